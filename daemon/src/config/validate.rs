//! The ranges and rules of every value. Each check names its key; the first that fails is
//! the error (in the order of default.toml's tables).
use std::{net::SocketAddr, path::Path};

use super::{AttributionConfig, Config};

/// A value the configuration may not hold: its key ("prometheus.top_n") and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadValue {
    pub key: String,
    pub message: String,
}

impl BadValue {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Config {
    pub(super) fn validate(&self) -> Result<(), BadValue> {
        self.validate_daemon()?;
        self.validate_sampling()?;
        self.validate_prometheus()?;
        self.validate_maps()?;
        self.validate_reader()?;
        self.validate_otlp()?;
        self.attribution.validate()?;
        self.validate_probes()
    }

    /// `[daemon]`.
    fn validate_daemon(&self) -> Result<(), BadValue> {
        let d = &self.daemon;
        in_range("daemon.interval_ms", d.interval_ms, 50, 3_600_000)?;
        check_socket_path(&d.socket)?;
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
        check_log_filter(&d.log)?;
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
            return Err(BadValue::new(
                "daemon.user",
                format!("daemon.user = {:?} is not a user name", d.user),
            ));
        }
        Ok(())
    }

    /// `[gpu]`, `[devices]` and `[diagnosis]`: what is probed and how often it is read.
    fn validate_sampling(&self) -> Result<(), BadValue> {
        for r in &self.gpu.runtimes {
            if !["cuda", "nccl", "ascendcl", "hccl"].contains(&r.as_str()) {
                return Err(BadValue::new(
                    "gpu.runtimes",
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
            "diagnosis.gpu_activity_ms",
            self.diagnosis.gpu_activity_ms,
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
        Ok(())
    }

    /// `[prometheus]`.
    fn validate_prometheus(&self) -> Result<(), BadValue> {
        let p = &self.prometheus;
        if p.listen.parse::<SocketAddr>().is_err() {
            return Err(BadValue::new(
                "prometheus.listen",
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
            return Err(BadValue::new(
                "prometheus.comms",
                format!(
                    "prometheus.comms: {c:?} can never match: a process name (comm) is 1 to 15 bytes, the kernel cuts longer ones"
                ),
            ));
        }
        Ok(())
    }

    /// `[maps]`: kernel map capacities and the per-process bounds within them.
    fn validate_maps(&self) -> Result<(), BadValue> {
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
        Ok(())
    }

    /// `[reader]`: the bounds of the sandboxed reader's workers.
    fn validate_reader(&self) -> Result<(), BadValue> {
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
        Ok(())
    }

    /// `[probes]`: every tracepoint is "group/event".
    fn validate_probes(&self) -> Result<(), BadValue> {
        for (name, tp) in &self.probes.tracepoints {
            if tp.split('/').count() != 2 || tp.starts_with('/') || tp.ends_with('/') {
                return Err(BadValue::new(
                    format!("probes.tracepoints.{name}"),
                    format!("probes.tracepoints.{name} = {tp:?} is not \"group/event\""),
                ));
            }
        }
        Ok(())
    }

    /// Checked whether or not export is enabled, so that a typo shows before it is switched on.
    fn validate_otlp(&self) -> Result<(), BadValue> {
        let o = &self.otlp;
        if !["grpc", "http/protobuf"].contains(&o.protocol.as_str()) {
            return Err(BadValue::new(
                "otlp.protocol",
                format!(
                    "otlp.protocol = {:?}: expected \"grpc\" or \"http/protobuf\"",
                    o.protocol
                ),
            ));
        }
        if !o.endpoint.is_empty()
            && !(o.endpoint.starts_with("http://") || o.endpoint.starts_with("https://"))
        {
            return Err(BadValue::new(
                "otlp.endpoint",
                format!(
                    "otlp.endpoint = {:?} is not a URL like http://collector:4317",
                    o.endpoint
                ),
            ));
        }
        if o.endpoint.starts_with("https://") {
            return Err(BadValue::new(
                "otlp.endpoint",
                format!(
                    "otlp.endpoint = {:?}: TLS is not built in; use http:// to a local collector or sidecar",
                    o.endpoint
                ),
            ));
        }
        if o.interval_ms < 100 || o.interval_ms > 3_600_000 {
            return Err(BadValue::new(
                "otlp.interval_ms",
                format!(
                    "otlp.interval_ms = {} is out of range [100, 3600000]",
                    o.interval_ms
                ),
            ));
        }
        in_range(
            "otlp.max_points_per_metric",
            o.max_points_per_metric,
            100,
            1_000_000,
        )?;
        if o.timeout_ms == 0 || o.timeout_ms > o.interval_ms {
            return Err(BadValue::new(
                "otlp.timeout_ms",
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
                return Err(BadValue::new(
                    format!("otlp.headers.{k}"),
                    format!("otlp.headers.{k}: not a valid header name and value"),
                ));
            }
        }
        if o.resource_attributes.keys().any(|k| k.is_empty()) {
            return Err(BadValue::new(
                "otlp.resource_attributes",
                "otlp.resource_attributes: empty attribute name",
            ));
        }
        Ok(())
    }
}

/// Smallest and largest capacity of a kernel map (entries): below, a map cannot hold one busy
/// node's threads or sockets for a moment; above, one map alone could take gigabytes of kernel
/// memory.
pub const MAP_ENTRIES_MIN: u64 = 64;
pub const MAP_ENTRIES_MAX: u64 = 4 << 20;

/// `key = v` must lie in [lo, hi]; the error names the key and the range.
fn in_range(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), BadValue> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(BadValue::new(
            key,
            format!("{key} = {v} is out of range [{lo}, {hi}]"),
        ))
    }
}

/// Longest Unix socket path the kernel takes (`sun_path` is 108 bytes with its final NUL).
pub const SOCKET_PATH_MAX: usize = 107;

/// A path `bind`/`connect` on a Unix socket can take: not empty, no NUL, at most
/// [`SOCKET_PATH_MAX`] bytes. Checked for `daemon.socket` and `--socket` alike.
pub fn check_socket_path(p: &Path) -> Result<(), BadValue> {
    let bad = |m: String| BadValue::new("daemon.socket", m);
    use std::os::unix::ffi::OsStrExt as _;
    let b = p.as_os_str().as_bytes();
    if b.is_empty() {
        return Err(bad(
            "daemon.socket is empty: a Unix socket needs a path".into()
        ));
    }
    if b.contains(&0) {
        return Err(bad(format!("daemon.socket {p:?} contains a NUL byte")));
    }
    if b.len() > SOCKET_PATH_MAX {
        return Err(bad(format!(
            "daemon.socket is {} bytes long: a Unix socket path is at most {SOCKET_PATH_MAX} bytes",
            b.len()
        )));
    }
    Ok(())
}

/// `daemon.log` must be a filter that logs what it says: each comma-separated directive is a
/// level (trace, debug, info, warn, error, off) or `target=level`. A bare word that is not a
/// level ("inf") would be a target with no level and silence every other log line.
pub fn check_log_filter(s: &str) -> Result<(), BadValue> {
    let bad = |m: String| BadValue::new("daemon.log", m);
    use tracing::level_filters::LevelFilter;
    let levels = "trace, debug, info, warn, error or off";
    if s.trim().is_empty() {
        return Err(bad(format!(
            "daemon.log is empty: expected a level ({levels}) or target=level"
        )));
    }
    for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = match d.rsplit_once('=') {
            Some((_, level)) => level,
            None => d,
        };
        if level.parse::<LevelFilter>().is_err() {
            return Err(bad(format!(
                "daemon.log = {s:?}: {d:?} is not a level ({levels}) or target=level"
            )));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| ())
        .map_err(|e| bad(format!("daemon.log = {s:?}: {e}")))
}

impl AttributionConfig {
    /// job_keys and rank_keys must be allow-listed (they are read from the filtered variables).
    pub fn validate(&self) -> Result<(), BadValue> {
        for (name, keys) in [
            ("attribution.job_keys", &self.job_keys),
            ("attribution.rank_keys", &self.rank_keys),
        ] {
            if let Some(k) = keys.iter().find(|k| !self.env_allowlist.contains(k)) {
                return Err(BadValue::new(
                    name,
                    format!("{name}: {k:?} is not in attribution.env_allowlist"),
                ));
            }
        }
        if let Some(k) = self
            .env_allowlist
            .iter()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(BadValue::new(
                "attribution.env_allowlist",
                format!("attribution.env_allowlist: {k:?} is not a variable name"),
            ));
        }
        Ok(())
    }
}
