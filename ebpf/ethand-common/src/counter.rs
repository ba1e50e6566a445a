//! Indexes into the `COUNTERS` per-CPU array: events ethand could not account. Exported as
//! `ethand_bpf_dropped_events_total{reason}`; never silent.

/// THREADS was full: a thread's scheduler accounting was lost.
pub const THREADS_FULL: u32 = 0;
/// SYSCALLS was full.
pub const SYSCALLS_FULL: u32 = 1;
/// SYSCALL_HIST was full.
pub const SYSCALL_HIST_FULL: u32 = 2;
/// BLK_INFLIGHT was full (request not timed).
pub const BLK_INFLIGHT_FULL: u32 = 3;
/// BLK_STATS was full.
pub const BLK_STATS_FULL: u32 = 4;
/// NET_STATS was full.
pub const NET_STATS_FULL: u32 = 5;
/// The lifecycle ring buffer was full.
pub const LIFECYCLE_RINGBUF_FULL: u32 = 6;
/// A syscall exit whose entry was not seen (started before attach): not an error.
pub const SYSCALL_EXIT_UNMATCHED: u32 = 7;
/// Block completions whose issue was not seen.
pub const BLK_COMPLETE_UNMATCHED: u32 = 8;
/// GPU_CALLS was full.
pub const GPU_CALLS_FULL: u32 = 9;
/// GPU_ALLOCS was full: an allocation's size is not known at its free.
pub const GPU_ALLOCS_FULL: u32 = 10;
/// GPU_PROC was full.
pub const GPU_PROC_FULL: u32 = 11;
/// GPU_INFLIGHT was full: a call's return was not accounted.
pub const GPU_INFLIGHT_FULL: u32 = 12;
/// A woken thread found its WAKEUPS slot holding a later wakeup of another thread (tids
/// equal modulo the slot count): that wake-to-run wait was not counted.
pub const WAKEUP_SLOT_TAKEN: u32 = 13;
/// A thread was switched out whose switch-in no tracepoint reported (some kernels fire
/// no tracepoints in the task context of some tasks, such as a sandbox's agent, so the
/// switch away from one of them is never seen). Where `oncpu_from_task` holds, its
/// on-CPU time is still exact and the wait before that run is placed from the run's
/// charge. Counted only where the switch-in does accounting (not `offcpu_from_task`,
/// where nothing depends on it). Informational: the kernel did not deliver the event.
pub const SWITCH_IN_UNSEEN: u32 = 14;
/// A probed GPU call's user stack could not be taken (a different stack already holds
/// its hash slot in GPU_STACKS, the map is full, the stack could not be read): the call is
/// counted under the unattributed site ([`super::GPU_STACK_UNATTRIBUTED`]).
pub const GPU_STACK_LOST: u32 = 15;
/// GPU_SITES was full: a call was counted in GPU_CALLS but at no call site.
pub const GPU_SITES_FULL: u32 = 16;
/// SYSCALL_KEYS was full: a new syscall number of a process was counted without its
/// per-process limit being checked.
pub const SYSCALL_KEYS_FULL: u32 = 17;
/// A process called a syscall number beyond its limit of distinct numbers: counted under
/// [`super::SYSCALL_NR_OVER_LIMIT`] (informational: nothing is lost but the number).
pub const SYSCALLS_OVER_LIMIT: u32 = 18;
/// A process had as many call sites as it may have: its call was counted under the
/// unattributed site, without taking its stack (informational).
pub const GPU_SITES_OVER_LIMIT: u32 = 19;
/// PY_STACKS was full: a call of a Python process was counted at its native call site
/// without its Python frames.
pub const PY_STACKS_FULL: u32 = 20;
/// The Python walk of a registered process could not read the thread's state or a frame
/// (a page not resident, a torn frame): the call was counted with the frames read so far, or
/// none.
pub const PY_WALK_FAULT: u32 = 21;
pub const COUNT: u32 = 22;
pub const NAMES: [&str; COUNT as usize] = [
    "threads_full",
    "syscalls_full",
    "syscall_hist_full",
    "blk_inflight_full",
    "blk_stats_full",
    "net_stats_full",
    "lifecycle_ringbuf_full",
    "syscall_exit_unmatched",
    "blk_complete_unmatched",
    "gpu_calls_full",
    "gpu_allocs_full",
    "gpu_proc_full",
    "gpu_inflight_full",
    "wakeup_slot_taken",
    "switch_in_unseen",
    "gpu_stack_lost",
    "gpu_sites_full",
    "syscall_keys_full",
    "syscalls_over_process_limit",
    "gpu_sites_over_process_limit",
    "py_stacks_full",
    "py_walk_fault",
];
/// Which of the above mean lost data (the rest are informational).
pub const IS_LOSS: [bool; COUNT as usize] = [
    true, true, true, true, true, true, true, false, false, true, true, true, true, true, false,
    true, true, false, false, false, true, false,
];
