//! Block IO per device and submitting process: ops, bytes, queue time (request created to
//! issued to the driver) and service time (issued to completed). Classic tracepoints: block
//! events are rare enough that their cost does not matter, and their records carry dev/sector.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use ethand_common::{BlkKey, BlkReqKey, BlkReqState, HIST_BUCKETS, blk_op, counter, log2_bucket};

use crate::maps::{
    BLK_INFLIGHT, BLK_STATS, ZERO_BLK_STATS, atomic_add, bump, current_ctx, get_or_insert,
};
use crate::tpoff;

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
    let Some(c) = current_ctx() else { return 0 };
    let rwbs: [u8; 8] = unsafe { ctx.read_at(tpoff!(blk_start_rwbs)) }.unwrap_or([0; 8]);
    let bytes: u32 = unsafe { ctx.read_at(tpoff!(blk_start_bytes)) }.unwrap_or(0);
    // An empty request with the preflush flag ("FWS", 0 bytes) is a cache flush.
    let op = if rwbs[0] == b'F' && bytes == 0 {
        blk_op::FLUSH
    } else {
        op_of(&rwbs)
    };
    let st = BlkReqState {
        tgid: c.tgid,
        op,
        proc_start_ns: c.proc_start_ns,
        start_ns: unsafe { bpf_ktime_get_ns() },
        issue_ns: 0,
    };
    if BLK_INFLIGHT.insert(&key, &st, 0).is_err() {
        bump(counter::BLK_INFLIGHT_FULL);
    }
    0
}

#[tracepoint(category = "block", name = "block_rq_issue")]
pub fn block_issue(ctx: TracePointContext) -> u32 {
    let key = req_key(&ctx, tpoff!(blk_issue_dev), tpoff!(blk_issue_sector));
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(st) = BLK_INFLIGHT.get_ptr_mut(&key) {
        unsafe { (*st).issue_ns = now };
        return 0;
    }
    // Not seen at start (e.g. a flush, or started before attach): charge whoever issues it.
    let Some(c) = current_ctx() else { return 0 };
    let st = BlkReqState {
        tgid: c.tgid,
        op: BlkReqState::OP_UNKNOWN,
        proc_start_ns: c.proc_start_ns,
        start_ns: now,
        issue_ns: now,
    };
    if BLK_INFLIGHT.insert(&key, &st, 0).is_err() {
        bump(counter::BLK_INFLIGHT_FULL);
    }
    0
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_complete(ctx: TracePointContext) -> u32 {
    let key = req_key(&ctx, tpoff!(blk_complete_dev), tpoff!(blk_complete_sector));
    let now = unsafe { bpf_ktime_get_ns() };
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
    let issue = if st.issue_ns != 0 {
        st.issue_ns
    } else {
        st.start_ns
    };
    let queue = issue.saturating_sub(st.start_ns);
    let service = now.saturating_sub(issue);
    let skey = BlkKey {
        dev: key.dev,
        tgid: st.tgid,
        proc_start_ns: st.proc_start_ns,
        op,
        _pad0: 0,
    };
    let Some(s) = get_or_insert(&BLK_STATS, &skey, &ZERO_BLK_STATS, counter::BLK_STATS_FULL) else {
        return 0;
    };
    unsafe {
        atomic_add(&raw mut (*s).ops, 1);
        atomic_add(&raw mut (*s).bytes, nr_sector as u64 * 512);
        atomic_add(&raw mut (*s).queue_ns, queue);
        atomic_add(&raw mut (*s).service_ns, service);
        let qb = log2_bucket(queue) & (HIST_BUCKETS - 1);
        atomic_add((*s).queue_hist.as_mut_ptr().add(qb), 1);
        let sb = log2_bucket(service) & (HIST_BUCKETS - 1);
        atomic_add((*s).service_hist.as_mut_ptr().add(sb), 1);
    }
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
