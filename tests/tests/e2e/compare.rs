//! `ethand compare`: two runs of a workload with known work (N, then 2N getpid calls), each
//! snapshotted with `ethand snapshot --json`; the comparison must show exactly N more, in JSON
//! and in CSV. Files that are not snapshots are refused with exit 2 and a useful message.
use std::{fs, path::PathBuf, thread};

use ethand_exporters::report::Comparison;
use ethand_tests::{Daemon, RemoveOnDrop, SETTLE, TreeSnapshot, ethand, serial, temp_path, text};

use crate::workload;

/// Runs `syscalls GETPIDS 0` to its end, waits for the daemon to read the maps, and returns
/// `ethand snapshot --json` of it (the raw text and parsed), and `ethand snapshot --csv`.
fn run_and_snapshot(d: &Daemon, getpids: u64) -> (String, TreeSnapshot, String) {
    let mut w = workload(&["syscalls", &getpids.to_string(), "0"]);
    let done = w.go();
    assert_eq!(done.u64("getpid"), getpids, "workload's own count");
    thread::sleep(SETTLE);
    let pid = w.pid.to_string();
    let out = d.cli(&["snapshot", "--pid", &pid, "--json"]);
    assert!(
        out.status.success(),
        "ethand snapshot --json failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    let json = text(&out.stdout);
    let t: TreeSnapshot = serde_json::from_str(&json).expect("snapshot --json is a TreeSnapshot");
    let out = d.cli(&["snapshot", "--pid", &pid, "--csv"]);
    assert!(
        out.status.success(),
        "ethand snapshot --csv failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    w.finish();
    (json, t, text(&out.stdout))
}

/// RFC 4180 records (quoted fields may hold commas, doubled quotes and newlines).
fn parse_csv(s: &str) -> Vec<Vec<String>> {
    let (mut records, mut record, mut field) = (Vec::new(), Vec::new(), String::new());
    let mut chars = s.chars().peekable();
    let mut in_quotes = false;
    while let Some(c) = chars.next() {
        match (in_quotes, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => in_quotes = false,
            (true, c) => field.push(c),
            (false, '"') => in_quotes = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(
        !in_quotes && field.is_empty() && record.is_empty(),
        "CSV ends mid-record"
    );
    records
}

fn getpid_count(t: &TreeSnapshot) -> u64 {
    t.processes
        .iter()
        .flat_map(|p| &p.syscalls.by_nr)
        .filter(|r| i64::from(r.nr) == libc::SYS_getpid)
        .map(|r| r.count)
        .sum()
}

#[test]
fn compare_shows_exactly_the_extra_syscalls_of_the_second_run() {
    let _serial = serial();
    let d = Daemon::start("compare-runs", "");
    let n = 20_000u64;
    let (json_a, a, csv_a) = run_and_snapshot(&d, n);
    let (json_b, b, _) = run_and_snapshot(&d, 2 * n);
    let (ga, gb) = (getpid_count(&a), getpid_count(&b));
    eprintln!("observed: getpid in run 1 = {ga}, run 2 = {gb}");
    assert!(ga >= n && gb >= 2 * n, "getpid counts {ga}, {gb}");

    // `snapshot --csv` has the same figure as `snapshot --json`.
    let rows = parse_csv(&csv_a);
    assert_eq!(rows[0], ["scope", "metric", "value", "unit"]);
    assert!(rows.iter().all(|r| r.len() == 4), "4 fields per record");
    let v = rows
        .iter()
        .find(|r| r[0] == "total" && r[1] == "syscalls.getpid.count")
        .expect("snapshot --csv: total syscalls.getpid.count");
    assert_eq!(v[2], ga.to_string());
    assert_eq!(v[3], "count");

    let fa = RemoveOnDrop(temp_path("compare-a", "json"));
    let fb = RemoveOnDrop(temp_path("compare-b", "json"));
    fs::write(&fa.0, &json_a).expect("write a.json");
    fs::write(&fb.0, &json_b).expect("write b.json");
    let (pa, pb) = (path_str(&fa.0), path_str(&fb.0));

    let fh = RemoveOnDrop(temp_path("compare", "html"));
    let ph = path_str(&fh.0);
    let out = ethand(&["compare", &pa, &pb, "--json", "--html", &ph]);
    assert!(
        out.status.success(),
        "ethand compare --json failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    // The HTML page shows the same row with the exact change.
    let html = fs::read_to_string(&fh.0).expect("compare --html wrote its file");
    let row_html = format!(
        "<tr><td>syscalls.getpid.count</td><td>count</td><td>{ga}</td><td>{gb}</td><td class=\"up\">{n}</td>"
    );
    assert!(html.contains(&row_html), "compare --html lacks {row_html}");
    assert!(!html.contains("http://") && !html.contains("https://"));
    let c: Comparison = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "compare --json is not a Comparison: {e}\n{}",
            text(&out.stdout)
        )
    });
    assert_eq!(c.schema_version, 1);
    assert_eq!(
        (c.before.root_pid, c.after.root_pid),
        (a.root_pid, b.root_pid)
    );
    let row = c
        .rows
        .iter()
        .find(|r| r.metric == "syscalls.getpid.count")
        .expect("compared row syscalls.getpid.count");
    eprintln!("observed: compare row {row:?}");
    assert_eq!(row.scope, "total");
    assert_eq!(row.before, Some(ga as f64));
    assert_eq!(row.after, Some(gb as f64));
    assert_eq!(
        row.change,
        Some(n as f64),
        "the second run made exactly {n} more getpid"
    );
    let total = c
        .rows
        .iter()
        .find(|r| r.metric == "syscalls.count")
        .expect("syscalls.count");
    assert!(total.change.expect("both known") >= n as f64, "{total:?}");
    assert!(c.rows.iter().any(|r| r.metric == "rate.syscalls.count"));

    let out = ethand(&["compare", &pa, &pb, "--csv"]);
    assert!(out.status.success(), "compare --csv: {}", text(&out.stderr));
    let rows = parse_csv(&text(&out.stdout));
    assert_eq!(
        rows[0],
        [
            "scope", "metric", "unit", "before", "after", "change", "ratio"
        ]
    );
    let r = rows
        .iter()
        .find(|r| r[1] == "syscalls.getpid.count")
        .expect("compare --csv: syscalls.getpid.count");
    assert_eq!(r[3..6], [ga.to_string(), gb.to_string(), n.to_string()]);

    // Terminal form: no colors into a pipe.
    let out = ethand(&["compare", &pa, &pb]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "compare: {}", text(&out.stderr));
    assert!(s.contains("Most changed") && !s.contains('\x1b'), "{s}");
}

fn path_str(p: &std::path::Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Exit 2 and one error line per bad file, naming it and (for JSON) the line and column.
#[test]
fn compare_refuses_files_that_are_not_snapshots() {
    let _serial = serial();
    let good = RemoveOnDrop(temp_path("compare-good", "json"));
    fs::write(
        &good.0,
        serde_json::to_string(&TreeSnapshot {
            schema_version: 1,
            source: ethand_snapshot::SnapshotSource::Daemon,
            ..Default::default()
        })
        .unwrap(),
    )
    .unwrap();
    let not_json = RemoveOnDrop(temp_path("compare-text", "json"));
    fs::write(&not_json.0, "hello\n").unwrap();
    // A `ethand status --json`-like object: JSON, but not a snapshot.
    let other = RemoveOnDrop(temp_path("compare-status", "json"));
    fs::write(&other.0, "{\n  \"version\": \"0.1.0\",\n  \"pid\": 1\n}\n").unwrap();
    let missing: PathBuf = temp_path("compare-missing", "json");
    let _ = fs::remove_file(&missing);

    let good_s = path_str(&good.0);
    let cases: [(&PathBuf, &[&str]); 3] = [
        (
            &not_json.0,
            &["is not an ethand snapshot", "line 1 column 1"],
        ),
        (
            &other.0,
            &[
                "is not an ethand snapshot",
                "missing field",
                "line 4 column 1",
            ],
        ),
        (&missing, &["cannot read", "No such file"]),
    ];
    for (bad, words) in cases {
        let bad_s = path_str(bad);
        for args in [
            vec!["compare", &bad_s, &good_s],
            vec!["compare", &good_s, &bad_s, "--json"],
        ] {
            let out = ethand(&args);
            let err = text(&out.stderr);
            eprintln!("observed: {args:?}: {} {err:?}", out.status);
            assert_eq!(out.status.code(), Some(2), "{args:?}: exit status; {err}");
            assert!(
                out.stdout.is_empty(),
                "{args:?}: stdout {}",
                text(&out.stdout)
            );
            assert_eq!(err.lines().count(), 1, "{args:?}: one error line: {err:?}");
            assert!(err.starts_with("ethand: error: "), "{err:?}");
            assert!(err.contains(&bad_s), "{args:?}: names the file: {err:?}");
            for w in words {
                assert!(err.contains(w), "{args:?}: no {w:?} in {err:?}");
            }
        }
    }
    // Both good: fine, even without a daemon.
    let out = ethand(&["compare", &good_s, &good_s, "--csv"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
