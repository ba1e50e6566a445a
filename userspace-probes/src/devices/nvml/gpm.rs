//! GPM (GPU Performance Monitoring, Hopper and newer): SM activity, SM occupancy, tensor
//! activity and DRAM bandwidth, each computed by NVML between two samples of the GPU's
//! performance counters. Read at every collection (one device interval apart), whatever the
//! cadence: one nvmlGpmSampleGet costs ~42 µs on an H200.
use super::*;

/// The GPM metrics ethand reads, in the order of [`GpmRatios`]' fields.
pub const GPM_METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

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
    /// `nvmlGpmMetricsGet` of [`GPM_METRICS`] between two samples: percent, each on its own.
    fn gpm_metrics(
        &self,
        earlier: &Self::Sample,
        later: &Self::Sample,
    ) -> Result<[Result<f64, NvmlError>; 4], NvmlError>;
}

/// What [`read_gpm`] keeps about one GPU between collections: `S` is the sample type of its
/// [`GpmSource`]. Kept apart from [`GpuState`] because a sample is a handle to memory NVML
/// allocated (neither `Clone` nor comparable).
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

/// The GPM metrics of one interval as 0-1 ratios; None: unsupported, first interval, or not
/// readable this time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmRatios {
    pub sm_activity: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub tensor_activity: Option<f64>,
    pub dram_bandwidth: Option<f64>,
}

/// One GPU's GPM reading: whether it has GPM, and the interval's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmReading {
    /// [`GpuDevice::gpm_supported`].
    pub supported: Option<bool>,
    pub ratios: GpmRatios,
}

impl GpmReading {
    /// Copies the reading into the GPU's fields.
    pub fn apply(&self, gpu: &mut GpuDevice) {
        gpu.gpm_supported = self.supported;
        gpu.sm_activity_ratio = self.ratios.sm_activity;
        gpu.sm_occupancy_ratio = self.ratios.sm_occupancy;
        gpu.tensor_activity_ratio = self.ratios.tensor_activity;
        gpu.dram_bandwidth_ratio = self.ratios.dram_bandwidth;
    }
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
    let mut f = Fields { label, notes };
    if state.supported.is_none() {
        state.supported = match src.gpm_supported() {
            Ok(s) => Some(s),
            Err(e) if unsupported(&e) => Some(false),
            Err(e) => f.get::<bool>("gpm support", Err(e)),
        };
    }
    let mut reading = GpmReading {
        supported: state.supported,
        ratios: GpmRatios::default(),
    };
    if state.supported != Some(true) {
        state.previous = None;
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
    let Some([sm, occupancy, tensor, dram]) = values else {
        return reading;
    };
    let mut ratio = |what: &str, v: Result<f64, NvmlError>| {
        let percent = f.get(what, v)?;
        let r = gpm_ratio(percent);
        if r.is_none() {
            f.notes
                .push(format!("{} {what}: {percent} is not a percentage", f.label));
        }
        r
    };
    reading.ratios = GpmRatios {
        sm_activity: ratio("gpm sm activity", sm),
        sm_occupancy: ratio("gpm sm occupancy", occupancy),
        tensor_activity: ratio("gpm tensor activity", tensor),
        dram_bandwidth: ratio("gpm dram bandwidth", dram),
    };
    reading
}
