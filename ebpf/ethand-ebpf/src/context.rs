//! The per-CPU context (`CPU_CTX`): which thread is running and its process, cached by its
//! first event after a switch so that its later events need no lookup. A change of thread
//! first flushes the syscall batch the context carries (syscall_account.rs).
use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel};
use ethand_common::{CpuCtx, NO_SYSCALL, ProcKey};

use crate::koff;
use crate::maps::{CPU_CTX, THREADS};
use crate::syscall_account::flush_pending_syscalls;

/// Thread id stored in CPU_CTX when the running thread is not known yet.
pub const UNKNOWN_TID: u32 = u32::MAX;

/// Start time of the thread group leader of `task`: the process half of [`ProcKey`].
#[inline(always)]
pub fn proc_start_of(task: *const u8) -> u64 {
    unsafe {
        let leader: *const u8 = match bpf_probe_read_kernel(
            task.add(koff!(task_group_leader) as usize) as *const *const u8,
        ) {
            Ok(p) => p,
            Err(_) => return 0,
        };
        bpf_probe_read_kernel(leader.add(koff!(task_start_time) as usize) as *const u64)
            .unwrap_or(0)
    }
}

/// The per-CPU context of the current thread; refreshed when it does not describe `current`
/// (threads that have not been switched in since ethand attached).
#[inline(always)]
pub fn current_ctx() -> Option<&'static mut CpuCtx> {
    let ctx = unsafe { &mut *CPU_CTX.get_ptr_mut(0)? };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if ctx.tid != tid {
        flush_pending_syscalls(ctx);
        ctx.tid = tid;
        ctx.tgid = (pid_tgid >> 32) as u32;
        ctx.sys_nr = NO_SYSCALL;
        ctx.sys_start_ns = 0;
        // The thread's first event since it was switched in (where the switch-in does not
        // fill the context, or was never reported): it may be returning from a syscall it
        // was switched out in, carried in its entry, as is its process's start time.
        let mut proc_start_ns = 0;
        if let Some(t) = THREADS.get_ptr_mut(&tid) {
            let t = unsafe { &mut *t };
            ctx.sys_nr = t.sys_nr;
            ctx.sys_start_ns = t.sys_start_ns;
            t.sys_nr = NO_SYSCALL;
            // An entry of an earlier process with this tid is not trusted for it.
            if t.tgid == ctx.tgid {
                proc_start_ns = t.proc_start_ns;
            }
        }
        if proc_start_ns == 0 {
            proc_start_ns = proc_start_of(unsafe { bpf_get_current_task() } as *const u8);
        }
        ctx.proc_start_ns = proc_start_ns;
    }
    Some(ctx)
}

#[inline(always)]
pub fn proc_key(ctx: &CpuCtx) -> ProcKey {
    ProcKey {
        tgid: ctx.tgid,
        _pad0: 0,
        proc_start_ns: ctx.proc_start_ns,
    }
}
