use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, MemoryError, PcieUtilCounter};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{
    MemoryInfo, ProcessInfo, ProcessUtilizationSample, Utilization,
};

use super::fields::throttle_names;
use super::*;
use crate::devices::{
    CollectorState, DeviceProcess, GpuDevice, MAX_XID_EVENTS, NvLinkStats, XidEvent,
};

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
    encoder: fn() -> Result<u32, NvmlError>,
    /// A health field's value by NVML field id.
    health: fn(u32) -> Result<u64, NvmlError>,
    /// Added to every NVLink traffic counter (KiB), to make traffic between reads.
    nvlink_kib: Cell<u64>,
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
            encoder: || Ok(12),
            health: |id| {
                use nvml_wrapper_sys::bindings::field_id::*;
                match id {
                    NVML_FI_DEV_MEMORY_TEMP => Ok(71),
                    NVML_FI_DEV_PCIE_REPLAY_COUNTER => Ok(5),
                    NVML_FI_DEV_REMAPPED_COR => Ok(2),
                    NVML_FI_DEV_REMAPPED_UNC => Ok(1),
                    NVML_FI_DEV_REMAPPED_PENDING => Ok(1),
                    NVML_FI_DEV_REMAPPED_FAILURE => Ok(0),
                    // Pages are retired before Ampere only.
                    _ => Err(NvmlError::NotSupported),
                }
            },
            nvlink_kib: Cell::new(0),
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
    fn field_values(
        &self,
        fields: &[(u32, u32)],
    ) -> Result<Vec<Result<u64, NvmlError>>, NvmlError> {
        use nvml_wrapper_sys::bindings::field_id::{
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX as RX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX as TX,
        };
        let extra = self.nvlink_kib.get();
        Ok(fields
            .iter()
            .map(|&(id, scope)| match (id, scope) {
                (TX, 0) => Ok(100 + extra),
                (RX, 0) => Ok(200 + extra),
                (TX, _) => Ok(7 + extra),
                (RX, _) => Err(NvmlError::NotSupported),
                (id, 0) => (self.health)(id),
                _ => Err(NvmlError::InvalidArg),
            })
            .collect())
    }
    fn enforced_power_limit(&self) -> Result<u32, NvmlError> {
        Ok(700_000)
    }
    fn encoder_utilization(&self) -> Result<u32, NvmlError> {
        (self.encoder)()
    }
    fn decoder_utilization(&self) -> Result<u32, NvmlError> {
        Ok(3)
    }
    fn pcie_link_generation(&self) -> Result<u32, NvmlError> {
        Ok(4)
    }
    fn pcie_link_generation_max(&self) -> Result<u32, NvmlError> {
        Ok(5)
    }
    fn pcie_link_width(&self) -> Result<u32, NvmlError> {
        Ok(8)
    }
    fn pcie_link_width_max(&self) -> Result<u32, NvmlError> {
        Ok(16)
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
    assert_eq!(g.memory_reserved_bytes, Some(1 << 30));
    assert_eq!(g.power_limit_watts, Some(700.0));
    assert_eq!(g.encoder_utilization_ratio, Some(0.12));
    assert_eq!(g.decoder_utilization_ratio, Some(0.03));
    assert_eq!(
        (g.pcie_link_generation, g.pcie_link_generation_max),
        (Some(4), Some(5))
    );
    assert_eq!(
        (g.pcie_link_width, g.pcie_link_width_max),
        (Some(8), Some(16))
    );
    assert_eq!(g.memory_temperature_celsius, Some(71));
    assert_eq!(g.pcie_replays, Some(5));
    assert_eq!(g.remapped_rows_correctable, Some(2));
    assert_eq!(g.remapped_rows_uncorrectable, Some(1));
    assert_eq!(g.row_remap_pending, Some(true));
    assert_eq!(g.row_remap_failed, Some(false));
    // Not supported on this GPU: absent, and listed.
    assert_eq!(g.retired_pages_single_bit, None);
    assert_eq!(g.retired_pages_double_bit, None);
    assert_eq!(g.retired_pages_pending, None);
    assert_eq!(
        g.unsupported,
        [
            "retired_pages_double_bit",
            "retired_pages_pending",
            "retired_pages_single_bit"
        ]
    );
    // One read: no NVLink rate yet.
    assert_eq!(g.nvlink_bytes_per_second, None);
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
        encoder: || Err(NvmlError::FunctionNotFound),
        health: |id| match id {
            nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_PCIE_REPLAY_COUNTER => {
                Err(NvmlError::GpuLost)
            }
            _ => Err(NvmlError::NotSupported),
        },
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
    assert_eq!(g.encoder_utilization_ratio, None);
    assert_eq!(g.pcie_replays, None);
    assert_eq!(g.memory_temperature_celsius, None);
    assert_eq!(g.nvlink_bytes_per_second, None);
    // Per-process utilization unsupported: None, not 0; memory is still there.
    assert_eq!(r.processes[0].utilization_ratio, None);
    assert_eq!(r.processes[0].memory_used_bytes, Some(3 << 30));
    // Every unsupported field by name, sorted; the failed ones are notes instead.
    assert_eq!(
        g.unsupported,
        [
            "encoder_utilization_ratio",
            "energy_millijoules",
            "memory_temperature_celsius",
            "nvlink_bytes_per_second",
            "nvlinks",
            "power_watts",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "retired_pages_double_bit",
            "retired_pages_pending",
            "retired_pages_single_bit",
            "row_remap_failed",
            "row_remap_pending",
        ]
    );
    assert_eq!(
        r.notes,
        vec![
            format!("gpu2 throttle reasons: {}", NvmlError::NoPermission),
            format!("gpu2 pcie_replays: {}", NvmlError::GpuLost),
        ]
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

/// Values of a GPM stand-in, given the numbers of the earlier and later samples.
type Metrics = fn(u32, u32) -> Result<GpmValues, NvmlError>;

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
            // Percent: the later sample's number times 10, plus the metric's position;
            // PCIe: that many MiB/s times 100.
            metrics: |_, later| {
                let p = f64::from(later) * 10.0;
                Ok([
                    Ok(p),
                    Ok(p + 1.0),
                    Ok(p + 2.0),
                    Ok(p + 3.0),
                    Ok(p + 4.0),
                    Ok(p * 100.0),
                    Ok(p * 100.0 + 0.5),
                    Ok(p + 5.0),
                    Ok(p + 6.0),
                    Ok(p + 7.0),
                ])
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
    fn gpm_metrics(&self, earlier: &Sample, later: &Sample) -> Result<GpmValues, NvmlError> {
        self.intervals.borrow_mut().push((earlier.0, later.0));
        (self.metrics)(earlier.0, later.0)
    }
}

fn gpm(src: &GpmStandIn, state: &mut GpmState<Sample>) -> (GpmReading, Vec<String>) {
    let mut notes = Vec::new();
    let r = read_gpm(src, state, "gpu0", &mut notes);
    (r, notes)
}

const MIB: f64 = 1024.0 * 1024.0;

/// What [`GpmStandIn::hopper`] gives for the interval ending at sample `later`.
fn ratios(later: u32) -> GpmRatios {
    let p = f64::from(later) * 10.0;
    GpmRatios {
        sm_activity: Some(p / 100.0),
        sm_occupancy: Some((p + 1.0) / 100.0),
        tensor_activity: Some((p + 2.0) / 100.0),
        dram_bandwidth: Some((p + 3.0) / 100.0),
        graphics_activity: Some((p + 4.0) / 100.0),
        pcie_tx_bytes_per_second: Some(p * 100.0 * MIB),
        pcie_rx_bytes_per_second: Some((p * 100.0 + 0.5) * MIB),
        fp64_activity: Some((p + 5.0) / 100.0),
        fp32_activity: Some((p + 6.0) / 100.0),
        fp16_activity: Some((p + 7.0) / 100.0),
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
    assert_eq!(r.ratios, ratios(2));
    assert_eq!(r.ratios.pcie_tx_bytes_per_second, Some(2000.0 * MIB));
    let (r, _) = gpm(&src, &mut state);
    assert_eq!(r.ratios, ratios(3));
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
    assert_eq!(gpu.graphics_activity_ratio, Some(0.34));
    assert_eq!(gpu.pcie_tx_average_bytes_per_second, Some(3000.0 * MIB));
    assert_eq!(gpu.pcie_rx_average_bytes_per_second, Some(3000.5 * MIB));
    assert_eq!(gpu.fp64_activity_ratio, Some(0.35));
    assert_eq!(gpu.fp32_activity_ratio, Some(0.36));
    assert_eq!(gpu.fp16_activity_ratio, Some(0.37));
    assert!(gpu.unsupported.is_empty());
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
        // Every GPM field listed, sorted.
        let mut all: Vec<String> = GPM_FIELDS.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(gpu.unsupported, all);
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
    assert_eq!(gpm(&src, &mut state).0.ratios, ratios(5));
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
            unsupported: GPM_FIELDS.to_vec(),
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
                Ok(40.0),
                Ok(-3.0),
                Err(NvmlError::NotSupported),
                Ok(12.5),
                Err(NvmlError::NotSupported),
                Ok(100.4),
            ])
        },
        ..GpmStandIn::hopper()
    };
    let mut state = GpmState::default();
    gpm(&src, &mut state);
    let (r, notes) = gpm(&src, &mut state);
    assert_eq!(r.supported, Some(true));
    // Each metric on its own: the good one is there.
    assert_eq!(
        r.ratios,
        GpmRatios {
            graphics_activity: Some(0.4),
            fp64_activity: Some(0.125),
            // Rounding past 100 %: clamped.
            fp16_activity: Some(1.0),
            ..Default::default()
        }
    );
    // NOT_SUPPORTED for one metric is silent (and listed); the rest are noted.
    assert_eq!(
        r.unsupported,
        [
            "fp32_activity_ratio",
            "pcie_rx_average_bytes_per_second",
            "sm_occupancy_ratio"
        ]
    );
    assert_eq!(
        notes,
        vec![
            "gpu0 gpm sm activity ratio: NaN is out of range".to_owned(),
            "gpu0 gpm tensor activity ratio: 180 is out of range".to_owned(),
            format!("gpu0 gpm dram bandwidth ratio: {}", NvmlError::Unknown),
            "gpu0 gpm pcie tx average bytes per second: -3 is out of range".to_owned(),
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

#[test]
fn gpm_pcie_rates_are_mib_per_second() {
    assert_eq!(gpm_mib_per_second(0.0), Some(0.0));
    assert_eq!(gpm_mib_per_second(1.5), Some(1.5 * MIB));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(gpm_mib_per_second(bad), None, "{bad}");
    }
}

#[test]
fn nvlink_rate_between_two_counter_reads() {
    let src = StandIn::full();
    let mut state = GpuState::default();
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let r = read_gpu(&src, "", &mut state, at(0), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(r.gpu.nvlink_bytes_per_second, None, "first read");
    // 2 s later every counter is 1000 KiB higher: link 0 tx + rx, link 3 tx (no rx).
    src.nvlink_kib.set(1000);
    let r = read_gpu(&src, "", &mut state, at(2000), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(
        r.gpu.nvlink_bytes_per_second,
        Some(3.0 * 1000.0 * 1024.0 / 2.0)
    );
    // A counter went backwards (driver reloaded): no rate this time, then again.
    src.nvlink_kib.set(0);
    let r = read_gpu(&src, "", &mut state, at(3000), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(r.gpu.nvlink_bytes_per_second, None);
    src.nvlink_kib.set(10);
    let r = read_gpu(&src, "", &mut state, at(4000), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(r.gpu.nvlink_bytes_per_second, Some(3.0 * 10.0 * 1024.0));
    // Between counter reads the last rate is reported again.
    let cadence = Cadence {
        counters: Duration::from_secs(10),
        ..Cadence::EVERY_TIME
    };
    let r = read_gpu(&src, "", &mut state, at(4500), &cadence).unwrap();
    assert_eq!(r.gpu.nvlink_bytes_per_second, Some(3.0 * 10.0 * 1024.0));
}

#[test]
fn pids_of_the_last_two_collections_are_kept() {
    let mut src = StandIn::full();
    let mut state = GpuState::default();
    read_gpu(&src, "", &mut state, Instant::now(), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(state.pids, BTreeSet::from([100, 200]));
    assert!(state.previous_pids.is_empty());
    // Process 100 died (say, killed by an XID).
    src.processes.remove(0);
    read_gpu(&src, "", &mut state, Instant::now(), &Cadence::EVERY_TIME).unwrap();
    assert_eq!(state.pids, BTreeSet::from([200]));
    assert_eq!(state.previous_pids, BTreeSet::from([100, 200]));
}

#[test]
fn xid_events_are_counted_by_code_and_kept_in_a_ring() {
    let mut ring = XidRing::default();
    let mut state = GpuState {
        xid_errors: Some(0),
        pids: BTreeSet::from([4343]),
        previous_pids: BTreeSet::from([4242, 4343]),
        ..Default::default()
    };
    ring.record(&mut state, 0, "GPU-0".into(), Some(79), 11);
    ring.record(&mut state, 0, "GPU-0".into(), Some(13), 12);
    // No code (NVML's 999): counted, but neither by code nor in the ring.
    ring.record(&mut state, 0, "GPU-0".into(), None, 13);
    ring.record(&mut state, 0, "GPU-0".into(), Some(79), 14);
    assert_eq!(state.xid_errors, Some(4));
    assert_eq!(state.last_xid, Some(79));
    assert_eq!(state.xid_errors_by_code, BTreeMap::from([(13, 1), (79, 2)]));
    let events = ring.events();
    assert_eq!(
        events.iter().map(|e| (e.seq, e.xid)).collect::<Vec<_>>(),
        [(1, 79), (2, 13), (3, 79)]
    );
    assert_eq!(
        events[0],
        XidEvent {
            seq: 1,
            gpu: 0,
            uuid: "GPU-0".into(),
            xid: 79,
            drained_unix_ns: 11,
            pids: vec![4242, 4343],
        }
    );
    // Full: the oldest goes, the numbering goes on.
    for i in 0..MAX_XID_EVENTS as u64 {
        ring.record(&mut state, 1, "GPU-1".into(), Some(48), 100 + i);
    }
    let events = ring.events();
    assert_eq!(events.len(), MAX_XID_EVENTS);
    assert_eq!(events[0].seq, 4);
    assert_eq!(events.last().unwrap().seq, 3 + MAX_XID_EVENTS as u64);
}
