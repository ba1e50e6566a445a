//! Adding syscalls to SYSCALLS and SYSCALL_HIST: one call, or the batch pending in the per-CPU
//! context (see syscalls.rs). Apart from the syscall programs because the context flushes a
//! batch whenever it changes threads (context.rs), as the scheduler and exit programs do.
use ethand_common::{
    CpuCtx, HIST_BUCKETS, ProcKey, SYSCALL_NR_OVER_LIMIT, SyscallHistKey, SyscallKey, SyscallStats,
    counter,
};

use crate::maps::{
    SYSCALL_HIST, SYSCALL_KEYS, SYSCALLS, ZERO_HIST, atomic_add, bump, get_or_insert,
};

/// Distinct syscall numbers one process may have in SYSCALLS
/// (`maps.syscall_numbers_per_process`); set by the loader. Its calls of further numbers are
/// counted under [`SYSCALL_NR_OVER_LIMIT`]: one process cannot fill the map for the others.
#[unsafe(no_mangle)]
pub static SYSCALL_NUMBERS_PER_PROCESS: u64 = 128;

/// Adds the context's pending batch (see the module comment) to SYSCALLS. Called before
/// anything changes which thread the context describes.
#[inline(always)]
pub fn flush_pending_syscalls(ctx: &mut CpuCtx) {
    if ctx.pend_count == 0 {
        return;
    }
    add_syscalls(
        ctx,
        ctx.pend_nr,
        ctx.pend_count,
        ctx.pend_time_ns,
        ctx.pend_errors,
    );
    ctx.pend_count = 0;
    flush_pending_hist(ctx);
}

#[inline(always)]
pub fn flush_pending_hist(ctx: &mut CpuCtx) {
    if ctx.pend_hist_count == 0 {
        return;
    }
    add_hist(
        ctx,
        ctx.pend_hist_class,
        ctx.pend_hist_bucket,
        ctx.pend_hist_count,
    );
    ctx.pend_hist_count = 0;
}

#[inline(always)]
pub fn add_hist(ctx: &CpuCtx, class: u32, bucket: u32, count: u32) {
    let hkey = SyscallHistKey {
        tgid: ctx.tgid,
        class,
        proc_start_ns: ctx.proc_start_ns,
    };
    if let Some(h) = get_or_insert(&SYSCALL_HIST, &hkey, &ZERO_HIST, counter::SYSCALL_HIST_FULL) {
        let b = bucket as usize & (HIST_BUCKETS - 1);
        unsafe { atomic_add((*h).buckets.as_mut_ptr().add(b), u64::from(count)) };
    }
}

#[inline(always)]
pub fn add_syscalls(ctx: &CpuCtx, nr: u32, count: u32, time_ns: u64, errors: u32) {
    let mut key = SyscallKey {
        tgid: ctx.tgid,
        nr,
        proc_start_ns: ctx.proc_start_ns,
    };
    let s = match SYSCALLS.get_ptr_mut(&key) {
        Some(s) => Some(s),
        // A number new to this process: within its share of the map, or under the one key
        // of its numbers beyond it. Only new numbers pay this lookup.
        None => {
            let pk = ProcKey {
                tgid: ctx.tgid,
                _pad0: 0,
                proc_start_ns: ctx.proc_start_ns,
            };
            let limit = unsafe { core::ptr::read_volatile(&raw const SYSCALL_NUMBERS_PER_PROCESS) };
            match get_or_insert(&SYSCALL_KEYS, &pk, &0u64, counter::SYSCALL_KEYS_FULL) {
                Some(n) if unsafe { *n } >= limit => {
                    bump(counter::SYSCALLS_OVER_LIMIT);
                    key.nr = SYSCALL_NR_OVER_LIMIT;
                }
                Some(n) => atomic_add(n, 1),
                None => {}
            }
            get_or_insert(
                &SYSCALLS,
                &key,
                &SyscallStats::default(),
                counter::SYSCALLS_FULL,
            )
        }
    };
    if let Some(s) = s {
        unsafe {
            atomic_add(&raw mut (*s).count, u64::from(count));
            atomic_add(&raw mut (*s).time_ns, time_ns);
            if errors != 0 {
                atomic_add(&raw mut (*s).errors, u64::from(errors));
            }
        }
    }
}
