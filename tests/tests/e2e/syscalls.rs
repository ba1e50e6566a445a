//! Syscall counting: counts and errors per syscall number, latency classes.
use std::thread;

use ethand_tests::{Daemon, SETTLE, find_proc, latency_class_count, measure, serial, syscall};

use crate::workload;

/// 10000 getpid() and 500 openat() of a missing path: exactly those counts and errors.
#[test]
fn syscall_counts_and_errors_are_exact() {
    let _serial = serial();
    let d = Daemon::start("syscalls", "");
    let (getpids, opens) = (10_000u64, 500u64);
    let mut w = workload(&["syscalls", &getpids.to_string(), &opens.to_string()]);
    let m = measure(&d, &mut w);
    assert_eq!(
        m.done.u64("openat_failed"),
        opens,
        "workload: every openat of the missing path must fail"
    );

    let getpid = m.syscall_delta(w.pid, libc::SYS_getpid);
    let openat = m.syscall_delta(w.pid, libc::SYS_openat);
    let (b, a) = m.proc_pair(w.pid);
    let open_class =
        latency_class_count(a, "open_close_sync") - latency_class_count(&b, "open_close_sync");
    let total = a.syscalls.count - b.syscalls.count;
    let total_errors = a.syscalls.errors - b.syscalls.errors;
    eprintln!(
        "observed: getpid (count, errors) = {getpid:?}, openat = {openat:?}, open_close_sync latency count = {open_class}, \
         all syscalls = {total} ({total_errors} errors)"
    );

    assert_eq!(
        getpid,
        (getpids, 0),
        "getpid (count, errors): expected ({getpids}, 0), got {getpid:?}"
    );
    assert_eq!(
        openat,
        (opens, opens),
        "openat (count, errors): expected ({opens}, {opens}), got {openat:?}"
    );
    // Between the snapshots the workload opens nothing else (its `done` line is a write).
    assert_eq!(
        open_class, opens,
        "open_close_sync latency histogram: expected {opens} observations, got {open_class}"
    );
    assert!(
        total >= getpids + opens,
        "process syscall total {total} < {}",
        getpids + opens
    );
    assert!(
        total_errors >= opens,
        "process syscall errors {total_errors} < {opens}"
    );
    w.finish();
}

/// Syscall batching (default on): runs of one syscall (and of its latency bucket) are summed
/// in the kernel and flushed at the thread's next other syscall, switch-out or exit. Threads
/// that end right after a run of getpid(), and a process whose last calls before `_exit` are
/// getpid(), must still be counted exactly, and a run of failing openat() exactly in its
/// latency histogram; the same workloads with batching off give the same counts.
#[test]
fn batched_syscall_runs_are_exact_across_thread_and_process_exit() {
    let _serial = serial();
    for batching in [true, false] {
        let d = Daemon::start(
            if batching { "batched" } else { "unbatched" },
            &format!("[probes]\nsyscall_batching = {batching}\n"),
        );
        let log_says_on = d.log_text().contains("syscall batching on");
        assert_eq!(
            log_says_on, batching,
            "daemon log must say `syscall batching on` exactly when configured on"
        );
        let opens = 777u64;
        let mut w = workload(&["syscalls", "0", &opens.to_string()]);
        let m = measure(&d, &mut w);
        let (b, a) = m.proc_pair(w.pid);
        let open_class =
            latency_class_count(a, "open_close_sync") - latency_class_count(&b, "open_close_sync");
        let openat = m.syscall_delta(w.pid, libc::SYS_openat);
        eprintln!(
            "observed (batching {batching}): openat {openat:?}, open_close_sync latency count {open_class}"
        );
        assert_eq!(
            openat,
            (opens, opens),
            "openat (count, errors), batching {batching}"
        );
        assert_eq!(
            open_class, opens,
            "open_close_sync latency count, batching {batching}"
        );
        w.finish();
        // 10,007 per thread: two full batches of 4,096 and a remainder; 333 before _exit.
        let (threads, per_thread, last) = (4u64, 10_007u64, 333u64);
        let mut w = workload(&[
            "getpid-exit",
            &threads.to_string(),
            &per_thread.to_string(),
            &last.to_string(),
        ]);
        let pid = w.pid;
        let m = measure(&d, &mut w);
        let (before, _) = m.proc_pair(pid);
        let base = syscall(&before, libc::SYS_getpid).0;
        let live = m.syscall_delta(pid, libc::SYS_getpid).0;
        w.finish();
        thread::sleep(SETTLE);
        let t = d.snapshot(pid);
        let p = find_proc(&t, pid);
        let exited = syscall(p, libc::SYS_getpid).0 - base;
        eprintln!(
            "observed (batching {batching}): getpid after the threads ended {live}, after exit {exited}, alive {}",
            p.alive
        );
        assert_eq!(
            live,
            threads * per_thread,
            "getpid of {threads} ended threads x {per_thread} (batching {batching})"
        );
        assert!(!p.alive, "pid {pid} exited but is reported alive");
        assert_eq!(
            exited,
            threads * per_thread + last,
            "getpid after the process exited: the threads' plus the {last} made just before _exit (batching {batching})"
        );
    }
}
