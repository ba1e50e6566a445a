//! The diagnosis engine: turns a process tree's snapshot into named signals and evaluates
//! the rules (data, not code: `rules.toml` embedded, plus `diagnosis.rules_dir`) over them.
//! Every signal is documented in docs/diagnosis.md; a rule reading a signal the tree does not
//! have does not fire.
//!
//! `expr.rs`: the expression language of the rules' fields; `rules.toml`: the built-in rules;
//! this file: signals, rule files, evaluation and `ethand diagnose FILE`.
pub mod expr;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ethand_snapshot::{
    ProcessSnapshot, TreeSnapshot, WindowStats,
    diagnosis::{Evidence, Finding, NotEvaluated},
};
use serde::Deserialize;
use tracing::{info, warn};

use self::expr::Expr;

pub const BUILTIN_RULES: &str = include_str!("rules.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    rule: Vec<RuleSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    title: String,
    #[serde(default = "warning")]
    severity: String,
    #[serde(default)]
    when: String,
    #[serde(default)]
    evidence: Vec<String>,
    #[serde(default)]
    explanation: String,
    #[serde(default)]
    advice: Vec<String>,
    speedup: Option<String>,
    impact: Option<String>,
    #[serde(default)]
    suppressed_by: Vec<String>,
    #[serde(default)]
    needs: Vec<String>,
}

fn yes() -> bool {
    true
}
fn warning() -> String {
    "warning".into()
}

/// A parsed rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub title: String,
    pub severity: String,
    pub when: Expr,
    pub evidence: Vec<String>,
    pub explanation: String,
    pub advice: Vec<String>,
    pub speedup: Option<Expr>,
    pub impact: Option<Expr>,
    /// Rules that explain this one: when one of them fires, this finding is left out.
    pub suppressed_by: Vec<String>,
    /// Signals without which the rule cannot decide: when one is missing the rule is
    /// reported as not evaluated (with how to get the signal), never as "nothing found".
    pub needs: Vec<String>,
    /// Where it came from (built-in or a file), for error messages and `ethand status`.
    pub origin: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("{origin}: {msg}")]
    Invalid { origin: String, msg: String },
}

/// Parses one rules file. Every error names the file, the rule and the field.
pub fn parse_rules(
    text: &str,
    origin: &str,
) -> Result<Vec<(RuleSpecState, Option<Rule>)>, RuleError> {
    let file: RuleFile = toml::from_str(text).map_err(|e| RuleError::Invalid {
        origin: origin.into(),
        msg: e.to_string().trim().replace('\n', " "),
    })?;
    let mut out = Vec::new();
    for spec in file.rule {
        let bad = |field: &str, e: expr::ParseError| RuleError::Invalid {
            origin: origin.into(),
            msg: format!("rule {:?}: {field}: {e}", spec.id),
        };
        if !spec.enabled {
            out.push((RuleSpecState::Disabled(spec.id.clone()), None));
            continue;
        }
        if spec.when.trim().is_empty() || spec.title.is_empty() {
            return Err(RuleError::Invalid {
                origin: origin.into(),
                msg: format!("rule {:?}: needs a title and a `when` condition", spec.id),
            });
        }
        if !["critical", "warning", "info"].contains(&spec.severity.as_str()) {
            return Err(RuleError::Invalid {
                origin: origin.into(),
                msg: format!(
                    "rule {:?}: severity {:?} is not critical, warning or info",
                    spec.id, spec.severity
                ),
            });
        }
        let when = expr::parse(&spec.when).map_err(|e| bad("when", e))?;
        let speedup = spec
            .speedup
            .as_deref()
            .map(expr::parse)
            .transpose()
            .map_err(|e| bad("speedup", e))?;
        let impact = spec
            .impact
            .as_deref()
            .map(expr::parse)
            .transpose()
            .map_err(|e| bad("impact", e))?;
        out.push((
            RuleSpecState::Enabled(spec.id.clone()),
            Some(Rule {
                id: spec.id,
                title: spec.title,
                severity: spec.severity,
                when,
                evidence: spec.evidence,
                explanation: spec.explanation,
                advice: spec.advice,
                speedup,
                impact,
                suppressed_by: spec.suppressed_by,
                needs: spec.needs,
                origin: origin.into(),
            }),
        ));
    }
    Ok(out)
}

#[derive(Debug)]
pub enum RuleSpecState {
    Enabled(String),
    Disabled(String),
}

/// Built-in rules overlaid with the `*.toml` files of `dir` (sorted by name). A broken file is
/// reported and skipped: the built-in rules keep working.
pub fn load_rules(dir: &Path) -> Vec<Rule> {
    let mut rules: Vec<Rule> = parse_rules(BUILTIN_RULES, "built-in rules.toml")
        .expect("the embedded rules are valid")
        .into_iter()
        .filter_map(|(_, r)| r)
        .collect();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    for f in files {
        let origin = f.display().to_string();
        let parsed = std::fs::read_to_string(&f)
            .map_err(|e| RuleError::Invalid {
                origin: origin.clone(),
                msg: e.to_string(),
            })
            .and_then(|t| parse_rules(&t, &origin));
        match parsed {
            Ok(list) => {
                for (state, rule) in list {
                    let id = match &state {
                        RuleSpecState::Enabled(id) | RuleSpecState::Disabled(id) => id.clone(),
                    };
                    if let Some(old) = rules.iter().find(|r| r.id == id) {
                        info!(rule = %id, replaced = %old.origin, by = %origin, "diagnosis rule overridden");
                    }
                    rules.retain(|r| r.id != id);
                    if let Some(r) = rule {
                        rules.push(r);
                    }
                }
                info!(file = %origin, "diagnosis rules loaded");
            }
            Err(e) => warn!(error = %e, "diagnosis rules file skipped"),
        }
    }
    rules
}

/// Fills the tree's `findings` and `not_evaluated` from the rules.
pub fn apply(t: &mut TreeSnapshot, rules: &[Rule]) {
    let (findings, not_evaluated) = evaluate(t, rules);
    t.findings = findings;
    t.not_evaluated = not_evaluated;
}

/// Evaluates the rules over the tree; findings ranked by impact, highest first.
pub fn diagnose(t: &TreeSnapshot, rules: &[Rule]) -> Vec<Finding> {
    evaluate(t, rules).0
}

/// Findings ranked by impact, and the rules that could not run for a missing signal. A rule
/// about GPUs on a tree that uses none does not apply: it is neither.
pub fn evaluate(t: &TreeSnapshot, rules: &[Rule]) -> (Vec<Finding>, Vec<NotEvaluated>) {
    let s = signals(t);
    let uses_gpu = uses_accelerator(t);
    let mut not_evaluated = Vec::new();
    let runnable: Vec<&Rule> = rules
        .iter()
        .filter(|r| {
            let missing: Vec<String> = r
                .needs
                .iter()
                .filter(|n| !s.contains_key(n.as_str()))
                .cloned()
                .collect();
            if missing.is_empty() {
                return true;
            }
            let about_gpu = r
                .needs
                .iter()
                .any(|n| n.starts_with("gpu.") || n.starts_with("ranks."));
            if about_gpu && !uses_gpu {
                return false;
            }
            not_evaluated.push(NotEvaluated {
                rule: r.id.clone(),
                title: r.title.clone(),
                how: missing
                    .iter()
                    .map(|m| how_to_get(m, t))
                    .collect::<Vec<_>>()
                    .join(" "),
                missing,
            });
            false
        })
        .collect();
    let fired: Vec<&Rule> = runnable.into_iter().filter(|r| r.when.truth(&s)).collect();
    let mut out: Vec<Finding> = fired
        .iter()
        .filter(|r| {
            !r.suppressed_by
                .iter()
                .any(|id| fired.iter().any(|f| &f.id == id))
        })
        .map(|r| {
            let evidence = r
                .evidence
                .iter()
                .filter_map(|name| {
                    s.get(name).map(|v| Evidence {
                        signal: name.clone(),
                        value: *v,
                        unit: unit_of(name).into(),
                    })
                })
                .collect();
            Finding {
                id: r.id.clone(),
                title: r.title.clone(),
                severity: r.severity.clone(),
                evidence,
                explanation: r.explanation.clone(),
                advice: r.advice.clone(),
                estimated_speedup: r
                    .speedup
                    .as_ref()
                    .and_then(|e| e.eval(&s))
                    .filter(|v| v.is_finite() && *v >= 1.0),
                impact: r
                    .impact
                    .as_ref()
                    .and_then(|e| e.eval(&s))
                    .filter(|v| v.is_finite())
                    .map_or(0.0, |v| v.clamp(0.0, 1.0)),
                detail: detail(&r.id, t),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.impact
            .partial_cmp(&a.impact)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.id.cmp(&b.id))
    });
    (out, not_evaluated)
}

/// Where a finding was found, for the rules whose numbers alone do not say it, then where
/// in the code (call sites, the sampled threads' lines).
fn detail(rule: &str, t: &TreeSnapshot) -> Vec<String> {
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
        "gpu_memory_growth" => (&["alloc"], false),
        "collective_bound" | "straggler_rank" => (&["collective", "sync"], false),
        "launch_bound" => (&["launch", "graph_launch"], true),
        "input_pipeline_stall"
        | "input_workers_stall"
        | "gpu_underutilized"
        | "cpu_contention"
        | "single_thread_cpu_bound"
        | "stalled" => (&[], true),
        _ => (&[], false),
    }
}

/// "where in the code: cuStreamSynchronize: 99.0 % of 200 samples inside it from
/// train.py:41 in step(): `loss.item()` (pid 12)": the busiest call sites of the rule's call
/// categories (Python samples first: they reach the script's line; then the kernel's exact
/// stacks), and the sampled main threads' busiest lines.
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
        for basis in [sampled.collect::<Vec<_>>(), kernel.collect()] {
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
                "stalled" | "input_pipeline_stall" | "input_workers_stall" | "gpu_underutilized"
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
            let mut waits: Vec<(u64, String)> = live_threads(t)
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
        // The process the signal came from (the busiest such main thread).
        "single_thread_cpu_bound" => single_threaded(t)
            .filter(|(_, _, others)| *others < SINGLE_THREAD_OTHERS)
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
        for g in tree_gpus(t) {
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
    for g in tree_gpus(t).filter(|g| g.row_remap_failed == Some(true)) {
        out.push(format!(
            "{}: row remapping failed (the GPU needs a reset and, if it recurs, service)",
            g.label()
        ));
    }
    out
}

/// The GPUs the tree uses (all GPUs when the driver names none for it).
fn tree_gpus(t: &TreeSnapshot) -> impl Iterator<Item = &ethand_snapshot::devices::GpuDevice> {
    let used: Vec<String> = t
        .processes
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.device.clone()))
        .collect();
    t.devices
        .gpus
        .iter()
        .filter(move |g| used.is_empty() || used.contains(&g.label()))
}

/// Live threads of live processes whose state the snapshot read (not zombies).
fn live_threads(
    t: &TreeSnapshot,
) -> impl Iterator<Item = (&ProcessSnapshot, &ethand_snapshot::ThreadSnapshot)> {
    t.processes
        .iter()
        .filter(|p| p.alive)
        .flat_map(|p| p.threads.iter().map(move |th| (p, th)))
        .filter(|(_, th)| {
            th.alive
                && th
                    .now
                    .as_ref()
                    .is_some_and(|n| n.state != "zombie" && n.state != "dead")
        })
}

/// How long a live thread has been blocked in its syscall (0: running, runnable, or asleep
/// outside a syscall, which cannot be timed).
fn blocked_seconds(th: &ethand_snapshot::ThreadSnapshot) -> f64 {
    match &th.now {
        Some(n) if n.state != "running" => n
            .syscall
            .as_ref()
            .and_then(|s| s.blocked_ns())
            .map_or(0.0, |ns| ns as f64 / 1e9),
        _ => 0.0,
    }
}

/// Main thread's demand (on a CPU or waiting for one) and the other threads' cores, over the
/// window, per live process.
const SINGLE_THREAD_OTHERS: f64 = 0.25;
fn single_threaded(t: &TreeSnapshot) -> impl Iterator<Item = (&ProcessSnapshot, f64, f64)> {
    t.processes.iter().filter(|p| p.alive).filter_map(|p| {
        let w = p.window.as_ref()?;
        let main = w.main_thread_oncpu_ns? as f64;
        let d = w.duration_ms as f64 * 1e6;
        // On a CPU or waiting for one: a serial loop on a busy node still wants a whole core
        // (the run-queue wait is the process's; its other threads use little by definition).
        (d > 0.0).then(|| {
            (
                p,
                ((main + w.runq_wait_ns as f64) / d).min(1.0),
                (w.oncpu_ns as f64 - main).max(0.0) / d,
            )
        })
    })
}

/// The tree calls a GPU/NPU runtime or holds a device (by the driver's process list).
fn uses_accelerator(t: &TreeSnapshot) -> bool {
    t.total.gpu.is_some() || t.processes.iter().any(|p| !p.devices.is_empty())
}

/// How to get a signal the tree lacks: one sentence for the snapshot's reader.
fn how_to_get(signal: &str, t: &TreeSnapshot) -> String {
    let level = t.gpu_level.as_deref().unwrap_or("unknown");
    match signal {
        "gpu.launches_per_second" | "gpu.launches" | "gpu.syncs_per_launch" => {
            match &t.launch_sample {
                Some(s) if !s.notes.is_empty() => format!(
                    "Kernel launches: the on-demand sample counted none ({}); `ethand level process` counts them all the time, at a cost per launch.",
                    s.notes.join("; ")
                ),
                Some(_) => "Kernel launches: no process of the tree maps a probed runtime library to sample; `ethand level process` counts them all the time.".into(),
                None => format!(
                    "Kernel launches are not counted at GPU level {level} and no launch sample was taken: snapshot without --no-launch-sample (diagnosis.launch_sample_ms > 0), or `ethand level process`."
                ),
            }
        }
        s if s.starts_with("gpu.device_") || s == "gpu.sm_busy_ratio" => "GPU utilization: no NVML/DCMI reading of the tree's devices in the window (`ethand status` shows the device collectors).".into(),
        s if s.starts_with("gpu.sm_") || s.starts_with("gpu.tensor") || s.starts_with("gpu.dram") => "NVML GPM (SM activity) is read on Hopper and newer GPUs only; this GPU or driver does not offer it.".into(),
        s if s.starts_with("gpu.") => format!(
            "GPU runtime calls: none probed for this tree (GPU level {level}; `ethand status` lists the probed libraries)."
        ),
        s if s.starts_with("cpu.main_thread") => "The main thread's CPU time: the tree's root or GPU process has no main thread the probes saw in the window.".into(),
        _ => format!("{signal} was not measured for this tree."),
    }
}

fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_ratio")
        || name.ends_with("_spread")
        || name.ends_with("_min")
        || name.ends_with("_max")
    {
        "ratio"
    } else if name.ends_with("_per_second") {
        "per_second"
    } else if name.ends_with("_bytes") {
        "bytes"
    } else if name.contains("seconds") {
        "seconds"
    } else if name.ends_with("_celsius") {
        "celsius"
    } else if name.ends_with("_watts") {
        "watts"
    } else {
        "count"
    }
}

const RW_SYSCALLS: &[&str] = &[
    "read",
    "pread64",
    "readv",
    "preadv",
    "preadv2",
    "write",
    "pwrite64",
    "writev",
    "pwritev",
    "pwritev2",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "io_getevents",
    "io_pgetevents",
    "io_uring_enter",
];

/// Every signal of the tree (see docs/diagnosis.md). Rates are over the snapshot window (the
/// daemon's `--window`, or a standalone measurement).
pub fn signals(t: &TreeSnapshot) -> BTreeMap<String, f64> {
    let mut s = BTreeMap::new();
    let mut put = |k: &str, v: f64| {
        if v.is_finite() {
            s.insert(k.to_string(), v);
        }
    };
    // The snapshot's own host (a saved file is read on another machine); unknown in older
    // files, then the per-CPU signals are left out.
    let cpus = t.node_cpus.map(f64::from);
    if let Some(c) = cpus {
        put("node.cpus", c);
    }
    put(
        "tree.uses_accelerator",
        f64::from(u8::from(uses_accelerator(t))),
    );
    // In-flight state: the shortest wait among the live threads (0 when one runs).
    let live: Vec<f64> = live_threads(t).map(|(_, th)| blocked_seconds(th)).collect();
    if !live.is_empty() {
        put(
            "state.stalled_seconds",
            live.iter().copied().fold(f64::INFINITY, f64::min),
        );
        put("state.threads", live.len() as f64);
        put(
            "state.blocked_threads",
            live.iter().filter(|s| **s >= 1.0).count() as f64,
        );
    }
    // A process held to one core: its main thread busy, its other threads (if any) idle.
    if let Some(best) = single_threaded(t)
        .filter(|(_, _, others)| *others < SINGLE_THREAD_OTHERS)
        .map(|(_, main, _)| main)
        .reduce(f64::max)
    {
        put("cpu.single_thread_busy_ratio", best);
    }
    // The window: the daemon's history, else the standalone measurement.
    let windows: Vec<&WindowStats> = t
        .processes
        .iter()
        .filter_map(|p| p.window.as_ref())
        .collect();
    let window_ms = windows
        .iter()
        .map(|w| w.duration_ms)
        .max()
        .unwrap_or(t.measured_ms);
    let w = window_ms as f64 / 1000.0;
    let sum = |f: fn(&WindowStats) -> u64| windows.iter().map(|x| f(x)).sum::<u64>() as f64;
    let tt = &t.total;
    // Launches: counted in the window at `process`/`op`; at `calls` only by the snapshot's
    // on-demand sample. Never read as 0 when not counted.
    let window_launches: Option<u64> = windows
        .iter()
        .map(|x| x.gpu_launches)
        .reduce(ethand_snapshot::gpu::add_counted)
        .flatten();
    let sample = t.launch_sample.as_ref();
    let launches_per_second: Option<f64> = if w > 0.0 && window_launches.is_some() {
        window_launches.map(|n| n as f64 / w)
    } else {
        sample.and_then(|s| s.launches_per_second)
    };
    let per_pid_launches = |p: &ProcessSnapshot| -> Option<u64> {
        p.window.as_ref().and_then(|w| w.gpu_launches).or_else(|| {
            sample.and_then(|s| {
                s.processes
                    .iter()
                    .find(|x| x.pid == p.pid)
                    .map(|x| x.launches)
            })
        })
    };
    if w > 0.0 {
        put("window_seconds", w);
        let oncpu = sum(|x| x.oncpu_ns);
        let runq = sum(|x| x.runq_wait_ns);
        put("cpu.cores_used", oncpu / 1e9 / w);
        put("cpu.runq_wait_seconds_per_second", runq / 1e9 / w);
        if oncpu > 0.0 {
            put("cpu.runq_wait_ratio", runq / oncpu);
        }
        put(
            "io.block_read_bytes_per_second",
            sum(|x| x.block_read_bytes) / w,
        );
        put(
            "io.block_write_bytes_per_second",
            sum(|x| x.block_write_bytes) / w,
        );
        put(
            "io.block_bytes_per_second",
            (sum(|x| x.block_read_bytes) + sum(|x| x.block_write_bytes)) / w,
        );
        put("net.tx_bytes_per_second", sum(|x| x.net_tx_bytes) / w);
        put("net.rx_bytes_per_second", sum(|x| x.net_rx_bytes) / w);
        if tt.gpu.is_some() {
            put("gpu.sync_blocked_ratio", sum(|x| x.gpu_sync_ns) / 1e9 / w);
            put("gpu.collective_ratio", sum(|x| x.collective_ns) / 1e9 / w);
            put(
                "gpu.memory_growth_bytes_per_second",
                sum(|x| x.gpu_memory_growth_bytes) / w,
            );
            let syncs = sum(|x| x.gpu_sync_calls);
            put("gpu.syncs_per_second", syncs / w);
            let h2d = sum(|x| x.gpu_copy_h2d_calls);
            put("gpu.h2d_copies_per_second", h2d / w);
            if h2d > 0.0 {
                put(
                    "gpu.h2d_copy_avg_bytes",
                    sum(|x| x.gpu_copy_h2d_bytes) / h2d,
                );
                put("gpu.syncs_per_h2d_copy", syncs / h2d);
            }
            if let Some(lps) = launches_per_second {
                put("gpu.launches_per_second", lps);
                if lps > 0.0 {
                    put("gpu.syncs_per_launch", syncs / w / lps);
                }
            }
        }
    }
    // A thread's off-CPU time is counted when it runs again: one asleep right now would look
    // busy. Its life is at least the span its process was observed (and alive, by age).
    let span_ns = |p: &ProcessSnapshot| {
        let age_ms = if p.start_time_unix_s > 0 {
            t.taken_at_unix_ms
                .saturating_sub(p.start_time_unix_s * 1000)
        } else {
            u64::MAX
        };
        p.observed_ms.min(age_ms) as f64 * 1e6
    };
    let life_in = |p: &ProcessSnapshot, x: &ethand_snapshot::SchedStats| {
        ((x.oncpu_ns + x.offcpu_blocked_ns + x.offcpu_preempted_ns) as f64).max(span_ns(p))
    };
    // Threads: all, and those that want a CPU (running or preempted) most of their time.
    let threads: Vec<(&ProcessSnapshot, &ethand_snapshot::ThreadSnapshot)> = t
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |th| (p, th)))
        .filter(|(_, th)| th.alive)
        .collect();
    let busy = threads
        .iter()
        .filter(|(p, th)| {
            let l = life_in(p, &th.sched);
            l > 0.0 && (th.sched.oncpu_ns + th.sched.offcpu_preempted_ns) as f64 / l > 0.5
        })
        .count() as f64;
    put("cpu.threads", threads.len() as f64);
    put("cpu.busy_threads", busy);
    if let Some(c) = cpus {
        put("cpu.threads_per_cpu", busy / c);
    }
    let (vol, invol) = (
        tt.sched.voluntary_switches as f64,
        tt.sched.involuntary_switches as f64,
    );
    if vol + invol > 0.0 {
        put("cpu.involuntary_switch_ratio", invol / (vol + invol));
    }
    // The process that drives the GPU: most launches (counted or sampled), else most
    // runtime calls, else one the driver lists on a device, else the root. A launcher
    // (bash, torchrun) is the root of the tree but not the driver.
    let gpu_calls = |p: &ProcessSnapshot| {
        p.gpu
            .as_ref()
            .map_or(0, |g| g.symbols.iter().map(|x| x.calls).sum::<u64>())
    };
    let driver = t
        .processes
        .iter()
        .filter(|p| per_pid_launches(p).is_some_and(|n| n > 0))
        .max_by_key(|p| per_pid_launches(p))
        .or_else(|| {
            t.processes
                .iter()
                .filter(|p| gpu_calls(p) > 0)
                .max_by_key(|p| gpu_calls(p))
        })
        .or_else(|| t.processes.iter().find(|p| !p.devices.is_empty()))
        .or(t.processes.first());
    if let Some(root) = driver {
        // Over the window when the history has the main thread's time, else over its life.
        match (root.window.as_ref(), w > 0.0) {
            (Some(win), true) if win.main_thread_oncpu_ns.is_some() && win.duration_ms > 0 => {
                // A process younger than the window: over its life (unknown life: the window).
                let window_ns = win.duration_ms as f64 * 1e6;
                let life = span_ns(root);
                let span = if life > 0.0 {
                    window_ns.min(life)
                } else {
                    window_ns
                };
                put(
                    "cpu.main_thread_busy_ratio",
                    (win.main_thread_oncpu_ns.unwrap_or(0) as f64 / span).min(1.0),
                );
            }
            _ => {
                if let Some(main) = root.threads.iter().find(|th| th.tid == root.pid) {
                    let l = life_in(root, &main.sched);
                    if l > 0.0 {
                        put("cpu.main_thread_busy_ratio", main.sched.oncpu_ns as f64 / l);
                    }
                }
            }
        }
        // Its descendants: DataLoader workers and other helpers that feed it.
        let mut below = vec![root.pid];
        let mut i = 0;
        while i < below.len() {
            let parent = below[i];
            for p in &t.processes {
                if p.ppid == parent && !below.contains(&p.pid) {
                    below.push(p.pid);
                }
            }
            i += 1;
        }
        let workers: Vec<&ProcessSnapshot> = t
            .processes
            .iter()
            .filter(|p| p.pid != root.pid && p.alive && below.contains(&p.pid))
            .collect();
        put("cpu.workers", workers.len() as f64);
        if !workers.is_empty() && w > 0.0 {
            let cores: f64 = workers
                .iter()
                .filter_map(|p| p.window.as_ref())
                .map(|x| x.oncpu_ns as f64)
                .sum::<f64>()
                / 1e9
                / w;
            put("cpu.workers_cores_used", cores);
            put("cpu.workers_busy_ratio", cores / workers.len() as f64);
        }
    }
    // Per process, `ns_of(p)` against its longest-lived thread's time; the worst process.
    let worst_share_of_life = |ns_of: &dyn Fn(&ProcessSnapshot) -> u64| {
        t.processes
            .iter()
            .filter_map(|p| {
                let l = p
                    .threads
                    .iter()
                    .map(|th| life_in(p, &th.sched))
                    .fold(0.0, f64::max);
                (l > 0.0).then(|| ns_of(p) as f64 / l)
            })
            .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
    };
    // I/O wait: time in read/write-class syscalls.
    let io_wait = worst_share_of_life(&|p| {
        p.syscalls
            .by_nr
            .iter()
            .filter(|r| RW_SYSCALLS.contains(&r.name.as_str()))
            .map(|r| r.time_ns)
            .sum()
    });
    if let Some(v) = io_wait {
        put("io.wait_ratio", v.min(1.0));
    }
    // Disk busy: the device time of the process's requests. Time in read() alone cannot tell
    // the disk from the page cache, and a few requests of a process that reads from the cache
    // (pages the kernel evicted) move a MiB/s without the disk being its bottleneck.
    let disk_busy = worst_share_of_life(&|p| p.block.iter().map(|b| b.service_ns).sum());
    if let Some(v) = disk_busy {
        put("io.disk_busy_ratio", v.min(1.0));
    }
    let (ops, svc): (u64, u64) = t
        .processes
        .iter()
        .flat_map(|p| p.block.iter())
        .fold((0, 0), |(o, s), b| (o + b.ops, s + b.service_ns));
    if ops > 0 {
        put(
            "io.block_service_seconds_per_op",
            svc as f64 / 1e9 / ops as f64,
        );
    }
    put("net.tcp_retransmits", tt.net.tcp_retransmits as f64);
    put("net.tcp_tx_bytes", tt.net.tcp_tx_bytes as f64);
    put(
        "net.retransmits_per_mib",
        tt.net.tcp_retransmits as f64 / (tt.net.tcp_tx_bytes as f64 / 1048576.0).max(1.0 / 1024.0),
    );
    if let Some(g) = &tt.gpu {
        put("gpu.sync_calls", g.sync.calls as f64);
        if let Some(n) = g.launches {
            put("gpu.launches", n as f64);
        } else if let Some(n) = sample.and_then(|s| s.launches) {
            put("gpu.launches", n as f64);
        }
        // Of all host-to-device copies, the share made with the synchronous symbols (the
        // path of pageable memory in CuPy and the driver API).
        let h2d = |is_async: bool| {
            g.symbols
                .iter()
                .filter(|x| {
                    x.category == "copy"
                        && x.direction == "host_to_device"
                        && x.symbol.contains("Async") == is_async
                })
                .map(|x| x.calls)
                .sum::<u64>()
        };
        let (h2d_sync, h2d_async) = (h2d(false), h2d(true));
        if h2d_sync + h2d_async > 0 {
            put(
                "gpu.sync_h2d_copy_share",
                h2d_sync as f64 / (h2d_sync + h2d_async) as f64,
            );
        }
        let copies = |is_async: bool| {
            g.symbols
                .iter()
                .filter(|x| x.category == "copy" && x.symbol.contains("Async") == is_async)
                .fold((0u64, 0u64), |(c, b), x| (c + x.calls, b + x.bytes))
        };
        let (sc, sb) = copies(false);
        let (ac, _) = copies(true);
        put("gpu.sync_copy_calls", sc as f64);
        put("gpu.async_copy_calls", ac as f64);
        if sc > 0 {
            put("gpu.sync_copy_avg_bytes", sb as f64 / sc as f64);
        }
        put("gpu.memory_live_bytes", g.memory_live_bytes() as f64);
        put(
            "gpu.memory_allocs",
            g.memory.iter().map(|m| m.allocs).sum::<u64>() as f64,
        );
        put("gpu.collective_calls", g.collective_calls() as f64);
        put("gpu.collective_bytes", g.collective_bytes() as f64);
    }
    if let Some(d) = &tt.gpu_derived {
        if let Some(u) = d.device_utilization_ratio {
            put("gpu.device_utilization_ratio", u);
        }
        if let Some(i) = d.device_idle_ratio {
            put("gpu.device_idle_ratio", i);
        }
        for (name, v) in [
            ("gpu.sm_activity_ratio", d.sm_activity_ratio),
            ("gpu.sm_occupancy_ratio", d.sm_occupancy_ratio),
            ("gpu.tensor_activity_ratio", d.tensor_activity_ratio),
            ("gpu.dram_bandwidth_ratio", d.dram_bandwidth_ratio),
        ] {
            if let Some(v) = v {
                put(name, v);
            }
        }
        // How busy the SMs really are: GPM's SM activity where the GPU has it; else NVML's
        // utilization, which counts the GPU busy while a single tiny kernel runs (an upper
        // bound).
        if let Some(v) = d.sm_activity_ratio.or(d.device_utilization_ratio) {
            put("gpu.sm_busy_ratio", v);
        }
    }
    device_signals(t, &mut put);
    rank_signals(t, w, &mut put);
    memory_signals(t, &mut put);
    s
}

/// Health of the GPUs the tree uses (all GPUs when the driver names none for it).
fn device_signals(t: &TreeSnapshot, put: &mut impl FnMut(&str, f64)) {
    let gpus: Vec<_> = tree_gpus(t).collect();
    if gpus.is_empty() {
        return;
    }
    // XIDs while the tree held a context: measured where its GPUs deliver XID events.
    if gpus.iter().any(|g| g.xid_errors.is_some()) {
        put(
            "gpu.xid_events",
            t.processes
                .iter()
                .flat_map(|p| &p.gpu_xid_events)
                .map(|x| x.count)
                .sum::<u64>() as f64,
        );
    }
    let reported = |f: fn(&ethand_snapshot::devices::GpuDevice) -> Option<bool>| {
        let known: Vec<bool> = gpus.iter().filter_map(|g| f(g)).collect();
        (!known.is_empty()).then(|| known.iter().filter(|b| **b).count() as f64)
    };
    if let Some(n) = reported(|g| g.row_remap_failed) {
        put("gpu.row_remap_failed", n);
    }
    if let Some(n) = reported(|g| Some(g.pcie_link_width? < g.pcie_link_width_max?)) {
        put("gpu.pcie_link_downtrained", n);
    }
    // The software power cap is where a fully loaded GPU normally runs: counted apart.
    let with = |pred: fn(&str) -> bool| {
        gpus.iter()
            .filter(|g| {
                g.throttle_reasons
                    .as_ref()
                    .is_some_and(|r| r.iter().any(|x| pred(x)))
            })
            .count() as f64
    };
    put(
        "gpu.throttled",
        with(|x| x.contains("thermal") || x == "hw_slowdown" || x.contains("power_brake")),
    );
    put("gpu.power_capped", with(|x| x == "sw_power_cap"));
    if let Some(v) = gpus.iter().filter_map(|g| g.temperature_celsius).max() {
        put("gpu.temperature_max_celsius", v as f64);
    }
    if let Some(v) = gpus.iter().filter_map(|g| g.power_watts).reduce(f64::max) {
        put("gpu.power_max_watts", v);
    }
    put(
        "gpu.ecc_uncorrected_errors",
        gpus.iter()
            .filter_map(|g| g.ecc_uncorrected_errors)
            .sum::<u64>() as f64,
    );
    put(
        "gpu.xid_errors",
        gpus.iter().filter_map(|g| g.xid_errors).sum::<u64>() as f64,
    );
}

/// Ranks of one job inside the tree (torchrun children): how much each waits on its GPU.
/// The rank that waits least is the one the others wait for.
fn rank_signals(t: &TreeSnapshot, w: f64, put: &mut impl FnMut(&str, f64)) {
    if w <= 0.0 {
        return;
    }
    let ranks: Vec<(u32, f64)> = t
        .processes
        .iter()
        .filter_map(|p: &ProcessSnapshot| {
            let rank = p.gpu.as_ref()?.comm.as_ref()?.rank?;
            let win = p.window.as_ref()?;
            Some((rank, (win.gpu_sync_ns + win.collective_ns) as f64 / 1e9 / w))
        })
        .collect();
    if ranks.len() < 2 {
        return;
    }
    let (min_rank, min) = ranks
        .iter()
        .copied()
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
        .expect("two ranks");
    let max = ranks.iter().map(|r| r.1).fold(0.0, f64::max);
    put("ranks.count", ranks.len() as f64);
    put("ranks.wait_ratio_min", min);
    put("ranks.wait_ratio_max", max);
    put("ranks.wait_ratio_spread", max - min);
    put("ranks.straggler_rank", min_rank as f64);
}

/// Swap and major faults of the tree's live processes, as read when the snapshot was taken
/// (so that a saved snapshot diagnoses the same later).
fn memory_signals(t: &TreeSnapshot, put: &mut impl FnMut(&str, f64)) {
    let now_s = t.taken_at_unix_ms as f64 / 1000.0;
    let live: Vec<&ProcessSnapshot> = t.processes.iter().filter(|p| p.alive).collect();
    if live.iter().any(|p| p.swap_bytes.is_some()) {
        put(
            "mem.swap_bytes",
            live.iter().filter_map(|p| p.swap_bytes).sum::<u64>() as f64,
        );
    }
    if live.iter().any(|p| p.major_faults.is_some()) {
        let per_s: f64 = live
            .iter()
            .filter(|p| p.start_time_unix_s > 0)
            .filter_map(|p| {
                let age = now_s - p.start_time_unix_s as f64;
                let faults = p.major_faults?;
                (age > 0.0).then(|| faults as f64 / age)
            })
            .sum();
        put("mem.major_faults_per_second", per_s);
    }
}

/// `ethand diagnose FILE`: the rules (built-in plus the rules directory) over a saved
/// snapshot. Prints the findings and the rules that could not run; exit 0, or 2 when the file
/// cannot be read or is not a snapshot (as `ethand compare`).
pub fn run_file(cfg: &crate::config::Config, file: &Path, json: bool) -> anyhow::Result<u8> {
    let mut tree = match crate::commands::compare::load(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ethand: error: {e}");
            return Ok(crate::EXIT_USAGE);
        }
    };
    let rules = load_rules(&cfg.diagnosis.rules_dir);
    apply(&mut tree, &rules);
    if json {
        let v = serde_json::json!({
            "root_pid": tree.root_pid,
            "findings": tree.findings,
            "not_evaluated": tree.not_evaluated,
        });
        crate::write_stdout(serde_json::to_string_pretty(&v)? + "\n")?;
    } else {
        crate::write_stdout(crate::render::diagnosis(&tree))?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests;
