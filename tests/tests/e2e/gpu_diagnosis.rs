//! What the diagnosis gets about GPU processes at the default level `calls`, against the
//! stand-in libcuda: kernel launches counted on demand for a snapshot (only the tree's
//! processes, only during the sample, never into the cumulative counters or /metrics), the
//! rules that cannot run said so, and a driver library probed at start-up, before any process
//! maps it.
use std::{
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, SETTLE, find_proc, serial,
    standins::{self, Lib},
    text,
};

fn snapshot(d: &Daemon, pid: u32, extra: &[&str]) -> ethand_tests::TreeSnapshot {
    let p = pid.to_string();
    let mut args = vec!["snapshot", "--pid", &p, "--json", "--window", "5"];
    args.extend_from_slice(extra);
    let out = d.cli(&args);
    assert!(
        out.status.success(),
        "ethand snapshot failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snapshot JSON")
}

/// Waits until `ethand status` lists the stand-in libcuda attached.
fn wait_attached(d: &Daemon) {
    let path = std::fs::canonicalize(standins::shared().path(Lib::Cuda)).expect("canonical");
    let t0 = Instant::now();
    while !d.status().gpu_libraries.iter().any(|l| {
        std::path::Path::new(&l.path) == path && l.state == ethand_tests::ProbeState::Attached
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "libcuda not attached"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// At `calls` a snapshot counts the tree's kernel launches for `launch_sample_ms`: exactly
/// the launches the tree's process makes inside the sample, none of another process that
/// launches at the same time, and nothing of them in the cumulative counters or /metrics.
#[test]
fn launch_sample_counts_the_tree_during_the_sample_only() {
    let _serial = serial();
    let d = Daemon::start(
        "gpu-launch-sample",
        "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 300\n[diagnosis]\nlaunch_sample_ms = 3000\n",
    );
    let s = standins::shared();
    let mut mine = s.spawn_driver(
        &[Lib::Cuda],
        &[
            "wait_stdin",
            "htod 4K",
            "launches 3",
            "wait_stdin",
            "launches 777",
            "wait_stdin",
        ],
    );
    let mut other = s.spawn_driver(&[Lib::Cuda], &["wait_stdin", "launches 500", "wait_stdin"]);
    mine.wait_for("waiting");
    other.wait_for("waiting");
    wait_attached(&d);
    // Before any sample: 3 launches the level does not count.
    mine.resume();
    mine.wait_for("waiting");
    thread::sleep(SETTLE);
    let pid = mine.pid;
    let t0 = Instant::now();
    let sampled = thread::scope(|sc| {
        let snap = sc.spawn(|| snapshot(&d, pid, &[]));
        // The sample starts at the next collection (200 ms) after the request.
        thread::sleep(Duration::from_millis(1200));
        mine.resume();
        other.resume();
        mine.wait_for("waiting");
        other.wait_for("waiting");
        snap.join().expect("snapshot thread")
    });
    eprintln!("observed: sampled snapshot took {:?}", t0.elapsed());
    let ls = sampled
        .launch_sample
        .as_ref()
        .unwrap_or_else(|| panic!("no launch sample: {sampled:#?}"));
    eprintln!("observed: launch sample {ls:?}");
    assert_eq!(ls.launches, Some(777), "{ls:?}");
    assert_eq!(ls.processes.len(), 1, "{ls:?}");
    assert_eq!((ls.processes[0].pid, ls.processes[0].launches), (pid, 777));
    assert!((2900..5000).contains(&ls.duration_ms), "{ls:?}");
    assert!(ls.method.contains("scoped"), "{}", ls.method);
    // Nothing of it in the process's own figures: launches stay not counted.
    let p = find_proc(&sampled, pid);
    let g = p.gpu.as_ref().expect("gpu section (the htod copy)");
    assert_eq!(g.launches, None, "{g:?}");
    assert_eq!(p.window.as_ref().and_then(|w| w.gpu_launches), None);
    let body = d.metrics();
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("ethand_process_gpu_launches_total")
                && l.contains(&format!("pid=\"{pid}\""))),
        "a launch series for pid {pid} at level calls"
    );
    // The launch-based rules ran on the sample: none is listed as not evaluated for it.
    assert!(
        !sampled
            .not_evaluated
            .iter()
            .any(|n| n.missing.iter().any(|m| m == "gpu.launches_per_second")),
        "{:#?}",
        sampled.not_evaluated
    );
    // Without a sample they say what is missing and how to get it.
    let plain = snapshot(&d, pid, &["--no-launch-sample"]);
    assert!(plain.launch_sample.is_none());
    let lb = plain
        .not_evaluated
        .iter()
        .find(|n| n.rule == "launch_bound")
        .unwrap_or_else(|| panic!("launch_bound not listed: {:#?}", plain.not_evaluated));
    assert!(
        lb.missing.iter().any(|m| m == "gpu.launches_per_second"),
        "{lb:?}"
    );
    assert!(lb.how.contains("level process"), "{}", lb.how);
    mine.finish();
    other.finish();
}

/// A driver library named in `gpu.driver_libraries` is probed at start-up: a process that
/// makes its calls right after it starts is counted although no rescan (one per hour here)
/// has looked at its mappings.
#[test]
fn driver_library_probed_before_any_process_maps_it() {
    let _serial = serial();
    let s = standins::shared();
    let lib = std::fs::canonicalize(s.path(Lib::Cuda)).expect("canonical");
    let d = Daemon::start(
        "gpu-preload",
        &format!(
            "[gpu]\nlevel = \"calls\"\nrescan_interval_ms = 3600000\ndriver_libraries = [\"{}\"]\n",
            lib.display()
        ),
    );
    // Probed at the daemon's first GPU scan, before any process maps it.
    let t0 = Instant::now();
    let entry = loop {
        let st = d.status();
        if let Some(e) = st
            .gpu_libraries
            .iter()
            .find(|l| std::path::Path::new(&l.path) == lib)
        {
            break e.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{} not probed at start-up: {:#?}",
            lib.display(),
            st.gpu_libraries
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(entry.state, ethand_tests::ProbeState::Attached, "{entry:?}");
    assert!(entry.detail.contains("start-up"), "{}", entry.detail);
    let mut drv = s.spawn_driver(
        &[Lib::Cuda],
        &["htod 4K x 3", "sync stream 2", "wait_stdin"],
    );
    drv.wait_for("waiting");
    thread::sleep(SETTLE);
    let t = snapshot(&d, drv.pid, &["--no-launch-sample"]);
    let truth = drv.finish();
    let g = find_proc(&t, truth.pid)
        .gpu
        .clone()
        .unwrap_or_else(|| panic!("no GPU calls counted: {t:#?}"));
    eprintln!("observed: copies {:?}, sync {:?}", g.copies, g.sync);
    assert_eq!(g.copy_bytes("host_to_device"), 3 * 4096);
    assert_eq!(g.sync.calls, 2);
}

/// `ethand diagnose` on what is not a snapshot, or a missing file: a clear error and exit 2
/// (as `ethand compare`), never a diagnosis of nothing.
#[test]
fn diagnose_refuses_what_is_not_a_snapshot() {
    let f = ethand_tests::temp_path("diagnose-bad", "json");
    let _rm = ethand_tests::RemoveOnDrop(f.clone());
    for (content, want) in [
        (&b"not json at all"[..], "is not an ethand snapshot"),
        (b"", "is not an ethand snapshot"),
        (
            b"{\"schema_version\": \"one\"}",
            "is not an ethand snapshot",
        ),
        (b"\xff\xfe\x00garbage", "is not an ethand snapshot"),
    ] {
        std::fs::write(&f, content).expect("write");
        let out = ethand_tests::ethand(&["diagnose", f.to_str().expect("utf-8")]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{content:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(want),
            "{content:?}: {}",
            text(&out.stderr)
        );
    }
    let out = ethand_tests::ethand(&["diagnose", "/nonexistent/snapshot.json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot read /nonexistent/snapshot.json"),
        "{}",
        text(&out.stderr)
    );
}
