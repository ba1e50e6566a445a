//! GPM (GPU Performance Monitoring, Hopper and newer): SM activity, SM occupancy, tensor
//! activity, DRAM bandwidth, graphics engine activity, the PCIe transmit and receive rates
//! and the FP64/FP32/FP16 pipes' activity, each computed by NVML between two samples of the
//! GPU's performance counters, all asked in one `nvmlGpmMetricsGet`. Units: the
//! utilizations are percent (made 0-1);
//! the PCIe rates are MiB per second (nvml.h: "PCIe traffic from this GPU in MiB/sec"),
//! made bytes per second. Read at every collection (one device interval apart), whatever the
//! cadence: one nvmlGpmSampleGet costs ~42 µs on an H200.
use std::collections::BTreeSet;

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;

use super::fields::{Fields, unsupported};
use crate::devices::GpuDevice;

/// The GPM metrics ethand reads, in the order of [`GpmRatios`]' fields.
pub const GPM_METRICS: [GpmMetricId; 10] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::GraphicsUtil,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
];

/// The [`GpuDevice`] field each of [`GPM_METRICS`] fills.
pub const GPM_FIELDS: [&str; 10] = [
    "sm_activity_ratio",
    "sm_occupancy_ratio",
    "tensor_activity_ratio",
    "dram_bandwidth_ratio",
    "graphics_activity_ratio",
    "pcie_tx_average_bytes_per_second",
    "pcie_rx_average_bytes_per_second",
    "fp64_activity_ratio",
    "fp32_activity_ratio",
    "fp16_activity_ratio",
];

/// One metric's value per [`GPM_METRICS`] entry, each on its own.
pub type GpmValues = [Result<f64, NvmlError>; GPM_METRICS.len()];

/// GPM values (percent) above 100 or below 0 by at most this much are rounding and are
/// clamped; further out they are not a share of anything and are dropped.
pub(super) const GPM_PERCENT_SLACK: f64 = 0.5;

/// One GPU's GPM calls, in NVML's units. Implemented over `nvml_wrapper::Device` by the
/// collector and by stand-ins in tests.
pub trait GpmSource {
    /// A filled sample; freed when dropped (`nvmlGpmSampleFree`).
    type Sample;
    /// `nvmlGpmQueryDeviceSupport`.
    fn gpm_supported(&self) -> Result<bool, NvmlError>;
    /// `nvmlGpmSampleAlloc` + `nvmlGpmSampleGet`: the GPU's counters now.
    fn gpm_sample(&self) -> Result<Self::Sample, NvmlError>;
    /// `nvmlGpmMetricsGet` of [`GPM_METRICS`] between two samples, in NVML's units (percent,
    /// MiB/s), each on its own.
    fn gpm_metrics(
        &self,
        earlier: &Self::Sample,
        later: &Self::Sample,
    ) -> Result<GpmValues, NvmlError>;
}

/// What [`read_gpm`] keeps about one GPU between collections: `S` is the sample type of its
/// [`GpmSource`]. Kept apart from [`GpuState`](super::GpuState) because a sample is a handle
/// to memory NVML allocated (neither `Clone` nor comparable).
#[derive(Debug)]
pub struct GpmState<S> {
    /// None: not asked yet, or asking failed (asked again next time); Some(false): the GPU
    /// or the library has no GPM (never asked again).
    pub supported: Option<bool>,
    /// The sample of the previous collection: the start of the next interval.
    pub previous: Option<S>,
}

impl<S> Default for GpmState<S> {
    fn default() -> Self {
        Self {
            supported: None,
            previous: None,
        }
    }
}

/// The GPM metrics of one interval in base units (0-1 ratios, bytes per second); None:
/// unsupported, first interval, or not readable this time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmRatios {
    pub sm_activity: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_activity: Option<f64>,
    pub dram_bandwidth: Option<f64>,
    pub graphics_activity: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub fp64_activity: Option<f64>,
    pub fp32_activity: Option<f64>,
    pub fp16_activity: Option<f64>,
}

/// One GPU's GPM reading: whether it has GPM, and the interval's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpmReading {
    /// [`GpuDevice::gpm_supported`].
    pub supported: Option<bool>,
    pub ratios: GpmRatios,
    /// [`GPM_FIELDS`] the GPU does not have: all of them without GPM, else those whose
    /// metric NVML answered "not supported".
    pub unsupported: Vec<&'static str>,
}

impl GpmReading {
    /// Copies the reading into the GPU's fields.
    pub fn apply(&self, gpu: &mut GpuDevice) {
        gpu.gpm_supported = self.supported;
        gpu.sm_activity_ratio = self.ratios.sm_activity;
        gpu.sm_occupancy_ratio = self.ratios.sm_occupancy;
        gpu.tensor_activity_ratio = self.ratios.tensor_activity;
        gpu.dram_bandwidth_ratio = self.ratios.dram_bandwidth;
        gpu.graphics_activity_ratio = self.ratios.graphics_activity;
        gpu.pcie_tx_average_bytes_per_second = self.ratios.pcie_tx_bytes_per_second;
        gpu.pcie_rx_average_bytes_per_second = self.ratios.pcie_rx_bytes_per_second;
        gpu.fp64_activity_ratio = self.ratios.fp64_activity;
        gpu.fp32_activity_ratio = self.ratios.fp32_activity;
        gpu.fp16_activity_ratio = self.ratios.fp16_activity;
        if !self.unsupported.is_empty() {
            gpu.unsupported
                .extend(self.unsupported.iter().map(|s| (*s).to_owned()));
            gpu.unsupported.sort();
            gpu.unsupported.dedup();
        }
    }
}

/// A GPM PCIe rate (MiB/s) in bytes per second; None when negative or not finite.
pub fn gpm_mib_per_second(mib: f64) -> Option<f64> {
    (mib.is_finite() && mib >= 0.0).then_some(mib * 1024.0 * 1024.0)
}

/// A GPM percentage as a 0-1 ratio. NaN, infinities and values outside 0-100 by more than
/// rounding ([`GPM_PERCENT_SLACK`]) are None; the rest is clamped to 0-1.
pub fn gpm_ratio(percent: f64) -> Option<f64> {
    let slack = -GPM_PERCENT_SLACK..=100.0 + GPM_PERCENT_SLACK;
    // NaN is in no range.
    slack
        .contains(&percent)
        .then(|| (percent / 100.0).clamp(0.0, 1.0))
}

/// The interval bookkeeping: `new` becomes the start of the next interval, and the sample it
/// replaces, if any, is returned with it as the interval just ended (earlier, later). None on
/// the first call (no interval yet). The replaced sample is the caller's to drop (free).
pub fn next_interval<S>(previous: &mut Option<S>, new: S) -> Option<(S, &S)> {
    let earlier = previous.replace(new);
    match (earlier, previous.as_ref()) {
        (Some(earlier), Some(later)) => Some((earlier, later)),
        _ => None,
    }
}

/// Reads one GPU's GPM metrics over the interval since the previous call: asks once whether
/// the GPU has GPM, then at every call takes a sample and computes the metrics between the
/// previous sample and it. Unsupported (an older GPU, or a library without the GPM symbols)
/// is `supported: Some(false)` and no values, silently; other failures leave the values
/// None and add a note, and never fail the collection. A failed sample also drops the
/// previous one, so the next call starts a new interval rather than spanning the gap.
pub fn read_gpm<G: GpmSource>(
    src: &G,
    state: &mut GpmState<G::Sample>,
    label: &str,
    notes: &mut Vec<String>,
) -> GpmReading {
    let mut f = Fields {
        label,
        notes,
        unsupported: BTreeSet::new(),
    };
    if state.supported.is_none() {
        state.supported = match src.gpm_supported() {
            Ok(s) => Some(s),
            Err(e) if unsupported(&e) => Some(false),
            Err(e) => f.get::<bool>("gpm support", Err(e)),
        };
    }
    let mut reading = GpmReading {
        supported: state.supported,
        ..Default::default()
    };
    if state.supported != Some(true) {
        state.previous = None;
        if state.supported == Some(false) {
            reading.unsupported = GPM_FIELDS.to_vec();
        }
        return reading;
    }
    let sample = match src.gpm_sample() {
        Ok(s) => s,
        Err(e) => {
            state.previous = None;
            if unsupported(&e) {
                // The GPU has GPM but will not sample it now (with MIG enabled NVML samples
                // per GPU instance): nothing this time, asked again next time.
                reading.supported = Some(false);
                reading.unsupported = GPM_FIELDS.to_vec();
            } else {
                f.get::<()>("gpm sample", Err(e));
            }
            return reading;
        }
    };
    let Some((earlier, later)) = next_interval(&mut state.previous, sample) else {
        return reading;
    };
    let values = f.get("gpm metrics", src.gpm_metrics(&earlier, later));
    drop(earlier);
    let Some(values) = values else {
        return reading;
    };
    let mut v = GPM_FIELDS.iter().zip(values).map(|(field, r)| {
        let what = field.replace('_', " ");
        // Metric by metric: NOT_SUPPORTED leaves only that field out.
        let value = f.field(&[*field], &format!("gpm {what}"), r)?;
        let converted = if field.ends_with("_bytes_per_second") {
            gpm_mib_per_second(value)
        } else {
            gpm_ratio(value)
        };
        if converted.is_none() {
            f.notes
                .push(format!("{} gpm {what}: {value} is out of range", f.label));
        }
        converted
    });
    let mut next = || v.next().flatten();
    reading.ratios = GpmRatios {
        sm_activity: next(),
        sm_occupancy: next(),
        tensor_activity: next(),
        dram_bandwidth: next(),
        graphics_activity: next(),
        pcie_tx_bytes_per_second: next(),
        pcie_rx_bytes_per_second: next(),
        fp64_activity: next(),
        fp32_activity: next(),
        fp16_activity: next(),
    };
    drop(v);
    reading.unsupported = f.unsupported.into_iter().collect();
    reading
}
