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
    pub attribution: crate::attribution::AttributionConfig,
    pub otlp: OtlpConfig,
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
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    pub interval_ms: u64,
    pub socket: PathBuf,
    pub history_seconds: u64,
    pub exit_grace_seconds: u64,
    pub max_processes: usize,
    pub log: String,
    pub bpf_stats: BpfStatsMode,
    pub bpf_stats_window_ms: u64,
    pub bpf_stats_period_ms: u64,
    /// Group allowed to use the socket (root:GROUP, 0660); empty or missing: root only (0600).
    pub socket_group: String,
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
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub cgroups: Vec<String>,
    /// Prometheus web-config file (TLS, basic auth; daemon/src/web_config.rs); empty: plain
    /// HTTP without auth.
    pub web_config_file: PathBuf,
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
            invalid(
                line_of(text, e.span().map(|s| s.start)),
                e.message().to_string(),
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
        if self.daemon.interval_ms < 50 || self.daemon.interval_ms > 3_600_000 {
            return Err((
                "daemon.interval_ms".into(),
                format!(
                    "daemon.interval_ms = {} is out of range [50, 3600000]",
                    self.daemon.interval_ms
                ),
            ));
        }
        if self.daemon.bpf_stats_window_ms > self.daemon.bpf_stats_period_ms
            || self.daemon.bpf_stats_period_ms == 0
        {
            return Err((
                "daemon.bpf_stats_window_ms".into(),
                format!(
                    "daemon.bpf_stats_window_ms = {} must be at most daemon.bpf_stats_period_ms = {} (> 0)",
                    self.daemon.bpf_stats_window_ms, self.daemon.bpf_stats_period_ms
                ),
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
        if self.gpu.rescan_interval_ms < 100 {
            return Err((
                "gpu.rescan_interval_ms".into(),
                format!(
                    "gpu.rescan_interval_ms = {} must be at least 100",
                    self.gpu.rescan_interval_ms
                ),
            ));
        }
        if self.devices.interval_ms < 100 {
            return Err((
                "devices.interval_ms".into(),
                format!(
                    "devices.interval_ms = {} must be at least 100",
                    self.devices.interval_ms
                ),
            ));
        }
        if self.prometheus.listen.parse::<SocketAddr>().is_err() {
            return Err((
                "prometheus.listen".into(),
                format!(
                    "prometheus.listen = {:?} is not an address like 127.0.0.1:9477",
                    self.prometheus.listen
                ),
            ));
        }
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

    #[test]
    fn syntax_error_has_line() {
        let e = Config::from_overlay("[daemon]\ninterval_ms = = 3\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f.toml:2:"), "{e}");
    }
}
