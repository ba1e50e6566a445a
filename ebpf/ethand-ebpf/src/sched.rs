//! Scheduler accounting per thread: on-CPU, off-CPU (blocked / preempted), switches and
//! run-queue wait. `tp_btf` programs are preferred (near-free on this kernel); the classic
//! tracepoint programs are the fallback, reading fields at offsets from tracefs.
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{
    HIST_BUCKETS, NO_SYSCALL, ThreadStats, WAKEUP_SLOTS, counter, log2_bucket, thread_flags,
};

use crate::context::{UNKNOWN_TID, proc_start_of};
use crate::maps::{CPU_CTX, THREADS, WAKEUPS, btf_ptr, btf_u32, btf_u64, bump};
use crate::syscall_account::flush_pending_syscalls;
use crate::{koff, tpoff};

/// "Now" for the scheduler programs. With BTF, the clock of `task`'s run queue
/// (`task->se.cfs_rq->rq->clock`), which the scheduler has just updated: three loads instead
/// of a `bpf_ktime_get_ns()` call, which costs ~90 ns in a VM. The classic programs have no
/// task pointer and read the monotonic clock; the loader picks one clock for all of them
/// (`sched_clock_from_rq`), so timestamps are never mixed. 0: no clock (skip timing).
#[inline(always)]
fn sched_now(task: Option<*const u8>) -> u64 {
    match task {
        Some(task) if koff!(sched_clock_from_rq) != 0 => {
            let cfs_rq = btf_ptr(task, koff!(task_se_cfs_rq));
            if cfs_rq.is_null() {
                return 0;
            }
            let rq = btf_ptr(cfs_rq, koff!(cfs_rq_rq));
            if rq.is_null() {
                return 0;
            }
            unsafe { core::ptr::read_volatile(rq.add(koff!(rq_clock) as usize) as *const u64) }
        }
        None if koff!(sched_clock_from_rq) != 0 => {
            // Classic tracepoints: the same chain from `current` (on this CPU's run queue).
            let task = unsafe { bpf_get_current_task() } as *const u8;
            let read_ptr = |p: *const u8, off: u32| unsafe {
                bpf_probe_read_kernel(p.add(off as usize) as *const *const u8)
                    .unwrap_or(core::ptr::null())
            };
            let cfs_rq = read_ptr(task, koff!(task_se_cfs_rq));
            if cfs_rq.is_null() {
                return 0;
            }
            let rq = read_ptr(cfs_rq, koff!(cfs_rq_rq));
            if rq.is_null() {
                return 0;
            }
            unsafe { bpf_probe_read_kernel(rq.add(koff!(rq_clock) as usize) as *const u64) }
                .unwrap_or(0)
        }
        _ => unsafe { bpf_ktime_get_ns() },
    }
}

/// What the kernel has charged the thread being switched out: on-CPU time
/// (`se.sum_exec_runtime`), run-queue wait (`sched_info.run_delay`) and when this run began
/// (`sched_info.last_arrival`), each 0 where not read (`oncpu_from_task`, `runq_from_task`,
/// `offcpu_from_task`). The scheduler brought them up to date before the tracepoint;
/// run_delay includes the wait that ended with this run.
#[derive(Clone, Copy)]
struct Charges {
    exec_ns: u64,
    run_delay_ns: u64,
    arrival_ns: u64,
}

/// [`Charges`] of `prev` (BTF), or of `current` (classic tracepoints: `current` is prev).
#[inline(always)]
fn charges(prev: Option<*const u8>) -> Charges {
    let mut c = Charges {
        exec_ns: 0,
        run_delay_ns: 0,
        arrival_ns: 0,
    };
    if koff!(oncpu_from_task) == 0 {
        return c;
    }
    let runq = koff!(runq_from_task) != 0;
    let offcpu = koff!(offcpu_from_task) != 0;
    match prev {
        Some(p) => {
            c.exec_ns = btf_u64(p, koff!(task_sum_exec_runtime));
            if runq {
                c.run_delay_ns = btf_u64(p, koff!(task_run_delay));
            }
            if offcpu {
                c.arrival_ns = btf_u64(p, koff!(task_last_arrival));
            }
        }
        None => {
            let task = unsafe { bpf_get_current_task() } as *const u8;
            let read = |off: u32| {
                unsafe { bpf_probe_read_kernel(task.add(off as usize) as *const u64) }.unwrap_or(0)
            };
            c.exec_ns = read(koff!(task_sum_exec_runtime));
            if runq {
                c.run_delay_ns = read(koff!(task_run_delay));
            }
            if offcpu {
                c.arrival_ns = read(koff!(task_last_arrival));
            }
        }
    }
    c
}

/// TASK_REPORT_MAX: the classic tracepoint's prev_state for a preempted task.
const TASK_REPORT_MAX: u32 = 0x100;

#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_btf(ctx: BtfTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    let next_tid = btf_u32(next, koff!(task_pid));
    // Voluntary: the task blocked (non-running state) and was not preempted.
    on_switch(
        next_tid,
        preempt == 0 && (prev_state as u32) != 0,
        sched_now(Some(next)),
        charges(Some(prev)),
    );
    0
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch_tp(ctx: TracePointContext) -> u32 {
    let next_tid: i32 = unsafe { ctx.read_at(tpoff!(sched_switch_next_pid)) }.unwrap_or(0);
    let state: i64 = unsafe { ctx.read_at(tpoff!(sched_switch_prev_state)) }.unwrap_or(0);
    let state = state as u32;
    on_switch(
        next_tid as u32,
        state != 0 && state & TASK_REPORT_MAX == 0,
        sched_now(None),
        charges(None),
    );
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    on_wakeup(btf_u32(p, koff!(task_pid)), Some(p));
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup_tp(ctx: TracePointContext) -> u32 {
    let pid: i32 = unsafe { ctx.read_at(tpoff!(sched_wakeup_pid)) }.unwrap_or(0);
    on_wakeup(pid as u32, None);
    0
}

/// A new task becomes runnable for the first time: start its thread entry so that its first
/// run-queue wait is measured.
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new_btf(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    let tid = btf_u32(p, koff!(task_pid));
    let now = sched_now(Some(p));
    if now == 0 {
        return 0;
    }
    let t = ThreadStats {
        tgid: btf_u32(p, koff!(task_tgid)),
        flags: thread_flags::BLOCKED,
        proc_start_ns: proc_start_of(p),
        switch_out_ns: now,
        sys_nr: NO_SYSCALL,
        ..ThreadStats::default()
    };
    if THREADS.insert(&tid, &t, 0).is_err() {
        bump(counter::THREADS_FULL);
    }
    // Read at the first switch-in only when waits are timed from wakeups.
    if koff!(runq_from_task) == 0 {
        record_wakeup(tid, now);
    }
    0
}

#[inline(always)]
fn on_wakeup(tid: u32, task: Option<*const u8>) {
    record_wakeup(tid, sched_now(task));
}

/// The WAKEUPS slot of `tid`: tids equal modulo the slot count share one.
#[inline(always)]
fn wakeup_slot(tid: u32) -> u32 {
    tid & (WAKEUP_SLOTS - 1)
}

/// Every wakeup is recorded, also of a thread that is still running (woken before it got to
/// block): the switch-in only takes a wakeup from after the thread's switch-out.
#[inline(always)]
fn record_wakeup(tid: u32, now: u64) {
    if let Some(s) = WAKEUPS.get_ptr_mut(wakeup_slot(tid)) {
        unsafe {
            (*s).wakeup_ns = now;
            (*s).tid = tid;
        }
    }
}

/// When `tid` was woken after `since` (its switch-out), from its WAKEUPS slot. A slot holding
/// a later wakeup of another thread means this one's was overwritten: counted as lost.
#[inline(always)]
fn woken_since(tid: u32, since: u64) -> Option<u64> {
    let s = WAKEUPS.get(wakeup_slot(tid))?;
    let (slot_tid, wakeup_ns) = unsafe {
        (
            core::ptr::read_volatile(&s.tid),
            core::ptr::read_volatile(&s.wakeup_ns),
        )
    };
    if wakeup_ns < since {
        return None;
    }
    if slot_tid != tid {
        bump(counter::WAKEUP_SLOT_TAKEN);
        return None;
    }
    Some(wakeup_ns)
}

/// The core of the switch accounting. `prev` is always `current`; `prev_charges` what the
/// kernel has charged it.
#[inline(always)]
fn on_switch(next_tid: u32, voluntary: bool, now: u64, prev_charges: Charges) {
    let prev_exec = prev_charges.exec_ns;
    let Some(cpu) = CPU_CTX.get_ptr_mut(0) else {
        return;
    };
    let cpu = unsafe { &mut *cpu };
    // prev's batched syscalls: the context is about to describe another thread.
    flush_pending_syscalls(cpu);
    let pid_tgid = bpf_get_current_pid_tgid();
    let prev_tid = pid_tgid as u32;

    // The switch-out does all the accounting (see KernelOffsets::offcpu_from_task).
    let out_only = koff!(offcpu_from_task) != 0;
    if prev_tid != 0 {
        let mut unseen = false;
        let mut created = false;
        let t = match THREADS.get_ptr_mut(&prev_tid) {
            Some(t) => {
                // Some kernels deliver no tracepoints in the context of some tasks (this
                // sandbox's agent): the switch to this thread came from one of them.
                if !out_only && unsafe { (*t).switch_in_ns } == 0 {
                    bump(counter::SWITCH_IN_UNSEEN);
                    unseen = true;
                }
                Some(t)
            }
            None => {
                let init = ThreadStats {
                    tgid: (pid_tgid >> 32) as u32,
                    proc_start_ns: if cpu.tid == prev_tid {
                        cpu.proc_start_ns
                    } else {
                        proc_start_of(unsafe { bpf_get_current_task() } as *const u8)
                    },
                    sys_nr: NO_SYSCALL,
                    // Counted from here: the thread was running when ethand attached.
                    exec_runtime_ns: prev_exec,
                    run_delay_ns: prev_charges.run_delay_ns,
                    ..ThreadStats::default()
                };
                created = true;
                let _ = THREADS.insert(&prev_tid, &init, 1);
                let t = THREADS.get_ptr_mut(&prev_tid);
                if t.is_none() {
                    bump(counter::THREADS_FULL);
                }
                t
            }
        };
        if let Some(t) = t {
            let t = unsafe { &mut *t };
            if out_only && !created {
                // Off CPU from the last switch-out to this run's start, split by how that
                // span began. Both are run-queue clock readings (the arrival possibly on
                // another CPU's); a span not after the last switch-out is not counted.
                let arrival = prev_charges.arrival_ns;
                if t.switch_out_ns != 0 && arrival > t.switch_out_ns {
                    let off = arrival - t.switch_out_ns;
                    if t.flags & thread_flags::BLOCKED != 0 {
                        t.offcpu_blocked_ns += off;
                    } else {
                        t.offcpu_preempted_ns += off;
                    }
                }
            }
            if koff!(runq_from_task) != 0 {
                // The kernel's wait before this run: exact, one per run, also when the
                // switch-in was not reported. Lower after tid reuse: a new baseline.
                let rd = prev_charges.run_delay_ns;
                if !created && rd >= t.run_delay_ns {
                    add_wait(t, rd - t.run_delay_ns);
                }
                t.run_delay_ns = rd;
            } else if unseen && koff!(oncpu_from_task) != 0 {
                // The unreported switch-in was this run's on-CPU time before now: account
                // the wait that ended there as the switch-in would have (off by the IRQ
                // time of the run, which the kernel does not charge to the thread).
                let run = prev_exec.saturating_sub(t.exec_runtime_ns);
                if run != 0 && now > run {
                    account_switch_in(t, prev_tid, now - run);
                }
            }
            if koff!(oncpu_from_task) != 0 {
                // The kernel's own charge: exact, and complete even when this run's
                // switch-in was not reported. Lower after tid reuse: a new baseline.
                if prev_exec > t.exec_runtime_ns {
                    t.oncpu_ns += prev_exec - t.exec_runtime_ns;
                }
                t.exec_runtime_ns = prev_exec;
            } else if t.switch_in_ns != 0 && now > t.switch_in_ns {
                t.oncpu_ns += now - t.switch_in_ns;
            }
            t.switch_in_ns = 0;
            t.switch_out_ns = now;
            if voluntary {
                t.flags |= thread_flags::BLOCKED;
                t.voluntary_switches += 1;
            } else {
                t.flags &= !thread_flags::BLOCKED;
                t.involuntary_switches += 1;
            }
            // Carry an in-flight syscall with the thread (it may resume on another CPU). A
            // context describing another thread means no event in this run: the entry still
            // holds what was in flight (a reported switch-in moved it to the context).
            if cpu.tid == prev_tid {
                t.sys_nr = cpu.sys_nr;
                t.sys_start_ns = cpu.sys_start_ns;
            }
        }
    }

    cpu.tid = UNKNOWN_TID;
    cpu.running_tid = next_tid;
    // With out_only, next's first event fills the context from its entry (current_ctx).
    if next_tid == 0 || out_only {
        return;
    }
    let Some(t) = THREADS.get_ptr_mut(&next_tid) else {
        return;
    };
    let t = unsafe { &mut *t };
    account_switch_in(t, next_tid, now);
    t.switch_in_ns = now;
    cpu.tid = next_tid;
    cpu.tgid = t.tgid;
    cpu.proc_start_ns = t.proc_start_ns;
    cpu.sys_nr = t.sys_nr;
    cpu.sys_start_ns = t.sys_start_ns;
    t.sys_nr = NO_SYSCALL;
}

/// Off-CPU time and run-queue wait of thread `tid` going on CPU at `now`.
#[inline(always)]
fn account_switch_in(t: &mut ThreadStats, tid: u32, now: u64) {
    if t.switch_out_ns == 0 || now <= t.switch_out_ns {
        return;
    }
    let off = now - t.switch_out_ns;
    // With runq_from_task the wait is the kernel's, taken at the switch-out.
    let timed = koff!(runq_from_task) == 0;
    let wait = if t.flags & thread_flags::BLOCKED != 0 {
        t.offcpu_blocked_ns += off;
        if timed {
            match woken_since(tid, t.switch_out_ns) {
                Some(w) if now >= w => Some(now - w),
                _ => None,
            }
        } else {
            None
        }
    } else {
        t.offcpu_preempted_ns += off;
        timed.then_some(off)
    };
    if let Some(wait) = wait {
        add_wait(t, wait);
    }
}

/// One run-queue wait: its total and its histogram bucket.
#[inline(always)]
fn add_wait(t: &mut ThreadStats, wait: u64) {
    t.runq_wait_ns += wait;
    let b = log2_bucket(wait) & (HIST_BUCKETS - 1);
    unsafe {
        *t.runq_wait_hist.get_unchecked_mut(b) = t.runq_wait_hist.get_unchecked(b).wrapping_add(1)
    };
}
