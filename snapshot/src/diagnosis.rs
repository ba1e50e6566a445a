//! Findings of the diagnosis engine: what the rules concluded about a process tree. Produced
//! by the daemon (`daemon/src/diagnose/mod.rs`, rules as data in TOML) and carried in
//! [`crate::TreeSnapshot::findings`], ranked by estimated impact.
use serde::{Deserialize, Serialize};

/// How much a finding matters; serialized as "critical", "warning" or "info".
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    #[default]
    Warning,
    Info,
}

impl Severity {
    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }

    /// From a rule file's spelling; None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        [Severity::Critical, Severity::Warning, Severity::Info]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// Stable rule id, e.g. "input_pipeline_stall".
    pub id: String,
    pub title: String,
    pub severity: Severity,
    /// The numbers that fired the rule.
    pub evidence: Vec<Evidence>,
    /// Why this matters, in a sentence or two.
    pub explanation: String,
    /// Concrete changes to try, most likely first.
    pub advice: Vec<String>,
    /// Estimated speed-up if the cause is removed (1.0 = none), when one can be computed.
    pub estimated_speedup: Option<f64>,
    /// Ranking score (0-1): the share of wall time or throughput the finding accounts for.
    pub impact: f64,
    /// Where in the tree the rule found it, one line each (which threads wait on what).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
}

/// A rule the diagnosis could not evaluate on a tree, because a signal it reads was not
/// measured there (never read as 0).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NotEvaluated {
    pub rule: String,
    pub title: String,
    /// The signals the rule needs that the tree does not have.
    pub missing: Vec<String>,
    /// How to get them (a level, a driver, a longer window).
    pub how: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Evidence {
    /// Signal name, e.g. "gpu.sync_blocked_ratio".
    pub signal: String,
    pub value: f64,
    /// How to read it: "ratio", "count", "bytes", "seconds", "per_second", ...
    pub unit: String,
}

/// One collection interval of a process tree (sums over its processes), for time-series
/// charts: changes since the previous point.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TimelinePoint {
    /// Wall clock at the end of the interval.
    pub t_unix_ms: u64,
    pub interval_ms: u64,
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_bytes: u64,
    /// None: launches not counted at the GPU level in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_launches: Option<u64>,
    pub gpu_sync_ns: u64,
    pub gpu_copy_bytes: u64,
    pub collective_ns: u64,
    /// Live GPU/NPU memory at the end of the interval (not a change).
    pub gpu_memory_live_bytes: u64,
}
