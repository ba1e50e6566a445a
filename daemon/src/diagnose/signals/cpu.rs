//! The node, the window, the tree's state right now, and its CPU time.
use super::{Ctx, HowToGet, Signal, Unit, tree};

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "node.cpus",
        unit: Unit::Count,
        doc: "CPUs available to ethand on the snapshot's host (absent in files that do not say)",
        how_to_get: HowToGet::Measured,
        compute: |c| c.cpus,
    },
    Signal {
        name: "window_seconds",
        unit: Unit::Seconds,
        doc: "the window: the daemon's history (`--window`), else the standalone measurement",
        how_to_get: HowToGet::Measured,
        compute: |c| (c.w > 0.0).then_some(c.w),
    },
    Signal {
        name: "tree.uses_accelerator",
        unit: Unit::Count,
        doc: "1 when the tree calls a GPU/NPU runtime or holds a device, else 0",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(f64::from(u8::from(tree::uses_accelerator(c.t)))),
    },
    Signal {
        name: "state.stalled_seconds",
        unit: Unit::Seconds,
        doc: "the shortest time any live thread has been blocked in its current syscall (0 when one is running or asleep outside a syscall), leaving out the waits that are no stall: timed sleeps and event loops' waits (idle), waits for children (wait4), and futex waits in a process with an idle thread (0 when only those remain). From /proc's state and `syscall` files when the snapshot was taken, timed from the probes' syscall entry (a thread blocked since before ethand first saw its process counts as at least that long); absent for a tree with no live thread or a file without thread states",
        how_to_get: HowToGet::Measured,
        compute: |c| tree::stalled_seconds(c.t),
    },
    Signal {
        name: "state.threads",
        unit: Unit::Count,
        doc: "live threads whose state the snapshot read",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let n = tree::live_threads(c.t).count();
            (n > 0).then_some(n as f64)
        },
    },
    Signal {
        name: "state.blocked_threads",
        unit: Unit::Count,
        doc: "live threads blocked in a syscall for ≥ 1 s",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let live: Vec<f64> = tree::live_threads(c.t)
                .map(|(_, th)| tree::blocked_seconds(th))
                .collect();
            (!live.is_empty()).then(|| live.iter().filter(|s| **s >= 1.0).count() as f64)
        },
    },
    Signal {
        name: "cpu.single_thread_busy_ratio",
        unit: Unit::Ratio,
        doc: "the highest share of the window a main thread spent on a CPU or waiting for one (its process's run-queue wait), among the tree's processes whose other threads use < 0.25 cores",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            tree::single_threaded(c.t)
                .filter(|(_, _, others)| *others < tree::SINGLE_THREAD_OTHERS)
                .map(|(_, main, _)| main)
                .reduce(f64::max)
        },
    },
    Signal {
        name: "cpu.cores_used",
        unit: Unit::Count,
        doc: "on-CPU seconds per second of the tree",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.oncpu_ns) / 1e9),
    },
    Signal {
        name: "cpu.runq_wait_seconds_per_second",
        unit: Unit::PerSecond,
        doc: "run-queue wait per second",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.runq_wait_ns) / 1e9),
    },
    Signal {
        name: "cpu.runq_wait_ratio",
        unit: Unit::Ratio,
        doc: "run-queue wait / on-CPU time",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let oncpu = c.sum(|x| x.oncpu_ns);
            (c.w > 0.0 && oncpu > 0.0).then(|| c.sum(|x| x.runq_wait_ns) / oncpu)
        },
    },
    Signal {
        name: "cpu.allowed_cores",
        unit: Unit::Count,
        doc: "the cores the tree may use: per live process the fewest of its affinity's CPUs (a cpuset bounds it), its cgroups' CFS quota (v1 or v2) and the node's CPUs; the widest of the tree's busy processes",
        how_to_get: HowToGet::Measured,
        compute: allowed_cores,
    },
    Signal {
        name: "cpu.demand_cores",
        unit: Unit::Count,
        doc: "cores the tree would have used had it never waited for a CPU: on-CPU time plus run-queue wait per second of the window",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second((c.sum(|x| x.oncpu_ns) + c.sum(|x| x.runq_wait_ns)) / 1e9),
    },
    Signal {
        name: "cpu.neighbour_speedup",
        unit: Unit::Count,
        doc: "how much faster the tree would run with the cores it may use to itself: min(cpu.demand_cores, cpu.allowed_cores) / cpu.cores_used; about 1 when its own threads fill its cores (more of them cannot run at once)",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let used = c.per_second(c.sum(|x| x.oncpu_ns) / 1e9)?;
            let demand = c.per_second((c.sum(|x| x.oncpu_ns) + c.sum(|x| x.runq_wait_ns)) / 1e9)?;
            let allowed = allowed_cores(c)?;
            (used > 0.0).then(|| (demand.min(allowed) / used).max(1.0))
        },
    },
    Signal {
        name: "cpu.contention_speedup",
        unit: Unit::Count,
        doc: "the estimated speed-up of removing the neighbours: cpu.neighbour_speedup, at most 1 / gpu.sm_busy_ratio for a tree whose GPU work sets its pace",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let cpu = super::find("cpu.neighbour_speedup").and_then(|s| (s.compute)(c))?;
            let gpu = super::find("gpu.sm_busy_ratio")
                .and_then(|s| (s.compute)(c))
                .filter(|b| *b > 0.0)
                .map_or(f64::INFINITY, |b| 1.0 / b);
            Some(cpu.min(gpu).max(1.0))
        },
    },
    Signal {
        name: "cpu.neighbours_cores",
        unit: Unit::Count,
        doc: "CPU used by every process outside the tree over the same window, in cores (the busiest are named in the finding)",
        how_to_get: HowToGet::Measured,
        compute: |c| c.t.neighbours_cores,
    },
    Signal {
        name: "cpu.threads",
        unit: Unit::Count,
        doc: "live threads",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(c.threads.len() as f64),
    },
    Signal {
        name: "cpu.busy_threads",
        unit: Unit::Count,
        doc: "live threads that want a CPU (running or preempted) more than half their time",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(busy_threads(c)),
    },
    Signal {
        name: "cpu.threads_per_cpu",
        unit: Unit::Count,
        doc: "busy threads per CPU",
        how_to_get: HowToGet::Measured,
        compute: |c| c.cpus.map(|n| busy_threads(c) / n),
    },
    Signal {
        name: "cpu.involuntary_switch_ratio",
        unit: Unit::Ratio,
        doc: "involuntary / all context switches",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let s = &c.t.total.sched;
            let (vol, invol) = (s.voluntary_switches as f64, s.involuntary_switches as f64);
            (vol + invol > 0.0).then(|| invol / (vol + invol))
        },
    },
    Signal {
        name: "cpu.main_thread_busy_ratio",
        unit: Unit::Ratio,
        doc: "on-CPU share of the main thread of the process that drives the GPU (most launches, else most runtime calls, else one on a device, else the root) over the window (its life when younger)",
        how_to_get: HowToGet::MainThread,
        compute: main_thread_busy_ratio,
    },
    Signal {
        name: "cpu.workers",
        unit: Unit::Count,
        doc: "live descendants of the process that drives the GPU (DataLoader workers...)",
        how_to_get: HowToGet::Measured,
        compute: |c| c.driver.map(|_| c.workers.len() as f64),
    },
    Signal {
        name: "cpu.workers_cores_used",
        unit: Unit::Count,
        doc: "the workers' on-CPU seconds per second",
        how_to_get: HowToGet::Measured,
        compute: workers_cores_used,
    },
    Signal {
        name: "cpu.workers_busy_ratio",
        unit: Unit::Ratio,
        doc: "the workers' on-CPU seconds per second, per worker",
        how_to_get: HowToGet::Measured,
        compute: |c| workers_cores_used(c).map(|cores| cores / c.workers.len() as f64),
    },
];

fn busy_threads(c: &Ctx) -> f64 {
    c.threads
        .iter()
        .filter(|(p, th)| {
            let l = c.life_in(p, &th.sched);
            l > 0.0 && (th.sched.oncpu_ns + th.sched.offcpu_preempted_ns) as f64 / l > 0.5
        })
        .count() as f64
}

/// Over the window when the history has the main thread's time, else over its life.
fn main_thread_busy_ratio(c: &Ctx) -> Option<f64> {
    let root = c.driver?;
    match root.window.as_ref() {
        Some(win) if c.w > 0.0 && win.main_thread_oncpu_ns.is_some() && win.duration_ms > 0 => {
            // A process younger than the window: over its life (unknown life: the window).
            let window_ns = win.duration_ms as f64 * 1e6;
            let life = c.span_ns(root);
            let span = if life > 0.0 {
                window_ns.min(life)
            } else {
                window_ns
            };
            Some((win.main_thread_oncpu_ns.unwrap_or(0) as f64 / span).min(1.0))
        }
        _ => {
            let main = root.threads.iter().find(|th| th.tid == root.pid)?;
            let l = c.life_in(root, &main.sched);
            (l > 0.0).then(|| main.sched.oncpu_ns as f64 / l)
        }
    }
}

fn workers_cores_used(c: &Ctx) -> Option<f64> {
    if c.workers.is_empty() {
        return None;
    }
    c.per_second(
        c.workers
            .iter()
            .filter_map(|p| p.window.as_ref())
            .map(|x| x.oncpu_ns as f64)
            .sum::<f64>()
            / 1e9,
    )
}

/// The cores the tree may use (see `cpu.allowed_cores`): the widest of its processes that ran
/// in the window; the node's CPUs when none was read (an older file).
fn allowed_cores(c: &Ctx) -> Option<f64> {
    let node = c.cpus?;
    let widest =
        c.t.processes
            .iter()
            .filter(|p| p.alive && p.window.as_ref().is_some_and(|w| w.oncpu_ns > 0))
            .filter(|p| p.cpus_allowed.is_some() || p.cpu_quota_cores.is_some())
            .map(|p| {
                let affinity = p.cpus_allowed.map_or(node, f64::from);
                affinity
                    .min(p.cpu_quota_cores.unwrap_or(f64::INFINITY))
                    .min(node)
            })
            .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))));
    Some(widest.unwrap_or(node))
}
