//! The resolved plan: decisions several parts of the daemon take from the configuration,
//! each made here once, typed (in the spirit of ripgrep's HiArgs over its LowArgs). The
//! loader, the privilege drop, the snapshot builder and the samplers read the plan, not the
//! `[diagnosis]` keys behind it.
use std::time::Duration;

use super::Config;

/// What the snapshots sample on demand, as the configuration sets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The native CPU profile over a snapshot's stack-sample window, or why it is off.
    pub cpu_profile: Result<CpuProfile, &'static str>,
    /// The stack sample of a snapshot (Python frames; the CPU profile runs over the same
    /// window); None when `diagnosis.stack_sample_ms` is 0.
    pub stack_sample: Option<StackSample>,
    /// How long a snapshot counts launches at level `calls`; None when off.
    pub launch_sample: Option<Duration>,
    /// Whether runtime libraries are probed at all (`gpu.runtimes` not empty).
    pub probes_runtimes: bool,
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

impl Plan {
    pub fn resolve(cfg: &Config) -> Self {
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
        Self {
            cpu_profile,
            stack_sample,
            launch_sample: (d.launch_sample_ms > 0)
                .then(|| Duration::from_millis(d.launch_sample_ms)),
            probes_runtimes: !cfg.gpu.runtimes.is_empty(),
        }
    }

    /// The stack sample's window (zero when off).
    pub fn stack_window(&self) -> Duration {
        self.stack_sample.map_or(Duration::ZERO, |s| s.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_needs_its_rate_and_the_stack_window() {
        let mut cfg = Config::defaults();
        let p = Plan::resolve(&cfg);
        assert!(p.cpu_profile.is_ok() && p.stack_sample.is_some() && p.probes_runtimes);
        cfg.diagnosis.stack_sample_ms = 0;
        let p = Plan::resolve(&cfg);
        assert!(p.cpu_profile.is_err() && p.stack_window().is_zero());
        cfg.diagnosis.stack_sample_ms = 500;
        cfg.diagnosis.cpu_profile_hz = 0;
        assert!(Plan::resolve(&cfg).cpu_profile.is_err());
        cfg.diagnosis.launch_sample_ms = 0;
        assert_eq!(Plan::resolve(&cfg).launch_sample, None);
    }
}
