//! Flat report formats of a [`TreeSnapshot`] (`ethand snapshot --csv`) and the comparison of
//! two snapshots (`ethand compare BEFORE.json AFTER.json`).
//!
//! [`metrics_rows`] turns the tree into named metrics, one row per (scope, metric):
//! - scope `total`: sums over the tree (`TreeSnapshot::total`), the tree's window (sum of the
//!   processes' windows) and derived signals (`derived.*`);
//! - scope `pid:<pid>`: one process; its first row is an info row
//!   `process.info{comm="<comm>"}` = 1 that carries the process name (the name is escaped as a
//!   JSON string inside the metric name);
//! - scope `device:<label>` (`device:gpu0`, `device:npu3`): the device readings of
//!   `TreeSnapshot::devices`.
//!
//! Metric names are dotted (`sched.oncpu_ns`, `syscalls.getpid.count`,
//! `gpu.copies.host_to_device.bytes`, `window.oncpu_ns`, `derived.gpu.sync_blocked_ratio`);
//! units are `ns`, `bytes`, `count`, `ratio` and `per_second` (device readings also use
//! `watts`, `joules`, `celsius` and `hertz`). Counters are cumulative like the snapshot's (since ethand
//! first saw the process, or over the standalone measurement); `window.*` rows hold the change
//! over the snapshot's window. A figure that was not measured (kernel launches below GPU
//! level `process`, a GPM ratio on a GPU without GPM) has no row, never a 0 row; the launches
//! counted on demand for the snapshot at level `calls` are the `launch_sample.*` rows (scope
//! `total`, and `launch_sample.launches` per sampled process). Host memory is in `memory.*`
//! rows: per live process its resident set by kind, swap, VmHWM, faults and the window's
//! peak and growth; for the tree the sums over its live processes, its peak over the window,
//! the memory cgroup nearest its limit (`memory.cgroup.*`) and the node's available memory. The order is deterministic:
//! total, the processes in snapshot order (root first), then devices; within a scope a fixed
//! group order, and keyed sub-lists (syscalls, block devices, copy directions, ...) sorted by
//! key.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::format::{bytes, bytes_per_second, duration_ns, exact, in_unit, significant, utc};
use crate::text::for_terminal;
use ethand_snapshot::diagnosis::Finding;
use ethand_snapshot::gpu::{GpuProcessStats, LaunchSample, add_counted};
use ethand_snapshot::{NetStats, SchedStats, TreeSnapshot, WindowStats};

mod compare;
pub use compare::{
    ComparedRow, Comparison, SnapshotMeta, compare, compared, comparison_to_csv, render_comparison,
};

/// Version of the [`Comparison`] JSON; bumped on incompatible changes.
pub const COMPARISON_SCHEMA_VERSION: u32 = 1;

/// How many metrics [`render_comparison`] shows.
pub const RENDER_TOP: usize = 25;

/// Units of [`MetricRow::unit`].
pub mod unit {
    pub const NS: &str = "ns";
    pub const BYTES: &str = "bytes";
    pub const COUNT: &str = "count";
    pub const RATIO: &str = "ratio";
    pub const PER_SECOND: &str = "per_second";
    pub const WATTS: &str = "watts";
    pub const CELSIUS: &str = "celsius";
    pub const HERTZ: &str = "hertz";
    pub const JOULES: &str = "joules";
    /// Findings' rows in the CSV: the finding's ranking score (0-1).
    pub const IMPACT: &str = "impact";
}

/// One named metric of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricRow {
    /// "total", "pid:<pid>" or "device:<label>".
    pub scope: String,
    /// Dotted name, e.g. "sched.oncpu_ns".
    pub metric: String,
    pub value: f64,
    /// See [`unit`].
    pub unit: String,
}

struct Rows<'a> {
    scope: String,
    out: &'a mut Vec<MetricRow>,
}

impl Rows<'_> {
    fn f(&mut self, metric: impl Into<String>, value: f64, unit: &str) {
        self.out.push(MetricRow {
            scope: self.scope.clone(),
            metric: metric.into(),
            value,
            unit: unit.to_string(),
        });
    }

    fn u(&mut self, metric: impl Into<String>, value: u64, unit: &str) {
        self.f(metric, value as f64, unit);
    }

    fn opt_f(&mut self, metric: impl Into<String>, value: Option<f64>, unit: &str) {
        if let Some(v) = value {
            self.f(metric, v, unit);
        }
    }

    fn opt_u(&mut self, metric: impl Into<String>, value: Option<u64>, unit: &str) {
        if let Some(v) = value {
            self.u(metric, v, unit);
        }
    }
}

/// What total and per-process scopes have in common.
struct ScopeData<'a> {
    sched: &'a SchedStats,
    syscalls: (u64, u64, u64),
    /// name -> (count, errors, time_ns)
    by_name: BTreeMap<String, (u64, u64, u64)>,
    /// (read bytes, write bytes, read ops, write ops)
    block_rw: (u64, u64, u64, u64),
    /// (device name, op) -> (ops, bytes, queue_ns, service_ns)
    block: BTreeMap<(String, String), (u64, u64, u64, u64)>,
    net: &'a NetStats,
    gpu: Option<&'a GpuProcessStats>,
    window: Option<WindowStats>,
}

fn add_syscalls(m: &mut BTreeMap<String, (u64, u64, u64)>, p: &ethand_snapshot::ProcessSnapshot) {
    for r in &p.syscalls.by_nr {
        let e = m.entry(r.name.clone()).or_default();
        e.0 += r.count;
        e.1 += r.errors;
        e.2 += r.time_ns;
    }
}

fn add_block(
    m: &mut BTreeMap<(String, String), (u64, u64, u64, u64)>,
    p: &ethand_snapshot::ProcessSnapshot,
) {
    for b in &p.block {
        let e = m.entry((b.device_name.clone(), b.op.clone())).or_default();
        e.0 += b.ops;
        e.1 += b.bytes;
        e.2 += b.queue_ns;
        e.3 += b.service_ns;
    }
}

fn add_window(a: &mut WindowStats, w: &WindowStats) {
    a.duration_ms = a.duration_ms.max(w.duration_ms);
    a.oncpu_ns += w.oncpu_ns;
    a.offcpu_blocked_ns += w.offcpu_blocked_ns;
    a.offcpu_preempted_ns += w.offcpu_preempted_ns;
    a.runq_wait_ns += w.runq_wait_ns;
    a.syscalls += w.syscalls;
    a.syscall_time_ns += w.syscall_time_ns;
    a.block_read_bytes += w.block_read_bytes;
    a.block_write_bytes += w.block_write_bytes;
    a.net_tx_bytes += w.net_tx_bytes;
    a.net_rx_bytes += w.net_rx_bytes;
    a.gpu_launches = add_counted(a.gpu_launches, w.gpu_launches);
    a.gpu_sync_ns += w.gpu_sync_ns;
    a.gpu_sync_calls += w.gpu_sync_calls;
    a.gpu_copy_h2d_calls += w.gpu_copy_h2d_calls;
    a.gpu_copy_d2h_calls += w.gpu_copy_d2h_calls;
    a.gpu_copy_h2d_bytes += w.gpu_copy_h2d_bytes;
    a.gpu_copy_d2h_bytes += w.gpu_copy_d2h_bytes;
    a.gpu_copy_other_bytes += w.gpu_copy_other_bytes;
    a.collective_calls += w.collective_calls;
    a.collective_ns += w.collective_ns;
}

/// The tree's window: the sum of its processes' windows (they all span the same history
/// points; the duration is the longest). None when no process has one or it spans no time.
pub fn tree_window(t: &TreeSnapshot) -> Option<WindowStats> {
    let mut acc: Option<WindowStats> = None;
    for w in t.processes.iter().filter_map(|p| p.window.as_ref()) {
        add_window(acc.get_or_insert_with(Default::default), w);
    }
    acc.filter(|w| w.duration_ms > 0)
}

fn scope_rows(r: &mut Rows, d: &ScopeData) {
    use unit::*;
    let s = d.sched;
    r.u("sched.oncpu_ns", s.oncpu_ns, NS);
    r.u("sched.offcpu_blocked_ns", s.offcpu_blocked_ns, NS);
    r.u("sched.offcpu_preempted_ns", s.offcpu_preempted_ns, NS);
    r.u("sched.runq_wait_ns", s.runq_wait_ns, NS);
    r.u("sched.voluntary_switches", s.voluntary_switches, COUNT);
    r.u("sched.involuntary_switches", s.involuntary_switches, COUNT);

    r.u("syscalls.count", d.syscalls.0, COUNT);
    r.u("syscalls.errors", d.syscalls.1, COUNT);
    r.u("syscalls.time_ns", d.syscalls.2, NS);
    for (name, (c, e, t)) in &d.by_name {
        r.u(format!("syscalls.{name}.count"), *c, COUNT);
        r.u(format!("syscalls.{name}.errors"), *e, COUNT);
        r.u(format!("syscalls.{name}.time_ns"), *t, NS);
    }

    let (rb, wb, ro, wo) = d.block_rw;
    r.u("block.read_bytes", rb, BYTES);
    r.u("block.write_bytes", wb, BYTES);
    r.u("block.read_ops", ro, COUNT);
    r.u("block.write_ops", wo, COUNT);
    for ((dev, op), (ops, bytes, q, sv)) in &d.block {
        r.u(format!("block.{dev}.{op}.ops"), *ops, COUNT);
        r.u(format!("block.{dev}.{op}.bytes"), *bytes, BYTES);
        r.u(format!("block.{dev}.{op}.queue_ns"), *q, NS);
        r.u(format!("block.{dev}.{op}.service_ns"), *sv, NS);
    }

    let n = d.net;
    r.u("net.tx_bytes", n.tx_bytes(), BYTES);
    r.u("net.rx_bytes", n.rx_bytes(), BYTES);
    r.u("net.tcp_tx_bytes", n.tcp_tx_bytes, BYTES);
    r.u("net.tcp_rx_bytes", n.tcp_rx_bytes, BYTES);
    r.u("net.udp_tx_bytes", n.udp_tx_bytes, BYTES);
    r.u("net.udp_rx_bytes", n.udp_rx_bytes, BYTES);
    r.u("net.tcp_retransmits", n.tcp_retransmits, COUNT);
    r.u("net.tcp_active_opens", n.tcp_active_opens, COUNT);
    r.u("net.tcp_closes", n.tcp_closes, COUNT);
    r.u("net.tcp_resets_sent", n.tcp_resets_sent, COUNT);
    r.u("net.tcp_resets_received", n.tcp_resets_received, COUNT);

    if let Some(g) = d.gpu {
        gpu_rows(r, g);
    }
    if let Some(w) = &d.window {
        window_rows(r, w, d.gpu.is_some());
    }
}

fn gpu_rows(r: &mut Rows, g: &GpuProcessStats) {
    use unit::*;
    // No rows where launches were not counted (GPU level below `process`): never a 0.
    r.opt_u("gpu.launches", g.launches, COUNT);
    r.opt_u("gpu.graph_launches", g.graph_launches, COUNT);
    r.u("gpu.copies.calls", g.copy_calls_total(), COUNT);
    r.u("gpu.copies.bytes", g.copy_bytes_total(), BYTES);
    let mut copies: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for c in &g.copies {
        let e = copies.entry(&c.direction).or_default();
        e.0 += c.calls;
        e.1 += c.bytes;
    }
    for (dir, (calls, bytes)) in copies {
        r.u(format!("gpu.copies.{dir}.calls"), calls, COUNT);
        r.u(format!("gpu.copies.{dir}.bytes"), bytes, BYTES);
    }
    r.u("gpu.sync.calls", g.sync.calls, COUNT);
    r.u("gpu.sync.time_ns", g.sync.time_ns, NS);
    r.u("gpu.sync.timed_calls", g.sync.timed_calls, COUNT);
    let mut mem: Vec<&ethand_snapshot::gpu::GpuMemoryStats> = g.memory.iter().collect();
    mem.sort_by(|a, b| a.kind.cmp(&b.kind));
    for m in mem {
        let k = &m.kind;
        r.u(format!("gpu.memory.{k}.allocs"), m.allocs, COUNT);
        r.u(format!("gpu.memory.{k}.alloc_bytes"), m.alloc_bytes, BYTES);
        r.u(format!("gpu.memory.{k}.frees"), m.frees, COUNT);
        r.u(format!("gpu.memory.{k}.freed_bytes"), m.freed_bytes, BYTES);
        r.u(format!("gpu.memory.{k}.live_bytes"), m.live_bytes, BYTES);
        r.u(format!("gpu.memory.{k}.peak_bytes"), m.peak_bytes, BYTES);
    }
    r.u("gpu.untracked_frees", g.untracked_frees, COUNT);
    r.u("gpu.collectives.calls", g.collective_calls(), COUNT);
    r.u("gpu.collectives.bytes", g.collective_bytes(), BYTES);
    r.u("gpu.collectives.time_ns", g.collective_time_ns(), NS);
    let mut coll: Vec<&ethand_snapshot::gpu::CollectiveStats> = g.collectives.iter().collect();
    coll.sort_by(|a, b| (&a.library, &a.operation).cmp(&(&b.library, &b.operation)));
    for c in coll {
        let p = format!("gpu.collectives.{}.{}", c.library, c.operation);
        r.u(format!("{p}.calls"), c.calls, COUNT);
        r.u(format!("{p}.bytes"), c.bytes, BYTES);
        r.u(format!("{p}.time_ns"), c.time_ns, NS);
        r.u(format!("{p}.timed_calls"), c.timed_calls, COUNT);
    }
    r.u("gpu.groups.calls", g.groups.calls, COUNT);
    r.u("gpu.groups.time_ns", g.groups.time_ns, NS);
    r.u("gpu.groups.timed_calls", g.groups.timed_calls, COUNT);
    r.u("gpu.comm_inits", g.comm_inits, COUNT);
    if let Some(c) = &g.comm {
        r.u("gpu.comm.nranks", u64::from(c.nranks), COUNT);
        r.opt_u("gpu.comm.rank", c.rank.map(u64::from), COUNT);
    }
    r.u("gpu.errors", g.errors, COUNT);
    let mut syms: Vec<&ethand_snapshot::gpu::GpuSymbolStats> = g.symbols.iter().collect();
    syms.sort_by(|a, b| {
        (&a.library, &a.symbol, &a.direction).cmp(&(&b.library, &b.symbol, &b.direction))
    });
    for s in syms {
        let p = if s.direction.is_empty() {
            format!("gpu.symbols.{}.{}", s.library, s.symbol)
        } else {
            format!("gpu.symbols.{}.{}.{}", s.library, s.symbol, s.direction)
        };
        r.u(format!("{p}.calls"), s.calls, COUNT);
        r.u(format!("{p}.errors"), s.errors, COUNT);
        r.u(format!("{p}.bytes"), s.bytes, BYTES);
        r.u(format!("{p}.time_ns"), s.time_ns, NS);
    }
}

fn window_rows(r: &mut Rows, w: &WindowStats, gpu: bool) {
    use unit::*;
    r.u("window.duration_ns", w.duration_ms * 1_000_000, NS);
    r.u("window.oncpu_ns", w.oncpu_ns, NS);
    r.u("window.offcpu_blocked_ns", w.offcpu_blocked_ns, NS);
    r.u("window.offcpu_preempted_ns", w.offcpu_preempted_ns, NS);
    r.u("window.runq_wait_ns", w.runq_wait_ns, NS);
    r.u("window.syscalls", w.syscalls, COUNT);
    r.u("window.syscall_time_ns", w.syscall_time_ns, NS);
    r.u("window.block_read_bytes", w.block_read_bytes, BYTES);
    r.u("window.block_write_bytes", w.block_write_bytes, BYTES);
    r.u("window.net_tx_bytes", w.net_tx_bytes, BYTES);
    r.u("window.net_rx_bytes", w.net_rx_bytes, BYTES);
    let any_gpu = w.gpu_launches.unwrap_or(0)
        + w.gpu_sync_ns
        + w.gpu_sync_calls
        + w.gpu_copy_h2d_calls
        + w.gpu_copy_d2h_calls
        + w.gpu_copy_h2d_bytes
        + w.gpu_copy_d2h_bytes
        + w.gpu_copy_other_bytes
        + w.collective_calls
        + w.collective_ns
        > 0;
    if gpu || any_gpu {
        r.opt_u("window.gpu_launches", w.gpu_launches, COUNT);
        r.u("window.gpu_sync_ns", w.gpu_sync_ns, NS);
        r.u("window.gpu_sync_calls", w.gpu_sync_calls, COUNT);
        r.u("window.gpu_copy_h2d_calls", w.gpu_copy_h2d_calls, COUNT);
        r.u("window.gpu_copy_d2h_calls", w.gpu_copy_d2h_calls, COUNT);
        r.u("window.gpu_copy_h2d_bytes", w.gpu_copy_h2d_bytes, BYTES);
        r.u("window.gpu_copy_d2h_bytes", w.gpu_copy_d2h_bytes, BYTES);
        r.u("window.gpu_copy_other_bytes", w.gpu_copy_other_bytes, BYTES);
        r.u("window.collective_calls", w.collective_calls, COUNT);
        r.u("window.collective_ns", w.collective_ns, NS);
    }
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

fn total_rows(t: &TreeSnapshot, out: &mut Vec<MetricRow>) {
    use unit::*;
    let tt = &t.total;
    let mut by_name = BTreeMap::new();
    let mut block = BTreeMap::new();
    for p in &t.processes {
        add_syscalls(&mut by_name, p);
        add_block(&mut block, p);
    }
    let window = tree_window(t);
    let d = ScopeData {
        sched: &tt.sched,
        syscalls: (tt.syscalls, tt.syscall_errors, tt.syscall_time_ns),
        by_name,
        block_rw: (
            tt.block_read_bytes,
            tt.block_write_bytes,
            tt.block_read_ops,
            tt.block_write_ops,
        ),
        block,
        net: &tt.net,
        gpu: tt.gpu.as_ref(),
        window: window.clone(),
    };
    let mut r = Rows {
        scope: "total".into(),
        out,
    };
    r.u("tree.processes", tt.processes, COUNT);
    r.u("tree.threads", tt.threads, COUNT);
    scope_rows(&mut r, &d);

    // Derived signals.
    if let Some(w) = &window {
        let wall = w.duration_ms * 1_000_000;
        r.opt_f("derived.cpu.oncpu_ratio", ratio(w.oncpu_ns, wall), RATIO);
        r.opt_f(
            "derived.cpu.runq_wait_ratio",
            ratio(w.runq_wait_ns, wall),
            RATIO,
        );
        r.opt_f(
            "derived.cpu.offcpu_blocked_ratio",
            ratio(w.offcpu_blocked_ns, wall),
            RATIO,
        );
    }
    r.opt_f(
        "derived.syscalls.error_ratio",
        ratio(tt.syscall_errors, tt.syscalls),
        RATIO,
    );
    if let Some(g) = &tt.gpu_derived {
        r.u("derived.gpu.window_ns", g.window_ms * 1_000_000, NS);
        r.opt_f(
            "derived.gpu.launches_per_second",
            g.launches_per_second,
            PER_SECOND,
        );
        r.f(
            "derived.gpu.syncs_per_second",
            g.syncs_per_second,
            PER_SECOND,
        );
        r.f(
            "derived.gpu.sync_blocked_ratio",
            g.sync_blocked_ratio,
            RATIO,
        );
        r.f("derived.gpu.collective_ratio", g.collective_ratio, RATIO);
        let mut c: Vec<&(String, f64)> = g.copy_bytes_per_second.iter().collect();
        c.sort_by(|a, b| a.0.cmp(&b.0));
        for (dir, v) in c {
            r.f(
                format!("derived.gpu.copy_bytes_per_second.{dir}"),
                *v,
                PER_SECOND,
            );
        }
        r.opt_f(
            "derived.gpu.device_utilization_ratio",
            g.device_utilization_ratio,
            RATIO,
        );
        r.opt_f("derived.gpu.device_idle_ratio", g.device_idle_ratio, RATIO);
        r.opt_f("derived.gpu.sm_activity_ratio", g.sm_activity_ratio, RATIO);
        r.opt_f(
            "derived.gpu.sm_occupancy_ratio",
            g.sm_occupancy_ratio,
            RATIO,
        );
        r.opt_f(
            "derived.gpu.tensor_activity_ratio",
            g.tensor_activity_ratio,
            RATIO,
        );
        r.opt_f(
            "derived.gpu.dram_bandwidth_ratio",
            g.dram_bandwidth_ratio,
            RATIO,
        );
    }
    if let Some(l) = &t.launch_sample {
        launch_sample_rows(&mut r, l);
    }
    tree_memory_rows(&mut r, t);
}

/// The tree's memory now (sums over its live processes), its peak over the window, and its
/// memory cgroup nearest its limit; no rows where not read.
fn tree_memory_rows(r: &mut Rows, t: &TreeSnapshot) {
    use unit::*;
    if let Some(m) = t.memory_totals() {
        r.u("memory.rss_bytes", m.rss_bytes, BYTES);
        r.u("memory.anon_bytes", m.anon_bytes, BYTES);
        r.u("memory.file_bytes", m.file_bytes, BYTES);
        r.u("memory.shmem_bytes", m.shmem_bytes, BYTES);
        r.u("memory.swap_bytes", m.swap_bytes, BYTES);
        r.u("memory.minor_faults", m.minor_faults, COUNT);
        r.u("memory.major_faults", m.major_faults, COUNT);
    }
    r.opt_u(
        "memory.peak_rss_bytes",
        t.total.memory_peak_rss_bytes,
        BYTES,
    );
    if let Some((c, ratio)) = t.memory_cgroup_nearest_limit() {
        r.opt_u("memory.cgroup.limit_bytes", c.limit_bytes, BYTES);
        r.opt_u("memory.cgroup.usage_bytes", c.usage_bytes, BYTES);
        r.f("memory.cgroup.limit_ratio", ratio, RATIO);
    }
    r.opt_u("memory.cgroup.oom_kills", t.memory_oom_kills(), COUNT);
    if let Some(n) = &t.node_memory {
        r.u("memory.node.available_bytes", n.available_bytes, BYTES);
        r.u("memory.node.total_bytes", n.total_bytes, BYTES);
    }
}

/// A process's memory rows (`memory.*`), where read.
fn process_memory_rows(r: &mut Rows, m: &ethand_snapshot::memory::ProcessMemory) {
    use unit::*;
    r.opt_u("memory.rss_bytes", m.rss_bytes, BYTES);
    r.opt_u("memory.anon_bytes", m.anon_bytes, BYTES);
    r.opt_u("memory.file_bytes", m.file_bytes, BYTES);
    r.opt_u("memory.shmem_bytes", m.shmem_bytes, BYTES);
    r.opt_u("memory.swap_bytes", m.swap_bytes, BYTES);
    r.opt_u("memory.rss_hwm_bytes", m.rss_hwm_bytes, BYTES);
    r.opt_u("memory.minor_faults", m.minor_faults, COUNT);
    r.opt_u("memory.major_faults", m.major_faults, COUNT);
    if let Some(w) = &m.window {
        r.u("memory.window.peak_rss_bytes", w.peak_rss_bytes, BYTES);
        r.opt_f(
            "memory.window.rss_growth_bytes_per_second",
            w.rss_growth_bytes_per_second(),
            PER_SECOND,
        );
    }
}

/// The launches counted on demand for this snapshot (GPU level `calls`): its duration always,
/// the counts when a process could be sampled.
fn launch_sample_rows(r: &mut Rows, l: &LaunchSample) {
    use unit::*;
    r.u("launch_sample.duration_ns", l.duration_ms * 1_000_000, NS);
    r.opt_u("launch_sample.launches", l.launches, COUNT);
    r.opt_f(
        "launch_sample.launches_per_second",
        l.launches_per_second,
        PER_SECOND,
    );
}

/// The name of a process's info row: `process.info{comm="<comm as a JSON string>"}`.
pub fn process_info_metric(comm: &str) -> String {
    let quoted = serde_json::to_string(comm).unwrap_or_else(|_| "\"\"".into());
    format!("process.info{{comm={quoted}}}")
}

fn process_rows(
    p: &ethand_snapshot::ProcessSnapshot,
    sample: Option<&LaunchSample>,
    out: &mut Vec<MetricRow>,
) {
    use unit::*;
    let mut by_name = BTreeMap::new();
    let mut block = BTreeMap::new();
    add_syscalls(&mut by_name, p);
    add_block(&mut block, p);
    let mut rw = (0, 0, 0, 0);
    for b in &p.block {
        match b.op.as_str() {
            "read" => {
                rw.0 += b.bytes;
                rw.2 += b.ops;
            }
            "write" => {
                rw.1 += b.bytes;
                rw.3 += b.ops;
            }
            _ => {}
        }
    }
    let d = ScopeData {
        sched: &p.sched,
        syscalls: (p.syscalls.count, p.syscalls.errors, p.syscalls.time_ns),
        by_name,
        block_rw: rw,
        block,
        net: &p.net,
        gpu: p.gpu.as_ref(),
        window: p.window.clone(),
    };
    let mut r = Rows {
        scope: format!("pid:{}", p.pid),
        out,
    };
    r.u(process_info_metric(&p.comm), 1, COUNT);
    r.u("process.alive", u64::from(p.alive), COUNT);
    r.u(
        "process.threads",
        p.threads.iter().filter(|t| t.alive).count() as u64,
        COUNT,
    );
    scope_rows(&mut r, &d);
    if let Some(m) = p.memory_now() {
        process_memory_rows(&mut r, m);
    }
    if let Some(n) = sample
        .and_then(|l| l.processes.iter().find(|s| s.pid == p.pid))
        .map(|s| s.launches)
    {
        r.u("launch_sample.launches", n, COUNT);
    }
    let mut devs: Vec<&ethand_snapshot::gpu::ProcessDeviceUsage> = p.devices.iter().collect();
    devs.sort_by(|a, b| a.device.cmp(&b.device));
    for u in devs {
        let k = &u.device;
        r.u(
            format!("device.{k}.memory_used_bytes"),
            u.memory_used_bytes,
            BYTES,
        );
        r.opt_f(
            format!("device.{k}.utilization_ratio"),
            u.utilization_ratio,
            RATIO,
        );
        r.opt_f(
            format!("device.{k}.device_utilization_ratio"),
            u.device_utilization_ratio,
            RATIO,
        );
    }
}

fn device_rows(t: &TreeSnapshot, out: &mut Vec<MetricRow>) {
    use unit::*;
    let mut gpus: Vec<&ethand_snapshot::devices::GpuDevice> = t.devices.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    for g in gpus {
        let mut r = Rows {
            scope: format!("device:{}", g.label()),
            out: &mut *out,
        };
        r.opt_f("utilization_ratio", g.utilization_ratio, RATIO);
        r.opt_f(
            "memory_utilization_ratio",
            g.memory_utilization_ratio,
            RATIO,
        );
        r.opt_u("memory_used_bytes", g.memory_used_bytes, BYTES);
        r.opt_u("memory_free_bytes", g.memory_free_bytes, BYTES);
        r.opt_u("memory_total_bytes", g.memory_total_bytes, BYTES);
        r.opt_f("power_watts", g.power_watts, WATTS);
        r.opt_f(
            "energy_joules",
            g.energy_millijoules.map(|v| v as f64 / 1000.0),
            JOULES,
        );
        r.opt_f(
            "temperature_celsius",
            g.temperature_celsius.map(|v| v as f64),
            CELSIUS,
        );
        r.opt_u("sm_clock_hertz", g.sm_clock_hertz, HERTZ);
        r.opt_u("memory_clock_hertz", g.memory_clock_hertz, HERTZ);
        r.opt_u(
            "pcie_tx_bytes_per_second",
            g.pcie_tx_bytes_per_second,
            PER_SECOND,
        );
        r.opt_u(
            "pcie_rx_bytes_per_second",
            g.pcie_rx_bytes_per_second,
            PER_SECOND,
        );
        r.opt_u("ecc_corrected_errors", g.ecc_corrected_errors, COUNT);
        r.opt_u("ecc_uncorrected_errors", g.ecc_uncorrected_errors, COUNT);
        r.opt_u("xid_errors", g.xid_errors, COUNT);
        r.opt_u(
            "throttle_reasons",
            g.throttle_reasons.as_ref().map(|v| v.len() as u64),
            COUNT,
        );
        let mut links: Vec<&ethand_snapshot::devices::NvLinkStats> = g.nvlinks.iter().collect();
        links.sort_by_key(|l| l.link);
        for l in links {
            r.opt_u(format!("nvlink.{}.tx_bytes", l.link), l.tx_bytes, BYTES);
            r.opt_u(format!("nvlink.{}.rx_bytes", l.link), l.rx_bytes, BYTES);
        }
    }
    let mut npus: Vec<&ethand_snapshot::devices::NpuDevice> = t.devices.npus.iter().collect();
    npus.sort_by_key(|n| n.index);
    for n in npus {
        let mut r = Rows {
            scope: format!("device:{}", n.label()),
            out: &mut *out,
        };
        r.opt_f("utilization_ratio", n.aicore_utilization_ratio, RATIO);
        r.opt_u("memory_used_bytes", n.hbm_used_bytes, BYTES);
        r.opt_u("memory_total_bytes", n.hbm_total_bytes, BYTES);
        r.opt_f(
            "memory_bandwidth_utilization_ratio",
            n.hbm_bandwidth_utilization_ratio,
            RATIO,
        );
        r.opt_f("power_watts", n.power_watts, WATTS);
        r.opt_f(
            "temperature_celsius",
            n.temperature_celsius.map(|v| v as f64),
            CELSIUS,
        );
        r.opt_u("health", n.health.map(u64::from), COUNT);
    }
}

/// Every metric of the tree: totals (with the tree's window and derived signals), every
/// process, then the device readings. See the module documentation for names and order.
pub fn metrics_rows(t: &TreeSnapshot) -> Vec<MetricRow> {
    let mut out = Vec::new();
    total_rows(t, &mut out);
    for p in &t.processes {
        process_rows(p, t.launch_sample.as_ref(), &mut out);
    }
    device_rows(t, &mut out);
    out
}

/// One CSV field, quoted as RFC 4180 wants when it holds a comma, a quote, CR or LF (quotes
/// inside are doubled). Leading or trailing spaces are quoted too, so that no reader trims them.
pub fn csv_field(s: &str) -> String {
    let needs = s.contains([',', '"', '\n', '\r'])
        || s.starts_with(' ')
        || s.ends_with(' ')
        || s.starts_with('\t')
        || s.ends_with('\t');
    if needs {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A number as CSV writes it: Rust's shortest round-trip form ("10000", "0.25"), empty for
/// None and for non-finite values.
fn csv_num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v}"),
        _ => String::new(),
    }
}

fn csv_line(o: &mut String, fields: &[&str]) {
    let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
    o.push_str(&line.join(","));
    o.push('\n');
}

/// `ethand snapshot --csv`: header `scope,metric,value,unit`, the [`metrics_rows`], then one
/// row per finding (`finding,<id>,<impact>,impact`) in rank order, then one row per rule that
/// could not run (`not_evaluated,<rule id>,,impact`: its impact is unknown, so the value is
/// empty, as everywhere in ethand's CSV for a figure not known; never 0), then the node-wide
/// losses (`dropped_events,<reason>,<count>,count`). A figure not measured (kernel launches
/// below GPU level `process`) has no row at all. Fields are quoted as RFC 4180 says (process
/// names can hold commas, quotes and newlines); lines end with LF.
pub fn to_csv(t: &TreeSnapshot) -> String {
    let mut o = String::from("scope,metric,value,unit\n");
    for r in metrics_rows(t) {
        csv_line(
            &mut o,
            &[&r.scope, &r.metric, &csv_num(Some(r.value)), &r.unit],
        );
    }
    for f in &t.findings {
        csv_line(
            &mut o,
            &["finding", &f.id, &csv_num(Some(f.impact)), unit::IMPACT],
        );
    }
    // Rules that could not run (a signal not measured): not healthy, not examined.
    for n in &t.not_evaluated {
        csv_line(&mut o, &["not_evaluated", &n.rule, "", unit::IMPACT]);
    }
    // Node-wide losses while the figures were taken (none: no rows).
    for d in &t.dropped_events {
        csv_line(
            &mut o,
            &[
                "dropped_events",
                &d.reason,
                &d.count.to_string(),
                unit::COUNT,
            ],
        );
    }
    o
}
