//! Syscalls per process: count, errors and time per syscall number, and latency histograms
//! for the blocking classes. Enter and exit touch only the per-CPU context (the in-flight
//! syscall rides with the thread across CPUs through the scheduler programs); exit does one
//! hash lookup per syscall, plus one for the blocking classes.
//!
//! Syscall batching (on when the scheduler and exit probes are attached): calls of one
//! syscall in a row by one thread (a `sched_yield` spin, a `read` loop) are summed in the
//! per-CPU context and added to SYSCALLS in one update, so a repeated call costs no hash
//! lookup and no atomics. The sum is flushed when the thread makes another syscall, is
//! switched out or exits, and after [`BATCH_MAX_CALLS`] calls or [`BATCH_MAX_AGE_NS`]: a
//! thread that keeps running shows its latest run of one syscall at most 10 ms late.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{
    HIST_BUCKETS, MAX_SYSCALL_NR, NO_SYSCALL, SYSCALL_NR_UNIMPLEMENTED, counter, log2_bucket,
};

use crate::context::current_ctx;
use crate::maps::{SYSCALL_BATCHING, SYSCALL_CLASS, bump};
use crate::syscall_account::{add_hist, add_syscalls, flush_pending_hist, flush_pending_syscalls};

/// ENOSYS as a syscall's return value.
const ENOSYS: i64 = -38;

/// Flush a batch after this many calls...
const BATCH_MAX_CALLS: u32 = 4096;
/// ...or once its first call is this old (checked at each call; a thread that stops making
/// syscalls flushes at its next switch-out).
const BATCH_MAX_AGE_NS: u64 = 10_000_000;
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

/// The number a syscall is accounted under: numbers the table cannot hold share one key.
#[inline(always)]
fn key_nr(id: i64) -> u32 {
    if id >= MAX_SYSCALL_NR as i64 {
        SYSCALL_NR_UNIMPLEMENTED
    } else {
        id as u32
    }
}

#[inline(always)]
fn on_enter(id: i64) {
    if id < 0 || id as u32 == koff!(skip_syscall_nr) {
        return;
    }
    let Some(ctx) = current_ctx() else { return };
    ctx.sys_nr = key_nr(id);
    ctx.sys_start_ns = unsafe { bpf_ktime_get_ns() };
}

#[inline(always)]
fn on_exit(nr: Option<i64>, ret: i64) {
    // nr -1: not a real syscall return (the uretprobe trampoline, whose entry was skipped).
    if nr.is_some_and(|nr| nr < 0) {
        return;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(ctx) = current_ctx() else { return };
    if ctx.sys_nr == NO_SYSCALL || nr.is_some_and(|nr| ctx.sys_nr != key_nr(nr)) {
        // Entered before ethand attached, or a skipped entry (uretprobe trampoline).
        bump(counter::SYSCALL_EXIT_UNMATCHED);
        return;
    }
    // Whatever number the kernel does not implement is counted under one key.
    let nr = if ret == ENOSYS {
        SYSCALL_NR_UNIMPLEMENTED as i64
    } else {
        ctx.sys_nr as i64
    };
    ctx.sys_nr = NO_SYSCALL;
    let dur = now.saturating_sub(ctx.sys_start_ns);
    let error = u32::from((-4095..0).contains(&ret));
    let class = match SYSCALL_CLASS.get(nr as u32) {
        Some(c) => *c,
        None => 0,
    };
    let bucket = (log2_bucket(dur) & (HIST_BUCKETS - 1)) as u32;
    if SYSCALL_BATCHING.get(0).is_some_and(|on| *on != 0) {
        if ctx.pend_count != 0 && ctx.pend_nr == nr as u32 {
            ctx.pend_count += 1;
            ctx.pend_time_ns += dur;
            ctx.pend_errors += error;
            // Calls of a run often take alike: their latency bucket is batched too, until
            // one lands in another bucket.
            if class != 0 {
                if ctx.pend_hist_count != 0 && ctx.pend_hist_bucket == bucket {
                    ctx.pend_hist_count += 1;
                } else {
                    flush_pending_hist(ctx);
                    ctx.pend_hist_class = class;
                    ctx.pend_hist_bucket = bucket;
                    ctx.pend_hist_count = 1;
                }
            }
            if ctx.pend_count >= BATCH_MAX_CALLS
                || now.wrapping_sub(ctx.pend_since_ns) >= BATCH_MAX_AGE_NS
            {
                flush_pending_syscalls(ctx);
            }
        } else {
            flush_pending_syscalls(ctx);
            ctx.pend_nr = nr as u32;
            ctx.pend_count = 1;
            ctx.pend_time_ns = dur;
            ctx.pend_errors = error;
            ctx.pend_since_ns = now;
            if class != 0 {
                ctx.pend_hist_class = class;
                ctx.pend_hist_bucket = bucket;
                ctx.pend_hist_count = 1;
            }
        }
    } else {
        add_syscalls(ctx, nr as u32, 1, dur, error);
        if class != 0 {
            add_hist(ctx, class, bucket, 1);
        }
    }
}
