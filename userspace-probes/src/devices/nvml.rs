//! NVIDIA GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`).
//!
//! The translation from NVML's answers to [`GpuDevice`] ([`read_gpu`]) is a pure function
//! over [`GpuSource`], a narrow view of one GPU in NVML's own units, so it is tested with a
//! stand-in; [`NvmlCollector`] implements that view over the real library and adds what
//! needs state across collections: the XID event set, the process-utilization timestamp and,
//! on GPUs with GPM (Hopper and newer), the previous GPM sample ([`read_gpm`], also a
//! function over a narrow view, [`GpmSource`]).
//!
//! Field by field (the NVML call is named in each metric's help text): a call that returns
//! `NVML_ERROR_NOT_SUPPORTED` (or that an older driver lacks) leaves the field `None`
//! silently; any other error leaves it `None` and adds a note to the sample.
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::struct_wrappers::device::{
    MemoryInfo, ProcessInfo, ProcessUtilizationSample, Utilization,
};
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml};

use super::{
    CollectorState, DeviceCollector, DeviceError, DeviceProcess, DeviceSample, GpuDevice,
    NvLinkStats,
};

/// The collector's name in statuses and labels.
pub const NAME: &str = "nvml";
/// What NVML is loaded from unless configured otherwise (the driver installs it; the
/// unversioned `libnvidia-ml.so` comes only with development packages).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";
/// NVLinks a GPU can have (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINKS: u32 = nvml_wrapper_sys::bindings::NVML_NVLINK_MAX_LINKS;
/// XID events drained per collection at most; the rest wait for the next one.
const MAX_EVENTS_PER_COLLECT: usize = 4096;
/// NVML samples per-process utilization every 1/6 s to 1 s. A collection that finds no new
/// sample within this long of the last batch reuses that batch (the driver has not sampled
/// yet); after it, no new sample means every process was idle.
const PROCESS_UTIL_FRESH: Duration = Duration::from_secs(2);

/// One GPU as NVML describes it, in NVML's units. Implemented over `nvml_wrapper::Device` by
/// the collector and by stand-ins in tests; each method is one NVML call.
pub trait GpuSource {
    /// `nvmlDeviceGetIndex`.
    fn index(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetUUID`.
    fn uuid(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetName`.
    fn name(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetPciInfo_v3`: `busId`.
    fn pci_bus_id(&self) -> Result<String, NvmlError>;
    /// `nvmlDeviceGetMinorNumber`.
    fn minor_number(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetUtilizationRates`: percent.
    fn utilization_rates(&self) -> Result<Utilization, NvmlError>;
    /// `nvmlDeviceGetMemoryInfo_v2`: bytes.
    fn memory_info(&self) -> Result<MemoryInfo, NvmlError>;
    /// `nvmlDeviceGetPowerUsage`: milliwatts.
    fn power_usage(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetTotalEnergyConsumption`: millijoules since the driver was loaded.
    fn total_energy_consumption(&self) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`: celsius.
    fn temperature(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetClockInfo`: MHz.
    fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetPcieThroughput`: KB/s.
    fn pcie_throughput(&self, counter: PcieUtilCounter) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetTotalEccErrors(type, NVML_VOLATILE_ECC)`.
    fn ecc_volatile(&self, error: MemoryError) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetCurrentClocksThrottleReasons`.
    fn throttle_reasons(&self) -> Result<ThrottleReasons, NvmlError>;
    /// `nvmlDeviceGetNvLinkState`.
    fn nvlink_active(&self, link: u32) -> Result<bool, NvmlError>;
    /// `nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX, scopeId =
    /// link)`: KiB since the driver was loaded, (transmit, receive), each on its own.
    #[allow(clippy::type_complexity)]
    fn nvlink_data(
        &self,
        link: u32,
    ) -> Result<(Result<u64, NvmlError>, Result<u64, NvmlError>), NvmlError>;
    /// `nvmlDeviceGetNvLinkErrorCounter`.
    fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetComputeRunningProcesses_v3`.
    fn compute_processes(&self) -> Result<Vec<ProcessInfo>, NvmlError>;
    /// `nvmlDeviceGetProcessUtilization`: samples newer than `since` (µs; None: all the
    /// driver buffered).
    fn process_utilization(
        &self,
        since: Option<u64>,
    ) -> Result<Vec<ProcessUtilizationSample>, NvmlError>;
}

/// What [`read_gpu`] keeps about one GPU between collections.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuState {
    /// Timestamp (µs, the driver's clock) of the newest process-utilization sample read so
    /// far: the next call asks only for newer ones.
    pub process_util_since: Option<u64>,
    /// SM share (0-1) per pid in the newest batch of samples, and when it was read.
    pub process_util: BTreeMap<u32, f64>,
    pub process_util_read_at: Option<Instant>,
    /// Critical XID events counted so far; None when the GPU does not deliver them to ethand.
    pub xid_errors: Option<u64>,
    /// Code of the most recent one.
    pub last_xid: Option<u64>,
    /// The expensive reads (see [`Cadence`]), as last made, and when.
    pub counters: Option<Counters>,
    pub counters_read_at: Option<Instant>,
    /// Per-link NVLink error counters (replay, recovery, CRC FLIT, CRC data), and when.
    pub nvlink_errors: BTreeMap<u32, [Option<u64>; 4]>,
    pub nvlink_errors_read_at: Option<Instant>,
}

/// The values of the expensive reads, kept between the collections that make them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub energy_millijoules: Option<u64>,
    pub pcie_tx_bytes_per_second: Option<u64>,
    pub pcie_rx_bytes_per_second: Option<u64>,
    /// Active links with their traffic (errors filled in from `GpuState::nvlink_errors`).
    pub nvlinks: Vec<NvLinkStats>,
    /// SM share per pid; None when the driver would not say.
    pub sm_share: Option<BTreeMap<u32, f64>>,
}

/// How often the expensive NVML reads are made. Measured on an H200 (driver 580, in a VM):
/// the whole collection took ~94 ms of CPU per GPU, almost all of it in these: the 72
/// per-link NVLink error counters ~69 ms, the per-link NVLink traffic ~17 ms, energy ~4 ms,
/// per-process utilization ~2.5 ms, PCIe throughput ~1.6 ms of CPU and ~42 ms of wall time.
/// The cheap gauges (utilization, memory, power, clocks, temperature, ECC, throttling,
/// processes: ~30 µs in all) are read every collection. Counters read less often lose no
/// totals, only resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// Energy, PCIe throughput, NVLink traffic, per-process SM utilization.
    pub counters: Duration,
    /// NVLink error counters (read at the first collection of `counters` after this long).
    pub nvlink_errors: Duration,
}

impl Cadence {
    /// Everything at every collection.
    pub const EVERY_TIME: Self = Self {
        counters: Duration::ZERO,
        nvlink_errors: Duration::ZERO,
    };
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            counters: Duration::from_secs(10),
            nvlink_errors: Duration::from_secs(60),
        }
    }
}

/// One GPU's reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    pub gpu: GpuDevice,
    pub processes: Vec<DeviceProcess>,
    /// Fields that failed for a reason other than "not supported".
    pub notes: Vec<String>,
}

/// Reads one GPU from `src` and converts NVML's units to base units. Only the identity
/// (index, UUID) is required: without it the GPU cannot be named, and that is the error.
/// `now` is when the reading is taken (it decides whether per-process samples are stale).
/// The expensive reads are made when `cadence` says they are due, else their last values
/// are reported again.
pub fn read_gpu(
    src: &impl GpuSource,
    driver_version: &str,
    state: &mut GpuState,
    now: Instant,
    cadence: &Cadence,
) -> Result<GpuReading, NvmlError> {
    let index = src.index()?;
    let uuid = src.uuid()?;
    let label = format!("gpu{index}");
    let mut notes = Vec::new();
    let mut f = Fields {
        label: &label,
        notes: &mut notes,
    };

    let util = f.get("utilization", src.utilization_rates());
    let memory = f.get("memory", src.memory_info());
    let mut gpu = GpuDevice {
        index,
        uuid: uuid.clone(),
        name: f.get("name", src.name()).unwrap_or_default(),
        pci_bus_id: f.get("pci bus id", src.pci_bus_id()).unwrap_or_default(),
        minor_number: f.get("minor number", src.minor_number()),
        driver_version: driver_version.to_owned(),
        utilization_ratio: util.as_ref().map(|u| percent(u.gpu)),
        memory_utilization_ratio: util.as_ref().map(|u| percent(u.memory)),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_free_bytes: memory.as_ref().map(|m| m.free),
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        power_watts: f
            .get("power", src.power_usage())
            .map(|mw| f64::from(mw) / 1e3),
        energy_millijoules: None,
        temperature_celsius: f.get("temperature", src.temperature()).map(i64::from),
        sm_clock_hertz: f
            .get("sm clock", src.clock_info(Clock::SM))
            .map(mhz_to_hertz),
        memory_clock_hertz: f
            .get("memory clock", src.clock_info(Clock::Memory))
            .map(mhz_to_hertz),
        pcie_tx_bytes_per_second: None,
        pcie_rx_bytes_per_second: None,
        nvlinks: Vec::new(),
        ecc_corrected_errors: f.get("ecc corrected", src.ecc_volatile(MemoryError::Corrected)),
        ecc_uncorrected_errors: f.get(
            "ecc uncorrected",
            src.ecc_volatile(MemoryError::Uncorrected),
        ),
        throttle_reasons: f
            .get("throttle reasons", src.throttle_reasons())
            .map(throttle_names),
        xid_errors: state.xid_errors,
        last_xid: state.last_xid,
        // GPM needs samples kept across collections: the collector adds them (`read_gpm`).
        gpm_supported: None,
        sm_activity_ratio: None,
        sm_occupancy_ratio: None,
        tensor_activity_ratio: None,
        dram_bandwidth_ratio: None,
    };

    let due = |at: Option<Instant>, every: Duration| {
        at.is_none_or(|t| now.saturating_duration_since(t) >= every)
    };
    if due(state.counters_read_at, cadence.counters) {
        let errors_due = due(state.nvlink_errors_read_at, cadence.nvlink_errors);
        let counters = read_counters(src, &mut f, state, errors_due, now);
        state.counters = Some(counters);
        state.counters_read_at = Some(now);
        if errors_due {
            state.nvlink_errors_read_at = Some(now);
        }
    }
    let counters = state.counters.clone().unwrap_or_default();
    gpu.energy_millijoules = counters.energy_millijoules;
    gpu.pcie_tx_bytes_per_second = counters.pcie_tx_bytes_per_second;
    gpu.pcie_rx_bytes_per_second = counters.pcie_rx_bytes_per_second;
    gpu.nvlinks = counters.nvlinks;
    for l in &mut gpu.nvlinks {
        let [replay, recovery, flit, data] = state
            .nvlink_errors
            .get(&l.link)
            .copied()
            .unwrap_or_default();
        l.replay_errors = replay;
        l.recovery_errors = recovery;
        l.crc_flit_errors = flit;
        l.crc_data_errors = data;
    }
    let sm_share = counters.sm_share;
    let newest_util = |pid: u32| {
        sm_share
            .as_ref()
            .map(|share| share.get(&pid).copied().unwrap_or(0.0))
    };
    let processes = f
        .get("processes", src.compute_processes())
        .unwrap_or_default()
        .into_iter()
        .map(|p| DeviceProcess {
            pid: p.pid,
            device: label.clone(),
            uuid: uuid.clone(),
            memory_used_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            utilization_ratio: newest_util(p.pid),
        })
        .collect();

    Ok(GpuReading {
        gpu,
        processes,
        notes,
    })
}

/// The expensive reads (see [`Cadence`]); the NVLink error counters only when `errors_due`.
fn read_counters(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    state: &mut GpuState,
    errors_due: bool,
    now: Instant,
) -> Counters {
    let mut nvlinks = Vec::new();
    for link in 0..MAX_NVLINKS {
        // InvalidArg: no such link on this GPU.
        match src.nvlink_active(link) {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::InvalidArg) => continue,
            Err(e) => {
                f.get::<()>(&format!("nvlink {link} state"), Err(e));
                continue;
            }
        }
        let what = format!("nvlink {link}");
        let (tx, rx) = match src.nvlink_data(link) {
            Ok((tx, rx)) => (f.get(&what, tx), f.get(&what, rx)),
            Err(e) => (f.get(&what, Err(e)), None),
        };
        if errors_due {
            let mut errors = |c| f.get(&what, src.nvlink_error_counter(link, c));
            let read = [
                errors(ErrorCounter::DlReplay),
                errors(ErrorCounter::DlRecovery),
                errors(ErrorCounter::DlCrcFlit),
                errors(ErrorCounter::DlCrcData),
            ];
            state.nvlink_errors.insert(link, read);
        }
        nvlinks.push(NvLinkStats {
            link,
            tx_bytes: tx.map(kib),
            rx_bytes: rx.map(kib),
            ..Default::default()
        });
    }
    if errors_due {
        state
            .nvlink_errors
            .retain(|l, _| nvlinks.iter().any(|n| n.link == *l));
    }

    // Per process: SM share from the newest utilization sample of each pid in the newest
    // batch (the samples since the previous read). NVML lists only processes with non-zero
    // utilization (NOT_FOUND: none at all), so a listed process missing from the batch used
    // no SM time: 0.
    let batch = match src.process_utilization(state.process_util_since) {
        Ok(samples) => Some(samples),
        Err(NvmlError::NotFound) => Some(Vec::new()),
        Err(e) => f.get("process utilization", Err(e)),
    };
    let sm_share = batch.map(|samples| {
        if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
            let mut latest: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
            for s in &samples {
                let e = latest.entry(s.pid).or_insert((0, 0.0));
                if s.timestamp >= e.0 {
                    *e = (s.timestamp, percent(s.sm_util));
                }
            }
            state.process_util = latest.into_iter().map(|(pid, (_, r))| (pid, r)).collect();
            state.process_util_since = Some(newest);
            state.process_util_read_at = Some(now);
        } else if !state
            .process_util_read_at
            .is_some_and(|t| now.saturating_duration_since(t) < PROCESS_UTIL_FRESH)
        {
            state.process_util.clear();
        }
        state.process_util.clone()
    });
    Counters {
        energy_millijoules: f.get("energy", src.total_energy_consumption()),
        pcie_tx_bytes_per_second: f
            .get("pcie tx", src.pcie_throughput(PcieUtilCounter::Send))
            .map(kib),
        pcie_rx_bytes_per_second: f
            .get("pcie rx", src.pcie_throughput(PcieUtilCounter::Receive))
            .map(kib),
        nvlinks,
        sm_share,
    }
}

// ---------------------------------------------------------------------------------------------
// GPM (GPU Performance Monitoring, Hopper and newer): SM activity, SM occupancy, tensor
// activity and DRAM bandwidth, each computed by NVML between two samples of the GPU's
// performance counters. Read at every collection (one device interval apart), whatever the
// cadence: one nvmlGpmSampleGet costs ~42 µs on an H200.

/// The GPM metrics ethand reads, in the order of [`GpmRatios`]' fields.
pub const GPM_METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

/// GPM values (percent) above 100 or below 0 by at most this much are rounding and are
/// clamped; further out they are not a share of anything and are dropped.
const GPM_PERCENT_SLACK: f64 = 0.5;

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

/// Turns per-field errors into `None`, noting the ones that are not "not supported".
struct Fields<'a> {
    label: &'a str,
    notes: &'a mut Vec<String>,
}

impl Fields<'_> {
    fn get<T>(&mut self, what: &str, r: Result<T, NvmlError>) -> Option<T> {
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
fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

fn percent(p: u32) -> f64 {
    f64::from(p) / 100.0
}

fn mhz_to_hertz(mhz: u32) -> u64 {
    u64::from(mhz) * 1_000_000
}

/// NVML's KB (PCIe) and KiB (NVLink) are 1024 bytes.
fn kib<N: Into<u64>>(k: N) -> u64 {
    k.into().saturating_mul(1024)
}

fn throttle_names(r: ThrottleReasons) -> Vec<String> {
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

/// [`GpuSource`] over the real library.
struct NvmlGpu<'a> {
    nvml: &'a Nvml,
    device: Device<'a>,
}

impl GpuSource for NvmlGpu<'_> {
    fn index(&self) -> Result<u32, NvmlError> {
        self.device.index()
    }
    fn uuid(&self) -> Result<String, NvmlError> {
        self.device.uuid()
    }
    fn name(&self) -> Result<String, NvmlError> {
        self.device.name()
    }
    fn pci_bus_id(&self) -> Result<String, NvmlError> {
        self.device.pci_info().map(|p| p.bus_id)
    }
    fn minor_number(&self) -> Result<u32, NvmlError> {
        self.device.minor_number()
    }
    fn utilization_rates(&self) -> Result<Utilization, NvmlError> {
        self.device.utilization_rates()
    }
    fn memory_info(&self) -> Result<MemoryInfo, NvmlError> {
        self.device.memory_info()
    }
    fn power_usage(&self) -> Result<u32, NvmlError> {
        self.device.power_usage()
    }
    fn total_energy_consumption(&self) -> Result<u64, NvmlError> {
        self.device.total_energy_consumption()
    }
    fn temperature(&self) -> Result<u32, NvmlError> {
        self.device.temperature(TemperatureSensor::Gpu)
    }
    fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError> {
        self.device.clock_info(clock)
    }
    fn pcie_throughput(&self, counter: PcieUtilCounter) -> Result<u32, NvmlError> {
        self.device.pcie_throughput(counter)
    }
    fn ecc_volatile(&self, error: MemoryError) -> Result<u64, NvmlError> {
        self.device.total_ecc_errors(error, EccCounter::Volatile)
    }
    fn throttle_reasons(&self) -> Result<ThrottleReasons, NvmlError> {
        self.device.current_throttle_reasons()
    }
    fn nvlink_active(&self, link: u32) -> Result<bool, NvmlError> {
        self.device.link_wrapper_for(link).is_active()
    }
    fn nvlink_data(
        &self,
        link: u32,
    ) -> Result<(Result<u64, NvmlError>, Result<u64, NvmlError>), NvmlError> {
        use nvml_wrapper_sys::bindings::field_id::{
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        };
        use nvml_wrapper_sys::bindings::{
            nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UINT,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as ULONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as ULONGLONG,
        };
        // nvml-wrapper's field_values_for() cannot set scopeId (the link), so call
        // nvmlDeviceGetFieldValues through the bindings it loaded.
        let get = self
            .nvml
            .lib()
            .nvmlDeviceGetFieldValues
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        // SAFETY: nvmlFieldValue_t is plain C data; all zeroes is a valid value.
        let mut values: [nvmlFieldValue_t; 2] = unsafe { std::mem::zeroed() };
        for (v, id) in values.iter_mut().zip([
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ]) {
            v.fieldId = id;
            v.scopeId = link;
        }
        // SAFETY: the handle is valid while `self.device` lives (it borrows the Nvml that
        // loaded the library) and `values` holds the 2 entries the count says.
        nvml_try(unsafe { get(self.device.handle(), 2, values.as_mut_ptr()) })?;
        let read = |v: &nvmlFieldValue_t| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: `valueType` names the union member NVML wrote.
            unsafe {
                match v.valueType {
                    ULONGLONG => Ok(v.value.ullVal),
                    ULONG => Ok(v.value.ulVal),
                    UINT => Ok(u64::from(v.value.uiVal)),
                    other => Err(NvmlError::UnexpectedVariant(other)),
                }
            }
        };
        Ok((read(&values[0]), read(&values[1])))
    }
    fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError> {
        self.device.link_wrapper_for(link).error_counter(counter)
    }
    fn compute_processes(&self) -> Result<Vec<ProcessInfo>, NvmlError> {
        self.device.running_compute_processes()
    }
    fn process_utilization(
        &self,
        since: Option<u64>,
    ) -> Result<Vec<ProcessUtilizationSample>, NvmlError> {
        self.device.process_utilization_stats(since)
    }
}

impl<'a> GpmSource for NvmlGpu<'a> {
    type Sample = GpmSample<'a>;
    fn gpm_supported(&self) -> Result<bool, NvmlError> {
        self.device.gpm_support()
    }
    fn gpm_sample(&self) -> Result<GpmSample<'a>, NvmlError> {
        self.device.gpm_sample()
    }
    fn gpm_metrics(
        &self,
        earlier: &GpmSample<'a>,
        later: &GpmSample<'a>,
    ) -> Result<[Result<f64, NvmlError>; 4], NvmlError> {
        let mut values =
            nvml_wrapper::gpm::gpm_metrics_get(self.nvml, earlier, later, &GPM_METRICS)?
                .into_iter()
                .map(|r| r.map(|m| m.value));
        Ok(std::array::from_fn(|_| {
            values
                .next()
                .unwrap_or(Err(NvmlError::UnexpectedVariant(0)))
        }))
    }
}

/// Reads every GPU through NVML. Holds the library (and NVML's initialisation) for its
/// lifetime, and an event set registered for critical XID errors on every GPU that supports
/// them, drained without blocking at each collection.
pub struct NvmlCollector {
    /// Borrows the `Nvml` below: declared first so it is dropped first (see `Drop`).
    events: Option<EventSet<'static>>,
    /// Per NVML index.
    states: Vec<GpuState>,
    /// Per NVML index. Its samples borrow the `Nvml` below: emptied in `Drop` before it.
    gpm: Vec<GpmState<GpmSample<'static>>>,
    driver_version: String,
    /// What this collector cannot do here (XID events), for the status.
    detail: String,
    cadence: Cadence,
    /// Boxed and leaked in `open`, freed in `Drop` after `events`.
    nvml: NonNull<Nvml>,
}

// SAFETY: `Nvml` is Send + Sync (nvml-wrapper asserts it) and `EventSet` is Send; the
// pointer is owned by this struct alone, and the collector is used by one thread at a time
// (`&mut self`).
unsafe impl Send for NvmlCollector {}

impl Drop for NvmlCollector {
    fn drop(&mut self) {
        self.events = None;
        self.gpm.clear();
        // SAFETY: from Box::leak in `open`; the event set and the GPM samples, the only
        // things left that borrowed it, are gone, and devices are never kept across calls.
        drop(unsafe { Box::from_raw(self.nvml.as_ptr()) });
    }
}

impl NvmlCollector {
    /// Loads NVML (`library`, default [`DEFAULT_LIBRARY`]) and registers for XID events.
    /// Err: the state to report (unavailable: no library, driver or GPU; failed: NVML would
    /// not initialise) and why.
    pub(crate) fn open(
        library: Option<&Path>,
        cadence: Cadence,
    ) -> Result<Self, (CollectorState, String)> {
        let path = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let shown = path.to_string_lossy();
        let nvml = Nvml::builder().lib_path(path).init().map_err(|e| match e {
            NvmlError::LibloadingError(e) => (
                CollectorState::Unavailable,
                format!("{shown} not found: no NVIDIA driver ({e})"),
            ),
            NvmlError::DriverNotLoaded => (
                CollectorState::Unavailable,
                format!("{shown} loaded but the NVIDIA kernel driver is not"),
            ),
            NvmlError::FailedToLoadSymbol(e) => (
                CollectorState::Failed,
                format!("{shown} is not a usable NVML library: {e}"),
            ),
            e => (
                CollectorState::Failed,
                format!("NVML initialisation failed: {e}"),
            ),
        })?;
        let count = nvml.device_count().map_err(|e| {
            (
                CollectorState::Failed,
                format!("NVML cannot count GPUs: {e}"),
            )
        })?;
        if count == 0 {
            return Err((
                CollectorState::Unavailable,
                "NVML reports no GPU".to_owned(),
            ));
        }
        let driver_version = nvml.sys_driver_version().unwrap_or_default();
        let mut me = Self {
            events: None,
            states: vec![GpuState::default(); count as usize],
            gpm: Vec::new(),
            driver_version,
            detail: String::new(),
            cadence,
            nvml: NonNull::from(Box::leak(Box::new(nvml))),
        };
        me.register_xid_events(count);
        me.ask_gpm_support(count);
        Ok(me)
    }

    /// What the status should say about an available collector.
    pub(crate) fn detail(&self) -> String {
        self.detail.clone()
    }

    /// The library, for the lifetime of `self` (see `Drop`).
    fn nvml(&self) -> &'static Nvml {
        // SAFETY: the Nvml lives until `drop`, which first drops the only 'static borrower
        // (`events`); everything else borrows it for one call only.
        unsafe { self.nvml.as_ref() }
    }

    fn register_xid_events(&mut self, count: u32) {
        let nvml = self.nvml();
        let mut problems = Vec::new();
        let mut registered: Vec<u32> = Vec::new();
        let mut set = match nvml.create_event_set() {
            Ok(s) => Some(s),
            Err(e) => {
                self.detail = format!("XID events not available: {e}");
                return;
            }
        };
        for i in 0..count {
            let device = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!("gpu{i} ({e})"));
                    continue;
                }
            };
            match device.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(_) => {
                    problems.push(format!("gpu{i} (not supported)"));
                    continue;
                }
                Err(e) => {
                    problems.push(format!("gpu{i} ({e})"));
                    continue;
                }
            }
            let Some(s) = set.take() else { break };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
                Ok(s) => {
                    set = Some(s);
                    registered.push(i);
                }
                Err(e) => {
                    problems.push(format!("gpu{i} ({})", e.error));
                    // A failed registration consumes the set: start a new one with the GPUs
                    // registered so far.
                    set = nvml.create_event_set().ok();
                    registered.retain(|&j| {
                        let Some(s) = set.take() else { return false };
                        match nvml
                            .device_by_index(j)
                            .map_err(Into::into)
                            .and_then(|d| d.register_events(EventTypes::CRITICAL_XID_ERROR, s))
                        {
                            Ok(s) => {
                                set = Some(s);
                                true
                            }
                            Err(_) => {
                                set = nvml.create_event_set().ok();
                                false
                            }
                        }
                    });
                }
            }
        }
        for &i in &registered {
            self.states[i as usize].xid_errors = Some(0);
        }
        if !registered.is_empty() {
            self.events = set;
        }
        if !problems.is_empty() {
            self.detail = format!("XID events not supported on {}", problems.join(", "));
        }
    }

    /// Asks every GPU once whether it has GPM, and says in the status which do not.
    fn ask_gpm_support(&mut self, count: u32) {
        let nvml = self.nvml();
        self.gpm.resize_with(count as usize, GpmState::default);
        let mut without = Vec::new();
        for i in 0..count {
            let Ok(device) = nvml.device_by_index(i) else {
                continue;
            };
            let st = &mut self.gpm[i as usize];
            st.supported = match device.gpm_support() {
                Ok(s) => Some(s),
                Err(e) if unsupported(&e) => Some(false),
                // Asked again at the first collection, which notes the error.
                Err(_) => None,
            };
            if st.supported == Some(false) {
                without.push(format!("gpu{i}"));
            }
        }
        if !without.is_empty() {
            let gpm = format!(
                "GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth: Hopper and newer) \
                 not supported on {}",
                without.join(", ")
            );
            self.detail = if self.detail.is_empty() {
                gpm
            } else {
                format!("{}; {gpm}", self.detail)
            };
        }
    }

    /// Counts the XID events that arrived since the last call, without waiting.
    fn drain_xid_events(&mut self, notes: &mut Vec<String>) {
        let Some(set) = &self.events else { return };
        for _ in 0..MAX_EVENTS_PER_COLLECT {
            match set.wait(0) {
                Ok(ev) => {
                    if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let i = match ev.device.index() {
                        Ok(i) => i as usize,
                        Err(e) => {
                            notes.push(format!("XID event from an unknown GPU: {e}"));
                            continue;
                        }
                    };
                    if i >= self.states.len() {
                        self.states.resize(i + 1, GpuState::default());
                    }
                    let st = &mut self.states[i];
                    st.xid_errors = Some(st.xid_errors.unwrap_or(0) + 1);
                    if let Some(XidError::Value(code)) = ev.event_data {
                        st.last_xid = Some(code);
                    }
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    notes.push(format!("XID events: {e}"));
                    break;
                }
            }
        }
    }
}

impl DeviceCollector for NvmlCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn collect(&mut self) -> Result<DeviceSample, DeviceError> {
        let nvml = self.nvml();
        let count = nvml.device_count().map_err(|source| DeviceError::Nvml {
            call: "nvmlDeviceGetCount",
            source,
        })?;
        let mut sample = DeviceSample::default();
        self.drain_xid_events(&mut sample.notes);
        if self.states.len() < count as usize {
            self.states.resize(count as usize, GpuState::default());
        }
        if self.gpm.len() < count as usize {
            self.gpm.resize_with(count as usize, GpmState::default);
        }
        for i in 0..count {
            let device = match nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    sample.notes.push(format!("gpu{i}: {e}"));
                    continue;
                }
            };
            let src = NvmlGpu { nvml, device };
            let state = &mut self.states[i as usize];
            match read_gpu(
                &src,
                &self.driver_version,
                state,
                Instant::now(),
                &self.cadence,
            ) {
                Ok(mut r) => {
                    let label = r.gpu.label();
                    read_gpm(&src, &mut self.gpm[i as usize], &label, &mut r.notes)
                        .apply(&mut r.gpu);
                    sample.gpus.push(r.gpu);
                    sample.processes.extend(r.processes);
                    sample.notes.extend(r.notes);
                }
                Err(e) => sample.notes.push(format!("gpu{i}: {e}")),
            }
        }
        Ok(sample)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    use super::*;

    /// A GPU as a driver would describe it: every answer set by the test.
    struct StandIn {
        index: u32,
        power: fn() -> Result<u32, NvmlError>,
        energy: fn() -> Result<u64, NvmlError>,
        throttle: fn() -> Result<ThrottleReasons, NvmlError>,
        nvlink_state: fn(u32) -> Result<bool, NvmlError>,
        processes: Vec<ProcessInfo>,
        utilization: fn(Option<u64>) -> Result<Vec<ProcessUtilizationSample>, NvmlError>,
        /// The `since` argument of each process_utilization call.
        util_calls: RefCell<Vec<Option<u64>>>,
    }

    fn sample(pid: u32, timestamp: u64, sm_util: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            timestamp,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        }
    }

    fn process(pid: u32, memory: UsedGpuMemory) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: memory,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    impl StandIn {
        /// An H100-like GPU that supports everything.
        fn full() -> Self {
            Self {
                index: 2,
                power: || Ok(350_250),
                energy: || Ok(9_876_543),
                throttle: || Ok(ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_SLOWDOWN),
                nvlink_state: |l| match l {
                    0 | 3 => Ok(true),
                    l if l < 18 => Ok(false),
                    _ => Err(NvmlError::InvalidArg),
                },
                processes: vec![
                    process(100, UsedGpuMemory::Used(3 << 30)),
                    process(200, UsedGpuMemory::Unavailable),
                ],
                utilization: |since| match since {
                    None => Ok(vec![sample(100, 10, 20), sample(100, 30, 45)]),
                    Some(30) => Ok(vec![sample(100, 50, 5)]),
                    Some(_) => Err(NvmlError::NotFound),
                },
                util_calls: RefCell::new(Vec::new()),
            }
        }
    }

    impl GpuSource for StandIn {
        fn index(&self) -> Result<u32, NvmlError> {
            Ok(self.index)
        }
        fn uuid(&self) -> Result<String, NvmlError> {
            Ok(format!("GPU-{}", self.index))
        }
        fn name(&self) -> Result<String, NvmlError> {
            Ok("NVIDIA H100 80GB HBM3".into())
        }
        fn pci_bus_id(&self) -> Result<String, NvmlError> {
            Ok("00000000:18:00.0".into())
        }
        fn minor_number(&self) -> Result<u32, NvmlError> {
            Ok(5)
        }
        fn utilization_rates(&self) -> Result<Utilization, NvmlError> {
            Ok(Utilization { gpu: 87, memory: 4 })
        }
        fn memory_info(&self) -> Result<MemoryInfo, NvmlError> {
            Ok(MemoryInfo {
                free: 60 << 30,
                reserved: 1 << 30,
                total: 80 << 30,
                used: 19 << 30,
                version: 2,
            })
        }
        fn power_usage(&self) -> Result<u32, NvmlError> {
            (self.power)()
        }
        fn total_energy_consumption(&self) -> Result<u64, NvmlError> {
            (self.energy)()
        }
        fn temperature(&self) -> Result<u32, NvmlError> {
            Ok(61)
        }
        fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError> {
            match clock {
                Clock::SM => Ok(1755),
                Clock::Memory => Ok(2619),
                _ => Err(NvmlError::InvalidArg),
            }
        }
        fn pcie_throughput(&self, counter: PcieUtilCounter) -> Result<u32, NvmlError> {
            match counter {
                PcieUtilCounter::Send => Ok(1000),
                PcieUtilCounter::Receive => Ok(250),
            }
        }
        fn ecc_volatile(&self, error: MemoryError) -> Result<u64, NvmlError> {
            match error {
                MemoryError::Corrected => Ok(12),
                MemoryError::Uncorrected => Ok(1),
            }
        }
        fn throttle_reasons(&self) -> Result<ThrottleReasons, NvmlError> {
            (self.throttle)()
        }
        fn nvlink_active(&self, link: u32) -> Result<bool, NvmlError> {
            (self.nvlink_state)(link)
        }
        fn nvlink_data(
            &self,
            link: u32,
        ) -> Result<(Result<u64, NvmlError>, Result<u64, NvmlError>), NvmlError> {
            match link {
                0 => Ok((Ok(100), Ok(200))),
                _ => Ok((Ok(7), Err(NvmlError::NotSupported))),
            }
        }
        fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError> {
            match counter {
                ErrorCounter::DlReplay => Ok(u64::from(link) + 1),
                ErrorCounter::DlCrcData => Err(NvmlError::NotSupported),
                _ => Ok(0),
            }
        }
        fn compute_processes(&self) -> Result<Vec<ProcessInfo>, NvmlError> {
            Ok(self.processes.clone())
        }
        fn process_utilization(
            &self,
            since: Option<u64>,
        ) -> Result<Vec<ProcessUtilizationSample>, NvmlError> {
            self.util_calls.borrow_mut().push(since);
            (self.utilization)(since)
        }
    }

    #[test]
    fn converts_units_and_names() {
        let src = StandIn::full();
        let mut state = GpuState {
            xid_errors: Some(3),
            last_xid: Some(48),
            ..Default::default()
        };
        let r = read_gpu(
            &src,
            "580.65.06",
            &mut state,
            Instant::now(),
            &Cadence::EVERY_TIME,
        )
        .unwrap();
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        let g = &r.gpu;
        assert_eq!(g.index, 2);
        assert_eq!(g.uuid, "GPU-2");
        assert_eq!(g.label(), "gpu2");
        assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.pci_bus_id, "00000000:18:00.0");
        assert_eq!(g.minor_number, Some(5));
        assert_eq!(g.driver_version, "580.65.06");
        assert_eq!(g.utilization_ratio, Some(0.87));
        assert_eq!(g.memory_utilization_ratio, Some(0.04));
        assert_eq!(g.memory_used_bytes, Some(19 << 30));
        assert_eq!(g.memory_free_bytes, Some(60 << 30));
        assert_eq!(g.memory_total_bytes, Some(80 << 30));
        assert_eq!(g.power_watts, Some(350.25));
        assert_eq!(g.energy_millijoules, Some(9_876_543));
        assert_eq!(g.temperature_celsius, Some(61));
        assert_eq!(g.sm_clock_hertz, Some(1_755_000_000));
        assert_eq!(g.memory_clock_hertz, Some(2_619_000_000));
        assert_eq!(g.pcie_tx_bytes_per_second, Some(1000 * 1024));
        assert_eq!(g.pcie_rx_bytes_per_second, Some(250 * 1024));
        assert_eq!(g.ecc_corrected_errors, Some(12));
        assert_eq!(g.ecc_uncorrected_errors, Some(1));
        assert_eq!(
            g.throttle_reasons,
            Some(vec!["sw_power_cap".to_owned(), "hw_slowdown".to_owned()])
        );
        assert_eq!((g.xid_errors, g.last_xid), (Some(3), Some(48)));
        // Links 0 and 3 are active; 3 has no RX counter and neither has CRC data counters.
        assert_eq!(
            g.nvlinks,
            vec![
                NvLinkStats {
                    link: 0,
                    tx_bytes: Some(100 * 1024),
                    rx_bytes: Some(200 * 1024),
                    replay_errors: Some(1),
                    recovery_errors: Some(0),
                    crc_flit_errors: Some(0),
                    crc_data_errors: None,
                },
                NvLinkStats {
                    link: 3,
                    tx_bytes: Some(7 * 1024),
                    rx_bytes: None,
                    replay_errors: Some(4),
                    recovery_errors: Some(0),
                    crc_flit_errors: Some(0),
                    crc_data_errors: None,
                },
            ]
        );
        // Each exported name is one of the names the exporter knows.
        for r in g.throttle_reasons.as_ref().unwrap() {
            assert!(
                ethand_snapshot::devices::THROTTLE_REASONS.contains(&r.as_str()),
                "{r}"
            );
        }
    }

    #[test]
    fn processes_memory_and_newest_sm_share() {
        let src = StandIn::full();
        let mut state = GpuState::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let r = read_gpu(&src, "", &mut state, at(0), &Cadence::EVERY_TIME).unwrap();
        assert_eq!(
            r.processes,
            vec![
                DeviceProcess {
                    pid: 100,
                    device: "gpu2".into(),
                    uuid: "GPU-2".into(),
                    memory_used_bytes: Some(3 << 30),
                    // The newest of its samples (timestamp 30), not the first.
                    utilization_ratio: Some(0.45),
                },
                DeviceProcess {
                    pid: 200,
                    device: "gpu2".into(),
                    uuid: "GPU-2".into(),
                    // NVML_VALUE_NOT_AVAILABLE: unknown, not 0.
                    memory_used_bytes: None,
                    // Listed, but in no sample: no SM time.
                    utilization_ratio: Some(0.0),
                },
            ]
        );
        // The next collection asks only for samples newer than the newest one seen.
        assert_eq!(state.process_util_since, Some(30));
        let r = read_gpu(&src, "", &mut state, at(1000), &Cadence::EVERY_TIME).unwrap();
        assert_eq!(r.processes[0].utilization_ratio, Some(0.05));
        assert_eq!(state.process_util_since, Some(50));
        // Nothing new yet (the driver samples every 1/6 s to 1 s): the last batch stands.
        let r = read_gpu(&src, "", &mut state, at(1500), &Cadence::EVERY_TIME).unwrap();
        assert_eq!(r.processes[0].utilization_ratio, Some(0.05));
        // Nothing new for longer than the driver's sample period: idle.
        let r = read_gpu(&src, "", &mut state, at(4000), &Cadence::EVERY_TIME).unwrap();
        assert_eq!(r.processes[0].utilization_ratio, Some(0.0));
        assert_eq!(
            *src.util_calls.borrow(),
            vec![None, Some(30), Some(50), Some(50)]
        );
    }

    #[test]
    fn expensive_reads_follow_the_cadence_and_are_reported_in_between() {
        let src = StandIn::full();
        let cadence = Cadence {
            counters: Duration::from_secs(10),
            nvlink_errors: Duration::from_secs(30),
        };
        let mut state = GpuState::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let first = read_gpu(&src, "", &mut state, at(0), &cadence).unwrap();
        let every = read_gpu(
            &StandIn::full(),
            "",
            &mut GpuState::default(),
            at(0),
            &Cadence::EVERY_TIME,
        )
        .unwrap();
        // The first collection reads everything.
        assert_eq!(first.gpu, every.gpu);
        assert!(first.gpu.energy_millijoules.is_some() && !first.gpu.nvlinks.is_empty());
        // In between: the last values again, without asking the driver.
        for ms in [1000, 5000, 9999] {
            let r = read_gpu(&src, "", &mut state, at(ms), &cadence).unwrap();
            assert_eq!(r.gpu, first.gpu, "at {ms} ms");
            assert_eq!(r.processes, first.processes, "at {ms} ms");
        }
        assert_eq!(src.util_calls.borrow().len(), 1);
        read_gpu(&src, "", &mut state, at(10_000), &cadence).unwrap();
        assert_eq!(src.util_calls.borrow().len(), 2);
        assert_eq!(state.nvlink_errors_read_at, Some(at(0)));
        read_gpu(&src, "", &mut state, at(20_000), &cadence).unwrap();
        assert_eq!(state.nvlink_errors_read_at, Some(at(0)));
        let r = read_gpu(&src, "", &mut state, at(30_000), &cadence).unwrap();
        assert_eq!(state.nvlink_errors_read_at, Some(at(30_000)));
        assert_eq!(src.util_calls.borrow().len(), 4);
        assert_eq!(r.gpu.nvlinks, every.gpu.nvlinks);
    }

    #[test]
    fn not_supported_is_none_and_silent_other_errors_are_noted() {
        let src = StandIn {
            power: || Err(NvmlError::NotSupported),
            energy: || Err(NvmlError::FailedToLoadSymbol("old driver".into())),
            throttle: || Err(NvmlError::NoPermission),
            nvlink_state: |_| Err(NvmlError::NotSupported),
            utilization: |_| Err(NvmlError::NotSupported),
            ..StandIn::full()
        };
        let r = read_gpu(
            &src,
            "",
            &mut GpuState::default(),
            Instant::now(),
            &Cadence::EVERY_TIME,
        )
        .unwrap();
        let g = &r.gpu;
        assert_eq!(g.power_watts, None);
        assert_eq!(g.energy_millijoules, None);
        assert_eq!(g.throttle_reasons, None);
        assert!(g.nvlinks.is_empty());
        assert_eq!(g.xid_errors, None, "not registered for XID events");
        // Per-process utilization unsupported: None, not 0; memory is still there.
        assert_eq!(r.processes[0].utilization_ratio, None);
        assert_eq!(r.processes[0].memory_used_bytes, Some(3 << 30));
        assert_eq!(
            r.notes,
            vec![format!(
                "gpu2 throttle reasons: {}",
                NvmlError::NoPermission
            )]
        );
    }

    #[test]
    fn no_samples_means_no_sm_time() {
        let src = StandIn {
            utilization: |_| Err(NvmlError::NotFound),
            ..StandIn::full()
        };
        let mut state = GpuState::default();
        let r = read_gpu(&src, "", &mut state, Instant::now(), &Cadence::EVERY_TIME).unwrap();
        assert_eq!(r.processes[0].utilization_ratio, Some(0.0));
        assert_eq!(state.process_util_since, None);
    }

    #[test]
    fn throttle_reason_names() {
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
        assert_eq!(
            throttle_names(ThrottleReasons::all()).len(),
            ethand_snapshot::devices::THROTTLE_REASONS.len()
        );
        assert_eq!(
            throttle_names(ThrottleReasons::all()),
            ethand_snapshot::devices::THROTTLE_REASONS
        );
    }

    #[test]
    fn missing_library_is_unavailable() {
        let Err((state, detail)) = NvmlCollector::open(
            Some(Path::new("/nonexistent/libnvml.so")),
            Cadence::default(),
        ) else {
            panic!("opened a library that does not exist");
        };
        assert_eq!(state, CollectorState::Unavailable);
        assert!(
            detail.starts_with("/nonexistent/libnvml.so not found: no NVIDIA driver ("),
            "{detail}"
        );
    }

    /// Percent values of a GPM stand-in: per metric, the later sample's number times 10.
    type Metrics = fn(u32, u32) -> Result<[Result<f64, NvmlError>; 4], NvmlError>;

    /// A GPU's GPM as a stand-in: samples are numbered 1, 2, ... and count their frees.
    struct GpmStandIn {
        supported: fn() -> Result<bool, NvmlError>,
        /// Given the number of the sample asked for.
        sample: fn(u32) -> Result<(), NvmlError>,
        metrics: Metrics,
        support_calls: Cell<u32>,
        samples: Cell<u32>,
        /// (earlier, later) of each metrics call.
        intervals: RefCell<Vec<(u32, u32)>>,
        freed: Rc<Cell<u32>>,
    }

    /// A sample handle: its number, and the stand-in's free count.
    #[derive(Debug)]
    struct Sample(u32, Rc<Cell<u32>>);

    impl Drop for Sample {
        fn drop(&mut self) {
            self.1.set(self.1.get() + 1);
        }
    }

    impl GpmStandIn {
        /// An H100-like GPU: GPM there, every metric read.
        fn hopper() -> Self {
            Self {
                supported: || Ok(true),
                sample: |_| Ok(()),
                metrics: |_, later| {
                    let p = f64::from(later) * 10.0;
                    Ok([Ok(p), Ok(p + 1.0), Ok(p + 2.0), Ok(p + 3.0)])
                },
                support_calls: Cell::new(0),
                samples: Cell::new(0),
                intervals: RefCell::new(Vec::new()),
                freed: Rc::new(Cell::new(0)),
            }
        }
    }

    impl GpmSource for GpmStandIn {
        type Sample = Sample;
        fn gpm_supported(&self) -> Result<bool, NvmlError> {
            self.support_calls.set(self.support_calls.get() + 1);
            (self.supported)()
        }
        fn gpm_sample(&self) -> Result<Sample, NvmlError> {
            let n = self.samples.get() + 1;
            self.samples.set(n);
            (self.sample)(n).map(|()| Sample(n, self.freed.clone()))
        }
        fn gpm_metrics(
            &self,
            earlier: &Sample,
            later: &Sample,
        ) -> Result<[Result<f64, NvmlError>; 4], NvmlError> {
            self.intervals.borrow_mut().push((earlier.0, later.0));
            (self.metrics)(earlier.0, later.0)
        }
    }

    fn gpm(src: &GpmStandIn, state: &mut GpmState<Sample>) -> (GpmReading, Vec<String>) {
        let mut notes = Vec::new();
        let r = read_gpm(src, state, "gpu0", &mut notes);
        (r, notes)
    }

    fn ratios(a: f64, b: f64, c: f64, d: f64) -> GpmRatios {
        GpmRatios {
            sm_activity: Some(a),
            sm_occupancy: Some(b),
            tensor_activity: Some(c),
            dram_bandwidth: Some(d),
        }
    }

    #[test]
    fn gpm_percent_to_ratio() {
        assert_eq!(gpm_ratio(0.0), Some(0.0));
        assert_eq!(gpm_ratio(50.0), Some(0.5));
        assert_eq!(gpm_ratio(100.0), Some(1.0));
        // Rounding just past the ends: clamped.
        assert_eq!(gpm_ratio(100.3), Some(1.0));
        assert_eq!(gpm_ratio(-0.2), Some(0.0));
        assert_eq!(gpm_ratio(-0.0), Some(0.0));
        // Not a share of anything: dropped, never reported as 0 or 1.
        for bad in [
            101.0,
            250.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(gpm_ratio(bad), None, "{bad}");
        }
    }

    #[test]
    fn intervals_run_between_consecutive_samples() {
        let mut previous = None;
        assert_eq!(next_interval(&mut previous, 1), None, "first: no interval");
        assert_eq!(previous, Some(1));
        assert_eq!(next_interval(&mut previous, 2), Some((1, &2)));
        assert_eq!(next_interval(&mut previous, 3), Some((2, &3)));
        assert_eq!(previous, Some(3));
    }

    #[test]
    fn gpm_first_interval_is_none_then_each_interval_is_read() {
        let src = GpmStandIn::hopper();
        let mut state = GpmState::default();
        let (r, notes) = gpm(&src, &mut state);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(r.supported, Some(true));
        assert_eq!(
            r.ratios,
            GpmRatios::default(),
            "one sample: no interval yet"
        );
        let (r, notes) = gpm(&src, &mut state);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(r.ratios, ratios(0.2, 0.21, 0.22, 0.23));
        let (r, _) = gpm(&src, &mut state);
        assert_eq!(r.ratios, ratios(0.3, 0.31, 0.32, 0.33));
        // Each interval from the previous sample to the new one; support asked once.
        assert_eq!(*src.intervals.borrow(), vec![(1, 2), (2, 3)]);
        assert_eq!(src.support_calls.get(), 1);
        // Only the newest sample is kept; it is freed with the state.
        assert_eq!(src.freed.get(), 2);
        assert_eq!(state.previous.as_ref().map(|s| s.0), Some(3));
        drop(state);
        assert_eq!(src.freed.get(), 3);

        let mut gpu = GpuDevice::default();
        r.apply(&mut gpu);
        assert_eq!(gpu.gpm_supported, Some(true));
        assert_eq!(gpu.sm_activity_ratio, Some(0.3));
        assert_eq!(gpu.sm_occupancy_ratio, Some(0.31));
        assert_eq!(gpu.tensor_activity_ratio, Some(0.32));
        assert_eq!(gpu.dram_bandwidth_ratio, Some(0.33));
    }

    #[test]
    fn gpm_unsupported_is_reported_once_and_silently() {
        for supported in [
            (|| Ok(false)) as fn() -> Result<bool, NvmlError>,
            || Err(NvmlError::NotSupported),
            // A library older than GPM (R520).
            || {
                Err(NvmlError::FailedToLoadSymbol(
                    "nvmlGpmQueryDeviceSupport".into(),
                ))
            },
        ] {
            let src = GpmStandIn {
                supported,
                ..GpmStandIn::hopper()
            };
            let mut state = GpmState::default();
            for _ in 0..3 {
                let (r, notes) = gpm(&src, &mut state);
                assert!(notes.is_empty(), "{notes:?}");
                assert_eq!(r.supported, Some(false));
                assert_eq!(r.ratios, GpmRatios::default());
            }
            assert_eq!(src.support_calls.get(), 1, "asked once");
            assert_eq!(src.samples.get(), 0, "never sampled");
            let mut gpu = GpuDevice::default();
            gpm(&src, &mut state).0.apply(&mut gpu);
            assert_eq!(
                (gpu.gpm_supported, gpu.sm_activity_ratio),
                (Some(false), None)
            );
        }
    }

    #[test]
    fn gpm_support_question_failing_is_noted_and_asked_again() {
        let src = GpmStandIn {
            supported: || Err(NvmlError::Unknown),
            ..GpmStandIn::hopper()
        };
        let mut state = GpmState::default();
        let (r, notes) = gpm(&src, &mut state);
        assert_eq!(r, GpmReading::default());
        assert_eq!(
            notes,
            vec![format!("gpu0 gpm support: {}", NvmlError::Unknown)]
        );
        gpm(&src, &mut state);
        assert_eq!(src.support_calls.get(), 2);
        assert_eq!(src.samples.get(), 0);
    }

    #[test]
    fn gpm_failed_sample_starts_a_new_interval() {
        let src = GpmStandIn {
            // The third sample fails.
            sample: |n| match n {
                3 => Err(NvmlError::GpuLost),
                _ => Ok(()),
            },
            ..GpmStandIn::hopper()
        };
        let mut state = GpmState::default();
        gpm(&src, &mut state);
        assert!(gpm(&src, &mut state).0.ratios.sm_activity.is_some());
        let (r, notes) = gpm(&src, &mut state);
        assert_eq!(r.supported, Some(true));
        assert_eq!(r.ratios, GpmRatios::default());
        assert_eq!(
            notes,
            vec![format!("gpu0 gpm sample: {}", NvmlError::GpuLost)]
        );
        assert!(
            state.previous.is_none(),
            "the interval across the gap is dropped"
        );
        // Sample 4 starts the next interval, sample 5 ends it.
        assert_eq!(gpm(&src, &mut state).0.ratios, GpmRatios::default());
        assert_eq!(
            gpm(&src, &mut state).0.ratios,
            ratios(0.5, 0.51, 0.52, 0.53)
        );
        assert_eq!(*src.intervals.borrow(), vec![(1, 2), (4, 5)]);

        // Sampling unsupported although the GPU has GPM: unsupported now, silently.
        let src = GpmStandIn {
            sample: |_| Err(NvmlError::NotSupported),
            ..GpmStandIn::hopper()
        };
        let mut state = GpmState::default();
        let (r, notes) = gpm(&src, &mut state);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(
            r,
            GpmReading {
                supported: Some(false),
                ratios: GpmRatios::default(),
            }
        );
        gpm(&src, &mut state);
        assert_eq!(src.samples.get(), 2, "tried again");
    }

    #[test]
    fn gpm_bad_metric_values_are_none() {
        let src = GpmStandIn {
            metrics: |_, _| {
                Ok([
                    Ok(f64::NAN),
                    Err(NvmlError::NotSupported),
                    Ok(180.0),
                    Err(NvmlError::Unknown),
                ])
            },
            ..GpmStandIn::hopper()
        };
        let mut state = GpmState::default();
        gpm(&src, &mut state);
        let (r, notes) = gpm(&src, &mut state);
        assert_eq!(r.supported, Some(true));
        assert_eq!(r.ratios, GpmRatios::default());
        // NOT_SUPPORTED for one metric is silent; the rest are noted.
        assert_eq!(
            notes,
            vec![
                "gpu0 gpm sm activity: NaN is not a percentage".to_owned(),
                "gpu0 gpm tensor activity: 180 is not a percentage".to_owned(),
                format!("gpu0 gpm dram bandwidth: {}", NvmlError::Unknown),
            ]
        );

        let src = GpmStandIn {
            metrics: |_, _| Err(NvmlError::InvalidArg),
            ..GpmStandIn::hopper()
        };
        let mut state = GpmState::default();
        gpm(&src, &mut state);
        let (r, notes) = gpm(&src, &mut state);
        assert_eq!(r.ratios, GpmRatios::default());
        assert_eq!(
            notes,
            vec![format!("gpu0 gpm metrics: {}", NvmlError::InvalidArg)]
        );
        // The new sample still starts the next interval.
        assert_eq!(state.previous.as_ref().map(|s| s.0), Some(2));
    }
}
