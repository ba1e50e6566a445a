//! Process lifecycle: the exec and exit events of the ring buffer and the parent recorded at
//! fork.

/// Kinds of [`LifecycleEvent`].
pub mod lifecycle_kind {
    // 1 was FORK: births need no event (a process appears with its first counters).
    pub const EXEC: u32 = 2;
    pub const EXIT: u32 = 3;
}

/// Sent through the LIFECYCLE ring buffer on process exec and exit: the process, and what
/// /proc can no longer tell once it has exited (its parent, cgroup, user and name), taken in
/// kernel context. A process that lives between two collection rounds is known by this alone.
/// Under churn (10,000 exits/s) every byte here is ring buffer room: 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LifecycleEvent {
    pub kind: u32,
    pub tgid: u32,
    pub proc_start_ns: u64,
    /// The parent that forked it (from [`ProcOrigin`]), else its parent now; 0: unknown.
    pub parent_tgid: u32,
    pub uid: u32,
    pub parent_start_ns: u64,
    /// cgroup v2 id (the inode number of its directory in cgroupfs) at the event.
    pub cgroup_id: u64,
    /// `comm` of the thread that sent the event, NUL-padded.
    pub comm: [u8; 16],
}

/// Recorded at fork for a new process (not a thread), keyed by its tgid: the parent that forked
/// it, which a later reparenting (its parent exiting first) does not change.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcOrigin {
    pub proc_start_ns: u64,
    pub parent_tgid: u32,
    pub _pad0: u32,
    pub parent_start_ns: u64,
}
