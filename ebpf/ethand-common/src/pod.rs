//! `aya::Pod` for every map type: userspace only (feature `user`).
use crate::*;
// SAFETY: all types are repr(C), integer-only and padding-free (see tests::sizes).
unsafe impl aya::Pod for ThreadStats {}
unsafe impl aya::Pod for CpuCtx {}
unsafe impl aya::Pod for ProcKey {}
unsafe impl aya::Pod for SyscallKey {}
unsafe impl aya::Pod for SyscallStats {}
unsafe impl aya::Pod for SyscallHistKey {}
unsafe impl aya::Pod for Hist {}
unsafe impl aya::Pod for BlkReqKey {}
unsafe impl aya::Pod for BlkReqState {}
unsafe impl aya::Pod for BlkKey {}
unsafe impl aya::Pod for BlkStats {}
unsafe impl aya::Pod for NetStats {}
unsafe impl aya::Pod for LifecycleEvent {}
unsafe impl aya::Pod for ProcOrigin {}
unsafe impl aya::Pod for KernelOffsets {}
unsafe impl aya::Pod for TracepointOffsets {}
unsafe impl aya::Pod for GpuOpDesc {}
unsafe impl aya::Pod for GpuCallKey {}
unsafe impl aya::Pod for GpuCallStats {}
unsafe impl aya::Pod for GpuInflightKey {}
unsafe impl aya::Pod for GpuInflight {}
unsafe impl aya::Pod for GpuAllocKey {}
unsafe impl aya::Pod for GpuAlloc {}
unsafe impl aya::Pod for GpuSiteKey {}
unsafe impl aya::Pod for GpuSiteStats {}
unsafe impl aya::Pod for GpuProcState {}
unsafe impl aya::Pod for RecordEvent {}
unsafe impl aya::Pod for RecordThread {}
unsafe impl aya::Pod for RecordBlk {}
unsafe impl aya::Pod for RecordGpuInflight {}
unsafe impl aya::Pod for ProfileKey {}
unsafe impl aya::Pod for ProfileCount {}
unsafe impl aya::Pod for ProfileOff {}
