//! The CPU profile of one process tree, taken while a snapshot asks for it and detached
//! after (daemon/src/pipeline/cpu_profile.rs): nothing here runs otherwise.
//!
//! - `profile_cpu` (a software CPU-clock perf event on every CPU, `diagnosis.cpu_profile_hz`):
//!   a sample of a thread of the tree counts at its (user stack, kernel stack).
//! - `profile_switch` (tp_btf sched_switch): a thread of the tree that blocks (switched out,
//!   not preempted) leaves its stacks at that moment in `PROFILE_OFF`; when it runs again a
//!   wait of at least `PROFILE_OFFCPU_MIN_NS` counts at those stacks with its time; a
//!   shorter one counts in the thread's `OFF_CPU_SHORT` entry (no stacks), so every wait
//!   is summed and only the long ones are listed by stack.
//!
//! The tree is `PROFILE_PIDS` (tgid -> 1), set by userspace for the profile.
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, perf_event},
    maps::{HashMap, PerCpuArray, StackTrace},
    programs::{BtfTracePointContext, PerfEventContext, tracing::StackIdContext},
};
use ethand_common::{
    PROFILE_NO_STACK, ProfileCount, ProfileKey, ProfileOff, profile_drop, profile_kind,
};

use crate::koff;
use crate::maps::{atomic_add, btf_u32};

/// No preallocation: empty unless a profile is being taken.
const NO_PREALLOC: u32 = 1;
/// -EFAULT from bpf_get_stackid: no stack of that kind here (a sample taken in user mode
/// has no kernel stack), not a loss.
const EFAULT: i32 = -14;

/// Waits shorter than this are summed per thread without stacks (`diagnosis.offcpu_min_us`);
/// set by the loader.
#[unsafe(no_mangle)]
pub static PROFILE_OFFCPU_MIN_NS: u64 = 1_000_000;

#[map]
pub static PROFILE_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(4096, NO_PREALLOC);
/// User and kernel stacks of the samples and waits (sized from `maps.profile_stacks`).
#[map]
pub static PROFILE_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);
#[map]
pub static PROFILE_COUNTS: HashMap<ProfileKey, ProfileCount> =
    HashMap::with_max_entries(16384, NO_PREALLOC);
#[map]
pub static PROFILE_OFF: HashMap<u32, ProfileOff> = HashMap::with_max_entries(16384, NO_PREALLOC);
#[map]
pub static PROFILE_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(profile_drop::COUNT, 0);

#[inline(always)]
fn drop_count(idx: u32) {
    if let Some(c) = PROFILE_DROPS.get_ptr_mut(idx) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn profiled(tgid: u32) -> bool {
    unsafe { PROFILE_PIDS.get(&tgid) }.is_some()
}

/// The id of the current user (`BPF_F_USER_STACK`) or kernel (0) stack in `PROFILE_STACKS`,
/// or [`PROFILE_NO_STACK`].
#[inline(always)]
pub(crate) fn stack<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    match ctx.get_stackid(&PROFILE_STACKS, flags) {
        Ok(id) => id as i32,
        Err(e) => {
            if e != EFAULT {
                drop_count(profile_drop::STACK_LOST);
            }
            PROFILE_NO_STACK
        }
    }
}

#[inline(always)]
fn add(key: &ProfileKey, off_ns: u64) {
    if let Some(c) = PROFILE_COUNTS.get_ptr_mut(key) {
        unsafe {
            atomic_add(&raw mut (*c).count, 1);
            atomic_add(&raw mut (*c).off_ns, off_ns);
        }
        return;
    }
    let v = ProfileCount { count: 1, off_ns };
    // BPF_NOEXIST: a racing insert from another CPU wins; add to its entry instead.
    if PROFILE_COUNTS.insert(key, &v, 1).is_err() {
        match PROFILE_COUNTS.get_ptr_mut(key) {
            Some(c) => unsafe {
                atomic_add(&raw mut (*c).count, 1);
                atomic_add(&raw mut (*c).off_ns, off_ns);
            },
            None => drop_count(profile_drop::COUNTS_FULL),
        }
    }
}

#[perf_event]
pub fn profile_cpu(ctx: PerfEventContext) -> u32 {
    let pt = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pt >> 32) as u32, pt as u32);
    if tid == 0 || !profiled(tgid) {
        return 0;
    }
    let key = ProfileKey {
        tgid,
        tid,
        user_stack: stack(&ctx, u64::from(BPF_F_USER_STACK)),
        kernel_stack: stack(&ctx, 0),
        kind: profile_kind::ON_CPU,
        _pad0: 0,
    };
    add(&key, 0);
    0
}

#[btf_tracepoint(function = "sched_switch")]
pub fn profile_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    let now = unsafe { bpf_ktime_get_ns() };
    // The task switching out is current: its stacks are the ones taken here.
    let pt = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pt >> 32) as u32, pt as u32);
    if tid != 0 && preempt == 0 && (prev_state as u32) != 0 && profiled(tgid) {
        let off = ProfileOff {
            since_ns: now,
            tgid,
            user_stack: stack(&ctx, u64::from(BPF_F_USER_STACK)),
            kernel_stack: stack(&ctx, 0),
            _pad0: 0,
        };
        if PROFILE_OFF.insert(&tid, &off, 0).is_err() {
            drop_count(profile_drop::COUNTS_FULL);
        }
    }
    let next_tid = btf_u32(next, koff!(task_pid));
    if next_tid == 0 {
        return 0;
    }
    let Some(off) = (unsafe { PROFILE_OFF.get(&next_tid) }).copied() else {
        return 0;
    };
    let _ = PROFILE_OFF.remove(&next_tid);
    let waited = now.saturating_sub(off.since_ns);
    let min = unsafe { core::ptr::read_volatile(&raw const PROFILE_OFFCPU_MIN_NS) };
    let key = if waited >= min {
        ProfileKey {
            tgid: off.tgid,
            tid: next_tid,
            user_stack: off.user_stack,
            kernel_stack: off.kernel_stack,
            kind: profile_kind::OFF_CPU,
            _pad0: 0,
        }
    } else {
        ProfileKey {
            tgid: off.tgid,
            tid: next_tid,
            user_stack: PROFILE_NO_STACK,
            kernel_stack: PROFILE_NO_STACK,
            kind: profile_kind::OFF_CPU_SHORT,
            _pad0: 0,
        }
    };
    add(&key, waited);
    0
}
