//! Host memory signals: the tree's resident set and its growth (the daemon's samples over
//! the window), its memory cgroups' limits and OOM kills, the node's available memory. The
//! figures are the snapshot's (`ethand_snapshot::memory`), so `ethand diagnose` of a saved
//! file reads the same.
use super::{Ctx, HowToGet, Signal, Unit};

/// Headroom before the nearest limit (the tree's memory cgroup's, else the node's
/// available memory), in bytes.
pub(crate) fn headroom_bytes(c: &Ctx) -> Option<f64> {
    let cgroup =
        c.t.memory_cgroups
            .iter()
            .filter_map(|m| Some(m.limit_bytes? as f64 - m.usage_bytes? as f64))
            .reduce(f64::min);
    let node = c.t.node_memory.as_ref().map(|n| n.available_bytes as f64);
    match (cgroup, node) {
        (Some(a), Some(b)) => Some(a.min(b).max(0.0)),
        (a, b) => a.or(b).map(|v| v.max(0.0)),
    }
}

/// The fastest resident-set growth of a live process over the window; 0 when the tree has
/// samples spanning a second and none grew.
pub(crate) fn fastest_growth(c: &Ctx) -> Option<f64> {
    let sampled = c.t.processes.iter().any(|p| {
        p.memory_now()
            .and_then(|m| m.window.as_ref()?.rss_growth_bytes_per_second())
            .is_some()
    });
    sampled.then(|| c.t.memory_fastest_growth().map_or(0.0, |(_, g)| g))
}

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "mem.rss_bytes",
        unit: Unit::Bytes,
        doc: "resident memory of the tree's live processes (anonymous, file and shmem pages of /proc/PID/status) when the snapshot was taken",
        how_to_get: HowToGet::Measured,
        compute: |c| c.t.memory_totals().map(|m| m.rss_bytes as f64),
    },
    Signal {
        name: "mem.rss_growth_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "resident-memory growth of the tree's fastest-growing live process over the window (the daemon samples a process each second it runs, and every process every 10 s); 0 when none grew",
        how_to_get: HowToGet::Measured,
        compute: fastest_growth,
    },
    Signal {
        name: "mem.growth_window_seconds",
        unit: Unit::Seconds,
        doc: "the span over which `mem.rss_growth_bytes_per_second` was measured (the fastest-growing process's samples in the window): a rate over a few seconds says little about the next ten minutes",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let (p, _) = c.t.memory_fastest_growth()?;
            Some(p.memory_now()?.window.as_ref()?.duration_ms as f64 / 1000.0)
        },
    },
    Signal {
        name: "mem.cgroup_limit_ratio",
        unit: Unit::Ratio,
        doc: "usage over the limit of the tree's memory cgroup nearest its limit (cgroup v2 memory.current / memory.max, v1 memory.usage_in_bytes / memory.limit_in_bytes, the lowest limit on the way up); absent without a limit",
        how_to_get: HowToGet::Measured,
        compute: |c| c.t.memory_cgroup_nearest_limit().map(|(_, r)| r),
    },
    Signal {
        name: "mem.available_ratio",
        unit: Unit::Ratio,
        doc: "the node's MemAvailable over MemTotal (/proc/meminfo) when the snapshot was taken",
        how_to_get: HowToGet::Measured,
        compute: |c| c.t.node_memory.as_ref()?.available_ratio(),
    },
    Signal {
        name: "mem.oom_kills",
        unit: Unit::Count,
        doc: "processes the OOM killer killed in the tree's memory cgroups since they were made (memory.events oom_kill, v1 memory.oom_control)",
        how_to_get: HowToGet::Measured,
        compute: |c| c.t.memory_oom_kills().map(|n| n as f64),
    },
    Signal {
        name: "mem.seconds_to_limit",
        unit: Unit::Seconds,
        doc: "how long until the nearest limit (the memory cgroup's, else the node's available memory) at `mem.rss_growth_bytes_per_second`; absent when nothing grows",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let growth = fastest_growth(c).filter(|g| *g > 0.0)?;
            Some(headroom_bytes(c)? / growth)
        },
    },
];
