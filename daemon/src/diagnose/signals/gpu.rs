//! GPU/NPU runtime calls (the uprobes' counts) and the ranks of a job.
use ethand_snapshot::{ProcessSnapshot, gpu::GpuProcessStats};

use super::{Ctx, HowToGet, Signal, Unit};

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "gpu.launches",
        unit: Unit::Count,
        doc: "kernel launches: counted at `process`/`op`, the snapshot's launch sample at `calls`; absent when neither",
        how_to_get: HowToGet::Launches,
        compute: |c| {
            let g = totals(c)?;
            g.launches
                .or_else(|| c.t.launch_sample.as_ref().and_then(|s| s.launches))
                .map(|n| n as f64)
        },
    },
    Signal {
        name: "gpu.launches_per_second",
        unit: Unit::PerSecond,
        doc: "kernel launches per second of the window (counted, else sampled)",
        how_to_get: HowToGet::Launches,
        compute: |c| c.gpu_window().and(c.launches_per_second),
    },
    Signal {
        name: "gpu.sync_calls",
        unit: Unit::Count,
        doc: "synchronizations (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| g.sync.calls as f64),
    },
    Signal {
        name: "gpu.syncs_per_second",
        unit: Unit::PerSecond,
        doc: "synchronizations per second of the window",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| c.gpu_window().map(|w| c.sum(|x| x.gpu_sync_calls) / w),
    },
    Signal {
        name: "gpu.syncs_per_launch",
        unit: Unit::Count,
        doc: "synchronizations per launch, when launches are known",
        how_to_get: HowToGet::Launches,
        compute: |c| {
            let w = c.gpu_window()?;
            let lps = c.launches_per_second.filter(|l| *l > 0.0)?;
            Some(c.sum(|x| x.gpu_sync_calls) / w / lps)
        },
    },
    Signal {
        name: "gpu.sync_blocked_ratio",
        unit: Unit::Ratio,
        doc: "host time blocked in synchronizations / wall time",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| c.gpu_window().map(|w| c.sum(|x| x.gpu_sync_ns) / 1e9 / w),
    },
    Signal {
        name: "gpu.h2d_copies_per_second",
        unit: Unit::PerSecond,
        doc: "host-to-device copies per second of the window",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| c.gpu_window().map(|w| c.sum(|x| x.gpu_copy_h2d_calls) / w),
    },
    Signal {
        name: "gpu.h2d_copy_avg_bytes",
        unit: Unit::Bytes,
        doc: "mean size of those host-to-device copies",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            c.gpu_window()?;
            let h2d = c.sum(|x| x.gpu_copy_h2d_calls);
            (h2d > 0.0).then(|| c.sum(|x| x.gpu_copy_h2d_bytes) / h2d)
        },
    },
    Signal {
        name: "gpu.host_copy_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "bytes copied between host and device (both ways) per second of the window",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            c.gpu_window()
                .map(|w| (c.sum(|x| x.gpu_copy_h2d_bytes) + c.sum(|x| x.gpu_copy_d2h_bytes)) / w)
        },
    },
    Signal {
        name: "gpu.syncs_per_h2d_copy",
        unit: Unit::Count,
        doc: "synchronizations per host-to-device copy",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            c.gpu_window()?;
            let h2d = c.sum(|x| x.gpu_copy_h2d_calls);
            (h2d > 0.0).then(|| c.sum(|x| x.gpu_sync_calls) / h2d)
        },
    },
    Signal {
        name: "gpu.sync_h2d_copy_share",
        unit: Unit::Ratio,
        doc: "of all host-to-device copies, the share made with the synchronous copy symbols (the path of pageable memory in CuPy and the driver API; cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            let g = totals(c)?;
            let h2d = |is_async: bool| {
                g.symbols
                    .iter()
                    .filter(|x| {
                        x.category == "copy"
                            && x.direction == "host_to_device"
                            && x.symbol.contains("Async") == is_async
                    })
                    .map(|x| x.calls)
                    .sum::<u64>()
            };
            let (sync, not) = (h2d(false), h2d(true));
            (sync + not > 0).then(|| sync as f64 / (sync + not) as f64)
        },
    },
    Signal {
        name: "gpu.sync_copy_calls",
        unit: Unit::Count,
        doc: "synchronous copies (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| copies(g, false).0 as f64),
    },
    Signal {
        name: "gpu.sync_copy_avg_bytes",
        unit: Unit::Bytes,
        doc: "mean size of the synchronous copies",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            let (n, bytes) = copies(totals(c)?, false);
            (n > 0).then(|| bytes as f64 / n as f64)
        },
    },
    Signal {
        name: "gpu.async_copy_calls",
        unit: Unit::Count,
        doc: "asynchronous copies (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| copies(g, true).0 as f64),
    },
    Signal {
        name: "gpu.memory_live_bytes",
        unit: Unit::Bytes,
        doc: "runtime-allocated memory still allocated",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| g.memory_live_bytes() as f64),
    },
    Signal {
        name: "gpu.memory_allocs",
        unit: Unit::Count,
        doc: "runtime allocations (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| g.memory.iter().map(|m| m.allocs).sum::<u64>() as f64),
    },
    Signal {
        name: "gpu.blocking_frees_per_second",
        unit: Unit::PerSecond,
        doc: "frees that hand memory back to the driver (cuMemFree_v2, cuMemFreeHost, aclrtFree; not the stream-ordered cuMemFreeAsync) per second of the window: each waits for the device",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            let w = c.gpu_window()?;
            // Older files lack the count: absent, not 0.
            let frees: Option<u64> = c.windows.iter().map(|x| x.gpu_blocking_frees).sum();
            frees.map(|n| n as f64 / w)
        },
    },
    Signal {
        name: "gpu.memory_growth_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "growth of runtime-allocated memory over the window",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| {
            c.gpu_window()
                .map(|w| c.sum(|x| x.gpu_memory_growth_bytes) / w)
        },
    },
    Signal {
        name: "gpu.collective_ratio",
        unit: Unit::Ratio,
        doc: "host time inside collectives / wall time",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| c.gpu_window().map(|w| c.sum(|x| x.collective_ns) / 1e9 / w),
    },
    Signal {
        name: "gpu.collective_calls",
        unit: Unit::Count,
        doc: "collectives (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| g.collective_calls() as f64),
    },
    Signal {
        name: "gpu.collective_bytes",
        unit: Unit::Bytes,
        doc: "bytes moved by collectives (cumulative)",
        how_to_get: HowToGet::RuntimeCalls,
        compute: |c| totals(c).map(|g| g.collective_bytes() as f64),
    },
    Signal {
        name: "ranks.count",
        unit: Unit::Count,
        doc: "ranks of one job in the tree (NCCL/HCCL rank known, with a window)",
        how_to_get: HowToGet::Measured,
        compute: |c| ranks(c).map(|r| r.len() as f64),
    },
    Signal {
        name: "ranks.wait_ratio_min",
        unit: Unit::Ratio,
        doc: "the least share of wall time a rank waited on its GPU (sync + collective)",
        how_to_get: HowToGet::Measured,
        compute: |c| least_waiting(&ranks(c)?).map(|(_, v)| v),
    },
    Signal {
        name: "ranks.wait_ratio_max",
        unit: Unit::Ratio,
        doc: "the most share of wall time a rank waited on its GPU",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(most_waiting(&ranks(c)?)),
    },
    Signal {
        name: "ranks.wait_ratio_spread",
        unit: Unit::Ratio,
        doc: "the difference between the two",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let r = ranks(c)?;
            Some(most_waiting(&r) - least_waiting(&r)?.1)
        },
    },
    Signal {
        name: "ranks.straggler_rank",
        unit: Unit::Count,
        doc: "the rank that waits least: the one the others wait for",
        how_to_get: HowToGet::Measured,
        compute: |c| least_waiting(&ranks(c)?).map(|(rank, _)| f64::from(rank)),
    },
];

/// The tree's runtime-call totals; None when it calls no probed runtime.
fn totals<'t>(c: &Ctx<'t>) -> Option<&'t GpuProcessStats> {
    c.t.total.gpu.as_ref()
}

/// Copies made with the synchronous or the asynchronous symbols: (calls, bytes).
fn copies(g: &GpuProcessStats, is_async: bool) -> (u64, u64) {
    g.symbols
        .iter()
        .filter(|x| x.category == "copy" && x.symbol.contains("Async") == is_async)
        .fold((0, 0), |(c, b), x| (c + x.calls, b + x.bytes))
}

/// Ranks of one job inside the tree (torchrun children) and the share of the window each
/// waits on its GPU; None under two ranks or without a window.
fn ranks(c: &Ctx) -> Option<Vec<(u32, f64)>> {
    if c.w <= 0.0 {
        return None;
    }
    let ranks: Vec<(u32, f64)> =
        c.t.processes
            .iter()
            .filter_map(|p: &ProcessSnapshot| {
                let rank = p.gpu.as_ref()?.comm.as_ref()?.rank?;
                let win = p.window.as_ref()?;
                Some((
                    rank,
                    (win.gpu_sync_ns + win.collective_ns) as f64 / 1e9 / c.w,
                ))
            })
            .collect();
    (ranks.len() >= 2).then_some(ranks)
}

fn least_waiting(ranks: &[(u32, f64)]) -> Option<(u32, f64)> {
    ranks
        .iter()
        .copied()
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
}

fn most_waiting(ranks: &[(u32, f64)]) -> f64 {
    ranks.iter().map(|r| r.1).fold(0.0, f64::max)
}
