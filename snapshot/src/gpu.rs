//! Accelerator runtime activity of one process, from the uprobes on libcuda, libnccl,
//! libascendcl and libhccl (cumulative since ethand first saw the process), joined with what
//! the device collectors (NVML, DCMI) report for that process.
use serde::{Deserialize, Serialize};

/// A process's calls into GPU/NPU runtime libraries. Absent from a process that never called
/// a probed symbol.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuProcessStats {
    /// Kernel launches (CUDA) and operator / model executions (Ascend). None: not counted
    /// at the GPU level the figures were taken at (below `process`), never a measured 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<u64>,
    /// CUDA graph launches (each runs many kernels); None as for `launches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_launches: Option<u64>,
    /// By direction: host_to_device, device_to_host, device_to_device, peer, default
    /// (unified addressing: direction chosen by the driver), host_to_host.
    pub copies: Vec<GpuCopyStats>,
    /// Host blocked in stream, context, event or device synchronization.
    pub sync: GpuTimedCalls,
    /// By kind: device, managed, host_pinned, host_registered.
    pub memory: Vec<GpuMemoryStats>,
    /// Frees of memory allocated before ethand attached (their size is unknown).
    pub untracked_frees: u64,
    /// By library and operation (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
    /// all_to_all, send, recv).
    pub collectives: Vec<CollectiveStats>,
    /// `ncclGroupStart` + `ncclGroupEnd` calls; time is host time in them.
    pub groups: GpuTimedCalls,
    /// Communicator creations.
    pub comm_inits: u64,
    /// Rank in the largest communicator the process created.
    pub comm: Option<CommRank>,
    /// Probed calls that returned an error status.
    pub errors: u64,
    /// Every probed symbol the process called, by library and name.
    pub symbols: Vec<GpuSymbolStats>,
    /// Where the calls come from: per runtime symbol, the user stacks the kernel took at
    /// each call (exact counts), symbolized. Empty where stacks were not taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_sites: Vec<crate::stacks::CallSites>,
    /// Whether the calling thread's Python frames are walked at each call (a CPython
    /// process); absent for other processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_walk: Option<PythonWalk>,
}

/// The in-kernel walk of a CPython process's frames at its GPU calls: the call sites of
/// calls made while `walked` name their Python lines (exact per call).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PythonWalk {
    /// The interpreter is being read (calls until then have native call sites only).
    Pending,
    /// Walked: the interpreter's version ("3.11").
    Walked { version: String },
    /// A CPython process whose frames are not walked, and why.
    Refused { why: String },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuCopyStats {
    pub direction: String,
    pub calls: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuTimedCalls {
    pub calls: u64,
    /// Host time inside the calls whose return was seen (`timed_calls` of them).
    pub time_ns: u64,
    pub timed_calls: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuMemoryStats {
    pub kind: String,
    pub allocs: u64,
    pub alloc_bytes: u64,
    pub frees: u64,
    pub freed_bytes: u64,
    /// Allocated and not yet freed (as seen since ethand attached).
    pub live_bytes: u64,
    /// Highest `live_bytes` seen.
    pub peak_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CollectiveStats {
    /// "nccl" or "hccl".
    pub library: String,
    pub operation: String,
    pub calls: u64,
    /// Element count times data-type size, summed over calls (send buffer size; for
    /// all_gather the per-rank contribution, for reduce_scatter the per-rank result).
    pub bytes: u64,
    /// Host time inside the calls. NCCL returns once the work is enqueued: a rank waiting
    /// for its peers shows that wait in synchronization, not here.
    pub time_ns: u64,
    pub timed_calls: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommRank {
    /// "nccl" or "hccl".
    pub library: String,
    /// None: one process drives every rank (`ncclCommInitAll`) or the API did not say.
    pub rank: Option<u32>,
    pub nranks: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuSymbolStats {
    /// "libcuda", "libnccl", "libascendcl", "libhccl".
    pub library: String,
    pub symbol: String,
    /// launch, graph_launch, copy, alloc, free, sync, collective, group, comm_init.
    pub category: String,
    /// Copies: the direction; empty otherwise.
    pub direction: String,
    pub calls: u64,
    pub errors: u64,
    pub bytes: u64,
    pub time_ns: u64,
    pub timed_calls: u64,
}

/// What a device collector (NVML, DCMI) reports for one process on one device.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessDeviceUsage {
    /// Device identity as in the device metrics: "gpu0", "npu3".
    pub device: String,
    pub uuid: String,
    pub memory_used_bytes: u64,
    /// SM (GPU) / AI-core (NPU) utilization attributed to the process, 0-1, when the driver
    /// gives it.
    pub utilization_ratio: Option<f64>,
    /// Utilization of the whole device (all its processes), 0-1.
    pub device_utilization_ratio: Option<f64>,
}

/// Critical XID events of one code on one GPU the process held a context on.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessXid {
    /// "gpu0".
    pub device: String,
    pub uuid: String,
    /// The XID code.
    pub xid: u64,
    pub count: u64,
    /// When the newest of them was drained, Unix ns.
    pub last_unix_ns: u64,
}

/// Signals for diagnosis, over the snapshot window (`WindowStats::duration_ms`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuDerived {
    pub window_ms: u64,
    /// Kernel launches per second over the window; None when launches were not counted
    /// (see `TreeSnapshot::launch_sample` for the on-demand measurement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches_per_second: Option<f64>,
    /// Fraction of wall time the tree's threads spent blocked in GPU/NPU synchronization
    /// (summed over threads: above 1 when several threads wait at once).
    pub sync_blocked_ratio: f64,
    /// Fraction of wall time spent inside collective calls (host side).
    pub collective_ratio: f64,
    /// Copy throughput over the window, bytes per second, by direction.
    pub copy_bytes_per_second: Vec<(String, f64)>,
    /// Utilization of the devices the tree uses, from the device collector (0-1), when known.
    pub device_utilization_ratio: Option<f64>,
    /// 1 - device_utilization_ratio: how much of the time the tree's devices sat idle.
    pub device_idle_ratio: Option<f64>,
    /// Synchronization calls per second over the window.
    #[serde(default)]
    pub syncs_per_second: f64,
    /// NVML GPM (Hopper and newer) over the window, mean of the tree's GPUs: share of SMs
    /// active, warps resident per SM against the maximum, tensor-pipe activity, DRAM
    /// bandwidth used. None where the GPU has no GPM or no reading fell in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_activity_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_bandwidth_ratio: Option<f64>,
    /// NVML GPM FP32 and FP64 pipe activity over the window, mean of the tree's GPUs (see
    /// `GpuDevice::fp32_activity_ratio`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp32_activity_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp64_activity_ratio: Option<f64>,
}

/// Sum of two counts either of which may not have been taken: known only if one was.
pub fn add_counted(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

impl GpuProcessStats {
    /// Adds another process's figures (tree totals). Symbols are merged by library+name.
    pub fn add(&mut self, o: &Self) {
        self.launches = add_counted(self.launches, o.launches);
        self.graph_launches = add_counted(self.graph_launches, o.graph_launches);
        for c in &o.copies {
            match self.copies.iter_mut().find(|x| x.direction == c.direction) {
                Some(x) => {
                    x.calls += c.calls;
                    x.bytes += c.bytes;
                }
                None => self.copies.push(c.clone()),
            }
        }
        self.sync.add(&o.sync);
        self.groups.add(&o.groups);
        for m in &o.memory {
            match self.memory.iter_mut().find(|x| x.kind == m.kind) {
                Some(x) => {
                    x.allocs += m.allocs;
                    x.alloc_bytes += m.alloc_bytes;
                    x.frees += m.frees;
                    x.freed_bytes += m.freed_bytes;
                    x.live_bytes += m.live_bytes;
                    // Peaks of different processes need not coincide: the sum bounds it.
                    x.peak_bytes += m.peak_bytes;
                }
                None => self.memory.push(m.clone()),
            }
        }
        self.untracked_frees += o.untracked_frees;
        for c in &o.collectives {
            match self
                .collectives
                .iter_mut()
                .find(|x| x.library == c.library && x.operation == c.operation)
            {
                Some(x) => {
                    x.calls += c.calls;
                    x.bytes += c.bytes;
                    x.time_ns += c.time_ns;
                    x.timed_calls += c.timed_calls;
                }
                None => self.collectives.push(c.clone()),
            }
        }
        self.comm_inits += o.comm_inits;
        if self.comm.is_none() {
            self.comm = o.comm.clone();
        }
        self.errors += o.errors;
        for s in &o.symbols {
            match self.symbols.iter_mut().find(|x| {
                x.library == s.library && x.symbol == s.symbol && x.direction == s.direction
            }) {
                Some(x) => {
                    x.calls += s.calls;
                    x.errors += s.errors;
                    x.bytes += s.bytes;
                    x.time_ns += s.time_ns;
                    x.timed_calls += s.timed_calls;
                }
                None => self.symbols.push(s.clone()),
            }
        }
    }

    pub fn collective_time_ns(&self) -> u64 {
        self.collectives.iter().map(|c| c.time_ns).sum()
    }

    /// Collective calls of every operation.
    pub fn collective_calls(&self) -> u64 {
        self.collectives.iter().map(|c| c.calls).sum()
    }

    /// Bytes of every collective call.
    pub fn collective_bytes(&self) -> u64 {
        self.collectives.iter().map(|c| c.bytes).sum()
    }

    /// Copy calls in every direction.
    pub fn copy_calls_total(&self) -> u64 {
        self.copies.iter().map(|c| c.calls).sum()
    }

    /// Bytes copied in every direction.
    pub fn copy_bytes_total(&self) -> u64 {
        self.copies.iter().map(|c| c.bytes).sum()
    }

    /// Device memory allocated and not yet freed, every kind.
    pub fn memory_live_bytes(&self) -> u64 {
        self.memory.iter().map(|m| m.live_bytes).sum()
    }

    /// Sum of each kind's peak of live memory (an upper bound of the joint peak).
    pub fn memory_peak_bytes(&self) -> u64 {
        self.memory.iter().map(|m| m.peak_bytes).sum()
    }

    pub fn copy_bytes(&self, direction: &str) -> u64 {
        self.copies
            .iter()
            .filter(|c| c.direction == direction)
            .map(|c| c.bytes)
            .sum()
    }
}

impl GpuTimedCalls {
    pub fn add(&mut self, o: &Self) {
        self.calls += o.calls;
        self.time_ns += o.time_ns;
        self.timed_calls += o.timed_calls;
    }
}

/// Kernel launches counted on demand for one snapshot, when the GPU level in force does not
/// count them (`calls`): launch uprobes scoped to the tree's GPU processes for a short sample.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LaunchSample {
    /// How the launches were counted and what that costs the sampled processes.
    pub method: String,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    /// Launches of the sampled processes; None when no process of the tree could be sampled
    /// (none maps a probed runtime library; `notes` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches_per_second: Option<f64>,
    /// Per sampled process.
    pub processes: Vec<LaunchSampleProcess>,
    /// Processes that could not be sampled, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaunchSampleProcess {
    pub pid: u32,
    pub launches: u64,
}
