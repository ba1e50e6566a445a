//! OTLP metrics not in [`crate::catalog`] yet (GPU/NPU runtime and device series), each with an
//! `observe` of its own; they move into the catalog area by area.
use std::borrow::Cow;

use opentelemetry::KeyValue;

use super::metrics::{Kind, MetricSpec, Num, Observe, V};

/// Prometheus families of the areas below with no OTLP metric of their own, and why.
pub(crate) const NOT_EXPORTED: &[(&str, &str)] = &[
    (
        "ethand_gpu_info",
        "name, PCI bus id and driver are attributes (hw.model, ethand.pci_bus_id, \
         ethand.driver.version) of every hw.* point",
    ),
    (
        "ethand_npu_info",
        "as ethand_gpu_info, on the NPU's hw.* points",
    ),
    (
        "DCGM_FI_*",
        "dcgm-exporter aliases exist for existing Prometheus dashboards only",
    ),
];

pub(crate) fn specs() -> impl Iterator<Item = MetricSpec> {
    LEGACY.iter().map(|m| MetricSpec {
        name: m.name,
        unit: m.unit,
        kind: m.kind,
        num: m.num,
        prometheus: m.prometheus.clone(),
        attributes: m.attributes.clone(),
        description: m.description,
        observe: match m.observe {
            Observe::Legacy(f) => Observe::Legacy(f),
            Observe::Catalog(_) => unreachable!("legacy metrics have their own observe"),
        },
    })
}

const HW: &str = "hw.id, hw.name, hw.type, hw.model, hw.vendor";

macro_rules! spec {
    ($name:expr, $unit:expr, $kind:ident, $num:ident, $prom:expr, $attrs:expr, $desc:expr, $f:expr) => {
        MetricSpec {
            name: $name,
            unit: $unit,
            kind: Kind::$kind,
            num: Num::$num,
            prometheus: Cow::Borrowed($prom),
            attributes: Cow::Borrowed($attrs),
            description: $desc,
            observe: Observe::Legacy($f),
        }
    };
}

/// The metrics not in the catalog yet.
const LEGACY: &[MetricSpec] = &[
    // --- per process: what the device drivers report
    spec!(
        "ethand.process.gpu.memory.usage",
        "By",
        UpDownCounter,
        Int,
        "ethand_process_gpu_memory_bytes, ethand_process_npu_memory_bytes",
        "hw.id (device uuid, else gpu0/npu0), hw.name",
        "Device memory held by the process, per device, as the driver reports it (NVML, DCMI).",
        |v, o| for (p, id) in v.each_proc() {
            for d in &p.devices {
                o.proc(
                    id,
                    &[("hw.id", dev_id(d)), ("hw.name", &d.device)],
                    V::U(d.memory_used_bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.utilization",
        "1",
        Gauge,
        Float,
        "ethand_process_gpu_utilization_ratio",
        "hw.id, hw.name",
        "Share of the device's SMs the process used in the driver's newest sample, 0-1.",
        |v, o| for (p, id) in v.each_proc() {
            for d in &p.devices {
                if let Some(u) = d.utilization_ratio {
                    o.proc(id, &[("hw.id", dev_id(d)), ("hw.name", &d.device)], V::F(u))
                }
            }
        }
    ),
    // --- devices (NVML, DCMI)
    spec!(
        "ethand.device.collector.up",
        "1",
        Gauge,
        Int,
        "ethand_device_collector_up",
        "ethand.collector (nvml, dcmi)",
        "1 when the device collector's library is loaded and its last collection succeeded.",
        |v, o| for c in &v.snap.devices.collectors {
            o.plain(
                &[("ethand.collector", &c.name)],
                V::U(u64::from(
                    c.state == ethand_snapshot::devices::CollectorState::Available,
                )),
            )
        }
    ),
    spec!(
        "hw.gpu.utilization",
        "1",
        Gauge,
        Float,
        "ethand_gpu_utilization_ratio, ethand_npu_aicore_utilization_ratio",
        HW,
        "Share of the last sample period in which a kernel ran (GPU) or AI-core utilization (NPU), 0-1.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.utilization_ratio {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.aicore_utilization_ratio {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.memory.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_memory_utilization_ratio, ethand_npu_hbm_bandwidth_utilization_ratio",
        HW,
        "Share of time device memory was read or written (GPU) or HBM bandwidth utilization (NPU), 0-1.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_utilization_ratio {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_bandwidth_utilization_ratio {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    // GPM (Hopper and newer): no points where unsupported or not yet measured.
    spec!(
        "ethand.gpu.sm.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_sm_activity_ratio",
        HW,
        "Share of time the SMs had at least one warp assigned, averaged over the SMs, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_activity_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.sm.occupancy",
        "1",
        Gauge,
        Float,
        "ethand_gpu_sm_occupancy_ratio",
        HW,
        "Resident warps as a share of the most the SMs can hold, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_occupancy_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.tensor.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_tensor_activity_ratio",
        HW,
        "Share of time the tensor pipes (any precision) were busy, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.tensor_activity_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.memory.bandwidth.utilization",
        "1",
        Gauge,
        Float,
        "ethand_gpu_dram_bandwidth_ratio",
        HW,
        "GPU memory (DRAM) bandwidth used as a share of its peak, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.dram_bandwidth_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "hw.gpu.memory.usage",
        "By",
        UpDownCounter,
        Int,
        "ethand_gpu_memory_used_bytes, ethand_npu_hbm_used_bytes",
        HW,
        "Device memory in use.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_used_bytes {
                    o.add(gpu_hw(g, &[]), V::U(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_used_bytes {
                    o.add(npu_hw(n, &[]), V::U(x))
                }
            }
        }
    ),
    spec!(
        "hw.gpu.memory.limit",
        "By",
        UpDownCounter,
        Int,
        "ethand_gpu_memory_total_bytes, ethand_npu_hbm_total_bytes",
        HW,
        "Installed device memory.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_total_bytes {
                    o.add(gpu_hw(g, &[]), V::U(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_total_bytes {
                    o.add(npu_hw(n, &[]), V::U(x))
                }
            }
        }
    ),
    spec!(
        "hw.power",
        "W",
        Gauge,
        Float,
        "ethand_gpu_power_watts, ethand_npu_power_watts",
        HW,
        "Power draw of the device.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.power_watts {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.power_watts {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    spec!(
        "hw.energy",
        "J",
        Counter,
        Float,
        "ethand_gpu_energy_joules_total",
        HW,
        "Energy the GPU used since the driver was loaded.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.energy_millijoules {
                o.add(gpu_hw(g, &[]), V::F(x as f64 / 1e3))
            }
        }
    ),
    spec!(
        "hw.temperature",
        "Cel",
        Gauge,
        Float,
        "ethand_gpu_temperature_celsius, ethand_npu_temperature_celsius, ethand_npu_hbm_temperature_celsius",
        "hw.*, hw.sensor_location (core, hbm)",
        "Temperature of the device's core, or of an NPU's HBM.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.temperature_celsius {
                    o.add(gpu_hw(g, &[("hw.sensor_location", "core")]), V::F(x as f64))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.temperature_celsius {
                    o.add(npu_hw(n, &[("hw.sensor_location", "core")]), V::F(x as f64))
                }
                if let Some(x) = n.hbm_temperature_celsius {
                    o.add(npu_hw(n, &[("hw.sensor_location", "hbm")]), V::F(x as f64))
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.clock.sm",
        "Hz",
        Gauge,
        Int,
        "ethand_gpu_sm_clock_hertz",
        HW,
        "Current SM clock.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_clock_hertz {
                o.add(gpu_hw(g, &[]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.clock.memory",
        "Hz",
        Gauge,
        Int,
        "ethand_gpu_memory_clock_hertz",
        HW,
        "Current memory clock.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.memory_clock_hertz {
                o.add(gpu_hw(g, &[]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.pcie.throughput",
        "By/s",
        Gauge,
        Int,
        "ethand_gpu_pcie_tx_bytes_per_second, ethand_gpu_pcie_rx_bytes_per_second",
        "hw.*, network.io.direction (transmit = GPU to host, receive)",
        "PCIe throughput over NVML's last 20 ms sample.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.pcie_tx_bytes_per_second {
                o.add(gpu_hw(g, &[("network.io.direction", "transmit")]), V::U(x))
            }
            if let Some(x) = g.pcie_rx_bytes_per_second {
                o.add(gpu_hw(g, &[("network.io.direction", "receive")]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.nvlink.io",
        "By",
        Counter,
        Int,
        "ethand_gpu_nvlink_bytes_total",
        "hw.*, ethand.nvlink, network.io.direction",
        "Payload bytes sent or received over each active NVLink since the driver was loaded.",
        |v, o| for g in &v.snap.devices.gpus {
            for l in &g.nvlinks {
                let link = l.link.to_string();
                if let Some(x) = l.tx_bytes {
                    o.add(
                        gpu_hw(
                            g,
                            &[
                                ("ethand.nvlink", &link),
                                ("network.io.direction", "transmit"),
                            ],
                        ),
                        V::U(x),
                    )
                }
                if let Some(x) = l.rx_bytes {
                    o.add(
                        gpu_hw(
                            g,
                            &[
                                ("ethand.nvlink", &link),
                                ("network.io.direction", "receive"),
                            ],
                        ),
                        V::U(x),
                    )
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.nvlink.errors",
        "{error}",
        Counter,
        Int,
        "ethand_gpu_nvlink_errors_total",
        "hw.*, ethand.nvlink, error.type (replay, recovery, crc_flit, crc_data)",
        "NVLink data link errors.",
        |v, o| for g in &v.snap.devices.gpus {
            for l in &g.nvlinks {
                let link = l.link.to_string();
                for (t, x) in [
                    ("replay", l.replay_errors),
                    ("recovery", l.recovery_errors),
                    ("crc_flit", l.crc_flit_errors),
                    ("crc_data", l.crc_data_errors),
                ] {
                    if let Some(x) = x {
                        o.add(
                            gpu_hw(g, &[("ethand.nvlink", &link), ("error.type", t)]),
                            V::U(x),
                        )
                    }
                }
            }
        }
    ),
    spec!(
        "hw.errors",
        "{error}",
        Counter,
        Int,
        "ethand_gpu_ecc_errors_total, ethand_gpu_xid_errors_total",
        "hw.*, error.type (ecc_corrected, ecc_uncorrected, xid)",
        "GPU memory ECC errors since the driver was loaded; critical XID events since ethand started watching.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.ecc_corrected_errors {
                o.add(gpu_hw(g, &[("error.type", "ecc_corrected")]), V::U(x))
            }
            if let Some(x) = g.ecc_uncorrected_errors {
                o.add(gpu_hw(g, &[("error.type", "ecc_uncorrected")]), V::U(x))
            }
            if let Some(x) = g.xid_errors {
                o.add(gpu_hw(g, &[("error.type", "xid")]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.throttle",
        "1",
        Gauge,
        Int,
        "ethand_gpu_throttle_reason",
        "hw.*, ethand.throttle.reason",
        "1 for each clock throttle reason active now, 0 for the others.",
        |v, o| for g in &v.snap.devices.gpus {
            let Some(active) = &g.throttle_reasons else {
                continue;
            };
            for r in ethand_snapshot::devices::THROTTLE_REASONS {
                o.add(
                    gpu_hw(g, &[("ethand.throttle.reason", r)]),
                    V::U(u64::from(active.iter().any(|a| a == r))),
                )
            }
        }
    ),
    spec!(
        "ethand.npu.health",
        "1",
        Gauge,
        Int,
        "ethand_npu_health",
        HW,
        "DCMI health: 0 normal, 1 minor, 2 major, 3 critical alarm.",
        |v, o| for n in &v.snap.devices.npus {
            if let Some(x) = n.health {
                o.add(npu_hw(n, &[]), V::U(u64::from(x)))
            }
        }
    ),
];

fn dev_id(d: &ethand_snapshot::gpu::ProcessDeviceUsage) -> &str {
    if d.uuid.is_empty() {
        &d.device
    } else {
        &d.uuid
    }
}

/// The hw.* identity of one device (GPU or NPU), then `extra`.
#[allow(clippy::too_many_arguments)] // one call per device kind, all fields named there
fn hw(
    id: &str,
    name: String,
    kind: &'static str,
    model: &str,
    vendor: &'static str,
    pci: &str,
    driver: &str,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("hw.id", id.to_owned()),
        KeyValue::new("hw.name", name),
        KeyValue::new("hw.type", kind),
        KeyValue::new("hw.vendor", vendor),
    ];
    for (k, v) in [
        ("hw.model", model),
        ("ethand.pci_bus_id", pci),
        ("ethand.driver.version", driver),
    ] {
        if !v.is_empty() {
            a.push(KeyValue::new(k, v.to_owned()));
        }
    }
    a.extend(extra.iter().map(|&(k, s)| KeyValue::new(k, s.to_owned())));
    a
}

fn gpu_hw(
    g: &ethand_snapshot::devices::GpuDevice,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let label = g.label();
    let id = if g.uuid.is_empty() {
        label.clone()
    } else {
        g.uuid.clone()
    };
    hw(
        &id,
        label,
        "gpu",
        &g.name,
        "NVIDIA",
        &g.pci_bus_id,
        &g.driver_version,
        extra,
    )
}

fn npu_hw(
    n: &ethand_snapshot::devices::NpuDevice,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let label = n.label();
    let id = if n.uuid.is_empty() {
        label.clone()
    } else {
        n.uuid.clone()
    };
    hw(
        &id,
        label,
        "npu",
        &n.name,
        "Huawei",
        &n.pci_bus_id,
        &n.driver_version,
        extra,
    )
}
