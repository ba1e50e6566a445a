//! The contract of `libethand_cupti.so` (cupti/ethand_cupti.h), mirrored: the control file the
//! daemon writes and the library maps read-only, the records and events its probe functions
//! pass, and the ring-buffer entries the uprobes on those functions make of them
//! (ebpf/ethand-ebpf/src/cupti.rs). `tests::cupti_layout` pins every size and the offsets
//! the C header has.

/// `ETHAND_CUPTI_ABI`.
pub const CUPTI_ABI: u32 = 2;
/// `ETHAND_CUPTI_CTL_MAGIC`: "ETHCUPTI" as a little-endian u64.
pub const CUPTI_CTL_MAGIC: u64 = 0x4954_5055_4348_5445;
/// `ETHAND_CUPTI_SLOTS`.
pub const CUPTI_SLOTS: u32 = 256;
/// `ETHAND_CUPTI_BATCH`: records per `ethand_cupti_batch` call at most.
pub const CUPTI_BATCH: u32 = 64;
/// `ETHAND_CUPTI_NAME_MAX`: bytes of a kernel name kept (with its NUL).
pub const CUPTI_NAME_MAX: usize = 256;
/// `ETHAND_CUPTI_NONE`: no device, no name id.
pub const CUPTI_NONE: u32 = u32::MAX;
/// Size of the `CUPTI_EVENTS` ring buffer (a power of two, a multiple of the page).
pub const CUPTI_RINGBUF_BYTES: u32 = 4 << 20;
/// Size of the `LAUNCH_EVENTS` ring buffer: 64 bytes a launch, drained each collection round
/// (a second at the defaults): room for 65,536 launches a round.
pub const LAUNCH_RINGBUF_BYTES: u32 = 4 << 20;
/// Entries of `LAUNCH_STACKS` (the user stacks of launches inside windows, cleared when no
/// window is open).
pub const LAUNCH_STACKS_MAX: u32 = 4096;

/// `struct ethand_cupti_ctl_header`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CuptiCtlHeader {
    pub magic: u64,
    pub abi: u32,
    /// The futex word: one more after each change of a slot.
    pub wake_seq: u32,
    pub nslots: u32,
    pub slot_size: u32,
    pub reserved: [u64; 5],
}

/// `struct ethand_cupti_slot`: a seqlock (`seq` odd while written).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuptiSlot {
    pub seq: u32,
    pub nspid: u32,
    pub pidns_ino: u64,
    pub window_id: u64,
    pub deadline_mono_ns: u64,
    pub kinds: u32,
    pub max_records: u32,
    pub reserved: [u64; 3],
}

/// `ETHAND_CUPTI_KIND_*`: what a window records.
pub mod cupti_kinds {
    pub const KERNEL: u32 = 1 << 0;
    pub const MEMCPY: u32 = 1 << 1;
    pub const MEMSET: u32 = 1 << 2;
    pub const SYNC: u32 = 1 << 3;
    pub const ALL: u32 = KERNEL | MEMCPY | MEMSET | SYNC;
}

/// [`CuptiRec::kind`] (`enum ethand_cupti_rec_kind`).
pub mod cupti_rec_kind {
    pub const KERNEL: u8 = 1;
    pub const MEMCPY: u8 = 2;
    pub const MEMSET: u8 = 3;
    pub const SYNC: u8 = 4;
}

/// `struct ethand_cupti_rec`: one activity, times on CUPTI's clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuptiRec {
    pub kind: u8,
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    pub sync_type: u32,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub correlation: u32,
    pub name_id: u32,
    pub flags: u32,
    pub start: u64,
    pub end: u64,
    pub bytes: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Kernel: when the host queued the launch (CUPTI's clock; 0: unknown).
    pub queued: u64,
}

/// [`CuptiWindowEvent::state`] (`enum ethand_cupti_window_state`).
pub mod cupti_window_state {
    pub const OPENED: u32 = 1;
    pub const CLOSED: u32 = 2;
    pub const REFUSED: u32 = 3;
    pub const FAILED: u32 = 4;
}

/// `struct ethand_cupti_window_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuptiWindowEvent {
    pub window_id: u64,
    pub state: u32,
    pub result: i32,
    pub cupti_version: u32,
    pub reason: u32,
    pub clock_cupti: u64,
    pub clock_mono: u64,
    pub records: u64,
    pub dropped: u64,
    pub buffers_declined: u64,
    pub names: u64,
    pub unnamed: u64,
}

/// [`CuptiWindowEvent::reason`] of a CLOSED window (`ethand_cupti_close_reason`).
pub mod cupti_close_reason {
    /// Its deadline passed.
    pub const DEADLINE: u32 = 1;
    /// The window's owner ended it (a recording that ended early, the daemon going).
    pub const ASKED: u32 = 2;
    /// It held the records it was allowed.
    pub const MAX_RECORDS: u32 = 3;
    /// Another window was asked for in the process (one at a time).
    pub const ANOTHER_WINDOW: u32 = 4;
}

/// [`CuptiEventHeader::what`]: which probe made a `CUPTI_EVENTS` entry.
pub mod cupti_event {
    /// Followed by `n` [`super::CuptiRec`]s (room for [`super::CUPTI_BATCH`]).
    pub const BATCH: u32 = 1;
    /// Followed by the name's bytes (room for [`super::CUPTI_NAME_MAX`], NUL-terminated);
    /// `n` = the name id.
    pub const NAME: u32 = 2;
    /// Followed by one [`super::CuptiWindowEvent`].
    pub const WINDOW: u32 = 3;
}

/// The start of every `CUPTI_EVENTS` entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuptiEventHeader {
    pub what: u32,
    pub tgid: u32,
    /// BATCH: records that follow; NAME: the name id; WINDOW: 0.
    pub n: u32,
    /// 1 if the probe could not read all it was given (the entry holds what it read).
    pub partial: u32,
    /// The window the probe named (WINDOW: the event's own).
    pub window_id: u64,
}

/// A `CUPTI_EVENTS` entry of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CuptiBatchEvent {
    pub header: CuptiEventHeader,
    pub recs: [CuptiRec; CUPTI_BATCH as usize],
}

/// A `CUPTI_EVENTS` entry of a name.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CuptiNameEvent {
    pub header: CuptiEventHeader,
    pub name: [u8; CUPTI_NAME_MAX],
}

/// A `CUPTI_EVENTS` entry of a window event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CuptiWindowEntry {
    pub header: CuptiEventHeader,
    pub event: CuptiWindowEvent,
}

/// One kernel launch call of a process inside its window (`LAUNCH_EVENTS`), made by the
/// uprobe and uretprobe on the runtime's launch symbols (ebpf/ethand-ebpf/src/cupti.rs):
/// which thread called, when it entered and returned (CLOCK_MONOTONIC), and its call site as
/// the GPU call sites key it. The kernel a launch made is the one whose `queued` time (mapped
/// to this clock) falls inside [entry_ns, return_ns].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchEvent {
    pub tgid: u32,
    pub tid: u32,
    /// The window `CUPTI_OPEN` names for the process at the return.
    pub window_id: u64,
    pub entry_ns: u64,
    pub return_ns: u64,
    /// A `LAUNCH_STACKS` id, or [`crate::GPU_STACK_UNATTRIBUTED`] where the stack could not
    /// be taken.
    pub stack_id: u32,
    pub _pad0: u32,
    /// The caller's return address (the stack's top at the entry).
    pub caller: u64,
    /// The `PY_STACKS` hash of the thread's Python frames, or 0.
    pub py_stack: u64,
}

/// A launch between its entry and return (`LAUNCH_INFLIGHT`, by thread id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchInflight {
    pub entry_ns: u64,
    pub stack_id: u32,
    pub _pad0: u32,
    pub caller: u64,
    pub py_stack: u64,
}

/// Indexes of the `CUPTI_DROPS` per-CPU counters.
pub mod cupti_drop {
    /// The ring buffer was full: an entry lost.
    pub const RINGBUF_FULL: u32 = 0;
    /// A probe's arguments could not be read.
    pub const READ_FAILED: u32 = 1;
    /// `LAUNCH_EVENTS` was full: a launch lost (its kernel is unattributed).
    pub const LAUNCH_RINGBUF_FULL: u32 = 2;
    /// A launch's user stack could not be taken (`LAUNCH_STACKS` full, or a stack it could
    /// not walk): its kernels join a site without native frames.
    pub const LAUNCH_STACK_LOST: u32 = 3;
    pub const COUNT: u32 = 4;
}
