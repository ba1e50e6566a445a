//! Configuration: TOML, every default embedded (default.toml) and documented there. A file
//! given with `--config` is merged over the defaults; unknown keys and bad values are errors
//! that name the key and its line.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub prometheus: PrometheusConfig,
    pub probes: ProbesConfig,
    pub maps: MapsConfig,
    pub gpu: GpuConfig,
    pub devices: DevicesConfig,
    pub diagnosis: DiagnosisConfig,
    /// Container / pod / job / rank of processes (attribution.rs, docs/cluster.md).
    pub attribution: AttributionConfig,
    pub otlp: OtlpConfig,
    /// The sandboxed reader of other users' files and memory (reader/, docs/security.md).
    pub reader: ReaderConfig,
}

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
    /// Stack samples per second per Python process.
    pub stack_sample_hz: u32,
    /// CPU-clock samples per second of the snapshot's native CPU profile (over
    /// `stack_sample_ms`); 0: no profile.
    pub cpu_profile_hz: u32,
    /// Waits off the CPU shorter than this are not counted by the profile.
    pub offcpu_min_us: u64,
}

/// How much ethand probes GPU/NPU runtime libraries; switchable live with `ethand level`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GpuLevel {
    /// Device metrics only (NVML, DCMI): no uprobes.
    System,
    /// Per process: memory, copies, syncs and collectives (counts, bytes, sync and collective
    /// time), every probed call but kernel launches. A launch-bound training step makes
    /// hundreds of launches, and each probed one costs a uprobe trap (2-7 µs measured on H200
    /// VMs): 5-15 % of the step. The default.
    Calls,
    /// As `calls`, plus kernel launches (and graph launches) counted.
    Process,
    /// As `process`, plus host time of every probed call.
    Op,
}

impl GpuLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Calls => "calls",
            Self::Process => "process",
            Self::Op => "op",
        }
    }

    /// Kernel launches are probed (and counted) at this level.
    pub fn counts_launches(self) -> bool {
        matches!(self, Self::Process | Self::Op)
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "system" => Some(Self::System),
            "calls" => Some(Self::Calls),
            "process" => Some(Self::Process),
            "op" => Some(Self::Op),
            _ => None,
        }
    }
}

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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Invalid {
        path: String,
        line: usize,
        message: String,
    },
}

impl Config {
    pub fn defaults() -> Self {
        toml::from_str(DEFAULT_TOML).expect("embedded default.toml is valid")
    }

    /// Defaults, overlaid with the file at `path` if given.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else {
            return Ok(Self::defaults());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_overlay(&text, &path.display().to_string())
    }

    pub fn from_overlay(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let invalid = |line: usize, message: String| ConfigError::Invalid {
            path: origin.into(),
            line,
            message,
        };
        let user: toml::Table = text.parse::<toml::Table>().map_err(|e| {
            let at = e.span().map(|s| s.start);
            // A value the parser refuses (an integer beyond 64 bits, say): name its key.
            let key = at.map(|o| key_path_at(text, o)).unwrap_or_default();
            let msg = e.message().trim().to_string();
            invalid(
                line_of(text, at),
                if key.is_empty() {
                    msg
                } else {
                    format!("{key}: {msg}")
                },
            )
        })?;
        let mut merged: toml::Table = DEFAULT_TOML
            .parse()
            .expect("embedded default.toml is valid");
        merge(&mut merged, user);
        let merged_text = toml::to_string(&merged).expect("a table serializes");
        let cfg: Config = toml::from_str(&merged_text).map_err(|e| {
            // The error points into the merged text: name the key by its full path and find
            // that path in the user's file.
            let path = e
                .span()
                .map(|s| key_path_at(&merged_text, s.start))
                .unwrap_or_default();
            let line = find_path_line(text, &path).unwrap_or(0);
            let msg = e.message().trim().to_string();
            invalid(
                line,
                if path.is_empty() {
                    msg
                } else {
                    format!("{path}: {msg}")
                },
            )
        })?;
        cfg.validate()
            .map_err(|(path, msg)| invalid(find_path_line(text, &path).unwrap_or(0), msg))?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let d = &self.daemon;
        in_range("daemon.interval_ms", d.interval_ms, 50, 3_600_000)?;
        check_socket_path(&d.socket).map_err(|m| ("daemon.socket".into(), m))?;
        in_range("daemon.history_seconds", d.history_seconds, 1, 86_400)?;
        in_range("daemon.exit_grace_seconds", d.exit_grace_seconds, 0, 86_400)?;
        in_range(
            "daemon.max_processes",
            d.max_processes as u64,
            16,
            1_000_000,
        )?;
        in_range(
            "daemon.max_exited_processes",
            d.max_exited_processes as u64,
            0,
            1_000_000,
        )?;
        in_range("daemon.api_max_connections", d.api_max_connections, 1, 4096)?;
        in_range(
            "daemon.level_switch_interval_seconds",
            d.level_switch_interval_seconds,
            0,
            3600,
        )?;
        check_log_filter(&d.log).map_err(|m| ("daemon.log".into(), m))?;
        in_range(
            "daemon.bpf_stats_period_ms",
            d.bpf_stats_period_ms,
            1000,
            86_400_000,
        )?;
        in_range(
            "daemon.bpf_stats_window_ms",
            d.bpf_stats_window_ms,
            1,
            d.bpf_stats_period_ms,
        )?;
        if d.user.contains('\0') || d.user.contains(':') || d.user.contains('/') {
            return Err((
                "daemon.user".into(),
                format!("daemon.user = {:?} is not a user name", d.user),
            ));
        }
        for r in &self.gpu.runtimes {
            if !["cuda", "nccl", "ascendcl", "hccl"].contains(&r.as_str()) {
                return Err((
                    "gpu.runtimes".into(),
                    format!(
                        "gpu.runtimes: unknown runtime {r:?} (known: cuda, nccl, ascendcl, hccl)"
                    ),
                ));
            }
        }
        in_range(
            "gpu.rescan_interval_ms",
            self.gpu.rescan_interval_ms,
            100,
            3_600_000,
        )?;
        let dev = &self.devices;
        in_range("devices.interval_ms", dev.interval_ms, 100, 3_600_000)?;
        in_range(
            "diagnosis.launch_sample_ms",
            self.diagnosis.launch_sample_ms,
            0,
            60_000,
        )?;
        in_range(
            "diagnosis.stack_sample_ms",
            self.diagnosis.stack_sample_ms,
            0,
            60_000,
        )?;
        in_range(
            "diagnosis.cpu_profile_hz",
            u64::from(self.diagnosis.cpu_profile_hz),
            0,
            999,
        )?;
        in_range(
            "diagnosis.offcpu_min_us",
            self.diagnosis.offcpu_min_us,
            1,
            1_000_000,
        )?;
        in_range(
            "diagnosis.stack_sample_hz",
            u64::from(self.diagnosis.stack_sample_hz),
            1,
            1000,
        )?;
        in_range(
            "devices.counters_interval_ms",
            dev.counters_interval_ms,
            100,
            86_400_000,
        )?;
        in_range(
            "devices.nvlink_errors_interval_ms",
            dev.nvlink_errors_interval_ms,
            100,
            86_400_000,
        )?;
        let p = &self.prometheus;
        if p.listen.parse::<SocketAddr>().is_err() {
            return Err((
                "prometheus.listen".into(),
                format!(
                    "prometheus.listen = {:?} is not an address like 127.0.0.1:9477",
                    p.listen
                ),
            ));
        }
        in_range("prometheus.top_n", p.top_n as u64, 0, 100_000)?;
        in_range(
            "prometheus.selection_hold_seconds",
            p.selection_hold_seconds,
            0,
            86_400,
        )?;
        in_range(
            "prometheus.selection_min_age_seconds",
            p.selection_min_age_seconds,
            0,
            86_400,
        )?;
        in_range("prometheus.max_connections", p.max_connections, 1, 65_536)?;
        in_range(
            "prometheus.max_connections_per_peer",
            p.max_connections_per_peer,
            1,
            p.max_connections,
        )?;
        in_range("prometheus.timeout_ms", p.timeout_ms, 100, 600_000)?;
        in_range(
            "prometheus.cgroup_hold_seconds",
            p.cgroup_hold_seconds,
            0,
            86_400,
        )?;
        in_range("prometheus.max_cgroups", p.max_cgroups, 1, 1_000_000)?;
        if let Some(c) = p.comms.iter().find(|c| c.is_empty() || c.len() > 15) {
            return Err((
                "prometheus.comms".into(),
                format!(
                    "prometheus.comms: {c:?} can never match: a process name (comm) is 1 to 15 bytes, the kernel cuts longer ones"
                ),
            ));
        }
        let m = &self.maps;
        for (key, v) in [
            ("maps.threads", m.threads),
            ("maps.syscalls", m.syscalls),
            ("maps.syscall_hist", m.syscall_hist),
            ("maps.blk_inflight", m.blk_inflight),
            ("maps.blk_stats", m.blk_stats),
            ("maps.net_stats", m.net_stats),
            ("maps.sock_owner", m.sock_owner),
            ("maps.gpu_sites", m.gpu_sites),
        ] {
            in_range(key, u64::from(v), MAP_ENTRIES_MIN, MAP_ENTRIES_MAX)?;
        }
        // ~1 KiB per stack, preallocated: at most 256 MiB.
        in_range(
            "maps.gpu_stacks",
            u64::from(m.gpu_stacks),
            MAP_ENTRIES_MIN,
            1 << 18,
        )?;
        in_range(
            "maps.profile_stacks",
            u64::from(m.profile_stacks),
            MAP_ENTRIES_MIN,
            1 << 18,
        )?;
        in_range(
            "maps.syscall_numbers_per_process",
            u64::from(m.syscall_numbers_per_process),
            8,
            u64::from(ethand_common::MAX_SYSCALL_NR),
        )?;
        in_range(
            "maps.gpu_sites_per_process",
            u64::from(m.gpu_sites_per_process),
            1,
            u64::from(m.gpu_sites),
        )?;
        let r = &self.reader;
        in_range(
            "reader.memory_max_bytes",
            r.memory_max_bytes,
            16 << 20,
            16 << 30,
        )?;
        in_range("reader.cpu_max_seconds", r.cpu_max_seconds, 1, 86_400)?;
        in_range("reader.max_workers", u64::from(r.max_workers), 1, 64)?;
        in_range(
            "reader.symbolize_timeout_ms",
            r.symbolize_timeout_ms,
            100,
            60_000,
        )?;
        in_range(
            "reader.python_read_timeout_ms",
            r.python_read_timeout_ms,
            10,
            60_000,
        )?;
        self.validate_otlp()?;
        self.attribution.validate()?;
        for (name, tp) in &self.probes.tracepoints {
            if tp.split('/').count() != 2 || tp.starts_with('/') || tp.ends_with('/') {
                return Err((
                    format!("probes.tracepoints.{name}"),
                    format!("probes.tracepoints.{name} = {tp:?} is not \"group/event\""),
                ));
            }
        }
        Ok(())
    }

    /// Checked whether or not export is enabled, so that a typo shows before it is switched on.
    fn validate_otlp(&self) -> Result<(), (String, String)> {
        let o = &self.otlp;
        if !["grpc", "http/protobuf"].contains(&o.protocol.as_str()) {
            return Err((
                "otlp.protocol".into(),
                format!(
                    "otlp.protocol = {:?}: expected \"grpc\" or \"http/protobuf\"",
                    o.protocol
                ),
            ));
        }
        if !o.endpoint.is_empty()
            && !(o.endpoint.starts_with("http://") || o.endpoint.starts_with("https://"))
        {
            return Err((
                "otlp.endpoint".into(),
                format!(
                    "otlp.endpoint = {:?} is not a URL like http://collector:4317",
                    o.endpoint
                ),
            ));
        }
        if o.endpoint.starts_with("https://") {
            return Err((
                "otlp.endpoint".into(),
                format!(
                    "otlp.endpoint = {:?}: TLS is not built in; use http:// to a local collector or sidecar",
                    o.endpoint
                ),
            ));
        }
        if o.interval_ms < 100 || o.interval_ms > 3_600_000 {
            return Err((
                "otlp.interval_ms".into(),
                format!(
                    "otlp.interval_ms = {} is out of range [100, 3600000]",
                    o.interval_ms
                ),
            ));
        }
        if o.timeout_ms == 0 || o.timeout_ms > o.interval_ms {
            return Err((
                "otlp.timeout_ms".into(),
                format!(
                    "otlp.timeout_ms = {} must be in [1, otlp.interval_ms = {}]",
                    o.timeout_ms, o.interval_ms
                ),
            ));
        }
        for (k, v) in &o.headers {
            let bad_name = k.is_empty()
                || !k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if bad_name || v.bytes().any(|b| b.is_ascii_control()) {
                return Err((
                    format!("otlp.headers.{k}"),
                    format!("otlp.headers.{k}: not a valid header name and value"),
                ));
            }
        }
        if o.resource_attributes.keys().any(|k| k.is_empty()) {
            return Err((
                "otlp.resource_attributes".into(),
                "otlp.resource_attributes: empty attribute name".into(),
            ));
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.prometheus.listen.parse().expect("validated")
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }
}

/// Smallest and largest capacity of a kernel map (entries): below, a map cannot hold one busy
/// node's threads or sockets for a moment; above, one map alone could take gigabytes of kernel
/// memory.
pub const MAP_ENTRIES_MIN: u64 = 64;
pub const MAP_ENTRIES_MAX: u64 = 4 << 20;

/// `key = v` must lie in [lo, hi]; the error names the key and the range.
fn in_range(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), (String, String)> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err((
            key.into(),
            format!("{key} = {v} is out of range [{lo}, {hi}]"),
        ))
    }
}

/// Longest Unix socket path the kernel takes (`sun_path` is 108 bytes with its final NUL).
pub const SOCKET_PATH_MAX: usize = 107;

/// A path `bind`/`connect` on a Unix socket can take: not empty, no NUL, at most
/// [`SOCKET_PATH_MAX`] bytes. Checked for `daemon.socket` and `--socket` alike.
pub fn check_socket_path(p: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt as _;
    let b = p.as_os_str().as_bytes();
    if b.is_empty() {
        return Err("daemon.socket is empty: a Unix socket needs a path".into());
    }
    if b.contains(&0) {
        return Err(format!("daemon.socket {p:?} contains a NUL byte"));
    }
    if b.len() > SOCKET_PATH_MAX {
        return Err(format!(
            "daemon.socket is {} bytes long: a Unix socket path is at most {SOCKET_PATH_MAX} bytes",
            b.len()
        ));
    }
    Ok(())
}

/// `daemon.log` must be a filter that logs what it says: each comma-separated directive is a
/// level (trace, debug, info, warn, error, off) or `target=level`. A bare word that is not a
/// level ("inf") would be a target with no level and silence every other log line.
pub fn check_log_filter(s: &str) -> Result<(), String> {
    use tracing::level_filters::LevelFilter;
    let levels = "trace, debug, info, warn, error or off";
    if s.trim().is_empty() {
        return Err(format!(
            "daemon.log is empty: expected a level ({levels}) or target=level"
        ));
    }
    for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = match d.rsplit_once('=') {
            Some((_, level)) => level,
            None => d,
        };
        if level.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "daemon.log = {s:?}: {d:?} is not a level ({levels}) or target=level"
            ));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| ())
        .map_err(|e| format!("daemon.log = {s:?}: {e}"))
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn line_of(text: &str, offset: Option<usize>) -> usize {
    offset
        .map(|o| text[..o.min(text.len())].matches('\n').count() + 1)
        .unwrap_or(0)
}

/// The table header a line sits under (`[a.b]` -> "a.b"), tracking headers line by line.
fn table_of(line: &str) -> Option<String> {
    let l = line.trim();
    if l.starts_with('[') && !l.starts_with("[[") {
        let inner = l.trim_start_matches('[').split(']').next().unwrap_or("");
        return Some(
            inner
                .split('.')
                .map(|p| p.trim().trim_matches('"'))
                .collect::<Vec<_>>()
                .join("."),
        );
    }
    None
}

fn key_of(line: &str) -> Option<&str> {
    let l = line.trim_start();
    if l.starts_with('#') || l.starts_with('[') {
        return None;
    }
    let (k, _) = l.split_once('=')?;
    Some(k.trim().trim_matches('"'))
}

/// Full path ("prometheus.top_n") of the key assigned on the line holding `offset`.
fn key_path_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let mut table = String::new();
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        if let Some(t) = table_of(line) {
            table = t;
        }
        if offset < pos + line.len() {
            return match key_of(line) {
                Some(k) if table.is_empty() => k.to_string(),
                Some(k) => format!("{table}.{k}"),
                None => table,
            };
        }
        pos += line.len();
    }
    String::new()
}

/// Line (1-based) in `text` where the key with full path `path` is assigned.
fn find_path_line(text: &str, path: &str) -> Option<usize> {
    let mut table = String::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(t) = table_of(line) {
            // An unknown table is named by its header.
            if t == path {
                return Some(i + 1);
            }
            table = t;
            continue;
        }
        if let Some(k) = key_of(line) {
            let full = if table.is_empty() {
                k.to_string()
            } else {
                format!("{table}.{k}")
            };
            if full == path {
                return Some(i + 1);
            }
        }
    }
    None
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

impl AttributionConfig {
    /// job_keys and rank_keys must be allow-listed (they are read from the filtered variables).
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (name, keys) in [
            ("attribution.job_keys", &self.job_keys),
            ("attribution.rank_keys", &self.rank_keys),
        ] {
            if let Some(k) = keys.iter().find(|k| !self.env_allowlist.contains(k)) {
                return Err((
                    name.into(),
                    format!("{name}: {k:?} is not in attribution.env_allowlist"),
                ));
            }
        }
        if let Some(k) = self
            .env_allowlist
            .iter()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err((
                "attribution.env_allowlist".into(),
                format!("attribution.env_allowlist: {k:?} is not a variable name"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_validate() {
        let c = Config::defaults();
        assert_eq!(c.daemon.interval_ms, 1000);
        assert!(c.validate().is_ok());
        assert_eq!(c.listen_addr().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn overlay_changes_only_given_keys() {
        let c = Config::from_overlay("[daemon]\ninterval_ms = 250\n", "t").unwrap();
        assert_eq!(c.daemon.interval_ms, 250);
        assert_eq!(c.prometheus.top_n, Config::defaults().prometheus.top_n);
    }

    #[test]
    fn unknown_key_names_itself_and_line() {
        let e = Config::from_overlay("[daemon]\n\ninterval_mss = 5\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("interval_mss"), "{e}");
        assert!(e.starts_with("f.toml:3:"), "{e}");
    }

    #[test]
    fn wrong_type_names_key_and_line() {
        let e = Config::from_overlay("[prometheus]\ntop_n = \"ten\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:2: prometheus.top_n:"), "{e}");
    }

    #[test]
    fn same_key_name_in_two_tables_points_at_the_right_one() {
        let text = "[prometheus]\nenabled = true\n\n[probes]\nsched = true\nenabled_typo = 1\n\n[maps]\nsyscalls = 5\n";
        let e = Config::from_overlay(text, "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:6: probes.enabled_typo:"), "{e}");
        let text = "[probes]\nsyscalls = true\n[maps]\nsyscalls = \"many\"\n";
        let e = Config::from_overlay(text, "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:4: maps.syscalls:"), "{e}");
    }

    #[test]
    fn bad_listen_address() {
        let e = Config::from_overlay("[prometheus]\nlisten = \"localhost:notaport\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prometheus.listen"), "{e}");
        assert!(e.starts_with("f.toml:2:"), "{e}");
    }

    #[test]
    fn otlp_section_parses_and_bad_values_name_their_key() {
        let c = Config::from_overlay(
            "[otlp]\nenabled = true\nprotocol = \"http/protobuf\"\n[otlp.headers]\nauthorization = \"Bearer x\"\n[otlp.resource_attributes]\n\"deployment.environment\" = \"prod\"\n",
            "f.toml",
        )
        .unwrap();
        assert!(c.otlp.enabled);
        assert_eq!(c.otlp.headers["authorization"], "Bearer x");
        assert_eq!(c.otlp.resource_attributes["deployment.environment"], "prod");
        assert_eq!(c.otlp.node_name_env, "NODE_NAME");
        for (text, key, line) in [
            ("[otlp]\nprotocol = \"http\"\n", "otlp.protocol", 2),
            (
                "[otlp]\n\nendpoint = \"collector:4317\"\n",
                "otlp.endpoint",
                3,
            ),
            (
                "[otlp]\nendpoint = \"https://c:4317\"\n",
                "otlp.endpoint",
                2,
            ),
            ("[otlp]\ninterval_ms = 10\n", "otlp.interval_ms", 2),
            (
                "[otlp]\ninterval_ms = 1000\ntimeout_ms = 2000\n",
                "otlp.timeout_ms",
                3,
            ),
            (
                "[otlp.headers]\n\"bad header\" = \"x\"\n",
                "otlp.headers.bad header",
                2,
            ),
        ] {
            let e = Config::from_overlay(text, "f.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text:?}: {e}");
            assert!(e.starts_with(&format!("f.toml:{line}:")), "{text:?}: {e}");
        }
    }

    #[test]
    fn bad_enum_value_names_key() {
        let e = Config::from_overlay("[daemon]\nbpf_stats = \"sometimes\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:2:"), "{e}");
    }

    /// Every value that would break the daemon, silence it or name nothing is refused with
    /// its key and line (values seen accepted, or failing late with no key, in testing).
    #[test]
    fn out_of_range_values_name_key_and_line() {
        let long_socket = format!("/run/{}", "s".repeat(120));
        for (text, key, line) in [
            ("[daemon]\nlog = \"inf\"\n", "daemon.log", 2),
            ("[daemon]\nlog = \"\"\n", "daemon.log", 2),
            ("[daemon]\nlog = \"info,ethand=loud\"\n", "daemon.log", 2),
            ("[daemon]\nmax_processes = 0\n", "daemon.max_processes", 2),
            (
                "[daemon]\n\nhistory_seconds = 0\n",
                "daemon.history_seconds",
                3,
            ),
            ("[daemon]\nsocket = \"\"\n", "daemon.socket", 2),
            (
                &format!("[daemon]\nsocket = {long_socket:?}\n"),
                "daemon.socket",
                2,
            ),
            (
                "[daemon]\nbpf_stats_period_ms = 0\n",
                "daemon.bpf_stats_period_ms",
                2,
            ),
            (
                "[daemon]\napi_max_connections = 0\n",
                "daemon.api_max_connections",
                2,
            ),
            ("[daemon]\nuser = \"a:b\"\n", "daemon.user", 2),
            ("[maps]\nthreads = 0\n", "maps.threads", 2),
            ("[maps]\nsock_owner = 100000000\n", "maps.sock_owner", 2),
            ("[maps]\ngpu_stacks = 1000000\n", "maps.gpu_stacks", 2),
            ("[maps]\ngpu_sites = 10\n", "maps.gpu_sites", 2),
            (
                "[prometheus]\nmax_connections = 0\n",
                "prometheus.max_connections",
                2,
            ),
            (
                "[prometheus]\nmax_connections = 4\nmax_connections_per_peer = 5\n",
                "prometheus.max_connections_per_peer",
                3,
            ),
            ("[prometheus]\ntimeout_ms = 1\n", "prometheus.timeout_ms", 2),
            (
                "[prometheus]\ncomms = [\"a-name-longer-than-15\"]\n",
                "prometheus.comms",
                2,
            ),
            (
                "[gpu]\nrescan_interval_ms = 99999999999\n",
                "gpu.rescan_interval_ms",
                2,
            ),
            (
                "[devices]\ncounters_interval_ms = 0\n",
                "devices.counters_interval_ms",
                2,
            ),
            // Beyond TOML's 64-bit integers: refused by the parser, still named.
            (
                "[daemon]\ninterval_ms = 99999999999999999999\n",
                "daemon.interval_ms",
                2,
            ),
            ("[maps]\nthreads = -1\n", "maps.threads", 2),
            // An unknown table, at its header's line.
            ("\n[deamon]\ninterval_ms = 100\n", "deamon", 2),
        ] {
            let e = Config::from_overlay(text, "f.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text:?}: {e}");
            assert!(e.starts_with(&format!("f.toml:{line}:")), "{text:?}: {e}");
        }
        for ok in [
            "[daemon]\nlog = \"warn,ethand=debug\"\n",
            "[daemon]\nlog = \"ethand::gpu=trace\"\n",
            "[daemon]\nlog = \"OFF\"\n",
            "[maps]\nthreads = 64\n",
            "[prometheus]\ncomms = [\"python3\"]\n",
        ] {
            Config::from_overlay(ok, "f.toml").unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        assert!(check_socket_path(Path::new(&"/".repeat(SOCKET_PATH_MAX))).is_ok());
        assert!(check_socket_path(Path::new(&"/".repeat(SOCKET_PATH_MAX + 1))).is_err());
    }

    #[test]
    fn syntax_error_has_line() {
        let e = Config::from_overlay("[daemon]\ninterval_ms = = 3\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:2:"), "{e}");
    }
}
