//! The GPU activity section of `ethand snapshot`: what the GPU ran during the snapshot's
//! window, per process recorded by libethand_cupti.so.
use std::fmt::Write;

use ethand_snapshot::kernels::{ActivityState, GpuActivity, GpuActivityProcess};

use super::clean;
use crate::format::{bytes_u, duration_ns_u, percent};

/// Kernels shown per process in the terminal (the JSON has up to `TOP_KERNELS`).
const SHOWN: usize = 10;
/// A kernel's name is cut to this many characters in the terminal (template arguments run
/// to thousands); the JSON has it whole.
const NAME_CHARS: usize = 160;

/// `name` cut to `max` characters, with an ellipsis where it was cut.
fn shorten(name: &str, max: usize) -> String {
    match name.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &name[..at]),
        None => name.to_string(),
    }
}

pub(super) fn gpu_activity(o: &mut String, a: &GpuActivity) {
    let _ = writeln!(
        o,
        "\nGPU ACTIVITY (CUPTI, over {:.1}s for this snapshot)",
        a.duration_ms as f64 / 1000.0
    );
    for p in &a.processes {
        process(o, p);
    }
    for n in &a.notes {
        let _ = writeln!(o, "  {}", clean(n));
    }
}

fn process(o: &mut String, p: &GpuActivityProcess) {
    let state = p.state.describe();
    let _ = writeln!(o, "  pid {}: {state}", p.pid);
    if let Some(d) = &p.detail {
        let _ = writeln!(o, "    {}", clean(d));
    }
    if p.state != ActivityState::Recorded {
        return;
    }
    if let Some(why) = &p.incomplete {
        let _ = writeln!(o, "    INCOMPLETE: {}", clean(why));
    }
    for d in &p.devices {
        let busy = d
            .busy_fraction
            .map(|f| format!(" ({} of the window)", percent(f)))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "    GPU {}: busy {}{busy}, {} kernels, {} of kernel time",
            d.device,
            duration_ns_u(d.busy_ns),
            d.kernels,
            duration_ns_u(d.kernel_ns)
        );
        if let Some(i) = &d.idle {
            let of = |ns: u64| match p.window_ns {
                Some(w) if w > 0 => {
                    format!("{} ({})", duration_ns_u(ns), percent(ns as f64 / w as f64))
                }
                _ => duration_ns_u(ns),
            };
            let _ = writeln!(
                o,
                "      idle: waiting for the host {}, kernels queued not running {}, copies only {}, \
                 unattributed {}; {} gaps",
                of(i.host_wait_ns),
                of(i.kernel_wait_ns),
                of(i.copy_ns),
                of(i.unattributed_ns),
                i.gaps
            );
        }
    }
    for d in &p.devices {
        if let Some(c) = &d.communication {
            let share = (c.communication_ns > 0)
                .then(|| {
                    format!(
                        " ({})",
                        percent(c.overlapped_ns as f64 / c.communication_ns as f64)
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "      collectives: {} running, {} of it overlapped by computation{share}",
                duration_ns_u(c.communication_ns),
                duration_ns_u(c.overlapped_ns)
            );
        }
    }
    let total: u64 = p.kernel_classes.iter().map(|c| c.gpu_ns).sum();
    if total > 0 {
        let by: Vec<String> = p
            .kernel_classes
            .iter()
            .map(|c| {
                format!(
                    "{} {} ({})",
                    c.class.as_str(),
                    duration_ns_u(c.gpu_ns),
                    percent(c.gpu_ns as f64 / total as f64)
                )
            })
            .collect();
        let _ = writeln!(o, "    kernel time by type: {}", by.join(", "));
    }
    for k in p.kernels.iter().take(SHOWN) {
        let name = k.shown_name();
        let _ = writeln!(
            o,
            "    {:>10} {:>7}x  [{}] {}",
            duration_ns_u(k.gpu_ns),
            k.count,
            k.class.as_str(),
            clean(&shorten(name, NAME_CHARS))
        );
    }
    let more: u64 = p.kernels.iter().skip(SHOWN).map(|k| k.count).sum::<u64>()
        + p.kernels_other.as_ref().map_or(0, |k| k.count);
    if more > 0 {
        let _ = writeln!(o, "    ... and {more} launches of other kernels");
    }
    launch_sites(o, p);
    for c in &p.copies {
        let rate = c
            .bytes_per_s
            .map(|r| format!(", {}/s", bytes_u(r as u64)))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "    copy {:?} {:?}->{:?}: {} x{}, {}{rate}",
            c.kind,
            c.src,
            c.dst,
            bytes_u(c.bytes),
            c.count,
            duration_ns_u(c.gpu_ns)
        );
    }
    if let Some(m) = &p.memsets {
        let _ = writeln!(
            o,
            "    memset: {} x{}, {}",
            bytes_u(m.bytes),
            m.count,
            duration_ns_u(m.gpu_ns)
        );
    }
    for s in &p.syncs {
        let _ = writeln!(
            o,
            "    sync {:?}: {} waits, {}",
            s.kind,
            s.count,
            duration_ns_u(s.wait_ns)
        );
    }
    let lost = p.records_dropped_by_cupti + p.records_lost_by_ethand;
    if lost > 0 {
        let _ = writeln!(
            o,
            "    records lost: {} by CUPTI, {} by ethand (figures above are low)",
            p.records_dropped_by_cupti, p.records_lost_by_ethand
        );
    }
}

/// Where the kernels were launched from.
fn launch_sites(o: &mut String, p: &GpuActivityProcess) {
    if let Some(why) = &p.launch_sites_unavailable {
        let _ = writeln!(o, "    launch call sites: not traced: {}", clean(why));
    }
    let Some(ls) = &p.launch_sites else {
        return;
    };
    let _ = writeln!(
        o,
        "    launched from ({}):",
        clean(&crate::stacks::launch_coverage(ls))
    );
    for s in &ls.sites {
        let kernels: Vec<String> = s
            .top
            .iter()
            .map(|k| format!("{} x{}", shorten(k.shown_name(), 60), k.count))
            .collect();
        let _ = writeln!(
            o,
            "    {:>10} {:>7}x  {}  [{}]",
            duration_ns_u(s.gpu_ns),
            s.kernels,
            clean(&crate::stacks::launch_site(s)),
            clean(&kernels.join(", "))
        );
    }
    if let Some(other) = &ls.other {
        let _ = writeln!(
            o,
            "    {:>10} {:>7}x  (other sites)",
            duration_ns_u(other.gpu_ns),
            other.count
        );
    }
}
