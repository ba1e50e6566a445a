//! Prometheus families for GPUs and NPUs ([`DevicesSnapshot`]): `ethand_gpu_*`,
//! `ethand_npu_*`, per-process device memory and the collectors' state, plus, on request,
//! the names and labels dcgm-exporter uses (`DCGM_FI_DEV_*`, and `DCGM_FI_PROF_*` for the
//! GPM ratios) so that existing dashboards keep working.
//!
//! A field the driver did not give (`None`) emits no sample. GPU series carry `gpu` ("gpu0")
//! and `uuid`; NPU series `npu` ("npu0") and `uuid`; the identity labels (model, PCI bus,
//! driver) are on `ethand_gpu_info` / `ethand_npu_info` only. Per-process series are bounded:
//! per device, the [`MAX_PROCESSES_PER_DEVICE`] processes with the most device memory keep
//! their pid, the rest are summed into `pid="other"`.
//!
//! The DCGM aliases keep DCGM's units (percent, MiB, MHz, KB/s, mJ; the `DCGM_FI_PROF_*`
//! profiling fields are 0-1 ratios) and are all gauges:
//! dcgm-exporter types some of them as counters without a `_total` suffix, which this
//! client cannot emit under the same name. Their `modelName` label is camelCase, which
//! `promtool check metrics` reports; that is dcgm-exporter's name, kept on purpose.
use std::collections::BTreeMap;

use crate::prometheus::Exposition;

use crate::prometheus::{Desc, Family, Labels, counter, gauge, labels};
use ethand_snapshot::devices::{DevicesSnapshot, GpuDevice, NpuDevice, THROTTLE_REASONS};

/// Per device, processes beyond this many (ranked by device memory) are summed into
/// `pid="other"`.
pub(crate) const MAX_PROCESSES_PER_DEVICE: usize = 32;

const COLLECTOR_UP: Desc = gauge(
    "ethand_device_collector_up",
    "1 when the device collector (nvml, dcmi) reads its devices, 0 when it is unavailable or \
     failed; `ethand status` says why.",
);

const GPU_INFO: Desc = gauge(
    "ethand_gpu_info",
    "NVIDIA GPU identity (model name, PCI bus id, driver version), value always 1 (NVML).",
);
const GPU_UTIL: Desc = gauge(
    "ethand_gpu_utilization_ratio",
    "Share of the last sample period in which a kernel ran on the GPU, 0-1 \
     (nvmlDeviceGetUtilizationRates).",
);
const GPU_MEM_UTIL: Desc = gauge(
    "ethand_gpu_memory_utilization_ratio",
    "Share of the last sample period in which GPU memory was read or written, 0-1 \
     (nvmlDeviceGetUtilizationRates).",
);
const GPU_SM_ACTIVITY: Desc = gauge(
    "ethand_gpu_sm_activity_ratio",
    "Share of time the GPU's SMs had at least one warp assigned, averaged over the SMs, over \
     the last device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_SM_UTIL).",
);
const GPU_SM_OCCUPANCY: Desc = gauge(
    "ethand_gpu_sm_occupancy_ratio",
    "Warps resident on the GPU's SMs as a share of the most they can hold, averaged over the \
     SMs, over the last device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_SM_OCCUPANCY).",
);
const GPU_TENSOR_ACTIVITY: Desc = gauge(
    "ethand_gpu_tensor_activity_ratio",
    "Share of time the GPU's tensor pipes (any precision) were busy, over the last device \
     interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_ANY_TENSOR_UTIL).",
);
const GPU_DRAM_BANDWIDTH: Desc = gauge(
    "ethand_gpu_dram_bandwidth_ratio",
    "GPU memory (DRAM) bandwidth used as a share of its peak, over the last device interval, \
     0-1; Hopper and newer, absent elsewhere (NVML GPM, NVML_GPM_METRIC_DRAM_BW_UTIL).",
);
const GPU_MEM_USED: Desc = gauge(
    "ethand_gpu_memory_used_bytes",
    "Allocated GPU memory (nvmlDeviceGetMemoryInfo).",
);
const GPU_MEM_TOTAL: Desc = gauge(
    "ethand_gpu_memory_total_bytes",
    "Installed GPU memory (nvmlDeviceGetMemoryInfo).",
);
const GPU_POWER: Desc = gauge(
    "ethand_gpu_power_watts",
    "GPU power draw (nvmlDeviceGetPowerUsage).",
);
const GPU_ENERGY: Desc = counter(
    "ethand_gpu_energy_joules_total",
    "Energy the GPU used since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption).",
);
const GPU_TEMP: Desc = gauge(
    "ethand_gpu_temperature_celsius",
    "GPU core temperature (nvmlDeviceGetTemperature).",
);
const GPU_SM_CLOCK: Desc = gauge(
    "ethand_gpu_sm_clock_hertz",
    "Current SM clock (nvmlDeviceGetClockInfo).",
);
const GPU_MEM_CLOCK: Desc = gauge(
    "ethand_gpu_memory_clock_hertz",
    "Current memory clock (nvmlDeviceGetClockInfo).",
);
const GPU_PCIE_TX: Desc = gauge(
    "ethand_gpu_pcie_tx_bytes_per_second",
    "PCIe throughput from the GPU to the host over the driver's last 20 ms sample \
     (nvmlDeviceGetPcieThroughput).",
);
const GPU_PCIE_RX: Desc = gauge(
    "ethand_gpu_pcie_rx_bytes_per_second",
    "PCIe throughput from the host to the GPU over the driver's last 20 ms sample \
     (nvmlDeviceGetPcieThroughput).",
);
const GPU_NVLINK_BYTES: Desc = counter(
    "ethand_gpu_nvlink_bytes_total",
    "Payload bytes sent (transmit) or received (receive) over each active NVLink since the \
     driver was loaded (nvmlDeviceGetFieldValues NVLINK_THROUGHPUT_DATA).",
);
const GPU_NVLINK_ERRORS: Desc = counter(
    "ethand_gpu_nvlink_errors_total",
    "NVLink data link errors by link and type: replay, recovery, crc_flit, crc_data \
     (nvmlDeviceGetNvLinkErrorCounter).",
);
const GPU_ECC: Desc = counter(
    "ethand_gpu_ecc_errors_total",
    "GPU memory ECC errors since the driver was loaded, corrected or uncorrected \
     (nvmlDeviceGetTotalEccErrors, volatile).",
);
const GPU_THROTTLE: Desc = gauge(
    "ethand_gpu_throttle_reason",
    "1 for each clock throttle reason active now, 0 for the others \
     (nvmlDeviceGetCurrentClocksThrottleReasons).",
);
const GPU_XID: Desc = counter(
    "ethand_gpu_xid_errors_total",
    "Critical XID error events of the GPU since ethand started watching (NVML event set, \
     nvmlEventTypeXidCriticalError).",
);
const PROCESS_GPU_MEM: Desc = gauge(
    "ethand_process_gpu_memory_bytes",
    "GPU memory held by the process, per GPU; per GPU the 32 processes with the most memory, \
     the rest as pid=\"other\" (nvmlDeviceGetComputeRunningProcesses).",
);
const PROCESS_GPU_UTIL: Desc = gauge(
    "ethand_process_gpu_utilization_ratio",
    "Share of the GPU's SMs the process used in the driver's newest per-process sample (taken \
     every 1/6 s to 1 s), 0-1; the same 32 processes per GPU as ethand_process_gpu_memory_bytes \
     (nvmlDeviceGetProcessUtilization).",
);

const NPU_INFO: Desc = gauge(
    "ethand_npu_info",
    "Ascend NPU identity (chip name, PCI bus id, driver version, DCMI card and chip), value \
     always 1 (DCMI).",
);
const NPU_AICORE_UTIL: Desc = gauge(
    "ethand_npu_aicore_utilization_ratio",
    "AI core utilization of the NPU, 0-1 (dcmi_get_device_utilization_rate).",
);
const NPU_HBM_USED: Desc = gauge(
    "ethand_npu_hbm_used_bytes",
    "HBM in use on the NPU (dcmi_get_device_hbm_info).",
);
const NPU_HBM_TOTAL: Desc = gauge(
    "ethand_npu_hbm_total_bytes",
    "HBM installed on the NPU (dcmi_get_device_hbm_info).",
);
const NPU_HBM_BW_UTIL: Desc = gauge(
    "ethand_npu_hbm_bandwidth_utilization_ratio",
    "HBM bandwidth utilization of the NPU, 0-1 (dcmi_get_device_hbm_info).",
);
const NPU_HBM_TEMP: Desc = gauge(
    "ethand_npu_hbm_temperature_celsius",
    "HBM temperature of the NPU (dcmi_get_device_hbm_info).",
);
const NPU_POWER: Desc = gauge(
    "ethand_npu_power_watts",
    "NPU chip power draw (dcmi_get_device_power_info).",
);
const NPU_TEMP: Desc = gauge(
    "ethand_npu_temperature_celsius",
    "NPU chip temperature (dcmi_get_device_temperature).",
);
const NPU_HEALTH: Desc = gauge(
    "ethand_npu_health",
    "NPU health: 0 normal, 1 minor alarm, 2 major alarm, 3 critical alarm; the most severe \
     alarm wins (dcmi_get_device_health).",
);
const PROCESS_NPU_MEM: Desc = gauge(
    "ethand_process_npu_memory_bytes",
    "NPU memory held by the process, per NPU; per NPU the 32 processes with the most memory, \
     the rest as pid=\"other\" (dcmi_get_device_resource_info).",
);

const DCGM_GPU_UTIL: Desc = gauge(
    "DCGM_FI_DEV_GPU_UTIL",
    "GPU utilization in percent; dcgm-exporter alias of ethand_gpu_utilization_ratio.",
);
const DCGM_MEM_COPY_UTIL: Desc = gauge(
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "Memory utilization in percent; dcgm-exporter alias of \
     ethand_gpu_memory_utilization_ratio.",
);
const DCGM_FB_USED: Desc = gauge(
    "DCGM_FI_DEV_FB_USED",
    "Framebuffer memory used in MiB; dcgm-exporter alias of ethand_gpu_memory_used_bytes.",
);
const DCGM_FB_FREE: Desc = gauge(
    "DCGM_FI_DEV_FB_FREE",
    "Framebuffer memory free in MiB (nvmlDeviceGetMemoryInfo); dcgm-exporter name.",
);
const DCGM_POWER: Desc = gauge(
    "DCGM_FI_DEV_POWER_USAGE",
    "Power draw in W; dcgm-exporter alias of ethand_gpu_power_watts.",
);
const DCGM_ENERGY: Desc = gauge(
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "Energy since the driver was loaded in mJ, a counter typed as gauge; dcgm-exporter alias \
     of ethand_gpu_energy_joules_total.",
);
const DCGM_TEMP: Desc = gauge(
    "DCGM_FI_DEV_GPU_TEMP",
    "GPU temperature in C; dcgm-exporter alias of ethand_gpu_temperature_celsius.",
);
const DCGM_SM_CLOCK: Desc = gauge(
    "DCGM_FI_DEV_SM_CLOCK",
    "SM clock in MHz; dcgm-exporter alias of ethand_gpu_sm_clock_hertz.",
);
const DCGM_MEM_CLOCK: Desc = gauge(
    "DCGM_FI_DEV_MEM_CLOCK",
    "Memory clock in MHz; dcgm-exporter alias of ethand_gpu_memory_clock_hertz.",
);
const DCGM_PCIE_TX: Desc = gauge(
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "PCIe transmit throughput in KB/s; dcgm-exporter alias of \
     ethand_gpu_pcie_tx_bytes_per_second.",
);
const DCGM_PCIE_RX: Desc = gauge(
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "PCIe receive throughput in KB/s; dcgm-exporter alias of \
     ethand_gpu_pcie_rx_bytes_per_second.",
);
const DCGM_XID: Desc = gauge(
    "DCGM_FI_DEV_XID_ERRORS",
    "Code of the last critical XID error seen since ethand started watching, 0 for none; \
     dcgm-exporter name (ethand_gpu_xid_errors_total counts them).",
);
const DCGM_ECC_SBE: Desc = gauge(
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "Corrected (single-bit) volatile ECC errors, a counter typed as gauge; dcgm-exporter \
     alias of ethand_gpu_ecc_errors_total{type=\"corrected\"}.",
);
const DCGM_ECC_DBE: Desc = gauge(
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "Uncorrected (double-bit) volatile ECC errors, a counter typed as gauge; dcgm-exporter \
     alias of ethand_gpu_ecc_errors_total{type=\"uncorrected\"}.",
);

const DCGM_SM_ACTIVE: Desc = gauge(
    "DCGM_FI_PROF_SM_ACTIVE",
    "Ratio of time the SMs had a warp assigned, 0-1; dcgm-exporter alias of \
     ethand_gpu_sm_activity_ratio (NVML GPM, not DCGM).",
);
const DCGM_SM_OCCUPANCY: Desc = gauge(
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "Ratio of resident warps to the SMs' maximum, 0-1; dcgm-exporter alias of \
     ethand_gpu_sm_occupancy_ratio (NVML GPM, not DCGM).",
);
const DCGM_TENSOR_ACTIVE: Desc = gauge(
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "Ratio of time the tensor pipes were busy, 0-1; dcgm-exporter alias of \
     ethand_gpu_tensor_activity_ratio (NVML GPM, not DCGM).",
);
const DCGM_DRAM_ACTIVE: Desc = gauge(
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "Ratio of the DRAM bandwidth in use, 0-1; dcgm-exporter alias of \
     ethand_gpu_dram_bandwidth_ratio (NVML GPM, not DCGM).",
);

/// Every family [`register_devices`] can emit, in exposition order.
pub(crate) const DEVICE_FAMILIES: &[Desc] = &[
    COLLECTOR_UP,
    GPU_INFO,
    GPU_UTIL,
    GPU_MEM_UTIL,
    GPU_SM_ACTIVITY,
    GPU_SM_OCCUPANCY,
    GPU_TENSOR_ACTIVITY,
    GPU_DRAM_BANDWIDTH,
    GPU_MEM_USED,
    GPU_MEM_TOTAL,
    GPU_POWER,
    GPU_ENERGY,
    GPU_TEMP,
    GPU_SM_CLOCK,
    GPU_MEM_CLOCK,
    GPU_PCIE_TX,
    GPU_PCIE_RX,
    GPU_NVLINK_BYTES,
    GPU_NVLINK_ERRORS,
    GPU_ECC,
    GPU_THROTTLE,
    GPU_XID,
    PROCESS_GPU_MEM,
    PROCESS_GPU_UTIL,
    NPU_INFO,
    NPU_AICORE_UTIL,
    NPU_HBM_USED,
    NPU_HBM_TOTAL,
    NPU_HBM_BW_UTIL,
    NPU_HBM_TEMP,
    NPU_POWER,
    NPU_TEMP,
    NPU_HEALTH,
    PROCESS_NPU_MEM,
    DCGM_GPU_UTIL,
    DCGM_MEM_COPY_UTIL,
    DCGM_FB_USED,
    DCGM_FB_FREE,
    DCGM_POWER,
    DCGM_ENERGY,
    DCGM_TEMP,
    DCGM_SM_CLOCK,
    DCGM_MEM_CLOCK,
    DCGM_PCIE_TX,
    DCGM_PCIE_RX,
    DCGM_XID,
    DCGM_ECC_SBE,
    DCGM_ECC_DBE,
    DCGM_SM_ACTIVE,
    DCGM_SM_OCCUPANCY,
    DCGM_TENSOR_ACTIVE,
    DCGM_DRAM_ACTIVE,
];

/// Registers the device families of `d`; with `dcgm_aliases` also the `DCGM_FI_DEV_*` ones.
pub(crate) fn register_devices(registry: &mut Exposition, d: &DevicesSnapshot, dcgm_aliases: bool) {
    let mut up = Family::<u64>::new(&COLLECTOR_UP);
    for c in &d.collectors {
        up.add(
            labels(&[("collector", c.name.as_str())], &[]),
            u64::from(c.state == ethand_snapshot::devices::CollectorState::Available),
        );
    }
    up.register(registry);
    register_gpus(registry, &d.gpus);
    register_npus(registry, &d.npus);
    register_processes(registry, d);
    if dcgm_aliases {
        register_dcgm(registry, &d.gpus, &d.hostname);
    }
}

/// A gauge or counter family whose samples are optional per device.
struct Opt<V: crate::prometheus::Value>(Family<V>);

impl<V: crate::prometheus::Value> Opt<V> {
    fn new(desc: &'static Desc) -> Self {
        Self(Family::new(desc))
    }
    fn add(&mut self, labels: &Labels, value: Option<V>) {
        if let Some(v) = value {
            self.0.add(labels.clone(), v);
        }
    }
    fn register(self, registry: &mut Exposition) {
        self.0.register(registry);
    }
}

fn register_gpus(registry: &mut Exposition, gpus: &[GpuDevice]) {
    let mut info = Family::<u64>::new(&GPU_INFO);
    let mut util = Opt::<f64>::new(&GPU_UTIL);
    let mut mem_util = Opt::<f64>::new(&GPU_MEM_UTIL);
    let mut sm_activity = Opt::<f64>::new(&GPU_SM_ACTIVITY);
    let mut sm_occupancy = Opt::<f64>::new(&GPU_SM_OCCUPANCY);
    let mut tensor_activity = Opt::<f64>::new(&GPU_TENSOR_ACTIVITY);
    let mut dram_bandwidth = Opt::<f64>::new(&GPU_DRAM_BANDWIDTH);
    let mut mem_used = Opt::<u64>::new(&GPU_MEM_USED);
    let mut mem_total = Opt::<u64>::new(&GPU_MEM_TOTAL);
    let mut power = Opt::<f64>::new(&GPU_POWER);
    let mut energy = Opt::<f64>::new(&GPU_ENERGY);
    let mut temp = Opt::<f64>::new(&GPU_TEMP);
    let mut sm_clock = Opt::<u64>::new(&GPU_SM_CLOCK);
    let mut mem_clock = Opt::<u64>::new(&GPU_MEM_CLOCK);
    let mut pcie_tx = Opt::<u64>::new(&GPU_PCIE_TX);
    let mut pcie_rx = Opt::<u64>::new(&GPU_PCIE_RX);
    let mut nvlink_bytes = Opt::<u64>::new(&GPU_NVLINK_BYTES);
    let mut nvlink_errors = Opt::<u64>::new(&GPU_NVLINK_ERRORS);
    let mut ecc = Opt::<u64>::new(&GPU_ECC);
    let mut throttle = Family::<u64>::new(&GPU_THROTTLE);
    let mut xid = Opt::<u64>::new(&GPU_XID);

    for g in gpus {
        let gpu = g.label();
        let id = |extra: &[(&'static str, &str)]| {
            labels(&[("gpu", gpu.as_str()), ("uuid", g.uuid.as_str())], extra)
        };
        info.add(
            id(&[
                ("name", g.name.as_str()),
                ("pci_bus_id", g.pci_bus_id.as_str()),
                ("driver", g.driver_version.as_str()),
            ]),
            1,
        );
        let l = id(&[]);
        util.add(&l, g.utilization_ratio);
        mem_util.add(&l, g.memory_utilization_ratio);
        sm_activity.add(&l, g.sm_activity_ratio);
        sm_occupancy.add(&l, g.sm_occupancy_ratio);
        tensor_activity.add(&l, g.tensor_activity_ratio);
        dram_bandwidth.add(&l, g.dram_bandwidth_ratio);
        mem_used.add(&l, g.memory_used_bytes);
        mem_total.add(&l, g.memory_total_bytes);
        power.add(&l, g.power_watts);
        energy.add(&l, g.energy_millijoules.map(|mj| mj as f64 / 1e3));
        temp.add(&l, g.temperature_celsius.map(|c| c as f64));
        sm_clock.add(&l, g.sm_clock_hertz);
        mem_clock.add(&l, g.memory_clock_hertz);
        pcie_tx.add(&l, g.pcie_tx_bytes_per_second);
        pcie_rx.add(&l, g.pcie_rx_bytes_per_second);
        for n in &g.nvlinks {
            let link = n.link.to_string();
            let dir = |d| id(&[("link", link.as_str()), ("direction", d)]);
            nvlink_bytes.add(&dir("transmit"), n.tx_bytes);
            nvlink_bytes.add(&dir("receive"), n.rx_bytes);
            for (kind, v) in [
                ("replay", n.replay_errors),
                ("recovery", n.recovery_errors),
                ("crc_flit", n.crc_flit_errors),
                ("crc_data", n.crc_data_errors),
            ] {
                nvlink_errors.add(&id(&[("link", link.as_str()), ("type", kind)]), v);
            }
        }
        ecc.add(&id(&[("type", "corrected")]), g.ecc_corrected_errors);
        ecc.add(&id(&[("type", "uncorrected")]), g.ecc_uncorrected_errors);
        if let Some(active) = &g.throttle_reasons {
            // Every known reason as 0/1, plus any name the collector reported beyond them.
            let known = THROTTLE_REASONS.iter().map(|r| r.to_string());
            let extra = active
                .iter()
                .filter(|r| !THROTTLE_REASONS.contains(&r.as_str()));
            for reason in known.chain(extra.cloned()) {
                let on = u64::from(active.contains(&reason));
                throttle.add(id(&[("reason", reason.as_str())]), on);
            }
        }
        xid.add(&l, g.xid_errors);
    }

    info.register(registry);
    util.register(registry);
    mem_util.register(registry);
    sm_activity.register(registry);
    sm_occupancy.register(registry);
    tensor_activity.register(registry);
    dram_bandwidth.register(registry);
    mem_used.register(registry);
    mem_total.register(registry);
    power.register(registry);
    energy.register(registry);
    temp.register(registry);
    sm_clock.register(registry);
    mem_clock.register(registry);
    pcie_tx.register(registry);
    pcie_rx.register(registry);
    nvlink_bytes.register(registry);
    nvlink_errors.register(registry);
    ecc.register(registry);
    throttle.register(registry);
    xid.register(registry);
}

fn register_npus(registry: &mut Exposition, npus: &[NpuDevice]) {
    let mut info = Family::<u64>::new(&NPU_INFO);
    let mut util = Opt::<f64>::new(&NPU_AICORE_UTIL);
    let mut hbm_used = Opt::<u64>::new(&NPU_HBM_USED);
    let mut hbm_total = Opt::<u64>::new(&NPU_HBM_TOTAL);
    let mut hbm_bw = Opt::<f64>::new(&NPU_HBM_BW_UTIL);
    let mut hbm_temp = Opt::<f64>::new(&NPU_HBM_TEMP);
    let mut power = Opt::<f64>::new(&NPU_POWER);
    let mut temp = Opt::<f64>::new(&NPU_TEMP);
    let mut health = Opt::<u64>::new(&NPU_HEALTH);

    for n in npus {
        let npu = n.label();
        let id = |extra: &[(&'static str, &str)]| {
            labels(&[("npu", npu.as_str()), ("uuid", n.uuid.as_str())], extra)
        };
        let (card, chip) = (n.card_id.to_string(), n.device_id.to_string());
        info.add(
            id(&[
                ("name", n.name.as_str()),
                ("pci_bus_id", n.pci_bus_id.as_str()),
                ("driver", n.driver_version.as_str()),
                ("card", card.as_str()),
                ("chip", chip.as_str()),
            ]),
            1,
        );
        let l = id(&[]);
        util.add(&l, n.aicore_utilization_ratio);
        hbm_used.add(&l, n.hbm_used_bytes);
        hbm_total.add(&l, n.hbm_total_bytes);
        hbm_bw.add(&l, n.hbm_bandwidth_utilization_ratio);
        hbm_temp.add(&l, n.hbm_temperature_celsius.map(|c| c as f64));
        power.add(&l, n.power_watts);
        temp.add(&l, n.temperature_celsius.map(|c| c as f64));
        health.add(&l, n.health.map(u64::from));
    }

    info.register(registry);
    util.register(registry);
    hbm_used.register(registry);
    hbm_total.register(registry);
    hbm_bw.register(registry);
    hbm_temp.register(registry);
    power.register(registry);
    temp.register(registry);
    health.register(registry);
}

/// What one `pid` label value of one device stands for.
#[derive(Default)]
struct ProcSeries {
    memory: Option<u64>,
    utilization: Option<f64>,
}

impl ProcSeries {
    fn add(&mut self, memory: Option<u64>, utilization: Option<f64>) {
        if let Some(m) = memory {
            self.memory = Some(self.memory.unwrap_or(0).saturating_add(m));
        }
        if let Some(u) = utilization {
            self.utilization = Some(self.utilization.unwrap_or(0.0) + u);
        }
    }
}

fn register_processes(registry: &mut Exposition, d: &DevicesSnapshot) {
    let mut gpu_mem = Opt::<u64>::new(&PROCESS_GPU_MEM);
    let mut gpu_util = Opt::<f64>::new(&PROCESS_GPU_UTIL);
    let mut npu_mem = Opt::<u64>::new(&PROCESS_NPU_MEM);

    // Per device (label, uuid): its processes, most memory first, ties to the lower pid.
    let mut by_device: BTreeMap<(&str, &str), Vec<_>> = BTreeMap::new();
    for p in &d.processes {
        by_device
            .entry((p.device.as_str(), p.uuid.as_str()))
            .or_default()
            .push(p);
    }
    for ((device, uuid), mut procs) in by_device {
        procs.sort_by_key(|p| (std::cmp::Reverse(p.memory_used_bytes.unwrap_or(0)), p.pid));
        let mut series: BTreeMap<String, ProcSeries> = BTreeMap::new();
        for (rank, p) in procs.iter().enumerate() {
            let pid = if rank < MAX_PROCESSES_PER_DEVICE {
                p.pid.to_string()
            } else {
                "other".to_owned()
            };
            series
                .entry(pid)
                .or_default()
                .add(p.memory_used_bytes, p.utilization_ratio);
        }
        let npu = device.starts_with("npu");
        for (pid, s) in &series {
            let key = if npu { "npu" } else { "gpu" };
            let l = labels(&[("pid", pid.as_str()), (key, device), ("uuid", uuid)], &[]);
            if npu {
                npu_mem.add(&l, s.memory);
            } else {
                gpu_mem.add(&l, s.memory);
                gpu_util.add(&l, s.utilization);
            }
        }
    }

    gpu_mem.register(registry);
    gpu_util.register(registry);
    npu_mem.register(registry);
}

fn register_dcgm(registry: &mut Exposition, gpus: &[GpuDevice], hostname: &str) {
    let mut util = Opt::<f64>::new(&DCGM_GPU_UTIL);
    let mut mem_util = Opt::<f64>::new(&DCGM_MEM_COPY_UTIL);
    let mut fb_used = Opt::<u64>::new(&DCGM_FB_USED);
    let mut fb_free = Opt::<u64>::new(&DCGM_FB_FREE);
    let mut power = Opt::<f64>::new(&DCGM_POWER);
    let mut energy = Opt::<u64>::new(&DCGM_ENERGY);
    let mut temp = Opt::<f64>::new(&DCGM_TEMP);
    let mut sm_clock = Opt::<u64>::new(&DCGM_SM_CLOCK);
    let mut mem_clock = Opt::<u64>::new(&DCGM_MEM_CLOCK);
    let mut pcie_tx = Opt::<u64>::new(&DCGM_PCIE_TX);
    let mut pcie_rx = Opt::<u64>::new(&DCGM_PCIE_RX);
    let mut xid = Opt::<u64>::new(&DCGM_XID);
    let mut sbe = Opt::<u64>::new(&DCGM_ECC_SBE);
    let mut dbe = Opt::<u64>::new(&DCGM_ECC_DBE);
    let mut sm_active = Opt::<f64>::new(&DCGM_SM_ACTIVE);
    let mut sm_occupancy = Opt::<f64>::new(&DCGM_SM_OCCUPANCY);
    let mut tensor_active = Opt::<f64>::new(&DCGM_TENSOR_ACTIVE);
    let mut dram_active = Opt::<f64>::new(&DCGM_DRAM_ACTIVE);

    const MIB: u64 = 1 << 20;
    const MHZ: u64 = 1_000_000;
    for g in gpus {
        let index = g.index.to_string();
        let device = format!("nvidia{}", g.minor_number.unwrap_or(g.index));
        // dcgm-exporter's labels, in its order.
        let mut base = vec![
            ("gpu", index.as_str()),
            ("UUID", g.uuid.as_str()),
            ("pci_bus_id", g.pci_bus_id.as_str()),
            ("device", device.as_str()),
            ("modelName", g.name.as_str()),
        ];
        if !hostname.is_empty() {
            base.push(("Hostname", hostname));
        }
        let l = labels(&base, &[]);
        util.add(&l, g.utilization_ratio.map(|r| r * 100.0));
        mem_util.add(&l, g.memory_utilization_ratio.map(|r| r * 100.0));
        fb_used.add(&l, g.memory_used_bytes.map(|b| b / MIB));
        fb_free.add(&l, g.memory_free_bytes.map(|b| b / MIB));
        power.add(&l, g.power_watts);
        energy.add(&l, g.energy_millijoules);
        temp.add(&l, g.temperature_celsius.map(|c| c as f64));
        sm_clock.add(&l, g.sm_clock_hertz.map(|h| h / MHZ));
        mem_clock.add(&l, g.memory_clock_hertz.map(|h| h / MHZ));
        pcie_tx.add(&l, g.pcie_tx_bytes_per_second.map(|b| b / 1024));
        pcie_rx.add(&l, g.pcie_rx_bytes_per_second.map(|b| b / 1024));
        xid.add(&l, g.xid_errors.map(|_| g.last_xid.unwrap_or(0)));
        sbe.add(&l, g.ecc_corrected_errors);
        dbe.add(&l, g.ecc_uncorrected_errors);
        // dcgm-exporter's profiling fields are ratios already.
        sm_active.add(&l, g.sm_activity_ratio);
        sm_occupancy.add(&l, g.sm_occupancy_ratio);
        tensor_active.add(&l, g.tensor_activity_ratio);
        dram_active.add(&l, g.dram_bandwidth_ratio);
    }

    util.register(registry);
    mem_util.register(registry);
    fb_used.register(registry);
    fb_free.register(registry);
    power.register(registry);
    energy.register(registry);
    temp.register(registry);
    sm_clock.register(registry);
    mem_clock.register(registry);
    pcie_tx.register(registry);
    pcie_rx.register(registry);
    xid.register(registry);
    sbe.register(registry);
    dbe.register(registry);
    sm_active.register(registry);
    sm_occupancy.register(registry);
    tensor_active.register(registry);
    dram_active.register(registry);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;
    use crate::prometheus::{PrometheusOptions, render};
    use ethand_snapshot::NodeSnapshot;
    use ethand_snapshot::devices::{CollectorState, CollectorStatus, DeviceProcess, NvLinkStats};

    fn gpu0() -> GpuDevice {
        GpuDevice {
            index: 0,
            uuid: "GPU-aaaa".into(),
            name: "NVIDIA H200".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            minor_number: Some(3),
            driver_version: "580.65.06".into(),
            utilization_ratio: Some(0.75),
            memory_utilization_ratio: Some(0.25),
            memory_used_bytes: Some(10 << 30),
            memory_free_bytes: Some(130 << 30),
            memory_total_bytes: Some(141 << 30),
            power_watts: Some(412.5),
            energy_millijoules: Some(123_456_789),
            temperature_celsius: Some(55),
            sm_clock_hertz: Some(1_980_000_000),
            memory_clock_hertz: Some(2_619_000_000),
            pcie_tx_bytes_per_second: Some(2048 * 1024),
            pcie_rx_bytes_per_second: Some(512 * 1024),
            nvlinks: vec![NvLinkStats {
                link: 2,
                tx_bytes: Some(1 << 40),
                rx_bytes: Some(3 << 30),
                replay_errors: Some(1),
                recovery_errors: Some(0),
                crc_flit_errors: None,
                crc_data_errors: Some(4),
            }],
            ecc_corrected_errors: Some(7),
            ecc_uncorrected_errors: Some(0),
            throttle_reasons: Some(vec!["sw_power_cap".into()]),
            xid_errors: Some(2),
            last_xid: Some(79),
            gpm_supported: Some(true),
            sm_activity_ratio: Some(0.875),
            sm_occupancy_ratio: Some(0.375),
            tensor_activity_ratio: Some(0.5),
            dram_bandwidth_ratio: Some(0.0625),
        }
    }

    /// A GPU whose driver gives almost nothing: only identity.
    fn gpu1() -> GpuDevice {
        GpuDevice {
            index: 1,
            uuid: "GPU-bbbb".into(),
            name: "Tesla T4".into(),
            pci_bus_id: "00000000:3b:00.0".into(),
            ..Default::default()
        }
    }

    fn snapshot() -> NodeSnapshot {
        let mut procs: Vec<DeviceProcess> = (0..(MAX_PROCESSES_PER_DEVICE as u32 + 3))
            .map(|i| DeviceProcess {
                pid: 1000 + i,
                device: "gpu0".into(),
                uuid: "GPU-aaaa".into(),
                // pid 1000 holds the most; the last three (the smallest) become "other".
                memory_used_bytes: Some(u64::from(100 - i) << 20),
                utilization_ratio: Some(0.01),
            })
            .collect();
        procs.push(DeviceProcess {
            pid: 42,
            device: "npu1".into(),
            uuid: "NPU-1".into(),
            memory_used_bytes: Some(3 << 30),
            utilization_ratio: None,
        });
        NodeSnapshot {
            devices: DevicesSnapshot {
                hostname: "node1".into(),
                collectors: vec![
                    CollectorStatus {
                        name: "nvml".into(),
                        state: CollectorState::Available,
                        detail: String::new(),
                    },
                    CollectorStatus {
                        name: "dcmi".into(),
                        state: CollectorState::Unavailable,
                        detail: "libdcmi.so not found".into(),
                    },
                ],
                gpus: vec![gpu0(), gpu1()],
                npus: vec![NpuDevice {
                    index: 1,
                    card_id: 4,
                    device_id: 0,
                    uuid: "NPU-1".into(),
                    name: "910B3".into(),
                    pci_bus_id: "0000:c1:00.0".into(),
                    driver_version: "24.1.rc2".into(),
                    aicore_utilization_ratio: Some(0.5),
                    hbm_used_bytes: Some(4 << 30),
                    hbm_total_bytes: Some(64 << 30),
                    hbm_bandwidth_utilization_ratio: Some(0.1),
                    hbm_temperature_celsius: Some(40),
                    power_watts: Some(95.5),
                    temperature_celsius: Some(45),
                    health: Some(1),
                }],
                processes: procs,
            },
            ..Default::default()
        }
    }

    fn samples(text: &str) -> HashMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap();
                (series.to_owned(), value.parse().unwrap())
            })
            .collect()
    }

    fn value(s: &HashMap<String, f64>, series: &str) -> f64 {
        *s.get(series)
            .unwrap_or_else(|| panic!("no series {series} in {:#?}", s.keys()))
    }

    fn opts(dcgm_aliases: bool) -> PrometheusOptions {
        PrometheusOptions {
            dcgm_aliases,
            ..Default::default()
        }
    }

    #[test]
    fn gpu_values_and_labels() {
        let s = samples(&render(&snapshot(), &opts(false)));
        let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
        let v = |name: &str| value(&s, &format!("{name}{{{g}}}"));
        assert_eq!(v("ethand_gpu_utilization_ratio"), 0.75);
        assert_eq!(v("ethand_gpu_memory_utilization_ratio"), 0.25);
        assert_eq!(v("ethand_gpu_sm_activity_ratio"), 0.875);
        assert_eq!(v("ethand_gpu_sm_occupancy_ratio"), 0.375);
        assert_eq!(v("ethand_gpu_tensor_activity_ratio"), 0.5);
        assert_eq!(v("ethand_gpu_dram_bandwidth_ratio"), 0.0625);
        assert_eq!(v("ethand_gpu_memory_used_bytes"), (10u64 << 30) as f64);
        assert_eq!(v("ethand_gpu_memory_total_bytes"), (141u64 << 30) as f64);
        assert_eq!(v("ethand_gpu_power_watts"), 412.5);
        assert_eq!(v("ethand_gpu_energy_joules_total"), 123_456.789);
        assert_eq!(v("ethand_gpu_temperature_celsius"), 55.0);
        assert_eq!(v("ethand_gpu_sm_clock_hertz"), 1.98e9);
        assert_eq!(v("ethand_gpu_memory_clock_hertz"), 2.619e9);
        assert_eq!(v("ethand_gpu_pcie_tx_bytes_per_second"), 2048.0 * 1024.0);
        assert_eq!(v("ethand_gpu_pcie_rx_bytes_per_second"), 512.0 * 1024.0);
        assert_eq!(v("ethand_gpu_xid_errors_total"), 2.0);
        let e = |t: &str| {
            value(
                &s,
                &format!(r#"ethand_gpu_ecc_errors_total{{{g},type="{t}"}}"#),
            )
        };
        assert_eq!(e("corrected"), 7.0);
        assert_eq!(e("uncorrected"), 0.0);
        let link = |rest: &str| format!(r#"{{{g},link="2",{rest}}}"#);
        assert_eq!(
            value(
                &s,
                &format!(
                    "ethand_gpu_nvlink_bytes_total{}",
                    link(r#"direction="transmit""#)
                )
            ),
            (1u64 << 40) as f64
        );
        assert_eq!(
            value(
                &s,
                &format!(
                    "ethand_gpu_nvlink_errors_total{}",
                    link(r#"type="crc_data""#)
                )
            ),
            4.0
        );
        // crc_flit is None: no sample.
        assert!(!s.contains_key(&format!(
            "ethand_gpu_nvlink_errors_total{}",
            link(r#"type="crc_flit""#)
        )));
        // Throttle reasons: every known reason as 0/1.
        for r in THROTTLE_REASONS {
            let want = if *r == "sw_power_cap" { 1.0 } else { 0.0 };
            assert_eq!(
                value(
                    &s,
                    &format!(r#"ethand_gpu_throttle_reason{{{g},reason="{r}"}}"#)
                ),
                want,
                "{r}"
            );
        }
        assert_eq!(
            value(
                &s,
                &format!(
                    r#"ethand_gpu_info{{{g},name="NVIDIA H200",pci_bus_id="00000000:18:00.0",driver="580.65.06"}}"#
                )
            ),
            1.0
        );
        assert_eq!(
            value(&s, r#"ethand_device_collector_up{collector="nvml"}"#),
            1.0
        );
        assert_eq!(
            value(&s, r#"ethand_device_collector_up{collector="dcmi"}"#),
            0.0
        );
    }

    #[test]
    fn missing_fields_emit_no_sample() {
        let text = render(&snapshot(), &opts(true));
        let gpu1: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("GPU-bbbb"))
            .collect();
        // gpu1 has identity only: its info series, and nothing else (not even DCGM's).
        assert_eq!(gpu1.len(), 1, "{gpu1:#?}");
        assert!(gpu1[0].starts_with("ethand_gpu_info{"), "{gpu1:?}");
        // No devices at all: only what the snapshot has, no empty families.
        let empty = render(&NodeSnapshot::default(), &opts(true));
        assert!(
            !empty.contains("ethand_gpu_") && !empty.contains("DCGM_"),
            "{empty}"
        );
    }

    #[test]
    fn gpm_ratios_are_absent_where_unmeasured() {
        // Measured and zero: a series with 0. Unsupported (Some(false)) or not asked (None):
        // no series at all, in ethand's names or DCGM's.
        let gpm = [
            "sm_activity",
            "sm_occupancy",
            "tensor_activity",
            "dram_bandwidth",
        ];
        let dcgm = [
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
        ];
        let idle = GpuDevice {
            sm_activity_ratio: Some(0.0),
            sm_occupancy_ratio: Some(0.0),
            tensor_activity_ratio: Some(0.0),
            dram_bandwidth_ratio: Some(0.0),
            ..gpu0()
        };
        let older = GpuDevice {
            gpm_supported: Some(false),
            sm_activity_ratio: None,
            sm_occupancy_ratio: None,
            tensor_activity_ratio: None,
            dram_bandwidth_ratio: None,
            ..gpu0()
        };
        let first_interval = GpuDevice {
            gpm_supported: Some(true),
            ..older.clone()
        };
        for (gpu, present) in [(idle, true), (older, false), (first_interval, false)] {
            let mut snap = snapshot();
            snap.devices.gpus = vec![gpu];
            let text = render(&snap, &opts(true));
            let s = samples(&text);
            let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
            for name in gpm {
                let series = format!("ethand_gpu_{name}_ratio{{{g}}}");
                assert_eq!(s.get(&series).copied(), present.then_some(0.0), "{series}");
            }
            for name in dcgm {
                assert_eq!(
                    text.lines().any(|l| l.starts_with(&format!("{name}{{"))),
                    present,
                    "{name}"
                );
                // No series, no family: no HELP/TYPE either.
                assert_eq!(text.contains(&format!("# TYPE {name} ")), present, "{name}");
            }
            // The rest of the GPU is there either way.
            assert!(s.contains_key(&format!("ethand_gpu_power_watts{{{g}}}")));
        }
    }

    #[test]
    fn npu_values() {
        let s = samples(&render(&snapshot(), &opts(false)));
        let n = r#"npu="npu1",uuid="NPU-1""#;
        let v = |name: &str| value(&s, &format!("{name}{{{n}}}"));
        assert_eq!(v("ethand_npu_aicore_utilization_ratio"), 0.5);
        assert_eq!(v("ethand_npu_hbm_used_bytes"), (4u64 << 30) as f64);
        assert_eq!(v("ethand_npu_hbm_total_bytes"), (64u64 << 30) as f64);
        assert_eq!(v("ethand_npu_hbm_bandwidth_utilization_ratio"), 0.1);
        assert_eq!(v("ethand_npu_hbm_temperature_celsius"), 40.0);
        assert_eq!(v("ethand_npu_power_watts"), 95.5);
        assert_eq!(v("ethand_npu_temperature_celsius"), 45.0);
        assert_eq!(v("ethand_npu_health"), 1.0);
        assert_eq!(
            value(
                &s,
                &format!(
                    r#"ethand_npu_info{{{n},name="910B3",pci_bus_id="0000:c1:00.0",driver="24.1.rc2",card="4",chip="0"}}"#
                )
            ),
            1.0
        );
        assert_eq!(
            value(
                &s,
                r#"ethand_process_npu_memory_bytes{pid="42",npu="npu1",uuid="NPU-1"}"#
            ),
            (3u64 << 30) as f64
        );
    }

    #[test]
    fn processes_are_capped_per_device() {
        let s = samples(&render(&snapshot(), &opts(false)));
        let pids: BTreeSet<&str> = s
            .keys()
            .filter_map(|k| k.strip_prefix("ethand_process_gpu_memory_bytes{pid=\""))
            .map(|k| k.split('"').next().unwrap())
            .collect();
        assert_eq!(pids.len(), MAX_PROCESSES_PER_DEVICE + 1, "{pids:?}");
        assert!(pids.contains("1000") && pids.contains("other"));
        let last = 1000 + MAX_PROCESSES_PER_DEVICE as u32;
        assert!(!pids.contains(last.to_string().as_str()));
        let g = r#"gpu="gpu0",uuid="GPU-aaaa""#;
        // The three smallest: 100 - 32, - 33, - 34 MiB.
        let other: u64 = (32..35).map(|i| (100 - i) << 20).sum();
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_process_gpu_memory_bytes{{pid="other",{g}}}"#)
            ),
            other as f64
        );
        let util = value(
            &s,
            &format!(r#"ethand_process_gpu_utilization_ratio{{pid="other",{g}}}"#),
        );
        assert!((util - 0.03).abs() < 1e-12, "{util}");
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_process_gpu_memory_bytes{{pid="1000",{g}}}"#)
            ),
            (100u64 << 20) as f64
        );
    }

    #[test]
    fn dcgm_aliases_use_dcgm_units_and_labels() {
        let text = render(&snapshot(), &opts(false));
        assert!(!text.contains("DCGM_"), "aliases are off by default");
        let s = samples(&render(&snapshot(), &opts(true)));
        let l = r#"gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia3",modelName="NVIDIA H200",Hostname="node1""#;
        let v = |name: &str| value(&s, &format!("{name}{{{l}}}"));
        assert_eq!(v("DCGM_FI_DEV_GPU_UTIL"), 75.0);
        assert_eq!(v("DCGM_FI_DEV_MEM_COPY_UTIL"), 25.0);
        assert_eq!(v("DCGM_FI_DEV_FB_USED"), 10.0 * 1024.0);
        assert_eq!(v("DCGM_FI_DEV_FB_FREE"), 130.0 * 1024.0);
        assert_eq!(v("DCGM_FI_DEV_POWER_USAGE"), 412.5);
        assert_eq!(v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), 123_456_789.0);
        assert_eq!(v("DCGM_FI_DEV_GPU_TEMP"), 55.0);
        assert_eq!(v("DCGM_FI_DEV_SM_CLOCK"), 1980.0);
        assert_eq!(v("DCGM_FI_DEV_MEM_CLOCK"), 2619.0);
        assert_eq!(v("DCGM_FI_DEV_PCIE_TX_THROUGHPUT"), 2048.0);
        assert_eq!(v("DCGM_FI_DEV_PCIE_RX_THROUGHPUT"), 512.0);
        assert_eq!(v("DCGM_FI_DEV_XID_ERRORS"), 79.0);
        assert_eq!(v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), 7.0);
        assert_eq!(v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), 0.0);
        // Profiling fields: ratios in dcgm-exporter too.
        assert_eq!(v("DCGM_FI_PROF_SM_ACTIVE"), 0.875);
        assert_eq!(v("DCGM_FI_PROF_SM_OCCUPANCY"), 0.375);
        assert_eq!(v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), 0.5);
        assert_eq!(v("DCGM_FI_PROF_DRAM_ACTIVE"), 0.0625);
    }

    #[test]
    fn every_device_family_is_rendered_and_declared() {
        let text = render(&snapshot(), &opts(true));
        let rendered: BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        // metric_catalog() lists DEVICE_FAMILIES last.
        let catalog = crate::prometheus::metric_catalog();
        let devices = &catalog[catalog.len() - DEVICE_FAMILIES.len()..];
        assert_eq!(devices[0].0, "ethand_device_collector_up");
        for (name, _, help) in devices {
            assert!(rendered.contains(name), "{name} not rendered");
            assert!(text.contains(&format!("# HELP {name} {help}\n")), "{name}");
        }
    }
}
