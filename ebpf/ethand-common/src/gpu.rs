//! GPU/NPU runtime uprobes: the op descriptions userspace fills, and the per-call, per-site,
//! per-allocation and per-process state of the programs.

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
    /// The call's Python stack (see [`GpuSiteKey::py_stack`]).
    pub py_stack: u64,
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
    /// The calling thread's Python frames (`PY_STACKS` key, see [`PyStack`](crate::PyStack));
    /// 0: not a walked Python process, or no Python frame on the thread.
    pub py_stack: u64,
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

/// Per process ([`ProcKey`](crate::ProcKey)): memory live and peak by kind, and the
/// communicator rank.
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
