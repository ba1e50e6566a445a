//! Block I/O: requests in flight and counters per (device, process, op).
use crate::HIST_BUCKETS;

/// Block operation kinds in [`BlkKey::op`].
pub mod blk_op {
    pub const READ: u32 = 0;
    pub const WRITE: u32 = 1;
    pub const FLUSH: u32 = 2;
    pub const DISCARD: u32 = 3;
    pub const OTHER: u32 = 4;
    pub const NAMES: [&str; 5] = ["read", "write", "flush", "discard", "other"];
}

impl BlkReqState {
    pub const OP_UNKNOWN: u32 = u32::MAX;
}

/// An in-flight block request. The BTF programs key it by the address of its `struct
/// request` (`dev` = [`BlkReqKey::BY_ADDRESS`]), which no merge changes; the classic
/// tracepoints carry no address and key it by (dev, start sector).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlkReqKey {
    pub dev: u32,
    pub _pad0: u32,
    /// The start sector, or the request's address.
    pub sector: u64,
}

impl BlkReqKey {
    pub const BY_ADDRESS: u32 = u32::MAX;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkReqState {
    pub tgid: u32,
    /// blk_op decided when the request was created (the flush flag is gone by completion);
    /// [`BlkReqState::OP_UNKNOWN`] when the start was not seen.
    pub op: u32,
    pub proc_start_ns: u64,
    /// When the submitter created the request (block_io_start / block_rq_insert).
    pub start_ns: u64,
    /// When the driver was handed the request (block_rq_issue).
    pub issue_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlkKey {
    /// Kernel dev_t as the block tracepoints report it (MAJOR << 20 | MINOR).
    pub dev: u32,
    pub tgid: u32,
    pub proc_start_ns: u64,
    pub op: u32,
    pub _pad0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlkStats {
    pub ops: u64,
    pub bytes: u64,
    pub queue_ns: u64,
    pub service_ns: u64,
    pub queue_hist: [u64; HIST_BUCKETS],
    pub service_hist: [u64; HIST_BUCKETS],
}

impl Default for BlkStats {
    fn default() -> Self {
        Self {
            ops: 0,
            bytes: 0,
            queue_ns: 0,
            service_ns: 0,
            queue_hist: [0; HIST_BUCKETS],
            service_hist: [0; HIST_BUCKETS],
        }
    }
}
