//! Hostile process names in every output. Processes whose names hold control characters
//! (\n, \t, ESC, DEL), quotes, a backslash, `<script>` and invalid UTF-8 (set with
//! prctl(PR_SET_NAME), and one exec'd through a file name and argv[0] made of such bytes)
//! run next to the daemon; every format must stay valid and still name the process.
//!
//! The rule (docs/snapshot-schema.md): ethand reads names from /proc as bytes and decodes
//! them as UTF-8, each invalid sequence becoming U+FFFD; control characters are kept in the
//! data (JSON, OTLP, Prometheus label values escape what their format requires) and shown
//! escaped where a person or a browser reads them: `\n`, `\t`, `\u{1b}`, `\u{7f}` in the
//! terminal, HTML entities plus `\u{..}` in the HTML report.
use std::{
    ffi::{OsStr, OsString},
    fs,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::PathBuf,
    thread,
};

use ethand_tests::{
    Daemon, RemoveOnDrop, SETTLE, Workload, find_proc, free_port, promtool_check, serial,
    temp_path, text,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};

use crate::otlp::GrpcReceiver;

/// The names given with prctl (the kernel keeps 15 bytes). The last one reads "ab" then,
/// through a right-to-left override (U+202E), "dc", with a zero-width space (U+200B) hidden
/// before the "e".
const NAMES: [&[u8]; 4] = [
    b"a\nb\tc\x1bd\x7fe",
    b"q'\"\\<script>",
    b"bad\xff\xfeutf8\xc3",
    b"ab\xe2\x80\xaecd\xe2\x80\x8be",
];
/// Characters that reorder or hide text: never shown raw to a person.
const HIDDEN: [char; 2] = ['\u{202e}', '\u{200b}'];
/// The file name (and argv[0]) of the exec'd one: ESC and a terminal colour, a newline,
/// `<script>`, a quote and invalid UTF-8.
const FILE_NAME: &[u8] = b"e\x1b[31m\n<script>\xff\"'\\x";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What ethand must report for a name: invalid UTF-8 replaced by U+FFFD.
fn decoded(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The terminal form: control characters as Rust escapes (`\n`, `\t`, `\u{1b}`), the
/// reordering and invisible ones as `\u{202e}`.
fn terminal(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else if HIDDEN.contains(&c) {
                c.escape_unicode().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Control bytes that must never reach a terminal raw (newline excepted: it ends lines).
fn raw_controls(b: &[u8]) -> Vec<u8> {
    b.iter()
        .copied()
        .filter(|&c| (c < 0x20 && c != b'\n') || c == 0x7f)
        .collect()
}

/// A label value of a Prometheus sample line, unescaped (`\\`, `\"`, `\n`).
fn label(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}=\""))? + key.len() + 2;
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                c => out.push(c),
            },
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// RFC 4180 records of a CSV text.
fn csv_records(s: &str) -> Vec<Vec<String>> {
    let (mut recs, mut rec, mut field) = (Vec::new(), Vec::new(), String::new());
    let mut chars = s.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => rec.push(std::mem::take(&mut field)),
            (false, '\n') => {
                rec.push(std::mem::take(&mut field));
                recs.push(std::mem::take(&mut rec));
            }
            (false, c) => field.push(c),
        }
    }
    recs
}

fn attr(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

struct Hostile {
    w: Workload,
    /// What ethand must show as its comm.
    comm: String,
}

#[test]
fn hostile_process_names_are_escaped_in_every_output() {
    let _serial = serial();
    // The exec'd one: a copy of ethand-load under a hostile file name.
    let dir = temp_path("escaping", "d");
    let _ = fs::create_dir_all(&dir);
    let mut path = dir.clone().into_os_string().into_vec();
    path.push(b'/');
    path.extend_from_slice(FILE_NAME);
    let path = PathBuf::from(OsString::from_vec(path));
    fs::copy(env!("CARGO_BIN_EXE_ethand-load"), &path).expect("copy ethand-load");
    let _rm = RemoveOnDrop(path.clone());

    let mut procs: Vec<Hostile> = NAMES
        .iter()
        .map(|n| Hostile {
            w: Workload::start(env!("CARGO_BIN_EXE_ethand-load"), &["named", &hex(n)]),
            comm: decoded(n),
        })
        .collect();
    procs.push(Hostile {
        w: Workload::start_os(
            path.as_os_str(),
            OsStr::from_bytes(FILE_NAME),
            &[OsStr::new("named"), OsStr::new("-")],
        ),
        // comm after exec: the file name's first 15 bytes.
        comm: decoded(&FILE_NAME[..15]),
    });
    let pids: Vec<String> = procs.iter().map(|h| h.w.pid.to_string()).collect();
    let port = free_port();
    let receiver = GrpcReceiver::start(port);
    let d = Daemon::start(
        "escaping",
        &format!(
            "[prometheus]\npids = [{}]\n[otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{port}\"\n\
             protocol = \"grpc\"\ninterval_ms = 500\ntimeout_ms = 400\n",
            pids.join(", ")
        ),
    );
    for h in &mut procs {
        h.w.go();
    }
    thread::sleep(SETTLE);

    // /metrics: promtool accepts it; the comm label reads back as the name.
    let body = d.metrics();
    promtool_check(&body);

    receiver.store.wait_for(receiver.store.len(), 2);
    for h in &procs {
        let pid = h.w.pid;
        let want = &h.comm;
        eprintln!("process {pid}: comm {want:?}");

        // Prometheus.
        let line = body
            .lines()
            .find(|l| {
                l.starts_with("ethand_process_syscalls_total{")
                    && l.contains(&format!("pid=\"{pid}\""))
                    && l.contains("syscall=\"getpid\"")
            })
            .unwrap_or_else(|| panic!("/metrics: no getpid series of pid {pid}"));
        eprintln!("  /metrics: {line}");
        assert_eq!(
            label(line, "comm").as_deref(),
            Some(want.as_str()),
            "/metrics comm of {pid}"
        );
        assert!(line.ends_with(" 1000"), "/metrics getpid of {pid}: {line}");

        // Snapshot JSON.
        let out = d.cli(&["snapshot", "--pid", &pid.to_string(), "--json"]);
        assert!(
            out.status.success(),
            "snapshot --json: {}",
            text(&out.stderr)
        );
        let json = std::str::from_utf8(&out.stdout).expect("snapshot JSON is UTF-8");
        let t: ethand_tests::TreeSnapshot =
            serde_json::from_str(json).expect("snapshot JSON parses");
        let p = find_proc(&t, pid);
        assert_eq!(&p.comm, want, "snapshot JSON comm");
        // JSON forbids raw U+0000-U+001F in strings (DEL is allowed and round-trips above).
        assert!(
            raw_controls(&out.stdout).iter().all(|&c| c == 0x7f),
            "raw control bytes in JSON"
        );

        // Terminal text.
        let out = d.cli(&["snapshot", "--pid", &pid.to_string()]);
        assert!(out.status.success(), "snapshot: {}", text(&out.stderr));
        let raw = raw_controls(&out.stdout);
        assert!(
            raw.is_empty(),
            "raw control bytes {raw:?} reach the terminal:\n{}",
            text(&out.stdout)
        );
        let shown = terminal(want);
        let txt = text(&out.stdout);
        assert!(
            !txt.contains(HIDDEN),
            "a reordering or invisible character reaches the terminal:\n{txt}"
        );
        assert!(
            txt.lines()
                .any(|l| l.contains(&pid.to_string()) && l.contains(&shown)),
            "terminal snapshot: no line with pid {pid} and {shown:?}:\n{txt}"
        );

        // CSV: process.info{comm="<JSON string>"} reads back as the name.
        let out = d.cli(&["snapshot", "--pid", &pid.to_string(), "--csv"]);
        assert!(
            out.status.success(),
            "snapshot --csv: {}",
            text(&out.stderr)
        );
        // The names are JSON-quoted inside the CSV field: U+0000-U+001F escaped, DEL allowed.
        let raw = raw_controls(&out.stdout);
        assert!(
            raw.iter().all(|c| *c == b'\r' || *c == 0x7f),
            "raw control bytes {raw:?} in CSV:\n{}",
            text(&out.stdout)
        );
        let recs = csv_records(&text(&out.stdout));
        assert!(recs.iter().all(|r| r.len() == 4), "CSV rows of 4 fields");
        let names: Vec<String> = recs
            .iter()
            .filter_map(|r| {
                let q = r[1].strip_prefix("process.info{comm=")?.strip_suffix('}')?;
                serde_json::from_str::<String>(q).ok()
            })
            .collect();
        assert!(
            names.contains(want),
            "CSV process.info names {names:?}, want {want:?}"
        );

        // HTML.
        let html = temp_path(&format!("escaping-{pid}"), "html");
        let _rm_html = RemoveOnDrop(html.clone());
        let out = d.cli(&[
            "snapshot",
            "--pid",
            &pid.to_string(),
            "--html",
            html.to_str().expect("utf-8"),
        ]);
        assert!(
            out.status.success(),
            "snapshot --html: {}",
            text(&out.stderr)
        );
        let h_bytes = fs::read(&html).expect("report");
        let h_text = std::str::from_utf8(&h_bytes).expect("HTML is UTF-8");
        assert!(
            !h_text.contains("<script"),
            "raw <script in the HTML report"
        );
        assert!(
            raw_controls(&h_bytes).is_empty(),
            "raw control bytes in the HTML report"
        );
        let esc = ethand_exporters::html::escape(want);
        assert!(h_text.contains(&esc), "HTML lacks the escaped name {esc:?}");
        assert!(
            !h_text.contains(HIDDEN),
            "a reordering or invisible character in the HTML report"
        );

        // OTLP (prost rejects invalid UTF-8 in strings: decoding it is the check).
        let reqs = receiver.store.0.lock().unwrap();
        let exported: Vec<String> = reqs
            .iter()
            .rev()
            .take(2)
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .filter_map(|m| match &m.data {
                Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(s)) => {
                    Some(&s.data_points)
                }
                _ => None,
            })
            .flatten()
            .filter(|p| {
                p.attributes
                    .iter()
                    .any(|kv| kv.key == "process.pid" && attr(kv) == pid.to_string())
            })
            .flat_map(|p| &p.attributes)
            .filter(|kv| kv.key == "process.executable.name")
            .map(attr)
            .collect();
        drop(reqs);
        assert!(
            !exported.is_empty() && exported.iter().all(|n| n == want),
            "OTLP process.executable.name of {pid}: {exported:?}"
        );

        // record: the Chrome trace names the process.
        let trace = temp_path(&format!("escaping-{pid}"), "json");
        let pf = temp_path(&format!("escaping-{pid}"), "pftrace");
        let _rm_trace = (RemoveOnDrop(trace.clone()), RemoveOnDrop(pf.clone()));
        let out = d.cli(&[
            "record",
            "--pid",
            &pid.to_string(),
            "--duration",
            "1s",
            "-o",
            trace.to_str().expect("utf-8"),
            "-o",
            pf.to_str().expect("utf-8"),
        ]);
        assert!(out.status.success(), "record: {}", text(&out.stderr));
        let tr = fs::read(&trace).expect("trace");
        let v: serde_json::Value = serde_json::from_slice(&tr).expect("trace is JSON");
        let events = v["traceEvents"].as_array().cloned().unwrap_or_default();
        let named: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name" && e["pid"] == pid)
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert_eq!(named, [want.as_str()], "record process_name of {pid}");
        // The Perfetto trace: the process track's name, as a protobuf string.
        let d = ethand_perfetto::decode::decode(&fs::read(&pf).expect("pftrace"))
            .unwrap_or_else(|e| panic!("import rules: {e}"));
        let tracks: Vec<&str> = d
            .tracks
            .values()
            .filter(|t| t.pid == Some(pid as i32) && t.tid.is_none())
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(tracks, [want.as_str()], "Perfetto process track of {pid}");
    }
    // The exec'd one: argv[0] and exe read back.
    let last = procs.last().expect("exec'd");
    let t = d.snapshot(last.w.pid);
    let p = find_proc(&t, last.w.pid);
    eprintln!(
        "observed: exec'd: comm {:?} cmdline {:?} exe {:?}",
        p.comm, p.cmdline, p.exe
    );
    assert_eq!(p.cmdline[0], decoded(FILE_NAME), "argv[0]");
    assert_eq!(p.exe, decoded(path.as_os_str().as_bytes()), "exe");
    let out = d.cli(&["snapshot", "--pid", &last.w.pid.to_string()]);
    let txt = text(&out.stdout);
    assert!(
        txt.contains(&terminal(&decoded(FILE_NAME))),
        "terminal cmdline escaped:\n{txt}"
    );
    for h in procs {
        h.w.finish();
    }
    let _ = fs::remove_dir_all(&dir);
}
