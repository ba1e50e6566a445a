//! Every bytecode position of real code objects against the line CPython itself gives it:
//! live with this machine's python3 (Debian's 3.11 in CI: the location table), and from
//! fixtures recorded with CPython 3.9.18, 3.10.13, 3.12.1 and 3.13.0 (`dump_lines.py` over
//! textwrap and json's decoder and encoder). Then hostile tables: any bytes, no panic.
use super::*;

use serde_json::Value;

/// Checks every position of every code object of a `dump_lines.py` output; returns how
/// many positions were compared.
fn check(dump: &Value) -> usize {
    let v = &dump["version"];
    let minor = v[1].as_u64().unwrap() as u32;
    let format = LineTable::of_version(minor).expect("a known version");
    let mut compared = 0;
    for c in dump["codes"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let first = c["first"].as_u64().unwrap() as u32;
        let table: Vec<u8> = (0..c["table"].as_str().unwrap().len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&c["table"].as_str().unwrap()[i..i + 2], 16).unwrap())
            .collect();
        let code_bytes = c["code_bytes"].as_u64().unwrap();
        let lines = c["lines"].as_array().unwrap();
        for at in (0..code_bytes).step_by(2) {
            let expected: Option<Option<u32>> = if minor >= 10 {
                // co_lines(): [start, end) in bytes, the line or None.
                lines
                    .iter()
                    .find(|r| r[0].as_u64().unwrap() <= at && at < r[1].as_u64().unwrap())
                    .map(|r| r[2].as_u64().map(|l| l as u32))
            } else {
                // findlinestarts: the last line start at or before the offset.
                lines
                    .iter()
                    .rev()
                    .find(|r| r[0].as_u64().unwrap() <= at)
                    .map(|r| r[1].as_u64().map(|l| l as u32))
            };
            let Some(expected) = expected else { continue };
            // 3.9: f_lasti in bytes; 3.10: f_lasti in code units; 3.11+: the index in units.
            let pos = if minor >= 10 { at / 2 } else { at } as u32;
            assert_eq!(
                format.line(&table, first, pos),
                expected,
                "CPython {v}: {name} at byte {at}"
            );
            compared += 1;
        }
    }
    compared
}

#[test]
fn recorded_versions_give_cpythons_own_lines() {
    for (version, text) in [
        ("3.9", include_str!("fixtures/cpython-3.9.json")),
        ("3.10", include_str!("fixtures/cpython-3.10.json")),
        ("3.12", include_str!("fixtures/cpython-3.12.json")),
        ("3.13", include_str!("fixtures/cpython-3.13.json")),
    ] {
        let n = check(&serde_json::from_str(text).unwrap());
        eprintln!("CPython {version}: {n} positions");
        assert!(n > 1000, "{version}: only {n} positions");
    }
}

/// This machine's interpreter (the CI's Debian python3.11) on a few of its own modules.
#[test]
fn this_machines_python_gives_the_same_lines() {
    let py = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| std::process::Command::new(p).arg("-V").output().is_ok())
        .expect("python3 (the setup script installs it)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/src/pyline/dump_lines.py");
    let srcs = std::process::Command::new(py)
        .args([
            "-c",
            "import textwrap, argparse, json.decoder; \
             print(textwrap.__file__, argparse.__file__, json.decoder.__file__)",
        ])
        .output()
        .unwrap();
    let srcs = String::from_utf8(srcs.stdout).unwrap();
    let out = std::process::Command::new(py)
        .arg(script)
        .args(srcs.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = check(&dump);
    eprintln!("CPython {}: {n} positions", dump["version"]);
    assert!(n > 5000, "only {n} positions");
}

/// Tables from a hostile process: whatever the bytes, an answer or None, never a panic, and
/// a line always in range.
#[test]
fn any_bytes_answer_or_none() {
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let table: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let first = (next() % 3) as u32 * (u32::MAX / 2);
        let pos = (next() % 200) as u32;
        for f in [
            LineTable::Lnotab,
            LineTable::Linetable310,
            LineTable::Locations,
        ] {
            let _ = f.line(&table, first, pos);
        }
    }
    // A varint that never ends, a line below 1.
    assert_eq!(
        LineTable::Locations.line(&[0xe8, 0x7f, 0x7f, 0x7f], 1, 0),
        None
    );
    assert_eq!(LineTable::Lnotab.line(&[0, 0x80], 5, 0), None);
    // Two long-form deltas of about 2^61 each (fuzzing found the overflow).
    let big = [
        0xe8, 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x3f,
    ];
    let mut t = big.to_vec();
    t.extend_from_slice(&big);
    t.extend_from_slice(&big);
    t.push(0x80);
    t.push(0);
    assert_eq!(LineTable::Locations.line(&t, 1, 3), None);
}
