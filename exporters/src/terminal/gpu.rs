//! The GPU / NPU runtime part of a snapshot: what the uprobes on the runtime libraries counted,
//! the device readings of the window, and the launches counted on demand.
use std::fmt::Write as _;

use ethand_snapshot::{
    GpuLevel, TreeSnapshot,
    gpu::{GpuDerived, GpuProcessStats, LaunchSample},
};

use super::clean;
use crate::format::{bytes_u, seconds_fixed};

/// The tree's runtime calls (`g`, its totals), then the device side.
pub(super) fn gpu_section(o: &mut String, t: &TreeSnapshot, g: &GpuProcessStats) {
    let _ = writeln!(o, "\nGPU / NPU RUNTIME (uprobes)");
    launches(o, g, t.gpu_level);
    if let Some(d) = &t.total.gpu_derived {
        window(o, d);
    }
    if let Some(l) = &t.launch_sample {
        launch_sample(o, l);
    }
    calls(o, g);
    per_process(o, t);
    top_symbols(o, g);
}

/// Launches, or why they were not counted (never a 0 that means "not counted").
fn launches(o: &mut String, g: &GpuProcessStats, level: Option<GpuLevel>) {
    match g.launches {
        None => {
            let at = level.map_or_else(
                || "the GPU level in force".to_string(),
                |l| format!("level {l}"),
            );
            let _ = writeln!(
                o,
                "  launches and device-to-device async copies not counted at {at} (`ethand level process` counts them, at a cost per call), api errors {}",
                g.errors
            );
        }
        Some(n) => {
            let graph = g
                .graph_launches
                .map_or_else(|| "not counted".to_string(), |n| n.to_string());
            let _ = writeln!(
                o,
                "  launches {n} (graph launches {graph}), api errors {}",
                g.errors
            );
        }
    }
}

/// The rates and ratios of the last window, and the GPM ratios that were measured.
fn window(o: &mut String, d: &GpuDerived) {
    let util = match (d.device_utilization_ratio, d.device_idle_ratio) {
        (Some(u), Some(i)) => format!(", device busy {:.0}% idle {:.0}%", 100.0 * u, 100.0 * i),
        _ => String::new(),
    };
    let launches = d
        .launches_per_second
        .map(|r| format!(" {r:.0} launches/s,"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "  last {:.0}s:{launches} {:.1} syncs/s, host blocked in sync {:.1}% of wall time, in collectives {:.1}%{}",
        d.window_ms as f64 / 1000.0,
        d.syncs_per_second,
        100.0 * d.sync_blocked_ratio,
        100.0 * d.collective_ratio,
        util
    );
    // NVML GPM (Hopper and newer): only the ratios that were measured.
    let gpm: Vec<String> = [
        ("SM activity", d.sm_activity_ratio),
        ("SM occupancy", d.sm_occupancy_ratio),
        ("tensor activity", d.tensor_activity_ratio),
        ("DRAM bandwidth", d.dram_bandwidth_ratio),
    ]
    .into_iter()
    .filter_map(|(what, v)| Some(format!("{what} {:.0}%", 100.0 * v?)))
    .collect();
    if !gpm.is_empty() {
        let _ = writeln!(o, "  GPU (GPM, window mean): {}", gpm.join(", "));
    }
}

/// Copies, synchronization, device memory and collectives.
fn calls(o: &mut String, g: &GpuProcessStats) {
    for c in &g.copies {
        let _ = writeln!(
            o,
            "  copy {:<17} {:>9} calls {:>11}",
            c.direction,
            c.calls,
            bytes_u(c.bytes)
        );
    }
    if g.sync.calls > 0 {
        let _ = writeln!(
            o,
            "  sync {:>9} calls, host blocked {}",
            g.sync.calls,
            seconds_fixed(g.sync.time_ns)
        );
    }
    for m in &g.memory {
        let _ = writeln!(
            o,
            "  memory {:<15} live {:>11} peak {:>11} ({} allocs, {} frees)",
            m.kind,
            bytes_u(m.live_bytes),
            bytes_u(m.peak_bytes),
            m.allocs,
            m.frees
        );
    }
    if g.untracked_frees > 0 {
        let _ = writeln!(
            o,
            "  {} frees of memory allocated before ethand attached",
            g.untracked_frees
        );
    }
    for c in &g.collectives {
        let _ = writeln!(
            o,
            "  {} {:<15} {:>9} calls {:>11} host {}",
            c.library,
            c.operation,
            c.calls,
            bytes_u(c.bytes),
            seconds_fixed(c.time_ns)
        );
    }
}

/// Each process's communicator rank and the devices it uses.
fn per_process(o: &mut String, t: &TreeSnapshot) {
    for p in &t.processes {
        if let Some(c) = p.gpu.as_ref().and_then(|g| g.comm.as_ref()) {
            let rank = c.rank.map_or("all".to_string(), |r| r.to_string());
            let _ = writeln!(
                o,
                "  pid {} {} rank {} of {}",
                p.pid, c.library, rank, c.nranks
            );
        }
        for dev in &p.devices {
            let util = dev
                .utilization_ratio
                .map(|u| format!(", sm {:.0}%", 100.0 * u))
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "  pid {} on {}: {} device memory{}",
                p.pid,
                dev.device,
                bytes_u(dev.memory_used_bytes),
                util
            );
        }
    }
}

/// The eight runtime symbols called most.
fn top_symbols(o: &mut String, g: &GpuProcessStats) {
    let mut syms: Vec<_> = g.symbols.iter().collect();
    syms.sort_by_key(|a| std::cmp::Reverse(a.calls));
    let _ = writeln!(
        o,
        "  TOP SYMBOLS                         CALLS       BYTES    HOST TIME"
    );
    for s in syms.iter().take(8) {
        let t = if s.timed_calls > 0 {
            seconds_fixed(s.time_ns)
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "  {:<32} {:>9} {:>11} {:>12}",
            s.symbol,
            s.calls,
            bytes_u(s.bytes),
            t
        );
    }
}

/// The launches counted on demand for this snapshot (GPU level `calls`).
pub(super) fn launch_sample(o: &mut String, l: &LaunchSample) {
    let over = l.duration_ms as f64 / 1000.0;
    let counted = match (l.launches_per_second, l.launches) {
        (Some(r), _) => {
            format!("{r:.0} launches/s, counted on demand over {over:.1}s for this snapshot")
        }
        (None, Some(n)) => {
            format!("{n} launches, counted on demand over {over:.1}s for this snapshot")
        }
        (None, None) => format!("no process of the tree could be sampled (tried over {over:.1}s)"),
    };
    let _ = writeln!(o, "  launch sample: {counted}");
    if !l.method.is_empty() {
        let _ = writeln!(o, "    how: {}", clean(&l.method));
    }
    for p in &l.processes {
        let _ = writeln!(o, "    pid {}: {} launches", p.pid, p.launches);
    }
    for n in &l.notes {
        let _ = writeln!(o, "    {}", clean(n));
    }
}
