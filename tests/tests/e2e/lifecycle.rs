//! Process identity and lifecycle: metadata from /proc, exited processes and the grace period.
use std::{
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, INTERVAL_MS, SETTLE, find_proc, measure, serial, syscall, text};

use crate::workload;

/// The workload's identity as the kernel and the test know it.
#[test]
fn process_metadata_matches_proc() {
    let _serial = serial();
    let d = Daemon::start("metadata", "");
    let mut w = workload(&["syscalls", "100", "0"]);
    let m = measure(&d, &mut w);
    let p = find_proc(&m.after, w.pid);
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", w.pid)).expect("cgroup");
    let cgroup = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("")
        .to_string();
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_ethand-workload")).expect("exe path");
    eprintln!(
        "observed: pid {} ppid {} comm {:?} exe {:?} cmdline {:?} cgroup {:?} uid {} alive {} start {}",
        p.pid, p.ppid, p.comm, p.exe, p.cmdline, p.cgroup, p.uid, p.alive, p.start_time_unix_s
    );
    assert_eq!(p.ppid, std::process::id(), "ppid");
    assert_eq!(p.comm, "ethand-workload", "comm");
    assert_eq!(p.exe, exe.display().to_string(), "exe");
    assert_eq!(
        p.cmdline,
        [
            env!("CARGO_BIN_EXE_ethand-workload"),
            "syscalls",
            "100",
            "0"
        ],
        "cmdline"
    );
    assert_eq!(p.cgroup, cgroup, "cgroup");
    assert_eq!(p.uid, 0, "uid");
    assert!(p.alive, "alive");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert!(
        p.start_time_unix_s.abs_diff(now) <= 30,
        "start_time_unix_s {} vs now {now}",
        p.start_time_unix_s
    );
    assert_eq!(m.after.processes[0].pid, w.pid, "the root comes first");
    w.finish();
}

/// A process that exited stays visible, not alive, with its final counters, for
/// exit_grace_seconds; then `ethand snapshot` no longer knows it (exit 3).
#[test]
fn exited_process_is_kept_for_the_grace_period() {
    let _serial = serial();
    let grace = Duration::from_secs(2);
    let d = Daemon::start(
        "exited",
        &format!("[daemon]\nexit_grace_seconds = {}\n", grace.as_secs()),
    );
    let mut w = workload(&["syscalls", "5000", "0"]);
    let pid = w.pid;
    let m = measure(&d, &mut w);
    let live = syscall(find_proc(&m.after, pid), libc::SYS_getpid).0;
    w.finish();
    let exited_at = Instant::now();
    thread::sleep(SETTLE);
    let t = d.snapshot(pid);
    let p = find_proc(&t, pid);
    let (count, _) = syscall(p, libc::SYS_getpid);
    eprintln!(
        "observed: after exit: alive {}, getpid {count} (live: {live})",
        p.alive
    );
    assert!(!p.alive, "pid {pid} exited but is reported alive");
    assert_eq!(
        count, 5000,
        "getpid count of the exited process (it was {live} while alive)"
    );

    // Gone once the grace period is over (allow two more intervals and the liveness check).
    let deadline = exited_at + grace + Duration::from_secs(3);
    loop {
        let out = d.cli(&["snapshot", "--pid", &pid.to_string(), "--json"]);
        if out.status.code() == Some(3) {
            eprintln!(
                "observed: forgotten {:?} after exit (grace {grace:?})",
                exited_at.elapsed()
            );
            // The grace period is counted in collection rounds from the round that saw the
            // exit: accurate to one interval.
            let early = Duration::from_millis(INTERVAL_MS + 50);
            assert!(
                exited_at.elapsed() + early >= grace,
                "forgotten {:?} after exit, before the grace period {grace:?}",
                exited_at.elapsed()
            );
            break;
        }
        assert!(
            out.status.success(),
            "ethand snapshot: {} {}",
            out.status,
            text(&out.stderr)
        );
        assert!(
            Instant::now() < deadline,
            "pid {pid} still known {:?} after its exit (grace {grace:?})",
            exited_at.elapsed()
        );
        thread::sleep(Duration::from_millis(100));
    }
}
