//! dcgm-exporter's names and labels for the GPU series (`DCGM_FI_DEV_*`, and `DCGM_FI_PROF_*`
//! for the GPM figures), only with `PrometheusOptions::dcgm_aliases`, so that existing
//! dashboards and alerts keep working. Not exported over OTLP.
//!
//! They keep DCGM's units (percent, MiB, MHz, KB/s, mJ; the `DCGM_FI_PROF_*` activity fields
//! are 0-1 ratios, the PCIe ones bytes per second) and dcgm-exporter's types: the fields it
//! types `counter` are counters here too, without a `_total` suffix (the exposition is
//! written by hand, so `# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter` is what it writes;
//! `promtool check metrics` reports the missing suffix, which is dcgm-exporter's name, kept
//! on purpose, as is the camelCase `modelName` label). Every alias has dcgm-exporter's
//! labels: `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
//! `DCGM_FI_DRIVER_VERSION`, and with `PrometheusOptions::device_workload_labels` the GPU's
//! owner's `namespace`, `pod`, `container`. They are entries of their own rather than a
//! field of the ethand entries: their order is dcgm-exporter's default-counters.csv, the XID
//! alias is the last code rather than a count, and one ethand family (ECC, remapped rows)
//! makes two of them.
use ethand_snapshot::devices::GpuDevice;

use super::{Desc, Metric, Otel, Output, Per, Sample, Scope, Sink, Subject, counter, gauge, label};

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

/// dcgm-exporter's whole percent. The ratios behind these aliases are NVML's whole percents
/// divided by 100, so rounding gives NVML's number back (0.07 * 100 is 7.000000000000001).
fn percent(ratio: Option<f64>) -> Option<Sample<'static>> {
    ratio
        .filter(|r| r.is_finite() && *r >= 0.0)
        .map(|r| Sample::Int((r * 100.0).round() as u64))
}

/// The `err_msg` of an XID code: the snapshot's one table of XID meanings, "No Error" for
/// 0 (no XID yet) and "Unknown Error" for codes it does not describe.
pub(crate) fn xid_meaning(code: u64) -> &'static str {
    match code {
        0 => "No Error",
        c => ethand_snapshot::devices::xid_description(c).unwrap_or("Unknown Error"),
    }
}

pub(crate) const METRICS: &[Metric] = &[
    alias(
        gauge(
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock frequency in MHz; dcgm-exporter alias of ethand_gpu_sm_clock_hertz.",
        ),
        |s, o| each_dcgm(s, o, |g| g.sm_clock_hertz.map(|h| Sample::Int(h / MHZ))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_MEM_CLOCK",
            "Memory clock frequency in MHz; dcgm-exporter alias of ethand_gpu_memory_clock_hertz.",
        ),
        |s, o| each_dcgm(s, o, |g| g.memory_clock_hertz.map(|h| Sample::Int(h / MHZ))),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_MEMORY_TEMP",
            "Memory temperature in C; dcgm-exporter alias of ethand_gpu_memory_temperature_celsius.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.memory_temperature_celsius
                    .map(|c| Sample::Float(c as f64))
            })
        },
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
            "DCGM_FI_DEV_POWER_USAGE",
            "Power draw in W; dcgm-exporter alias of ethand_gpu_power_watts.",
        ),
        |s, o| each_dcgm(s, o, |g| g.power_watts.map(Sample::Float)),
    ),
    alias(
        counter(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Energy since the driver was loaded in mJ; dcgm-exporter alias of \
     ethand_gpu_energy_joules_total.",
        ),
        |s, o| each_dcgm(s, o, |g| g.energy_millijoules.map(Sample::Int)),
    ),
    alias(
        counter(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "PCIe replays (retries) since the driver was loaded; dcgm-exporter alias of \
     ethand_gpu_pcie_replays_total.",
        ),
        |s, o| each_dcgm(s, o, |g| g.pcie_replays.map(Sample::Int)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization in percent; dcgm-exporter alias of ethand_gpu_utilization_ratio.",
        ),
        |s, o| each_dcgm(s, o, |g| percent(g.utilization_ratio)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "Memory utilization in percent; dcgm-exporter alias of \
     ethand_gpu_memory_utilization_ratio.",
        ),
        |s, o| each_dcgm(s, o, |g| percent(g.memory_utilization_ratio)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_ENC_UTIL",
            "Encoder utilization in percent; dcgm-exporter alias of \
     ethand_gpu_encoder_utilization_ratio.",
        ),
        |s, o| each_dcgm(s, o, |g| percent(g.encoder_utilization_ratio)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_DEC_UTIL",
            "Decoder utilization in percent; dcgm-exporter alias of \
     ethand_gpu_decoder_utilization_ratio.",
        ),
        |s, o| each_dcgm(s, o, |g| percent(g.decoder_utilization_ratio)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_XID_ERRORS",
            "Code of the last critical XID error seen since ethand started watching, 0 for none, \
     with err_code (the code) and err_msg (its meaning, Unknown Error for codes ethand has no \
     text for); dcgm-exporter name (ethand_gpu_xid_errors_total counts them by code).",
        ),
        |s, o| {
            let hostname = s.snap.devices.hostname.as_str();
            for gpu in &s.snap.devices.gpus {
                if gpu.xid_errors.is_none() {
                    continue;
                }
                let code = gpu.last_xid.unwrap_or(0);
                let subject = Subject::DcgmGpu { gpu, hostname };
                let labels = [&*code.to_string(), xid_meaning(code)];
                o.sample(subject, &labels, Sample::Int(code));
            }
        },
    )
    .labels(&[
        label("err_code", "").values("XID code"),
        label("err_msg", "").values("bounded table of XID meanings, else Unknown Error"),
    ]),
    alias(
        gauge(
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free in MiB; dcgm-exporter alias of ethand_gpu_memory_free_bytes.",
        ),
        |s, o| each_dcgm(s, o, |g| g.memory_free_bytes.map(|b| Sample::Int(b / MIB))),
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
            "DCGM_FI_DEV_FB_RESERVED",
            "Framebuffer memory reserved by the driver in MiB; dcgm-exporter alias of \
     ethand_gpu_memory_reserved_bytes.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.memory_reserved_bytes.map(|b| Sample::Int(b / MIB))
            })
        },
    ),
    alias(
        counter(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "NVLink traffic of all links, transmit plus receive, in about MiB/s (bytes per second / \
     1024 / 1000, as DCGM computes it); a rate, typed counter as dcgm-exporter types it; \
     dcgm-exporter alias of ethand_gpu_nvlink_bytes_per_second.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.nvlink_bytes_per_second
                    .map(|b| Sample::Float(b / 1024.0 / 1000.0))
            })
        },
    ),
    alias(
        counter(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "Rows remapped for uncorrectable errors; dcgm-exporter alias of \
     ethand_gpu_memory_remapped_rows_total{cause=\"uncorrectable\"}.",
        ),
        |s, o| each_dcgm(s, o, |g| g.remapped_rows_uncorrectable.map(Sample::Int)),
    ),
    alias(
        counter(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "Rows remapped for correctable errors; dcgm-exporter alias of \
     ethand_gpu_memory_remapped_rows_total{cause=\"correctable\"}.",
        ),
        |s, o| each_dcgm(s, o, |g| g.remapped_rows_correctable.map(Sample::Int)),
    ),
    alias(
        gauge(
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "1 when a row remap failed, else 0; dcgm-exporter alias of \
     ethand_gpu_memory_row_remap_failed.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.row_remap_failed.map(|b| Sample::Int(u64::from(b)))
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine was active, 0-1; dcgm-exporter alias of \
     ethand_gpu_graphics_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.graphics_activity_ratio.map(Sample::Float)),
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
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of time the FP64 pipes were busy, 0-1; dcgm-exporter alias of \
     ethand_gpu_fp64_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.fp64_activity_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of time the FP32 pipes were busy, 0-1; dcgm-exporter alias of \
     ethand_gpu_fp32_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.fp32_activity_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of time the FP16 pipes were busy, 0-1; dcgm-exporter alias of \
     ethand_gpu_fp16_activity_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.fp16_activity_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of the DRAM bandwidth in use, 0-1; dcgm-exporter alias of \
     ethand_gpu_dram_bandwidth_ratio (NVML GPM, not DCGM).",
        ),
        |s, o| each_dcgm(s, o, |g| g.dram_bandwidth_ratio.map(Sample::Float)),
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "PCIe transmit rate in bytes per second, headers included; dcgm-exporter alias of \
     ethand_gpu_pcie_tx_average_bytes_per_second (NVML GPM, not DCGM).",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_tx_average_bytes_per_second.map(Sample::Float)
            })
        },
    ),
    alias(
        gauge(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "PCIe receive rate in bytes per second, headers included; dcgm-exporter alias of \
     ethand_gpu_pcie_rx_average_bytes_per_second (NVML GPM, not DCGM).",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_rx_average_bytes_per_second.map(Sample::Float)
            })
        },
    ),
    // Not in dcgm-exporter's default set, kept for dashboards that use them.
    alias(
        counter(
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
            "PCIe transmit throughput in KB/s, typed counter as dcgm-exporter types it; \
     dcgm-exporter alias of ethand_gpu_pcie_tx_bytes_per_second.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_tx_bytes_per_second.map(|b| Sample::Int(b / 1024))
            })
        },
    ),
    alias(
        counter(
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
            "PCIe receive throughput in KB/s, typed counter as dcgm-exporter types it; \
     dcgm-exporter alias of ethand_gpu_pcie_rx_bytes_per_second.",
        ),
        |s, o| {
            each_dcgm(s, o, |g| {
                g.pcie_rx_bytes_per_second.map(|b| Sample::Int(b / 1024))
            })
        },
    ),
    alias(
        counter(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Corrected (single-bit) volatile ECC errors; dcgm-exporter alias of \
     ethand_gpu_ecc_errors_total{type=\"corrected\"}.",
        ),
        |s, o| each_dcgm(s, o, |g| g.ecc_corrected_errors.map(Sample::Int)),
    ),
    alias(
        counter(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Uncorrected (double-bit) volatile ECC errors; dcgm-exporter alias of \
     ethand_gpu_ecc_errors_total{type=\"uncorrected\"}.",
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
];
