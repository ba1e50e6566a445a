//! The kernel/user contract of ethand: every type stored in a BPF map or sent through the
//! ring buffer, and the constants both sides agree on.
//!
//! Invariants: every struct is `#[repr(C)]`, has no implicit padding (explicit `_pad` fields,
//! fields ordered by size) and contains only integers, so that `aya::Pod` is sound and the
//! layout is identical in the BPF object and in userspace. `tests::sizes` pins the sizes.
#![no_std]

mod block;
pub mod counter;
mod gpu;
mod hist;
mod lifecycle;
mod net;
mod offsets;
#[cfg(feature = "user")]
mod pod;
mod profile;
mod record;
mod sched;
mod syscalls;

// One flat namespace, as before the split: `ethand_common::ThreadStats`,
// `ethand_common::gpu_kind::COPY`, ...
pub use block::*;
pub use gpu::*;
pub use hist::*;
pub use lifecycle::*;
pub use net::*;
pub use offsets::*;
pub use profile::*;
pub use record::*;
pub use sched::*;
pub use syscalls::*;

/// Process identity: tgid plus the leader's start time (pid reuse never merges two processes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcKey {
    pub tgid: u32,
    pub _pad0: u32,
    pub proc_start_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// Sizes are the sum of field sizes: no hidden padding may creep in.
    #[test]
    fn sizes() {
        assert_eq!(size_of::<ThreadStats>(), 8 + 8 * 12 + 8 + 4 * HIST_BUCKETS);
        assert_eq!(size_of::<CpuCtx>(), 72);
        assert_eq!(size_of::<WakeupSlot>(), 16);
        assert!(WAKEUP_SLOTS.is_power_of_two());
        assert_eq!(size_of::<ProcKey>(), 16);
        assert_eq!(size_of::<SyscallKey>(), 16);
        assert_eq!(size_of::<SyscallStats>(), 24);
        assert_eq!(size_of::<SyscallHistKey>(), 16);
        assert_eq!(size_of::<Hist>(), 8 * HIST_BUCKETS);
        assert_eq!(size_of::<BlkReqKey>(), 16);
        assert_eq!(size_of::<BlkReqState>(), 32);
        assert_eq!(size_of::<BlkKey>(), 24);
        assert_eq!(size_of::<BlkStats>(), 32 + 16 * HIST_BUCKETS);
        assert_eq!(size_of::<NetStats>(), 72);
        assert_eq!(size_of::<LifecycleEvent>(), 56);
        assert_eq!(size_of::<ProcOrigin>(), 24);
        assert_eq!(size_of::<KernelOffsets>(), 112);
        assert_eq!(size_of::<TracepointOffsets>(), 30 * 4);
        assert_eq!(size_of::<GpuOpDesc>(), 8);
        assert_eq!(size_of::<GpuCallKey>(), 16);
        assert_eq!(size_of::<GpuCallStats>(), 40);
        assert_eq!(size_of::<GpuInflightKey>(), 8);
        assert_eq!(size_of::<GpuInflight>(), 40);
        assert_eq!(size_of::<GpuAllocKey>(), 16);
        assert_eq!(size_of::<GpuAlloc>(), 16);
        assert_eq!(size_of::<GpuSiteKey>(), 32);
        assert_eq!(size_of::<GpuSiteStats>(), 24);
        assert_eq!(size_of::<GpuProcState>(), 8 * 17 + 16);
        assert_eq!(size_of::<RecordEvent>(), 64);
        assert_eq!(size_of::<RecordThread>(), 40);
        assert_eq!(size_of::<ProfileKey>(), 24);
        assert_eq!(size_of::<ProfileCount>(), 16);
        assert_eq!(size_of::<ProfileOff>(), 24);
        assert_eq!(size_of::<RecordBlk>(), 40);
        assert_eq!(size_of::<RecordGpuInflight>(), 24);
    }
}
