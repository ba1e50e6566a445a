//! The signal catalog: every signal the diagnosis rules may read, declared once.
//!
//! An entry ([`Signal`]) holds the name rules use, its unit (shown with a finding's
//! evidence), what it means (the table in docs/diagnosis.md is generated from it), how to get
//! it when a tree lacks it, and its computation over a [`Ctx`], the figures several signals
//! share, derived once per tree. A computation returns `None` where the tree does not measure
//! the signal: an unmeasured signal is absent, never 0. Rules naming a signal not in the
//! catalog are refused when loaded (`rules.rs`).
//!
//! Adding a signal is adding one entry to one area's list.
use std::collections::BTreeMap;

use ethand_snapshot::{
    GpuLevel, ProcessSnapshot, ThreadSnapshot, TreeSnapshot, WindowStats, devices::GpuDevice,
    kernels::ActivityState,
};

use super::tree;

mod cpu;
mod device;
mod gpu;
mod io;
mod kernels;
mod main_thread;
mod memory;

/// The areas, in the order of docs/diagnosis.md's table.
const AREAS: &[&[Signal]] = &[
    cpu::SIGNALS,
    io::SIGNALS,
    memory::SIGNALS,
    gpu::SIGNALS,
    kernels::SIGNALS,
    main_thread::SIGNALS,
    device::SIGNALS,
];

/// One signal.
pub struct Signal {
    /// As rules name it: `area.what_unit`.
    pub name: &'static str,
    pub unit: Unit,
    /// What it measures (one line of docs/diagnosis.md).
    pub doc: &'static str,
    /// What a reader is told when a rule needs it and the tree lacks it.
    pub how_to_get: HowToGet,
    /// Its value; None when the tree does not measure it.
    pub compute: fn(&Ctx) -> Option<f64>,
}

/// A signal's unit, as a finding's evidence shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Ratio,
    PerSecond,
    Bytes,
    BytesPerSecond,
    Seconds,
    Celsius,
    Watts,
    Count,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Ratio => "ratio",
            Unit::PerSecond => "per_second",
            Unit::Bytes => "bytes",
            Unit::BytesPerSecond => "bytes_per_second",
            Unit::Seconds => "seconds",
            Unit::Celsius => "celsius",
            Unit::Watts => "watts",
            Unit::Count => "count",
        }
    }
}

/// Why a tree may lack a signal, and so what its reader can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HowToGet {
    /// Kernel launches: counted at `process`/`op`, sampled on demand at `calls`.
    Launches,
    /// NVML/DCMI utilization of the tree's devices.
    DeviceUtilization,
    /// NVML GPM (Hopper and newer).
    Gpm,
    /// NVML/DCMI health fields of the tree's devices.
    DeviceHealth,
    /// Probed GPU/NPU runtime calls.
    RuntimeCalls,
    /// The main thread's CPU time.
    MainThread,
    /// The native CPU profile of the snapshot (`diagnosis.cpu_profile_hz`).
    CpuProfile,
    /// The Python stack sample of the snapshot (`diagnosis.stack_sample_ms`).
    StackSample,
    /// What the GPU ran: CUPTI records of processes started with libethand_cupti.so.
    GpuActivity,
    /// Nothing to do but measure the tree (a window, a process that does the thing).
    Measured,
}

/// Every signal, in catalog order.
pub fn all() -> impl Iterator<Item = &'static Signal> {
    AREAS.iter().copied().flatten()
}

/// The catalog entry named `name`.
pub fn find(name: &str) -> Option<&'static Signal> {
    all().find(|s| s.name == name)
}

/// Whether a signal is about GPUs/NPUs (a rule needing one does not apply to a tree that uses
/// none).
pub fn about_accelerator(name: &str) -> bool {
    name.starts_with("gpu.") || name.starts_with("ranks.")
}

/// Every signal of the tree that it measures (see docs/diagnosis.md). Rates are over the
/// snapshot window (the daemon's `--window`, or a standalone measurement).
pub fn compute(t: &TreeSnapshot) -> BTreeMap<String, f64> {
    let ctx = Ctx::new(t);
    all()
        .filter_map(|s| {
            (s.compute)(&ctx)
                .filter(|v| v.is_finite())
                .map(|v| (s.name.to_string(), v))
        })
        .collect()
}

/// How to get a signal the tree lacks: one sentence for the snapshot's reader.
pub fn how_to_get(name: &str, t: &TreeSnapshot) -> String {
    let level = t.gpu_level.map_or("unknown", GpuLevel::as_str);
    let how = find(name).map_or(HowToGet::Measured, |s| s.how_to_get);
    match how {
        HowToGet::Launches => match &t.launch_sample {
            Some(s) if !s.notes.is_empty() => format!(
                "Kernel launches: the on-demand sample counted none ({}); `ethand level process` counts them all the time, at a cost per launch.",
                s.notes.join("; ")
            ),
            Some(_) => "Kernel launches: no process of the tree maps a probed runtime library to sample; `ethand level process` counts them all the time.".into(),
            None => format!(
                "Kernel launches are not counted at GPU level {level} and no launch sample was taken: snapshot without --no-launch-sample (diagnosis.launch_sample_ms > 0), or `ethand level process`."
            ),
        },
        HowToGet::DeviceUtilization => "GPU utilization: no NVML/DCMI reading of the tree's devices in the window (`ethand status` shows the device collectors).".into(),
        HowToGet::Gpm => "NVML GPM (SM and pipe activity) is read on Hopper and newer GPUs only; this GPU or driver does not offer it.".into(),
        HowToGet::DeviceHealth => "GPU health: the driver reports no such field for the tree's devices (`ethand status` shows the device collectors).".into(),
        HowToGet::RuntimeCalls => format!(
            "GPU runtime calls: none probed for this tree (GPU level {level}; `ethand status` lists the probed libraries)."
        ),
        HowToGet::MainThread => "The main thread's CPU time: the tree's root or GPU process has no main thread the probes saw in the window.".into(),
        HowToGet::CpuProfile => match &t.cpu_profile {
            Some(p) if !p.notes.is_empty() => format!("The CPU profile has no main thread of the GPU process: {}.", p.notes.join("; ")),
            Some(_) => "The CPU profile caught no main thread of the GPU process.".into(),
            None => "No CPU profile was taken: snapshot with diagnosis.cpu_profile_hz and diagnosis.stack_sample_ms above 0 (the defaults), as root or with the daemon.".into(),
        },
        HowToGet::StackSample => match &t.stack_sample {
            Some(s) if !s.notes.is_empty() => format!("The stack sample has no main thread of the GPU process: {}.", s.notes.join("; ")),
            Some(_) => "The stack sample caught no Python main thread of the GPU process (not a Python program?).".into(),
            None => "No stack sample was taken: snapshot with diagnosis.stack_sample_ms above 0 (the default).".into(),
        },
        HowToGet::GpuActivity => match &t.gpu_activity {
            None => "What the GPU ran was not recorded: snapshot through the daemon with diagnosis.gpu_activity_ms above 0 (the default), of a job started with CUDA_INJECTION64_PATH=<gpu.cupti_dir>/libethand_cupti.so (docs/gpu-activity.md).".into(),
            Some(a) => {
                let mut why: Vec<String> = a
                    .processes
                    .iter()
                    .map(|p| match (p.state, p.incomplete.as_deref()) {
                        (ActivityState::Recorded, Some(i)) => format!("pid {}: incomplete ({i})", p.pid),
                        (ActivityState::Recorded, None) => format!("pid {}: records lost", p.pid),
                        (state, _) => format!(
                            "pid {}: {}{}",
                            p.pid,
                            state.describe(),
                            p.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
                        ),
                    })
                    .collect();
                why.extend(a.notes.iter().cloned());
                if why.is_empty() {
                    why.push("no process of the tree maps a CUDA library".into());
                }
                format!("What the GPU ran: {} (docs/gpu-activity.md).", why.join("; "))
            }
        },
        HowToGet::Measured => format!("{name} was not measured for this tree."),
    }
}

/// The figures several signals share, derived once per tree.
pub struct Ctx<'t> {
    pub t: &'t TreeSnapshot,
    /// The snapshot's own host's CPUs (a saved file is read on another machine); None in
    /// older files, and then the per-CPU signals are absent.
    pub cpus: Option<f64>,
    /// The history windows of the tree's processes.
    pub windows: Vec<&'t WindowStats>,
    /// The window in seconds: the daemon's history, else the standalone measurement; 0 when
    /// neither.
    pub w: f64,
    /// Kernel launches per second: counted in the window at `process`/`op`, else the
    /// snapshot's on-demand sample. Never read as 0 when not counted.
    pub launches_per_second: Option<f64>,
    /// The process that drives the GPU (else the root).
    pub driver: Option<&'t ProcessSnapshot>,
    /// Its live descendants (DataLoader workers and other helpers that feed it).
    pub workers: Vec<&'t ProcessSnapshot>,
    /// Live threads of the tree.
    pub threads: Vec<(&'t ProcessSnapshot, &'t ThreadSnapshot)>,
    /// The GPUs the tree uses.
    pub gpus: Vec<&'t GpuDevice>,
}

impl<'t> Ctx<'t> {
    pub fn new(t: &'t TreeSnapshot) -> Self {
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
        let window_launches: Option<u64> = windows
            .iter()
            .map(|x| x.gpu_launches)
            .reduce(ethand_snapshot::gpu::add_counted)
            .flatten();
        let launches_per_second = if w > 0.0 && window_launches.is_some() {
            window_launches.map(|n| n as f64 / w)
        } else {
            t.launch_sample.as_ref().and_then(|s| s.launches_per_second)
        };
        let threads = t
            .processes
            .iter()
            .flat_map(|p| p.threads.iter().map(move |th| (p, th)))
            .filter(|(_, th)| th.alive)
            .collect();
        let mut ctx = Self {
            t,
            cpus: t.node_cpus.map(f64::from),
            windows,
            w,
            launches_per_second,
            driver: None,
            workers: Vec::new(),
            threads,
            gpus: tree::gpus(t).collect(),
        };
        ctx.driver = ctx.find_driver();
        ctx.workers = ctx.find_workers();
        ctx
    }

    /// The sum of one window field over the tree's processes.
    pub fn sum(&self, f: fn(&WindowStats) -> u64) -> f64 {
        self.windows.iter().map(|x| f(x)).sum::<u64>() as f64
    }

    /// `x` per second of the window; None without one.
    pub fn per_second(&self, x: f64) -> Option<f64> {
        (self.w > 0.0).then(|| x / self.w)
    }

    /// The window when the tree calls a GPU runtime (the GPU rates need both).
    pub fn gpu_window(&self) -> Option<f64> {
        (self.w > 0.0 && self.t.total.gpu.is_some()).then_some(self.w)
    }

    /// A process's launches in the window (counted or sampled).
    fn launches_of(&self, p: &ProcessSnapshot) -> Option<u64> {
        p.window.as_ref().and_then(|w| w.gpu_launches).or_else(|| {
            self.t.launch_sample.as_ref().and_then(|s| {
                s.processes
                    .iter()
                    .find(|x| x.pid == p.pid)
                    .map(|x| x.launches)
            })
        })
    }

    /// Most launches (counted or sampled), else most runtime calls, else one the driver
    /// lists on a device, else the root. A launcher (bash, torchrun) is the root of the tree
    /// but not the driver.
    fn find_driver(&self) -> Option<&'t ProcessSnapshot> {
        let t = self.t;
        let gpu_calls = |p: &ProcessSnapshot| {
            p.gpu
                .as_ref()
                .map_or(0, |g| g.symbols.iter().map(|x| x.calls).sum::<u64>())
        };
        t.processes
            .iter()
            .filter(|p| self.launches_of(p).is_some_and(|n| n > 0))
            .max_by_key(|p| self.launches_of(p))
            .or_else(|| {
                t.processes
                    .iter()
                    .filter(|p| gpu_calls(p) > 0)
                    .max_by_key(|p| gpu_calls(p))
            })
            .or_else(|| t.processes.iter().find(|p| !p.devices.is_empty()))
            .or(t.processes.first())
    }

    fn find_workers(&self) -> Vec<&'t ProcessSnapshot> {
        let Some(root) = self.driver else {
            return Vec::new();
        };
        let mut below = vec![root.pid];
        let mut i = 0;
        while i < below.len() {
            let parent = below[i];
            for p in &self.t.processes {
                if p.ppid == parent && !below.contains(&p.pid) {
                    below.push(p.pid);
                }
            }
            i += 1;
        }
        self.t
            .processes
            .iter()
            .filter(|p| p.pid != root.pid && p.alive && below.contains(&p.pid))
            .collect()
    }

    /// The span a process was observed (and alive, by age), in ns. A thread's off-CPU time
    /// is counted when it runs again: one asleep right now would look busy, so its life is at
    /// least this span.
    pub fn span_ns(&self, p: &ProcessSnapshot) -> f64 {
        let age_ms = if p.start_time_unix_s > 0 {
            self.t
                .taken_at_unix_ms
                .saturating_sub(p.start_time_unix_s * 1000)
        } else {
            u64::MAX
        };
        p.observed_ms.min(age_ms) as f64 * 1e6
    }

    /// A thread's life in ns: its scheduled time, at least its process's span.
    pub fn life_in(&self, p: &ProcessSnapshot, x: &ethand_snapshot::SchedStats) -> f64 {
        ((x.oncpu_ns + x.offcpu_blocked_ns + x.offcpu_preempted_ns) as f64).max(self.span_ns(p))
    }

    /// Per process, `ns_of(p)` against its longest-lived thread's time; the worst process.
    pub fn worst_share_of_life(&self, ns_of: &dyn Fn(&ProcessSnapshot) -> u64) -> Option<f64> {
        self.t
            .processes
            .iter()
            .filter_map(|p| {
                let l = p
                    .threads
                    .iter()
                    .map(|th| self.life_in(p, &th.sched))
                    .fold(0.0, f64::max);
                (l > 0.0).then(|| ns_of(p) as f64 / l)
            })
            .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
    }
}

/// The signals a text names as `{area.signal}` (a rule's explanation quotes its figures so).
pub fn quoted(text: &str) -> impl Iterator<Item = &str> {
    text.split('{').skip(1).filter_map(|rest| {
        let name = rest.split_once('}')?.0;
        let plain = name.contains('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
        plain.then_some(name)
    })
}

/// `text` with each `{area.signal}` replaced by the signal's value in its unit ("62.0 %",
/// "4.6 GiB/s"), or "unmeasured" where the tree lacks it.
pub fn quote(text: &str, values: &BTreeMap<String, f64>) -> String {
    let mut out = text.to_string();
    for name in quoted(text).collect::<std::collections::BTreeSet<_>>() {
        let value = match (find(name), values.get(name)) {
            (Some(s), Some(v)) => ethand_exporters::format::in_unit(*v, s.unit.as_str()),
            _ => "unmeasured".to_string(),
        };
        out = out.replace(&format!("{{{name}}}"), &value);
    }
    out
}

/// docs/diagnosis.md's signal table, from the catalog.
pub fn render_doc_table() -> String {
    let mut out = String::from("| signal | unit | meaning |\n|---|---|---|\n");
    for s in all() {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            s.name,
            s.unit.as_str(),
            s.doc
        ));
    }
    out
}
