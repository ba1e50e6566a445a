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
//! `total`, and `launch_sample.launches` per sampled process). The order is deterministic:
//! total, the processes in snapshot order (root first), then devices; within a scope a fixed
//! group order, and keyed sub-lists (syscalls, block devices, copy directions, ...) sorted by
//! key.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use ethand_snapshot::diagnosis::Finding;
use ethand_snapshot::gpu::{GpuProcessStats, LaunchSample, add_counted};
use ethand_snapshot::{NetStats, SchedStats, TreeSnapshot, WindowStats};

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
    r.u("net.tx_bytes", n.tcp_tx_bytes + n.udp_tx_bytes, BYTES);
    r.u("net.rx_bytes", n.tcp_rx_bytes + n.udp_rx_bytes, BYTES);
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
    r.u(
        "gpu.copies.calls",
        g.copies.iter().map(|c| c.calls).sum(),
        COUNT,
    );
    r.u(
        "gpu.copies.bytes",
        g.copies.iter().map(|c| c.bytes).sum(),
        BYTES,
    );
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
    r.u(
        "gpu.collectives.calls",
        g.collectives.iter().map(|c| c.calls).sum(),
        COUNT,
    );
    r.u(
        "gpu.collectives.bytes",
        g.collectives.iter().map(|c| c.bytes).sum(),
        BYTES,
    );
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

// ---------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------

/// What a compared snapshot was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// "daemon" or "standalone".
    pub source: String,
    pub root_pid: u32,
    pub taken_at_unix_ms: u64,
    /// Standalone measurement time (0 from a daemon).
    pub measured_ms: u64,
    /// The tree's window (0: none).
    pub window_ms: u64,
    pub processes: u64,
    /// What this side's `rate.*` rows divide by: "window" (window change / window
    /// duration), "measured" (totals / `measured_ms`) or "none" (no rates).
    pub rate_basis: String,
}

/// One metric in both snapshots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComparedRow {
    /// "total" (the comparison covers the tree totals, its window and derived signals).
    pub scope: String,
    pub metric: String,
    pub unit: String,
    /// None: the metric is absent from that snapshot (e.g. no GPU calls, no window).
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// after - before, when both are known.
    pub change: Option<f64>,
    /// after / before, when both are known and before is not 0.
    pub ratio: Option<f64>,
    /// "before", "after" or "both": the snapshot that did not measure the metric at all
    /// (kernel launches below GPU level `process`), as opposed to one where it is absent
    /// because nothing happened. Its value is None and the row is no change. Absent: measured
    /// wherever the snapshot could.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
}

/// `ethand compare BEFORE.json AFTER.json`: two snapshots of a workload (typically before and
/// after a change), metric by metric and finding by finding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// [`COMPARISON_SCHEMA_VERSION`].
    pub schema_version: u32,
    pub before: SnapshotMeta,
    pub after: SnapshotMeta,
    /// The tree totals, window and derived metrics matched by name (before's order, then
    /// the ones only after has), then the `rate.*` rows.
    pub rows: Vec<ComparedRow>,
    /// Findings of `before` whose id `after` does not have (before's rank order).
    pub findings_resolved: Vec<Finding>,
    /// Findings of `after` whose id `before` does not have (after's rank order).
    pub findings_new: Vec<Finding>,
    /// Findings in both, as (before, after), in before's rank order. JSON: `[before, after]`.
    pub findings_remaining: Vec<(Finding, Finding)>,
}

/// A counter that has a window figure: (metric, window field (None: not counted), GPU
/// counter).
type RateCounter = (&'static str, fn(&WindowStats) -> Option<u64>, bool);

/// The metrics of kernel launches, which GPU levels below `process` do not count.
const LAUNCH_METRICS: &[&str] = &[
    "gpu.launches",
    "gpu.graph_launches",
    "window.gpu_launches",
    "derived.gpu.launches_per_second",
];

/// The metrics `t` did not measure at all (not absent because nothing happened): kernel
/// launches, where its GPU figures were taken below level `process`.
fn unmeasured_metrics(t: &TreeSnapshot) -> &'static [&'static str] {
    let launches_not_counted = t.total.gpu.as_ref().is_some_and(|g| g.launches.is_none())
        || t.total
            .gpu_derived
            .as_ref()
            .is_some_and(|d| d.launches_per_second.is_none());
    if launches_not_counted {
        LAUNCH_METRICS
    } else {
        &[]
    }
}

fn rate_counters() -> Vec<RateCounter> {
    vec![
        ("sched.oncpu_ns", |w| Some(w.oncpu_ns), false),
        (
            "sched.offcpu_blocked_ns",
            |w| Some(w.offcpu_blocked_ns),
            false,
        ),
        (
            "sched.offcpu_preempted_ns",
            |w| Some(w.offcpu_preempted_ns),
            false,
        ),
        ("sched.runq_wait_ns", |w| Some(w.runq_wait_ns), false),
        ("syscalls.count", |w| Some(w.syscalls), false),
        ("syscalls.time_ns", |w| Some(w.syscall_time_ns), false),
        ("block.read_bytes", |w| Some(w.block_read_bytes), false),
        ("block.write_bytes", |w| Some(w.block_write_bytes), false),
        ("net.tx_bytes", |w| Some(w.net_tx_bytes), false),
        ("net.rx_bytes", |w| Some(w.net_rx_bytes), false),
        ("gpu.launches", |w| w.gpu_launches, true),
        ("gpu.sync.time_ns", |w| Some(w.gpu_sync_ns), true),
        (
            "gpu.copies.host_to_device.bytes",
            |w| Some(w.gpu_copy_h2d_bytes),
            true,
        ),
        (
            "gpu.copies.device_to_host.bytes",
            |w| Some(w.gpu_copy_d2h_bytes),
            true,
        ),
        (
            "gpu.copies.bytes",
            |w| Some(w.gpu_copy_h2d_bytes + w.gpu_copy_d2h_bytes + w.gpu_copy_other_bytes),
            true,
        ),
        ("gpu.collectives.calls", |w| Some(w.collective_calls), true),
        ("gpu.collectives.time_ns", |w| Some(w.collective_ns), true),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Basis {
    Window,
    Measured,
    None,
}

impl Basis {
    fn as_str(self) -> &'static str {
        match self {
            Basis::Window => "window",
            Basis::Measured => "measured",
            Basis::None => "none",
        }
    }
}

struct Side<'a> {
    t: &'a TreeSnapshot,
    rows: Vec<MetricRow>,
    /// metric -> index in `rows`
    index: std::collections::HashMap<String, usize>,
    window: Option<WindowStats>,
    basis: Basis,
    /// [`unmeasured_metrics`] of `t`.
    unmeasured: &'static [&'static str],
}

impl Side<'_> {
    fn value(&self, metric: &str) -> Option<f64> {
        self.index.get(metric).map(|&i| self.rows[i].value)
    }

    /// Per second rate of a counter on this side's basis. A counter absent from the totals
    /// (a tree without GPU calls) counts as 0; one not measured (launches below GPU level
    /// `process`) has no rate.
    fn rate(&self, metric: &str, field: fn(&WindowStats) -> Option<u64>) -> Option<f64> {
        if self.unmeasured.contains(&metric) {
            return None;
        }
        match self.basis {
            Basis::Window => {
                let w = self.window.as_ref()?;
                let n = match field(w) {
                    Some(n) => n,
                    // Not counted because the tree made no GPU calls: none happened.
                    None if self.t.total.gpu.is_none() => 0,
                    None => return None,
                };
                Some(n as f64 * 1000.0 / w.duration_ms as f64)
            }
            Basis::Measured => {
                Some(self.value(metric).unwrap_or(0.0) * 1000.0 / self.t.measured_ms as f64)
            }
            Basis::None => None,
        }
    }

    fn meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            source: self.t.source.clone(),
            root_pid: self.t.root_pid,
            taken_at_unix_ms: self.t.taken_at_unix_ms,
            measured_ms: self.t.measured_ms,
            window_ms: self.window.as_ref().map_or(0, |w| w.duration_ms),
            processes: self.t.total.processes,
            rate_basis: self.basis.as_str().into(),
        }
    }
}

fn compared(scope: &str, metric: &str, unit: &str, b: Option<f64>, a: Option<f64>) -> ComparedRow {
    let (change, ratio) = match (b, a) {
        (Some(b), Some(a)) => (Some(a - b), (b != 0.0).then(|| a / b)),
        _ => (None, None),
    };
    ComparedRow {
        scope: scope.into(),
        metric: metric.into(),
        unit: unit.into(),
        before: b,
        after: a,
        change,
        ratio,
        not_measured: None,
    }
}

/// [`ComparedRow::not_measured`] of a metric each side did (false) or did not (true) measure.
fn not_measured(before: bool, after: bool) -> Option<String> {
    match (before, after) {
        (true, true) => Some("both".into()),
        (true, false) => Some("before".into()),
        (false, true) => Some("after".into()),
        (false, false) => None,
    }
}

/// Compares two snapshots of (typically) the same workload.
///
/// - Only the `total` scope is compared (tree totals, the tree's window and `derived.*`
///   signals), matched by metric name: pids differ between runs, so processes are not.
/// - The two snapshots may cover different durations, so the main counters (CPU and
///   scheduler time, syscalls, block and network bytes, GPU launches, sync time, copy bytes,
///   collectives: those the window tracks) are also compared as rates, in rows named
///   `rate.<metric>` (unit `per_second`). Rates use, when **both** snapshots have a window,
///   the window change divided by the window duration for both (the same kind of figure on
///   each side: "what it was doing lately"); otherwise each side divides its totals by its
///   `measured_ms` (standalone snapshots, whose totals cover exactly the measurement), or
///   falls back to its own window when it has no `measured_ms`; a side with neither has no
///   rate. [`SnapshotMeta::rate_basis`] says which was used. GPU rate rows appear only when
///   one of the snapshots has GPU figures.
/// - Findings are matched by id: resolved (before only), new (after only), remaining (both).
pub fn compare(before: &TreeSnapshot, after: &TreeSnapshot) -> Comparison {
    fn side(t: &TreeSnapshot) -> Side<'_> {
        let mut rows = Vec::new();
        total_rows(t, &mut rows);
        let mut index = std::collections::HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            index.entry(r.metric.clone()).or_insert(i);
        }
        Side {
            t,
            rows,
            index,
            window: tree_window(t),
            basis: Basis::None,
            unmeasured: unmeasured_metrics(t),
        }
    }
    let mut b = side(before);
    let mut a = side(after);
    let both_windows = b.window.is_some() && a.window.is_some();
    for s in [&mut b, &mut a] {
        s.basis = if both_windows {
            Basis::Window
        } else if s.t.measured_ms > 0 {
            Basis::Measured
        } else if s.window.is_some() {
            Basis::Window
        } else {
            Basis::None
        };
    }

    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in b.rows.iter().chain(a.rows.iter()) {
        if !seen.insert(r.metric.as_str()) {
            continue;
        }
        let mut row = compared(
            "total",
            &r.metric,
            &r.unit,
            b.value(&r.metric),
            a.value(&r.metric),
        );
        let m = r.metric.as_str();
        row.not_measured = not_measured(b.unmeasured.contains(&m), a.unmeasured.contains(&m));
        rows.push(row);
    }
    let gpu = before.total.gpu.is_some() || after.total.gpu.is_some();
    for (metric, field, is_gpu) in rate_counters() {
        if is_gpu && !gpu {
            continue;
        }
        let mut row = compared(
            "total",
            &format!("rate.{metric}"),
            unit::PER_SECOND,
            b.rate(metric, field),
            a.rate(metric, field),
        );
        row.not_measured = not_measured(
            b.unmeasured.contains(&metric),
            a.unmeasured.contains(&metric),
        );
        rows.push(row);
    }

    let mut findings_resolved = Vec::new();
    let mut findings_remaining = Vec::new();
    let mut matched = vec![false; after.findings.len()];
    for f in &before.findings {
        let hit = after
            .findings
            .iter()
            .enumerate()
            .position(|(i, g)| !matched[i] && g.id == f.id);
        match hit {
            Some(i) => {
                matched[i] = true;
                findings_remaining.push((f.clone(), after.findings[i].clone()));
            }
            None => findings_resolved.push(f.clone()),
        }
    }
    let findings_new = after
        .findings
        .iter()
        .zip(&matched)
        .filter(|(_, m)| !**m)
        .map(|(f, _)| f.clone())
        .collect();
    Comparison {
        schema_version: COMPARISON_SCHEMA_VERSION,
        before: b.meta(),
        after: a.meta(),
        rows,
        findings_resolved,
        findings_new,
        findings_remaining,
    }
}

/// `ethand compare --csv`: header `scope,metric,unit,before,after,change,ratio` (empty field:
/// unknown), the compared rows, then one row per finding: `finding,<id>,impact,<impact
/// before>,<impact after>,<change>,<ratio>` (resolved: no after; new: no before), in the
/// order resolved, remaining, new. RFC 4180 quoting, LF line ends.
pub fn comparison_to_csv(c: &Comparison) -> String {
    let mut o = String::from("scope,metric,unit,before,after,change,ratio\n");
    let mut line = |r: &ComparedRow| {
        csv_line(
            &mut o,
            &[
                &r.scope,
                &r.metric,
                &r.unit,
                &csv_num(r.before),
                &csv_num(r.after),
                &csv_num(r.change),
                &csv_num(r.ratio),
            ],
        )
    };
    for r in &c.rows {
        line(r);
    }
    for f in &c.findings_resolved {
        line(&compared(
            "finding",
            &f.id,
            unit::IMPACT,
            Some(f.impact),
            None,
        ));
    }
    for (b, a) in &c.findings_remaining {
        line(&compared(
            "finding",
            &b.id,
            unit::IMPACT,
            Some(b.impact),
            Some(a.impact),
        ));
    }
    for f in &c.findings_new {
        line(&compared(
            "finding",
            &f.id,
            unit::IMPACT,
            None,
            Some(f.impact),
        ));
    }
    o
}

/// Relative change used to rank rows: |change| / |before|; infinite when the metric appeared,
/// disappeared or grew from 0; None when nothing changed or one side did not measure it.
fn relative_change(r: &ComparedRow) -> Option<f64> {
    if r.not_measured.is_some() {
        return None;
    }
    match (r.before, r.after) {
        (Some(b), Some(a)) => {
            let d = a - b;
            if d == 0.0 || !d.is_finite() {
                None
            } else if b == 0.0 {
                Some(f64::INFINITY)
            } else {
                Some((d / b).abs())
            }
        }
        (None, None) => None,
        _ => Some(f64::INFINITY),
    }
}

fn human_bytes(v: f64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let neg = v < 0.0;
    let mut x = v.abs();
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    let s = if i == 0 {
        format!("{x:.0} B")
    } else {
        format!("{x:.1} {}", U[i])
    };
    if neg { format!("-{s}") } else { s }
}

fn human_ns(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}s", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}ms", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.2}us", v / 1e3)
    } else {
        format!("{v:.0}ns")
    }
}

fn human_count(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Three significant digits for small values ("0.000212"), three decimals otherwise.
fn significant(v: f64) -> String {
    if v == 0.0 || v.abs() >= 0.1 || !v.is_finite() {
        format!("{v:.3}")
    } else {
        let digits = (2 - v.abs().log10().floor() as i64).clamp(3, 12) as usize;
        format!("{v:.digits$}")
    }
}

/// A value in its unit; `base` is the unit of the counter a `rate.*` row comes from.
fn human(v: f64, unit: &str, base: Option<&str>) -> String {
    match unit {
        unit::NS => human_ns(v),
        unit::BYTES => human_bytes(v),
        unit::COUNT | unit::IMPACT => human_count(v),
        unit::RATIO => significant(v),
        unit::PER_SECOND => match base {
            Some(unit::BYTES) => format!("{}/s", human_bytes(v)),
            // ns per second: seconds of the activity per second of wall time.
            Some(unit::NS) => format!("{:.3}s/s", v / 1e9),
            _ => format!("{v:.1}/s"),
        },
        _ => format!("{v} {unit}"),
    }
}

/// Seconds since the epoch as "YYYY-MM-DD HH:MM:SS UTC".
fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn describe(m: &SnapshotMeta) -> String {
    let mut s = format!(
        "{} snapshot of pid {} ({} process{}) at {}",
        if m.source.is_empty() { "?" } else { &m.source },
        m.root_pid,
        m.processes,
        if m.processes == 1 { "" } else { "es" },
        utc(m.taken_at_unix_ms)
    );
    if m.measured_ms > 0 {
        let _ = write!(s, ", measured {:.1}s", m.measured_ms as f64 / 1000.0);
    }
    if m.window_ms > 0 {
        let _ = write!(s, ", window {:.1}s", m.window_ms as f64 / 1000.0);
    }
    let _ = write!(s, "; rates over: {}", m.rate_basis);
    s
}

/// Printable form of text from a snapshot (control and hidden characters escaped).
fn clean(s: &str) -> String {
    crate::text::for_terminal(s)
}

struct Paint(bool);

impl Paint {
    fn p(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

/// Terminal form of a comparison: the [`RENDER_TOP`] metrics that changed most (by relative
/// change; appeared, disappeared or from-zero first), then the findings: resolved, new and
/// still there, with their titles and impact before -> after. `color`: ANSI colors.
pub fn render_comparison(c: &Comparison, color: bool) -> String {
    let paint = Paint(color);
    let mut o = String::new();
    let _ = writeln!(o, "{} {}", paint.p("1", "before:"), describe(&c.before));
    let _ = writeln!(o, "{} {}", paint.p("1", "after: "), describe(&c.after));

    let units: BTreeMap<&str, &str> = c
        .rows
        .iter()
        .map(|r| (r.metric.as_str(), r.unit.as_str()))
        .collect();
    let mut ranked: Vec<(f64, &ComparedRow)> = c
        .rows
        .iter()
        .filter_map(|r| relative_change(r).map(|x| (x, r)))
        .collect();
    ranked.sort_by(|x, y| {
        y.0.total_cmp(&x.0)
            .then_with(|| {
                let dx = x.1.change.map_or(0.0, f64::abs);
                let dy = y.1.change.map_or(0.0, f64::abs);
                dy.total_cmp(&dx)
            })
            .then_with(|| x.1.metric.cmp(&y.1.metric))
    });
    let shown: Vec<&(f64, &ComparedRow)> = ranked.iter().take(RENDER_TOP).collect();
    let _ = writeln!(o);
    if shown.is_empty() {
        let _ = writeln!(o, "no metric changed");
    } else {
        let width = shown
            .iter()
            .map(|(_, r)| r.metric.chars().count())
            .max()
            .unwrap_or(6)
            .clamp(6, 64);
        let _ = writeln!(
            o,
            "{}",
            paint.p(
                "1",
                &format!(
                    "Most changed: {} of {} metrics ({} changed), by relative change",
                    shown.len(),
                    c.rows.len(),
                    ranked.len()
                )
            )
        );
        let _ = writeln!(
            o,
            "{}",
            paint.p(
                "1",
                &format!(
                    "{:<width$}  {:>14}  {:>14}  {:>14}  {:>9}",
                    "METRIC", "BEFORE", "AFTER", "CHANGE", "RELATIVE"
                )
            )
        );
        for (rel, r) in shown {
            let base = r
                .metric
                .strip_prefix("rate.")
                .and_then(|m| units.get(m).copied());
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| human(v, &r.unit, base));
            let change = r.change.map_or("-".to_string(), |d| {
                let s = human(d, &r.unit, base);
                if d > 0.0 { format!("+{s}") } else { s }
            });
            let relative = match (r.before, r.after) {
                (None, Some(_)) => "appeared".to_string(),
                (Some(_), None) => "gone".to_string(),
                _ if rel.is_infinite() => "from 0".to_string(),
                _ => {
                    let pct = r.change.unwrap_or(0.0) / r.before.unwrap_or(1.0).abs() * 100.0;
                    format!("{pct:+.1}%")
                }
            };
            let code = if r.change.unwrap_or(0.0) > 0.0 || r.before.is_none() {
                "33"
            } else {
                "36"
            };
            let _ = writeln!(
                o,
                "{:<width$}  {:>14}  {:>14}  {}  {:>9}",
                clean(&r.metric),
                fmt(r.before),
                fmt(r.after),
                paint.p(code, &format!("{change:>14}")),
                relative
            );
        }
    }

    // Metrics a side did not measure: no change to show, and not a change from 0.
    let mut blank = true;
    for side in ["before", "after", "both"] {
        let names: Vec<String> = c
            .rows
            .iter()
            .filter(|r| r.not_measured.as_deref() == Some(side))
            .map(|r| clean(&r.metric))
            .collect();
        if names.is_empty() {
            continue;
        }
        let which = match side {
            "both" => "in either snapshot",
            "before" => "in before",
            _ => "in after",
        };
        if std::mem::take(&mut blank) {
            let _ = writeln!(o);
        }
        let _ = writeln!(
            o,
            "not compared, not measured {which} (kernel launches are counted at GPU level process or op, or sampled by `ethand snapshot`): {}",
            names.join(", ")
        );
    }

    let _ = writeln!(o);
    let impact = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    if c.findings_resolved.is_empty()
        && c.findings_new.is_empty()
        && c.findings_remaining.is_empty()
    {
        let _ = writeln!(o, "findings: none in either snapshot");
    }
    for f in &c.findings_resolved {
        let _ = writeln!(
            o,
            "{} {} ({}), impact {} -> -",
            paint.p("32;1", "resolved:"),
            clean(&f.title),
            clean(&f.id),
            impact(Some(f.impact))
        );
    }
    for f in &c.findings_new {
        let _ = writeln!(
            o,
            "{} {} ({}, {}), impact - -> {}",
            paint.p("31;1", "new:     "),
            clean(&f.title),
            clean(&f.id),
            clean(&f.severity),
            impact(Some(f.impact))
        );
    }
    for (b, a) in &c.findings_remaining {
        let _ = writeln!(
            o,
            "{} {} ({}), impact {} -> {}",
            paint.p("33;1", "still:   "),
            clean(&a.title),
            clean(&a.id),
            impact(Some(b.impact)),
            impact(Some(a.impact))
        );
    }
    o
}
