//! Process lifecycle: exec and exit go to userspace through a ring buffer; they drive metadata
//! refreshes and the reclaiming of map entries, and carry what /proc no longer tells of a
//! process that has exited (parent, cgroup, user, name), so that one living between two
//! collection rounds still reaches its tree and its cgroup. A fork sends nothing (under churn
//! a fork event would halve the room for exits): it records the parent in `ORIGINS`, which the
//! exit reads. Thread exits only mark the thread's entry so that userspace reads its final
//! counters before deleting it.
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_uid_gid, bpf_probe_read_kernel, generated::bpf_get_current_cgroup_id,
    },
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{LifecycleEvent, ProcOrigin, counter, lifecycle_kind, thread_flags};

use crate::context::{current_ctx, proc_start_of};
use crate::maps::{LIFECYCLE, LIFECYCLE_WAKEUP_BYTES, ORIGINS, THREADS, btf_u32, bump};
use crate::syscall_account::flush_pending_syscalls;
use crate::{koff, tpoff};

/// The real parent of `task` as (tgid, start time); (0, 0) when it cannot be read.
#[inline(always)]
fn parent_of(task: *const u8) -> (u32, u64) {
    let off = koff!(task_real_parent);
    if off == 0 || task.is_null() {
        return (0, 0);
    }
    let parent: *const u8 =
        match unsafe { bpf_probe_read_kernel(task.add(off as usize) as *const *const u8) } {
            Ok(p) if !p.is_null() => p,
            _ => return (0, 0),
        };
    let tgid =
        unsafe { bpf_probe_read_kernel(parent.add(koff!(task_tgid) as usize) as *const u32) }
            .unwrap_or(0);
    (tgid, proc_start_of(parent))
}

#[inline(always)]
fn emit(kind: u32, tgid: u32, proc_start_ns: u64) {
    // The parent that forked it; a process forked before ethand attached has none recorded.
    let (parent_tgid, parent_start_ns) = match unsafe { ORIGINS.get(&tgid) } {
        Some(o) if o.proc_start_ns == proc_start_ns => (o.parent_tgid, o.parent_start_ns),
        _ => parent_of(unsafe { bpf_get_current_task() } as *const u8),
    };
    if kind == lifecycle_kind::EXIT {
        let _ = ORIGINS.remove(&tgid);
    }
    let Some(mut e) = LIFECYCLE.reserve::<LifecycleEvent>(0) else {
        bump(counter::LIFECYCLE_RINGBUF_FULL);
        return;
    };
    e.write(LifecycleEvent {
        kind,
        tgid,
        proc_start_ns,
        parent_tgid,
        uid: bpf_get_current_uid_gid() as u32,
        parent_start_ns,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
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

/// `btf_trace_sched_process_fork(void *ctx, struct task_struct *parent, struct task_struct
/// *child)`. No classic fallback: its fields are pids only (the exit then records the parent
/// of the moment).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork_btf(ctx: BtfTracePointContext) -> i32 {
    let child: *const u8 = ctx.arg(1);
    let tgid = btf_u32(child, koff!(task_tgid));
    // A new thread is not a new process.
    if btf_u32(child, koff!(task_pid)) != tgid {
        return 0;
    }
    let (parent_tgid, parent_start_ns) = parent_of(child);
    let o = ProcOrigin {
        proc_start_ns: proc_start_of(child),
        parent_tgid,
        _pad0: 0,
        parent_start_ns,
    };
    // LRU: a full map drops the oldest entry, a process whose exit was lost.
    let _ = ORIGINS.insert(&tgid, &o, 0);
    0
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
        flush_pending_syscalls(c);
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
