//! What a tree is doing now: each live thread's state and the syscall it is blocked in, timed;
//! the findings built on them; the text snapshot leading with the window's rates.
use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::TreeSnapshot;
use ethand_tests::{Daemon, SETTLE, find_proc, serial, text};

fn snapshot_json(d: &Daemon, pid: u32) -> TreeSnapshot {
    d.snapshot(pid)
}

/// `cat` blocked in read() on a pipe nobody writes to: the snapshot shows the wait (read() on
/// pipe:[…]) with its elapsed time, and the diagnosis says the tree is stalled there, where
/// the window alone shows nothing (the wait has not ended).
#[test]
fn a_process_blocked_in_read_on_a_pipe_is_stalled_there() {
    let _serial = serial();
    let d = Daemon::start("inflight-pipe", "");
    let mut cat = Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("cat");
    let started = Instant::now();
    let pid = cat.id();
    thread::sleep(Duration::from_secs(6));
    let t = snapshot_json(&d, pid);
    let waited = started.elapsed();
    let p = find_proc(&t, pid);
    let main = p
        .threads
        .iter()
        .find(|th| th.tid == pid)
        .expect("cat's thread");
    let now = main.now.as_ref().expect("the thread's state is read");
    let sc = now.syscall.as_ref().expect("blocked in a syscall");
    eprintln!(
        "observed: state {:?}, {} fd {:?} file {:?} elapsed {:?} (cat started {waited:?} ago)",
        now.state,
        sc.name,
        sc.fd,
        sc.file,
        sc.elapsed_ns.map(|n| Duration::from_nanos(n))
    );
    assert_eq!(now.state, "sleeping");
    assert_eq!(sc.name, "read");
    assert_eq!(sc.fd, Some(0));
    assert!(
        sc.file.as_deref().is_some_and(|f| f.starts_with("pipe:[")),
        "file {:?}",
        sc.file
    );
    let elapsed = Duration::from_nanos(sc.elapsed_ns.expect("timed from its entry"));
    assert!(
        elapsed <= waited && elapsed + Duration::from_millis(1500) >= waited,
        "in read() for {elapsed:?}; cat started {waited:?} ago"
    );
    let f = t
        .findings
        .iter()
        .find(|f| f.id == "stalled")
        .unwrap_or_else(|| panic!("no `stalled` finding: {:?}", t.findings));
    assert!(
        f.detail.iter().any(|l| l.contains("read() on pipe:[")),
        "where: {:?}",
        f.detail
    );
    // The text names the wait.
    let out = d.cli(&["snapshot", "--pid", &pid.to_string()]);
    let txt = text(&out.stdout);
    assert!(txt.contains("where: pid"), "{txt}");
    assert!(txt.contains("read() on pipe:["), "{txt}");
    drop(cat.stdin.take());
    let _ = cat.wait();
}

/// A busy single-threaded process (no GPU): one core, the `single_thread_cpu_bound` finding,
/// and the text snapshot leads with the window's rates, lifetime totals after.
#[test]
fn a_single_threaded_busy_loop_is_held_to_one_core_and_now_comes_first() {
    let _serial = serial();
    let d = Daemon::start("inflight-busy", "");
    let mut b = Command::new("bash")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("bash");
    let pid = b.id();
    thread::sleep(Duration::from_secs(3) + SETTLE);
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &pid.to_string(),
        "--window",
        "2",
        "--json",
    ]);
    let t: TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
    let txt = text(
        &d.cli(&["snapshot", "--pid", &pid.to_string(), "--window", "2"])
            .stdout,
    );
    let _ = b.kill();
    let _ = b.wait();
    let ids: Vec<&str> = t.findings.iter().map(|f| f.id.as_str()).collect();
    let p = find_proc(&t, pid);
    let w = p.window.as_ref().expect("window");
    let main = p.threads.iter().find(|th| th.tid == pid).expect("thread");
    eprintln!(
        "observed: findings {ids:?}, cores {:.2}, state {:?}",
        w.oncpu_ns as f64 / 1e6 / w.duration_ms as f64,
        main.now.as_ref().map(|n| n.state.clone())
    );
    assert_eq!(main.now.as_ref().map(|n| n.state.as_str()), Some("running"));
    // On a busy machine the loop waits for a CPU instead: that finding explains it first.
    assert!(
        ids.contains(&"single_thread_cpu_bound") || ids.contains(&"cpu_contention"),
        "findings {ids:?}"
    );
    assert!(!ids.contains(&"stalled"), "a running thread is not stalled");
    let now_at = txt
        .find("NOW (last ")
        .unwrap_or_else(|| panic!("no NOW section:\n{txt}"));
    let life_at = txt.find("LIFETIME").expect("LIFETIME section");
    let total_at = txt.find("TOTAL ").expect("TOTAL line");
    assert!(now_at < life_at && life_at < total_at, "{txt}");
    assert!(txt[now_at..life_at].contains("cores"), "{txt}");
}
