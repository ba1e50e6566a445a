//! The configuration's tables and their typed values (each documented in default.toml).
use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

/// Bounds of the reader's workers (symbolization, Python frames, source lines).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReaderConfig {
    /// RLIMIT_DATA of each worker (bytes).
    pub memory_max_bytes: u64,
    /// RLIMIT_CPU of each worker over its life (seconds).
    pub cpu_max_seconds: u64,
    /// Workers alive at once.
    pub max_workers: u32,
    /// Deadline of one symbolization request (a snapshot's call sites, a CPU profile).
    pub symbolize_timeout_ms: u64,
    /// Deadline of one read of a Python process's stacks.
    pub python_read_timeout_ms: u64,
}

/// OTLP metrics export (exporters/src/otlp.rs, docs/otlp.md).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    pub enabled: bool,
    /// Empty: the protocol's default on localhost (grpc: http://localhost:4317,
    /// http/protobuf: http://localhost:4318/v1/metrics).
    pub endpoint: String,
    /// "grpc" or "http/protobuf".
    pub protocol: String,
    /// Sent with every export (gRPC metadata or HTTP headers).
    pub headers: BTreeMap<String, String>,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Added to the resource (string values); they override the built-in attributes.
    pub resource_attributes: BTreeMap<String, String>,
    /// Environment variable holding the Kubernetes node name (`k8s.node.name`).
    pub node_name_env: String,
    /// Most points (attribute sets) one metric carries per batch; the rest are summed in one
    /// `otel.metric.overflow` point and counted.
    pub max_points_per_metric: u64,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiagnosisConfig {
    /// Directory of extra rule files (*.toml); a rule with a built-in rule's id replaces it.
    pub rules_dir: PathBuf,
    /// How long a snapshot counts kernel launches on demand when the GPU level does not
    /// count them (launch uprobes scoped to the tree's GPU processes); 0: never.
    pub launch_sample_ms: u64,
    /// How long a snapshot samples the Python frames of the tree's threads (at the same time
    /// as the launch sample); 0: never.
    pub stack_sample_ms: u64,
    /// How long a snapshot records the GPU activity of the tree's processes started with
    /// libethand_cupti.so (at the same time as the launch sample); 0: never.
    pub gpu_activity_ms: u64,
    /// Whether a GPU activity window joins each kernel to its launch call site (launch
    /// uprobes on the recorded processes for the window's length).
    pub launch_sites: bool,
    /// Stack samples per second per Python process.
    pub stack_sample_hz: u32,
    /// CPU-clock samples per second of the snapshot's native CPU profile (over
    /// `stack_sample_ms`); 0: no profile.
    pub cpu_profile_hz: u32,
    /// Waits off the CPU shorter than this are not counted by the profile.
    pub offcpu_min_us: u64,
}

/// The level is part of the snapshot contract (the status and the tree snapshots carry it).
pub use ethand_snapshot::GpuLevel;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub level: GpuLevel,
    pub rescan_interval_ms: u64,
    /// Subset of "cuda", "nccl", "ascendcl", "hccl".
    pub runtimes: Vec<String>,
    /// Runtime library files probed at start-up, before any process maps them (so that the
    /// first GPU process is counted from its first call); empty: the system's driver
    /// libraries, found in the loader's directories and beside NVML's library.
    #[serde(default)]
    pub driver_libraries: Vec<PathBuf>,
    /// Take the user stack at each probed call (not frees) and count calls per call site.
    pub call_stacks: bool,
    /// With `call_stacks`: also walk a CPython caller's Python frames in the kernel.
    pub python_frames: bool,
    /// Where the daemon installs libethand_cupti.so and its control file; empty: no GPU
    /// activity recording.
    pub cupti_dir: PathBuf,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DevicesConfig {
    pub nvml: bool,
    pub dcmi: bool,
    /// Empty: the driver's default library name.
    pub nvml_library: String,
    pub dcmi_library: String,
    pub interval_ms: u64,
    /// NVML's expensive reads (energy, PCIe and NVLink traffic, per-process utilization).
    pub counters_interval_ms: u64,
    pub nvlink_errors_interval_ms: u64,
    pub dcgm_aliases: bool,
    /// The owning workload's labels on a GPU's device series and DCGM aliases.
    pub workload_labels: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    pub interval_ms: u64,
    pub socket: PathBuf,
    pub history_seconds: u64,
    pub exit_grace_seconds: u64,
    pub max_processes: usize,
    /// Most exited processes kept for the grace period; beyond, the earliest exits leave.
    pub max_exited_processes: usize,
    pub log: String,
    pub bpf_stats: BpfStatsMode,
    pub bpf_stats_window_ms: u64,
    pub bpf_stats_period_ms: u64,
    /// Group allowed to use the socket (root:GROUP, 0660); empty or missing: root only (0600).
    pub socket_group: String,
    /// Local API connections open at once; more are answered "busy" and closed.
    pub api_max_connections: u64,
    /// Run as this user once start-up is over (empty: stay the user ethand was started as).
    pub user: String,
    /// Who may switch the GPU level over the local API.
    pub level_switch: LevelSwitch,
    /// Least time between two level switches.
    pub level_switch_interval_seconds: u64,
}

/// Who may switch the GPU level (`ethand level`): every switch changes what every process on
/// the node pays per runtime call.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LevelSwitch {
    /// uid 0 only.
    Root,
    /// Whoever may use the socket (root and `socket_group`).
    SocketGroup,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BpfStatsMode {
    Sampled,
    Always,
    Off,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    pub enabled: bool,
    pub listen: String,
    pub top_n: usize,
    /// A process keeps its series until it exits or uses no CPU for this long.
    pub selection_hold_seconds: u64,
    /// Only processes at least this old take one of the top_n slots.
    pub selection_min_age_seconds: u64,
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub cgroups: Vec<String>,
    /// Prometheus web-config file (TLS, basic auth; daemon/src/serve/web_config.rs); empty: plain
    /// HTTP without auth.
    pub web_config_file: PathBuf,
    /// Connections open at once, in all and per peer (address, and user for local peers).
    pub max_connections: u64,
    pub max_connections_per_peer: u64,
    /// Time a client has to send a request's headers, the longest an idle connection stays
    /// open, and the longest a reply may wait on a client that does not read.
    pub timeout_ms: u64,
    /// How long a cgroup keeps its series after its last process left.
    pub cgroup_hold_seconds: u64,
    /// Most cgroups with series of their own; later ones are summed in "[other cgroups]".
    pub max_cgroups: u64,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProbesConfig {
    pub sched: bool,
    pub syscalls: bool,
    pub block: bool,
    pub net: bool,
    pub lifecycle: bool,
    pub prefer_btf: bool,
    /// Sum a thread's repeated calls of one syscall in the kernel and add them to the maps
    /// in one update (ebpf/ethand-ebpf/src/syscalls.rs); effective only while the
    /// sched_switch and sched_process_exit probes, which flush the sums, are attached.
    pub syscall_batching: bool,
    /// On-CPU time and run-queue waits from the kernel's own per-task charges
    /// (`se.sum_exec_runtime`, `sched_info.run_delay`) where it keeps them; false times both
    /// from sched_switch and sched_wakeup, the path of kernels without them.
    pub kernel_charges: bool,
    /// Probe name -> "group/event".
    pub tracepoints: BTreeMap<String, String>,
}

impl ProbesConfig {
    /// Every tracepoint family off: for the commands that load the object for their own
    /// programs only (`record`, `survey`).
    pub fn turn_families_off(&mut self) {
        self.sched = false;
        self.syscalls = false;
        self.block = false;
        self.net = false;
        self.lifecycle = false;
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MapsConfig {
    pub threads: u32,
    pub syscalls: u32,
    pub syscall_hist: u32,
    pub blk_inflight: u32,
    pub blk_stats: u32,
    pub net_stats: u32,
    pub sock_owner: u32,
    pub gpu_stacks: u32,
    pub gpu_sites: u32,
    pub profile_stacks: u32,
    /// Distinct syscall numbers one process may hold in `syscalls`.
    pub syscall_numbers_per_process: u32,
    /// Call sites one process may hold in `gpu_sites` (and stacks in `gpu_stacks`).
    pub gpu_sites_per_process: u32,
}

/// `[attribution]` in the configuration (documented in default.toml).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AttributionConfig {
    /// Parse container / pod identity from cgroup paths and read runtime metadata.
    pub kubernetes: bool,
    /// Directories holding `<id>/config.json` (containerd OCI bundles, namespace k8s.io).
    pub containerd_dirs: Vec<PathBuf>,
    /// Directories holding `<id>/userdata/config.json` (CRI-O).
    pub crio_dirs: Vec<PathBuf>,
    /// Directories holding `<id>/config.v2.json` (Docker, cri-dockerd).
    pub docker_dirs: Vec<PathBuf>,
    /// The only environment variables ever read out of /proc/PID/environ.
    pub env_allowlist: Vec<String>,
    /// First present (non-empty, not "none") of these gives `job_id`.
    pub job_keys: Vec<String>,
    /// First present numeric one of these gives `rank`; else NCCL's communicator rank.
    pub rank_keys: Vec<String>,
}
