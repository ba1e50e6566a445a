//! Per-process GPU/NPU runtime series (uprobes on libcuda, libnccl, libascendcl, libhccl).
//! Rendered for the processes the Prometheus selection picks; a process that made GPU/NPU
//! runtime calls is always picked (there are few: about one per accelerator). Labels are
//! bounded by the symbol catalog: direction (6), memory kind (4), library (4), operation (8),
//! symbol (under 100).
use crate::prometheus::Exposition;

use crate::prometheus::{Desc, Family, Nanos, counter, gauge, process_label_sets, with_extra};
use ethand_snapshot::ProcessSnapshot;

pub(crate) const LAUNCHES: Desc = counter(
    "ethand_process_gpu_launches_total",
    "Kernel launches (CUDA cuLaunchKernel*, kind=\"kernel\"), CUDA graph launches \
     (kind=\"graph\") and Ascend operator/model executions (kind=\"kernel\") by the process \
     (uprobes on libcuda, libascendcl); counted at GPU level process or op only, not at the \
     default level calls.",
);
pub(crate) const COPY_BYTES: Desc = counter(
    "ethand_process_gpu_memcpy_bytes_total",
    "Bytes the process asked the runtime to copy, by direction (host_to_device, \
     device_to_host, device_to_device, peer, default = unified addressing, host_to_host) \
     (uprobes on cuMemcpy*, aclrtMemcpy*).",
);
pub(crate) const COPY_CALLS: Desc = counter(
    "ethand_process_gpu_memcpy_calls_total",
    "Copy calls of the process, by direction (uprobes on cuMemcpy*, aclrtMemcpy*).",
);
pub(crate) const SYNC_TIME: Desc = counter(
    "ethand_process_gpu_sync_seconds_total",
    "Host time the process spent blocked in stream, context, event or device \
     synchronization (uprobe + uretprobe on cuStreamSynchronize, cuCtxSynchronize, \
     cuEventSynchronize, aclrtSynchronize*).",
);
pub(crate) const SYNC_CALLS: Desc = counter(
    "ethand_process_gpu_sync_calls_total",
    "Synchronization calls of the process (uprobes on cu*Synchronize, aclrtSynchronize*).",
);
pub(crate) const MEM_LIVE: Desc = gauge(
    "ethand_process_gpu_memory_allocated_bytes",
    "Memory the process allocated through the runtime and has not freed, by kind (device, \
     managed, host_pinned, host_registered), counted since ethand attached (uprobes on \
     cuMemAlloc*, cuMemFree*, cuMemHostAlloc, aclrtMalloc, aclrtFree, ...).",
);
pub(crate) const MEM_PEAK: Desc = gauge(
    "ethand_process_gpu_memory_peak_bytes",
    "Highest ethand_process_gpu_memory_allocated_bytes seen, by kind.",
);
pub(crate) const MEM_ALLOCS: Desc = counter(
    "ethand_process_gpu_memory_allocations_total",
    "Successful runtime allocations of the process, by kind (uprobe + uretprobe on \
     cuMemAlloc*, cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister, aclrtMalloc*).",
);
pub(crate) const MEM_FREES: Desc = counter(
    "ethand_process_gpu_memory_frees_total",
    "Runtime frees of the process, by kind (uprobes on cuMemFree*, aclrtFree*).",
);
pub(crate) const API_ERRORS: Desc = counter(
    "ethand_process_gpu_api_errors_total",
    "Probed runtime calls of the process that returned an error status, by library.",
);
pub(crate) const API_CALLS: Desc = counter(
    "ethand_process_gpu_api_calls_total",
    "Calls of each probed runtime symbol by the process, by library and symbol (which \
     variants a framework really calls: _v2, Async, _ptsz, ...).",
);
pub(crate) const COLL_CALLS: Desc = counter(
    "ethand_process_collective_calls_total",
    "Collective and point-to-point calls of the process, by library (nccl, hccl), operation \
     and rank (uprobes on ncclAllReduce, ..., HcclAllReduce, ...).",
);
pub(crate) const COLL_BYTES: Desc = counter(
    "ethand_process_collective_bytes_total",
    "Bytes of the process's collective calls (element count times data-type size), by \
     library, operation and rank.",
);
pub(crate) const COLL_TIME: Desc = counter(
    "ethand_process_collective_seconds_total",
    "Host time inside the process's collective calls (enqueue time: NCCL returns before the \
     collective completes), by library, operation and rank.",
);
pub(crate) const RANK_INFO: Desc = gauge(
    "ethand_process_collective_rank_info",
    "Rank and communicator size of the process's largest communicator, value 1 \
     (ncclCommInitRank*, ncclCommInitAll, HcclCommInitRootInfo); rank=\"all\" when one \
     process drives every rank.",
);

pub(crate) const GPU_FAMILIES: &[Desc] = &[
    LAUNCHES, COPY_BYTES, COPY_CALLS, SYNC_TIME, SYNC_CALLS, MEM_LIVE, MEM_PEAK, MEM_ALLOCS,
    MEM_FREES, API_ERRORS, API_CALLS, COLL_CALLS, COLL_BYTES, COLL_TIME, RANK_INFO,
];

pub(crate) fn register_process_gpu(registry: &mut Exposition, procs: &[&ProcessSnapshot]) {
    let mut launches = Family::<u64>::new(&LAUNCHES);
    let mut copy_bytes = Family::<u64>::new(&COPY_BYTES);
    let mut copy_calls = Family::<u64>::new(&COPY_CALLS);
    let mut sync_time = Family::<Nanos>::new(&SYNC_TIME);
    let mut sync_calls = Family::<u64>::new(&SYNC_CALLS);
    let mut mem_live = Family::<u64>::new(&MEM_LIVE);
    let mut mem_peak = Family::<u64>::new(&MEM_PEAK);
    let mut mem_allocs = Family::<u64>::new(&MEM_ALLOCS);
    let mut mem_frees = Family::<u64>::new(&MEM_FREES);
    let mut errors = Family::<u64>::new(&API_ERRORS);
    let mut api_calls = Family::<u64>::new(&API_CALLS);
    let mut coll_calls = Family::<u64>::new(&COLL_CALLS);
    let mut coll_bytes = Family::<u64>::new(&COLL_BYTES);
    let mut coll_time = Family::<Nanos>::new(&COLL_TIME);
    let mut rank_info = Family::<u64>::new(&RANK_INFO);

    for (p, base) in procs.iter().zip(process_label_sets(procs)) {
        let Some(g) = &p.gpu else { continue };
        let id = |extra: &[(&'static str, &str)]| with_extra(&base, extra);
        // No series where launches were not counted (GPU level below `process`): never a 0.
        if let Some(n) = g.launches {
            launches.add(id(&[("kind", "kernel")]), n);
        }
        if let Some(n) = g.graph_launches.filter(|&n| n > 0) {
            launches.add(id(&[("kind", "graph")]), n);
        }
        for c in &g.copies {
            copy_bytes.add(id(&[("direction", c.direction.as_str())]), c.bytes);
            copy_calls.add(id(&[("direction", c.direction.as_str())]), c.calls);
        }
        sync_time.add(id(&[]), Nanos(g.sync.time_ns));
        sync_calls.add(id(&[]), g.sync.calls);
        for m in &g.memory {
            mem_live.add(id(&[("memory", m.kind.as_str())]), m.live_bytes);
            mem_peak.add(id(&[("memory", m.kind.as_str())]), m.peak_bytes);
            mem_allocs.add(id(&[("memory", m.kind.as_str())]), m.allocs);
            mem_frees.add(id(&[("memory", m.kind.as_str())]), m.frees);
        }
        let mut libs: Vec<&str> = g.symbols.iter().map(|s| s.library.as_str()).collect();
        libs.sort_unstable();
        libs.dedup();
        for lib in libs {
            let n = g
                .symbols
                .iter()
                .filter(|s| s.library == lib)
                .map(|s| s.errors)
                .sum();
            errors.add(id(&[("library", lib)]), n);
        }
        for s in &g.symbols {
            api_calls.add(
                id(&[
                    ("library", s.library.as_str()),
                    ("symbol", s.symbol.as_str()),
                ]),
                s.calls,
            );
        }
        let rank = match &g.comm {
            Some(c) => c.rank.map_or("all".to_string(), |r| r.to_string()),
            None => String::new(),
        };
        for c in &g.collectives {
            let l = id(&[
                ("library", c.library.as_str()),
                ("operation", c.operation.as_str()),
                ("rank", rank.as_str()),
            ]);
            coll_calls.add(l.clone(), c.calls);
            coll_bytes.add(l.clone(), c.bytes);
            coll_time.add(l, Nanos(c.time_ns));
        }
        if let Some(c) = &g.comm {
            let nranks = c.nranks.to_string();
            rank_info.add(
                id(&[
                    ("library", c.library.as_str()),
                    ("rank", rank.as_str()),
                    ("nranks", nranks.as_str()),
                ]),
                1,
            );
        }
    }
    launches.register(registry);
    copy_bytes.register(registry);
    copy_calls.register(registry);
    sync_time.register(registry);
    sync_calls.register(registry);
    mem_live.register(registry);
    mem_peak.register(registry);
    mem_allocs.register(registry);
    mem_frees.register(registry);
    errors.register(registry);
    api_calls.register(registry);
    coll_calls.register(registry);
    coll_bytes.register(registry);
    coll_time.register(registry);
    rank_info.register(registry);
}
