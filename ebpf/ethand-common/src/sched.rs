//! Scheduler state: per-thread counters, the per-CPU context of the running thread and the
//! wakeup slots.
use crate::HIST_BUCKETS;

/// Flags in [`ThreadStats::flags`].
pub mod thread_flags {
    /// The thread ran `do_exit`; userspace reclaims the entry after reading it.
    pub const EXITED: u32 = 1;
    /// The last switch-out was voluntary (the thread blocked).
    pub const BLOCKED: u32 = 2;
}

/// Per-thread scheduler state and counters. Key: tid (u32). Written only from the CPU the
/// thread runs on (switch in/out), so no atomics are needed; wakeups go to `WakeupSlot`s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    pub tgid: u32,
    pub flags: u32,
    /// Start time (CLOCK_MONOTONIC ns) of the thread group leader: with tgid, the process
    /// identity that survives pid reuse.
    pub proc_start_ns: u64,
    /// When the thread last went on CPU (0: not since its last switch-out; timed only where
    /// the switch-in accounts, without `offcpu_from_task`) / off CPU.
    pub switch_in_ns: u64,
    pub switch_out_ns: u64,
    /// On-CPU time since ethand first saw the thread. With BTF, from the kernel's own
    /// `se.sum_exec_runtime` (see `exec_runtime_ns`), so a run whose switch-in no tracepoint
    /// reported still counts; else from the switch-in and switch-out times.
    pub oncpu_ns: u64,
    /// The thread's `se.sum_exec_runtime` at its last switch-out (or when the entry was
    /// made): the next switch-out adds the difference to `oncpu_ns`.
    pub exec_runtime_ns: u64,
    /// The thread's `sched_info.run_delay` (the kernel's run-queue wait) at its last
    /// switch-out (or when the entry was made): the next switch-out adds the difference, the
    /// wait before that run, to `runq_wait_ns` (with `runq_from_task`).
    pub run_delay_ns: u64,
    /// Off-CPU time of slices that began with the thread blocking (sleep + later run-queue wait).
    pub offcpu_blocked_ns: u64,
    /// Off-CPU time of slices that began with a preemption (all of it run-queue wait).
    pub offcpu_preempted_ns: u64,
    /// Runnable but not running: wakeup-to-run plus preempted-to-run.
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// A syscall in flight when the thread was switched out (carried across CPUs).
    pub sys_start_ns: u64,
    pub sys_nr: u32,
    pub _pad0: u32,
    /// log2 histogram of run-queue waits (u32 buckets: userspace takes wrapping deltas).
    pub runq_wait_hist: [u32; HIST_BUCKETS],
}

/// The thread currently running on a CPU, cached at switch-in so that syscall handlers need
/// no hash lookup. One entry per CPU (per-CPU array of size 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCtx {
    pub tid: u32,
    pub tgid: u32,
    pub proc_start_ns: u64,
    pub sys_start_ns: u64,
    pub sys_nr: u32,
    /// Calls of one syscall in a row by this thread, summed here and not yet added to
    /// SYSCALLS (syscall batching; `pend_count` 0: nothing pending). They belong to the
    /// thread this context describes: every change of that thread flushes them first.
    pub pend_nr: u32,
    pub pend_time_ns: u64,
    /// When the first pending call returned: bounds how late userspace sees them.
    pub pend_since_ns: u64,
    pub pend_count: u32,
    pub pend_errors: u32,
    /// The run's latest latency-histogram bucket and how many calls of the run landed in
    /// it in a row (`pend_hist_count` 0: none pending); class as in `SyscallHistKey`.
    pub pend_hist_class: u32,
    pub pend_hist_bucket: u32,
    pub pend_hist_count: u32,
    /// The thread switched in last on this CPU (0: idle), set at every reported switch.
    /// Userspace reads it to find the runs in progress, whose on-CPU time the kernel charges
    /// only at their switch-out (a busy loop alone on a CPU may not be switched out for
    /// seconds).
    pub running_tid: u32,
}

/// When a thread was last woken, in the slot `tid % WAKEUP_SLOTS` of the WAKEUPS array and
/// tagged with its tid. An array because the verifier inlines an array lookup, where a hash
/// lookup is a call into the kernel's hash table: ~60 ns per wakeup on the development VM.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeupSlot {
    pub tid: u32,
    pub _pad0: u32,
    pub wakeup_ns: u64,
}

/// Slots of WAKEUPS (a power of two; 1 MiB). Two live threads share a slot only when their
/// tids differ by a multiple of it, which needs pid_max above it.
pub const WAKEUP_SLOTS: u32 = 65536;
