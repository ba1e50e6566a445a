//! Syscall counting: counts and errors per syscall number, latency classes.
use ethand_tests::{Daemon, latency_class_count, measure, serial};

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
    assert!(
        open_class >= opens,
        "open_close_sync latency histogram: expected >= {opens} observations, got {open_class}"
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
