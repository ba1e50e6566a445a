//! What the GPU ran for one snapshot: kernels, copies, memsets and syncs of the tree's
//! processes that were started with `libethand_cupti.so` (CUDA_INJECTION64_PATH), recorded by
//! CUPTI for the snapshot's window only (docs/gpu-activity.md).
use serde::{Deserialize, Serialize};

/// The GPU activity of a tree's processes over one window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuActivity {
    /// How it was measured and what that costs the recorded processes.
    pub method: String,
    pub started_unix_ms: u64,
    /// How long the daemon kept the window open.
    pub duration_ms: u64,
    /// Per process of the tree that maps a CUDA library.
    pub processes: Vec<GpuActivityProcess>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What became of a process's window.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ActivityState {
    /// Recorded: the figures below are the window's.
    Recorded,
    /// Another tool holds CUPTI (torch.profiler, Nsight, a debugger): ethand stepped aside.
    Refused,
    /// The library could not record (no libcupti found, a CUPTI error): see `detail`.
    Failed,
    /// The process was not started with the library: nothing recorded.
    #[default]
    NotInjected,
    /// The library is loaded but never answered within the window (an ABI mismatch, a
    /// process stopped, or the daemon's probes lost its events).
    NoAnswer,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuActivityProcess {
    pub pid: u32,
    pub state: ActivityState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The libcupti the process loaded (CUPTI_API_VERSION: 28 for CUDA 12.9, 130500 for 13.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_version: Option<u32>,
    /// The window as the process's library timed it (CLOCK_MONOTONIC, open to close).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// Records handed over by the library, and lost on the way: by CUPTI (no buffer free),
    /// by the daemon (its ring buffer full, or a record it could not read).
    pub records: u64,
    pub records_dropped_by_cupti: u64,
    pub records_lost_by_ethand: u64,
    /// Why the figures may cover only part of the window (records stopped short of the
    /// launches the uprobes counted over about the same time: another tool took CUPTI's
    /// activity buffers). Absent: no sign of it, or the two could not be compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Per device: time with at least one kernel running (the union of kernel intervals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceActivity>,
    /// Kernels by name, most GPU time first (at most [`TOP_KERNELS`]; `kernels_other` holds
    /// the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels_other: Option<KernelStat>,
    /// Copies by direction and memory kinds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyStat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memsets: Option<TimedCount>,
    /// Synchronizations by kind, time the host waited in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syncs: Vec<SyncStat>,
}

/// Kernels listed by name; the others are summed.
pub const TOP_KERNELS: usize = 30;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceActivity {
    pub device: u32,
    pub kernels: u64,
    /// Sum of kernel durations (overlapping kernels counted each).
    pub kernel_ns: u64,
    /// Time with at least one kernel running.
    pub busy_ns: u64,
    /// `busy_ns` over the window, as NVML's utilization defines it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_fraction: Option<f64>,
    /// The rest of the window, by what the GPU waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleSplit>,
}

/// The time of a window with no kernel running on a device, by why; the parts add up to the
/// window (on CUPTI's clock) less `busy_ns` (docs/gpu-activity.md, "The idle split").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdleSplit {
    /// Nothing was queued: the GPU waited for the host (Python, the input pipeline, a sync,
    /// a copy from pageable memory staged by the CPU).
    pub host_wait_ns: u64,
    /// The next kernel was queued and not running yet: launch latency, or work ahead of it in
    /// its stream.
    pub kernel_wait_ns: u64,
    /// A copy or memset ran and no kernel.
    pub copy_ns: u64,
    /// Before the first and after the last kernel of the window (work queued outside it may
    /// have run there), and gaps before kernels CUPTI gave no queued time.
    pub unattributed_ns: u64,
    /// Gaps between kernels.
    pub gaps: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelStat {
    /// As CUPTI names it (mangled C++ names as they are); None: the name was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub count: u64,
    pub gpu_ns: u64,
    pub max_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TimedCount {
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
}

/// CUPTI's memory kinds, as named here.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    #[default]
    Unknown,
    Pageable,
    Pinned,
    Device,
    Array,
    Managed,
    DeviceStatic,
    ManagedStatic,
}

impl MemoryKind {
    /// From CUPTI's `CUpti_ActivityMemoryKind`.
    pub fn from_cupti(v: u8) -> Self {
        match v {
            1 => Self::Pageable,
            2 => Self::Pinned,
            3 => Self::Device,
            4 => Self::Array,
            5 => Self::Managed,
            6 => Self::DeviceStatic,
            7 => Self::ManagedStatic,
            _ => Self::Unknown,
        }
    }
}

/// CUPTI's copy directions, as named here.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    #[default]
    Unknown,
    HostToDevice,
    DeviceToHost,
    HostToArray,
    ArrayToHost,
    ArrayToArray,
    ArrayToDevice,
    DeviceToArray,
    DeviceToDevice,
    HostToHost,
    PeerToPeer,
}

impl CopyKind {
    /// From CUPTI's `CUpti_ActivityMemcpyKind`.
    pub fn from_cupti(v: u8) -> Self {
        match v {
            1 => Self::HostToDevice,
            2 => Self::DeviceToHost,
            3 => Self::HostToArray,
            4 => Self::ArrayToHost,
            5 => Self::ArrayToArray,
            6 => Self::ArrayToDevice,
            7 => Self::DeviceToArray,
            8 => Self::DeviceToDevice,
            9 => Self::HostToHost,
            10 => Self::PeerToPeer,
            _ => Self::Unknown,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CopyStat {
    pub kind: CopyKind,
    pub src: MemoryKind,
    pub dst: MemoryKind,
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
}

/// CUPTI's synchronization kinds.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum SyncKind {
    #[default]
    Unknown,
    Event,
    StreamWaitEvent,
    Stream,
    Context,
}

impl SyncKind {
    /// From CUPTI's `CUpti_ActivitySynchronizationType`.
    pub fn from_cupti(v: u32) -> Self {
        match v {
            1 => Self::Event,
            2 => Self::StreamWaitEvent,
            3 => Self::Stream,
            4 => Self::Context,
            _ => Self::Unknown,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SyncStat {
    pub kind: SyncKind,
    pub count: u64,
    pub wait_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fraction the daemon computed is the same number after the CLI reads it
    /// back (CI once saw 0.0013334712876053923 read as ...925 without
    /// serde_json's `float_roundtrip`).
    #[test]
    fn fractions_read_back_bit_for_bit() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let busy = rng % 10_000_000_000;
            let window = 1 + (rng >> 20) % 10_000_000_000;
            let d = DeviceActivity {
                busy_fraction: Some(busy as f64 / window as f64),
                ..Default::default()
            };
            let back: DeviceActivity =
                serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
            assert_eq!(back.busy_fraction, d.busy_fraction, "{busy} / {window}");
        }
        let d = DeviceActivity {
            busy_fraction: Some(4_000_000f64 / 2_999_689_635f64),
            ..Default::default()
        };
        let back: DeviceActivity =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back.busy_fraction, d.busy_fraction);
    }
}
