//! Syscalls per process: count, errors and time per syscall number, and latency histograms
//! for the blocking classes. Enter and exit touch only the per-CPU context (the in-flight
//! syscall rides with the thread across CPUs through the scheduler programs); exit does one
//! hash lookup per syscall, plus one for the blocking classes.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{
    HIST_BUCKETS, MAX_SYSCALL_NR, NO_SYSCALL, SyscallHistKey, SyscallKey, SyscallStats, counter,
    log2_bucket,
};

use crate::maps::{
    SYSCALL_CLASS, SYSCALL_HIST, SYSCALLS, ZERO_HIST, atomic_add, bump, current_ctx, get_or_insert,
};
use crate::{koff, tpoff};

#[btf_tracepoint(function = "sys_enter")]
pub fn sys_enter_btf(ctx: BtfTracePointContext) -> i32 {
    let id: i64 = ctx.arg(1);
    on_enter(id);
    0
}

#[tracepoint(category = "raw_syscalls", name = "sys_enter")]
pub fn sys_enter_tp(ctx: TracePointContext) -> u32 {
    let id: i64 = unsafe { ctx.read_at(tpoff!(sys_enter_id)) }.unwrap_or(-1);
    on_enter(id);
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit_btf(ctx: BtfTracePointContext) -> i32 {
    // The syscall number comes from the entry (CPU_CTX): entry and exit of one thread always
    // pair, so reading it again from pt_regs would only cost a probe_read.
    let ret: i64 = ctx.arg(1);
    on_exit(None, ret);
    0
}

#[tracepoint(category = "raw_syscalls", name = "sys_exit")]
pub fn sys_exit_tp(ctx: TracePointContext) -> u32 {
    let nr: i64 = unsafe { ctx.read_at(tpoff!(sys_exit_id)) }.unwrap_or(-1);
    let ret: i64 = unsafe { ctx.read_at(tpoff!(sys_exit_ret)) }.unwrap_or(0);
    on_exit(Some(nr), ret);
    0
}

#[inline(always)]
fn on_enter(id: i64) {
    if id < 0 || id >= MAX_SYSCALL_NR as i64 || id as u32 == koff!(skip_syscall_nr) {
        return;
    }
    let Some(ctx) = current_ctx() else { return };
    ctx.sys_nr = id as u32;
    ctx.sys_start_ns = unsafe { bpf_ktime_get_ns() };
}

#[inline(always)]
fn on_exit(nr: Option<i64>, ret: i64) {
    // nr -1: not a real syscall return (the uretprobe trampoline, whose entry was skipped).
    if nr.is_some_and(|nr| nr < 0 || nr >= MAX_SYSCALL_NR as i64) {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(ctx) = current_ctx() else { return };
    if ctx.sys_nr == NO_SYSCALL || nr.is_some_and(|nr| ctx.sys_nr != nr as u32) {
        // Entered before ethand attached, or a skipped entry (uretprobe trampoline).
        bump(counter::SYSCALL_EXIT_UNMATCHED);
        return;
    }
    let nr = ctx.sys_nr as i64;
    ctx.sys_nr = NO_SYSCALL;
    let dur = now.saturating_sub(ctx.sys_start_ns);
    let key = SyscallKey {
        tgid: ctx.tgid,
        nr: nr as u32,
        proc_start_ns: ctx.proc_start_ns,
    };
    if let Some(s) = get_or_insert(
        &SYSCALLS,
        &key,
        &SyscallStats::default(),
        counter::SYSCALLS_FULL,
    ) {
        unsafe {
            atomic_add(&raw mut (*s).count, 1);
            atomic_add(&raw mut (*s).time_ns, dur);
            if (-4095..0).contains(&ret) {
                atomic_add(&raw mut (*s).errors, 1);
            }
        }
    }
    let class = match SYSCALL_CLASS.get(nr as u32) {
        Some(c) => *c,
        None => 0,
    };
    if class == 0 {
        return;
    }
    let hkey = SyscallHistKey {
        tgid: ctx.tgid,
        class,
        proc_start_ns: ctx.proc_start_ns,
    };
    if let Some(h) = get_or_insert(&SYSCALL_HIST, &hkey, &ZERO_HIST, counter::SYSCALL_HIST_FULL) {
        let b = log2_bucket(dur) & (HIST_BUCKETS - 1);
        unsafe { atomic_add((*h).buckets.as_mut_ptr().add(b), 1) };
    }
}
