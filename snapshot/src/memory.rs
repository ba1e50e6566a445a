//! Host memory of processes and trees: what /proc/PID/status and /proc/PID/stat say of a
//! process (its resident set split by kind, swap, faults), what the daemon's samples say of
//! the window (peak, growth), the memory cgroups a tree lives in (limit, usage, OOM kills)
//! and the node's available memory. Figures derived from them (tree sums, ratios, rates)
//! are methods here, computed once for every output. None is "not read", never 0.
use serde::{Deserialize, Serialize};

use crate::{ProcessSnapshot, TreeSnapshot};

/// A process's memory when the snapshot was taken (/proc/PID/status and /proc/PID/stat),
/// and over the window (the daemon's samples).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ProcessMemory {
    /// Resident set: `anon_bytes + file_bytes + shmem_bytes` (RssAnon, RssFile, RssShmem).
    pub rss_bytes: Option<u64>,
    /// Anonymous pages (heap, stacks, private copies): what grows when a process leaks.
    pub anon_bytes: Option<u64>,
    /// Pages of mapped files (code, libraries, mmapped data): the kernel may drop them.
    pub file_bytes: Option<u64>,
    /// Shared memory (/dev/shm, memfd, shared anonymous mappings, SysV).
    pub shmem_bytes: Option<u64>,
    /// Swapped out (VmSwap).
    pub swap_bytes: Option<u64>,
    /// Highest resident set since the process started (VmHWM).
    pub rss_hwm_bytes: Option<u64>,
    /// Page faults since the process started (minflt, majflt of /proc/PID/stat; its own
    /// threads, not its children). A major fault waited for a disk read.
    pub minor_faults: Option<u64>,
    pub major_faults: Option<u64>,
    /// Over the window; None without samples in it (standalone, older files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<MemoryWindow>,
}

/// A process's resident set over the window, from the daemon's samples: every round the
/// process ran, and every process every `MEMORY_SWEEP_ROUNDS` rounds (a process that did not
/// run cannot have grown its anonymous memory).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct MemoryWindow {
    /// From the first to the last sample in the window (ms).
    pub duration_ms: u64,
    /// Samples in the window (a sample is kept only when a figure changed).
    pub samples: u64,
    /// Highest resident set of any sample in the window.
    pub peak_rss_bytes: u64,
    /// Resident set and its anonymous part at the first and the last sample.
    pub first_rss_bytes: u64,
    pub last_rss_bytes: u64,
    pub first_anon_bytes: u64,
    pub last_anon_bytes: u64,
}

impl MemoryWindow {
    /// Change of the resident set over the window per second (negative: it shrank); None
    /// when the samples span under a second.
    pub fn rss_growth_bytes_per_second(&self) -> Option<f64> {
        (self.duration_ms >= 1000).then(|| {
            (self.last_rss_bytes as f64 - self.first_rss_bytes as f64)
                / (self.duration_ms as f64 / 1000.0)
        })
    }

    /// The same for the anonymous part.
    pub fn anon_growth_bytes_per_second(&self) -> Option<f64> {
        (self.duration_ms >= 1000).then(|| {
            (self.last_anon_bytes as f64 - self.first_anon_bytes as f64)
                / (self.duration_ms as f64 / 1000.0)
        })
    }
}

/// The memory cgroup of some of a tree's processes, with the limit in force on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CgroupMemory {
    /// The cgroup's path inside its hierarchy ("/", "/system.slice/x.service").
    pub path: String,
    /// "v1" (the memory controller's own hierarchy) or "v2" (the unified one).
    pub version: String,
    /// The tree's live processes in it.
    pub pids: Vec<u32>,
    /// The lowest limit of the cgroup and its ancestors (memory.max or
    /// memory.limit_in_bytes); None: no limit (or unreadable: `note` says).
    pub limit_bytes: Option<u64>,
    /// The cgroup whose limit that is (itself or an ancestor).
    pub limit_path: Option<String>,
    /// Memory charged to the cgroup now (memory.current, memory.usage_in_bytes): its
    /// processes' memory and the page cache they brought in.
    pub usage_bytes: Option<u64>,
    /// Times it reached its limit and the OOM killer ran (memory.events `oom`), and the
    /// processes the OOM killer killed in it (`oom_kill` of memory.events or, on v1,
    /// memory.oom_control), since the cgroup was made.
    pub oom_events: Option<u64>,
    pub oom_kills: Option<u64>,
    /// Why a figure is missing, when one is.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl CgroupMemory {
    /// Usage over the limit (0-1); None without a limit or a usage.
    pub fn limit_ratio(&self) -> Option<f64> {
        let limit = self.limit_bytes.filter(|l| *l > 0)?;
        Some(self.usage_bytes? as f64 / limit as f64)
    }
}

/// The node's memory (/proc/meminfo) when the snapshot was taken.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct NodeMemory {
    pub total_bytes: u64,
    /// MemAvailable: what can be allocated without swapping.
    pub available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
}

impl NodeMemory {
    pub fn available_ratio(&self) -> Option<f64> {
        (self.total_bytes > 0).then(|| self.available_bytes as f64 / self.total_bytes as f64)
    }
}

/// Sums of the tree's live processes' memory now (only processes whose memory was read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryTotals {
    /// Processes whose memory was read.
    pub processes: u64,
    pub rss_bytes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
    pub swap_bytes: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
}

impl ProcessSnapshot {
    /// The memory read for a live process; None for an exited one or when not read.
    pub fn memory_now(&self) -> Option<&ProcessMemory> {
        self.memory.as_ref().filter(|_| self.alive)
    }
}

impl TreeSnapshot {
    /// Sums of the live processes' memory now; None when no process's memory was read.
    /// Shared pages (shmem, a file two processes map) count once per process, as in `ps`.
    pub fn memory_totals(&self) -> Option<MemoryTotals> {
        let mut t = MemoryTotals::default();
        for m in self.processes.iter().filter_map(|p| p.memory_now()) {
            if m.rss_bytes.is_none() {
                continue;
            }
            t.processes += 1;
            t.rss_bytes += m.rss_bytes.unwrap_or(0);
            t.anon_bytes += m.anon_bytes.unwrap_or(0);
            t.file_bytes += m.file_bytes.unwrap_or(0);
            t.shmem_bytes += m.shmem_bytes.unwrap_or(0);
            t.swap_bytes += m.swap_bytes.unwrap_or(0);
            t.minor_faults += m.minor_faults.unwrap_or(0);
            t.major_faults += m.major_faults.unwrap_or(0);
        }
        (t.processes > 0).then_some(t)
    }

    /// The live process whose resident set grew fastest over the window (bytes/s), if any
    /// grew.
    pub fn memory_fastest_growth(&self) -> Option<(&ProcessSnapshot, f64)> {
        self.processes
            .iter()
            .filter_map(|p| {
                let g = p
                    .memory_now()?
                    .window
                    .as_ref()?
                    .rss_growth_bytes_per_second()?;
                (g > 0.0).then_some((p, g))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The largest resident set of the tree's live processes.
    pub fn memory_largest(&self) -> Option<(&ProcessSnapshot, u64)> {
        self.processes
            .iter()
            .filter_map(|p| Some((p, p.memory_now()?.rss_bytes?)))
            .max_by_key(|(_, rss)| *rss)
    }

    /// The memory cgroup nearest its limit and its usage over the limit.
    pub fn memory_cgroup_nearest_limit(&self) -> Option<(&CgroupMemory, f64)> {
        self.memory_cgroups
            .iter()
            .filter_map(|c| Some((c, c.limit_ratio()?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// OOM kills in the tree's memory cgroups; None when none could be read.
    pub fn memory_oom_kills(&self) -> Option<u64> {
        let known: Vec<u64> = self
            .memory_cgroups
            .iter()
            .filter_map(|c| c.oom_kills)
            .collect();
        (!known.is_empty()).then(|| known.iter().sum())
    }
}
