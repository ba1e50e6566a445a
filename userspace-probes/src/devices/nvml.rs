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
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsStr;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    MAX_XID_EVENTS, NvLinkStats, XidEvent,
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
    /// `nvmlDeviceGetFieldValues`: one call for all `fields`, each a (`fieldId`, `scopeId`)
    /// pair; a value per field, each on its own (unsigned, or signed and not negative).
    fn field_values(&self, fields: &[(u32, u32)])
    -> Result<Vec<Result<u64, NvmlError>>, NvmlError>;
    /// `nvmlDeviceGetNvLinkErrorCounter`.
    fn nvlink_error_counter(&self, link: u32, counter: ErrorCounter) -> Result<u64, NvmlError>;
    /// `nvmlDeviceGetEnforcedPowerLimit`: milliwatts.
    fn enforced_power_limit(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetEncoderUtilization`: percent.
    fn encoder_utilization(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetDecoderUtilization`: percent.
    fn decoder_utilization(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetCurrPcieLinkGeneration`.
    fn pcie_link_generation(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetMaxPcieLinkGeneration`.
    fn pcie_link_generation_max(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetCurrPcieLinkWidth`: lanes.
    fn pcie_link_width(&self) -> Result<u32, NvmlError>;
    /// `nvmlDeviceGetMaxPcieLinkWidth`: lanes.
    fn pcie_link_width_max(&self) -> Result<u32, NvmlError>;
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
    /// The same events by code (an event without a code is only in `xid_errors`).
    pub xid_errors_by_code: BTreeMap<u64, u64>,
    /// Pids with a compute context at this collection and at the one before: an XID drained
    /// now names both (a context the XID killed is only in the earlier list).
    pub pids: BTreeSet<u32>,
    pub previous_pids: BTreeSet<u32>,
    /// Per-link NVLink payload counters (transmit, receive; bytes) at the last counters read,
    /// and when: the start of the next rate interval.
    pub nvlink_totals: BTreeMap<u32, (Option<u64>, Option<u64>)>,
    pub nvlink_totals_at: Option<Instant>,
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
    /// NVLink payload rate, all links, both directions, since the previous counters read.
    pub nvlink_bytes_per_second: Option<f64>,
    /// Fields among these that the GPU does not have, by [`GpuDevice`] field name.
    pub unsupported: BTreeSet<&'static str>,
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
        unsupported: BTreeSet::new(),
    };

    let util = f.field(
        &["utilization_ratio", "memory_utilization_ratio"],
        "utilization",
        src.utilization_rates(),
    );
    let memory = f.field(
        &[
            "memory_used_bytes",
            "memory_free_bytes",
            "memory_total_bytes",
            "memory_reserved_bytes",
        ],
        "memory",
        src.memory_info(),
    );
    let mut gpu = GpuDevice {
        index,
        uuid: uuid.clone(),
        name: f.get("name", src.name()).unwrap_or_default(),
        pci_bus_id: f.get("pci bus id", src.pci_bus_id()).unwrap_or_default(),
        minor_number: f.field(&["minor_number"], "minor number", src.minor_number()),
        driver_version: driver_version.to_owned(),
        utilization_ratio: util.as_ref().map(|u| percent(u.gpu)),
        memory_utilization_ratio: util.as_ref().map(|u| percent(u.memory)),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_free_bytes: memory.as_ref().map(|m| m.free),
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        memory_reserved_bytes: memory.as_ref().map(|m| m.reserved),
        power_watts: f
            .field(&["power_watts"], "power", src.power_usage())
            .map(milliwatts),
        power_limit_watts: f
            .field(
                &["power_limit_watts"],
                "power limit",
                src.enforced_power_limit(),
            )
            .map(milliwatts),
        energy_millijoules: None,
        temperature_celsius: f
            .field(&["temperature_celsius"], "temperature", src.temperature())
            .map(i64::from),
        sm_clock_hertz: f
            .field(&["sm_clock_hertz"], "sm clock", src.clock_info(Clock::SM))
            .map(mhz_to_hertz),
        memory_clock_hertz: f
            .field(
                &["memory_clock_hertz"],
                "memory clock",
                src.clock_info(Clock::Memory),
            )
            .map(mhz_to_hertz),
        encoder_utilization_ratio: f
            .field(
                &["encoder_utilization_ratio"],
                "encoder utilization",
                src.encoder_utilization(),
            )
            .map(percent),
        decoder_utilization_ratio: f
            .field(
                &["decoder_utilization_ratio"],
                "decoder utilization",
                src.decoder_utilization(),
            )
            .map(percent),
        pcie_link_generation: f.field(
            &["pcie_link_generation"],
            "pcie link generation",
            src.pcie_link_generation(),
        ),
        pcie_link_generation_max: f.field(
            &["pcie_link_generation_max"],
            "pcie link generation max",
            src.pcie_link_generation_max(),
        ),
        pcie_link_width: f.field(
            &["pcie_link_width"],
            "pcie link width",
            src.pcie_link_width(),
        ),
        pcie_link_width_max: f.field(
            &["pcie_link_width_max"],
            "pcie link width max",
            src.pcie_link_width_max(),
        ),
        pcie_tx_bytes_per_second: None,
        pcie_rx_bytes_per_second: None,
        nvlinks: Vec::new(),
        ecc_corrected_errors: f.field(
            &["ecc_corrected_errors"],
            "ecc corrected",
            src.ecc_volatile(MemoryError::Corrected),
        ),
        ecc_uncorrected_errors: f.field(
            &["ecc_uncorrected_errors"],
            "ecc uncorrected",
            src.ecc_volatile(MemoryError::Uncorrected),
        ),
        throttle_reasons: f
            .field(
                &["throttle_reasons"],
                "throttle reasons",
                src.throttle_reasons(),
            )
            .map(throttle_names),
        xid_errors: state.xid_errors,
        last_xid: state.last_xid,
        xid_errors_by_code: state.xid_errors_by_code.clone(),
        // GPM needs samples kept across collections: the collector adds them (`read_gpm`).
        gpm_supported: None,
        ..Default::default()
    };
    read_health(src, &mut f, &mut gpu);

    let due = |at: Option<Instant>, every: Duration| {
        at.is_none_or(|t| now.saturating_duration_since(t) >= every)
    };
    if due(state.counters_read_at, cadence.counters) {
        let errors_due = due(state.nvlink_errors_read_at, cadence.nvlink_errors);
        // The counters' own unsupported list, kept with them for the collections between.
        let outer = std::mem::take(&mut f.unsupported);
        let mut counters = read_counters(src, &mut f, state, errors_due, now);
        counters.unsupported = std::mem::replace(&mut f.unsupported, outer);
        state.counters = Some(counters);
        state.counters_read_at = Some(now);
        if errors_due {
            state.nvlink_errors_read_at = Some(now);
        }
    }
    let counters = state.counters.clone().unwrap_or_default();
    f.unsupported.extend(&counters.unsupported);
    gpu.energy_millijoules = counters.energy_millijoules;
    gpu.pcie_tx_bytes_per_second = counters.pcie_tx_bytes_per_second;
    gpu.pcie_rx_bytes_per_second = counters.pcie_rx_bytes_per_second;
    gpu.nvlink_bytes_per_second = counters.nvlink_bytes_per_second;
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
    let processes: Vec<DeviceProcess> = f
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
    state.previous_pids =
        std::mem::replace(&mut state.pids, processes.iter().map(|p| p.pid).collect());
    gpu.unsupported = f.unsupported.iter().map(|s| (*s).to_owned()).collect();

    Ok(GpuReading {
        gpu,
        processes,
        notes,
    })
}

/// The health counters `nvmlDeviceGetFieldValues` gives, in one call: field id and the
/// [`GpuDevice`] field it fills.
const HEALTH_FIELDS: [(u32, &str); 9] = {
    use nvml_wrapper_sys::bindings::field_id::*;
    [
        (NVML_FI_DEV_MEMORY_TEMP, "memory_temperature_celsius"),
        (NVML_FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replays"),
        (NVML_FI_DEV_REMAPPED_COR, "remapped_rows_correctable"),
        (NVML_FI_DEV_REMAPPED_UNC, "remapped_rows_uncorrectable"),
        (NVML_FI_DEV_REMAPPED_PENDING, "row_remap_pending"),
        (NVML_FI_DEV_REMAPPED_FAILURE, "row_remap_failed"),
        (NVML_FI_DEV_RETIRED_SBE, "retired_pages_single_bit"),
        (NVML_FI_DEV_RETIRED_DBE, "retired_pages_double_bit"),
        (NVML_FI_DEV_RETIRED_PENDING, "retired_pages_pending"),
    ]
};

/// Memory temperature, PCIe replays, row remapping and page retirement: one
/// `nvmlDeviceGetFieldValues` call, read every collection. Measured on an H200 (driver
/// 580.159, 9 fields): ~175-200 µs of CPU per call, so ~1.5 ms per collection on 8 GPUs. That
/// H200 answers memory temperature and PCIe replays as UNSIGNED_INT, the remap fields as
/// UNSIGNED_LONG_LONG and page retirement NOT_SUPPORTED.
fn read_health(src: &impl GpuSource, f: &mut Fields<'_>, gpu: &mut GpuDevice) {
    let ids: Vec<(u32, u32)> = HEALTH_FIELDS.iter().map(|(id, _)| (*id, 0)).collect();
    let values = match src.field_values(&ids) {
        Ok(v) => v,
        Err(e) => {
            let names: Vec<&'static str> = HEALTH_FIELDS.iter().map(|(_, n)| *n).collect();
            f.field::<()>(&names, "health fields", Err(e));
            return;
        }
    };
    let mut v = HEALTH_FIELDS
        .iter()
        .zip(values.into_iter().chain(std::iter::repeat_with(|| {
            Err(NvmlError::UnexpectedVariant(0))
        })))
        .map(|((_, name), r)| f.field(&[*name], name, r));
    let mut next = || v.next().flatten();
    gpu.memory_temperature_celsius = next().and_then(|t| i64::try_from(t).ok());
    gpu.pcie_replays = next();
    gpu.remapped_rows_correctable = next();
    gpu.remapped_rows_uncorrectable = next();
    gpu.row_remap_pending = next().map(|b| b != 0);
    gpu.row_remap_failed = next().map(|b| b != 0);
    gpu.retired_pages_single_bit = next();
    gpu.retired_pages_double_bit = next();
    gpu.retired_pages_pending = next().map(|b| b != 0);
}

/// The expensive reads (see [`Cadence`]); the NVLink error counters only when `errors_due`.
fn read_counters(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    state: &mut GpuState,
    errors_due: bool,
    now: Instant,
) -> Counters {
    use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    };
    let mut nvlinks = Vec::new();
    for link in 0..MAX_NVLINKS {
        // InvalidArg: no such link on this GPU.
        match src.nvlink_active(link) {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::InvalidArg) => continue,
            Err(e) => {
                f.field::<()>(
                    &["nvlinks", "nvlink_bytes_per_second"],
                    &format!("nvlink {link} state"),
                    Err(e),
                );
                continue;
            }
        }
        let what = format!("nvlink {link}");
        let data = src.field_values(&[
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
            (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
        ]);
        let (tx, rx) = match data {
            Ok(v) => {
                let mut v = v.into_iter();
                let mut next = || {
                    let r = v.next().unwrap_or(Err(NvmlError::UnexpectedVariant(0)));
                    f.get(&what, r)
                };
                (next(), next())
            }
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
    let nvlink_bytes_per_second = nvlink_rate(state, &nvlinks, now);

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
        energy_millijoules: f.field(
            &["energy_millijoules"],
            "energy",
            src.total_energy_consumption(),
        ),
        pcie_tx_bytes_per_second: f
            .field(
                &["pcie_tx_bytes_per_second"],
                "pcie tx",
                src.pcie_throughput(PcieUtilCounter::Send),
            )
            .map(kib),
        pcie_rx_bytes_per_second: f
            .field(
                &["pcie_rx_bytes_per_second"],
                "pcie rx",
                src.pcie_throughput(PcieUtilCounter::Receive),
            )
            .map(kib),
        nvlinks,
        sm_share,
        nvlink_bytes_per_second,
        unsupported: BTreeSet::new(),
    }
}

/// NVLink payload rate over all active links, both directions, between the previous counters
/// read and this one (`nvlinks`, which become the start of the next interval). None at the
/// first read, without links or counters in common, and when a counter went backwards (the
/// driver was reloaded: the totals restarted).
fn nvlink_rate(state: &mut GpuState, nvlinks: &[NvLinkStats], now: Instant) -> Option<f64> {
    let totals: BTreeMap<u32, (Option<u64>, Option<u64>)> = nvlinks
        .iter()
        .map(|l| (l.link, (l.tx_bytes, l.rx_bytes)))
        .collect();
    let previous = std::mem::replace(&mut state.nvlink_totals, totals);
    let since = state.nvlink_totals_at.replace(now)?;
    let seconds = now.saturating_duration_since(since).as_secs_f64();
    if seconds <= 0.0 {
        return None;
    }
    let mut bytes = 0u64;
    let mut any = false;
    for (link, (tx, rx)) in &state.nvlink_totals {
        let Some((tx0, rx0)) = previous.get(link) else {
            continue;
        };
        for (new, old) in [(tx, tx0), (rx, rx0)] {
            if let (Some(new), Some(old)) = (new, old) {
                bytes = bytes.saturating_add(new.checked_sub(*old)?);
                any = true;
            }
        }
    }
    any.then(|| bytes as f64 / seconds)
}

mod gpm;
pub use gpm::{
    GPM_FIELDS, GPM_METRICS, GpmRatios, GpmReading, GpmSource, GpmState, GpmValues,
    gpm_mib_per_second, gpm_ratio, next_interval, read_gpm,
};

/// Turns per-field errors into `None`, noting the ones that are not "not supported".
struct Fields<'a> {
    label: &'a str,
    notes: &'a mut Vec<String>,
    /// [`GpuDevice`] fields found unsupported so far.
    unsupported: BTreeSet<&'static str>,
}

impl Fields<'_> {
    /// As [`Fields::get`], and lists `fields` (what `r` fills) as unsupported when it is.
    fn field<T>(
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

fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1e3
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
    fn field_values(
        &self,
        fields: &[(u32, u32)],
    ) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
        use nvml_wrapper_sys::bindings::{
            nvmlFieldValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT as SINT,
            nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG as SLONGLONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UINT,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as ULONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as ULONGLONG,
        };
        // nvml-wrapper's field_values_for() cannot set scopeId (the NVLink), so call
        // nvmlDeviceGetFieldValues through the bindings it loaded. The one raw NVML call.
        let get = self
            .nvml
            .lib()
            .nvmlDeviceGetFieldValues
            .as_ref()
            .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let count = i32::try_from(fields.len()).map_err(|_| NvmlError::InvalidArg)?;
        let mut values: Vec<nvmlFieldValue_t> = fields
            .iter()
            .map(|&(id, scope)| {
                // SAFETY: nvmlFieldValue_t is plain C data; all zeroes is a valid value.
                let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                v.fieldId = id;
                v.scopeId = scope;
                v
            })
            .collect();
        // SAFETY: the handle is valid while `self.device` lives (it borrows the Nvml that
        // loaded the library) and `values` holds the `count` entries NVML fills.
        nvml_try(unsafe { get(self.device.handle(), count, values.as_mut_ptr()) })?;
        let read = |v: &nvmlFieldValue_t| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: `valueType` names the union member NVML wrote.
            let signed = unsafe {
                match v.valueType {
                    ULONGLONG => return Ok(v.value.ullVal),
                    // c_ulong is 32 bits on some targets.
                    #[allow(clippy::useless_conversion)]
                    ULONG => return Ok(u64::from(v.value.ulVal)),
                    UINT => return Ok(u64::from(v.value.uiVal)),
                    SLONGLONG => v.value.sllVal,
                    SINT => i64::from(v.value.siVal),
                    other => return Err(NvmlError::UnexpectedVariant(other)),
                }
            };
            // A count or a temperature below zero is not one: the driver's placeholder.
            u64::try_from(signed).map_err(|_| NvmlError::UnexpectedVariant(v.valueType))
        };
        Ok(values.iter().map(read).collect())
    }
    fn enforced_power_limit(&self) -> Result<u32, NvmlError> {
        self.device.enforced_power_limit()
    }
    fn encoder_utilization(&self) -> Result<u32, NvmlError> {
        self.device.encoder_utilization().map(|u| u.utilization)
    }
    fn decoder_utilization(&self) -> Result<u32, NvmlError> {
        self.device.decoder_utilization().map(|u| u.utilization)
    }
    fn pcie_link_generation(&self) -> Result<u32, NvmlError> {
        self.device.current_pcie_link_gen()
    }
    fn pcie_link_generation_max(&self) -> Result<u32, NvmlError> {
        self.device.max_pcie_link_gen()
    }
    fn pcie_link_width(&self) -> Result<u32, NvmlError> {
        self.device.current_pcie_link_width()
    }
    fn pcie_link_width_max(&self) -> Result<u32, NvmlError> {
        self.device.max_pcie_link_width()
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
    ) -> Result<GpmValues, NvmlError> {
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
    xid_events: XidRing,
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
            xid_events: XidRing::default(),
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
                "GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth, graphics, PCIe \
                 rates: Hopper and newer) not supported on {}",
                without.join(", ")
            );
            self.detail = if self.detail.is_empty() {
                gpm
            } else {
                format!("{}; {gpm}", self.detail)
            };
        }
    }

    /// Counts the XID events that arrived since the last call, without waiting, and keeps each
    /// in the ring with the pids its GPU had at this collection and the one before (so call
    /// it after the GPUs were read). `uuids`: the UUIDs just read, by index.
    fn drain_xid_events(&mut self, uuids: &BTreeMap<u32, String>, notes: &mut Vec<String>) {
        let Some(set) = &self.events else { return };
        let mut drained = Vec::new();
        for _ in 0..MAX_EVENTS_PER_COLLECT {
            match set.wait(0) {
                Ok(ev) => {
                    if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let i = match ev.device.index() {
                        Ok(i) => i,
                        Err(e) => {
                            notes.push(format!("XID event from an unknown GPU: {e}"));
                            continue;
                        }
                    };
                    let code = match ev.event_data {
                        Some(XidError::Value(code)) => Some(code),
                        _ => None,
                    };
                    let uuid = uuids
                        .get(&i)
                        .cloned()
                        .unwrap_or_else(|| ev.device.uuid().unwrap_or_default());
                    drained.push((i, uuid, code));
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    notes.push(format!("XID events: {e}"));
                    break;
                }
            }
        }
        let now = unix_ns_now();
        for (i, uuid, code) in drained {
            let i = i as usize;
            if i >= self.states.len() {
                self.states.resize(i + 1, GpuState::default());
            }
            self.xid_events
                .record(&mut self.states[i], i as u32, uuid, code, now);
        }
    }
}

/// The most recent XID events, oldest first (at most [`MAX_XID_EVENTS`]), numbered from 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct XidRing {
    events: VecDeque<XidEvent>,
    seq: u64,
}

impl XidRing {
    /// Counts one XID event of GPU `gpu` in its `state` and, when it has a code, keeps it
    /// with the pids of the GPU's last two collections, dropping the oldest when full.
    pub fn record(
        &mut self,
        state: &mut GpuState,
        gpu: u32,
        uuid: String,
        code: Option<u64>,
        drained_unix_ns: u64,
    ) {
        state.xid_errors = Some(state.xid_errors.unwrap_or(0) + 1);
        let Some(code) = code else { return };
        state.last_xid = Some(code);
        *state.xid_errors_by_code.entry(code).or_insert(0) += 1;
        self.seq += 1;
        if self.events.len() >= MAX_XID_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(XidEvent {
            seq: self.seq,
            gpu,
            uuid,
            xid: code,
            drained_unix_ns,
            pids: state.previous_pids.union(&state.pids).copied().collect(),
        });
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<XidEvent> {
        self.events.iter().cloned().collect()
    }
}

fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
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
                    r.gpu.unsupported.sort();
                    r.gpu.unsupported.dedup();
                    sample.gpus.push(r.gpu);
                    sample.processes.extend(r.processes);
                    sample.notes.extend(r.notes);
                }
                Err(e) => sample.notes.push(format!("gpu{i}: {e}")),
            }
        }
        // After the reads: an event's pids include this collection's processes.
        let uuids = sample
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect();
        self.drain_xid_events(&uuids, &mut sample.notes);
        for g in &mut sample.gpus {
            if let Some(st) = self.states.get(g.index as usize) {
                g.xid_errors = st.xid_errors;
                g.last_xid = st.last_xid;
                g.xid_errors_by_code = st.xid_errors_by_code.clone();
            }
        }
        sample.xid_events = self.xid_events.events();
        Ok(sample)
    }
}

#[cfg(test)]
mod tests;
