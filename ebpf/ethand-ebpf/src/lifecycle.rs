//! Process lifecycle: fork (new processes only), exec and exit go to userspace through a ring
//! buffer; they drive discovery and the reclaiming of map entries. Thread exits only mark the
//! thread's entry so that userspace reads its final counters before deleting it.
use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{LifecycleEvent, counter, lifecycle_kind, thread_flags};

use crate::maps::{LIFECYCLE, THREADS, bump, current_ctx, proc_start_of, read_u32};
use crate::{koff, tpoff};

#[inline(always)]
fn emit(kind: u32, tgid: u32, ppid: u32, proc_start_ns: u64) {
    let Some(mut e) = LIFECYCLE.reserve::<LifecycleEvent>(0) else {
        bump(counter::LIFECYCLE_RINGBUF_FULL);
        return;
    };
    e.write(LifecycleEvent {
        kind,
        tgid,
        ppid,
        _pad0: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        proc_start_ns,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    e.submit(0);
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let parent: *const u8 = ctx.arg(0);
    let child: *const u8 = ctx.arg(1);
    let pid = read_u32(child, koff!(task_pid));
    if pid != read_u32(child, koff!(task_tgid)) {
        return 0; // a new thread, not a new process
    }
    emit(
        lifecycle_kind::FORK,
        pid,
        read_u32(parent, koff!(task_tgid)),
        proc_start_of(child),
    );
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    if let Some(c) = current_ctx() {
        emit(lifecycle_kind::EXEC, c.tgid, 0, c.proc_start_ns);
    }
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(t) = THREADS.get_ptr_mut(&tid) {
        unsafe { (*t).flags |= thread_flags::EXITED };
    }
    let off = tpoff!(exit_group_dead);
    let group_dead = if off != u32::MAX as usize {
        unsafe { ctx.read_at::<u8>(off) }.unwrap_or(0) != 0
    } else {
        tid == tgid
    };
    if group_dead {
        if let Some(c) = current_ctx() {
            emit(lifecycle_kind::EXIT, tgid, 0, c.proc_start_ns);
        }
    }
    0
}
