//! Where the time went in the code: call sites of runtime calls, sampled Python frames and
//! the native CPU profile.
use std::fmt::Write as _;

use ethand_snapshot::{TreeSnapshot, stacks::CallSites};

use super::clean;
use crate::format::duration_ns_u;
use crate::stacks;

/// Call sites of runtime calls (kernel stacks, exact; Python samples) and where the sampled
/// threads' time went.
pub(super) fn where_in_code(o: &mut String, t: &TreeSnapshot) {
    let kernel: Vec<&CallSites> = t
        .processes
        .iter()
        .filter_map(|p| p.gpu.as_ref())
        .flat_map(|g| &g.call_sites)
        .collect();
    let sample = t.stack_sample.as_ref();
    if kernel.is_empty() && sample.is_none() {
        return;
    }
    let _ = writeln!(o, "\nWHERE IN THE CODE");
    if let Some(s) = sample {
        let cost = match s.sampler_cpu_ns {
            Some(ns) if s.reads > 0 => format!(
                "; {} reads cost ethand {} of CPU, {} each",
                s.reads,
                duration_ns_u(ns),
                duration_ns_u(ns / s.reads)
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "  Python frames sampled {}/s over {:.1}s for this snapshot{cost}",
            s.rate_hz,
            s.duration_ms as f64 / 1000.0
        );
        for c in s.call_sites.iter().take(8) {
            if let Some(line) = stacks::call_sites(c) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
            call_stack(o, c);
        }
        for th in s.threads.iter().take(4) {
            if let Some(line) = stacks::thread_lines(th, 3) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
        }
        for n in &s.notes {
            let _ = writeln!(o, "    {}", clean(n));
        }
    }
    if !kernel.is_empty() {
        let _ = writeln!(
            o,
            "  user stacks the kernel took at each call (exact counts):"
        );
        let mut kernel = kernel;
        kernel.sort_by_key(|c| std::cmp::Reverse(c.total));
        for c in kernel.iter().take(8) {
            if let Some(line) = stacks::call_sites(c) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
            if let Some(u) = c.unattributed.filter(|u| *u > 0) {
                let _ = writeln!(
                    o,
                    "    {u} calls without a stack (stack map full or unreadable)"
                );
            }
            call_stack(o, c);
        }
    }
}

/// The native profile of the sample window: each profiled thread's CPU time by file and
/// function, and where it blocked.
pub(super) fn cpu_profile(o: &mut String, t: &TreeSnapshot) {
    let Some(p) = &t.cpu_profile else {
        return;
    };
    let _ = writeln!(o, "\nCPU PROFILE");
    if p.rate_hz > 0 {
        let _ = writeln!(
            o,
            "  sampled {}/s on every CPU over {:.1}s; every wait summed, those of at least {} listed where they block",
            p.rate_hz,
            p.duration_ms as f64 / 1000.0,
            duration_ns_u(p.offcpu_min_ns)
        );
    }
    for th in p.threads.iter().take(6) {
        if let Some(l) = stacks::cpu_thread_line(p, th, 3) {
            let _ = writeln!(o, "  {}", clean(&l));
        }
        if let Some(l) = stacks::wait_line(p, th) {
            let _ = writeln!(o, "  {}", clean(&l));
        }
    }
    let lost = p.lost_stacks.unwrap_or(0) + p.lost_samples.unwrap_or(0);
    if lost > 0 {
        let _ = writeln!(
            o,
            "    {lost} samples or waits without a stack or lost (profile maps full)"
        );
    }
    for n in &p.notes {
        let _ = writeln!(o, "    {}", clean(n));
    }
}

/// The callers of a call's busiest site, innermost first, a few frames.
fn call_stack(o: &mut String, c: &CallSites) {
    if let Some((top, _)) = c.top() {
        for f in top.frames.iter().skip(1).take(4) {
            let _ = writeln!(o, "      <- {}", clean(&f.label()));
        }
    }
}
