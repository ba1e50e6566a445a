//! [`read_gpu`]: one GPU's reading, a pure function over [`GpuSource`].
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::counters::read_counters;
use super::fields::{Fields, mhz_to_hertz, milliwatts, percent, throttle_names};
use super::{Cadence, GpuSource, GpuState};
use crate::devices::{DeviceProcess, GpuDevice};

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
    let mut gpu = read_gauges(src, &mut f, index, &uuid, driver_version, state);
    read_health(src, &mut f, &mut gpu);
    let sm_share = apply_counters(src, &mut f, state, now, cadence, &mut gpu);
    let processes = read_processes(src, &mut f, &label, &uuid, sm_share.as_ref());
    state.previous_pids =
        std::mem::replace(&mut state.pids, processes.iter().map(|p| p.pid).collect());
    gpu.unsupported = f.unsupported.iter().map(|s| (*s).to_owned()).collect();

    Ok(GpuReading {
        gpu,
        processes,
        notes,
    })
}

/// The cheap gauges, read at every collection: name and bus, utilization, memory, power and
/// its limit, temperature, clocks, encoder/decoder, PCIe link, ECC and throttling; the XID
/// counts as the collector last counted them. The expensive reads are left empty.
fn read_gauges(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    index: u32,
    uuid: &str,
    driver_version: &str,
    state: &GpuState,
) -> GpuDevice {
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
    GpuDevice {
        index,
        uuid: uuid.to_owned(),
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
    }
}

/// Makes the expensive reads when `cadence` says they are due, and fills `gpu` with their
/// latest values (each link's error counters from their own, slower, read). Returns the SM
/// share per pid of that read.
fn apply_counters(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    state: &mut GpuState,
    now: Instant,
    cadence: &Cadence,
    gpu: &mut GpuDevice,
) -> Option<BTreeMap<u32, f64>> {
    let due = |at: Option<Instant>, every: Duration| {
        at.is_none_or(|t| now.saturating_duration_since(t) >= every)
    };
    if due(state.counters_read_at, cadence.counters) {
        let errors_due = due(state.nvlink_errors_read_at, cadence.nvlink_errors);
        // The counters' own unsupported list, kept with them for the collections between.
        let outer = std::mem::take(&mut f.unsupported);
        let mut counters = read_counters(src, f, state, errors_due, now);
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
    counters.sm_share
}

/// The processes with a compute context on the GPU, each with its SM share (`sm_share`; 0
/// for a pid it lacks, None when the driver would not say).
fn read_processes(
    src: &impl GpuSource,
    f: &mut Fields<'_>,
    label: &str,
    uuid: &str,
    sm_share: Option<&BTreeMap<u32, f64>>,
) -> Vec<DeviceProcess> {
    let newest_util = |pid: u32| sm_share.map(|share| share.get(&pid).copied().unwrap_or(0.0));
    f.get("processes", src.compute_processes())
        .unwrap_or_default()
        .into_iter()
        .map(|p| DeviceProcess {
            pid: p.pid,
            device: label.to_owned(),
            uuid: uuid.to_owned(),
            memory_used_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            utilization_ratio: newest_util(p.pid),
        })
        .collect()
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
