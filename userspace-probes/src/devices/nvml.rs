//! NVIDIA GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`).
//!
//! The translation from NVML's answers to [`GpuDevice`] ([`read_gpu`]) is a pure function
//! over [`GpuSource`], a narrow view of one GPU in NVML's own units, so it is tested with a
//! stand-in; [`NvmlCollector`] implements that view over the real library and adds what
//! needs state across collections: the XID event set and its ring of recent events
//! ([`XidRing`]), the process-utilization timestamp and, on GPUs with GPM (Hopper and
//! newer), the previous GPM sample ([`read_gpm`], also a function over a narrow view,
//! [`GpmSource`]).
//!
//! Every collection reads the cheap gauges (utilization, memory with the driver's reserve,
//! power and its enforced limit, clocks, temperatures, encoder/decoder, PCIe link generation
//! and width, ECC, throttling, processes), the health counters in one
//! `nvmlDeviceGetFieldValues` call (memory temperature, PCIe replays, row remapping, page
//! retirement) and GPM; the expensive counters follow [`Cadence`]. The NVLink rate is the
//! change of the per-link traffic counters between two counter reads. XID events are drained
//! after the GPUs are read, so that each event names the processes of this collection and
//! of the one before.
//!
//! Field by field (the NVML call is named in each metric's help text): a call that returns
//! `NVML_ERROR_NOT_SUPPORTED` (or that the loaded library lacks) leaves the field `None` and
//! lists its name in [`GpuDevice::unsupported`] (no note); any other error leaves it `None`
//! and adds a note to the sample.
//!
//! [`GpuDevice`]: super::GpuDevice
//! [`GpuDevice::unsupported`]: super::GpuDevice::unsupported

mod collector;
mod counters;
mod fields;
mod gpm;
mod read;
mod source;
mod state;

pub use collector::{NvmlCollector, XidRing};
pub use gpm::{
    GPM_FIELDS, GPM_METRICS, GpmRatios, GpmReading, GpmSource, GpmState, GpmValues,
    gpm_mib_per_second, gpm_ratio, next_interval, read_gpm,
};
pub use read::{GpuReading, read_gpu};
pub use source::GpuSource;
pub use state::{Cadence, Counters, GpuState};

/// The collector's name in statuses and labels.
pub const NAME: &str = "nvml";
/// What NVML is loaded from unless configured otherwise (the driver installs it; the
/// unversioned `libnvidia-ml.so` comes only with development packages).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// NVLinks a GPU can have (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINKS: u32 = nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;

#[cfg(test)]
mod tests;
