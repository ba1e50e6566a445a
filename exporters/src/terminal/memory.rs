//! The MEMORY section of `ethand snapshot`: the tree's resident memory by kind, its peak over
//! the window, the largest processes with their growth and faults, the memory cgroups'
//! limits and OOM kills, and the node's available memory. The cgroup phrase is shared with
//! the memory findings' detail.
use std::fmt::Write as _;

use ethand_snapshot::TreeSnapshot;
use ethand_snapshot::memory::{CgroupMemory, ProcessMemory};

use super::clean;
use crate::format::{bytes_per_second, bytes_u, count, duration_s, percent, plural};

/// Most processes listed (the largest resident sets).
const PROCESSES_SHOWN: usize = 10;

fn b(v: Option<u64>) -> String {
    v.map_or_else(|| "?".into(), bytes_u)
}

/// "resident 230 MiB (anonymous 220 MiB, file 8.0 MiB, shmem 2.0 MiB), swap 0 B".
pub fn split(m: &ProcessMemory) -> String {
    format!(
        "resident {} (anonymous {}, file {}, shmem {}), swap {}",
        b(m.rss_bytes),
        b(m.anon_bytes),
        b(m.file_bytes),
        b(m.shmem_bytes),
        b(m.swap_bytes)
    )
}

/// "grew 12.0 MiB/s over the last 30 s (100 MiB to 460 MiB, peak 460 MiB)" or "steady over
/// the last 30 s (peak 460 MiB)"; empty without a window.
pub fn window(m: &ProcessMemory) -> String {
    let Some(w) = &m.window else {
        return String::new();
    };
    let span = duration_s(w.duration_ms as f64 / 1000.0);
    match w.rss_growth_bytes_per_second() {
        Some(g) if g.abs() >= 4096.0 => format!(
            "{} {} over the last {span} ({} to {}, peak {})",
            if g > 0.0 { "grew" } else { "shrank" },
            bytes_per_second(g.abs()),
            bytes_u(w.first_rss_bytes),
            bytes_u(w.last_rss_bytes),
            bytes_u(w.peak_rss_bytes)
        ),
        _ => format!(
            "steady over the last {span} (peak {})",
            bytes_u(w.peak_rss_bytes)
        ),
    }
}

/// "memory cgroup /job (v1): 230 MiB of its 256 MiB limit (90 %), 0 OOM kills".
pub fn cgroup_line(c: &CgroupMemory) -> String {
    let usage = b(c.usage_bytes);
    let limit = match (c.limit_bytes, &c.limit_path) {
        (Some(l), Some(at)) if *at != c.path => {
            format!("used of the {} limit set on {}", bytes_u(l), clean(at))
        }
        (Some(l), _) => format!("used of its {} limit", bytes_u(l)),
        (None, _) => "used, no limit".into(),
    };
    let ratio = c
        .limit_ratio()
        .map_or(String::new(), |r| format!(" ({})", percent(r)));
    let kills = c
        .oom_kills
        .map_or(String::new(), |k| format!(", {}", plural(k, "OOM kill")));
    let note = if c.note.is_empty() {
        String::new()
    } else {
        format!(" [{}]", c.note)
    };
    format!(
        "memory cgroup {} ({}): {usage} {limit}{ratio}{kills}{note}",
        clean(&c.path),
        c.version
    )
}

pub fn memory_section(o: &mut String, t: &TreeSnapshot) {
    let Some(tot) = t.memory_totals() else {
        return;
    };
    let _ = writeln!(o, "MEMORY (now; peak and growth over the window)");
    let peak = t.total.memory_peak_rss_bytes.map_or(String::new(), |p| {
        format!(", peak {} over the window", bytes_u(p))
    });
    let _ = writeln!(
        o,
        "  tree: resident {} (anonymous {}, file {}, shmem {}), swap {}{peak}",
        bytes_u(tot.rss_bytes),
        bytes_u(tot.anon_bytes),
        bytes_u(tot.file_bytes),
        bytes_u(tot.shmem_bytes),
        bytes_u(tot.swap_bytes)
    );
    let mut procs: Vec<_> = t
        .processes
        .iter()
        .filter_map(|p| Some((p, p.memory_now()?)))
        .collect();
    procs.sort_by_key(|(_, m)| std::cmp::Reverse(m.rss_bytes.unwrap_or(0)));
    for (p, m) in procs.iter().take(PROCESSES_SHOWN) {
        let w = window(m);
        let faults = match (m.minor_faults, m.major_faults) {
            (Some(mi), Some(ma)) => format!("; faults {} minor, {} major", count(mi), count(ma)),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "  {:<7} {:<16} {}{}{}{faults}",
            p.pid,
            clean(&p.comm),
            split(m),
            if w.is_empty() { "" } else { "; " },
            w
        );
    }
    if procs.len() > PROCESSES_SHOWN {
        let _ = writeln!(o, "  ... {} more", procs.len() - PROCESSES_SHOWN);
    }
    for c in &t.memory_cgroups {
        let _ = writeln!(o, "  {}", cgroup_line(c));
    }
    if let Some(n) = &t.node_memory {
        let _ = writeln!(
            o,
            "  node: {} available of {} ({})",
            bytes_u(n.available_bytes),
            bytes_u(n.total_bytes),
            n.available_ratio().map_or("?".into(), percent)
        );
    }
    o.push('\n');
}
