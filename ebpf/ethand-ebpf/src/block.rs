//! Block IO per device and submitting process: ops, bytes, queue time (request created to
//! issued to the driver) and service time (issued to completed).
//!
//! Two implementations of the same three probes; the loader picks one for all three. The
//! `tp_btf` programs (preferred) key a request in flight by the address of its `struct
//! request`: a merge that moves the request's start sector (a bio merged in front of it)
//! cannot lose it, and an entry left by a request that never completes (merged into
//! another) is overwritten when the kernel reuses the struct, so it cannot fill the map.
//! The classic tracepoints carry no address and key by (dev, start sector): the fallback.
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use ethand_common::{BlkKey, BlkReqKey, BlkReqState, HIST_BUCKETS, blk_op, counter, log2_bucket};

use crate::context::current_ctx;
use crate::maps::{
    BLK_INFLIGHT, BLK_STATS, ZERO_BLK_STATS, atomic_add, btf_ptr, btf_u32, bump, get_or_insert,
};
use crate::{koff, tpoff};

/// The request was created by the thread running now: remember who and when.
#[inline(always)]
fn on_start(key: &BlkReqKey, op: u32) {
    let Some(c) = current_ctx() else { return };
    let st = BlkReqState {
        tgid: c.tgid,
        op,
        proc_start_ns: c.proc_start_ns,
        start_ns: unsafe { bpf_ktime_get_ns() },
        issue_ns: 0,
    };
    if BLK_INFLIGHT.insert(key, &st, 0).is_err() {
        bump(counter::BLK_INFLIGHT_FULL);
    }
}

/// Handed to the driver. A request not seen at start (a flush, or one started before
/// attach) is charged to whoever issues it, with the op `op()` reads (only then: the issue
/// of a request seen at start reads nothing).
#[inline(always)]
fn on_issue(key: &BlkReqKey, op: impl Fn() -> u32) {
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(st) = BLK_INFLIGHT.get_ptr_mut(key) {
        unsafe { (*st).issue_ns = now };
        return;
    }
    let Some(c) = current_ctx() else { return };
    let st = BlkReqState {
        tgid: c.tgid,
        op: op(),
        proc_start_ns: c.proc_start_ns,
        start_ns: now,
        issue_ns: now,
    };
    if BLK_INFLIGHT.insert(key, &st, 0).is_err() {
        bump(counter::BLK_INFLIGHT_FULL);
    }
}

/// Adds `bytes` completed on `dev` to the request's process; `last` (the request is done):
/// also the op and its queue and service times.
#[inline(always)]
fn account(dev: u32, st: &BlkReqState, op: u32, bytes: u64, last: bool) {
    let now = unsafe { bpf_ktime_get_ns() };
    let skey = BlkKey {
        dev,
        tgid: st.tgid,
        proc_start_ns: st.proc_start_ns,
        op,
        _pad0: 0,
    };
    let Some(s) = get_or_insert(&BLK_STATS, &skey, &ZERO_BLK_STATS, counter::BLK_STATS_FULL) else {
        return;
    };
    unsafe { atomic_add(&raw mut (*s).bytes, bytes) };
    if !last {
        return;
    }
    let issue = if st.issue_ns != 0 {
        st.issue_ns
    } else {
        st.start_ns
    };
    let queue = issue.saturating_sub(st.start_ns);
    let service = now.saturating_sub(issue);
    unsafe {
        atomic_add(&raw mut (*s).ops, 1);
        atomic_add(&raw mut (*s).queue_ns, queue);
        atomic_add(&raw mut (*s).service_ns, service);
        let qb = log2_bucket(queue) & (HIST_BUCKETS - 1);
        atomic_add((*s).queue_hist.as_mut_ptr().add(qb), 1);
        let sb = log2_bucket(service) & (HIST_BUCKETS - 1);
        atomic_add((*s).service_hist.as_mut_ptr().add(sb), 1);
    }
}

// ---- tp_btf: requests keyed by address ----

#[inline(always)]
pub(crate) fn rq_key(rq: *const u8) -> BlkReqKey {
    BlkReqKey {
        dev: BlkReqKey::BY_ADDRESS,
        _pad0: 0,
        sector: rq as u64,
    }
}

/// The dev_t the block tracepoints report: MKDEV(disk->major, disk->first_minor).
#[inline(always)]
pub(crate) fn rq_dev(rq: *const u8) -> u32 {
    let q = btf_ptr(rq, koff!(request_q));
    let disk = btf_ptr(q, koff!(request_queue_disk));
    (btf_u32(disk, koff!(gendisk_major)) << 20) | btf_u32(disk, koff!(gendisk_first_minor))
}

/// The op as the tracepoints' rwbs string gives it (see [`op_of`]): an empty request with
/// the preflush flag is a cache flush.
#[inline(always)]
pub(crate) fn rq_op(rq: *const u8) -> u32 {
    // REQ_OP_* values are kernel ABI (include/linux/blk_types.h).
    const REQ_OP_MASK: u32 = 0xff;
    const REQ_OP_READ: u32 = 0;
    const REQ_OP_WRITE: u32 = 1;
    const REQ_OP_FLUSH: u32 = 2;
    const REQ_OP_DISCARD: u32 = 3;
    const REQ_OP_SECURE_ERASE: u32 = 5;
    let flags = btf_u32(rq, koff!(request_cmd_flags));
    let preflush = flags & koff!(req_preflush) != 0;
    if preflush && btf_u32(rq, koff!(request_data_len)) == 0 {
        return blk_op::FLUSH;
    }
    match flags & REQ_OP_MASK {
        REQ_OP_READ => blk_op::READ,
        REQ_OP_WRITE => blk_op::WRITE,
        REQ_OP_DISCARD | REQ_OP_SECURE_ERASE => blk_op::DISCARD,
        REQ_OP_FLUSH => blk_op::FLUSH,
        _ if preflush => blk_op::FLUSH,
        _ => blk_op::OTHER,
    }
}

#[btf_tracepoint(function = "block_io_start")]
pub fn block_start_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    on_start(&rq_key(rq), rq_op(rq));
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_issue_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    on_issue(&rq_key(rq), || rq_op(rq));
    0
}

/// `block_rq_complete(rq, error, nr_bytes)` fires before the request's size is reduced by
/// `nr_bytes`: a driver that completes a request in parts leaves it in flight until the
/// part that reaches its size.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_complete_btf(ctx: BtfTracePointContext) -> i32 {
    let rq: *const u8 = ctx.arg(0);
    let nr_bytes: u32 = ctx.arg(2);
    let key = rq_key(rq);
    let Some(st) = BLK_INFLIGHT.get_ptr_mut(&key) else {
        bump(counter::BLK_COMPLETE_UNMATCHED);
        return 0;
    };
    let st = unsafe { *st };
    let last = nr_bytes >= btf_u32(rq, koff!(request_data_len));
    if last {
        let _ = BLK_INFLIGHT.remove(&key);
    }
    account(rq_dev(rq), &st, st.op, nr_bytes as u64, last);
    0
}

// ---- classic tracepoints: requests keyed by (dev, start sector) ----

#[inline(always)]
fn req_key(ctx: &TracePointContext, dev_off: usize, sector_off: usize) -> BlkReqKey {
    let dev: u32 = unsafe { ctx.read_at(dev_off) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(sector_off) }.unwrap_or(0);
    BlkReqKey {
        dev,
        _pad0: 0,
        sector,
    }
}

/// The submitter creates the request (block_io_start; block_rq_insert on older kernels).
#[tracepoint(category = "block", name = "block_io_start")]
pub fn block_start(ctx: TracePointContext) -> u32 {
    let key = req_key(&ctx, tpoff!(blk_start_dev), tpoff!(blk_start_sector));
    let rwbs: [u8; 8] = unsafe { ctx.read_at(tpoff!(blk_start_rwbs)) }.unwrap_or([0; 8]);
    let bytes: u32 = unsafe { ctx.read_at(tpoff!(blk_start_bytes)) }.unwrap_or(0);
    // An empty request with the preflush flag ("FWS", 0 bytes) is a cache flush.
    let op = if rwbs[0] == b'F' && bytes == 0 {
        blk_op::FLUSH
    } else {
        op_of(&rwbs)
    };
    on_start(&key, op);
    0
}

#[tracepoint(category = "block", name = "block_rq_issue")]
pub fn block_issue(ctx: TracePointContext) -> u32 {
    let key = req_key(&ctx, tpoff!(blk_issue_dev), tpoff!(blk_issue_sector));
    on_issue(&key, || BlkReqState::OP_UNKNOWN);
    0
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_complete(ctx: TracePointContext) -> u32 {
    let key = req_key(&ctx, tpoff!(blk_complete_dev), tpoff!(blk_complete_sector));
    let Some(st) = BLK_INFLIGHT.get_ptr_mut(&key) else {
        bump(counter::BLK_COMPLETE_UNMATCHED);
        return 0;
    };
    let st = unsafe { *st };
    let _ = BLK_INFLIGHT.remove(&key);
    let nr_sector: u32 = unsafe { ctx.read_at(tpoff!(blk_complete_nr_sector)) }.unwrap_or(0);
    // The op as the submitter made it: by completion a flush's flag is gone (it completes
    // as an empty write).
    let op = if st.op != BlkReqState::OP_UNKNOWN {
        st.op
    } else {
        let rwbs: [u8; 8] = unsafe { ctx.read_at(tpoff!(blk_complete_rwbs)) }.unwrap_or([0; 8]);
        op_of(&rwbs)
    };
    account(key.dev, &st, op, nr_sector as u64 * 512, true);
    0
}

/// Decodes the tracepoint's rwbs string ("WS", "R", "FWS", "D", "FN", ...).
#[inline(always)]
fn op_of(rwbs: &[u8; 8]) -> u32 {
    let mut flush = false;
    let mut i = 0;
    while i < 8 {
        match rwbs[i] {
            b'D' => return blk_op::DISCARD,
            b'W' => return blk_op::WRITE,
            b'R' => return blk_op::READ,
            b'F' => flush = true,
            0 => break,
            _ => {}
        }
        i += 1;
    }
    if flush { blk_op::FLUSH } else { blk_op::OTHER }
}
