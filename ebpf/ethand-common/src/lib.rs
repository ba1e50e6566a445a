//! The kernel/user contract of ethand: every type stored in a BPF map or sent through the
//! ring buffer, and the constants both sides agree on.
//!
//! Invariants: every struct is `#[repr(C)]`, has no implicit padding (explicit `_pad` fields,
//! fields ordered by size) and contains only integers, so that `aya::Pod` is sound and the
//! layout is identical in the BPF object and in userspace. `tests::sizes` pins the sizes.
#![no_std]

mod block;
pub mod counter;
mod cupti;
mod gpu;
mod hist;
mod lifecycle;
mod net;
mod offsets;
#[cfg(feature = "user")]
mod pod;
mod profile;
mod python;
mod record;
mod sched;
mod syscalls;

// One flat namespace, as before the split: `ethand_common::ThreadStats`,
// `ethand_common::gpu_kind::COPY`, ...
pub use block::*;
pub use cupti::*;
pub use gpu::*;
pub use hist::*;
pub use lifecycle::*;
pub use net::*;
pub use offsets::*;
pub use profile::*;
pub use python::*;
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

    /// The C header's sizes and offsets (cupti/ethand_cupti.h).
    #[test]
    fn cupti_layout() {
        use core::mem::offset_of;
        assert_eq!(size_of::<CuptiCtlHeader>(), 64);
        assert_eq!(size_of::<CuptiSlot>(), 64);
        assert_eq!(offset_of!(CuptiCtlHeader, wake_seq), 12);
        assert_eq!(offset_of!(CuptiSlot, pidns_ino), 8);
        assert_eq!(offset_of!(CuptiSlot, window_id), 16);
        assert_eq!(offset_of!(CuptiSlot, deadline_mono_ns), 24);
        assert_eq!(offset_of!(CuptiSlot, kinds), 32);
        assert_eq!(size_of::<CuptiRec>(), 88);
        assert_eq!(offset_of!(CuptiRec, sync_type), 4);
        assert_eq!(offset_of!(CuptiRec, name_id), 24);
        assert_eq!(offset_of!(CuptiRec, start), 32);
        assert_eq!(offset_of!(CuptiRec, bytes), 48);
        assert_eq!(offset_of!(CuptiRec, grid), 56);
        assert_eq!(offset_of!(CuptiRec, block), 68);
        assert_eq!(offset_of!(CuptiRec, queued), 80);
        assert_eq!(size_of::<CuptiWindowEvent>(), 80);
        assert_eq!(offset_of!(CuptiWindowEvent, clock_cupti), 24);
        assert_eq!(offset_of!(CuptiWindowEvent, unnamed), 72);
        assert_eq!(size_of::<CuptiEventHeader>(), 24);
        assert_eq!(size_of::<CuptiBatchEvent>(), 24 + 88 * CUPTI_BATCH as usize);
        assert_eq!(size_of::<CuptiNameEvent>(), 24 + CUPTI_NAME_MAX);
        assert_eq!(size_of::<CuptiWindowEntry>(), 24 + 80);
        assert_eq!(size_of::<LaunchEvent>(), 56);
        assert_eq!(size_of::<LaunchInflight>(), 32);
    }

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
        assert_eq!(size_of::<KernelOffsets>(), 120);
        assert_eq!(size_of::<TracepointOffsets>(), 30 * 4);
        assert_eq!(size_of::<GpuOpDesc>(), 8);
        assert_eq!(size_of::<GpuCallKey>(), 16);
        assert_eq!(size_of::<GpuCallStats>(), 40);
        assert_eq!(size_of::<GpuInflightKey>(), 8);
        assert_eq!(size_of::<GpuInflight>(), 48);
        assert_eq!(size_of::<GpuAllocKey>(), 16);
        assert_eq!(size_of::<GpuAlloc>(), 16);
        assert_eq!(size_of::<GpuSiteKey>(), 40);
        assert_eq!(size_of::<PyStack>(), 8 + 16 * PY_MAX_FRAMES);
        assert_eq!(size_of::<PyProc>(), 16);
        assert_eq!(size_of::<PyStackKey>(), 16);
        assert_eq!(size_of::<PyLayout>(), 64);
        assert_eq!(size_of::<GpuSiteStats>(), 24);
        assert_eq!(size_of::<GpuProcState>(), 8 * 17 + 16);
        assert_eq!(size_of::<RecordEvent>(), 64);
        assert_eq!(size_of::<RecordThread>(), 40);
        assert_eq!(size_of::<ProfileKey>(), 24);
        assert_eq!(size_of::<ProfileCount>(), 16);
        assert_eq!(size_of::<ProfileOff>(), 24);
        assert_eq!(size_of::<RecordBlk>(), 40);
        assert_eq!(size_of::<RecordGpuInflight>(), 32);
    }
}
