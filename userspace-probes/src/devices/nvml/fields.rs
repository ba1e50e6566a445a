//! Turning NVML's per-field answers into `Option`s and notes, and its units into base units.
use std::collections::BTreeSet;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::error::NvmlError;

/// Turns per-field errors into `None`, noting the ones that are not "not supported".
pub(super) struct Fields<'a> {
    pub(super) label: &'a str,
    pub(super) notes: &'a mut Vec<String>,
    /// [`GpuDevice`] fields found unsupported so far.
    pub(super) unsupported: BTreeSet<&'static str>,
}

impl Fields<'_> {
    /// As [`Fields::get`], and lists `fields` (what `r` fills) as unsupported when it is.
    pub(super) fn field<T>(
        &mut self,
        fields: &[&'static str],
        what: &str,
        r: Result<T, NvmlError>,
    ) -> Option<T> {
        if matches!(&r, Err(e) if unsupported(e)) {
            self.unsupported.extend(fields);
        }
        self.get(what, r)
    }

    pub(super) fn get<T>(&mut self, what: &str, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) if unsupported(&e) => None,
            Err(e) => {
                self.notes.push(format!("{} {what}: {e}", self.label));
                None
            }
        }
    }
}

/// The device or driver does not have this: say nothing, leave the field empty.
pub(super) fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

pub(super) fn percent(p: u32) -> f64 {
    f64::from(p) / 100.0
}

pub(super) fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1e3
}

pub(super) fn mhz_to_hertz(mhz: u32) -> u64 {
    u64::from(mhz) * 1_000_000
}

/// NVML's KB (PCIe) and KiB (NVLink) are 1024 bytes.
pub(super) fn kib<N: Into<u64>>(k: N) -> u64 {
    k.into().saturating_mul(1024)
}

pub(super) fn throttle_names(r: ThrottleReasons) -> Vec<String> {
    [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, name)| name.to_owned())
    .collect()
}
