//! What the GPU ran, recorded by CUPTI inside the tree's processes started with
//! libethand_cupti.so for the snapshot's window (`TreeSnapshot::gpu_activity`,
//! docs/gpu-activity.md): GPU time from the kernels themselves rather than from the host's
//! calls or NVML's averages. Ratios are over the recorded windows of every (process, device)
//! pair: their mean, weighted by window. A process whose records are incomplete (another
//! tool took CUPTI's buffers, records lost) is left out: its idle time would be overstated.
use ethand_snapshot::kernels::{ActivityState, GpuActivityProcess, KernelClass};

use super::{Ctx, HowToGet, Signal, Unit};

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "gpu.kernel_busy_ratio",
        unit: Unit::Ratio,
        doc: "time with at least one kernel running (the union of the recorded kernels' intervals) / the recording window, per device; NVML's utilization by its definition, measured",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let d = devices(c);
            let window = window_ns(&d)?;
            Some(d.iter().map(|x| x.busy_ns as f64).sum::<f64>() / window)
        },
    },
    Signal {
        name: "gpu.host_wait_idle_ratio",
        unit: Unit::Ratio,
        doc: "time the GPU had nothing queued between two kernels (it waited for the host: Python, input, syncs, launch cost) / the recording window",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| idle_ratio(c, |i| i.host_wait_ns),
    },
    Signal {
        name: "gpu.kernel_wait_idle_ratio",
        unit: Unit::Ratio,
        doc: "time the next kernel was queued but not yet running (launch latency, work ahead in its stream) / the recording window",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| idle_ratio(c, |i| i.kernel_wait_ns),
    },
    Signal {
        name: "gpu.kernels_per_second",
        unit: Unit::PerSecond,
        doc: "kernels recorded per second of the window, per device",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let d = devices(c);
            let window = window_ns(&d)?;
            Some(d.iter().map(|x| x.kernels as f64).sum::<f64>() * 1e9 / window)
        },
    },
    Signal {
        name: "gpu.kernel_mean_seconds",
        unit: Unit::Seconds,
        doc: "a recorded kernel's mean duration on the GPU; absent when none ran",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let d = devices(c);
            let kernels: u64 = d.iter().map(|x| x.kernels).sum();
            (kernels > 0)
                .then(|| d.iter().map(|x| x.kernel_ns as f64).sum::<f64>() / 1e9 / kernels as f64)
        },
    },
    Signal {
        name: "gpu.communication_exposed_ratio",
        unit: Unit::Ratio,
        doc: "time a collective (NCCL/HCCL kernel) ran with no computing kernel beside it / the recording window: communication on the step's critical path",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let d = devices(c);
            let window = window_ns(&d)?;
            let exposed: u64 = d
                .iter()
                .filter_map(|x| x.communication)
                .map(|(comm, overlapped)| comm.saturating_sub(overlapped))
                .sum();
            Some(exposed as f64 / window)
        },
    },
    Signal {
        name: "gpu.communication_overlap_ratio",
        unit: Unit::Ratio,
        doc: "the part of the collectives' time with a computing kernel running beside it; absent when no collective ran",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let (comm, overlapped) = devices(c)
                .iter()
                .filter_map(|x| x.communication)
                .fold((0u64, 0u64), |(a, b), (c, o)| (a + c, b + o));
            (comm > 0).then(|| overlapped as f64 / comm as f64)
        },
    },
    Signal {
        name: "gpu.fp32_simt_gemm_ratio",
        unit: Unit::Ratio,
        doc: "GPU time of matrix multiplies in fp32 on the CUDA cores (cuBLAS/CUTLASS sgemm, told by name) / the recording window, per device",
        how_to_get: HowToGet::GpuActivity,
        compute: |c| {
            let ps = recorded(c);
            let window: f64 = ps
                .iter()
                .map(|p| p.window_ns.unwrap_or(0) as f64 * p.devices.len().max(1) as f64)
                .sum();
            (window > 0.0).then(|| {
                let simt: u64 = ps
                    .iter()
                    .flat_map(|p| p.kernels.iter())
                    .filter(|k| {
                        k.class == KernelClass::Gemm
                            && k.name.as_deref().is_some_and(KernelClass::fp32_simt_gemm)
                    })
                    .map(|k| k.gpu_ns)
                    .sum();
                simt as f64 / window
            })
        },
    },
];

/// The recorded processes whose figures cover their whole window.
fn recorded<'t>(c: &Ctx<'t>) -> Vec<&'t GpuActivityProcess> {
    let Some(a) = c.t.gpu_activity.as_ref() else {
        return Vec::new();
    };
    a.processes
        .iter()
        .filter(|p| {
            p.state == ActivityState::Recorded
                && p.window_ns.is_some_and(|w| w > 0)
                && p.incomplete.is_none()
                // A few records lost of many change no ratio; more might.
                && (p.records_dropped_by_cupti + p.records_lost_by_ethand) * 100 <= p.records
        })
        .collect()
}

/// One device of one recorded process, with that process's window.
struct Device {
    window_ns: u64,
    busy_ns: u64,
    kernels: u64,
    kernel_ns: u64,
    idle: Option<ethand_snapshot::kernels::IdleSplit>,
    /// (communication, overlapped) ns.
    communication: Option<(u64, u64)>,
}

fn devices(c: &Ctx) -> Vec<Device> {
    recorded(c)
        .into_iter()
        .flat_map(|p| {
            let window_ns = p.window_ns.unwrap_or(0);
            p.devices.iter().map(move |d| Device {
                window_ns,
                busy_ns: d.busy_ns.min(window_ns),
                kernels: d.kernels,
                kernel_ns: d.kernel_ns,
                idle: d.idle.clone(),
                communication: d
                    .communication
                    .as_ref()
                    .map(|x| (x.communication_ns, x.overlapped_ns)),
            })
        })
        .collect()
}

/// The devices' windows summed; None when nothing was recorded.
fn window_ns(d: &[Device]) -> Option<f64> {
    let w: u64 = d.iter().map(|x| x.window_ns).sum();
    (w > 0).then_some(w as f64)
}

/// A part of the idle split over the windows of the devices that have one (a device that
/// ran no kernel in the window has no gaps to split).
fn idle_ratio(c: &Ctx, part: fn(&ethand_snapshot::kernels::IdleSplit) -> u64) -> Option<f64> {
    let d = devices(c);
    let with: Vec<&Device> = d.iter().filter(|x| x.idle.is_some()).collect();
    let window: u64 = with.iter().map(|x| x.window_ns).sum();
    (window > 0).then(|| {
        with.iter()
            .filter_map(|x| x.idle.as_ref().map(part))
            .sum::<u64>() as f64
            / window as f64
    })
}
