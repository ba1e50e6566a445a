//! Facts about a tree that the signals and the findings' details share.
use ethand_snapshot::{ProcessSnapshot, ThreadSnapshot, TreeSnapshot, devices::GpuDevice};

/// The GPUs the tree uses (all GPUs when the driver names none for it).
pub fn gpus(t: &TreeSnapshot) -> impl Iterator<Item = &GpuDevice> {
    let used: Vec<String> = t
        .processes
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.device.clone()))
        .collect();
    t.devices
        .gpus
        .iter()
        .filter(move |g| used.is_empty() || used.contains(&g.label()))
}

/// Live threads of live processes whose state the snapshot read (not zombies).
pub fn live_threads(t: &TreeSnapshot) -> impl Iterator<Item = (&ProcessSnapshot, &ThreadSnapshot)> {
    t.processes
        .iter()
        .filter(|p| p.alive)
        .flat_map(|p| p.threads.iter().map(move |th| (p, th)))
        .filter(|(_, th)| {
            th.alive
                && th
                    .now
                    .as_ref()
                    .is_some_and(|n| n.state != "zombie" && n.state != "dead")
        })
}

/// How long a live thread has been blocked in its syscall (0: running, runnable, or asleep
/// outside a syscall, which cannot be timed).
pub fn blocked_seconds(th: &ThreadSnapshot) -> f64 {
    match &th.now {
        Some(n) if n.state != "running" => n
            .syscall
            .as_ref()
            .and_then(|s| s.blocked_ns())
            .map_or(0.0, |ns| ns as f64 / 1e9),
        _ => 0.0,
    }
}

/// Whether a live thread's wait says nothing of a stall: an idle wait (a timed sleep, an
/// event loop's wait: `InFlightSyscall::idle`), a wait for children (wait4, waitid: their
/// own states say whether they are stalled), or a futex wait in a process that has an idle
/// thread (an event loop's pool waiting for work).
pub fn excused_wait(p: &ProcessSnapshot, th: &ThreadSnapshot) -> bool {
    let idle = |th: &ThreadSnapshot| {
        th.now
            .as_ref()
            .and_then(|n| n.syscall.as_ref())
            .is_some_and(|s| s.idle)
    };
    let Some(sc) = th.now.as_ref().and_then(|n| n.syscall.as_ref()) else {
        return false;
    };
    sc.idle
        || matches!(sc.name.as_str(), "wait4" | "waitid")
        || (sc.name == "futex" && p.threads.iter().any(|o| o.alive && idle(o)))
}

/// The shortest wait among the live threads whose waits may be a stall (running ones count
/// 0; see [`excused_wait`] for those left out); 0 when every one is left out, None without
/// thread states.
pub fn stalled_seconds(t: &TreeSnapshot) -> Option<f64> {
    let mut live = live_threads(t).peekable();
    live.peek()?;
    Some(
        live.filter(|(p, th)| !excused_wait(p, th))
            .map(|(_, th)| blocked_seconds(th))
            .reduce(f64::min)
            .unwrap_or(0.0),
    )
}

/// Main thread's demand (on a CPU or waiting for one) and the other threads' cores, over the
/// window, per live process.
pub const SINGLE_THREAD_OTHERS: f64 = 0.25;
pub fn single_threaded(t: &TreeSnapshot) -> impl Iterator<Item = (&ProcessSnapshot, f64, f64)> {
    t.processes.iter().filter(|p| p.alive).filter_map(|p| {
        let w = p.window.as_ref()?;
        let main = w.main_thread_oncpu_ns? as f64;
        let d = w.duration_ms as f64 * 1e6;
        // On a CPU or waiting for one: a serial loop on a busy node still wants a whole core
        // (the run-queue wait is the process's; its other threads use little by definition).
        (d > 0.0).then(|| {
            (
                p,
                ((main + w.runq_wait_ns as f64) / d).min(1.0),
                (w.oncpu_ns as f64 - main).max(0.0) / d,
            )
        })
    })
}

/// The tree calls a GPU/NPU runtime or holds a device (by the driver's process list).
pub fn uses_accelerator(t: &TreeSnapshot) -> bool {
    t.total.gpu.is_some() || t.processes.iter().any(|p| !p.devices.is_empty())
}
