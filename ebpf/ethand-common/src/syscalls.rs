//! Syscalls per process and number, and latency histograms per syscall class.

/// Syscall numbers are accounted below this (x86_64 has ~470); numbers at or above it are
/// counted under [`SYSCALL_NR_UNIMPLEMENTED`].
pub const MAX_SYSCALL_NR: u32 = 1024;

/// The one key of every call the kernel does not implement (a number at or above
/// [`MAX_SYSCALL_NR`], or any that returned ENOSYS): a process calling hundreds of unknown
/// numbers takes one map entry, not hundreds.
pub const SYSCALL_NR_UNIMPLEMENTED: u32 = MAX_SYSCALL_NR - 1;
/// The key of a process's calls of syscall numbers beyond its share of the map
/// (`maps.syscall_numbers_per_process` distinct numbers): counted, without the number.
pub const SYSCALL_NR_OVER_LIMIT: u32 = MAX_SYSCALL_NR - 2;

/// `CpuCtx::sys_nr` / `ThreadStats::sys_nr` value meaning "no syscall in flight".
pub const NO_SYSCALL: u32 = u32::MAX;

/// Syscall classes that get a latency histogram. Class 0 gets none.
pub mod syscall_class {
    pub const NONE: u8 = 0;
    pub const READ_WRITE: u8 = 1;
    pub const FUTEX: u8 = 2;
    pub const POLL: u8 = 3;
    pub const SLEEP: u8 = 4;
    pub const IO_URING: u8 = 5;
    pub const OPEN_CLOSE_SYNC: u8 = 6;
    pub const NET: u8 = 7;
    /// Number of classes including NONE.
    pub const COUNT: usize = 8;
    pub const NAMES: [&str; COUNT] = [
        "none",
        "read_write",
        "futex",
        "poll",
        "sleep",
        "io_uring",
        "open_close_sync",
        "net",
    ];
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    pub tgid: u32,
    pub nr: u32,
    pub proc_start_ns: u64,
}

/// Per process and syscall number. Updated with atomic adds (threads of one process run on
/// several CPUs at once).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallStats {
    pub count: u64,
    /// Returns in [-4095, -1].
    pub errors: u64,
    pub time_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SyscallHistKey {
    pub tgid: u32,
    pub class: u32,
    pub proc_start_ns: u64,
}
