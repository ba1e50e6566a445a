//! Probe attachment: a tracepoint the kernel lacks, and the classic tracepoint fallback.
use ethand_tests::{Daemon, ProbeState, assert_wakeup_not_needed, measure, probe, serial};

use crate::workload;

/// getpid() counted exactly by `d` (the probes that remain must still be exact).
fn assert_getpid_exact(d: &Daemon, n: u64) -> u64 {
    let mut w = workload(&["syscalls", &n.to_string(), "0"]);
    let m = measure(d, &mut w);
    let (count, errors) = m.syscall_delta(w.pid, libc::SYS_getpid);
    w.finish();
    assert_eq!(
        (count, errors),
        (n, 0),
        "getpid (count, errors): expected ({n}, 0)"
    );
    count
}

/// A configured tracepoint that does not exist: that probe is "unsupported" with a reason,
/// the daemon runs, every other probe is attached and syscall counting stays exact. Every
/// probe has a BTF program on this kernel, so the classic tracepoints are asked for
/// (prefer_btf = false) for the configured one to matter.
#[test]
fn missing_tracepoint_is_reported_unsupported_and_the_rest_works() {
    let _serial = serial();
    let d = Daemon::start(
        "unsupported",
        "[probes]\nprefer_btf = false\n\
         [probes.tracepoints]\nsched_process_exec = \"sched/no_such_event\"\n",
    );
    let status = d.status();
    let p = probe(&status.probes, "sched_process_exec");
    eprintln!(
        "observed: sched_process_exec {:?} at {:?}: {:?}",
        p.state, p.attach_point, p.detail
    );
    assert_eq!(
        p.state,
        ProbeState::Unsupported,
        "sched_process_exec: {p:?}"
    );
    assert!(
        p.detail.contains("sched/no_such_event"),
        "sched_process_exec's detail does not name the tracepoint: {:?}",
        p.detail
    );
    // The kernel probes; GPU uprobes wait for a runtime library and device collectors for a
    // driver, neither of which this machine has.
    let others: Vec<_> = status
        .probes
        .iter()
        .filter(|q| !q.name.starts_with("uprobe_") && !q.name.starts_with("collector_"))
        .filter(|q| q.name != "sched_process_exec" && q.name != "sched_wakeup")
        .filter(|q| q.state != ProbeState::Attached)
        .collect();
    assert!(others.is_empty(), "other probes not attached: {others:?}");
    assert_wakeup_not_needed(&status.probes);
    let n = assert_getpid_exact(&d, 10_000);
    eprintln!("observed: getpid count {n}");
}

/// prefer_btf = false: scheduler, syscall, block, socket and lifecycle probes run on the classic
/// tracepoints and counting stays exact (syscalls, context switches against the kernel's
/// counters, O_DIRECT bytes, TCP and UDP bytes and connections).
#[test]
fn classic_tracepoints_when_btf_is_not_preferred() {
    let _serial = serial();
    let d = Daemon::start("classic", "[probes]\nprefer_btf = false\n");
    let status = d.status();
    for (name, at) in [
        ("sched_switch", "tracepoint/sched/sched_switch"),
        ("sys_enter", "tracepoint/raw_syscalls/sys_enter"),
        ("sys_exit", "tracepoint/raw_syscalls/sys_exit"),
        ("block_start", "tracepoint/block/block_io_start"),
        ("block_issue", "tracepoint/block/block_rq_issue"),
        ("block_complete", "tracepoint/block/block_rq_complete"),
        ("sock_send_length", "tracepoint/sock/sock_send_length"),
        ("sock_recv_length", "tracepoint/sock/sock_recv_length"),
        ("inet_sock_set_state", "tracepoint/sock/inet_sock_set_state"),
        ("tcp_retransmit_skb", "tracepoint/tcp/tcp_retransmit_skb"),
        ("tcp_send_reset", "tracepoint/tcp/tcp_send_reset"),
        ("tcp_receive_reset", "tracepoint/tcp/tcp_receive_reset"),
        ("sched_process_exec", "tracepoint/sched/sched_process_exec"),
        ("sched_process_exit", "tracepoint/sched/sched_process_exit"),
    ] {
        let p = probe(&status.probes, name);
        eprintln!("observed: {name} {:?} at {:?}", p.state, p.attach_point);
        assert_eq!(
            (p.state, p.attach_point.as_str()),
            (ProbeState::Attached, at),
            "{name}: {p:?}"
        );
    }
    assert_wakeup_not_needed(&status.probes);
    let n = assert_getpid_exact(&d, 10_000);
    eprintln!("observed: getpid count {n}");
    crate::sched::assert_ping_pong(&d, 1000);
    crate::block::assert_direct_io_exact(&d, "classic", true);
    crate::net::assert_net_exact(&d);
}
