//! A process's history: its cumulative [`Totals`] at the rounds they changed, thinned with
//! age, from which windows ("the last N seconds") and timelines are differences.
use std::collections::VecDeque;

/// A process's cumulative totals at one point of its history (the fields of
/// snap::WindowStats): windows and timelines are differences of two of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub offcpu_preempted_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
    pub syscall_time_ns: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_bytes: u64,
    pub gpu_launches: u64,
    pub gpu_sync_ns: u64,
    pub gpu_copy_h2d_bytes: u64,
    pub gpu_copy_d2h_bytes: u64,
    pub gpu_copy_other_bytes: u64,
    pub collective_calls: u64,
    pub collective_ns: u64,
    /// Absolute (not a counter): its window change is the growth of live GPU memory.
    pub gpu_memory_live_bytes: u64,
    pub gpu_sync_calls: u64,
    pub gpu_copy_h2d_calls: u64,
    pub gpu_copy_d2h_calls: u64,
    /// The main thread's on-CPU time: is the thread that drives the GPU busy now?
    pub main_thread_oncpu_ns: u64,
    /// Time in the read family of syscalls, and in the write family with the syncs
    /// (`syscalls_table::io_direction`): is the tree waiting on reads or on writes?
    pub io_read_syscall_ns: u64,
    pub io_write_syscall_ns: u64,
    /// Frees that return memory to the driver (`snap::WindowStats::gpu_blocking_frees`).
    pub gpu_blocking_frees: u64,
}

impl Totals {
    /// Field by field `f(self, other)`: the one place that lists every field.
    fn zip_with(&self, o: &Self, f: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            oncpu_ns: f(self.oncpu_ns, o.oncpu_ns),
            offcpu_blocked_ns: f(self.offcpu_blocked_ns, o.offcpu_blocked_ns),
            offcpu_preempted_ns: f(self.offcpu_preempted_ns, o.offcpu_preempted_ns),
            runq_wait_ns: f(self.runq_wait_ns, o.runq_wait_ns),
            syscalls: f(self.syscalls, o.syscalls),
            syscall_time_ns: f(self.syscall_time_ns, o.syscall_time_ns),
            block_read_bytes: f(self.block_read_bytes, o.block_read_bytes),
            block_write_bytes: f(self.block_write_bytes, o.block_write_bytes),
            net_tx_bytes: f(self.net_tx_bytes, o.net_tx_bytes),
            net_rx_bytes: f(self.net_rx_bytes, o.net_rx_bytes),
            gpu_launches: f(self.gpu_launches, o.gpu_launches),
            gpu_sync_ns: f(self.gpu_sync_ns, o.gpu_sync_ns),
            gpu_copy_h2d_bytes: f(self.gpu_copy_h2d_bytes, o.gpu_copy_h2d_bytes),
            gpu_copy_d2h_bytes: f(self.gpu_copy_d2h_bytes, o.gpu_copy_d2h_bytes),
            gpu_copy_other_bytes: f(self.gpu_copy_other_bytes, o.gpu_copy_other_bytes),
            collective_calls: f(self.collective_calls, o.collective_calls),
            collective_ns: f(self.collective_ns, o.collective_ns),
            gpu_memory_live_bytes: f(self.gpu_memory_live_bytes, o.gpu_memory_live_bytes),
            gpu_sync_calls: f(self.gpu_sync_calls, o.gpu_sync_calls),
            gpu_copy_h2d_calls: f(self.gpu_copy_h2d_calls, o.gpu_copy_h2d_calls),
            gpu_copy_d2h_calls: f(self.gpu_copy_d2h_calls, o.gpu_copy_d2h_calls),
            main_thread_oncpu_ns: f(self.main_thread_oncpu_ns, o.main_thread_oncpu_ns),
            io_read_syscall_ns: f(self.io_read_syscall_ns, o.io_read_syscall_ns),
            io_write_syscall_ns: f(self.io_write_syscall_ns, o.io_write_syscall_ns),
            gpu_blocking_frees: f(self.gpu_blocking_frees, o.gpu_blocking_frees),
        }
    }

    /// Adds `o`, field by field (the sum over a tree's processes).
    pub fn add(&mut self, o: &Self) {
        *self = self.zip_with(o, |a, b| a + b);
    }

    /// The change since `earlier`, field by field (0 where a total went down).
    pub fn since(&self, earlier: &Self) -> Self {
        self.zip_with(earlier, u64::saturating_sub)
    }
}

/// Full resolution of the history for this long (ms); older points are thinned to the last
/// one of each COARSE_MS, so that a busy process costs ~60 points, not one per interval.
pub(super) const FINE_MS: u64 = 30_000;
pub(super) const COARSE_MS: u64 = 10_000;

/// Points in time (wall-clock ms, ascending) with a value each, thinned with age: every point
/// of the last FINE_MS, the last point of each COARSE_MS bucket before that, and nothing
/// older than the horizon except the one point that gives the value at the horizon.
#[derive(Default)]
pub(super) struct Thinned<T> {
    pub(super) points: VecDeque<(u64, T)>,
}

impl<T> Thinned<T> {
    pub(super) fn push(&mut self, t: u64, v: T) {
        self.points.push_back((t, v));
    }

    pub(super) fn last(&self) -> Option<&(u64, T)> {
        self.points.back()
    }

    /// The value at time `t`: the latest point at or before it.
    pub(super) fn at(&self, t: u64) -> Option<&T> {
        let n = self.points.partition_point(|(pt, _)| *pt <= t);
        n.checked_sub(1).map(|i| &self.points[i].1)
    }

    pub(super) fn thin(&mut self, now_ms: u64, history_ms: u64) {
        let horizon = now_ms.saturating_sub(history_ms);
        while self.points.len() >= 2 && self.points[1].0 <= horizon {
            self.points.pop_front();
        }
        let fine_from = now_ms.saturating_sub(FINE_MS);
        let bucket = |t: u64| t / COARSE_MS;
        let old = self.points.partition_point(|(t, _)| *t < fine_from);
        if old < 2 {
            return;
        }
        // Keep an old point if the next one is in another bucket (or is not old).
        let mut keep: Vec<bool> = (0..old)
            .map(|i| i + 1 >= old || bucket(self.points[i].0) != bucket(self.points[i + 1].0))
            .collect();
        keep.resize(self.points.len(), true);
        let mut k = keep.into_iter();
        self.points.retain(|_| k.next().unwrap_or(true));
    }
}

/// One process's totals: a point only when they changed (the value holds until the next).
pub(super) type History = Thinned<Totals>;
