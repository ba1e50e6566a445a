//! The resolved plan: every decision the daemon's parts take from the configuration, made
//! here once and typed (in the spirit of ripgrep's HiArgs over its LowArgs). `pipeline/`,
//! `privilege/` and the shared state of the servers read the plan, never the TOML sections
//! behind it; only the commands and `serve/daemon.rs` (the server's own settings: sockets,
//! listeners, OTLP) read [`Config`] itself, to build the plan and pass it down.
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use ethand_snapshot::selection::SelectionPolicy;
use ethand_userspace_probes::{Runtime, devices::DevicesConfig as DeviceCollectors};

use super::{AttributionConfig, BpfStatsMode, Config, GpuLevel, LevelSwitch, MapsConfig};

/// What the daemon (or a standalone measurement) loads, probes, samples and keeps, as the
/// configuration sets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The native CPU profile over a snapshot's stack-sample window, or why it is off.
    pub cpu_profile: Result<CpuProfile, &'static str>,
    /// The stack sample of a snapshot (Python frames; the CPU profile runs over the same
    /// window); None when `diagnosis.stack_sample_ms` is 0.
    pub stack_sample: Option<StackSample>,
    /// How long a snapshot counts launches at level `calls`; None when off.
    pub launch_sample: Option<Duration>,
    /// How long a snapshot records GPU activity (libethand_cupti.so); None when off.
    pub gpu_activity: Option<Duration>,
    /// Whether a GPU activity window joins kernels to their launch call sites.
    pub launch_sites: bool,
    pub probes: ProbePlan,
    pub maps: MapSizes,
    pub gpu: GpuPlan,
    pub collect: CollectPlan,
    pub reader: ReaderPlan,
    pub devices: DevicesPlan,
    /// Container / pod / job / rank of processes: the validated section, passed through.
    pub attribution: AttributionConfig,
    pub serve: ServePlan,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuProfile {
    /// CPU-clock samples per second per CPU.
    pub rate_hz: u32,
    /// Waits shorter than this are not kept.
    pub offcpu_min_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSample {
    pub window: Duration,
    /// Reads per second of each Python thread.
    pub hz: u32,
}

/// A family of kernel probes, switched as one by `probes.<family>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeFamily {
    Sched,
    Syscalls,
    Block,
    Net,
    Lifecycle,
}

impl ProbeFamily {
    pub const ALL: [Self; 5] = [
        Self::Sched,
        Self::Syscalls,
        Self::Block,
        Self::Net,
        Self::Lifecycle,
    ];

    /// Its key under `[probes]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sched => "sched",
            Self::Syscalls => "syscalls",
            Self::Block => "block",
            Self::Net => "net",
            Self::Lifecycle => "lifecycle",
        }
    }
}

/// What the loader attaches and how (`[probes]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePlan {
    /// The families switched on, in [`ProbeFamily::ALL`]'s order.
    pub families: Vec<ProbeFamily>,
    /// BTF tracepoints before classic ones where a probe has both.
    pub prefer_btf: bool,
    /// Sum repeated syscalls in the kernel (only while the probes that flush the sums are
    /// attached: the loader checks).
    pub syscall_batching: bool,
    /// On-CPU time and run-queue waits from the kernel's per-task charges where it keeps them.
    pub kernel_charges: bool,
    /// Probe name -> "group/event" of its classic tracepoint.
    pub tracepoints: BTreeMap<String, String>,
}

impl ProbePlan {
    pub fn enabled(&self, family: ProbeFamily) -> bool {
        self.families.contains(&family)
    }
}

/// Sizes of the kernel maps and of the kernel side's per-process tables.
#[derive(Clone, Debug, PartialEq)]
pub struct MapSizes {
    /// `[maps]`, validated.
    pub configured: MapsConfig,
    /// One SYSCALL_KEYS entry per process that made a syscall: as many as the model tracks
    /// (`daemon.max_processes`), never fewer than 1,024.
    pub syscall_keys: u32,
}

/// The GPU/NPU runtime probes (`[gpu]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuPlan {
    /// The level in force at start-up (`ethand level` switches it later).
    pub level: GpuLevel,
    /// The runtimes whose libraries are probed, in [`Runtime::ALL`]'s order; empty: none.
    pub runtimes: Vec<Runtime>,
    pub rescan: Duration,
    /// Probed at start-up, before any process maps them; empty: the system's own.
    pub driver_libraries: Vec<PathBuf>,
    /// Take the user stack at each probed call.
    pub call_stacks: bool,
    /// Walk CPython callers' frames at those calls (needs `call_stacks`).
    pub python_frames: bool,
    /// Where libethand_cupti.so and its control file go; None: no GPU activity recording.
    pub cupti_dir: Option<PathBuf>,
}

/// The collection rounds and the kernel's BPF statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectPlan {
    pub interval: Duration,
    pub bpf_stats: BpfStatsMode,
    /// With `sampled`: the statistics are on for `bpf_stats_window` every `bpf_stats_period`.
    pub bpf_stats_window: Duration,
    pub bpf_stats_period: Duration,
}

/// The sandboxed reader: who it runs as, its bounds, how long its answers may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaderPlan {
    /// `daemon.user` ("" : stay who we are).
    pub user: String,
    pub limits: ethand_reader::Limits,
    pub symbolize_timeout: Duration,
    pub python_read_timeout: Duration,
}

/// The device collectors and how often they are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicesPlan {
    pub collectors: DeviceCollectors,
    pub interval: Duration,
}

/// What the shared state of the servers keeps and allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServePlan {
    /// Who may switch levels, and the least time between two switches.
    pub level_switch: LevelSwitch,
    pub level_switch_every: Duration,
    /// The processes that get series (`[prometheus]` top_n, pids, comms, cgroups, hold).
    pub selection: SelectionPolicy,
    /// Device readings kept: one per round over `daemon.history_seconds`, at least two.
    pub device_history_rounds: usize,
}

impl Plan {
    pub fn resolve(cfg: &Config) -> Self {
        let (stack_sample, cpu_profile, launch_sample) = samples(cfg);
        let p = &cfg.probes;
        let d = &cfg.daemon;
        let family_on = [p.sched, p.syscalls, p.block, p.net, p.lifecycle];
        Self {
            cpu_profile,
            stack_sample,
            launch_sample,
            gpu_activity: (cfg.diagnosis.gpu_activity_ms > 0)
                .then(|| Duration::from_millis(cfg.diagnosis.gpu_activity_ms)),
            launch_sites: cfg.diagnosis.launch_sites,
            probes: ProbePlan {
                families: ProbeFamily::ALL
                    .into_iter()
                    .zip(family_on)
                    .filter_map(|(f, on)| on.then_some(f))
                    .collect(),
                prefer_btf: p.prefer_btf,
                syscall_batching: p.syscall_batching,
                kernel_charges: p.kernel_charges,
                tracepoints: p.tracepoints.clone(),
            },
            maps: MapSizes {
                configured: cfg.maps.clone(),
                syscall_keys: u32::try_from(d.max_processes).unwrap_or(u32::MAX).max(1024),
            },
            gpu: GpuPlan {
                level: cfg.gpu.level,
                // Validated: every name is a runtime's.
                runtimes: Runtime::ALL
                    .into_iter()
                    .filter(|r| cfg.gpu.runtimes.iter().any(|n| n == r.as_str()))
                    .collect(),
                rescan: Duration::from_millis(cfg.gpu.rescan_interval_ms),
                driver_libraries: cfg.gpu.driver_libraries.clone(),
                call_stacks: cfg.gpu.call_stacks,
                python_frames: cfg.gpu.call_stacks && cfg.gpu.python_frames,
                cupti_dir: (!cfg.gpu.cupti_dir.as_os_str().is_empty())
                    .then(|| cfg.gpu.cupti_dir.clone()),
            },
            collect: CollectPlan {
                interval: Duration::from_millis(d.interval_ms),
                bpf_stats: d.bpf_stats,
                bpf_stats_window: Duration::from_millis(d.bpf_stats_window_ms),
                bpf_stats_period: Duration::from_millis(d.bpf_stats_period_ms),
            },
            reader: reader(cfg),
            devices: devices(cfg),
            attribution: cfg.attribution.clone(),
            serve: ServePlan {
                level_switch: d.level_switch,
                level_switch_every: Duration::from_secs(d.level_switch_interval_seconds),
                selection: selection(&cfg.prometheus),
                device_history_rounds: (d.history_seconds * 1000 / d.interval_ms.max(1)).max(2)
                    as usize,
            },
        }
    }

    /// The plan of the embedded defaults (tests).
    pub fn defaults() -> Self {
        Self::resolve(&Config::defaults())
    }

    /// The stack sample's window (zero when off).
    pub fn stack_window(&self) -> Duration {
        self.stack_sample.map_or(Duration::ZERO, |s| s.window)
    }

    /// Whether the running daemon opens perf events: uprobes on runtime libraries (loaded
    /// later, or on `ethand level`) and the CPU-clock events of a snapshot's CPU profile.
    pub fn opens_perf_events(&self) -> bool {
        !self.gpu.runtimes.is_empty() || self.cpu_profile.is_ok()
    }
}

type Samples = (
    Option<StackSample>,
    Result<CpuProfile, &'static str>,
    Option<Duration>,
);

/// What a snapshot samples on demand (`[diagnosis]`).
fn samples(cfg: &Config) -> Samples {
    let d = &cfg.diagnosis;
    let stack_sample = (d.stack_sample_ms > 0).then(|| StackSample {
        window: Duration::from_millis(d.stack_sample_ms),
        hz: d.stack_sample_hz,
    });
    // The profile runs over the stack sample's window: no window, no profile.
    let cpu_profile = if d.cpu_profile_hz == 0 || stack_sample.is_none() {
        Err("off (diagnosis.cpu_profile_hz or diagnosis.stack_sample_ms is 0)")
    } else {
        Ok(CpuProfile {
            rate_hz: d.cpu_profile_hz,
            offcpu_min_ns: d.offcpu_min_us.saturating_mul(1000),
        })
    };
    let launch_sample = (d.launch_sample_ms > 0).then(|| Duration::from_millis(d.launch_sample_ms));
    (stack_sample, cpu_profile, launch_sample)
}

fn reader(cfg: &Config) -> ReaderPlan {
    let r = &cfg.reader;
    ReaderPlan {
        user: cfg.daemon.user.clone(),
        limits: ethand_reader::Limits {
            memory_max_bytes: r.memory_max_bytes,
            cpu_max_seconds: r.cpu_max_seconds,
            max_workers: r.max_workers,
        },
        symbolize_timeout: Duration::from_millis(r.symbolize_timeout_ms),
        python_read_timeout: Duration::from_millis(r.python_read_timeout_ms),
    }
}

fn devices(cfg: &Config) -> DevicesPlan {
    let d = &cfg.devices;
    let library = |path: &str| (!path.is_empty()).then(|| PathBuf::from(path));
    DevicesPlan {
        collectors: DeviceCollectors {
            nvml: d.nvml,
            dcmi: d.dcmi,
            nvml_library: library(&d.nvml_library),
            dcmi_library: library(&d.dcmi_library),
            nvml_cadence: ethand_userspace_probes::devices::nvml::Cadence {
                counters: Duration::from_millis(d.counters_interval_ms),
                nvlink_errors: Duration::from_millis(d.nvlink_errors_interval_ms),
            },
        },
        interval: Duration::from_millis(d.interval_ms),
    }
}

/// The process selection `[prometheus]` asks for.
fn selection(p: &super::PrometheusConfig) -> SelectionPolicy {
    SelectionPolicy {
        top_n: p.top_n,
        pids: p.pids.clone(),
        comms: p.comms.clone(),
        cgroups: p.cgroups.clone(),
        hold_ms: p.selection_hold_seconds.saturating_mul(1000),
        min_age_ms: p.selection_min_age_seconds.saturating_mul(1000),
    }
}

#[cfg(test)]
mod tests;
