//! Process lifecycle: exec and exit go to userspace through a ring buffer; they drive metadata
//! refreshes and the reclaiming of map entries. Births send nothing: a new process appears
//! with its first counters, and under churn a fork event would only halve the room for
//! exits. Thread exits only mark the thread's entry so that userspace reads its final
//! counters before deleting it.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_current_pid_tgid,
    macros::tracepoint,
    programs::TracePointContext,
};
use ethand_common::{LifecycleEvent, counter, lifecycle_kind, thread_flags};

use crate::maps::{LIFECYCLE, LIFECYCLE_WAKEUP_BYTES, THREADS, bump, current_ctx};
use crate::tpoff;

#[inline(always)]
fn emit(kind: u32, tgid: u32, proc_start_ns: u64) {
    let Some(mut e) = LIFECYCLE.reserve::<LifecycleEvent>(0) else {
        bump(counter::LIFECYCLE_RINGBUF_FULL);
        return;
    };
    e.write(LifecycleEvent {
        kind,
        tgid,
        proc_start_ns,
    });
    // Userspace drains at every collection round; it is woken in between only when a burst
    // of exits has filled a quarter of the buffer. Waking it per event (the default) would
    // cost a wakeup per exit, and a fixed drain timer costs an idle daemon ten wakeups a second.
    let flags = if LIFECYCLE.query(BPF_RB_AVAIL_DATA as u64) >= LIFECYCLE_WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    e.submit(flags as u64);
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    if let Some(c) = current_ctx() {
        emit(lifecycle_kind::EXEC, c.tgid, c.proc_start_ns);
    }
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    // The exiting thread's batched syscalls, before the exit event makes userspace read its
    // process's final counters.
    if let Some(c) = current_ctx() {
        crate::syscalls::flush_pending_syscalls(c);
    }
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
            emit(lifecycle_kind::EXIT, tgid, c.proc_start_ns);
        }
    }
    0
}
