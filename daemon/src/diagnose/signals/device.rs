//! The devices the tree uses: NVML/DCMI utilization, NVML GPM, and health.
use ethand_snapshot::{devices::GpuDevice, gpu::GpuDerived};

use super::{Ctx, HowToGet, Signal, Unit};

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "gpu.device_utilization_ratio",
        unit: Unit::Ratio,
        doc: "NVML/DCMI utilization of the devices the tree uses, mean over the window's collection rounds",
        how_to_get: HowToGet::DeviceUtilization,
        compute: |c| derived(c)?.device_utilization_ratio,
    },
    Signal {
        name: "gpu.device_idle_ratio",
        unit: Unit::Ratio,
        doc: "1 - `gpu.device_utilization_ratio`: how much of the time the tree's devices sat idle",
        how_to_get: HowToGet::DeviceUtilization,
        compute: |c| derived(c)?.device_idle_ratio,
    },
    Signal {
        name: "gpu.sm_activity_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM (Hopper and newer) SM activity, mean over the window",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.sm_activity_ratio,
    },
    Signal {
        name: "gpu.sm_occupancy_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM SM occupancy",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.sm_occupancy_ratio,
    },
    Signal {
        name: "gpu.tensor_activity_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM tensor-core activity",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.tensor_activity_ratio,
    },
    Signal {
        name: "gpu.fp32_activity_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM FP32 pipe activity (arithmetic outside the tensor cores), mean over the window",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.fp32_activity_ratio,
    },
    Signal {
        name: "gpu.fp64_activity_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM FP64 pipe activity, mean over the window",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.fp64_activity_ratio,
    },
    Signal {
        name: "gpu.dram_bandwidth_ratio",
        unit: Unit::Ratio,
        doc: "NVML GPM DRAM bandwidth used",
        how_to_get: HowToGet::Gpm,
        compute: |c| derived(c)?.dram_bandwidth_ratio,
    },
    Signal {
        name: "gpu.sm_busy_ratio",
        unit: Unit::Ratio,
        doc: "`gpu.sm_activity_ratio` where the GPU has GPM, else `gpu.device_utilization_ratio`, which counts the GPU busy while a single tiny kernel runs (an upper bound)",
        how_to_get: HowToGet::DeviceUtilization,
        compute: |c| {
            let d = derived(c)?;
            d.sm_activity_ratio.or(d.device_utilization_ratio)
        },
    },
    Signal {
        name: "gpu.memory_used_ratio",
        unit: Unit::Ratio,
        doc: "of the tree's GPUs, the largest share of device memory in use (NVML used / total: every process's and the driver's), at the snapshot",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            c.gpus
                .iter()
                .filter_map(|g| {
                    let total = g.memory_total_bytes.filter(|t| *t > 0)?;
                    Some(g.memory_used_bytes? as f64 / total as f64)
                })
                .reduce(f64::max)
        },
    },
    Signal {
        name: "gpu.memory_free_bytes",
        unit: Unit::Bytes,
        doc: "of the tree's GPUs, the least free device memory (NVML), at the snapshot",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            c.gpus
                .iter()
                .filter_map(|g| g.memory_free_bytes)
                .min()
                .map(|v| v as f64)
        },
    },
    Signal {
        name: "gpu.xid_events",
        unit: Unit::Count,
        doc: "critical XIDs of the tree's GPUs while one of its processes held a context there (NVML's compute-process list at the collection before and at the one that drained the event); absent when none of its GPUs delivers XID events",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            c.gpus.iter().any(|g| g.xid_errors.is_some()).then(|| {
                c.t.processes
                    .iter()
                    .flat_map(|p| &p.gpu_xid_events)
                    .map(|x| x.count)
                    .sum::<u64>() as f64
            })
        },
    },
    Signal {
        name: "gpu.row_remap_failed",
        unit: Unit::Count,
        doc: "the tree's GPUs whose row remapping failed; absent when no GPU reports it",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| reported(c, |g| g.row_remap_failed),
    },
    Signal {
        name: "gpu.pcie_link_downtrained",
        unit: Unit::Count,
        doc: "the tree's GPUs whose PCIe link is narrower than its maximum; absent when no GPU reports both widths",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| reported(c, |g| Some(g.pcie_link_width? < g.pcie_link_width_max?)),
    },
    Signal {
        name: "gpu.throttled",
        unit: Unit::Count,
        doc: "the tree's GPUs the driver reports slowed for heat, a hardware slowdown or a power brake",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            with_reason(c, |x| {
                x.contains("thermal") || x == "hw_slowdown" || x.contains("power_brake")
            })
        },
    },
    Signal {
        name: "gpu.power_capped",
        unit: Unit::Count,
        doc: "the tree's GPUs held at the software power cap (where a fully loaded GPU normally runs: counted apart from `gpu.throttled`)",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| with_reason(c, |x| x == "sw_power_cap"),
    },
    Signal {
        name: "gpu.temperature_max_celsius",
        unit: Unit::Celsius,
        doc: "the hottest of the tree's GPUs",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            c.gpus
                .iter()
                .filter_map(|g| g.temperature_celsius)
                .max()
                .map(|v| v as f64)
        },
    },
    Signal {
        name: "gpu.power_max_watts",
        unit: Unit::Watts,
        doc: "the highest power draw among the tree's GPUs",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| c.gpus.iter().filter_map(|g| g.power_watts).reduce(f64::max),
    },
    Signal {
        name: "gpu.ecc_uncorrected_errors",
        unit: Unit::Count,
        doc: "uncorrectable ECC errors of the tree's GPUs",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            (!c.gpus.is_empty()).then(|| {
                c.gpus
                    .iter()
                    .filter_map(|g| g.ecc_uncorrected_errors)
                    .sum::<u64>() as f64
            })
        },
    },
    Signal {
        name: "gpu.xid_errors",
        unit: Unit::Count,
        doc: "all critical XIDs of the tree's GPUs since ethand started watching",
        how_to_get: HowToGet::DeviceHealth,
        compute: |c| {
            (!c.gpus.is_empty())
                .then(|| c.gpus.iter().filter_map(|g| g.xid_errors).sum::<u64>() as f64)
        },
    },
];

/// The window's derived device figures; None when no device reading covers the tree.
fn derived<'t>(c: &Ctx<'t>) -> Option<&'t GpuDerived> {
    c.t.total.gpu_derived.as_ref()
}

/// How many of the tree's GPUs report `f` true; None when none reports it.
fn reported(c: &Ctx, f: fn(&GpuDevice) -> Option<bool>) -> Option<f64> {
    let known: Vec<bool> = c.gpus.iter().filter_map(|g| f(g)).collect();
    (!known.is_empty()).then(|| known.iter().filter(|b| **b).count() as f64)
}

/// How many of the tree's GPUs have a clock-event reason matching `pred`; None without GPUs.
fn with_reason(c: &Ctx, pred: fn(&str) -> bool) -> Option<f64> {
    (!c.gpus.is_empty()).then(|| {
        c.gpus
            .iter()
            .filter(|g| {
                g.throttle_reasons
                    .as_ref()
                    .is_some_and(|r| r.iter().any(|x| pred(x)))
            })
            .count() as f64
    })
}
