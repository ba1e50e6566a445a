//! Configuration: TOML, every default embedded (default.toml) and documented there. A file
//! given with `--config` is merged over the defaults; unknown keys and bad values are errors
//! that name the key and its line.
//!
//! `sections.rs`: the tables and their typed values; `validate.rs`: the ranges and rules of
//! every value; `locate.rs`: where a key sits in the user's text (for the error's line);
//! `plan.rs`: the decisions taken from it once (what snapshots sample).
use std::{net::SocketAddr, path::Path};

use serde::{Deserialize, Serialize};

mod locate;
pub mod log_filter;
mod plan;
mod sections;
mod validate;

pub use plan::{
    CollectPlan, CpuProfile, DevicesPlan, GpuPlan, MapSizes, Plan, ProbeFamily, ProbePlan,
    ReaderPlan, ServePlan, StackSample,
};
pub use sections::*;
pub use validate::{
    BadValue, MAP_ENTRIES_MAX, MAP_ENTRIES_MIN, SOCKET_PATH_MAX, check_log_filter,
    check_socket_path,
};

use locate::{find_path_line, key_path_at, line_of, merge};

pub const DEFAULT_TOML: &str = include_str!("../default.toml");

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
            .map_err(|e| invalid(find_path_line(text, &e.key).unwrap_or(0), e.message))?;
        Ok(cfg)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.prometheus.listen.parse().expect("validated")
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }
}

#[cfg(test)]
mod tests;
