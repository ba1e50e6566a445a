//! The kernel/user contract of ethand: every type stored in a BPF map or sent through the
//! ring buffer, and the constants both sides agree on.
//!
//! Invariants: every struct is `#[repr(C)]`, has no implicit padding (explicit `_pad` fields,
//! fields ordered by size) and contains only integers, so that `aya::Pod` is sound and the
//! layout is identical in the BPF object and in userspace. `tests::sizes` pins the sizes.
#![no_std]

/// Number of log2 buckets in every latency histogram. Bucket `i` counts values `v` (ns) with
/// `floor(log2(v)) == i` (bucket 0 also holds 0 and 1 ns); the last bucket holds everything
/// above 2^31 ns (~2.1 s).
pub const HIST_BUCKETS: usize = 32;

/// Syscall numbers are accounted below this (x86_64 has ~470); numbers at or above it are
/// counted under [`SYSCALL_NR_UNIMPLEMENTED`].
pub const MAX_SYSCALL_NR: u32 = 1024;

/// The one key of every call the kernel does not implement (a number at or above
/// [`MAX_SYSCALL_NR`], or any that returned ENOSYS): a process calling hundreds of unknown
/// numbers takes one map entry, not hundreds.
pub const SYSCALL_NR_UNIMPLEMENTED: u32 = MAX_SYSCALL_NR - 1;
/// The key of a process's calls of syscall numbers beyond its share of the map
/// (`maps.syscall_numbers_per_process` distinct numbers): counted, without the number.
pub const SYSCALL_NR_OVER_LIMIT: u32 = MAX_SYSCALL_NR - 2;

/// `CpuCtx::sys_nr` / `ThreadStats::sys_nr` value meaning "no syscall in flight".
pub const NO_SYSCALL: u32 = u32::MAX;

/// Flags in [`ThreadStats::flags`].
pub mod thread_flags {
    /// The thread ran `do_exit`; userspace reclaims the entry after reading it.
    pub const EXITED: u32 = 1;
    /// The last switch-out was voluntary (the thread blocked).
    pub const BLOCKED: u32 = 2;
}

/// Syscall classes that get a latency histogram. Class 0 gets none.
pub mod syscall_class {
    pub const NONE: u8 = 0;
    pub const READ_WRITE: u8 = 1;
    pub const FUTEX: u8 = 2;
    pub const POLL: u8 = 3;
    pub const SLEEP: u8 = 4;
    pub const IO_URING: u8 = 5;
    pub const OPEN_CLOSE_SYNC: u8 = 6;
    pub const NET: u8 = 7;
    /// Number of classes including NONE.
    pub const COUNT: usize = 8;
    pub const NAMES: [&str; COUNT] = [
        "none",
        "read_write",
        "futex",
        "poll",
        "sleep",
        "io_uring",
        "open_close_sync",
        "net",
    ];
}

/// Block operation kinds in [`BlkKey::op`].
pub mod blk_op {
    pub const READ: u32 = 0;
    pub const WRITE: u32 = 1;
    pub const FLUSH: u32 = 2;
    pub const DISCARD: u32 = 3;
    pub const OTHER: u32 = 4;
    pub const NAMES: [&str; 5] = ["read", "write", "flush", "discard", "other"];
}

/// Kinds of [`LifecycleEvent`].
pub mod lifecycle_kind {
    // 1 was FORK: births need no event (a process appears with its first counters).
    pub const EXEC: u32 = 2;
    pub const EXIT: u32 = 3;
}

/// Indexes into the `COUNTERS` per-CPU array: events ethand could not account. Exported as
/// `ethand_bpf_dropped_events_total{reason}`; never silent.
pub mod counter {
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
    pub const COUNT: u32 = 20;
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
    ];
    /// Which of the above mean lost data (the rest are informational).
    pub const IS_LOSS: [bool; COUNT as usize] = [
        true, true, true, true, true, true, true, false, false, true, true, true, true, true,
        false, true, true, false, false, false,
    ];
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

/// Process identity: tgid plus the leader's start time (pid reuse never merges two processes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcKey {
    pub tgid: u32,
    pub _pad0: u32,
    pub proc_start_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    pub tgid: u32,
    pub nr: u32,
    pub proc_start_ns: u64,
}

/// Per process and syscall number. Updated with atomic adds (threads of one process run on
/// several CPUs at once).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallStats {
    pub count: u64,
    /// Returns in [-4095, -1].
    pub errors: u64,
    pub time_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SyscallHistKey {
    pub tgid: u32,
    pub class: u32,
    pub proc_start_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hist {
    pub buckets: [u64; HIST_BUCKETS],
}

impl Default for Hist {
    fn default() -> Self {
        Self {
            buckets: [0; HIST_BUCKETS],
        }
    }
}

impl BlkReqState {
    pub const OP_UNKNOWN: u32 = u32::MAX;
}

/// An in-flight block request. The BTF programs key it by the address of its `struct
/// request` (`dev` = [`BlkReqKey::BY_ADDRESS`]), which no merge changes; the classic
/// tracepoints carry no address and key it by (dev, start sector).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlkReqKey {
    pub dev: u32,
    pub _pad0: u32,
    /// The start sector, or the request's address.
    pub sector: u64,
}

impl BlkReqKey {
    pub const BY_ADDRESS: u32 = u32::MAX;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkReqState {
    pub tgid: u32,
    /// blk_op decided when the request was created (the flush flag is gone by completion);
    /// [`BlkReqState::OP_UNKNOWN`] when the start was not seen.
    pub op: u32,
    pub proc_start_ns: u64,
    /// When the submitter created the request (block_io_start / block_rq_insert).
    pub start_ns: u64,
    /// When the driver was handed the request (block_rq_issue).
    pub issue_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlkKey {
    /// Kernel dev_t as the block tracepoints report it (MAJOR << 20 | MINOR).
    pub dev: u32,
    pub tgid: u32,
    pub proc_start_ns: u64,
    pub op: u32,
    pub _pad0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlkStats {
    pub ops: u64,
    pub bytes: u64,
    pub queue_ns: u64,
    pub service_ns: u64,
    pub queue_hist: [u64; HIST_BUCKETS],
    pub service_hist: [u64; HIST_BUCKETS],
}

impl Default for BlkStats {
    fn default() -> Self {
        Self {
            ops: 0,
            bytes: 0,
            queue_ns: 0,
            service_ns: 0,
            queue_hist: [0; HIST_BUCKETS],
            service_hist: [0; HIST_BUCKETS],
        }
    }
}

/// Per process network counters. Key: [`ProcKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub tcp_tx_bytes: u64,
    pub tcp_rx_bytes: u64,
    pub udp_tx_bytes: u64,
    pub udp_rx_bytes: u64,
    pub tcp_retransmits: u64,
    /// connect() that reached ESTABLISHED.
    pub tcp_active_opens: u64,
    /// Owned TCP sockets that reached CLOSE from an open state.
    pub tcp_closes: u64,
    pub tcp_resets_sent: u64,
    pub tcp_resets_received: u64,
}

/// Sent through the LIFECYCLE ring buffer on process exec and exit: the process, and what
/// /proc can no longer tell once it has exited (its parent, cgroup, user and name), taken in
/// kernel context. A process that lives between two collection rounds is known by this alone.
/// Under churn (10,000 exits/s) every byte here is ring buffer room: 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LifecycleEvent {
    pub kind: u32,
    pub tgid: u32,
    pub proc_start_ns: u64,
    /// The parent that forked it (from [`ProcOrigin`]), else its parent now; 0: unknown.
    pub parent_tgid: u32,
    pub uid: u32,
    pub parent_start_ns: u64,
    /// cgroup v2 id (the inode number of its directory in cgroupfs) at the event.
    pub cgroup_id: u64,
    /// `comm` of the thread that sent the event, NUL-padded.
    pub comm: [u8; 16],
}

/// Recorded at fork for a new process (not a thread), keyed by its tgid: the parent that forked
/// it, which a later reparenting (its parent exiting first) does not change.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcOrigin {
    pub proc_start_ns: u64,
    pub parent_tgid: u32,
    pub _pad0: u32,
    pub parent_start_ns: u64,
}

/// How one probed runtime-library symbol is accounted ([`GpuOpDesc::kind`]).
pub mod gpu_kind {
    /// Calls only (kernel launches, graph launches, operator executions, group start/end).
    pub const COUNT: u8 = 0;
    /// A copy: bytes from argument `bytes_arg`; direction fixed or from an argument.
    pub const COPY: u8 = 1;
    /// An allocation returning its pointer through the out-pointer `aux_arg`, size `bytes_arg`;
    /// recorded at return when the call succeeded.
    pub const ALLOC: u8 = 2;
    /// A free of the pointer `aux_arg`: its size comes from the allocation table.
    pub const FREE: u8 = 3;
    /// Registration of existing host memory (pointer `aux_arg`, size `bytes_arg`), recorded
    /// at return when the call succeeded; freed by the matching unregister (kind FREE).
    pub const REGISTER: u8 = 4;
    /// Host blocked until the device catches up: always timed.
    pub const SYNC: u8 = 5;
    /// A collective: element count `bytes_arg` times the size of data type `aux_arg`.
    pub const COLLECTIVE: u8 = 6;
    /// Communicator creation: rank `aux_arg` and size `aux2_arg` (GPU_ARG_NONE: unknown).
    pub const COMM_INIT: u8 = 7;
    /// `cuMemcpy2D*`: argument 0 points at a CUDA_MEMCPY2D (width x height bytes, memory
    /// types give the direction).
    pub const COPY_2D: u8 = 8;
}

/// [`GpuOpDesc`] argument index meaning "none".
pub const GPU_ARG_NONE: u8 = 0xff;

/// [`GpuOpDesc::flags`].
pub mod gpu_flags {
    /// Timed at every level that probes the symbol (syncs, collectives): needs a uretprobe.
    pub const TIMED: u8 = 1;
    /// Needs its return (allocations, registrations: the pointer and the status).
    pub const RET: u8 = 2;
}

/// Data-type size tables for collectives ([`GpuOpDesc::dtype_table`]).
pub mod gpu_dtype {
    pub const NONE: u8 = 0;
    /// `ncclDataType_t`: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64,
    /// bfloat16, float8e4m3, float8e5m2.
    pub const NCCL: u8 = 1;
    /// `HcclDataType`: int8, int16, int32, fp16, fp32, int64, uint64, uint8, uint16, uint32,
    /// fp64, bfp16, int128.
    pub const HCCL: u8 = 2;

    /// Bytes of one element of data type `t` in `table` (0: unknown). A `match`, not an
    /// array, so that the BPF programs need no read-only data for it.
    #[inline(always)]
    pub fn size(table: u8, t: u64) -> u64 {
        match table {
            NCCL => match t {
                0 | 1 | 10 | 11 => 1,
                6 | 9 => 2,
                2 | 3 | 7 => 4,
                4 | 5 | 8 => 8,
                _ => 0,
            },
            HCCL => match t {
                0 | 7 => 1,
                1 | 3 | 8 | 11 => 2,
                2 | 4 | 9 => 4,
                5 | 6 | 10 => 8,
                12 => 16,
                _ => 0,
            },
            _ => 0,
        }
    }
}

/// Memory kinds tracked per process ([`GpuOpDesc::mem`], index into [`GpuProcState`] arrays).
pub mod gpu_mem {
    pub const DEVICE: u8 = 0;
    pub const MANAGED: u8 = 1;
    pub const HOST_PINNED: u8 = 2;
    pub const HOST_REGISTERED: u8 = 3;
    pub const COUNT: usize = 4;
    pub const NAMES: [&str; COUNT] = ["device", "managed", "host_pinned", "host_registered"];
}

/// Copy directions ([`GpuCallKey::dir`]).
pub mod gpu_dir {
    pub const HOST_TO_DEVICE: u8 = 0;
    pub const DEVICE_TO_HOST: u8 = 1;
    pub const DEVICE_TO_DEVICE: u8 = 2;
    pub const PEER: u8 = 3;
    /// Unified addressing (`cuMemcpy`, `cuMemcpyAsync`): the driver infers the direction.
    pub const DEFAULT: u8 = 4;
    pub const HOST_TO_HOST: u8 = 5;
    pub const COUNT: usize = 6;
    pub const NAMES: [&str; COUNT] = [
        "host_to_device",
        "device_to_host",
        "device_to_device",
        "peer",
        "default",
        "host_to_host",
    ];
    /// [`super::GpuOpDesc::dir`]: direction from argument `aux_arg`, an `aclrtMemcpyKind`.
    pub const FROM_ACL_KIND: u8 = 0xfe;
    /// `aclrtMemcpyKind` (0 host-to-host, 1 host-to-device, 2 device-to-host,
    /// 3 device-to-device, 4 default) to direction.
    pub const ACL_KINDS: [u8; 5] = [
        HOST_TO_HOST,
        HOST_TO_DEVICE,
        DEVICE_TO_HOST,
        DEVICE_TO_DEVICE,
        DEFAULT,
    ];
}

/// What the uprobe programs need to know about one probed symbol; userspace fills the
/// `GPU_OPS` array, indexed by op id (the attach cookie).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuOpDesc {
    pub kind: u8,
    pub flags: u8,
    pub bytes_arg: u8,
    pub aux_arg: u8,
    pub aux2_arg: u8,
    pub mem: u8,
    pub dir: u8,
    pub dtype_table: u8,
}

/// Maximum number of op ids (symbols in the catalog).
pub const GPU_MAX_OPS: u32 = 4096;

/// Attach cookie: op id in the low 16 bits; [`GPU_COOKIE_TIME`] set when this level times
/// every call of the symbol (level `op`); the links' generation from bit
/// [`GPU_COOKIE_GEN_SHIFT`]: a probe counts only while its generation is the active one
/// (`GPU_GEN`), so that a level switch attaches the new links, makes them active in one map
/// write, and only then detaches the old ones: no call lost, none counted twice.
pub const GPU_COOKIE_TIME: u64 = 1 << 16;
pub const GPU_COOKIE_GEN_SHIFT: u32 = 32;
/// Generations wrap at this (16 bits of the cookie).
pub const GPU_GEN_MASK: u64 = 0xffff;

/// Per process, symbol and direction. Updated with atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuCallKey {
    pub tgid: u32,
    pub op: u16,
    /// Copy direction ([`gpu_dir`]); 0 for other kinds.
    pub dir: u16,
    pub proc_start_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuCallStats {
    /// Entries into the symbol.
    pub calls: u64,
    /// Returns with a non-zero status (only for calls whose return is probed).
    pub errors: u64,
    /// Copy bytes, collective bytes, or bytes allocated / freed / registered.
    pub bytes: u64,
    /// Host time inside the call, summed over `timed_calls` returns.
    pub time_ns: u64,
    pub timed_calls: u64,
}

/// A call in flight on one thread, keyed by (tid, op).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuInflightKey {
    pub tid: u32,
    pub op: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuInflight {
    pub start_ns: u64,
    /// Allocation: the out-pointer; registration: the host pointer.
    pub ptr: u64,
    pub size: u64,
    pub dir: u32,
    /// The call's site in `GPU_SITES` (a `GPU_STACKS` id, [`GPU_STACK_UNATTRIBUTED`]), or
    /// [`GPU_STACK_NONE`] where no stack was taken.
    pub stack_id: u32,
    /// The call's return address (see [`GpuSiteKey::caller`]).
    pub caller: u64,
}

/// [`GpuSiteKey::stack_id`] of calls whose user stack could not be taken.
pub const GPU_STACK_UNATTRIBUTED: u32 = u32::MAX;
/// [`GpuInflight::stack_id`] when call stacks are off.
pub const GPU_STACK_NONE: u32 = u32::MAX - 1;
/// Frames the kernel keeps per stack in `GPU_STACKS` (PERF_MAX_STACK_DEPTH).
pub const GPU_STACK_DEPTH: usize = 127;

/// One call site of a runtime symbol: per process, symbol and user stack (`GPU_STACKS` id)
/// at the call's entry. Updated with atomic adds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuSiteKey {
    pub tgid: u32,
    pub op: u32,
    pub proc_start_ns: u64,
    pub stack_id: u32,
    pub _pad0: u32,
    /// The return address at the top of the user stack at the probed function's entry: the
    /// immediate caller, which a frame-pointer walk from a function's first instruction
    /// misses (the kernel adds it only where the probed instruction is `push %rbp` or
    /// `endbr64`). 0: not read.
    pub caller: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSiteStats {
    pub calls: u64,
    /// Host time inside the calls from this site, summed over `timed_calls` returns.
    pub time_ns: u64,
    pub timed_calls: u64,
}

/// A live allocation, keyed by (tgid, pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuAllocKey {
    pub tgid: u32,
    pub _pad0: u32,
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuAlloc {
    pub size: u64,
    pub mem: u32,
    pub _pad0: u32,
}

/// Per process ([`ProcKey`]): memory live and peak by kind, and the communicator rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuProcState {
    /// Bytes allocated and not freed, by [`gpu_mem`] kind (two's complement: frees of memory
    /// allocated before ethand attached are not subtracted, see `untracked_frees`).
    pub live_bytes: [u64; gpu_mem::COUNT],
    pub peak_bytes: [u64; gpu_mem::COUNT],
    /// Frees of tracked allocations and their bytes, by the allocation's kind (a managed
    /// allocation freed with cuMemFree counts as managed).
    pub frees: [u64; gpu_mem::COUNT],
    pub freed_bytes: [u64; gpu_mem::COUNT],
    /// Frees of pointers ethand did not see allocated (allocated before it attached).
    pub untracked_frees: u64,
    /// Rank and size of the largest communicator the process created (the first of equal
    /// size); nranks 0: none yet. rank u32::MAX: one process drives all ranks
    /// (`ncclCommInitAll`) or unknown.
    pub rank: u32,
    pub nranks: u32,
    /// The library of that communicator, as a [`gpu_dtype`] table id (NCCL or HCCL).
    pub comm_lib: u32,
    /// Call sites (`GPU_SITES` entries) the process has made: at `gpu_sites_per_process`
    /// its further calls take no stack.
    pub sites: u32,
}

/// Offsets inside kernel structs, read from BTF by userspace and handed to the programs as
/// read-only globals (aya has no CO-RE for Rust programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_group_leader: u32,
    pub task_start_time: u32,
    /// Syscall number that is not a syscall: the uretprobe return trampoline (335 on x86_64).
    pub skip_syscall_nr: u32,
    /// `task_struct.se.cfs_rq`, `cfs_rq.rq` and `rq.clock`: the scheduler programs read their
    /// run queue's clock instead of calling bpf_ktime_get_ns().
    pub task_se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    /// 1 when the three offsets above were found (CONFIG_FAIR_GROUP_SCHED); 0: the
    /// scheduler programs use the monotonic clock.
    pub sched_clock_from_rq: u32,
    /// What the BTF block programs read of a `struct request`: its size and flags, and its
    /// disk's dev_t through `request.q->disk->{major, first_minor}`.
    pub request_q: u32,
    pub request_data_len: u32,
    pub request_cmd_flags: u32,
    pub request_queue_disk: u32,
    pub gendisk_major: u32,
    pub gendisk_first_minor: u32,
    /// `REQ_PREFLUSH`: 1 << `__REQ_PREFLUSH` of `enum req_flag_bits`.
    pub req_preflush: u32,
    /// 1 when every block offset above was found; 0: block IO uses the classic tracepoints.
    pub blk_btf: u32,
    /// `sock.sk_protocol` (a u16): what the BTF socket programs read to tell TCP from UDP.
    pub sock_protocol: u32,
    /// 1 when `sock_protocol` was found (a plain u16, not the bitfield of kernels before
    /// 5.6); 0: the socket probes use the classic tracepoints.
    pub net_btf: u32,
    /// 1 when the BTF `sched_process_exit` tracepoint passes `group_dead` (its second
    /// argument, a bool; kernels since 6.15); 0: the BTF exit program takes a thread group
    /// leader's exit as the group's.
    pub exit_group_dead_arg: u32,
    /// `request.__sector` (a u64): the start sector `ethand record` reports for a request.
    pub request_sector: u32,
    /// `task_struct.se.sum_exec_runtime` (a u64): the on-CPU time the kernel has charged a
    /// thread, read at its switch-out.
    pub task_sum_exec_runtime: u32,
    /// 1 when `task_sum_exec_runtime` was found; 0: on-CPU time is measured from switch-in to
    /// switch-out.
    pub oncpu_from_task: u32,
    /// `task_struct.sched_info.run_delay` (a u64, CONFIG_SCHED_INFO): the time the kernel
    /// has seen a thread runnable and waiting for a CPU, read at its switch-out.
    pub task_run_delay: u32,
    /// 1 when `task_run_delay` was found (and `oncpu_from_task`): run-queue waits come from
    /// the kernel and `sched_wakeup` is not attached; 0: waits are timed from `sched_wakeup`.
    pub runq_from_task: u32,
    /// `task_struct.sched_info.last_arrival` (a u64, run-queue clock): when the thread's
    /// current run began, read at its switch-out.
    pub task_last_arrival: u32,
    /// 1 when `task_last_arrival` was found (with `runq_from_task` and `sched_clock_from_rq`,
    /// whose clock it shares): the switch-out does all the accounting, off-CPU time included,
    /// and the switch-in nothing; the running thread's per-CPU context is filled by its first
    /// event instead. 0: the switch-in times off-CPU spans.
    pub offcpu_from_task: u32,
    /// `task_struct.real_parent` (a pointer): the parent a fork and an exit record.
    pub task_real_parent: u32,
}

/// Field offsets of the classic tracepoints used as fallbacks, read from
/// `/sys/kernel/tracing/events/<group>/<event>/format` at start-up. u32::MAX: field absent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointOffsets {
    pub sched_switch_prev_pid: u32,
    pub sched_switch_prev_state: u32,
    pub sched_switch_next_pid: u32,
    pub sched_wakeup_pid: u32,
    pub sys_enter_id: u32,
    pub sys_exit_id: u32,
    pub sys_exit_ret: u32,
    pub blk_start_dev: u32,
    pub blk_start_sector: u32,
    pub blk_start_rwbs: u32,
    pub blk_start_bytes: u32,
    pub blk_issue_dev: u32,
    pub blk_issue_sector: u32,
    pub blk_complete_dev: u32,
    pub blk_complete_sector: u32,
    pub blk_complete_nr_sector: u32,
    pub blk_complete_rwbs: u32,
    pub sock_len_sk: u32,
    pub sock_len_family: u32,
    pub sock_len_protocol: u32,
    pub sock_len_ret: u32,
    pub set_state_sk: u32,
    pub set_state_oldstate: u32,
    pub set_state_newstate: u32,
    pub set_state_protocol: u32,
    pub tcp_retransmit_skaddr: u32,
    pub tcp_send_reset_skaddr: u32,
    pub tcp_receive_reset_skaddr: u32,
    pub exec_pid: u32,
    /// sched_process_exit's group_dead (u8); ABSENT on kernels without it.
    pub exit_group_dead: u32,
}

impl TracepointOffsets {
    pub const ABSENT: u32 = u32::MAX;
}

impl Default for TracepointOffsets {
    fn default() -> Self {
        let a = Self::ABSENT;
        Self {
            sched_switch_prev_pid: a,
            sched_switch_prev_state: a,
            sched_switch_next_pid: a,
            sched_wakeup_pid: a,
            sys_enter_id: a,
            sys_exit_id: a,
            sys_exit_ret: a,
            blk_start_dev: a,
            blk_start_sector: a,
            blk_start_rwbs: a,
            blk_start_bytes: a,
            blk_issue_dev: a,
            blk_issue_sector: a,
            blk_complete_dev: a,
            blk_complete_sector: a,
            blk_complete_nr_sector: a,
            blk_complete_rwbs: a,
            sock_len_sk: a,
            sock_len_family: a,
            sock_len_protocol: a,
            sock_len_ret: a,
            set_state_sk: a,
            set_state_oldstate: a,
            set_state_newstate: a,
            set_state_protocol: a,
            tcp_retransmit_skaddr: a,
            tcp_send_reset_skaddr: a,
            tcp_receive_reset_skaddr: a,
            exec_pid: a,
            exit_group_dead: a,
        }
    }
}

/// log2 bucket of a nanosecond value (see [`HIST_BUCKETS`]). Branch-free enough for BPF.
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    if v < 2 {
        return 0;
    }
    let b = 63 - v.leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// `PROFILE_COUNTS` key: one thread's samples on the CPU, or its long waits off it, at one
/// (user stack, kernel stack) pair of `PROFILE_STACKS` ids. The CPU profile a snapshot takes
/// (ebpf/ethand-ebpf/src/profile.rs); attached only while one is taken.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileKey {
    pub tgid: u32,
    pub tid: u32,
    /// [`PROFILE_NO_STACK`]: none (a sample in the kernel has no user stack only for kernel
    /// threads; a sample in user mode has no kernel stack).
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// [`profile_kind`].
    pub kind: u32,
    pub _pad0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileCount {
    /// On-CPU samples, or waits off the CPU.
    pub count: u64,
    /// Off CPU: the waits' time summed (switch-out to switch-in).
    pub off_ns: u64,
}

/// A profiled thread that blocked (switched out not preempted), keyed by thread id, until
/// it runs again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileOff {
    pub since_ns: u64,
    pub tgid: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad0: u32,
}

/// [`ProfileKey::kind`].
pub mod profile_kind {
    pub const ON_CPU: u32 = 0;
    pub const OFF_CPU: u32 = 1;
}

/// No stack in [`ProfileKey`].
pub const PROFILE_NO_STACK: i32 = -1;

/// Indexes of the `PROFILE_DROPS` per-CPU counters.
pub mod profile_drop {
    /// A stack that could not be stored (`PROFILE_STACKS` slot taken by another stack, or
    /// full): the sample or wait is counted without it.
    pub const STACK_LOST: u32 = 0;
    /// `PROFILE_COUNTS` or `PROFILE_OFF` full: the sample or wait is lost.
    pub const COUNTS_FULL: u32 = 1;
    pub const COUNT: u32 = 2;
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all types are repr(C), integer-only and padding-free (see tests::sizes).
    unsafe impl aya::Pod for ThreadStats {}
    unsafe impl aya::Pod for CpuCtx {}
    unsafe impl aya::Pod for ProcKey {}
    unsafe impl aya::Pod for SyscallKey {}
    unsafe impl aya::Pod for SyscallStats {}
    unsafe impl aya::Pod for SyscallHistKey {}
    unsafe impl aya::Pod for Hist {}
    unsafe impl aya::Pod for BlkReqKey {}
    unsafe impl aya::Pod for BlkReqState {}
    unsafe impl aya::Pod for BlkKey {}
    unsafe impl aya::Pod for BlkStats {}
    unsafe impl aya::Pod for NetStats {}
    unsafe impl aya::Pod for LifecycleEvent {}
    unsafe impl aya::Pod for ProcOrigin {}
    unsafe impl aya::Pod for KernelOffsets {}
    unsafe impl aya::Pod for TracepointOffsets {}
    unsafe impl aya::Pod for GpuOpDesc {}
    unsafe impl aya::Pod for GpuCallKey {}
    unsafe impl aya::Pod for GpuCallStats {}
    unsafe impl aya::Pod for GpuInflightKey {}
    unsafe impl aya::Pod for GpuInflight {}
    unsafe impl aya::Pod for GpuAllocKey {}
    unsafe impl aya::Pod for GpuAlloc {}
    unsafe impl aya::Pod for GpuSiteKey {}
    unsafe impl aya::Pod for GpuSiteStats {}
    unsafe impl aya::Pod for GpuProcState {}
    unsafe impl aya::Pod for RecordEvent {}
    unsafe impl aya::Pod for RecordThread {}
    unsafe impl aya::Pod for RecordBlk {}
    unsafe impl aya::Pod for RecordGpuInflight {}
    unsafe impl aya::Pod for ProfileKey {}
    unsafe impl aya::Pod for ProfileCount {}
    unsafe impl aya::Pod for ProfileOff {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// Sizes are the sum of field sizes: no hidden padding may creep in.
    #[test]
    fn sizes() {
        assert_eq!(size_of::<ThreadStats>(), 8 + 8 * 12 + 8 + 4 * HIST_BUCKETS);
        assert_eq!(size_of::<CpuCtx>(), 72);
        assert_eq!(size_of::<WakeupSlot>(), 16);
        assert!(WAKEUP_SLOTS.is_power_of_two());
        assert_eq!(size_of::<ProcKey>(), 16);
        assert_eq!(size_of::<SyscallKey>(), 16);
        assert_eq!(size_of::<SyscallStats>(), 24);
        assert_eq!(size_of::<SyscallHistKey>(), 16);
        assert_eq!(size_of::<Hist>(), 8 * HIST_BUCKETS);
        assert_eq!(size_of::<BlkReqKey>(), 16);
        assert_eq!(size_of::<BlkReqState>(), 32);
        assert_eq!(size_of::<BlkKey>(), 24);
        assert_eq!(size_of::<BlkStats>(), 32 + 16 * HIST_BUCKETS);
        assert_eq!(size_of::<NetStats>(), 72);
        assert_eq!(size_of::<LifecycleEvent>(), 56);
        assert_eq!(size_of::<ProcOrigin>(), 24);
        assert_eq!(size_of::<KernelOffsets>(), 112);
        assert_eq!(size_of::<TracepointOffsets>(), 30 * 4);
        assert_eq!(size_of::<GpuOpDesc>(), 8);
        assert_eq!(size_of::<GpuCallKey>(), 16);
        assert_eq!(size_of::<GpuCallStats>(), 40);
        assert_eq!(size_of::<GpuInflightKey>(), 8);
        assert_eq!(size_of::<GpuInflight>(), 40);
        assert_eq!(size_of::<GpuAllocKey>(), 16);
        assert_eq!(size_of::<GpuAlloc>(), 16);
        assert_eq!(size_of::<GpuSiteKey>(), 32);
        assert_eq!(size_of::<GpuSiteStats>(), 24);
        assert_eq!(size_of::<GpuProcState>(), 8 * 17 + 16);
        assert_eq!(size_of::<RecordEvent>(), 64);
        assert_eq!(size_of::<RecordThread>(), 40);
        assert_eq!(size_of::<ProfileKey>(), 24);
        assert_eq!(size_of::<ProfileCount>(), 16);
        assert_eq!(size_of::<ProfileOff>(), 24);
        assert_eq!(size_of::<RecordBlk>(), 40);
        assert_eq!(size_of::<RecordGpuInflight>(), 24);
    }

    #[test]
    fn buckets() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(2), 1);
        assert_eq!(log2_bucket(3), 1);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(u64::MAX), HIST_BUCKETS - 1);
    }
}

// ------------------------------------------------------------------ `ethand record`
// Types of the recording programs (ebpf/ethand-ebpf/src/record.rs), attached only while
// `ethand record` runs: one event per scheduler slice, slow syscall, block request and GPU
// runtime call of the recorded process tree, sent through the `RECORD_EVENTS` ring buffer.

/// Size of the `RECORD_EVENTS` ring buffer in bytes (a power of two, a multiple of the page).
pub const RECORD_RINGBUF_BYTES: u32 = 8 << 20;

/// [`RecordEvent::kind`].
pub mod record_kind {
    /// The thread ran on `cpu` from `start_ns` for `dur_ns`.
    pub const ON_CPU: u32 = 1;
    /// The thread was off CPU; `arg0` = [`super::record_off::BLOCKED`] or `PREEMPTED`.
    pub const OFF_CPU: u32 = 2;
    /// A syscall at least as slow as the threshold; `arg0` = nr, `arg1` = return value.
    pub const SYSCALL: u32 = 3;
    /// A block request from creation to completion, charged to its submitter;
    /// `arg0` = dev (kernel encoding), `arg1` = sector, `arg2` = bytes, `arg3` = rwbs
    /// (up to 8 bytes, NUL-padded, little-endian).
    pub const BLOCK: u32 = 4;
    /// A GPU/NPU runtime call; `arg0` = op id (catalog index), `arg1` = the raw value of the
    /// catalog's bytes argument (bytes, element count or size), `arg2` = the raw auxiliary
    /// argument (copy kind, data type, ...), `arg3` = return value.
    pub const GPU: u32 = 5;
    /// A CPU-clock sample of a thread on a CPU at `start_ns`; `arg0` = user and `arg1` =
    /// kernel stack id in `PROFILE_STACKS` (as i64; [`super::PROFILE_NO_STACK`]: none).
    pub const CPU_SAMPLE: u32 = 6;
}

/// Why a thread went off CPU ([`RecordEvent::arg0`] of an `OFF_CPU` event).
pub mod record_off {
    pub const BLOCKED: u64 = 1;
    pub const PREEMPTED: u64 = 2;
}

/// Indexes of the `RECORD_CFG` array (u64 values set by `ethand record` before attaching).
pub mod record_cfg {
    /// Syscalls shorter than this are not recorded.
    pub const SYSCALL_THRESHOLD_NS: u32 = 0;
    pub const COUNT: u32 = 4;
}

/// Indexes of the `RECORD_DROPS` per-CPU counters.
pub mod record_drop {
    /// Ring buffer full: the event was lost.
    pub const RINGBUF_FULL: u32 = 0;
    /// `RECORD_THREADS` full: a thread's slices and syscalls are not recorded.
    pub const THREADS_FULL: u32 = 1;
    /// `RECORD_BLK` or `RECORD_GPU_INFLIGHT` full: a block request or GPU call is lost.
    pub const INFLIGHT_FULL: u32 = 2;
    pub const COUNT: u32 = 4;
}

/// One recorded event. Timestamps: `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordEvent {
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub start_ns: u64,
    pub dur_ns: u64,
    pub arg0: u64,
    pub arg1: u64,
    pub arg2: u64,
    pub arg3: u64,
}

/// Per recorded thread (keyed by tid): where its current scheduler slice and syscall began.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordThread {
    pub tgid: u32,
    /// Why it went off CPU (`record_off`), 0 while on CPU.
    pub off_reason: u32,
    /// Switch-in time, 0 when not known.
    pub on_ns: u64,
    /// Switch-out time, 0 when not known.
    pub off_ns: u64,
    pub sys_start_ns: u64,
    /// [`NO_SYSCALL`] when none is in flight.
    pub sys_nr: u32,
    pub _pad0: u32,
}

/// A block request of a recorded process in flight, keyed by [`BlkReqKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordBlk {
    pub tgid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub rwbs: u64,
    /// BTF programs: the request's start sector when its first part completed, and the
    /// bytes completed so far (a driver may complete a request in parts).
    pub sector: u64,
    pub bytes: u64,
}

/// A GPU call of a recorded thread in flight, keyed by [`GpuInflightKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordGpuInflight {
    pub start_ns: u64,
    pub arg1: u64,
    pub arg2: u64,
}
