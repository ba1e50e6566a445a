//! What the device collectors (NVML for NVIDIA GPUs, DCMI for Huawei Ascend NPUs) report:
//! the node's accelerators, the processes holding device memory, and each collector's state.
//!
//! The daemon fills [`DevicesSnapshot`] from `ethand_userspace_probes::devices` (which is
//! the only code that calls a vendor library) and hands it to the exporters in
//! [`crate::NodeSnapshot::devices`]. Units are base units (bytes, watts, hertz,
//! celsius, 0-1 ratios); counters are cumulative. A field a driver does not give on this
//! device (NVML `NotSupported`, a DCMI symbol the library lacks) is `None`, never a made-up
//! value, and the exporters emit no sample for it.
use serde::{Deserialize, Serialize};

/// Clock throttle reasons as [`GpuDevice::throttle_reasons`] names them (NVML's
/// `nvmlClocksThrottleReason*` bits). Prometheus exposes each as a 0/1 series.
pub const THROTTLE_REASONS: &[&str] = &[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
];

/// The node's accelerators at one instant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DevicesSnapshot {
    /// Host name, for the `Hostname` label of the DCGM-compatible aliases (the daemon copies
    /// `NodeSnapshot::hostname`); empty leaves the label out.
    pub hostname: String,
    /// One entry per collector ethand knows ("nvml", "dcmi"), available or not, so that users
    /// can see what is and is not measured.
    pub collectors: Vec<CollectorStatus>,
    /// NVIDIA GPUs, by NVML index.
    pub gpus: Vec<GpuDevice>,
    /// Ascend NPUs, by logical id.
    pub npus: Vec<NpuDevice>,
    /// Processes holding device memory, one entry per (process, device).
    pub processes: Vec<DeviceProcess>,
    /// The most recent critical XID events (at most [`MAX_XID_EVENTS`]), oldest first, each
    /// with the processes that held a context on its GPU. Consumers count an event once by
    /// its `seq`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_events: Vec<XidEvent>,
}

/// How many XID events [`DevicesSnapshot::xid_events`] keeps.
pub const MAX_XID_EVENTS: usize = 256;

/// XID codes above this are counted under [`XID_OTHER`] in the `xid` label, so that a driver
/// reporting garbage cannot make unbounded series (NVIDIA's documented codes are below 200).
pub const MAX_XID_CODE: u64 = 1023;
/// The `xid` label value of codes above [`MAX_XID_CODE`].
pub const XID_OTHER: &str = "other";

/// The `xid` label value of a code: the number, or [`XID_OTHER`] above [`MAX_XID_CODE`].
pub fn xid_label(code: u64) -> String {
    if code <= MAX_XID_CODE {
        code.to_string()
    } else {
        XID_OTHER.to_owned()
    }
}

/// What an XID code means, in short, for the codes an operator meets most (NVIDIA's XID
/// catalog has the full list and the actions); None for the others.
pub fn xid_description(code: u64) -> Option<&'static str> {
    Some(match code {
        8 => "GPU stopped processing (channel timeout)",
        13 => "Graphics engine exception (illegal instruction or memory access in a kernel)",
        31 => "GPU memory page fault (a kernel accessed an invalid address)",
        32 => "Invalid or corrupted push buffer stream",
        38 => "Driver firmware error",
        43 => "GPU stopped processing (the application's context was torn down)",
        45 => "Preemptive cleanup after a previous error",
        48 => "Double-bit ECC error",
        61 => "Internal micro-controller breakpoint",
        62 => "Internal micro-controller halt",
        63 => "Row remapping recorded (ECC page retirement)",
        64 => "Row remapping failed (ECC page retirement failure)",
        68 => "Video processor exception",
        69 => "Graphics engine class error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "High single-bit ECC error rate",
        94 => "Contained ECC error (the affected application was stopped)",
        95 => "Uncontained ECC error (every application on the GPU is affected)",
        109 => "Context switch timeout",
        119 => "GSP firmware RPC timeout",
        120 => "GSP firmware error",
        121 => "C2C link error",
        140 => "Unrecovered ECC error",
        _ => return None,
    })
}

/// One critical XID event (NVML event set), as the collector drained it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct XidEvent {
    /// 1, 2, 3, ... per collector lifetime: tells a new event from one already counted.
    pub seq: u64,
    /// NVML index of the GPU ("gpu<index>").
    pub gpu: u32,
    pub uuid: String,
    /// The XID code (NVML `eventData`).
    pub xid: u64,
    /// When the collector drained it (NVML gives no event time), Unix ns.
    pub drained_unix_ns: u64,
    /// Processes that held a compute context on the GPU: those NVML listed at the collection
    /// before the event was drained and at the one that drained it (a context the XID killed
    /// is only in the first).
    pub pids: Vec<u32>,
}

/// Whether a collector reads its devices, and why not.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CollectorStatus {
    /// "nvml" or "dcmi".
    pub name: String,
    pub state: CollectorState,
    /// Why it is unavailable or failed ("libnvidia-ml.so.1 not found: no NVIDIA driver"), or
    /// what an available collector cannot read ("XID events not supported on gpu1: ...").
    pub detail: String,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CollectorState {
    /// The library is loaded and the last collection succeeded.
    Available,
    /// No library, no driver, no device, or turned off in the config: nothing to measure here.
    #[default]
    Unavailable,
    /// The library is there but initialising it or the last collection failed.
    Failed,
}

impl CollectorState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Available => "available",
            Self::Unavailable => "unavailable",
            Self::Failed => "failed",
        }
    }
}

/// One NVIDIA GPU (NVML).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuDevice {
    /// NVML index (`nvmlDeviceGetIndex`); label `gpu="gpu<index>"`.
    pub index: u32,
    /// "GPU-8c2f...": stable across reboots, unlike the index.
    pub uuid: String,
    /// Product name, "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// PCI bus id as NVML writes it, "00000000:18:00.0".
    pub pci_bus_id: String,
    /// Minor number of the device file (`/dev/nvidia<minor>`).
    pub minor_number: Option<u32>,
    /// Kernel driver version, "580.65.06".
    pub driver_version: String,
    /// Share of the last sample period (1/6 s to 1 s) in which a kernel ran, 0-1.
    pub utilization_ratio: Option<f64>,
    /// Share of the last sample period in which device memory was read or written, 0-1.
    pub memory_utilization_ratio: Option<f64>,
    /// Allocated device memory.
    pub memory_used_bytes: Option<u64>,
    /// Unallocated device memory (total less used and less what the driver reserves).
    pub memory_free_bytes: Option<u64>,
    /// Installed device memory.
    pub memory_total_bytes: Option<u64>,
    /// Power draw.
    pub power_watts: Option<f64>,
    /// Energy used since the driver was loaded (Volta and newer), millijoules.
    pub energy_millijoules: Option<u64>,
    /// Core temperature.
    pub temperature_celsius: Option<i64>,
    /// Current SM clock.
    pub sm_clock_hertz: Option<u64>,
    /// Current memory clock.
    pub memory_clock_hertz: Option<u64>,
    /// PCIe transmit (GPU to host) throughput over NVML's last 20 ms sample.
    pub pcie_tx_bytes_per_second: Option<u64>,
    /// PCIe receive (host to GPU) throughput over NVML's last 20 ms sample.
    pub pcie_rx_bytes_per_second: Option<u64>,
    /// Active NVLinks; empty on GPUs without NVLink.
    pub nvlinks: Vec<NvLinkStats>,
    /// Corrected (single-bit) ECC errors since the driver was loaded.
    pub ecc_corrected_errors: Option<u64>,
    /// Uncorrected (double-bit) ECC errors since the driver was loaded.
    pub ecc_uncorrected_errors: Option<u64>,
    /// Clock throttle reasons active now, from [`THROTTLE_REASONS`]; empty: not throttled.
    pub throttle_reasons: Option<Vec<String>>,
    /// Critical XID events seen since ethand started watching; None when the GPU cannot
    /// deliver XID events to ethand.
    pub xid_errors: Option<u64>,
    /// The most recent XID code seen since ethand started watching.
    pub last_xid: Option<u64>,
    /// Whether the GPU and the loaded NVML offer GPM (GPU Performance Monitoring,
    /// `nvmlGpmQueryDeviceSupport`: Hopper and newer), which the four ratios below need.
    /// None: not asked (no NVML, or the question failed); Some(false): the four are absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpm_supported: Option<bool>,
    /// SM activity: share of time each SM had at least one warp assigned, averaged over all
    /// SMs, 0-1 (`NVML_GPM_METRIC_SM_UTIL`; dcgm-exporter's `DCGM_FI_PROF_SM_ACTIVE`). Over the
    /// last device interval, NVML GPM, Hopper and newer; absent where unsupported and for the
    /// first interval after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity_ratio: Option<f64>,
    /// SM occupancy: resident warps as a share of the maximum the SMs can hold, averaged over
    /// all SMs, 0-1 (`NVML_GPM_METRIC_SM_OCCUPANCY`; `DCGM_FI_PROF_SM_OCCUPANCY`). Over the
    /// last device interval, NVML GPM, Hopper and newer; absent where unsupported and for the
    /// first interval after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy_ratio: Option<f64>,
    /// Tensor activity: share of time the SMs' tensor pipes (any precision) were busy, 0-1
    /// (`NVML_GPM_METRIC_ANY_TENSOR_UTIL`; `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`). Over the last
    /// device interval, NVML GPM, Hopper and newer; absent where unsupported and for the
    /// first interval after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_activity_ratio: Option<f64>,
    /// DRAM bandwidth utilization: bytes moved to and from device memory as a share of the
    /// peak bandwidth, 0-1 (`NVML_GPM_METRIC_DRAM_BW_UTIL`; `DCGM_FI_PROF_DRAM_ACTIVE`). Over
    /// the last device interval, NVML GPM, Hopper and newer; absent where unsupported and for
    /// the first interval after start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_bandwidth_ratio: Option<f64>,
    /// Shares of time the SMs' FP64, FP32 and FP16 pipes (the non-tensor arithmetic units)
    /// were busy, 0-1 (`NVML_GPM_METRIC_FP64_UTIL` / `_FP32_UTIL` / `_FP16_UTIL`;
    /// `DCGM_FI_PROF_PIPE_FP64_ACTIVE` / `_FP32_` / `_FP16_`). GPM, over the last device
    /// interval, as the four above. An FP32 pipe busy with the tensor pipes idle is a matrix
    /// product computed without tensor cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp64_activity_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp32_activity_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp16_activity_ratio: Option<f64>,
    /// Graphics engine activity: share of time any engine of the graphics/compute context was
    /// busy, 0-1 (`NVML_GPM_METRIC_GRAPHICS_UTIL`; `DCGM_FI_PROF_GR_ENGINE_ACTIVE`). GPM, over
    /// the last device interval, as the four above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphics_activity_ratio: Option<f64>,
    /// PCIe transmit (GPU to host) and receive rates averaged over the last device interval,
    /// headers included (`NVML_GPM_METRIC_PCIE_TX_PER_SEC` / `_RX_PER_SEC`;
    /// `DCGM_FI_PROF_PCIE_TX_BYTES` / `_RX_BYTES`). GPM, as the four above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_tx_average_bytes_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_rx_average_bytes_per_second: Option<f64>,
    /// Device memory the driver reserves for itself (`nvmlDeviceGetMemoryInfo_v2` `reserved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reserved_bytes: Option<u64>,
    /// Memory (HBM) temperature (`NVML_FI_DEV_MEMORY_TEMP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_temperature_celsius: Option<i64>,
    /// Enforced power limit (`nvmlDeviceGetEnforcedPowerLimit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_watts: Option<f64>,
    /// Video encoder and decoder utilization over NVML's last sample period, 0-1
    /// (`nvmlDeviceGetEncoderUtilization` / `nvmlDeviceGetDecoderUtilization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_utilization_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_utilization_ratio: Option<f64>,
    /// PCIe link generation and width now, and the most the GPU and its slot allow
    /// (`nvmlDeviceGetCurrPcieLinkGeneration`, `...MaxPcieLinkGeneration`,
    /// `...CurrPcieLinkWidth`, `...MaxPcieLinkWidth`). An idle GPU lowers its generation to
    /// save power; a narrower width than the maximum is a downtrained link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_generation: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_generation_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_link_width_max: Option<u32>,
    /// PCIe replays (retransmissions) since the driver was loaded
    /// (`NVML_FI_DEV_PCIE_REPLAY_COUNTER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replays: Option<u64>,
    /// Row remapping (Ampere and newer; kept in the InfoROM, so across reboots): rows remapped
    /// for correctable and uncorrectable errors, a remap waiting for a GPU reset, and a remap
    /// that failed (the GPU needs service) (`NVML_FI_DEV_REMAPPED_COR` / `_UNC` / `_PENDING` /
    /// `_FAILURE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_correctable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_pending: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_failed: Option<bool>,
    /// Page retirement (before Ampere): pages retired for single-bit and double-bit errors,
    /// and a retirement waiting for a reset (`NVML_FI_DEV_RETIRED_SBE` / `_DBE` / `_PENDING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_single_bit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_double_bit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_pending: Option<bool>,
    /// NVLink traffic of all links, transmit plus receive payload, averaged over the last
    /// counters interval (from the per-link counters of two reads; absent after the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_bytes_per_second: Option<f64>,
    /// Critical XID events by code (`xid_label` bounds the label) since ethand started
    /// watching; their sum is `xid_errors`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xid_errors_by_code: std::collections::BTreeMap<u64, u64>,
    /// Fields this GPU or its driver does not have (NVML `NotSupported`, or a call the loaded
    /// library lacks), by their [`GpuDevice`] field name: absent from every output, and listed
    /// in `ethand status`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<String>,
}

/// One active NVLink of a GPU. Counters are cumulative since the driver was loaded.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NvLinkStats {
    pub link: u32,
    /// Payload bytes sent (NVML counts KiB).
    pub tx_bytes: Option<u64>,
    /// Payload bytes received (NVML counts KiB).
    pub rx_bytes: Option<u64>,
    /// Data link transmit replay errors.
    pub replay_errors: Option<u64>,
    /// Data link transmit recovery errors.
    pub recovery_errors: Option<u64>,
    /// Data link receive flow-control digit (FLIT) CRC errors.
    pub crc_flit_errors: Option<u64>,
    /// Data link receive data CRC errors.
    pub crc_data_errors: Option<u64>,
}

/// One Huawei Ascend NPU chip (DCMI).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NpuDevice {
    /// Logical id (`dcmi_get_device_logic_id`), as npu-smi and the Ascend runtime number
    /// devices; the enumeration order when the library lacks that call. Label
    /// `npu="npu<index>"`.
    pub index: u32,
    /// DCMI card id (NPU management unit).
    pub card_id: i32,
    /// Chip number within the card.
    pub device_id: i32,
    /// VDIE id (`dcmi_get_device_die_v2`): five 32-bit words in hex, dash-separated; empty
    /// when unknown.
    pub uuid: String,
    /// Chip name, "910B3" (`dcmi_get_device_chip_info`); empty when unknown.
    pub name: String,
    /// PCI bus id, "0000:c1:00.0"; empty when unknown.
    pub pci_bus_id: String,
    /// Driver version (`dcmi_get_driver_version`); empty when unknown.
    pub driver_version: String,
    /// AI core utilization, 0-1.
    pub aicore_utilization_ratio: Option<f64>,
    /// HBM in use.
    pub hbm_used_bytes: Option<u64>,
    /// HBM installed.
    pub hbm_total_bytes: Option<u64>,
    /// HBM bandwidth utilization, 0-1.
    pub hbm_bandwidth_utilization_ratio: Option<f64>,
    /// HBM temperature.
    pub hbm_temperature_celsius: Option<i64>,
    /// Chip power draw.
    pub power_watts: Option<f64>,
    /// Chip temperature.
    pub temperature_celsius: Option<i64>,
    /// DCMI health: 0 normal, 1 minor alarm, 2 major alarm, 3 critical alarm (the most
    /// severe alarm wins).
    pub health: Option<u32>,
}

/// A process holding memory on a device, as the driver reports it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceProcess {
    /// Host pid (NVML and DCMI report host pids, also for containerised processes).
    pub pid: u32,
    /// Device label as in the device metrics: "gpu0", "npu3".
    pub device: String,
    /// The device's uuid (GPU UUID or NPU VDIE id); empty when unknown.
    pub uuid: String,
    /// Device memory the process holds; None when the driver does not say.
    pub memory_used_bytes: Option<u64>,
    /// SM (GPU) utilization attributed to the process in the driver's newest per-process
    /// sample (NVML samples every 1/6 s to 1 s), 0-1; None when the driver does not give
    /// per-process utilization.
    pub utilization_ratio: Option<f64>,
}

impl GpuDevice {
    /// The `gpu` label value: "gpu0".
    pub fn label(&self) -> String {
        format!("gpu{}", self.index)
    }
}

impl NpuDevice {
    /// The `npu` label value: "npu0".
    pub fn label(&self) -> String {
        format!("npu{}", self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_serialize_as_their_names() {
        for s in [
            CollectorState::Available,
            CollectorState::Unavailable,
            CollectorState::Failed,
        ] {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
    }

    #[test]
    fn round_trips_through_json() {
        let snap = DevicesSnapshot {
            hostname: "node1".into(),
            collectors: vec![CollectorStatus {
                name: "nvml".into(),
                state: CollectorState::Available,
                detail: String::new(),
            }],
            gpus: vec![GpuDevice {
                index: 1,
                uuid: "GPU-1".into(),
                power_watts: Some(123.5),
                throttle_reasons: Some(vec!["sw_power_cap".into()]),
                nvlinks: vec![NvLinkStats {
                    link: 0,
                    tx_bytes: Some(1024),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            npus: vec![NpuDevice {
                index: 0,
                health: Some(0),
                ..Default::default()
            }],
            processes: vec![DeviceProcess {
                pid: 7,
                device: "gpu1".into(),
                uuid: "GPU-1".into(),
                memory_used_bytes: Some(1 << 20),
                utilization_ratio: None,
            }],
            xid_events: vec![XidEvent {
                seq: 1,
                gpu: 1,
                uuid: "GPU-1".into(),
                xid: 79,
                drained_unix_ns: 1,
                pids: vec![7],
            }],
        };
        let json = serde_json::to_string(&snap).unwrap();
        assert_eq!(
            serde_json::from_str::<DevicesSnapshot>(&json).unwrap(),
            snap
        );
        assert_eq!(snap.gpus[0].label(), "gpu1");
    }
}
