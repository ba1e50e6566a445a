//! Process lifecycle: exec and exit go to userspace through a ring buffer; they drive metadata
//! refreshes and the reclaiming of map entries. Births send nothing: a new process appears
//! with its first counters, and under churn a fork event would only halve the room for
//! exits. Thread exits only mark the thread's entry so that userspace reads its final
//! counters before deleting it.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{LifecycleEvent, counter, lifecycle_kind, thread_flags};

use crate::maps::{LIFECYCLE, LIFECYCLE_WAKEUP_BYTES, THREADS, bump, current_ctx};
use crate::{koff, tpoff};

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

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec_btf(_ctx: BtfTracePointContext) -> i32 {
    on_exec();
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    on_exec();
    0
}

#[inline(always)]
fn on_exec() {
    if let Some(c) = current_ctx() {
        emit(lifecycle_kind::EXEC, c.tgid, c.proc_start_ns);
    }
}

/// The task is `current` on both kinds of tracepoint.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit_btf(ctx: BtfTracePointContext) -> i32 {
    let group_dead = if koff!(exit_group_dead_arg) != 0 {
        let arg: u64 = ctx.arg(1);
        Some(arg as u8 != 0)
    } else {
        None
    };
    on_exit(group_dead);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let off = tpoff!(exit_group_dead);
    let group_dead =
        (off != u32::MAX as usize).then(|| unsafe { ctx.read_at::<u8>(off) }.unwrap_or(0) != 0);
    on_exit(group_dead);
    0
}

/// `group_dead`: whether the last thread of the process is exiting; None where the kernel
/// does not say (then the leader's exit stands for the group's).
#[inline(always)]
fn on_exit(group_dead: Option<bool>) {
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
    if group_dead.unwrap_or(tid == tgid) {
        if let Some(c) = current_ctx() {
            emit(lifecycle_kind::EXIT, tgid, c.proc_start_ns);
        }
    }
}
