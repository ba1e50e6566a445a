//! A finding's detail: where it was found (the stalled threads, the XIDs) and where in the
//! code (call sites, the sampled threads' lines), for the rules whose numbers alone do not
//! say it.
use ethand_snapshot::{TreeSnapshot, stacks::FrameKind};

use super::tree;

/// Where a finding was found, for the rules whose numbers alone do not say it, then where
/// in the code (call sites, the sampled threads' lines).
pub(super) fn detail(rule: &str, t: &TreeSnapshot) -> Vec<String> {
    let mut out = found_at(rule, t);
    out.extend(in_code(rule, t));
    out
}

/// The call categories whose sites say where a rule's cause is in the code, and whether the
/// sampled threads' busiest lines do.
fn code_of(rule: &str) -> (&'static [&'static str], bool) {
    match rule {
        "excessive_sync" => (&["sync"], false),
        "small_pageable_copies" => (&["copy"], false),
        "pageable_transfer_bound" => (&["copy"], true),
        "gpu_memory_growth" => (&["alloc"], false),
        "collective_bound" | "straggler_rank" => (&["collective", "sync"], false),
        "launch_bound" => (&["launch", "graph_launch"], true),
        "input_pipeline_stall"
        | "input_workers_stall"
        | "gpu_underutilized"
        | "cpu_contention"
        | "single_thread_cpu_bound"
        | "checkpoint_bound"
        | "stalled" => (&[], true),
        _ => (&[], false),
    }
}

/// "where in the code: cuStreamSynchronize: 99.0 % of 200 samples inside it from
/// train.py:41 in step(): `loss.item()` (pid 12)": the busiest call sites of the rule's call
/// categories (the kernel's exact stacks first where they carry Python lines, else the Python
/// samples first), and the sampled main threads' busiest lines.
fn in_code(rule: &str, t: &TreeSnapshot) -> Vec<String> {
    use ethand_exporters::stacks;
    let (categories, threads) = code_of(rule);
    let mut out = Vec::new();
    if !categories.is_empty() {
        let sampled = t.stack_sample.iter().flat_map(|s| &s.call_sites);
        let kernel = t
            .processes
            .iter()
            .filter_map(|p| p.gpu.as_ref())
            .flat_map(|g| &g.call_sites);
        let (sampled, kernel): (Vec<_>, Vec<_>) = (sampled.collect(), kernel.collect());
        // The kernel's stacks are exact per call; where they reach Python lines (the walked
        // interpreters) they come first, else the samples do (they reach the script's line).
        let python_in_kernel = kernel.iter().any(|c| {
            c.sites
                .iter()
                .any(|s| s.key_frame().is_some_and(|f| f.kind == FrameKind::Python))
        });
        let order = if python_in_kernel {
            [kernel, sampled]
        } else {
            [sampled, kernel]
        };
        for basis in order {
            let mut sites: Vec<_> = basis
                .into_iter()
                .filter(|c| categories.contains(&c.category.as_str()))
                .collect();
            sites.sort_by(|a, b| b.total.cmp(&a.total));
            out.extend(
                sites
                    .iter()
                    .take(2)
                    .filter_map(|c| stacks::call_sites(c))
                    .map(|l| format!("where in the code: {l}")),
            );
        }
    }
    if threads {
        if let Some(s) = &t.stack_sample {
            // The main threads first (a training loop's), then the busiest others (workers).
            out.extend(
                s.threads
                    .iter()
                    .filter(|th| th.main_thread)
                    .take(2)
                    .chain(
                        (rule == "input_workers_stall")
                            .then(|| s.threads.iter().filter(|th| !th.main_thread).take(1))
                            .into_iter()
                            .flatten(),
                    )
                    .filter_map(|th| stacks::thread_lines(th, 3))
                    .map(|l| format!("where the time goes: {l}")),
            );
        }
        if let Some(p) = &t.cpu_profile {
            let waits = matches!(
                rule,
                "stalled"
                    | "input_pipeline_stall"
                    | "input_workers_stall"
                    | "gpu_underutilized"
                    | "checkpoint_bound"
            );
            let other = matches!(rule, "input_workers_stall" | "single_thread_cpu_bound");
            // The snapshot's root process first (the trainer, not its data workers).
            let mut mains: Vec<_> = p.threads.iter().filter(|th| th.main_thread).collect();
            mains.sort_by_key(|th| th.pid != t.root_pid);
            let picked = mains.into_iter().take(2).chain(
                other
                    .then(|| {
                        p.threads
                            .iter()
                            .filter(|th| !th.main_thread)
                            .max_by_key(|th| th.samples)
                    })
                    .flatten(),
            );
            for th in picked {
                if let Some(l) = stacks::cpu_thread_line(p, th, 3) {
                    out.push(format!("where the CPU time goes: {l}"));
                }
                if waits && let Some(l) = stacks::wait_line(p, th) {
                    out.push(format!("where it waits: {l}"));
                }
            }
        }
    }
    out
}

fn found_at(rule: &str, t: &TreeSnapshot) -> Vec<String> {
    match rule {
        "stalled" => {
            let mut waits: Vec<(u64, String)> = tree::live_threads(t)
                .filter(|(p, th)| !tree::excused_wait(p, th))
                .filter_map(|(p, th)| {
                    let sc = th.now.as_ref()?.syscall.as_ref()?;
                    let ns = sc.blocked_ns()?;
                    let at_least = if sc.elapsed_ns.is_none() { "at least " } else { "" };
                    Some((
                        ns,
                        format!(
                            "pid {} ({}) thread {} ({}): {} in {} for {at_least}{:.1} s",
                            p.pid,
                            p.comm,
                            th.tid,
                            th.comm,
                            th.now.as_ref()?.state,
                            sc.describe(),
                            ns as f64 / 1e9
                        ),
                    ))
                })
                .collect();
            waits.sort_by(|a, b| b.0.cmp(&a.0));
            waits.into_iter().take(8).map(|(_, s)| s).collect()
        }
        // Who held the CPUs: the busiest processes outside the tree over its window.
        "cpu_contention" => t
            .neighbours
            .iter()
            .map(|n| {
                let cpus = n
                    .cpus_allowed
                    .map(|c| format!(", may run on {c} CPUs"))
                    .unwrap_or_default();
                let cgroup = if n.cgroup.is_empty() {
                    String::new()
                } else {
                    format!(", cgroup {}", n.cgroup)
                };
                format!(
                    "held the CPUs: pid {} ({}) {:.2} cores{cgroup}{cpus}",
                    n.pid, n.comm, n.cores
                )
            })
            .collect(),
        // The process the signal came from (the busiest such main thread).
        "single_thread_cpu_bound" => tree::single_threaded(t)
            .filter(|(_, _, others)| *others < tree::SINGLE_THREAD_OTHERS)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, main, others)| {
                format!(
                    "pid {} ({}): main thread on a CPU or waiting for one {:.0} % of the window, its other threads {others:.2} cores",
                    p.pid,
                    p.comm,
                    main * 100.0
                )
            })
            .into_iter()
            .collect(),
        "gpu_errors" => gpu_error_detail(t),
        "near_oom" | "memory_pressure" => super::memory::detail(t),
        _ => Vec::new(),
    }
}

/// The XIDs of the tree's processes (code, meaning, GPU, process, count, when), most first;
/// else the XID codes of the GPUs it uses; and the GPUs whose row remapping failed.
fn gpu_error_detail(t: &TreeSnapshot) -> Vec<String> {
    use ethand_snapshot::devices::xid_description;
    let meaning = |xid: u64| xid_description(xid).map_or(String::new(), |m| format!(" ({m})"));
    let mut rows: Vec<(u64, String)> = t
        .processes
        .iter()
        .flat_map(|p| p.gpu_xid_events.iter().map(move |x| (p, x)))
        .map(|(p, x)| {
            (
                x.count,
                format!(
                    "{} XID {}{}: {} while pid {} ({}) held a context on it, last at {}",
                    x.device,
                    x.xid,
                    meaning(x.xid),
                    ethand_exporters::format::plural(x.count, "time"),
                    p.pid,
                    p.comm,
                    ethand_exporters::format::utc(x.last_unix_ns / 1_000_000)
                ),
            )
        })
        .collect();
    if rows.is_empty() {
        for g in tree::gpus(t) {
            for (xid, n) in &g.xid_errors_by_code {
                rows.push((
                    *n,
                    format!(
                        "{} XID {xid}{}: {} since ethand started watching",
                        g.label(),
                        meaning(*xid),
                        ethand_exporters::format::plural(*n, "time")
                    ),
                ));
            }
        }
    }
    rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut out: Vec<String> = rows.into_iter().take(8).map(|(_, s)| s).collect();
    for g in tree::gpus(t).filter(|g| g.row_remap_failed == Some(true)) {
        out.push(format!(
            "{}: row remapping failed (the GPU needs a reset and, if it recurs, service)",
            g.label()
        ));
    }
    out
}
