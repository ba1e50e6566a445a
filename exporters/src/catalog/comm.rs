//! Per process name (comm) series: every process, exited ones included, whatever the selection.
use super::labels::COMM;
use super::{Metric, Num, Otel, OtelKind, Per, Sample, Subject, counter, gauge, otel};

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        counter(
            "ethand_comm_cpu_seconds_total",
            "CPU time of all processes with this name (comm), exited ones included, charged each \
             round to the name the process had then; short-lived processes without series of their \
             own are here, and names beyond the first 128 are summed under comm=\"[other names]\" \
             (sched_switch).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.comm.cpu.time",
            "s",
            OtelKind::Counter,
            Num::Float,
        )),
        |s, o| {
            for c in &s.snap.comms {
                o.sample(Subject::Node, &[&c.comm], Sample::Nanos(c.oncpu_ns));
            }
        },
    )
    .labels(&[COMM]),
    Metric::new(
        counter(
            "ethand_comm_runq_wait_seconds_total",
            "Time all processes with this name, exited ones included, waited runnable for a CPU \
             (sched_switch; sched_wakeup where the kernel keeps no run_delay).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.comm.runq.wait.time",
            "s",
            OtelKind::Counter,
            Num::Float,
        )),
        |s, o| {
            for c in &s.snap.comms {
                o.sample(Subject::Node, &[&c.comm], Sample::Nanos(c.runq_wait_ns));
            }
        },
    )
    .labels(&[COMM]),
    Metric::new(
        counter(
            "ethand_comm_syscalls_total",
            "System calls of all processes with this name, exited ones included (raw_syscalls \
             sys_enter, sys_exit).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.comm.syscalls",
            "{call}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for c in &s.snap.comms {
                o.sample(Subject::Node, &[&c.comm], Sample::Int(c.syscalls));
            }
        },
    )
    .labels(&[COMM]),
    Metric::new(
        gauge(
            "ethand_comm_processes",
            "Processes with this name that ethand tracks now, exited ones within the grace period \
             included (sched_process_exec, sched_process_exit).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.comm.processes",
            "{process}",
            OtelKind::Gauge,
            Num::Int,
        )),
        |s, o| {
            for c in &s.snap.comms {
                o.sample(Subject::Node, &[&c.comm], Sample::Int(c.processes));
            }
        },
    )
    .labels(&[COMM]),
    Metric::new(
        counter(
            "ethand_comm_exited_processes_total",
            "Processes with this name that exited and left ethand's model, so the birth rate of \
             short-lived ones by name (sched_process_exit).",
        ),
        Per::Node,
        Otel::Metric(otel(
            "ethand.comm.exited.processes",
            "{process}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for c in &s.snap.comms {
                o.sample(Subject::Node, &[&c.comm], Sample::Int(c.exited));
            }
        },
    )
    .labels(&[COMM]),
];
