//! The CPU profile a snapshot takes: samples on the CPU and long waits off it, by stack.

/// `PROFILE_COUNTS` key: one thread's samples on the CPU, or its long waits off it, at one
/// (user stack, kernel stack) pair of `PROFILE_STACKS` ids, or its short waits (no stacks). The CPU profile a snapshot takes
/// (ebpf/ethand-ebpf/src/profile.rs); attached only while one is taken.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileKey {
    pub tgid: u32,
    pub tid: u32,
    /// [`PROFILE_NO_STACK`]: none (a sample in the kernel has no user stack only for kernel
    /// threads; a sample in user mode has no kernel stack).
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// [`profile_kind`].
    pub kind: u32,
    pub _pad0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileCount {
    /// On-CPU samples, or waits off the CPU.
    pub count: u64,
    /// Off CPU: the waits' time summed (switch-out to switch-in).
    pub off_ns: u64,
}

/// A profiled thread that blocked (switched out not preempted), keyed by thread id, until
/// it runs again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileOff {
    pub since_ns: u64,
    pub tgid: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad0: u32,
}

/// [`ProfileKey::kind`].
pub mod profile_kind {
    pub const ON_CPU: u32 = 0;
    pub const OFF_CPU: u32 = 1;
    /// Waits shorter than `diagnosis.offcpu_min_us`, summed per thread (no stacks: the key's
    /// stacks are [`super::PROFILE_NO_STACK`]), so that a thread's wait total counts every
    /// wait, not only the long ones listed by stack.
    pub const OFF_CPU_SHORT: u32 = 2;
}

/// No stack in [`ProfileKey`].
pub const PROFILE_NO_STACK: i32 = -1;

/// Indexes of the `PROFILE_DROPS` per-CPU counters.
pub mod profile_drop {
    /// A stack that could not be stored (`PROFILE_STACKS` slot taken by another stack, or
    /// full): the sample or wait is counted without it.
    pub const STACK_LOST: u32 = 0;
    /// `PROFILE_COUNTS` or `PROFILE_OFF` full: the sample or wait is lost.
    pub const COUNTS_FULL: u32 = 1;
    pub const COUNT: u32 = 2;
}
