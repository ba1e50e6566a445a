//! Types of the recording programs (ebpf/ethand-ebpf/src/record.rs), attached only while
//! `ethand record` runs: one event per scheduler slice, slow syscall, block request and GPU
//! runtime call of the recorded process tree, sent through the `RECORD_EVENTS` ring buffer.

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
    /// A GPU/NPU runtime call; `arg0` = op id (catalog index) in the low 32 bits and the
    /// return value (an int) in the high 32, `arg1` = the raw value of the catalog's bytes
    /// argument (bytes, element count or size), `arg2` = the raw auxiliary argument (copy
    /// kind, data type, ...), `arg3` = the calling thread's Python stack (the hash of
    /// [`PyStackKey`](crate::PyStackKey), 0: none walked).
    pub const GPU: u32 = 5;
    /// A CPU-clock sample of a thread on a CPU at `start_ns`; `arg0` = user and `arg1` =
    /// kernel stack id in `PROFILE_STACKS` (as i64; [`crate::PROFILE_NO_STACK`]: none).
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
    /// [`NO_SYSCALL`](crate::NO_SYSCALL) when none is in flight.
    pub sys_nr: u32,
    pub _pad0: u32,
}

/// A block request of a recorded process in flight, keyed by [`BlkReqKey`](crate::BlkReqKey).
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

/// A GPU call of a recorded thread in flight, keyed by [`GpuInflightKey`](crate::GpuInflightKey).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordGpuInflight {
    pub start_ns: u64,
    pub arg1: u64,
    pub arg2: u64,
    /// The Python stack walked at the entry (0: none).
    pub py_stack: u64,
}

/// `arg0` of a [`record_kind::GPU`] event: the op and the call's return value.
#[inline(always)]
pub fn record_gpu_arg0(op: u32, ret: u64) -> u64 {
    u64::from(op) | (ret << 32)
}

/// The op and the return value of a [`record_kind::GPU`] event's `arg0`.
#[inline(always)]
pub fn record_gpu_op_ret(arg0: u64) -> (u64, i32) {
    (arg0 & 0xffff_ffff, (arg0 >> 32) as u32 as i32)
}
