//! `ethand record`: a timeline of one process tree. Unlike every other module, these programs
//! send one event per occurrence to userspace (the `RECORD_EVENTS` ring buffer); they are
//! loaded and attached only while `ethand record` runs, so they cost nothing otherwise.
//!
//! The tree is `RECORD_PIDS` (tgid -> 1): seeded by userspace, grown by `record_fork`.
//! Recorded: scheduler slices (on CPU, off CPU blocked / preempted) of every recorded thread,
//! syscalls at least `RECORD_CFG[SYSCALL_THRESHOLD_NS]` long, block requests (creation to
//! completion, charged to the submitter) and GPU/NPU runtime calls (entry to return).
//! One clock: `bpf_ktime_get_ns()`.
use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map, perf_event, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{
        BtfTracePointContext, PerfEventContext, ProbeContext, RetProbeContext, TracePointContext,
    },
};
use ethand_common::{
    BlkReqKey, GpuInflightKey, GpuOpDesc, MAX_SYSCALL_NR, NO_SYSCALL, RECORD_RINGBUF_BYTES,
    RecordBlk, RecordEvent, RecordGpuInflight, RecordThread, blk_op, record_cfg, record_drop,
    record_gpu_arg0, record_kind, record_off,
};

use crate::block::{rq_dev, rq_key, rq_op};
use crate::context::proc_start_of;
use crate::gpu::GPU_OPS;
use crate::maps::{btf_u32, btf_u64};
use crate::python::python_stack;
use crate::{koff, tpoff};

/// No preallocation: the daemon loads this object too, and must not pay for these maps.
const NO_PREALLOC: u32 = 1;

#[map]
pub static RECORD_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(4096, NO_PREALLOC);
#[map]
pub static RECORD_THREADS: HashMap<u32, RecordThread> =
    HashMap::with_max_entries(16384, NO_PREALLOC);
#[map]
pub static RECORD_BLK: HashMap<BlkReqKey, RecordBlk> = HashMap::with_max_entries(4096, NO_PREALLOC);
#[map]
pub static RECORD_GPU_INFLIGHT: HashMap<GpuInflightKey, RecordGpuInflight> =
    HashMap::with_max_entries(16384, NO_PREALLOC);
#[map]
pub static RECORD_EVENTS: RingBuf = RingBuf::with_byte_size(RECORD_RINGBUF_BYTES, 0);
#[map]
pub static RECORD_CFG: Array<u64> = Array::with_max_entries(record_cfg::COUNT, 0);
#[map]
pub static RECORD_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(record_drop::COUNT, 0);

#[inline(always)]
fn drop_count(idx: u32) {
    if let Some(c) = RECORD_DROPS.get_ptr_mut(idx) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn recorded(tgid: u32) -> bool {
    unsafe { RECORD_PIDS.get(&tgid) }.is_some()
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn emit(
    kind: u32,
    tgid: u32,
    tid: u32,
    start_ns: u64,
    dur_ns: u64,
    a0: u64,
    a1: u64,
    a2: u64,
    a3: u64,
) {
    let Some(mut e) = RECORD_EVENTS.reserve::<RecordEvent>(0) else {
        drop_count(record_drop::RINGBUF_FULL);
        return;
    };
    e.write(RecordEvent {
        kind,
        tgid,
        tid,
        cpu: unsafe { bpf_get_smp_processor_id() },
        start_ns,
        dur_ns,
        arg0: a0,
        arg1: a1,
        arg2: a2,
        arg3: a3,
    });
    e.submit(0);
}

/// The entry of a recorded thread: found, or created when its process is recorded. An entry
/// left by an exited thread whose tid now belongs to another process is dropped.
#[inline(always)]
fn thread_entry(tid: u32, tgid: u32) -> Option<*mut RecordThread> {
    if let Some(t) = RECORD_THREADS.get_ptr_mut(&tid) {
        if unsafe { (*t).tgid } == tgid {
            return Some(t);
        }
        if !recorded(tgid) {
            let _ = RECORD_THREADS.remove(&tid);
            return None;
        }
    } else if !recorded(tgid) {
        return None;
    }
    let init = RecordThread {
        tgid,
        off_reason: 0,
        on_ns: 0,
        off_ns: 0,
        sys_start_ns: 0,
        sys_nr: NO_SYSCALL,
        _pad0: 0,
    };
    if RECORD_THREADS.insert(&tid, &init, 0).is_err() {
        drop_count(record_drop::THREADS_FULL);
        return None;
    }
    RECORD_THREADS.get_ptr_mut(&tid)
}

// ------------------------------------------------------------------ scheduler

#[btf_tracepoint(function = "sched_switch")]
pub fn record_sched_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    let now = unsafe { bpf_ktime_get_ns() };
    let prev_tid = btf_u32(prev, koff!(task_pid));
    if let Some(t) = RECORD_THREADS.get_ptr_mut(&prev_tid) {
        let tgid = btf_u32(prev, koff!(task_tgid));
        unsafe {
            if (*t).tgid == tgid {
                if (*t).on_ns != 0 {
                    emit(
                        record_kind::ON_CPU,
                        tgid,
                        prev_tid,
                        (*t).on_ns,
                        now - (*t).on_ns,
                        0,
                        0,
                        0,
                        0,
                    );
                }
                (*t).on_ns = 0;
                (*t).off_ns = now;
                (*t).off_reason = if preempt == 0 && prev_state as u32 != 0 {
                    record_off::BLOCKED as u32
                } else {
                    record_off::PREEMPTED as u32
                };
            }
        }
    }
    let next_tid = btf_u32(next, koff!(task_pid));
    if next_tid == 0 {
        return 0; // idle
    }
    let next_tgid = btf_u32(next, koff!(task_tgid));
    if let Some(t) = thread_entry(next_tid, next_tgid) {
        unsafe {
            if (*t).off_ns != 0 {
                emit(
                    record_kind::OFF_CPU,
                    next_tgid,
                    next_tid,
                    (*t).off_ns,
                    now - (*t).off_ns,
                    (*t).off_reason as u64,
                    0,
                    0,
                    0,
                );
            }
            (*t).off_ns = 0;
            (*t).off_reason = 0;
            (*t).on_ns = now;
        }
    }
    0
}

/// A new process forked by a recorded one is recorded too (threads belong to their tgid).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn record_fork(ctx: BtfTracePointContext) -> i32 {
    let parent: *const u8 = ctx.arg(0);
    let child: *const u8 = ctx.arg(1);
    let pid = btf_u32(child, koff!(task_pid));
    if pid != btf_u32(child, koff!(task_tgid)) {
        return 0;
    }
    if recorded(btf_u32(parent, koff!(task_tgid))) {
        let _ = RECORD_PIDS.insert(&pid, &1, 0);
    }
    0
}

// ------------------------------------------------------------------ syscalls

#[btf_tracepoint(function = "sys_enter")]
pub fn record_sys_enter(ctx: BtfTracePointContext) -> i32 {
    let id: i64 = ctx.arg(1);
    if id < 0 || id >= MAX_SYSCALL_NR as i64 || id as u32 == koff!(skip_syscall_nr) {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if let Some(t) = thread_entry(pid_tgid as u32, (pid_tgid >> 32) as u32) {
        unsafe {
            (*t).sys_nr = id as u32;
            (*t).sys_start_ns = bpf_ktime_get_ns();
        }
    }
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn record_sys_exit(ctx: BtfTracePointContext) -> i32 {
    let ret: i64 = ctx.arg(1);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(t) = RECORD_THREADS.get_ptr_mut(&tid) else {
        return 0;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let tgid = (pid_tgid >> 32) as u32;
    unsafe {
        if (*t).tgid != tgid || (*t).sys_nr == NO_SYSCALL {
            return 0;
        }
        let nr = (*t).sys_nr;
        (*t).sys_nr = NO_SYSCALL;
        let dur = now.saturating_sub((*t).sys_start_ns);
        let threshold = match RECORD_CFG.get(record_cfg::SYSCALL_THRESHOLD_NS) {
            Some(v) => *v,
            None => 0,
        };
        if dur >= threshold {
            emit(
                record_kind::SYSCALL,
                tgid,
                tid,
                (*t).sys_start_ns,
                dur,
                nr as u64,
                ret as u64,
                0,
                0,
            );
        }
    }
    0
}

// ------------------------------------------------------------------ block IO

#[inline(always)]
fn blk_key(ctx: &TracePointContext, dev_off: usize, sector_off: usize) -> BlkReqKey {
    let dev: u32 = unsafe { ctx.read_at(dev_off) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(sector_off) }.unwrap_or(0);
    BlkReqKey {
        dev,
        _pad0: 0,
        sector,
    }
}

#[tracepoint(category = "block", name = "block_io_start")]
pub fn record_blk_start(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !recorded(tgid) {
        return 0;
    }
    let key = blk_key(&ctx, tpoff!(blk_start_dev), tpoff!(blk_start_sector));
    let rwbs: [u8; 8] = unsafe { ctx.read_at(tpoff!(blk_start_rwbs)) }.unwrap_or([0; 8]);
    let v = RecordBlk {
        tgid,
        tid: pid_tgid as u32,
        start_ns: unsafe { bpf_ktime_get_ns() },
        rwbs: u64::from_le_bytes(rwbs),
        sector: key.sector,
        bytes: 0,
    };
    if RECORD_BLK.insert(&key, &v, 0).is_err() {
        drop_count(record_drop::INFLIGHT_FULL);
    }
    0
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn record_blk_complete(ctx: TracePointContext) -> u32 {
    let key = blk_key(&ctx, tpoff!(blk_complete_dev), tpoff!(blk_complete_sector));
    let Some(st) = (unsafe { RECORD_BLK.get(&key) }).copied() else {
        return 0;
    };
    let nr_sector: u32 = unsafe { ctx.read_at(tpoff!(blk_complete_nr_sector)) }.unwrap_or(0);
    end_block(&key, &st, key.dev, key.sector, nr_sector as u64 * 512);
    0
}

/// A recorded request is done: forget it and emit its slice (start to now).
#[inline(always)]
fn end_block(key: &BlkReqKey, st: &RecordBlk, dev: u32, sector: u64, bytes: u64) {
    let _ = RECORD_BLK.remove(key);
    let now = unsafe { bpf_ktime_get_ns() };
    emit(
        record_kind::BLOCK,
        st.tgid,
        st.tid,
        st.start_ns,
        now.saturating_sub(st.start_ns),
        dev as u64,
        sector,
        bytes,
        st.rwbs,
    );
}

/// The BTF programs key a request by its address, as the block accounting does
/// (`block.rs`): a bio merged in front of it, which moves its start sector, cannot lose it.
/// The op is given as the classic tracepoints' rwbs letter.
#[btf_tracepoint(function = "block_io_start")]
pub fn record_blk_start_btf(ctx: BtfTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !recorded(tgid) {
        return 0;
    }
    let rq: *const u8 = ctx.arg(0);
    let letter = match rq_op(rq) {
        blk_op::READ => b'R',
        blk_op::WRITE => b'W',
        blk_op::DISCARD => b'D',
        blk_op::FLUSH => b'F',
        _ => b'N',
    };
    let v = RecordBlk {
        tgid,
        tid: pid_tgid as u32,
        start_ns: unsafe { bpf_ktime_get_ns() },
        rwbs: letter as u64,
        sector: 0,
        bytes: 0,
    };
    if RECORD_BLK.insert(&rq_key(rq), &v, 0).is_err() {
        drop_count(record_drop::INFLIGHT_FULL);
    }
    0
}

/// Fires per completed part, before the request's size is reduced by `nr_bytes`: the slice
/// ends with the part that reaches its size and carries the bytes of all its parts.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn record_blk_complete_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    let nr_bytes: u32 = ctx.arg(2);
    let key = rq_key(rq);
    let Some(st) = RECORD_BLK.get_ptr_mut(&key) else {
        return 0;
    };
    let st = unsafe { &mut *st };
    if st.bytes == 0 {
        st.sector = btf_u64(rq, koff!(request_sector));
    }
    st.bytes += nr_bytes as u64;
    if nr_bytes < btf_u32(rq, koff!(request_data_len)) {
        return 0;
    }
    let st = *st;
    end_block(&key, &st, rq_dev(rq), st.sector, st.bytes);
    0
}

// ------------------------------------------------------------------ GPU/NPU runtime calls

/// The six integer argument registers, read with constant offsets first (the verifier
/// refuses a context access at a computed offset), then one picked.
#[inline(always)]
fn reg(ctx: &ProbeContext, i: u8) -> u64 {
    let r = ctx.regs;
    let a: [u64; 6] = unsafe {
        [
            core::ptr::read_volatile(&raw const (*r).rdi),
            core::ptr::read_volatile(&raw const (*r).rsi),
            core::ptr::read_volatile(&raw const (*r).rdx),
            core::ptr::read_volatile(&raw const (*r).rcx),
            core::ptr::read_volatile(&raw const (*r).r8),
            core::ptr::read_volatile(&raw const (*r).r9),
        ]
    };
    match i {
        0 => a[0],
        1 => a[1],
        2 => a[2],
        3 => a[3],
        4 => a[4],
        5 => a[5],
        _ => 0,
    }
}

fn gpu_enter(ctx: &ProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !recorded((pid_tgid >> 32) as u32) {
        return None;
    }
    let op = (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } & 0xffff) as u32;
    let d: GpuOpDesc = *GPU_OPS.get(op)?;
    let tgid = (pid_tgid >> 32) as u32;
    // Walked before the clock is read: the call's slice does not include the walk.
    let proc_start_ns = proc_start_of(unsafe { bpf_get_current_task() } as *const u8);
    let py_stack = python_stack(tgid, proc_start_ns);
    let v = RecordGpuInflight {
        start_ns: unsafe { bpf_ktime_get_ns() },
        arg1: reg(ctx, d.bytes_arg),
        arg2: reg(ctx, d.aux_arg),
        py_stack,
    };
    let k = GpuInflightKey {
        tid: pid_tgid as u32,
        op,
    };
    if RECORD_GPU_INFLIGHT.insert(&k, &v, 0).is_err() {
        drop_count(record_drop::INFLIGHT_FULL);
    }
    Some(())
}

fn gpu_return(ctx: &RetProbeContext) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let op = (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } & 0xffff) as u32;
    let k = GpuInflightKey {
        tid: pid_tgid as u32,
        op,
    };
    let v: RecordGpuInflight = unsafe { *RECORD_GPU_INFLIGHT.get(&k)? };
    let _ = RECORD_GPU_INFLIGHT.remove(&k);
    let rc: u64 = ctx.ret();
    emit(
        record_kind::GPU,
        (pid_tgid >> 32) as u32,
        pid_tgid as u32,
        v.start_ns,
        now.saturating_sub(v.start_ns),
        record_gpu_arg0(op, rc),
        v.arg1,
        v.arg2,
        v.py_stack,
    );
    Some(())
}

#[uprobe]
pub fn record_gpu_enter(ctx: ProbeContext) -> u32 {
    let _ = gpu_enter(&ctx);
    0
}

#[uretprobe]
pub fn record_gpu_return(ctx: RetProbeContext) -> u32 {
    let _ = gpu_return(&ctx);
    0
}

#[uprobe(multi)]
pub fn record_gpu_enter_multi(ctx: ProbeContext) -> u32 {
    let _ = gpu_enter(&ctx);
    0
}

#[uretprobe(multi)]
pub fn record_gpu_return_multi(ctx: RetProbeContext) -> u32 {
    let _ = gpu_return(&ctx);
    0
}

/// A CPU-clock sample (a perf event on every CPU at `ethand record --cpu-sample-hz`) of a
/// recorded thread: its time and its user and kernel stacks (`PROFILE_STACKS`).
#[perf_event]
pub fn record_cpu_sample(ctx: PerfEventContext) -> u32 {
    let pt = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pt >> 32) as u32, pt as u32);
    if tid == 0 || !recorded(tgid) {
        return 0;
    }
    let user = crate::profile::stack(&ctx, u64::from(BPF_F_USER_STACK));
    let kernel = crate::profile::stack(&ctx, 0);
    emit(
        record_kind::CPU_SAMPLE,
        tgid,
        tid,
        unsafe { bpf_ktime_get_ns() },
        0,
        i64::from(user) as u64,
        i64::from(kernel) as u64,
        0,
        0,
    );
    0
}
