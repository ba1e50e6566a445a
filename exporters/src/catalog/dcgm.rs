//! dcgm-exporter's names and labels for the GPU series (`DCGM_FI_DEV_*`, and `DCGM_FI_PROF_*`
//! for the GPM ratios), only with `PrometheusOptions::dcgm_aliases`, so that existing
//! dashboards keep working. Not exported over OTLP.
//!
//! They keep DCGM's units (percent, MiB, MHz, KB/s, mJ; the `DCGM_FI_PROF_*` profiling fields
//! are 0-1 ratios) and are all gauges: dcgm-exporter types some of them as counters without a
//! `_total` suffix, which the text format cannot carry under the same name. Their `modelName`
//! label is camelCase, which `promtool check metrics` reports; that is dcgm-exporter's name,
//! kept on purpose. They are entries of their own rather than a field of the ethand entries:
//! their order is dcgm-exporter's, `DCGM_FI_DEV_FB_FREE` has no ethand family, the XID alias
//! is the last code rather than a count, and one ethand family (ECC) makes two of them.
use ethand_snapshot::devices::GpuDevice;

use super::{Desc, Metric, Otel, Output, Per, Sample, Scope, Sink, Subject, gauge};

const MIB: u64 = 1 << 20;
const MHZ: u64 = 1_000_000;

/// A dcgm-exporter alias: per GPU, dcgm-exporter's labels.
const fn alias(prometheus: Desc, observe: fn(&Scope, &mut dyn Sink)) -> Metric {
    Metric {
        output: Output::DcgmAlias,
        ..Metric::new(
            prometheus,
            Per::Device,
            Otel::NotExported(
                "dcgm-exporter aliases exist for existing Prometheus dashboards only",
            ),
            observe,
        )
    }
}

/// One sample per GPU where `value` has one, with dcgm-exporter's labels.
fn each_dcgm(s: &Scope, o: &mut dyn Sink, value: fn(&GpuDevice) -> Option<Sample<'static>>) {
    let hostname = s.snap.devices.hostname.as_str();
    for gpu in &s.snap.devices.gpus {
        if let Some(v) = value(gpu) {
            o.sample(Subject::DcgmGpu { gpu, hostname }, &[], v);
        }
    }
}

pub(crate) const METRICS: &[Metric] = &[
    alias(
        gauge(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization in percent; dcgm-exporter alias of ethand_gpu_utilization_ratio.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.utilization_ratio.map(|r| Sample::Float(r * 100.0))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "Memory utilization in percent; dcgm-exporter alias of \
     ethand_gpu_memory_utilization_ratio.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.memory_utilization_ratio.map(|r| Sample::Float(r * 100.0))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used in MiB; dcgm-exporter alias of ethand_gpu_memory_used_bytes.",
        ),
        |s, o| each_dcgm(s, o, |g| g.memory_used_bytes.map(|b| Sample::Int(b / MIB))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free in MiB (nvmlDeviceGetMemoryInfo); dcgm-exporter name.",
        ),
        |s, o| each_dcgm(s, o, |g| g.memory_free_bytes.map(|b| Sample::Int(b / MIB))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_POWER_USAGE",
            "Power draw in W; dcgm-exporter alias of ethand_gpu_power_watts.",
        ),
        |s, o| each_dcgm(s, o, |g| g.power_watts.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Energy since the driver was loaded in mJ, a counter typed as gauge; dcgm-exporter alias \
     of ethand_gpu_energy_joules_total.",
        ),
        |s, o| each_dcgm(s, o, |g| g.energy_millijoules.map(Sample::Int)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_GPU_TEMP",
            "GPU temperature in C; dcgm-exporter alias of ethand_gpu_temperature_celsius.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.temperature_celsius.map(|c| Sample::Float(c as f64))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock in MHz; dcgm-exporter alias of ethand_gpu_sm_clock_hertz.",
        ),
        |s, o| each_dcgm(s, o, |g| g.sm_clock_hertz.map(|h| Sample::Int(h / MHZ))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_MEM_CLOCK",
            "Memory clock in MHz; dcgm-exporter alias of ethand_gpu_memory_clock_hertz.",
        ),
        |s, o| each_dcgm(s, o, |g| g.memory_clock_hertz.map(|h| Sample::Int(h / MHZ))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
            "PCIe transmit throughput in KB/s; dcgm-exporter alias of \
     ethand_gpu_pcie_tx_bytes_per_second.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_tx_bytes_per_second.map(|b| Sample::Int(b / 1024))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
            "PCIe receive throughput in KB/s; dcgm-exporter alias of \
     ethand_gpu_pcie_rx_bytes_per_second.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_rx_bytes_per_second.map(|b| Sample::Int(b / 1024))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_XID_ERRORS",
            "Code of the last critical XID error seen since ethand started watching, 0 for none; \
     dcgm-exporter name (ethand_gpu_xid_errors_total counts them).",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.xid_errors.map(|_| Sample::Int(g.last_xid.unwrap_or(0)))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Corrected (single-bit) volatile ECC errors, a counter typed as gauge; dcgm-exporter \
     alias of ethand_gpu_ecc_errors_total{type=\"corrected\"}.",
        ),
        |s, o| each_dcgm(s, o, |g| g.ecc_corrected_errors.map(Sample::Int)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Uncorrected (double-bit) volatile ECC errors, a counter typed as gauge; dcgm-exporter \
     alias of ethand_gpu_ecc_errors_total{type=\"uncorrected\"}.",
        ),
        |s, o| each_dcgm(s, o, |g| g.ecc_uncorrected_errors.map(Sample::Int)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_SM_ACTIVE",
            "Ratio of time the SMs had a warp assigned, 0-1; dcgm-exporter alias of \
     ethand_gpu_sm_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.sm_activity_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "Ratio of resident warps to the SMs' maximum, 0-1; dcgm-exporter alias of \
     ethand_gpu_sm_occupancy_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.sm_occupancy_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of time the tensor pipes were busy, 0-1; dcgm-exporter alias of \
     ethand_gpu_tensor_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.tensor_activity_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of the DRAM bandwidth in use, 0-1; dcgm-exporter alias of \
     ethand_gpu_dram_bandwidth_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.dram_bandwidth_ratio.map(Sample::Float)),
    ),
];
