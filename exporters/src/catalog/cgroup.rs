//! Per-cgroup series: totals of every process of the cgroup, exited ones included, whatever
//! the selection.
use super::labels::{DIRECTION, OFFCPU_REASON, PROTOCOL};
use super::{
    Metric, Num, Otel, OtelKind, Per, Sample, Subject, counter, gauge, label, net_bytes, otel,
};

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        counter(
            "ethand_cgroup_cpu_seconds_total",
            "CPU time of all the cgroup's processes, exited ones included (sched_switch).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.cpu.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for c in &s.snap.cgroups {
                o.sample(Subject::Cgroup(c), &[], Sample::Nanos(c.oncpu_ns));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_cgroup_offcpu_seconds_total",
            "Off-CPU time, blocked or preempted, of all the cgroup's processes, exited ones included \
             (sched_switch).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.offcpu.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for c in &s.snap.cgroups {
                let id = Subject::Cgroup(c);
                o.sample(id, &["blocked"], Sample::Nanos(c.offcpu_blocked_ns));
                o.sample(id, &["preempted"], Sample::Nanos(c.offcpu_preempted_ns));
            }
        },
    )
    .labels(&[OFFCPU_REASON]),
    Metric::new(
        counter(
            "ethand_cgroup_runq_wait_seconds_total",
            "Time all the cgroup's processes, exited ones included, waited runnable for a CPU \
             (sched_switch; sched_wakeup where the kernel keeps no run_delay).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.runq.wait.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for c in &s.snap.cgroups {
                o.sample(Subject::Cgroup(c), &[], Sample::Nanos(c.runq_wait_ns));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_cgroup_syscalls_total",
            "System calls of all the cgroup's processes, exited ones included (raw_syscalls \
             sys_enter, sys_exit).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.syscalls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for c in &s.snap.cgroups {
                o.sample(Subject::Cgroup(c), &[], Sample::Int(c.syscalls));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_cgroup_syscall_seconds_total",
            "Time in system calls of all the cgroup's processes, exited ones included \
             (raw_syscalls sys_enter, sys_exit).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.syscall.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for c in &s.snap.cgroups {
                o.sample(Subject::Cgroup(c), &[], Sample::Nanos(c.syscall_time_ns));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_cgroup_block_io_bytes_total",
            "Block I/O bytes, by op, of all the cgroup's processes, exited ones included \
             (block_io_start, block_rq_complete).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.block.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for c in &s.snap.cgroups {
                let id = Subject::Cgroup(c);
                o.sample(id, &["read"], Sample::Int(c.block_read_bytes));
                o.sample(id, &["write"], Sample::Int(c.block_write_bytes));
            }
        },
    )
    .labels(&[label("op", "ethand.block.op").values("read, write")]),
    Metric::new(
        counter(
            "ethand_cgroup_network_bytes_total",
            "TCP and UDP bytes sent or received by all the cgroup's processes, exited ones \
             included (sock_send_length, sock_recv_length).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.network.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for c in &s.snap.cgroups {
                for (protocol, direction, bytes) in net_bytes(&c.net) {
                    o.sample(Subject::Cgroup(c), &[protocol, direction], Sample::Int(bytes));
                }
            }
        },
    )
    .labels(&[PROTOCOL, DIRECTION]),
    Metric::new(
        gauge(
            "ethand_cgroup_processes",
            "Processes of the cgroup that ethand tracks now, exited ones within the grace period \
             included (sched_process_exec, sched_process_exit).",
        ),
        Per::Cgroup,
        Otel::Metric(otel("ethand.cgroup.processes", "{process}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for c in &s.snap.cgroups {
                o.sample(Subject::Cgroup(c), &[], Sample::Int(c.processes));
            }
        },
    ),
];
