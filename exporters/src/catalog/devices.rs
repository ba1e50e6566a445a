//! GPUs and NPUs as the device collectors report them (`NodeSnapshot::devices`):
//! `ethand_gpu_*`, `ethand_npu_*`, per-process device memory and the collectors' state.
//!
//! A field the driver did not give (`None`) emits no sample. GPU series carry `gpu` ("gpu0")
//! and `uuid`; NPU series `npu` ("npu0") and `uuid`; the identity labels (model, PCI bus,
//! driver) are on `ethand_gpu_info` / `ethand_npu_info` only (over OTLP: on every `hw.*`
//! point). With `PrometheusOptions::device_workload_labels`, a GPU whose compute processes
//! all belong to one workload also gets that workload's `namespace`, `pod`, `container`,
//! `job_id`, `rank` (`prometheus::gpu_owners`). Per-process series are bounded: per device, the [`MAX_PROCESSES_PER_DEVICE`]
//! processes with the most device memory keep their pid, the rest are summed into
//! `pid="other"`. Over OTLP the per-process device usage comes from each selected process's
//! own record instead (the two OTLP-only entries at the end).
use std::collections::BTreeMap;

use ethand_snapshot::NodeSnapshot;
use ethand_snapshot::devices::{CollectorState, GpuDevice, NpuDevice, THROTTLE_REASONS, xid_label};

use super::labels::DIRECTION;
use super::{
    Label, Metric, Num, Otel, OtelKind, OtelLabel, Output, Per, Sample, Scope, Sink, Subject,
    counter, gauge, label, otel,
};

/// Per device, processes beyond this many (ranked by device memory) are summed into
/// `pid="other"`.
pub(crate) const MAX_PROCESSES_PER_DEVICE: usize = 32;

const LINK: Label = label("link", "ethand.nvlink");
const PID: Label = label("pid", "process.pid");
const GPU: Label = label("gpu", "hw.name");
const UUID: Label = label("uuid", "hw.id");
/// The XID code ([`xid_label`]: bounded, codes above 1023 as "other").
pub(crate) const XID: Label = label("xid", "ethand.gpu.xid");
const REMAP_CAUSE: Label =
    label("cause", "ethand.gpu.memory.error.cause").values("correctable, uncorrectable");
const RETIRE_CAUSE: Label =
    label("cause", "ethand.gpu.memory.error.cause").values("single_bit, double_bit");

/// One sample per GPU where `value` has one.
fn each_gpu(s: &Scope, o: &mut dyn Sink, value: fn(&GpuDevice) -> Option<Sample<'static>>) {
    for g in &s.snap.devices.gpus {
        if let Some(v) = value(g) {
            o.sample(Subject::Gpu(g), &[], v);
        }
    }
}

/// One sample per NPU where `value` has one.
fn each_npu(s: &Scope, o: &mut dyn Sink, value: fn(&NpuDevice) -> Option<Sample<'static>>) {
    for n in &s.snap.devices.npus {
        if let Some(v) = value(n) {
            o.sample(Subject::Npu(n), &[], v);
        }
    }
}

/// What one `pid` label value of one device stands for.
pub(crate) struct DeviceProcess<'a> {
    /// The pid, or "other" beyond the [`MAX_PROCESSES_PER_DEVICE`] with the most memory.
    pid: String,
    device: &'a str,
    uuid: &'a str,
    npu: bool,
    memory: Option<u64>,
    utilization: Option<f64>,
    /// namespace, pod, container, job_id, rank of the process where known ("" otherwise,
    /// and for "other"): the values of the `OWNER_*` labels.
    workload: [String; 5],
}

// The workload labels of a driver-listed process, as its own series have them (dcgm-exporter's
// `namespace`, `pod`, `container`; `job_id`, `rank`); left out where unknown. A process has one
// value of each, so they add no series.
const OWNER_NAMESPACE: Label = label("namespace", "k8s.namespace.name").omit_empty();
const OWNER_POD: Label = label("pod", "k8s.pod.name").omit_empty();
const OWNER_CONTAINER: Label = label("container", "k8s.container.name").omit_empty();
const OWNER_JOB: Label = label("job_id", "ethand.job.id").omit_empty();
const OWNER_RANK: Label = label("rank", "ethand.rank").omit_empty();

/// The `OWNER_*` labels' values for `pid` from the snapshot's processes.
fn owner_of(processes: &[ethand_snapshot::ProcessSnapshot], pid: &str) -> [String; 5] {
    let w = pid
        .parse::<u32>()
        .ok()
        .and_then(|pid| processes.iter().find(|p| p.pid == pid && p.alive))
        .and_then(|p| p.workload.as_ref());
    let Some(w) = w else {
        return Default::default();
    };
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    [
        s(&w.namespace),
        s(&w.pod),
        s(&w.container),
        s(&w.job_id),
        w.rank.map(|r| r.to_string()).unwrap_or_default(),
    ]
}

/// One sample of a per-process device series: pid, device, uuid, then the `OWNER_*` labels.
fn device_process_sample(o: &mut dyn Sink, p: &DeviceProcess<'_>, v: Sample<'_>) {
    let [a, b, c, d, e] = &p.workload;
    o.sample(Subject::Node, &[&p.pid, p.device, p.uuid, a, b, c, d, e], v);
}

/// Per device (label, uuid), its processes, most memory first (ties to the lower pid), the
/// ones beyond the cap summed into `pid="other"`.
fn device_processes(snap: &NodeSnapshot) -> Vec<DeviceProcess<'_>> {
    let d = &snap.devices;
    let mut by_device: BTreeMap<(&str, &str), Vec<_>> = BTreeMap::new();
    for p in &d.processes {
        by_device
            .entry((p.device.as_str(), p.uuid.as_str()))
            .or_default()
            .push(p);
    }
    let mut out = Vec::new();
    for ((device, uuid), mut procs) in by_device {
        procs.sort_by_key(|p| (std::cmp::Reverse(p.memory_used_bytes.unwrap_or(0)), p.pid));
        let mut series: BTreeMap<String, (Option<u64>, Option<f64>)> = BTreeMap::new();
        for (rank, p) in procs.iter().enumerate() {
            let pid = if rank < MAX_PROCESSES_PER_DEVICE {
                p.pid.to_string()
            } else {
                "other".to_owned()
            };
            let (memory, utilization) = series.entry(pid).or_default();
            if let Some(m) = p.memory_used_bytes {
                *memory = Some(memory.unwrap_or(0).saturating_add(m));
            }
            if let Some(u) = p.utilization_ratio {
                *utilization = Some(utilization.unwrap_or(0.0) + u);
            }
        }
        let npu = device.starts_with("npu");
        out.extend(
            series
                .into_iter()
                .map(|(pid, (memory, utilization))| DeviceProcess {
                    workload: owner_of(&snap.processes, &pid),
                    pid,
                    device,
                    uuid,
                    npu,
                    memory,
                    utilization,
                }),
        );
    }
    out
}

/// hw.id of a process's device usage: the device's uuid, else its label.
fn device_id(d: &ethand_snapshot::gpu::ProcessDeviceUsage) -> &str {
    if d.uuid.is_empty() {
        &d.device
    } else {
        &d.uuid
    }
}

/// hw.id and hw.name of a process's device usage (OTLP only).
const PROCESS_DEVICE: &[Label] = &[
    label("", "hw.id").values("device uuid, else gpu0/npu0"),
    label("", "hw.name"),
];

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        gauge(
            "ethand_device_collector_up",
            "1 when the device collector (nvml, dcmi) reads its devices, 0 when it is unavailable or \
     failed; `ethand status` says why.",
        ),
        Per::Node,
        Otel::Metric(otel("ethand.device.collector.up", "1", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for c in &s.snap.devices.collectors {
                let up = u64::from(c.state == CollectorState::Available);
                o.sample(Subject::Node, &[&c.name], Sample::Int(up));
            }
        },
    )
    .labels(&[label("collector", "ethand.collector").values("nvml, dcmi")]),
    Metric::new(
        gauge(
            "ethand_gpu_info",
            "NVIDIA GPU identity (model name, PCI bus id, driver version), value always 1 (NVML).",
        ),
        Per::Device,
        Otel::NotExported(
            "name, PCI bus id and driver are attributes (hw.model, ethand.pci_bus_id, \
             ethand.driver.version) of every hw.* point",
        ),
        |s, o| {
            for g in &s.snap.devices.gpus {
                let identity = [g.name.as_str(), &g.pci_bus_id, &g.driver_version];
                o.sample(Subject::Gpu(g), &identity, Sample::Int(1));
            }
        },
    )
    .labels(&[label("name", "hw.model"), label("pci_bus_id", "ethand.pci_bus_id"), label("driver", "ethand.driver.version")]),
    Metric::new(
        gauge(
            "ethand_gpu_utilization_ratio",
            "Share of the last sample period in which a kernel ran on the GPU, 0-1 \
     (nvmlDeviceGetUtilizationRates).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.utilization", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_utilization_ratio",
            "Share of the last sample period in which GPU memory was read or written, 0-1 \
     (nvmlDeviceGetUtilizationRates).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.memory_utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_encoder_utilization_ratio",
            "Share of the last sample period in which the GPU's video encoder was busy, 0-1 \
     (nvmlDeviceGetEncoderUtilization).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.utilization", "1", OtelKind::Gauge, Num::Float).with(&[("hw.gpu.task", "encoder")])),
        |s, o| each_gpu(s, o, |g| g.encoder_utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_decoder_utilization_ratio",
            "Share of the last sample period in which the GPU's video decoder was busy, 0-1 \
     (nvmlDeviceGetDecoderUtilization).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.utilization", "1", OtelKind::Gauge, Num::Float).with(&[("hw.gpu.task", "decoder")])),
        |s, o| each_gpu(s, o, |g| g.decoder_utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_sm_activity_ratio",
            "Share of time the GPU's SMs had at least one warp assigned, averaged over the SMs, over \
     the last device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_SM_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.sm.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.sm_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_sm_occupancy_ratio",
            "Warps resident on the GPU's SMs as a share of the most they can hold, averaged over the \
     SMs, over the last device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_SM_OCCUPANCY).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.sm.occupancy", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.sm_occupancy_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_tensor_activity_ratio",
            "Share of time the GPU's tensor pipes (any precision) were busy, over the last device \
     interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_ANY_TENSOR_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.tensor.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.tensor_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_fp64_activity_ratio",
            "Share of time the GPU's FP64 pipes (not the tensor cores) were busy, over the last \
     device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_FP64_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.fp64.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.fp64_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_fp32_activity_ratio",
            "Share of time the GPU's FP32 pipes (not the tensor cores) were busy, over the last \
     device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_FP32_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.fp32.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.fp32_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_fp16_activity_ratio",
            "Share of time the GPU's FP16 pipes (not the tensor cores) were busy, over the last \
     device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_FP16_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.fp16.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.fp16_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_dram_bandwidth_ratio",
            "GPU memory (DRAM) bandwidth used as a share of its peak, over the last device interval, \
     0-1; Hopper and newer, absent elsewhere (NVML GPM, NVML_GPM_METRIC_DRAM_BW_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.bandwidth.utilization", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.dram_bandwidth_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_graphics_activity_ratio",
            "Share of time any engine of the GPU's graphics/compute context was busy, over the last \
     device interval, 0-1; Hopper and newer, absent elsewhere (NVML GPM, \
     NVML_GPM_METRIC_GRAPHICS_UTIL).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.graphics.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.graphics_activity_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_used_bytes",
            "Allocated GPU memory (nvmlDeviceGetMemoryInfo).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.memory.usage", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.memory_used_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_total_bytes",
            "Installed GPU memory (nvmlDeviceGetMemoryInfo).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.memory.limit", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.memory_total_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_free_bytes",
            "Unallocated GPU memory: installed less used and less what the driver reserves \
     (nvmlDeviceGetMemoryInfo_v2).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.free", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.memory_free_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_reserved_bytes",
            "GPU memory the driver reserves for itself (nvmlDeviceGetMemoryInfo_v2).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.reserved", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.memory_reserved_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_power_watts",
            "GPU power draw (nvmlDeviceGetPowerUsage).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.power", "W", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.power_watts.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_power_limit_watts",
            "Power limit the driver enforces on the GPU (nvmlDeviceGetEnforcedPowerLimit).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.power.limit", "W", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.power_limit_watts.map(Sample::Float)),
    ),
    Metric::new(
        counter(
            "ethand_gpu_energy_joules_total",
            "Energy the GPU used since the driver was loaded (nvmlDeviceGetTotalEnergyConsumption).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.energy", "J", OtelKind::Counter, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.energy_millijoules.map(|mj| Sample::Float(mj as f64 / 1e3))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_temperature_celsius",
            "GPU core temperature (nvmlDeviceGetTemperature).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.temperature", "Cel", OtelKind::Gauge, Num::Float).with(&[("hw.sensor_location", "core")])),
        |s, o| each_gpu(s, o, |g| g.temperature_celsius.map(|c| Sample::Float(c as f64))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_temperature_celsius",
            "GPU memory (HBM) temperature (nvmlDeviceGetFieldValues NVML_FI_DEV_MEMORY_TEMP).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.temperature", "Cel", OtelKind::Gauge, Num::Float).with(&[("hw.sensor_location", "memory")])),
        |s, o| each_gpu(s, o, |g| g.memory_temperature_celsius.map(|c| Sample::Float(c as f64))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_sm_clock_hertz",
            "Current SM clock (nvmlDeviceGetClockInfo).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.clock.sm", "Hz", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.sm_clock_hertz.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_clock_hertz",
            "Current memory clock (nvmlDeviceGetClockInfo).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.clock.memory", "Hz", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.memory_clock_hertz.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_tx_bytes_per_second",
            "PCIe throughput from the GPU to the host over the driver's last 20 ms sample \
     (nvmlDeviceGetPcieThroughput).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.throughput", "By/s", OtelKind::Gauge, Num::Int).with(&[("network.io.direction", "transmit")])),
        |s, o| each_gpu(s, o, |g| g.pcie_tx_bytes_per_second.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_rx_bytes_per_second",
            "PCIe throughput from the host to the GPU over the driver's last 20 ms sample \
     (nvmlDeviceGetPcieThroughput).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.throughput", "By/s", OtelKind::Gauge, Num::Int).with(&[("network.io.direction", "receive")])),
        |s, o| each_gpu(s, o, |g| g.pcie_rx_bytes_per_second.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_tx_average_bytes_per_second",
            "PCIe traffic from the GPU to the host, headers included, averaged over the last device \
     interval; Hopper and newer, absent elsewhere (NVML GPM, NVML_GPM_METRIC_PCIE_TX_PER_SEC).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.throughput.average", "By/s", OtelKind::Gauge, Num::Float).with(&[("network.io.direction", "transmit")])),
        |s, o| each_gpu(s, o, |g| g.pcie_tx_average_bytes_per_second.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_rx_average_bytes_per_second",
            "PCIe traffic from the host to the GPU, headers included, averaged over the last device \
     interval; Hopper and newer, absent elsewhere (NVML GPM, NVML_GPM_METRIC_PCIE_RX_PER_SEC).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.throughput.average", "By/s", OtelKind::Gauge, Num::Float).with(&[("network.io.direction", "receive")])),
        |s, o| each_gpu(s, o, |g| g.pcie_rx_average_bytes_per_second.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_link_generation",
            "PCIe generation the GPU's link runs at now; an idle GPU lowers it to save power \
     (nvmlDeviceGetCurrPcieLinkGeneration).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.link.generation", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.pcie_link_generation.map(|v| Sample::Int(u64::from(v)))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_link_generation_max",
            "Highest PCIe generation the GPU and its slot allow (nvmlDeviceGetMaxPcieLinkGeneration).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.link.generation.max", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.pcie_link_generation_max.map(|v| Sample::Int(u64::from(v)))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_link_width",
            "PCIe lanes the GPU's link uses now; below the maximum the link is downtrained \
     (nvmlDeviceGetCurrPcieLinkWidth).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.link.width", "{lane}", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.pcie_link_width.map(|v| Sample::Int(u64::from(v)))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_pcie_link_width_max",
            "Most PCIe lanes the GPU and its slot allow (nvmlDeviceGetMaxPcieLinkWidth).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.link.width.max", "{lane}", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.pcie_link_width_max.map(|v| Sample::Int(u64::from(v)))),
    ),
    Metric::new(
        counter(
            "ethand_gpu_pcie_replays_total",
            "PCIe replays (link-level retransmissions) of the GPU since the driver was loaded \
     (nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_REPLAY_COUNTER).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.pcie.replays", "{replay}", OtelKind::Counter, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.pcie_replays.map(Sample::Int)),
    ),
    Metric::new(
        counter(
            "ethand_gpu_nvlink_bytes_total",
            "Payload bytes sent (transmit) or received (receive) over each active NVLink since the \
     driver was loaded (nvmlDeviceGetFieldValues NVLINK_THROUGHPUT_DATA).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.nvlink.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                for n in &g.nvlinks {
                    let link = n.link.to_string();
                    for (direction, bytes) in [("transmit", n.tx_bytes), ("receive", n.rx_bytes)] {
                        if let Some(b) = bytes {
                            o.sample(Subject::Gpu(g), &[&link, direction], Sample::Int(b));
                        }
                    }
                }
            }
        },
    )
    .labels(&[LINK, DIRECTION]),
    Metric::new(
        gauge(
            "ethand_gpu_nvlink_bytes_per_second",
            "NVLink payload traffic of all the GPU's links, transmit plus receive, averaged over the \
     last device interval; absent after the first read (nvmlDeviceGetFieldValues \
     NVLINK_THROUGHPUT_DATA, two reads).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.nvlink.throughput", "By/s", OtelKind::Gauge, Num::Float)),
        |s, o| each_gpu(s, o, |g| g.nvlink_bytes_per_second.map(Sample::Float)),
    ),
    Metric::new(
        counter(
            "ethand_gpu_nvlink_errors_total",
            "NVLink data link errors by link and type: replay, recovery, crc_flit, crc_data \
     (nvmlDeviceGetNvLinkErrorCounter).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.nvlink.errors", "{error}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                for n in &g.nvlinks {
                    let link = n.link.to_string();
                    for (kind, errors) in [
                        ("replay", n.replay_errors),
                        ("recovery", n.recovery_errors),
                        ("crc_flit", n.crc_flit_errors),
                        ("crc_data", n.crc_data_errors),
                    ] {
                        if let Some(e) = errors {
                            o.sample(Subject::Gpu(g), &[&link, kind], Sample::Int(e));
                        }
                    }
                }
            }
        },
    )
    .labels(&[LINK, label("type", "error.type").values("replay, recovery, crc_flit, crc_data")]),
    Metric::new(
        counter(
            "ethand_gpu_ecc_errors_total",
            "GPU memory ECC errors since the driver was loaded, corrected or uncorrected \
     (nvmlDeviceGetTotalEccErrors, volatile).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.errors", "{error}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                for (kind, errors) in [
                    ("corrected", g.ecc_corrected_errors),
                    ("uncorrected", g.ecc_uncorrected_errors),
                ] {
                    if let Some(e) = errors {
                        o.sample(Subject::Gpu(g), &[kind], Sample::Int(e));
                    }
                }
            }
        },
    )
    .labels(&[Label {
        otel: OtelLabel::Renamed(
            "error.type",
            &[("corrected", "ecc_corrected"), ("uncorrected", "ecc_uncorrected")],
        ),
        ..label("type", "")
    }]),
    Metric::new(
        counter(
            "ethand_gpu_memory_remapped_rows_total",
            "GPU memory rows remapped to spares, by the cause of the errors (correctable, \
     uncorrectable); kept in the InfoROM across reboots, Ampere and newer \
     (nvmlDeviceGetFieldValues NVML_FI_DEV_REMAPPED_COR / _UNC).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.remapped_rows", "{row}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                for (cause, rows) in [
                    ("correctable", g.remapped_rows_correctable),
                    ("uncorrectable", g.remapped_rows_uncorrectable),
                ] {
                    if let Some(n) = rows {
                        o.sample(Subject::Gpu(g), &[cause], Sample::Int(n));
                    }
                }
            }
        },
    )
    .labels(&[REMAP_CAUSE]),
    Metric::new(
        gauge(
            "ethand_gpu_memory_row_remap_pending",
            "1 while a row remap waits for a GPU reset to take effect, else 0; Ampere and newer \
     (nvmlDeviceGetFieldValues NVML_FI_DEV_REMAPPED_PENDING).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.row_remap.pending", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.row_remap_pending.map(|b| Sample::Int(u64::from(b)))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_memory_row_remap_failed",
            "1 when a row remap failed (no spare row left: the GPU needs service), else 0; Ampere \
     and newer (nvmlDeviceGetFieldValues NVML_FI_DEV_REMAPPED_FAILURE).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.row_remap.failed", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.row_remap_failed.map(|b| Sample::Int(u64::from(b)))),
    ),
    Metric::new(
        counter(
            "ethand_gpu_memory_retired_pages_total",
            "GPU memory pages retired, by the cause of the errors (single_bit, double_bit); GPUs \
     before Ampere (nvmlDeviceGetFieldValues NVML_FI_DEV_RETIRED_SBE / _DBE).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.retired_pages", "{page}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                for (cause, pages) in [
                    ("single_bit", g.retired_pages_single_bit),
                    ("double_bit", g.retired_pages_double_bit),
                ] {
                    if let Some(n) = pages {
                        o.sample(Subject::Gpu(g), &[cause], Sample::Int(n));
                    }
                }
            }
        },
    )
    .labels(&[RETIRE_CAUSE]),
    Metric::new(
        gauge(
            "ethand_gpu_memory_retired_pages_pending",
            "1 while a page retirement waits for a GPU reset, else 0; GPUs before Ampere \
     (nvmlDeviceGetFieldValues NVML_FI_DEV_RETIRED_PENDING).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.retired_pages.pending", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_gpu(s, o, |g| g.retired_pages_pending.map(|b| Sample::Int(u64::from(b)))),
    ),
    Metric::new(
        gauge(
            "ethand_gpu_throttle_reason",
            "1 for each clock throttle reason active now, 0 for the others \
     (nvmlDeviceGetCurrentClocksThrottleReasons).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.throttle", "1", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for g in &s.snap.devices.gpus {
                let Some(active) = &g.throttle_reasons else {
                    continue;
                };
                // Every known reason as 0/1, plus any name the collector reported beyond them.
                let extra = active
                    .iter()
                    .map(String::as_str)
                    .filter(|r| !THROTTLE_REASONS.contains(r));
                for reason in THROTTLE_REASONS.iter().copied().chain(extra) {
                    let on = u64::from(active.iter().any(|a| a == reason));
                    o.sample(Subject::Gpu(g), &[reason], Sample::Int(on));
                }
            }
        },
    )
    .labels(&[label("reason", "ethand.throttle.reason").otel_only(THROTTLE_REASONS)]),
    Metric::new(
        counter(
            "ethand_gpu_xid_errors_total",
            "Critical XID error events of the GPU since ethand started watching, by XID code (codes \
     above 1023 as xid=\"other\"); a watched GPU without events has no series (NVML event set, \
     nvmlEventTypeXidCriticalError).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.errors", "{error}", OtelKind::Counter, Num::Int).with(&[("error.type", "xid")])),
        |s, o| {
            for g in &s.snap.devices.gpus {
                if g.xid_errors.is_none() {
                    continue;
                }
                for (&code, &n) in &g.xid_errors_by_code {
                    o.sample(Subject::Gpu(g), &[&xid_label(code)], Sample::Int(n));
                }
            }
        },
    )
    .labels(&[XID]),
    Metric::new(
        gauge(
            "ethand_npu_info",
            "Ascend NPU identity (chip name, PCI bus id, driver version, DCMI card and chip), value \
     always 1 (DCMI).",
        ),
        Per::Device,
        Otel::NotExported("as ethand_gpu_info, on the NPU's hw.* points"),
        |s, o| {
            for n in &s.snap.devices.npus {
                let (card, chip) = (n.card_id.to_string(), n.device_id.to_string());
                let identity = [n.name.as_str(), &n.pci_bus_id, &n.driver_version, &card, &chip];
                o.sample(Subject::Npu(n), &identity, Sample::Int(1));
            }
        },
    )
    .labels(&[
        label("name", "hw.model"),
        label("pci_bus_id", "ethand.pci_bus_id"),
        label("driver", "ethand.driver.version"),
        label("card", "ethand.npu.card"),
        label("chip", "ethand.npu.chip"),
    ]),
    Metric::new(
        gauge(
            "ethand_npu_aicore_utilization_ratio",
            "AI core utilization of the NPU, 0-1 (dcmi_get_device_utilization_rate).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.utilization", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_npu(s, o, |n| n.aicore_utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_npu_hbm_used_bytes",
            "HBM in use on the NPU (dcmi_get_device_hbm_info).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.memory.usage", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_npu(s, o, |n| n.hbm_used_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_npu_hbm_total_bytes",
            "HBM installed on the NPU (dcmi_get_device_hbm_info).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.gpu.memory.limit", "By", OtelKind::UpDownCounter, Num::Int)),
        |s, o| each_npu(s, o, |n| n.hbm_total_bytes.map(Sample::Int)),
    ),
    Metric::new(
        gauge(
            "ethand_npu_hbm_bandwidth_utilization_ratio",
            "HBM bandwidth utilization of the NPU, 0-1 (dcmi_get_device_hbm_info).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.gpu.memory.activity", "1", OtelKind::Gauge, Num::Float)),
        |s, o| each_npu(s, o, |n| n.hbm_bandwidth_utilization_ratio.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_npu_hbm_temperature_celsius",
            "HBM temperature of the NPU (dcmi_get_device_hbm_info).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.temperature", "Cel", OtelKind::Gauge, Num::Float).with(&[("hw.sensor_location", "hbm")])),
        |s, o| each_npu(s, o, |n| n.hbm_temperature_celsius.map(|c| Sample::Float(c as f64))),
    ),
    Metric::new(
        gauge(
            "ethand_npu_power_watts",
            "NPU chip power draw (dcmi_get_device_power_info).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.power", "W", OtelKind::Gauge, Num::Float)),
        |s, o| each_npu(s, o, |n| n.power_watts.map(Sample::Float)),
    ),
    Metric::new(
        gauge(
            "ethand_npu_temperature_celsius",
            "NPU chip temperature (dcmi_get_device_temperature).",
        ),
        Per::Device,
        Otel::Metric(otel("hw.temperature", "Cel", OtelKind::Gauge, Num::Float).with(&[("hw.sensor_location", "core")])),
        |s, o| each_npu(s, o, |n| n.temperature_celsius.map(|c| Sample::Float(c as f64))),
    ),
    Metric::new(
        gauge(
            "ethand_npu_health",
            "NPU health: 0 normal, 1 minor alarm, 2 major alarm, 3 critical alarm; the most severe \
     alarm wins (dcmi_get_device_health).",
        ),
        Per::Device,
        Otel::Metric(otel("ethand.npu.health", "1", OtelKind::Gauge, Num::Int)),
        |s, o| each_npu(s, o, |n| n.health.map(|h| Sample::Int(u64::from(h)))),
    ),
    Metric::new(
        gauge(
            "ethand_process_gpu_memory_bytes",
            "GPU memory held by the process, per GPU; per GPU the 32 processes with the most memory, \
     the rest as pid=\"other\"; with the process's namespace, pod, container, job_id and rank \
     labels where known (nvmlDeviceGetComputeRunningProcesses).",
        ),
        Per::Node,
        Otel::Elsewhere("ethand.process.gpu.memory.usage"),
        |s, o| {
            for series in device_processes(s.snap).iter().filter(|p| !p.npu) {
                if let Some(m) = series.memory {
                    device_process_sample(o, series, Sample::Int(m));
                }
            }
        },
    )
    .labels(&[PID, GPU, UUID, OWNER_NAMESPACE, OWNER_POD, OWNER_CONTAINER, OWNER_JOB, OWNER_RANK]),
    Metric::new(
        gauge(
            "ethand_process_gpu_utilization_ratio",
            "Share of the GPU's SMs the process used in the driver's newest per-process sample (taken \
     every 1/6 s to 1 s), 0-1; the same 32 processes per GPU as ethand_process_gpu_memory_bytes \
     (nvmlDeviceGetProcessUtilization).",
        ),
        Per::Node,
        Otel::Elsewhere("ethand.process.gpu.utilization"),
        |s, o| {
            for series in device_processes(s.snap).iter().filter(|p| !p.npu) {
                if let Some(u) = series.utilization {
                    device_process_sample(o, series, Sample::Float(u));
                }
            }
        },
    )
    .labels(&[PID, GPU, UUID, OWNER_NAMESPACE, OWNER_POD, OWNER_CONTAINER, OWNER_JOB, OWNER_RANK]),
    Metric::new(
        gauge(
            "ethand_process_npu_memory_bytes",
            "NPU memory held by the process, per NPU; per NPU the 32 processes with the most memory, \
     the rest as pid=\"other\" (dcmi_get_device_resource_info).",
        ),
        Per::Node,
        Otel::Elsewhere("ethand.process.gpu.memory.usage"),
        |s, o| {
            for series in device_processes(s.snap).iter().filter(|p| p.npu) {
                if let Some(m) = series.memory {
                    device_process_sample(o, series, Sample::Int(m));
                }
            }
        },
    )
    .labels(&[PID, label("npu", "hw.name"), UUID, OWNER_NAMESPACE, OWNER_POD, OWNER_CONTAINER, OWNER_JOB, OWNER_RANK]),
    // OTLP only: per selected process from its own device usage, where /metrics has the
    // capped per-device lists above.
    Metric {
        output: Output::OtlpOnly,
        ..Metric::new(
            gauge(
                "ethand_process_gpu_memory_bytes, ethand_process_npu_memory_bytes",
                "Device memory held by the process, per device, as the driver reports it (NVML, DCMI).",
            ),
            Per::Process,
            Otel::Metric(otel(
                "ethand.process.gpu.memory.usage",
                "By",
                OtelKind::UpDownCounter,
                Num::Int,
            )),
            |s, o| {
                for (id, p) in s.processes() {
                    for d in &p.devices {
                        let value = Sample::Int(d.memory_used_bytes);
                        o.sample(id, &[device_id(d), &d.device], value);
                    }
                }
            },
        )
        .labels(PROCESS_DEVICE)
    },
    Metric {
        output: Output::OtlpOnly,
        ..Metric::new(
            gauge(
                "ethand_process_gpu_utilization_ratio",
                "Share of the device's SMs the process used in the driver's newest sample, 0-1.",
            ),
            Per::Process,
            Otel::Metric(otel(
                "ethand.process.gpu.utilization",
                "1",
                OtelKind::Gauge,
                Num::Float,
            )),
            |s, o| {
                for (id, p) in s.processes() {
                    for d in &p.devices {
                        if let Some(u) = d.utilization_ratio {
                            o.sample(id, &[device_id(d), &d.device], Sample::Float(u));
                        }
                    }
                }
            },
        )
        .labels(PROCESS_DEVICE)
    },
];
