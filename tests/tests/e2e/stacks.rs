//! Where in the code, against ground truth: a Python program calls the stand-in libcuda's
//! `cuStreamSynchronize` through ctypes from a known function and line, and spends known
//! shares of its time in two other known lines. A daemon snapshot must name that line as the
//! sync's call site, with its source text, and give each line's share of the main thread's
//! time within a few points of what the program did.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, KillOnDrop, serial,
    standins::{self, Lib},
    text,
};

/// Each round: 10 ms inside the sync (the stand-in sleeps), 10 ms spinning in `spin_a`,
/// 20 ms in `spin_b`: 25 %, 25 % and 50 % of the main thread's time.
pub(crate) const SCRIPT: &str = r#"import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
sync = lib.cuStreamSynchronize
def wait_for_gpu():
    sync(None)  # SYNC_LINE
def spin(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:  # SPIN_LINE
        pass
def spin_a():
    spin(10)  # A_LINE
def spin_b():
    spin(20)  # B_LINE
print("ready", flush=True)
while True:
    wait_for_gpu()
    spin_a()
    spin_b()
"#;

pub(crate) fn line_of(marker: &str) -> u32 {
    SCRIPT
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker") as u32
        + 1
}

#[test]
fn python_call_sites_and_line_shares_match_the_program() {
    let _serial = serial();
    let d = Daemon::start(
        "stack-sample",
        "[gpu]\nrescan_interval_ms = 300\n[diagnosis]\nstack_sample_ms = 4000\nstack_sample_hz = 97\n",
    );
    let dir = std::env::temp_dir().join(format!("ethand-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("sync_sites.py");
    std::fs::write(&script, SCRIPT).expect("script");
    let cuda = standins::shared().path(Lib::Cuda);
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(cuda)
        .env("ETHAND_STANDIN_SYNC_US", "10000")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let _kill = KillOnDrop(child);
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    assert_eq!(line.trim(), "ready");
    // Until the daemon knows the process (its next round) and has attached to the stand-in
    // libcuda it maps.
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(20), "no syncs seen");
        let o = d.cli(&["snapshot", "--pid", &pid.to_string(), "--json"]);
        if !o.status.success() {
            let err = text(&o.stderr);
            assert!(err.contains("is known to ethand"), "snapshot: {err}");
            thread::sleep(Duration::from_millis(300));
            continue;
        }
        let s: ethand_tests::TreeSnapshot = serde_json::from_slice(&o.stdout).expect("JSON");
        if s.processes.iter().any(|p| {
            p.gpu
                .as_ref()
                .is_some_and(|g| g.sync.calls > 0 && g.sync.timed_calls > 0)
        }) {
            break;
        }
        thread::sleep(Duration::from_millis(300));
    }
    let p = pid.to_string();
    let o = d.cli(&["snapshot", "--pid", &p, "--json", "--window", "5"]);
    assert!(o.status.success(), "snapshot: {}", text(&o.stderr));
    let tree: ethand_tests::TreeSnapshot = serde_json::from_slice(&o.stdout).expect("JSON");
    let sample = tree
        .stack_sample
        .as_ref()
        .expect("a stack sample of a Python tree");
    println!(
        "method: {}\nnotes: {:?}\ncall sites: {:#?}",
        sample.method, sample.notes, sample.call_sites
    );
    let script_path = script.to_str().expect("utf-8");

    // The sync's call site: the line that calls it, its function and its source text.
    let sites = sample
        .call_sites
        .iter()
        .find(|c| c.pid == pid && c.call == "cuStreamSynchronize")
        .expect("cuStreamSynchronize call sites");
    let (top, share) = sites.top().expect("a site");
    let f = top.key_frame().expect("frame");
    assert_eq!(f.file.as_deref(), Some(script_path));
    assert_eq!(f.line, Some(line_of("SYNC_LINE")));
    assert_eq!(f.function.as_deref(), Some("wait_for_gpu"));
    assert_eq!(top.source.as_deref(), Some("sync(None)  # SYNC_LINE"));
    assert_eq!(share, 1.0, "one call site only: {sites:?}");
    // The caller's frame is there too, outermost last.
    assert_eq!(
        top.frames.last().and_then(|f| f.function.as_deref()),
        Some("<module>")
    );

    // The main thread's time by line: 25 % sync, 50 % + 25 % spinning (the spin loop's line,
    // reached from spin_a and spin_b: told apart by the folded stacks).
    let main = sample
        .threads
        .iter()
        .find(|t| t.pid == pid && t.main_thread)
        .expect("main thread profile");
    let n = main.samples as f64;
    assert!(n >= 200.0, "too few samples: {n}");
    let in_sync = main.in_runtime_call_samples as f64 / n;
    let through = |marker: &str| {
        let l = line_of(marker);
        main.folded
            .iter()
            .filter(|s| {
                s.frames
                    .iter()
                    .any(|i| main.frames[*i as usize].line == Some(l))
            })
            .map(|s| s.samples)
            .sum::<u64>() as f64
            / n
    };
    let (a, b) = (through("A_LINE"), through("B_LINE"));
    println!("shares: sync {in_sync:.3} spin_a {a:.3} spin_b {b:.3} of {n} samples");
    assert!((in_sync - 0.25).abs() < 0.08, "sync share {in_sync}");
    assert!((a - 0.25).abs() < 0.08, "spin_a share {a}");
    assert!((b - 0.50).abs() < 0.08, "spin_b share {b}");
    // Spinning is on-CPU, the sync a sleep: the active share is the spinning's.
    let active = main.active_samples as f64 / n;
    assert!((active - 0.75).abs() < 0.1, "active share {active}");
    // The innermost line of most samples is the spin loop's.
    let top_line = &main.top_lines[0];
    assert_eq!(top_line.frames[0].line, Some(line_of("SPIN_LINE")));

    // The text snapshot names the site.
    let o = d.cli(&["snapshot", "--pid", &p, "--window", "5"]);
    let shown = text(&o.stdout);
    println!("{shown}");
    assert!(
        shown.contains(&format!(
            "sync_sites.py:{} in wait_for_gpu()",
            line_of("SYNC_LINE")
        )),
        "text snapshot does not name the sync's line"
    );
    // The Python reader's crates (py-spy, remoteprocess) read the process for every snapshot
    // above: none of their INFO lines reach the daemon's log at the default `daemon.log`.
    if std::env::var_os("RUST_LOG").is_none() {
        let log = d.log_text();
        let foreign: Vec<&str> = log
            .lines()
            .filter_map(|l| Some((l, l.split_once(" INFO ")?.1)))
            .filter(|(_, rest)| {
                // The target: the first word ending in ':' past any span ("name{...}:").
                let target = rest
                    .split_whitespace()
                    .find(|w| w.ends_with(':') && !w.contains('{'))
                    .unwrap_or("");
                !target.starts_with("ethand")
            })
            .map(|(l, _)| l)
            .collect();
        assert!(foreign.is_empty(), "third-party INFO lines: {foreign:#?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
