//! `ethand status`: the daemon's own state (probes, maps, program cost, losses).
use std::fmt::Write as _;

use ethand_snapshot::{GpuLevel, SelfStatus};

use super::clean;
use crate::format::{bytes_u, duration_ns_u, seconds_fixed};
use crate::text;

/// `ethand status`: what the daemon measures and what it costs.
pub fn status(s: &SelfStatus) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "ethand {} (pid {}), cpu {:.2}s, rss {}",
        s.version,
        s.pid,
        s.cpu_seconds,
        bytes_u(s.rss_bytes)
    );
    daemon(&mut o, s);
    probes(&mut o, s);
    maps_and_programs(&mut o, s);
    // Library paths and probe details come from other users' files: nothing raw.
    text::for_terminal_keep_lines(&o)
}

/// The tracked processes, the collection loop, the reader, and how the daemon runs and serves.
fn daemon(o: &mut String, s: &SelfStatus) {
    let _ = writeln!(
        o,
        "tracked processes: {} (overflow {})",
        s.tracked_processes, s.processes_overflow
    );
    if let Some(age) = s.last_round_age_ms {
        let _ = writeln!(
            o,
            "last collection round: {} ago{}",
            duration_ns_u(age.saturating_mul(1_000_000)),
            if age > 10 * 1000 {
                " (STALE: the collection loop is behind or stopped)"
            } else {
                ""
            }
        );
    }
    if let Some(r) = &s.reader {
        match (&r.pid, &r.unavailable) {
            (Some(pid), _) => {
                let _ = writeln!(
                    o,
                    "reader: pid {pid}; {} workers started, {} refused (busy), {} late, {} ended by a limit or fault",
                    r.sessions, r.refused, r.timeouts, r.died
                );
            }
            (None, Some(why)) => {
                let _ = writeln!(o, "reader: not running: {}", clean(why));
            }
            _ => {}
        }
        for b in &r.blamed_files {
            let _ = writeln!(o, "  not parsed again: {}", clean(b));
        }
    }
    if !s.socket_access.is_empty() {
        let _ = writeln!(o, "local API socket: {}", s.socket_access);
    }
    if !s.user.is_empty() {
        let _ = writeln!(o, "runs as: {}", s.user);
    }
    if !s.capabilities.is_empty() {
        let _ = writeln!(o, "capabilities kept: {}", s.capabilities.join(" "));
    }
    for c in &s.servers {
        let _ = writeln!(
            o,
            "{} connections: {} open (at most {}, {} per peer); refused {} at the server's cap, {} at a peer's; {} timed out; {} accept errors",
            if c.server == "metrics" {
                "/metrics"
            } else {
                "local API"
            },
            c.open,
            c.max,
            c.max_per_peer,
            c.refused_limit,
            c.refused_peer_limit,
            c.timed_out,
            c.accept_errors
        );
    }
}

/// Each probe's state, and the GPU/NPU runtime libraries found.
fn probes(o: &mut String, s: &SelfStatus) {
    let _ = writeln!(
        o,
        "\nPROBE                 STATE        ATTACHED TO                         DETAIL"
    );
    for p in &s.probes {
        let _ = writeln!(
            o,
            "{:<21} {:<12} {:<35} {}",
            p.name,
            p.state.as_str(),
            p.attach_point,
            p.detail
        );
    }
    let _ = writeln!(
        o,
        "\nGPU/NPU level: {}",
        s.gpu_level.map_or("", GpuLevel::as_str)
    );
    for l in &s.gpu_libraries {
        let _ = writeln!(
            o,
            "  {:<9} {:<9} {} (dev {} inode {}, first seen in pid {}): {}",
            l.runtime,
            l.state.as_str(),
            l.path,
            l.dev,
            l.inode,
            l.found_in_pid,
            l.detail
        );
        if !l.symbols_missing.is_empty() {
            let _ = writeln!(
                o,
                "            not probed: {}",
                l.symbols_missing.join(", ")
            );
        }
    }
}

/// Map fill, program cost (BPF stats) and dropped or unmatched events.
fn maps_and_programs(o: &mut String, s: &SelfStatus) {
    let _ = writeln!(o, "\nMAP            ENTRIES   CAPACITY  FILL");
    for m in &s.maps {
        let fill = if m.capacity > 0 {
            100.0 * m.entries as f64 / m.capacity as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "{:<14} {:>8} {:>10} {:>5.1}%",
            m.name, m.entries, m.capacity, fill
        );
    }
    let _ = writeln!(
        o,
        "\nPROGRAM COST (BPF stats {}, counted during {:.1}s)\nPROGRAM                  RUNS        TOTAL      AVG/RUN",
        s.bpf_stats,
        s.bpf_stats_enabled_ms as f64 / 1000.0
    );
    for p in &s.programs {
        let avg = p.run_time_ns.checked_div(p.run_count).unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<22} {:>10} {:>12} {:>9} ns",
            p.name,
            p.run_count,
            seconds_fixed(p.run_time_ns),
            avg
        );
    }
    let _ = writeln!(o, "\nDROPPED / UNMATCHED EVENTS");
    for d in &s.dropped {
        let _ = writeln!(
            o,
            "{:<26} {:>10}{}",
            d.reason,
            d.count,
            if d.loss { "" } else { "  (informational)" }
        );
    }
}
