//! Accelerator runtime activity of one process, from the uprobes on libcuda, libnccl,
//! libascendcl and libhccl (cumulative since ethand first saw the process), joined with what
//! the device collectors (NVML, DCMI) report for that process.
use serde::{Deserialize, Serialize};

/// A process's calls into GPU/NPU runtime libraries. Absent from a process that never called
/// a probed symbol.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuProcessStats {
    /// Kernel launches (CUDA) and operator / model executions (Ascend).
    pub launches: u64,
    /// CUDA graph launches (each runs many kernels).
    pub graph_launches: u64,
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
}
