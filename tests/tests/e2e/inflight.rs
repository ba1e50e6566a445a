//! What a tree is doing now: each live thread's state and the syscall it is blocked in, timed;
//! the findings built on them; the text snapshot leading with the window's rates.
use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{InFlightSyscall, TreeSnapshot};
use ethand_tests::{Daemon, INTERVAL_MS, SETTLE, find_proc, serial, text};

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

/// The syscall the main thread of `pid` is in at the snapshot.
fn main_wait(t: &TreeSnapshot, pid: u32) -> InFlightSyscall {
    let p = find_proc(t, pid);
    let th = p
        .threads
        .iter()
        .find(|th| th.tid == pid)
        .expect("main thread");
    th.now
        .as_ref()
        .and_then(|n| n.syscall.clone())
        .unwrap_or_else(|| panic!("pid {pid} is in no syscall: {:?}", th.now))
}

/// The figure of "NOW (last X s" in a text snapshot.
fn now_header_seconds(txt: &str) -> f64 {
    let at = txt
        .find("NOW (last ")
        .unwrap_or_else(|| panic!("no NOW:\n{txt}"))
        + 10;
    txt[at..]
        .split(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no figure in the NOW header:\n{txt}"))
}

/// `cat` blocked in read() on a pipe whose only writer is a `sleep` that never writes, for
/// longer than the window: the window is the 5 s asked (to the nearest collection round),
/// cat's blocked time over it is the whole window though its wait has not ended (counted
/// up to the snapshot, not when it ends), and the `stalled` finding names the writer.
#[test]
fn a_wait_in_progress_counts_over_the_whole_window_and_names_the_writer() {
    let _serial = serial();
    let d = Daemon::start("inflight-window", "");
    let mut writer = Command::new("sleep")
        .arg("600")
        .stdout(Stdio::piped())
        .spawn()
        .expect("sleep");
    let pipe = writer.stdout.take().expect("pipe");
    let mut cat = Command::new("cat")
        .stdin(Stdio::from(pipe))
        .stdout(Stdio::null())
        .spawn()
        .expect("cat");
    let pid = cat.id();
    // Older than the window by two rounds, so that the window is not cut at its birth.
    thread::sleep(Duration::from_secs(5) + SETTLE);
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &pid.to_string(),
        "--window",
        "5",
        "--json",
    ]);
    let t: TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
    let txt = text(
        &d.cli(&["snapshot", "--pid", &pid.to_string(), "--window", "5"])
            .stdout,
    );
    let _ = cat.kill();
    let _ = writer.kill();
    let _ = (cat.wait(), writer.wait());
    let w = find_proc(&t, pid).window.clone().expect("window");
    let sc = main_wait(&t, pid);
    eprintln!(
        "observed: window {} ms, blocked {:.3} s, wait {} peer {:?}, note {:?}",
        w.duration_ms,
        w.offcpu_blocked_ns as f64 / 1e9,
        sc.describe(),
        sc.peer,
        t.window_note
    );
    // Rounds are one interval apart: the one nearest the window's start is within half.
    let half = INTERVAL_MS / 2;
    assert!(
        w.duration_ms.abs_diff(5000) <= half,
        "window {} ms for --window 5",
        w.duration_ms
    );
    assert_eq!(t.window_note, None, "the window is what was asked");
    let shown = now_header_seconds(&txt);
    assert!(
        (shown - w.duration_ms as f64 / 1000.0).abs() < 0.051,
        "NOW says {shown} s, the window is {} ms:\n{txt}",
        w.duration_ms
    );
    // Blocked the whole window: its switch-out lies before it, so the span in progress is
    // exactly the window (the read of the rounds' clock is the only slack).
    let blocked_ms = w.offcpu_blocked_ns / 1_000_000;
    assert!(
        blocked_ms.abs_diff(w.duration_ms) <= half,
        "blocked {blocked_ms} ms of a {} ms window",
        w.duration_ms
    );
    assert!(txt.contains("blocked 1.00 s/s"), "{txt}");
    assert_eq!(sc.name, "read");
    assert!(!sc.idle, "a read of a pipe is no idle wait");
    let named = format!("pid {} (sleep) holds it for writing", writer.id());
    assert_eq!(sc.peer.as_deref(), Some(named.as_str()));
    let f = t
        .findings
        .iter()
        .find(|f| f.id == "stalled")
        .unwrap_or_else(|| panic!("no `stalled` finding: {:?}", t.findings));
    assert!(
        f.detail.iter().any(|l| l.contains(&named)),
        "where: {:?}",
        f.detail
    );
}

/// `sleep 30` sleeps on purpose: idle, shown as such, and no `stalled` finding; its window,
/// cut at its birth, says so.
#[test]
fn a_timed_sleep_is_idle_not_stalled() {
    let _serial = serial();
    let d = Daemon::start("inflight-sleep", "");
    let mut s = Command::new("sleep").arg("30").spawn().expect("sleep");
    let pid = s.id();
    thread::sleep(Duration::from_secs(6) + SETTLE);
    let t = snapshot_json(&d, pid);
    let txt = text(&d.cli(&["snapshot", "--pid", &pid.to_string()]).stdout);
    let _ = s.kill();
    let _ = s.wait();
    let sc = main_wait(&t, pid);
    let ids: Vec<&str> = t.findings.iter().map(|f| f.id.as_str()).collect();
    let w = find_proc(&t, pid).window.clone().expect("window");
    eprintln!(
        "observed: {} idle {} for {:?} ns, findings {ids:?}, window {} ms blocked {} ms, note {:?}",
        sc.name,
        sc.idle,
        sc.elapsed_ns,
        w.duration_ms,
        w.offcpu_blocked_ns / 1_000_000,
        t.window_note
    );
    assert!(
        sc.name == "clock_nanosleep" || sc.name == "nanosleep",
        "{}",
        sc.name
    );
    assert!(sc.idle, "a timed sleep is idle");
    assert!(sc.elapsed_ns.unwrap_or(0) >= 5_000_000_000, "asleep 6 s");
    assert!(!ids.contains(&"stalled"), "findings {ids:?}");
    assert!(
        txt.contains("1 idle (in clock_nanosleep() for ")
            || txt.contains("1 idle (in nanosleep() for "),
        "{txt}"
    );
    // Asked 10 s of a 6 s old process: the window starts at its birth, and says why.
    assert!(w.duration_ms < 10_000);
    let note = t
        .window_note
        .clone()
        .expect("a window short of the 10 s asked says why");
    assert!(
        note.contains("10.0 s asked") && note.contains("started"),
        "{note}"
    );
    assert!(txt.contains(&note), "{txt}");
    // Asleep all its window: blocked throughout, within a round.
    let blocked_ms = w.offcpu_blocked_ns / 1_000_000;
    assert!(
        blocked_ms + INTERVAL_MS >= w.duration_ms && blocked_ms <= w.duration_ms + INTERVAL_MS,
        "blocked {blocked_ms} ms of a {} ms window",
        w.duration_ms
    );
}

/// `cat` reading one end of a Unix socket pair whose other end only a `sleep` holds: the
/// wait names that process as the other end (sock_diag's peer, then its holder).
#[test]
fn a_wait_on_a_unix_socket_names_the_process_at_the_other_end() {
    use std::os::{fd::OwnedFd, unix::net::UnixStream};
    let _serial = serial();
    let d = Daemon::start("inflight-unix", "");
    let (mine, theirs) = UnixStream::pair().expect("socketpair");
    let mut holder = Command::new("sleep")
        .arg("600")
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .expect("sleep");
    let mut cat = Command::new("cat")
        .stdin(Stdio::from(OwnedFd::from(mine)))
        .stdout(Stdio::null())
        .spawn()
        .expect("cat");
    let pid = cat.id();
    thread::sleep(Duration::from_secs(5) + SETTLE);
    let t = snapshot_json(&d, pid);
    let _ = cat.kill();
    let _ = holder.kill();
    let _ = (cat.wait(), holder.wait());
    let sc = main_wait(&t, pid);
    eprintln!("observed: {} peer {:?}", sc.describe(), sc.peer);
    assert_eq!(sc.name, "read");
    assert!(
        sc.file
            .as_deref()
            .is_some_and(|f| f.starts_with("socket:[")),
        "{:?}",
        sc.file
    );
    let named = format!(
        "Unix socket, other end: pid {} (sleep) holds it",
        holder.id()
    );
    assert_eq!(sc.peer.as_deref(), Some(named.as_str()));
    let f = t
        .findings
        .iter()
        .find(|f| f.id == "stalled")
        .unwrap_or_else(|| panic!("no `stalled` finding: {:?}", t.findings));
    assert!(
        f.detail.iter().any(|l| l.contains(&named)),
        "{:?}",
        f.detail
    );
}

/// `cat` reading a TCP connection whose other end (this test) never writes: the wait names
/// the remote address, the listener's.
#[test]
fn a_wait_on_a_tcp_connection_names_the_remote_address() {
    use std::{
        net::{TcpListener, TcpStream},
        os::fd::OwnedFd,
    };
    let _serial = serial();
    let d = Daemon::start("inflight-tcp", "");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = TcpStream::connect(addr).expect("connect");
    let (_server_end, _) = listener.accept().expect("accept");
    let mut cat = Command::new("cat")
        .stdin(Stdio::from(OwnedFd::from(client)))
        .stdout(Stdio::null())
        .spawn()
        .expect("cat");
    let pid = cat.id();
    thread::sleep(Duration::from_secs(5) + SETTLE);
    let t = snapshot_json(&d, pid);
    let _ = cat.kill();
    let _ = cat.wait();
    let sc = main_wait(&t, pid);
    eprintln!("observed: {} peer {:?}", sc.describe(), sc.peer);
    assert_eq!(sc.name, "read");
    assert_eq!(
        sc.peer.as_deref(),
        Some(format!("TCP connection to {addr}").as_str())
    );
}

/// A shell that ran 40 short-lived `true`s: the terminal snapshot collapses them into one
/// line per section ("exited: 40 x true: ..."), the count the JSON's exited processes
/// have, and lists none of them on a line of its own.
#[test]
fn forty_exited_children_collapse_into_one_line() {
    let _serial = serial();
    let d = Daemon::start("inflight-collapse", "");
    let mut sh = Command::new("sh")
        .args(["-c", "for i in $(seq 40); do /bin/true; done; sleep 30"])
        .spawn()
        .expect("sh");
    let pid = sh.id();
    thread::sleep(SETTLE * 3);
    let t = snapshot_json(&d, pid);
    let txt = text(&d.cli(&["snapshot", "--pid", &pid.to_string()]).stdout);
    let _ = sh.kill();
    let _ = sh.wait();
    let exited: Vec<u32> = t
        .processes
        .iter()
        .filter(|p| !p.alive && p.comm == "true")
        .map(|p| p.pid)
        .collect();
    eprintln!(
        "observed: {} exited `true` children in the JSON\n{txt}",
        exited.len()
    );
    assert_eq!(exited.len(), 40, "every child the shell ran");
    let line = "exited: 40 x true";
    assert_eq!(
        txt.matches(line).count(),
        2,
        "one collapsed line in NOW and one in LIFETIME:\n{txt}"
    );
    // The process sections (the syscall table below may name a child's pid).
    let section = |from: &str, to: &str| {
        let a = txt
            .find(from)
            .unwrap_or_else(|| panic!("no {from:?}:\n{txt}"));
        let b = a + txt[a..]
            .find(to)
            .unwrap_or_else(|| panic!("no {to:?}:\n{txt}"));
        txt[a..b].to_string()
    };
    let sections = section("NOW (", "DIAGNOSIS") + &section("LIFETIME", "TOTAL ");
    for p in exited {
        let own = sections
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{p} ")));
        assert!(!own, "pid {p} has a line of its own:\n{txt}");
    }
}
