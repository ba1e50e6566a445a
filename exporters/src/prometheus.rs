//! Prometheus text exposition (format 0.0.4) of a [`NodeSnapshot`].
//!
//! Cardinality is bounded: only the processes [`PrometheusOptions`] selects get per-process
//! series (labels `pid`, `comm`). Per-cgroup series render `NodeSnapshot::cgroups` (totals of
//! every process of the cgroup, exited ones included) and the node block latency histograms
//! `NodeSnapshot::block_devices`, whatever the selection. Per process, syscalls beyond the
//! [`TOP_SYSCALLS`] with the most time are summed into `syscall="other"`. The kernel's log2
//! histograms become classic Prometheus histograms.
//!
//! Every family is declared once in `FAMILIES`: [`render`] registers families by that
//! declaration and [`metric_catalog`] lists it, so documentation and output cannot drift.
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{
    self as snapshot, CgroupSnapshot, CommSnapshot, HIST_BUCKETS, NodeSnapshot, ProbeState,
    ProcessSnapshot, SelfStatus, SyscallRow,
};

/// `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Per process, syscalls beyond this many (ranked by time) are summed into `syscall="other"`.
pub const TOP_SYSCALLS: usize = 8;

/// What /metrics renders besides the node-wide series. Every process, selected or not, is
/// also counted in its cgroup's and its name's series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrometheusOptions {
    /// Which processes get per-process series.
    pub selection: ExportSelection,
    /// Also expose the GPU series under dcgm-exporter's names and labels (`DCGM_FI_DEV_*`).
    pub dcgm_aliases: bool,
}

/// Renders the snapshot in the Prometheus text format ([`CONTENT_TYPE`]).
pub fn render(snap: &NodeSnapshot, opts: &PrometheusOptions) -> String {
    // Sized from the selection: ~100 bytes a sample line, ~170 lines a selected process.
    let mut registry =
        Exposition::with_capacity(64 * 1024 + snap.processes.len().min(100_000) * 2048);
    let selected: Vec<&ProcessSnapshot> = opts
        .selection
        .indices(&snap.processes)
        .into_iter()
        .map(|i| &snap.processes[i])
        .collect();
    register_processes(&mut registry, &selected);
    crate::prometheus_gpu::register_process_gpu(&mut registry, &selected);
    register_cgroups(&mut registry, &snap.cgroups);
    register_comms(&mut registry, &snap.comms);
    register_block_latency(&mut registry, &snap.block_devices);
    register_self(&mut registry, &snap.ethand);
    crate::prometheus_devices::register_devices(&mut registry, &snap.devices, opts.dcgm_aliases);
    registry.out
}

/// Every family [`render`] can emit: (name as exposed, type, help text).
pub fn metric_catalog() -> Vec<(&'static str, &'static str, &'static str)> {
    FAMILIES
        .iter()
        .chain(crate::prometheus_gpu::GPU_FAMILIES)
        .chain(crate::prometheus_devices::DEVICE_FAMILIES)
        .map(|d| (d.name, d.kind.as_str(), d.help))
        .collect()
}

/// The metric types ethand exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Desc {
    /// As exposed: counters include `_total`.
    name: &'static str,
    kind: MetricType,
    help: &'static str,
}

pub(crate) const fn counter(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Counter,
        help,
    }
}
pub(crate) const fn gauge(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Gauge,
        help,
    }
}
const fn histogram(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Histogram,
        help,
    }
}

const PROCESS_CPU: Desc = counter(
    "ethand_process_cpu_seconds_total",
    "Time the process's threads ran on a CPU: the kernel's own charge (sum_exec_runtime, as in /proc/PID/schedstat) (sched_switch).",
);
const PROCESS_OFFCPU: Desc = counter(
    "ethand_process_offcpu_seconds_total",
    "Time the process's threads were off CPU, by how they left it: blocked (sleep or I/O, plus \
     the run-queue wait after wakeup) or preempted (sched_switch).",
);
const PROCESS_RUNQ_WAIT: Desc = histogram(
    "ethand_process_runq_wait_seconds",
    "Waits of the process's threads for a CPU while runnable, one observation per wait: the \
     kernel's run_delay, read at sched_switch (timed from sched_wakeup where the kernel keeps \
     none).",
);
const PROCESS_SWITCHES: Desc = counter(
    "ethand_process_context_switches_total",
    "Context switches of the process's threads: voluntary (blocked) or involuntary (preempted) \
     (sched_switch).",
);
const PROCESS_SYSCALLS: Desc = counter(
    "ethand_process_syscalls_total",
    "System calls made by the process, for the 8 syscalls with the most time and the rest as \
     syscall=\"other\" (raw_syscalls sys_enter, sys_exit).",
);
const PROCESS_SYSCALL_ERRORS: Desc = counter(
    "ethand_process_syscall_errors_total",
    "System calls of the process that returned an error, for the 8 syscalls with the most time \
     and the rest as syscall=\"other\" (raw_syscalls sys_exit).",
);
const PROCESS_SYSCALL_TIME: Desc = counter(
    "ethand_process_syscall_seconds_total",
    "Time the process spent in system calls, for the 8 syscalls with the most time and the rest \
     as syscall=\"other\" (raw_syscalls sys_enter, sys_exit).",
);
const PROCESS_SYSCALL_LATENCY: Desc = histogram(
    "ethand_process_syscall_latency_seconds",
    "Latency of the process's blocking system calls by class (read_write, futex, poll, sleep, \
     io_uring, open_close_sync, net); the sum is estimated from bucket midpoints, calls over \
     2.1 s count as 2.1 s (raw_syscalls sys_enter, sys_exit).",
);
const PROCESS_BLOCK_BYTES: Desc = counter(
    "ethand_process_block_io_bytes_total",
    "Bytes of the block I/O requests the process submitted, by device and op, counted at \
     completion (block_io_start, block_rq_complete).",
);
const PROCESS_BLOCK_OPS: Desc = counter(
    "ethand_process_block_io_operations_total",
    "Block I/O requests the process submitted, by device and op, counted at completion \
     (block_io_start, block_rq_complete).",
);
const PROCESS_NET_BYTES: Desc = counter(
    "ethand_process_network_bytes_total",
    "Bytes the process's TCP and UDP sockets sent (transmit) or received (receive) \
     (sock_send_length, sock_recv_length).",
);
const PROCESS_TCP_RETRANSMITS: Desc = counter(
    "ethand_process_tcp_retransmits_total",
    "TCP segments retransmitted on the process's sockets (tcp_retransmit_skb).",
);
const PROCESS_TCP_OPENED: Desc = counter(
    "ethand_process_tcp_connections_opened_total",
    "TCP connections the process opened with connect() that reached ESTABLISHED \
     (inet_sock_set_state).",
);
const PROCESS_TCP_CLOSED: Desc = counter(
    "ethand_process_tcp_connections_closed_total",
    "TCP connections of the process that closed after being open (inet_sock_set_state).",
);
const PROCESS_TCP_RESETS: Desc = counter(
    "ethand_process_tcp_resets_total",
    "TCP resets the process's sockets sent or received (tcp_send_reset, tcp_receive_reset).",
);
const PROCESS_THREADS: Desc = gauge(
    "ethand_process_threads",
    "Live threads of the process (sched_wakeup_new, sched_switch, sched_process_exit).",
);
const PROCESS_WORKLOAD_INFO: Desc = gauge(
    "ethand_process_workload_info",
    "Value 1 for each process with per-process series whose container, pod, job or rank is \
     known: labels container_id, container_runtime, pod_uid and qos_class besides the ones on \
     every per-process series (cgroup v2 path, container runtime metadata, allow-listed \
     environment variables, NCCL). Join on pid for series that lack them.",
);

const COMM_CPU: Desc = counter(
    "ethand_comm_cpu_seconds_total",
    "CPU time of all processes with this name (comm), exited ones included, charged each \
     round to the name the process had then; short-lived processes without series of their \
     own are here, and names beyond the first 128 are summed under comm=\"[other names]\" \
     (sched_switch).",
);
const COMM_RUNQ_WAIT: Desc = counter(
    "ethand_comm_runq_wait_seconds_total",
    "Time all processes with this name, exited ones included, waited runnable for a CPU \
     (sched_switch; sched_wakeup where the kernel keeps no run_delay).",
);
const COMM_SYSCALLS: Desc = counter(
    "ethand_comm_syscalls_total",
    "System calls of all processes with this name, exited ones included (raw_syscalls \
     sys_enter, sys_exit).",
);
const COMM_PROCESSES: Desc = gauge(
    "ethand_comm_processes",
    "Processes with this name that ethand tracks now, exited ones within the grace period \
     included (sched_process_exec, sched_process_exit).",
);
const COMM_EXITED: Desc = counter(
    "ethand_comm_exited_processes_total",
    "Processes with this name that exited and left ethand's model, so the birth rate of \
     short-lived ones by name (sched_process_exit).",
);

const CGROUP_CPU: Desc = counter(
    "ethand_cgroup_cpu_seconds_total",
    "CPU time of all the cgroup's processes, exited ones included (sched_switch).",
);
const CGROUP_OFFCPU: Desc = counter(
    "ethand_cgroup_offcpu_seconds_total",
    "Off-CPU time, blocked or preempted, of all the cgroup's processes, exited ones included \
     (sched_switch).",
);
const CGROUP_RUNQ_WAIT: Desc = counter(
    "ethand_cgroup_runq_wait_seconds_total",
    "Time all the cgroup's processes, exited ones included, waited runnable for a CPU \
     (sched_switch; sched_wakeup where the kernel keeps no run_delay).",
);
const CGROUP_SYSCALLS: Desc = counter(
    "ethand_cgroup_syscalls_total",
    "System calls of all the cgroup's processes, exited ones included (raw_syscalls \
     sys_enter, sys_exit).",
);
const CGROUP_SYSCALL_TIME: Desc = counter(
    "ethand_cgroup_syscall_seconds_total",
    "Time in system calls of all the cgroup's processes, exited ones included \
     (raw_syscalls sys_enter, sys_exit).",
);
const CGROUP_BLOCK_BYTES: Desc = counter(
    "ethand_cgroup_block_io_bytes_total",
    "Block I/O bytes, by op, of all the cgroup's processes, exited ones included \
     (block_io_start, block_rq_complete).",
);
const CGROUP_NET_BYTES: Desc = counter(
    "ethand_cgroup_network_bytes_total",
    "TCP and UDP bytes sent or received by all the cgroup's processes, exited ones \
     included (sock_send_length, sock_recv_length).",
);
const CGROUP_PROCESSES: Desc = gauge(
    "ethand_cgroup_processes",
    "Processes of the cgroup that ethand tracks now, exited ones within the grace period \
     included (sched_process_exec, sched_process_exit).",
);

const BLOCK_QUEUE: Desc = histogram(
    "ethand_block_io_queue_seconds",
    "Time block I/O requests waited between submission and dispatch to the device, by device \
     and op, all processes, exited ones included (block_io_start to block_rq_issue).",
);
const BLOCK_SERVICE: Desc = histogram(
    "ethand_block_io_service_seconds",
    "Time the device took to complete block I/O requests, by device and op, all processes \
     (block_rq_issue to block_rq_complete).",
);

const BUILD_INFO: Desc = gauge("ethand_build_info", "ethand's version, value always 1.");
const PROBE_STATE: Desc = gauge(
    "ethand_probe_state",
    "1 for each probe's current state (attached, unsupported, disabled, failed), 0 for the \
     others; `ethand status` says why a probe is not attached.",
);
const PROGRAM_RUNS: Desc = counter(
    "ethand_bpf_program_runs_total",
    "Runs of each of ethand's BPF programs while the kernel's BPF statistics were on \
     (ethand_bpf_stats_enabled_seconds_total; kernel BPF run statistics).",
);
const PROGRAM_TIME: Desc = counter(
    "ethand_bpf_program_run_seconds_total",
    "Time spent running each of ethand's BPF programs while the kernel's BPF statistics \
     were on (kernel BPF run statistics).",
);
const MAP_ENTRIES: Desc = gauge(
    "ethand_bpf_map_entries",
    "Entries in each of ethand's BPF maps.",
);
const MAP_CAPACITY: Desc = gauge(
    "ethand_bpf_map_capacity_entries",
    "Maximum entries of each of ethand's BPF maps.",
);
const DROPPED: Desc = counter(
    "ethand_bpf_dropped_events_total",
    "Events ethand could not account, by reason (map full, ring buffer full, wakeup slot \
     taken); loss=\"false\" marks informational cases: mismatches that lose no data and \
     events the kernel did not report (switch_in_unseen).",
);
const STATS_ENABLED: Desc = counter(
    "ethand_bpf_stats_enabled_seconds_total",
    "Time the kernel's BPF run-time statistics were on (daemon.bpf_stats): the window that \
     ethand_bpf_program_runs_total and ethand_bpf_program_run_seconds_total cover.",
);
const SELF_CPU: Desc = counter(
    "ethand_self_cpu_seconds_total",
    "CPU time used by the ethand daemon, user and system.",
);
const SELF_RSS: Desc = gauge(
    "ethand_self_resident_memory_bytes",
    "Resident memory of the ethand daemon.",
);
const TRACKED: Desc = gauge(
    "ethand_tracked_processes",
    "Processes in ethand's model, exited ones within the grace period included.",
);
const OVERFLOW: Desc = counter(
    "ethand_processes_overflow_total",
    "Processes ethand did not track because its model held max_processes already.",
);
const OTLP_EXPORTS: Desc = counter(
    "ethand_otlp_exports_total",
    "OTLP export requests by result (ok, failed); each retry of a failed batch counts \
     (0 while [otlp] is off; docs/otlp.md).",
);
const OTLP_LAST_EXPORT: Desc = gauge(
    "ethand_otlp_last_export_duration_seconds",
    "How long the last successful OTLP export request took: encoding the batch, sending it and \
     the endpoint's answer (0 before the first, and while [otlp] is off; docs/otlp.md).",
);
const OTLP_DROPPED: Desc = counter(
    "ethand_otlp_dropped_batches_total",
    "OTLP batches dropped after their retries ran out of the export interval; counters are \
     cumulative, so the next batch carries the totals again (docs/otlp.md).",
);

const SERVER_CONNECTIONS: Desc = gauge(
    "ethand_server_connections",
    "Connections open to ethand's servers: server=\"metrics\" (/metrics) or \"api\" (the \
     local API socket).",
);
const SERVER_REFUSED: Desc = counter(
    "ethand_server_connections_refused_total",
    "Connections closed at once: reason=\"limit\" (the server had prometheus.max_connections \
     or daemon.api_max_connections open) or \"peer_limit\" (that peer, an address and for a \
     local client its user, had prometheus.max_connections_per_peer open).",
);
const SERVER_TIMED_OUT: Desc = counter(
    "ethand_server_connections_timed_out_total",
    "Connections closed for sending a request too slowly, idling, or not reading a reply \
     (prometheus.timeout_ms; 10 s on the local API).",
);
const SERVER_ACCEPT_ERRORS: Desc = counter(
    "ethand_server_accept_errors_total",
    "accept(2) failures of ethand's servers (out of descriptors, say), each followed by a \
     pause of 5 ms to 1 s.",
);

const FAMILIES: &[Desc] = &[
    PROCESS_CPU,
    PROCESS_OFFCPU,
    PROCESS_RUNQ_WAIT,
    PROCESS_SWITCHES,
    PROCESS_SYSCALLS,
    PROCESS_SYSCALL_ERRORS,
    PROCESS_SYSCALL_TIME,
    PROCESS_SYSCALL_LATENCY,
    PROCESS_BLOCK_BYTES,
    PROCESS_BLOCK_OPS,
    PROCESS_NET_BYTES,
    PROCESS_TCP_RETRANSMITS,
    PROCESS_TCP_OPENED,
    PROCESS_TCP_CLOSED,
    PROCESS_TCP_RESETS,
    PROCESS_THREADS,
    PROCESS_WORKLOAD_INFO,
    CGROUP_CPU,
    CGROUP_OFFCPU,
    CGROUP_RUNQ_WAIT,
    CGROUP_SYSCALLS,
    CGROUP_SYSCALL_TIME,
    CGROUP_BLOCK_BYTES,
    CGROUP_NET_BYTES,
    CGROUP_PROCESSES,
    COMM_CPU,
    COMM_RUNQ_WAIT,
    COMM_SYSCALLS,
    COMM_PROCESSES,
    COMM_EXITED,
    BLOCK_QUEUE,
    BLOCK_SERVICE,
    BUILD_INFO,
    PROBE_STATE,
    PROGRAM_RUNS,
    STATS_ENABLED,
    PROGRAM_TIME,
    MAP_ENTRIES,
    MAP_CAPACITY,
    DROPPED,
    SELF_CPU,
    SELF_RSS,
    TRACKED,
    OVERFLOW,
    OTLP_EXPORTS,
    OTLP_DROPPED,
    OTLP_LAST_EXPORT,
    SERVER_CONNECTIONS,
    SERVER_REFUSED,
    SERVER_TIMED_OUT,
    SERVER_ACCEPT_ERRORS,
];

fn register_processes(registry: &mut Exposition, procs: &[&ProcessSnapshot]) {
    let mut cpu = Family::<Nanos>::new(&PROCESS_CPU);
    let mut offcpu = Family::<Nanos>::new(&PROCESS_OFFCPU);
    let mut runq = Family::<Hist>::new(&PROCESS_RUNQ_WAIT);
    let mut switches = Family::<u64>::new(&PROCESS_SWITCHES);
    let mut syscalls = Family::<u64>::new(&PROCESS_SYSCALLS);
    let mut syscall_errors = Family::<u64>::new(&PROCESS_SYSCALL_ERRORS);
    let mut syscall_time = Family::<Nanos>::new(&PROCESS_SYSCALL_TIME);
    let mut syscall_latency = Family::<Hist>::new(&PROCESS_SYSCALL_LATENCY);
    let mut block_bytes = Family::<u64>::new(&PROCESS_BLOCK_BYTES);
    let mut block_ops = Family::<u64>::new(&PROCESS_BLOCK_OPS);
    let mut net_bytes = Family::<u64>::new(&PROCESS_NET_BYTES);
    let mut retransmits = Family::<u64>::new(&PROCESS_TCP_RETRANSMITS);
    let mut opened = Family::<u64>::new(&PROCESS_TCP_OPENED);
    let mut closed = Family::<u64>::new(&PROCESS_TCP_CLOSED);
    let mut resets = Family::<u64>::new(&PROCESS_TCP_RESETS);
    let mut threads = Family::<u64>::new(&PROCESS_THREADS);
    let mut workload = Family::<u64>::new(&PROCESS_WORKLOAD_INFO);

    for (p, base) in procs.iter().zip(process_label_sets(procs)) {
        let id = |extra: &[(&'static str, &str)]| with_extra(&base, extra);
        let s = &p.sched;
        cpu.add(id(&[]), Nanos(s.oncpu_ns));
        offcpu.add(id(&[("reason", "blocked")]), Nanos(s.offcpu_blocked_ns));
        offcpu.add(id(&[("reason", "preempted")]), Nanos(s.offcpu_preempted_ns));
        runq.add(id(&[]), Hist::new(&s.runq_wait_hist, s.runq_wait_ns));
        switches.add(id(&[("kind", "voluntary")]), s.voluntary_switches);
        switches.add(id(&[("kind", "involuntary")]), s.involuntary_switches);

        for sc in top_syscalls(p) {
            let l = id(&[("syscall", sc.name.as_str())]);
            syscalls.add(l.clone(), sc.count);
            syscall_errors.add(l.clone(), sc.errors);
            syscall_time.add(l, Nanos(sc.time_ns));
        }
        for h in &p.syscalls.latency {
            syscall_latency.add(
                id(&[("class", h.class.as_str())]),
                Hist::estimated(&h.buckets),
            );
        }

        for b in &p.block {
            let l = id(&[("device", device_label(b)), ("op", b.op.as_str())]);
            block_bytes.add(l.clone(), b.bytes);
            block_ops.add(l, b.ops);
        }
        for (protocol, direction, bytes) in net_bytes_by_direction(p) {
            net_bytes.add(
                id(&[("protocol", protocol), ("direction", direction)]),
                bytes,
            );
        }
        let n = &p.net;
        retransmits.add(id(&[]), n.tcp_retransmits);
        opened.add(id(&[]), n.tcp_active_opens);
        closed.add(id(&[]), n.tcp_closes);
        resets.add(id(&[("direction", "sent")]), n.tcp_resets_sent);
        resets.add(id(&[("direction", "received")]), n.tcp_resets_received);
        threads.add(id(&[]), p.threads.iter().filter(|t| t.alive).count() as u64);
        if let Some(w) = &p.workload {
            let opt = |v: &Option<String>| v.clone().unwrap_or_default();
            let (cid, rt, uid, qos) = (
                opt(&w.container_id),
                opt(&w.container_runtime),
                opt(&w.pod_uid),
                opt(&w.qos_class),
            );
            let extra: Vec<(&'static str, &str)> = [
                ("container_id", cid.as_str()),
                ("container_runtime", rt.as_str()),
                ("pod_uid", uid.as_str()),
                ("qos_class", qos.as_str()),
            ]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect();
            workload.add(id(&extra), 1);
        }
    }

    cpu.register(registry);
    offcpu.register(registry);
    runq.register(registry);
    switches.register(registry);
    syscalls.register(registry);
    syscall_errors.register(registry);
    syscall_time.register(registry);
    syscall_latency.register(registry);
    block_bytes.register(registry);
    block_ops.register(registry);
    net_bytes.register(registry);
    retransmits.register(registry);
    opened.register(registry);
    closed.register(registry);
    resets.register(registry);
    threads.register(registry);
    workload.register(registry);
}

fn register_comms(registry: &mut Exposition, comms: &[CommSnapshot]) {
    let mut cpu = Family::<Nanos>::new(&COMM_CPU);
    let mut runq = Family::<Nanos>::new(&COMM_RUNQ_WAIT);
    let mut syscalls = Family::<u64>::new(&COMM_SYSCALLS);
    let mut processes = Family::<u64>::new(&COMM_PROCESSES);
    let mut exited = Family::<u64>::new(&COMM_EXITED);
    for c in comms {
        let id = labels(&[("comm", c.comm.as_str())], &[]);
        cpu.add(id.clone(), Nanos(c.oncpu_ns));
        runq.add(id.clone(), Nanos(c.runq_wait_ns));
        syscalls.add(id.clone(), c.syscalls);
        processes.add(id.clone(), c.processes);
        exited.add(id, c.exited);
    }
    cpu.register(registry);
    runq.register(registry);
    syscalls.register(registry);
    processes.register(registry);
    exited.register(registry);
}

fn register_cgroups(registry: &mut Exposition, cgroups: &[CgroupSnapshot]) {
    let mut cpu = Family::<Nanos>::new(&CGROUP_CPU);
    let mut offcpu = Family::<Nanos>::new(&CGROUP_OFFCPU);
    let mut runq = Family::<Nanos>::new(&CGROUP_RUNQ_WAIT);
    let mut syscalls = Family::<u64>::new(&CGROUP_SYSCALLS);
    let mut syscall_time = Family::<Nanos>::new(&CGROUP_SYSCALL_TIME);
    let mut block_bytes = Family::<u64>::new(&CGROUP_BLOCK_BYTES);
    let mut net_bytes = Family::<u64>::new(&CGROUP_NET_BYTES);
    let mut processes = Family::<u64>::new(&CGROUP_PROCESSES);

    for c in cgroups {
        let mut base = labels(&[("cgroup", c.cgroup.as_str())], &[]);
        if let Some(w) = &c.workload {
            base.extend(workload_labels(w, false));
        }
        let id = |extra: &[(&'static str, &str)]| with_extra(&base, extra);
        cpu.add(id(&[]), Nanos(c.oncpu_ns));
        offcpu.add(id(&[("reason", "blocked")]), Nanos(c.offcpu_blocked_ns));
        offcpu.add(id(&[("reason", "preempted")]), Nanos(c.offcpu_preempted_ns));
        runq.add(id(&[]), Nanos(c.runq_wait_ns));
        syscalls.add(id(&[]), c.syscalls);
        syscall_time.add(id(&[]), Nanos(c.syscall_time_ns));
        block_bytes.add(id(&[("op", "read")]), c.block_read_bytes);
        block_bytes.add(id(&[("op", "write")]), c.block_write_bytes);
        let n = &c.net;
        for (protocol, direction, bytes) in [
            ("tcp", "transmit", n.tcp_tx_bytes),
            ("tcp", "receive", n.tcp_rx_bytes),
            ("udp", "transmit", n.udp_tx_bytes),
            ("udp", "receive", n.udp_rx_bytes),
        ] {
            net_bytes.add(
                id(&[("protocol", protocol), ("direction", direction)]),
                bytes,
            );
        }
        processes.add(id(&[]), c.processes);
    }

    cpu.register(registry);
    offcpu.register(registry);
    runq.register(registry);
    syscalls.register(registry);
    syscall_time.register(registry);
    block_bytes.register(registry);
    net_bytes.register(registry);
    processes.register(registry);
}

fn register_block_latency(registry: &mut Exposition, devices: &[snapshot::BlockStats]) {
    let mut queue = Family::<Hist>::new(&BLOCK_QUEUE);
    let mut service = Family::<Hist>::new(&BLOCK_SERVICE);
    for b in devices {
        let l = labels(&[("device", device_label(b)), ("op", b.op.as_str())], &[]);
        queue.add(l.clone(), Hist::new(&b.queue_hist, b.queue_ns));
        service.add(l, Hist::new(&b.service_hist, b.service_ns));
    }
    queue.register(registry);
    service.register(registry);
}

fn register_self(registry: &mut Exposition, me: &SelfStatus) {
    let mut build = Family::<u64>::new(&BUILD_INFO);
    build.add(labels(&[("version", me.version.as_str())], &[]), 1);

    let mut probes = Family::<u64>::new(&PROBE_STATE);
    for p in &me.probes {
        for state in [
            ProbeState::Attached,
            ProbeState::Unsupported,
            ProbeState::Disabled,
            ProbeState::Failed,
            ProbeState::Waiting,
        ] {
            let l = labels(
                &[("probe", p.name.as_str()), ("state", state.as_str())],
                &[],
            );
            probes.add(l, u64::from(p.state == state));
        }
    }

    let mut runs = Family::<u64>::new(&PROGRAM_RUNS);
    let mut run_time = Family::<Nanos>::new(&PROGRAM_TIME);
    for p in &me.programs {
        runs.add(labels(&[("program", p.name.as_str())], &[]), p.run_count);
        run_time.add(
            labels(&[("program", p.name.as_str())], &[]),
            Nanos(p.run_time_ns),
        );
    }

    let mut stats_on = Family::<Nanos>::new(&STATS_ENABLED);
    stats_on.add(Labels::new(), Nanos(me.bpf_stats_enabled_ms * 1_000_000));

    let mut entries = Family::<u64>::new(&MAP_ENTRIES);
    let mut capacity = Family::<u64>::new(&MAP_CAPACITY);
    for m in &me.maps {
        entries.add(labels(&[("map", m.name.as_str())], &[]), m.entries);
        capacity.add(labels(&[("map", m.name.as_str())], &[]), m.capacity);
    }

    let mut dropped = Family::<u64>::new(&DROPPED);
    for d in &me.dropped {
        let loss = if d.loss { "true" } else { "false" };
        dropped.add(
            labels(&[("reason", d.reason.as_str()), ("loss", loss)], &[]),
            d.count,
        );
    }

    let mut cpu = Family::<f64>::new(&SELF_CPU);
    cpu.add(Labels::new(), me.cpu_seconds);
    let mut rss = Family::<u64>::new(&SELF_RSS);
    rss.add(Labels::new(), me.rss_bytes);
    let mut tracked = Family::<u64>::new(&TRACKED);
    tracked.add(Labels::new(), me.tracked_processes);
    let mut overflow = Family::<u64>::new(&OVERFLOW);
    overflow.add(Labels::new(), me.processes_overflow);
    let mut otlp_exports = Family::<u64>::new(&OTLP_EXPORTS);
    let mut otlp_dropped = Family::<u64>::new(&OTLP_DROPPED);
    // Always present (0 while [otlp] is off), so alerts need no absent() special case.
    let o = me.otlp.clone().unwrap_or_default();
    otlp_exports.add(labels(&[("result", "ok")], &[]), o.exports_ok);
    otlp_exports.add(labels(&[("result", "failed")], &[]), o.exports_failed);
    otlp_dropped.add(Labels::new(), o.dropped_batches);
    let mut otlp_last_export = Family::<f64>::new(&OTLP_LAST_EXPORT);
    otlp_last_export.add(Labels::new(), o.last_export_duration_us as f64 / 1e6);
    let mut server_open = Family::<u64>::new(&SERVER_CONNECTIONS);
    let mut server_refused = Family::<u64>::new(&SERVER_REFUSED);
    let mut server_timed_out = Family::<u64>::new(&SERVER_TIMED_OUT);
    let mut server_accept_errors = Family::<u64>::new(&SERVER_ACCEPT_ERRORS);
    for c in &me.servers {
        let server = &[("server", c.server.as_str())];
        server_open.add(labels(server, &[]), c.open);
        server_refused.add(labels(server, &[("reason", "limit")]), c.refused_limit);
        server_refused.add(
            labels(server, &[("reason", "peer_limit")]),
            c.refused_peer_limit,
        );
        server_timed_out.add(labels(server, &[]), c.timed_out);
        server_accept_errors.add(labels(server, &[]), c.accept_errors);
    }

    build.register(registry);
    probes.register(registry);
    runs.register(registry);
    run_time.register(registry);
    stats_on.register(registry);
    entries.register(registry);
    capacity.register(registry);
    dropped.register(registry);
    cpu.register(registry);
    rss.register(registry);
    tracked.register(registry);
    overflow.register(registry);
    otlp_exports.register(registry);
    otlp_dropped.register(registry);
    otlp_last_export.register(registry);
    server_open.register(registry);
    server_refused.register(registry);
    server_timed_out.register(registry);
    server_accept_errors.register(registry);
}

/// The counters behind one `syscall` label value.
pub(crate) struct SyscallSeries {
    pub(crate) name: String,
    pub(crate) count: u64,
    pub(crate) errors: u64,
    pub(crate) time_ns: u64,
}

/// The [`TOP_SYSCALLS`] with the most time, then "other": what the process's totals leave
/// beyond them, or the remaining rows' sum should the totals fall short of the rows.
pub(crate) fn top_syscalls(p: &ProcessSnapshot) -> Vec<SyscallSeries> {
    let s = &p.syscalls;
    let mut rows: Vec<_> = s.by_nr.iter().collect();
    rows.sort_by_key(|r| (Reverse(r.time_ns), r.nr));
    let (top, rest) = rows.split_at(rows.len().min(TOP_SYSCALLS));
    let mut out: Vec<_> = top
        .iter()
        .map(|r| SyscallSeries {
            name: if r.name.is_empty() {
                format!("nr_{}", r.nr)
            } else {
                r.name.clone()
            },
            count: r.count,
            errors: r.errors,
            time_ns: r.time_ns,
        })
        .collect();
    let left = |total: u64, field: fn(&SyscallRow) -> u64| {
        let top: u64 = top.iter().map(|r| field(r)).sum();
        let rest: u64 = rest.iter().map(|r| field(r)).sum();
        total.saturating_sub(top).max(rest)
    };
    let other = SyscallSeries {
        name: "other".to_owned(),
        count: left(s.count, |r| r.count),
        errors: left(s.errors, |r| r.errors),
        time_ns: left(s.time_ns, |r| r.time_ns),
    };
    if !rest.is_empty() || other.count > 0 || other.errors > 0 || other.time_ns > 0 {
        out.push(other);
    }
    out
}

fn net_bytes_by_direction(p: &ProcessSnapshot) -> [(&'static str, &'static str, u64); 4] {
    let n = &p.net;
    [
        ("tcp", "transmit", n.tcp_tx_bytes),
        ("tcp", "receive", n.tcp_rx_bytes),
        ("udp", "transmit", n.udp_tx_bytes),
        ("udp", "receive", n.udp_rx_bytes),
    ]
}

fn device_label(b: &snapshot::BlockStats) -> &str {
    if b.device_name.is_empty() {
        &b.device
    } else {
        &b.device_name
    }
}

/// Label pairs in exposition order.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// `pid`, `comm`, then the process's workload labels where known: `namespace`, `pod`,
/// `container` (dcgm-exporter's names), `job_id`, `rank`. A process has one value of each, so
/// they add no series. (`job_id`, not `job`: Prometheus' scrape target label is `job`.)
pub(crate) fn process_labels(p: &ProcessSnapshot) -> Labels {
    let mut l = labels(
        &[("pid", &p.pid.to_string()), ("comm", p.comm.as_str())],
        &[],
    );
    if let Some(w) = &p.workload {
        l.extend(workload_labels(w, true));
    }
    l
}

/// The known Kubernetes labels of an identity, and with `job` its job and rank.
pub(crate) fn workload_labels(w: &snapshot::WorkloadIdentity, job: bool) -> Labels {
    let mut l = Labels::new();
    for (k, v) in [
        ("namespace", &w.namespace),
        ("pod", &w.pod),
        ("container", &w.container),
    ] {
        if let Some(v) = v {
            l.push((k, v.clone()));
        }
    }
    if job {
        if let Some(j) = &w.job_id {
            l.push(("job_id", j.clone()));
        }
        if let Some(r) = w.rank {
            l.push(("rank", r.to_string()));
        }
    }
    l
}

/// `base` plus `extra`; a key of `extra` already in `base` replaces its value (the collective
/// series' `rank` is the communicator's).
/// [`process_labels`] of each process, told apart where two would share one label set: a
/// pid reused within the exit grace period by a process of the same name. The newest keeps
/// the plain labels; each older one gets `start_time_ns` (as in `ethand snapshot --json`), so
/// two processes are never summed into one series.
pub(crate) fn process_label_sets(procs: &[&ProcessSnapshot]) -> Vec<Labels> {
    let sets: Vec<Labels> = procs.iter().map(|p| process_labels(p)).collect();
    let mut newest: BTreeMap<&Labels, u64> = BTreeMap::new();
    for (l, p) in sets.iter().zip(procs) {
        let n = newest.entry(l).or_insert(p.start_time_ns);
        *n = (*n).max(p.start_time_ns);
    }
    let newest: Vec<u64> = sets.iter().map(|l| newest[l]).collect();
    sets.into_iter()
        .zip(procs.iter().zip(newest))
        .map(|(l, (p, n))| {
            if p.start_time_ns < n {
                with_extra(&l, &[("start_time_ns", &p.start_time_ns.to_string())])
            } else {
                l
            }
        })
        .collect()
}

pub(crate) fn with_extra(base: &Labels, extra: &[(&'static str, &str)]) -> Labels {
    let mut l = base.clone();
    for &(k, v) in extra {
        match l.iter_mut().find(|(lk, _)| *lk == k) {
            Some(e) => e.1 = v.to_owned(),
            None => l.push((k, v.to_owned())),
        }
    }
    l
}

pub(crate) fn labels(base: &[(&'static str, &str)], extra: &[(&'static str, &str)]) -> Labels {
    base.iter()
        .chain(extra)
        .map(|&(k, v)| (k, v.to_owned()))
        .collect()
}

/// One family computed from the snapshot. A label set added twice is summed (pid reuse within
/// the exit grace period, two devices with one name) so no series is ever duplicated; the
/// BTreeMap keeps the output order stable between scrapes.
#[derive(Debug)]
pub(crate) struct Family<V> {
    desc: &'static Desc,
    series: BTreeMap<Labels, V>,
}

impl<V: Value> Family<V> {
    pub(crate) fn new(desc: &'static Desc) -> Self {
        Self {
            desc,
            series: BTreeMap::new(),
        }
    }

    pub(crate) fn add(&mut self, labels: Labels, value: V) {
        self.series.entry(labels).or_default().merge(&value);
    }

    /// Writes the family out (nothing when it has no series, not even its HELP and TYPE).
    pub(crate) fn register(self, e: &mut Exposition) {
        if self.series.is_empty() {
            return;
        }
        e.descriptor(self.desc);
        for (labels, value) in &self.series {
            e.labels.clear();
            encode_labels(labels, &mut e.labels);
            value.write(self.desc.name, &e.labels, &mut e.out);
        }
    }
}

/// The Prometheus text format (0.0.4), written straight into one pre-sized String.
///
/// prometheus-client's encoder (what this replaced; its output is the reference of the test
/// `output_matches_prometheus_client`) encodes a series' label set again for every bucket
/// line and formats each bucket bound anew: at 10,000 series that, the cloning around it and
/// the output's regrowth made a scrape take 1.5 times its budget. Here a series' labels are
/// escaped once, the bucket bounds are formatted once per process, and the output is
/// written once.
pub(crate) struct Exposition {
    out: String,
    /// The current series' label set, escaped, without braces.
    labels: String,
}

impl Exposition {
    fn with_capacity(bytes: usize) -> Self {
        Self {
            out: String::with_capacity(bytes),
            labels: String::new(),
        }
    }

    fn descriptor(&mut self, d: &Desc) {
        let help = d.help.strip_suffix('.').unwrap_or(d.help);
        let out = &mut self.out;
        out.push_str("# HELP ");
        out.push_str(d.name);
        out.push(' ');
        escape(help, false, out);
        out.push_str(".\n# TYPE ");
        out.push_str(d.name);
        out.push(' ');
        out.push_str(d.kind.as_str());
        out.push('\n');
    }
}

/// `k="v",k2="v2"` with the values escaped.
fn encode_labels(labels: &Labels, out: &mut String) {
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        escape(v, true, out);
        out.push('"');
    }
}

/// The text format's escapes: backslash and newline, and in label values the double quote.
fn escape(s: &str, quote: bool, out: &mut String) {
    let mut last = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'"' if quote => "\\\"",
            _ => continue,
        };
        out.push_str(&s[last..i]);
        out.push_str(esc);
        last = i + 1;
    }
    out.push_str(&s[last..]);
}

/// `name_suffix{labels,k="v"} ` (braces only when there is a label).
fn sample_start(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &str,
    extra: Option<(&str, &str)>,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        out.push_str(labels);
        if let Some((k, v)) = extra {
            if !labels.is_empty() {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            out.push_str(v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
}

fn write_u64(out: &mut String, v: u64) {
    out.push_str(itoa::Buffer::new().format(v));
    out.push('\n');
}

fn write_f64(out: &mut String, v: f64) {
    if v.is_finite() {
        out.push_str(dtoa::Buffer::new().format_finite(v));
    } else if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_sign_positive() {
        out.push_str("+Inf");
    } else {
        out.push_str("-Inf");
    }
    out.push('\n');
}

pub(crate) trait Value: Default + fmt::Debug {
    fn merge(&mut self, other: &Self);
    /// The series' sample line(s); `labels` is its escaped label set without braces.
    fn write(&self, name: &str, labels: &str, out: &mut String);
}

impl Value for u64 {
    fn merge(&mut self, other: &Self) {
        *self = self.saturating_add(*other);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        sample_start(out, name, "", labels, None);
        write_u64(out, *self);
    }
}

impl Value for f64 {
    fn merge(&mut self, other: &Self) {
        *self += other;
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        sample_start(out, name, "", labels, None);
        write_f64(out, *self);
    }
}

/// Nanoseconds, summed as integers and exposed as seconds, so sums carry no rounding error.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Nanos(pub(crate) u64);

impl Value for Nanos {
    fn merge(&mut self, other: &Self) {
        self.0 = self.0.saturating_add(other.0);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        (self.0 as f64 / 1e9).write(name, labels, out);
    }
}

/// A log2 histogram as the kernel keeps it: per-bucket (not cumulative) counts.
#[derive(Clone, Debug, Default)]
struct Hist {
    buckets: [u64; HIST_BUCKETS],
    sum_ns: u64,
}

/// The exposed buckets' upper bounds, as powers of two of nanoseconds: every second power
/// from 2^10 ns (1.024 µs; shorter waits and calls are all "fast") to 2^30 ns (1.07 s), then
/// 2^31 ns (2.15 s), then +Inf. 14 buckets rather than the kernel's 32 (which start at 2 ns)
/// keep a histogram series at 16 lines; each bound is one of the kernel's, so the
/// cumulative counts are exact. The kernel's last bucket also holds everything above
/// 2^31 ns (ethand_common::log2_bucket): it goes to +Inf.
const EXPOSED_POW2: [usize; 12] = [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 31];

/// Number of buckets a histogram series exposes (+Inf included).
pub const EXPOSED_BUCKETS: usize = EXPOSED_POW2.len() + 1;

/// The exposed buckets' bounds in seconds, +Inf last.
pub fn exposed_bucket_bounds_seconds() -> Vec<f64> {
    EXPOSED_POW2
        .iter()
        .map(|&k| (1u64 << k) as f64 / 1e9)
        .chain([f64::INFINITY])
        .collect()
}

/// Bucket bounds for the exposition, as `le` values: client_golang's formatting (Go's
/// `strconv.FormatFloat(v, 'g', -1, 64)`, so series match those of Go exporters).
static LE: LazyLock<Vec<String>> = LazyLock::new(|| {
    exposed_bucket_bounds_seconds()
        .into_iter()
        .map(go_float)
        .collect()
});

/// Go's shortest `%g`: exponent notation outside [1e-4, 1e6) with at least two exponent
/// digits; whole numbers below 1e6 as integers.
fn go_float(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        }
        .into();
    }
    if v.fract() == 0.0 && v.abs() < 1e6 {
        return (v as i64).to_string();
    }
    if (1e-4..1e6).contains(&v.abs()) {
        return format!("{v}");
    }
    let sci = format!("{v:e}");
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    format!("{mantissa}e{exponent:+03}")
}

impl Hist {
    fn new(counts: &[u64], sum_ns: u64) -> Self {
        let mut buckets = [0u64; HIST_BUCKETS];
        for (i, &n) in counts.iter().enumerate() {
            let b = &mut buckets[i.min(HIST_BUCKETS - 1)];
            *b = b.saturating_add(n);
        }
        Self { buckets, sum_ns }
    }

    /// For histograms without a recorded total: each observation counts as its bucket's
    /// geometric midpoint, 2^(i+0.5) ns, or the lower bound 2^31 ns in the open last bucket.
    fn estimated(counts: &[u64]) -> Self {
        let mut h = Self::new(counts, 0);
        h.sum_ns = h.buckets.iter().enumerate().fold(0u64, |sum, (i, &n)| {
            let each = if i == HIST_BUCKETS - 1 {
                1u64 << i
            } else {
                2f64.powf(i as f64 + 0.5) as u64
            };
            sum.saturating_add(n.saturating_mul(each))
        });
        h
    }
}

impl Hist {
    /// Per exposed bucket (not cumulative): the kernel's buckets below each bound, +Inf last.
    fn exposed(&self) -> [u64; EXPOSED_BUCKETS] {
        let mut out = [0u64; EXPOSED_BUCKETS];
        for (i, &n) in self.buckets.iter().enumerate() {
            // Kernel bucket i holds [2^i, 2^(i+1)) ns: under the first bound 2^k with k > i.
            let j = EXPOSED_POW2
                .iter()
                .position(|&k| i < k)
                .unwrap_or(EXPOSED_BUCKETS - 1);
            out[j] = out[j].saturating_add(n);
        }
        out
    }
}

impl Value for Hist {
    fn merge(&mut self, other: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a = a.saturating_add(b);
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        let mut cumulative = 0u64;
        for (le, n) in LE.iter().zip(self.exposed()) {
            cumulative = cumulative.saturating_add(n);
            sample_start(out, name, "_bucket", labels, Some(("le", le)));
            write_u64(out, cumulative);
        }
        sample_start(out, name, "_sum", labels, None);
        write_f64(out, self.sum_ns as f64 / 1e9);
        sample_start(out, name, "_count", labels, None);
        write_u64(out, cumulative);
    }
}

#[cfg(test)]
mod workload_label_tests {
    use super::*;
    use ethand_snapshot::WorkloadIdentity;
    use ethand_snapshot::gpu::{CollectiveStats, CommRank, GpuProcessStats};

    /// Workload labels on per-process and per-cgroup series; the collective series keep the
    /// communicator's rank (one `rank` label, never two).
    #[test]
    fn workload_labels_on_process_and_cgroup_series() {
        let w = WorkloadIdentity {
            container_runtime: Some("containerd".into()),
            container_id: Some("ab".repeat(32)),
            container: Some("pytorch".into()),
            pod: Some("trainer-0".into()),
            namespace: Some("ml".into()),
            job_id: Some("job-42".into()),
            rank: Some(3),
            ..Default::default()
        };
        let p = ProcessSnapshot {
            pid: 7,
            comm: "python".into(),
            cgroup: "/kubepods/pod1/x".into(),
            sched: snapshot::SchedStats {
                oncpu_ns: 5,
                ..Default::default()
            },
            gpu: Some(GpuProcessStats {
                collectives: vec![CollectiveStats {
                    library: "nccl".into(),
                    operation: "all_reduce".into(),
                    calls: 1,
                    ..Default::default()
                }],
                comm: Some(CommRank {
                    library: "nccl".into(),
                    rank: Some(1),
                    nranks: 4,
                }),
                ..Default::default()
            }),
            workload: Some(w.clone()),
            ..Default::default()
        };
        let snap = NodeSnapshot {
            processes: vec![p],
            cgroups: vec![CgroupSnapshot {
                cgroup: "/kubepods/pod1/x".into(),
                workload: Some(w),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(
            &snap,
            &PrometheusOptions {
                selection: ExportSelection::top(5),
                ..Default::default()
            },
        );
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_string()
        };
        assert_eq!(
            line("ethand_process_cpu_seconds_total{"),
            "ethand_process_cpu_seconds_total{pid=\"7\",comm=\"python\",namespace=\"ml\",pod=\"trainer-0\",container=\"pytorch\",job_id=\"job-42\",rank=\"3\"} 5e-9"
        );
        let info = line("ethand_process_workload_info{");
        assert!(
            info.contains(&format!("container_id=\"{}\"", "ab".repeat(32))),
            "{info}"
        );
        assert!(info.contains("container_runtime=\"containerd\""), "{info}");
        let coll = line("ethand_process_collective_calls_total{");
        assert_eq!(coll.matches("rank=").count(), 1, "{coll}");
        assert!(
            coll.contains("rank=\"1\"") && coll.contains("job_id=\"job-42\""),
            "{coll}"
        );
        let cg = line("ethand_cgroup_cpu_seconds_total{");
        assert!(
            cg.contains("namespace=\"ml\",pod=\"trainer-0\",container=\"pytorch\"")
                && !cg.contains("job_id"),
            "{cg}"
        );
    }
}

/// The hand-written exposition against prometheus-client's encoder, byte for byte.
#[cfg(test)]
mod exposition_tests {
    use super::*;
    use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    enum Sample {
        Int(u64),
        Float(f64),
        Hist(Box<Hist>),
    }

    /// A family as prometheus-client encodes it.
    #[derive(Debug)]
    struct Reference {
        kind: MetricType,
        series: Vec<(Labels, Sample)>,
    }

    impl EncodeMetric for Reference {
        fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
            for (labels, sample) in &self.series {
                let mut e = encoder.encode_family(labels)?;
                match (sample, self.kind) {
                    (Sample::Int(v), MetricType::Counter) => {
                        e.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Sample::Int(v), _) => e.encode_gauge(v)?,
                    (Sample::Float(v), MetricType::Counter) => {
                        e.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Sample::Float(v), _) => e.encode_gauge(v)?,
                    (Sample::Hist(h), _) => {
                        let buckets: Vec<(f64, u64)> = exposed_bucket_bounds_seconds()
                            .into_iter()
                            .zip(h.exposed())
                            .collect();
                        let count = h.buckets.iter().sum();
                        e.encode_histogram::<NoLabelSet>(
                            h.sum_ns as f64 / 1e9,
                            count,
                            &buckets,
                            None,
                        )?
                    }
                }
            }
            Ok(())
        }

        fn metric_type(&self) -> prometheus_client::metrics::MetricType {
            match self.kind {
                MetricType::Counter => prometheus_client::metrics::MetricType::Counter,
                MetricType::Gauge => prometheus_client::metrics::MetricType::Gauge,
                MetricType::Histogram => prometheus_client::metrics::MetricType::Histogram,
            }
        }
    }

    static INTS: Desc = counter(
        "ethand_test_ints_total",
        "Counts, with a backslash \\ and a\nnewline in the help.",
    );
    static FLOATS: Desc = gauge("ethand_test_floats", "Floats of every kind");
    static SECONDS: Desc = counter("ethand_test_seconds_total", "Nanoseconds as seconds.");
    static HISTS: Desc = histogram("ethand_test_latency_seconds", "Histograms.");

    fn label_sets() -> Vec<Labels> {
        vec![
            Labels::new(),
            labels(&[("pid", "1"), ("comm", "plain")], &[]),
            labels(&[("pid", "2"), ("comm", "q\"uote \\back\nline")], &[]),
            labels(&[("pid", "3"), ("comm", "")], &[("syscall", "read")]),
            labels(&[("pid", "4"), ("comm", "ünïcode\u{fffd}\t\u{1b}")], &[]),
        ]
    }

    #[test]
    fn output_matches_prometheus_client() {
        let ints = [0, 1, 42, u64::MAX];
        let floats = [
            0.0,
            -0.0,
            1.5,
            1e-7,
            123_456_789.123,
            1e22,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let sets = label_sets();
        let mut ours = Exposition::with_capacity(0);
        let mut registry = Registry::default();
        let mut reference = |desc: &'static Desc, series: Vec<(Labels, Sample)>| {
            let name = desc.name.strip_suffix("_total").unwrap_or(desc.name);
            let help = desc.help.strip_suffix('.').unwrap_or(desc.help);
            registry.register(
                name,
                help,
                Reference {
                    kind: desc.kind,
                    series,
                },
            );
        };

        let mut fam = Family::<u64>::new(&INTS);
        let mut refs = Vec::new();
        for (l, v) in sets.iter().zip(ints.iter().cycle()) {
            fam.add(l.clone(), *v);
            refs.push((l.clone(), Sample::Int(*v)));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&INTS, refs);

        let mut fam = Family::<f64>::new(&FLOATS);
        let mut refs = Vec::new();
        for (i, v) in floats.iter().enumerate() {
            let l = labels(&[("i", &format!("{i:02}"))], &[]);
            fam.add(l.clone(), *v);
            // As added to a family: merged into a 0.0 (-0.0 becomes 0.0).
            let mut merged = 0.0;
            merged.merge(v);
            refs.push((l, Sample::Float(merged)));
        }
        fam.register(&mut ours);
        reference(&FLOATS, refs);

        let mut fam = Family::<Nanos>::new(&SECONDS);
        let mut refs = Vec::new();
        for (l, ns) in sets
            .iter()
            .zip([0, 1, 999_999_999, 1_234_567_890_123, u64::MAX])
        {
            fam.add(l.clone(), Nanos(ns));
            refs.push((l.clone(), Sample::Float(ns as f64 / 1e9)));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&SECONDS, refs);

        let mut fam = Family::<Hist>::new(&HISTS);
        let mut refs = Vec::new();
        for (k, l) in sets.iter().enumerate() {
            let counts: Vec<u64> = (0..HIST_BUCKETS as u64)
                .map(|b| (b * 7 + k as u64) % 5)
                .collect();
            let h = Hist::new(&counts, 123_456_789 * k as u64);
            fam.add(l.clone(), h.clone());
            refs.push((l.clone(), Sample::Hist(Box::new(h))));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&HISTS, refs);

        // A family without series writes nothing, as the registry skips it.
        Family::<u64>::new(&PROCESS_THREADS).register(&mut ours);

        let mut expected = String::new();
        prometheus_text::encode(&mut expected, &registry).unwrap();
        assert!(expected.contains("le=\"1.024e-06\"") && expected.contains("le=\"+Inf\""));
        for (i, (a, b)) in ours.out.lines().zip(expected.lines()).enumerate() {
            assert_eq!(a, b, "line {i}");
        }
        assert_eq!(ours.out, expected);
    }

    #[test]
    fn bucket_bounds_as_go_writes_them() {
        assert_eq!(go_float(2e-9), "2e-09");
        assert_eq!(go_float(0.000131072), "0.000131072");
        assert_eq!(go_float(2.147483648), "2.147483648");
        assert_eq!(go_float(4.0), "4");
        assert_eq!(go_float(1e6), "1e+06");
        assert_eq!(go_float(1.5e300), "1.5e+300");
        assert_eq!(LE[0], "1.024e-06");
        assert_eq!(LE[5], "0.001048576");
        assert_eq!(LE[EXPOSED_BUCKETS - 2], "2.147483648");
        assert_eq!(LE[EXPOSED_BUCKETS - 1], "+Inf");
        assert_eq!(LE.len(), 13);
    }

    /// Each exposed bucket sums the kernel's buckets below its bound: the cumulative counts
    /// at 2^k ns are those of the kernel's log2 histogram, the rest is in +Inf.
    #[test]
    fn kernel_buckets_fold_into_the_exposed_ones() {
        let mut counts = [0u64; HIST_BUCKETS];
        for (i, c) in counts.iter_mut().enumerate() {
            *c = 1 << (i % 8);
        }
        let h = Hist::new(&counts, 0);
        let exposed = h.exposed();
        assert_eq!(exposed.iter().sum::<u64>(), counts.iter().sum::<u64>());
        let mut cumulative = 0;
        for (j, &k) in EXPOSED_POW2.iter().enumerate() {
            cumulative += exposed[j];
            assert_eq!(cumulative, counts[..k].iter().sum::<u64>(), "le 2^{k} ns");
        }
        assert_eq!(exposed[EXPOSED_BUCKETS - 1], counts[31]);
    }
}
