//! Per-process series (scheduler, syscalls, block I/O, network, threads, workload), for the
//! processes the export selection picks.
use super::labels::{BLOCK_DEVICE, BLOCK_OP, DIRECTION, OFFCPU_REASON, PROTOCOL};
use super::{
    Metric, Num, Otel, OtelKind, Per, Sample, counter, device_label, gauge, histogram, label,
    net_bytes, otel,
};

const SYSCALL: super::Label =
    label("syscall", "ethand.syscall").values("8 with the most time, then \"other\"");

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        counter(
            "ethand_process_cpu_seconds_total",
            "Time the process's threads ran on a CPU: the kernel's own charge (sum_exec_runtime, as in /proc/PID/schedstat) (sched_switch).",
        ),
        Per::Process,
        Otel::Metric(otel("process.cpu.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &[], Sample::Nanos(p.sched.oncpu_ns));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_offcpu_seconds_total",
            "Time the process's threads were off CPU, by how they left it: blocked (sleep or I/O, plus \
             the run-queue wait after wakeup) or preempted (sched_switch).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.offcpu.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &["blocked"], Sample::Nanos(p.sched.offcpu_blocked_ns));
                o.sample(id, &["preempted"], Sample::Nanos(p.sched.offcpu_preempted_ns));
            }
        },
    )
    .labels(&[OFFCPU_REASON]),
    Metric::new(
        histogram(
            "ethand_process_runq_wait_seconds",
            "Waits of the process's threads for a CPU while runnable, one observation per wait: the \
             kernel's run_delay, read at sched_switch (timed from sched_wakeup where the kernel keeps \
             none).",
        ),
        Per::Process,
        Otel::Histogram {
            sum: Some(otel("ethand.process.runq.wait.time", "s", OtelKind::Counter, Num::Float)),
            count: Some(otel("ethand.process.runq.waits", "{wait}", OtelKind::Counter, Num::Int)),
        },
        |s, o| {
            for (id, p) in s.processes() {
                let counts = &p.sched.runq_wait_hist;
                o.sample(id, &[], Sample::Hist { counts, sum_ns: p.sched.runq_wait_ns });
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_context_switches_total",
            "Context switches of the process's threads: voluntary (blocked) or involuntary (preempted) \
             (sched_switch).",
        ),
        Per::Process,
        Otel::Metric(otel("process.context_switches", "{count}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &["voluntary"], Sample::Int(p.sched.voluntary_switches));
                o.sample(id, &["involuntary"], Sample::Int(p.sched.involuntary_switches));
            }
        },
    )
    .labels(&[label("kind", "process.context_switch_type").values("voluntary, involuntary")]),
    Metric::new(
        counter(
            "ethand_process_syscalls_total",
            "System calls made by the process, for the 8 syscalls with the most time and the rest as \
             syscall=\"other\" (raw_syscalls sys_enter, sys_exit).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.syscalls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for ((id, _), top) in s.processes().zip(s.top_syscalls()) {
                for sc in top {
                    o.sample(id, &[&sc.name], Sample::Int(sc.count));
                }
            }
        },
    )
    .labels(&[SYSCALL]),
    Metric::new(
        counter(
            "ethand_process_syscall_errors_total",
            "System calls of the process that returned an error, for the 8 syscalls with the most time \
             and the rest as syscall=\"other\" (raw_syscalls sys_exit).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.syscall.errors", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for ((id, _), top) in s.processes().zip(s.top_syscalls()) {
                for sc in top {
                    o.sample(id, &[&sc.name], Sample::Int(sc.errors));
                }
            }
        },
    )
    .labels(&[SYSCALL]),
    Metric::new(
        counter(
            "ethand_process_syscall_seconds_total",
            "Time the process spent in system calls, for the 8 syscalls with the most time and the rest \
             as syscall=\"other\" (raw_syscalls sys_enter, sys_exit).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.syscall.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for ((id, _), top) in s.processes().zip(s.top_syscalls()) {
                for sc in top {
                    o.sample(id, &[&sc.name], Sample::Nanos(sc.time_ns));
                }
            }
        },
    )
    .labels(&[SYSCALL]),
    Metric::new(
        histogram(
            "ethand_process_syscall_latency_seconds",
            "Latency of the process's blocking system calls by class (read_write, futex, poll, sleep, \
             io_uring, open_close_sync, net); the sum is estimated from bucket midpoints, calls over \
             2.1 s count as 2.1 s (raw_syscalls sys_enter, sys_exit).",
        ),
        Per::Process,
        Otel::Histogram {
            sum: None,
            count: Some(otel(
                "ethand.process.syscall.blocking.calls",
                "{call}",
                OtelKind::Counter,
                Num::Int,
            )),
        },
        |s, o| {
            for (id, p) in s.processes() {
                for h in &p.syscalls.latency {
                    o.sample(id, &[&h.class], Sample::HistEstimated(&h.buckets));
                }
            }
        },
    )
    .labels(&[label("class", "ethand.syscall.class")
        .values("read_write, futex, poll, sleep, io_uring, open_close_sync, net")]),
    Metric::new(
        counter(
            "ethand_process_block_io_bytes_total",
            "Bytes of the block I/O requests the process submitted, by device and op, counted at \
             completion (block_io_start, block_rq_complete).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.block.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                for b in &p.block {
                    o.sample(id, &[device_label(b), &b.op], Sample::Int(b.bytes));
                }
            }
        },
    )
    .labels(&[BLOCK_DEVICE, BLOCK_OP]),
    Metric::new(
        counter(
            "ethand_process_block_io_operations_total",
            "Block I/O requests the process submitted, by device and op, counted at completion \
             (block_io_start, block_rq_complete).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.block.operations",
            "{operation}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for (id, p) in s.processes() {
                for b in &p.block {
                    o.sample(id, &[device_label(b), &b.op], Sample::Int(b.ops));
                }
            }
        },
    )
    .labels(&[BLOCK_DEVICE, BLOCK_OP]),
    Metric::new(
        counter(
            "ethand_process_network_bytes_total",
            "Bytes the process's TCP and UDP sockets sent (transmit) or received (receive) \
             (sock_send_length, sock_recv_length).",
        ),
        Per::Process,
        Otel::Metric(otel("process.network.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                for (protocol, direction, bytes) in net_bytes(&p.net) {
                    o.sample(id, &[protocol, direction], Sample::Int(bytes));
                }
            }
        },
    )
    .labels(&[PROTOCOL, DIRECTION]),
    Metric::new(
        counter(
            "ethand_process_tcp_retransmits_total",
            "TCP segments retransmitted on the process's sockets (tcp_retransmit_skb).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.tcp.retransmits",
            "{segment}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &[], Sample::Int(p.net.tcp_retransmits));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_tcp_connections_opened_total",
            "TCP connections the process opened with connect() that reached ESTABLISHED \
             (inet_sock_set_state).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.tcp.connections.opened",
            "{connection}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &[], Sample::Int(p.net.tcp_active_opens));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_tcp_connections_closed_total",
            "TCP connections of the process that closed after being open (inet_sock_set_state).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.tcp.connections.closed",
            "{connection}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &[], Sample::Int(p.net.tcp_closes));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_tcp_resets_total",
            "TCP resets the process's sockets sent or received (tcp_send_reset, tcp_receive_reset).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.tcp.resets", "{reset}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                o.sample(id, &["sent"], Sample::Int(p.net.tcp_resets_sent));
                o.sample(id, &["received"], Sample::Int(p.net.tcp_resets_received));
            }
        },
    )
    .labels(&[super::Label {
        otel: super::OtelLabel::Renamed(
            "network.io.direction",
            &[("sent", "transmit"), ("received", "receive")],
        ),
        ..label("direction", "").values("sent, received")
    }]),
    Metric::new(
        gauge(
            "ethand_process_threads",
            "Live threads of the process (sched_wakeup_new, sched_switch, sched_process_exit).",
        ),
        Per::Process,
        Otel::Metric(otel("process.thread.count", "{thread}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                let alive = p.threads.iter().filter(|t| t.alive).count() as u64;
                o.sample(id, &[], Sample::Int(alive));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_major_page_faults_total",
            "Major page faults of the process since it started: accesses that waited for a page to \
             be read from disk or swap; no series where it was not read (/proc/PID/stat majflt).",
        ),
        Per::Process,
        Otel::NotExported("process.paging.faults of ethand_process_page_faults_total holds them"),
        |s, o| {
            for (id, p) in s.processes() {
                let faults = p.major_faults.or(p.memory.as_ref().and_then(|m| m.major_faults));
                if let Some(faults) = faults {
                    o.sample(id, &[], Sample::Int(faults));
                }
            }
        },
    ),
    Metric::new(
        gauge(
            "ethand_process_memory_rss_bytes",
            "Resident memory of the process by kind: anonymous (heap, stacks), file (mapped files, \
             code) and shmem (/dev/shm, memfd, shared anonymous); their sum is the RSS \
             (/proc/PID/status RssAnon, RssFile, RssShmem: sampled each round the process ran and \
             every 10 rounds; no series where it was not read).",
        ),
        Per::Process,
        Otel::Metric(otel("process.memory.usage", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                let Some(m) = &p.memory else { continue };
                for (kind, v) in [
                    ("anon", m.anon_bytes),
                    ("file", m.file_bytes),
                    ("shmem", m.shmem_bytes),
                ] {
                    if let Some(v) = v {
                        o.sample(id, &[kind], Sample::Int(v));
                    }
                }
            }
        },
    )
    .labels(&[label("kind", "ethand.memory.kind").values("anon, file, shmem")]),
    Metric::new(
        gauge(
            "ethand_process_memory_swap_bytes",
            "Memory of the process swapped out (/proc/PID/status VmSwap, read as \
             ethand_process_memory_rss_bytes).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.memory.swap", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                if let Some(v) = p.memory.as_ref().and_then(|m| m.swap_bytes) {
                    o.sample(id, &[], Sample::Int(v));
                }
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_page_faults_total",
            "Page faults of the process since it started: minor (the page was in memory) and major \
             (it waited for a read from disk or swap) (/proc/PID/stat minflt, majflt, read every 10 \
             rounds; no series where it was not read).",
        ),
        Per::Process,
        Otel::Metric(otel("process.paging.faults", "{fault}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                let Some(m) = &p.memory else { continue };
                for (kind, v) in [("minor", m.minor_faults), ("major", m.major_faults)] {
                    if let Some(v) = v {
                        o.sample(id, &[kind], Sample::Int(v));
                    }
                }
            }
        },
    )
    .labels(&[label("kind", "system.paging.fault.type").values("minor, major")]),
    Metric::new(
        gauge(
            "ethand_process_workload_info",
            "Value 1 for each process with per-process series whose container, pod, job or rank is \
             known: labels container_id, container_runtime, pod_uid and qos_class besides the ones on \
             every per-process series (cgroup v2 path, container runtime metadata, allow-listed \
             environment variables, NCCL). Join on pid for series that lack them.",
        ),
        Per::Process,
        Otel::NotExported("container, pod, job and rank are attributes of every per-process point"),
        |s, o| {
            for (id, p) in s.processes() {
                let Some(w) = &p.workload else { continue };
                let values = [
                    &w.container_id,
                    &w.container_runtime,
                    &w.pod_uid,
                    &w.qos_class,
                ]
                .map(|v| v.as_deref().unwrap_or_default());
                o.sample(id, &values, Sample::Int(1));
            }
        },
    )
    .labels(&[
        label("container_id", "container.id").omit_empty(),
        label("container_runtime", "container.runtime").omit_empty(),
        label("pod_uid", "k8s.pod.uid").omit_empty(),
        label("qos_class", "ethand.qos_class").omit_empty(),
    ]),
];
