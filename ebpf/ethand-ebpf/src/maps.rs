//! Maps, read-only globals and the small map helpers every program shares. Below every
//! program file: it names nothing of them.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use ethand_common::{
    BlkKey, BlkReqKey, BlkReqState, BlkStats, CpuCtx, Hist, KernelOffsets, MAX_SYSCALL_NR,
    NetStats, ProcKey, ProcOrigin, SyscallHistKey, SyscallKey, SyscallStats, ThreadStats,
    TracepointOffsets, WAKEUP_SLOTS, WakeupSlot, counter,
};

/// Kernel struct offsets (from BTF); set by the loader.
#[unsafe(no_mangle)]
pub static KOFF: KernelOffsets = KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_group_leader: 0,
    task_start_time: 0,
    skip_syscall_nr: u32::MAX,
    task_se_cfs_rq: 0,
    cfs_rq_rq: 0,
    rq_clock: 0,
    sched_clock_from_rq: 0,
    request_q: 0,
    request_data_len: 0,
    request_cmd_flags: 0,
    request_queue_disk: 0,
    gendisk_major: 0,
    gendisk_first_minor: 0,
    req_preflush: 0,
    blk_btf: 0,
    sock_protocol: 0,
    net_btf: 0,
    exit_group_dead_arg: 0,
    request_sector: 0,
    task_sum_exec_runtime: 0,
    oncpu_from_task: 0,
    task_run_delay: 0,
    runq_from_task: 0,
    task_last_arrival: 0,
    offcpu_from_task: 0,
    task_real_parent: 0,
    task_thread_fsbase: 0,
    py_walk: 0,
};

/// Classic tracepoint field offsets (from tracefs format files); set by the loader.
#[unsafe(no_mangle)]
pub static TPOFF: TracepointOffsets = TracepointOffsets {
    sched_switch_prev_pid: u32::MAX,
    sched_switch_prev_state: u32::MAX,
    sched_switch_next_pid: u32::MAX,
    sched_wakeup_pid: u32::MAX,
    sys_enter_id: u32::MAX,
    sys_exit_id: u32::MAX,
    sys_exit_ret: u32::MAX,
    blk_start_dev: u32::MAX,
    blk_start_sector: u32::MAX,
    blk_start_rwbs: u32::MAX,
    blk_start_bytes: u32::MAX,
    blk_issue_dev: u32::MAX,
    blk_issue_sector: u32::MAX,
    blk_complete_dev: u32::MAX,
    blk_complete_sector: u32::MAX,
    blk_complete_nr_sector: u32::MAX,
    blk_complete_rwbs: u32::MAX,
    sock_len_sk: u32::MAX,
    sock_len_family: u32::MAX,
    sock_len_protocol: u32::MAX,
    sock_len_ret: u32::MAX,
    set_state_sk: u32::MAX,
    set_state_oldstate: u32::MAX,
    set_state_newstate: u32::MAX,
    set_state_protocol: u32::MAX,
    tcp_retransmit_skaddr: u32::MAX,
    tcp_send_reset_skaddr: u32::MAX,
    tcp_receive_reset_skaddr: u32::MAX,
    exec_pid: u32::MAX,
    exit_group_dead: u32::MAX,
};

/// Reads one field of KOFF. Volatile: the value is patched at load time and must not be
/// constant-folded; one field at a time keeps the BPF stack small.
#[macro_export]
macro_rules! koff {
    ($f:ident) => {{
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(&raw const $crate::maps::KOFF.$f) };
        v
    }};
}

/// Reads one field of TPOFF (see `koff!`).
#[macro_export]
macro_rules! tpoff {
    ($f:ident) => {{
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(&raw const $crate::maps::TPOFF.$f) };
        v as usize
    }};
}

/// Loads a u32 field of a BTF-typed kernel pointer (a tp_btf argument) directly: the offset
/// comes from frozen read-only data, so the verifier knows it and checks it against BTF,
/// and no bpf_probe_read call is needed (a NULL pointer reads as 0).
#[inline(always)]
pub fn btf_u32(p: *const u8, off: u32) -> u32 {
    unsafe { core::ptr::read_volatile(p.add(off as usize) as *const u32) }
}

/// Loads a u64 field of a BTF-typed kernel pointer (see [`btf_u32`]).
#[inline(always)]
pub fn btf_u64(p: *const u8, off: u32) -> u64 {
    unsafe { core::ptr::read_volatile(p.add(off as usize) as *const u64) }
}

/// Loads a u16 field of a BTF-typed kernel pointer (see [`btf_u32`]).
#[inline(always)]
pub fn btf_u16(p: *const u8, off: u32) -> u16 {
    unsafe { core::ptr::read_volatile(p.add(off as usize) as *const u16) }
}

/// Loads a pointer field of a BTF-typed kernel pointer (see [`btf_u32`]).
#[inline(always)]
pub fn btf_ptr(p: *const u8, off: u32) -> *const u8 {
    unsafe { core::ptr::read_volatile(p.add(off as usize) as *const *const u8) }
}

/// Zeroed values to insert from: map values too big for the 512-byte BPF stack.
pub static ZERO_BLK_STATS: BlkStats = BlkStats {
    ops: 0,
    bytes: 0,
    queue_ns: 0,
    service_ns: 0,
    queue_hist: [0; ethand_common::HIST_BUCKETS],
    service_hist: [0; ethand_common::HIST_BUCKETS],
};
pub static ZERO_HIST: Hist = Hist {
    buckets: [0; ethand_common::HIST_BUCKETS],
};

#[map]
pub static CPU_CTX: PerCpuArray<CpuCtx> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub static THREADS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(32768, 0);
/// Each thread's latest wakeup, in slot `tid % WAKEUP_SLOTS` (see `WakeupSlot`): the
/// wakeup program's only write, so that it does no hash lookup.
#[map]
pub static WAKEUPS: Array<WakeupSlot> = Array::with_max_entries(WAKEUP_SLOTS, 0);
#[map]
pub static SYSCALLS: HashMap<SyscallKey, SyscallStats> = HashMap::with_max_entries(65536, 0);
/// Distinct syscall numbers per process in SYSCALLS, for its limit (syscall_account.rs); freed
/// with the process's entries.
#[map]
pub static SYSCALL_KEYS: HashMap<ProcKey, u64> = HashMap::with_max_entries(16384, 0);
/// Entry 0: 1 when syscall batching is on (ethand-ebpf/src/syscalls.rs); set by userspace
/// after attaching, only when the scheduler and exit probes that flush batches are attached.
#[map]
pub static SYSCALL_BATCHING: Array<u32> = Array::with_max_entries(1, 0);
/// Syscall number -> histogram class (ethand_common::syscall_class); filled by the loader.
#[map]
pub static SYSCALL_CLASS: Array<u32> = Array::with_max_entries(MAX_SYSCALL_NR, 0);
#[map]
pub static SYSCALL_HIST: HashMap<SyscallHistKey, Hist> = HashMap::with_max_entries(16384, 0);
#[map]
pub static BLK_INFLIGHT: HashMap<BlkReqKey, BlkReqState> = HashMap::with_max_entries(8192, 0);
#[map]
pub static BLK_STATS: HashMap<BlkKey, BlkStats> = HashMap::with_max_entries(4096, 0);
#[map]
pub static NET_STATS: HashMap<ProcKey, NetStats> = HashMap::with_max_entries(16384, 0);
/// TCP socket -> owning process, so that softirq-context events (retransmits) find their owner.
#[map]
pub static SOCK_OWNER: LruHashMap<u64, ProcKey> = LruHashMap::with_max_entries(65536, 0);
/// 512 KiB: 21,000 exits (24 bytes with the header), two seconds of 10,000 exits/s.
#[map]
pub static LIFECYCLE: RingBuf = RingBuf::with_byte_size(LIFECYCLE_BYTES as u32, 0);
/// 16,000 events of 64 bytes (with the ring buffer's header).
const LIFECYCLE_BYTES: u64 = 1024 * 1024;
/// The parent each process was forked by (lifecycle.rs): LRU, so entries of processes whose
/// exit was lost age out.
#[map]
pub static ORIGINS: LruHashMap<u32, ProcOrigin> = LruHashMap::with_max_entries(32768, 0);
/// Pending bytes at which a lifecycle event wakes userspace to drain before its next round:
/// a quarter of the buffer, so a stalled or slow round still has three quarters to go.
pub const LIFECYCLE_WAKEUP_BYTES: u64 = LIFECYCLE_BYTES / 4;
/// Drop and mismatch counters, indexed by ethand_common::counter.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
pub fn bump(idx: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub fn atomic_add(p: *mut u64, v: u64) {
    // The BPF target has no atomic CAS, so core's AtomicU64::fetch_add is unavailable; the
    // intrinsic lowers to BPF's atomic add.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, v,
        )
    };
}

/// Looks `key` up, inserting `init` first when absent. `full` is the counter bumped when the
/// map is full.
#[inline(always)]
pub fn get_or_insert<K, V>(map: &HashMap<K, V>, key: &K, init: &V, full: u32) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    // BPF_NOEXIST: a racing insert from another CPU wins and we use its entry.
    let _ = map.insert(key, init, 1);
    match map.get_ptr_mut(key) {
        Some(p) => Some(p),
        None => {
            bump(full);
            None
        }
    }
}
