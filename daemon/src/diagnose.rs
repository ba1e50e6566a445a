//! The diagnosis engine: turns a process tree's snapshot into named signals and evaluates
//! the rules (data, not code: `rules.toml` embedded, plus `diagnosis.rules_dir`) over them.
//! Every signal is documented in docs/diagnosis.md; a rule reading a signal the tree does not
//! have does not fire.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ethand_exporters::{
    diagnosis::{Evidence, Finding},
    snapshot::{ProcessSnapshot, TreeSnapshot, WindowStats},
};
use serde::Deserialize;
use tracing::{info, warn};

use crate::expr::{self, Expr};

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

/// Evaluates the rules over the tree; findings ranked by impact, highest first.
pub fn diagnose(t: &TreeSnapshot, rules: &[Rule]) -> Vec<Finding> {
    let s = signals(t);
    let fired: Vec<&Rule> = rules.iter().filter(|r| r.when.truth(&s)).collect();
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
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.impact
            .partial_cmp(&a.impact)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.id.cmp(&b.id))
    });
    out
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
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    put("node.cpus", cpus);
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
    // Below level "process" launches are not probed: leave the launch signals out (unknown),
    // so that no rule reads "0 launches" as a fact.
    let launches_counted = !matches!(t.gpu_level.as_deref(), Some("system" | "calls"));
    let mut s_launches_per_second: Option<f64> = None;
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
        if tt.gpu.is_some() && launches_counted {
            s_launches_per_second = Some(sum(|x| x.gpu_launches) / w);
            put("gpu.launches_per_second", sum(|x| x.gpu_launches) / w);
        }
        if tt.gpu.is_some() {
            put("gpu.sync_blocked_ratio", sum(|x| x.gpu_sync_ns) / 1e9 / w);
            put("gpu.collective_ratio", sum(|x| x.collective_ns) / 1e9 / w);
            put(
                "gpu.memory_growth_bytes_per_second",
                sum(|x| x.gpu_memory_growth_bytes) / w,
            );
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
    let life_in = |p: &ProcessSnapshot, x: &ethand_exporters::snapshot::SchedStats| {
        ((x.oncpu_ns + x.offcpu_blocked_ns + x.offcpu_preempted_ns) as f64).max(span_ns(p))
    };
    // Threads: all, and those that want a CPU (running or preempted) most of their time.
    let threads: Vec<(
        &ProcessSnapshot,
        &ethand_exporters::snapshot::ThreadSnapshot,
    )> = t
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
    put("cpu.threads_per_cpu", busy / cpus);
    let (vol, invol) = (
        tt.sched.voluntary_switches as f64,
        tt.sched.involuntary_switches as f64,
    );
    if vol + invol > 0.0 {
        put("cpu.involuntary_switch_ratio", invol / (vol + invol));
    }
    // The main thread of the process that drives the GPU (most launches), else of the root.
    let driver = t
        .processes
        .iter()
        .filter(|p| p.gpu.as_ref().is_some_and(|g| g.launches > 0))
        .max_by_key(|p| p.gpu.as_ref().map_or(0, |g| g.launches))
        .or(t.processes.first());
    if let Some(root) = driver {
        if let Some(main) = root.threads.iter().find(|th| th.tid == root.pid) {
            let l = life_in(root, &main.sched);
            if l > 0.0 {
                put("cpu.main_thread_busy_ratio", main.sched.oncpu_ns as f64 / l);
            }
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
        if launches_counted {
            put("gpu.launches", g.launches as f64);
            let spl = g.sync.calls as f64 / (g.launches.max(1)) as f64;
            put("gpu.syncs_per_launch", spl);
            if let Some(lps) = s_launches_per_second {
                put("gpu.syncs_per_second", spl * lps);
            }
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
        put(
            "gpu.memory_live_bytes",
            g.memory.iter().map(|m| m.live_bytes).sum::<u64>() as f64,
        );
        put(
            "gpu.memory_allocs",
            g.memory.iter().map(|m| m.allocs).sum::<u64>() as f64,
        );
        put(
            "gpu.collective_calls",
            g.collectives.iter().map(|c| c.calls).sum::<u64>() as f64,
        );
        put(
            "gpu.collective_bytes",
            g.collectives.iter().map(|c| c.bytes).sum::<u64>() as f64,
        );
    }
    if let Some(d) = &tt.gpu_derived {
        if let Some(u) = d.device_utilization_ratio {
            put("gpu.device_utilization_ratio", u);
        }
        if let Some(i) = d.device_idle_ratio {
            put("gpu.device_idle_ratio", i);
        }
    }
    device_signals(t, &mut put);
    rank_signals(t, w, &mut put);
    memory_signals(t, &mut put);
    s
}

/// Health of the GPUs the tree uses (all GPUs when the driver names none for it).
fn device_signals(t: &TreeSnapshot, put: &mut impl FnMut(&str, f64)) {
    let used: Vec<&str> = t
        .processes
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.device.as_str()))
        .collect();
    let gpus: Vec<_> = t
        .devices
        .gpus
        .iter()
        .filter(|g| used.is_empty() || used.contains(&g.label().as_str()))
        .collect();
    if gpus.is_empty() {
        return;
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

/// Swap and major faults of the tree's live processes, from /proc.
fn memory_signals(t: &TreeSnapshot, put: &mut impl FnMut(&str, f64)) {
    let mut swap = 0u64;
    let mut faults_per_s = 0.0;
    let now_s = t.taken_at_unix_ms as f64 / 1000.0;
    // Only processes /proc knows (a start time); synthetic or exited ones have none.
    for p in t
        .processes
        .iter()
        .filter(|p| p.alive && p.start_time_unix_s > 0)
    {
        if let Ok(st) = std::fs::read_to_string(format!("/proc/{}/status", p.pid)) {
            if let Some(kb) = st
                .lines()
                .find_map(|l| l.strip_prefix("VmSwap:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            {
                swap += kb * 1024;
            }
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)) {
            // majflt is field 12: index 9 after the command name.
            let majflt = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(9)?.parse::<f64>().ok());
            let age = now_s - p.start_time_unix_s as f64;
            if let (Some(m), true) = (majflt, age > 0.0 && p.start_time_unix_s > 0) {
                faults_per_s += m / age;
            }
        }
    }
    put("mem.swap_bytes", swap as f64);
    put("mem.major_faults_per_second", faults_per_s);
}

#[cfg(test)]
mod tests;
