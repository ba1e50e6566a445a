//! Per-process GPU/NPU runtime series (uprobes on libcuda, libnccl, libascendcl, libhccl), for
//! the processes the selection picks; a process that made GPU/NPU runtime calls is always
//! picked (there are few: about one per accelerator). Labels are bounded by the symbol
//! catalog: direction (6), memory kind (4), library (4), operation (8), symbol (under 100).
use ethand_snapshot::ProcessSnapshot;
use ethand_snapshot::devices::xid_label;
use ethand_snapshot::gpu::GpuProcessStats;

use super::{
    Label, Metric, Num, Otel, OtelKind, OtelLabel, Per, Sample, Scope, Sink, Subject, counter,
    gauge, label, otel,
};

const COPY_DIRECTION: Label = label("direction", "ethand.gpu.copy.direction")
    .values("host_to_device, device_to_host, device_to_device, peer, default, host_to_host");
const MEMORY_KIND: Label = label("memory", "ethand.gpu.memory.kind")
    .values("device, managed, host_pinned, host_registered");
const GPU_LIBRARY: Label = label("library", "ethand.gpu.library");
const COLLECTIVE: &[Label] = &[
    label("library", "ethand.collective.library").values("nccl, hccl"),
    label("operation", "ethand.collective.operation"),
    label("rank", "ethand.collective.rank"),
];

/// The selected processes that made GPU/NPU runtime calls.
fn gpu_processes<'a>(
    s: &Scope<'a>,
) -> impl Iterator<Item = (Subject<'a>, &'a ProcessSnapshot, &'a GpuProcessStats)> {
    s.processes()
        .filter_map(|(id, p)| p.gpu.as_ref().map(|g| (id, p, g)))
}

/// The communicator rank of a process's collective series: "all" when one process drives
/// every rank, "" without a communicator.
fn rank(g: &GpuProcessStats) -> String {
    match &g.comm {
        Some(c) => c.rank.map_or("all".to_string(), |r| r.to_string()),
        None => String::new(),
    }
}

fn collectives(
    s: &Scope,
    o: &mut dyn Sink,
    value: fn(&ethand_snapshot::gpu::CollectiveStats) -> Sample<'static>,
) {
    for (id, _, g) in gpu_processes(s) {
        let rank = rank(g);
        for c in &g.collectives {
            o.sample(id, &[&c.library, &c.operation, &rank], value(c));
        }
    }
}

pub(crate) const METRICS: &[Metric] = &[
    Metric::new(
        counter(
            "ethand_process_gpu_launches_total",
            "Kernel launches (CUDA cuLaunchKernel*, kind=\"kernel\"), CUDA graph launches \
             (kind=\"graph\") and Ascend operator/model executions (kind=\"kernel\") by the process \
             (uprobes on libcuda, libascendcl); counted at GPU level process or op only, not at the \
             default level calls.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.launches", "{launch}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                // No series where launches were not counted (GPU level below `process`).
                if let Some(n) = g.launches {
                    o.sample(id, &["kernel"], Sample::Int(n));
                }
                if let Some(n) = g.graph_launches.filter(|&n| n > 0) {
                    o.sample(id, &["graph"], Sample::Int(n));
                }
            }
        },
    )
    .labels(&[label("kind", "ethand.gpu.launch.kind").values("kernel, graph")]),
    Metric::new(
        counter(
            "ethand_process_gpu_memcpy_bytes_total",
            "Bytes the process asked the runtime to copy, by direction (host_to_device, \
             device_to_host, device_to_device, peer, default = unified addressing, host_to_host) \
             (uprobes on cuMemcpy*, aclrtMemcpy*).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.memcpy.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for c in &g.copies {
                    o.sample(id, &[&c.direction], Sample::Int(c.bytes));
                }
            }
        },
    )
    .labels(&[COPY_DIRECTION]),
    Metric::new(
        counter(
            "ethand_process_gpu_memcpy_calls_total",
            "Copy calls of the process, by direction (uprobes on cuMemcpy*, aclrtMemcpy*).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.memcpy.calls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for c in &g.copies {
                    o.sample(id, &[&c.direction], Sample::Int(c.calls));
                }
            }
        },
    )
    .labels(&[COPY_DIRECTION]),
    Metric::new(
        counter(
            "ethand_process_gpu_sync_seconds_total",
            "Host time the process spent blocked in stream, context, event or device \
             synchronization (uprobe + uretprobe on cuStreamSynchronize, cuCtxSynchronize, \
             cuEventSynchronize, aclrtSynchronize*).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.sync.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                o.sample(id, &[], Sample::Nanos(g.sync.time_ns));
            }
        },
    ),
    Metric::new(
        counter(
            "ethand_process_gpu_sync_calls_total",
            "Synchronization calls of the process (uprobes on cu*Synchronize, aclrtSynchronize*).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.sync.calls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                o.sample(id, &[], Sample::Int(g.sync.calls));
            }
        },
    ),
    Metric::new(
        gauge(
            "ethand_process_gpu_memory_allocated_bytes",
            "Memory the process allocated through the runtime and has not freed, by kind (device, \
             managed, host_pinned, host_registered), counted since ethand attached (uprobes on \
             cuMemAlloc*, cuMemFree*, cuMemHostAlloc, aclrtMalloc, aclrtFree, ...).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.gpu.memory.allocated",
            "By",
            OtelKind::UpDownCounter,
            Num::Int,
        )),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for m in &g.memory {
                    o.sample(id, &[&m.kind], Sample::Int(m.live_bytes));
                }
            }
        },
    )
    .labels(&[MEMORY_KIND]),
    Metric::new(
        gauge(
            "ethand_process_gpu_memory_peak_bytes",
            "Highest ethand_process_gpu_memory_allocated_bytes seen, by kind.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.memory.peak", "By", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for m in &g.memory {
                    o.sample(id, &[&m.kind], Sample::Int(m.peak_bytes));
                }
            }
        },
    )
    .labels(&[MEMORY_KIND]),
    Metric::new(
        counter(
            "ethand_process_gpu_memory_allocations_total",
            "Successful runtime allocations of the process, by kind (uprobe + uretprobe on \
             cuMemAlloc*, cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister, aclrtMalloc*).",
        ),
        Per::Process,
        Otel::Metric(otel(
            "ethand.process.gpu.memory.allocations",
            "{allocation}",
            OtelKind::Counter,
            Num::Int,
        )),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for m in &g.memory {
                    o.sample(id, &[&m.kind], Sample::Int(m.allocs));
                }
            }
        },
    )
    .labels(&[MEMORY_KIND]),
    Metric::new(
        counter(
            "ethand_process_gpu_memory_frees_total",
            "Runtime frees of the process, by kind (uprobes on cuMemFree*, aclrtFree*).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.memory.frees", "{free}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for m in &g.memory {
                    o.sample(id, &[&m.kind], Sample::Int(m.frees));
                }
            }
        },
    )
    .labels(&[MEMORY_KIND]),
    Metric::new(
        counter(
            "ethand_process_gpu_api_errors_total",
            "Probed runtime calls of the process that returned an error status, by library.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.api.errors", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                let mut libraries: Vec<&str> =
                    g.symbols.iter().map(|s| s.library.as_str()).collect();
                libraries.sort_unstable();
                libraries.dedup();
                for library in libraries {
                    let errors = g
                        .symbols
                        .iter()
                        .filter(|s| s.library == library)
                        .map(|s| s.errors)
                        .sum();
                    o.sample(id, &[library], Sample::Int(errors));
                }
            }
        },
    )
    .labels(&[GPU_LIBRARY]),
    Metric::new(
        counter(
            "ethand_process_gpu_api_calls_total",
            "Calls of each probed runtime symbol by the process, by library and symbol (which \
             variants a framework really calls: _v2, Async, _ptsz, ...).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.api.calls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                for sym in &g.symbols {
                    o.sample(id, &[&sym.library, &sym.symbol], Sample::Int(sym.calls));
                }
            }
        },
    )
    .labels(&[GPU_LIBRARY, label("symbol", "ethand.gpu.symbol")]),
    Metric::new(
        counter(
            "ethand_process_collective_calls_total",
            "Collective and point-to-point calls of the process, by library (nccl, hccl), operation \
             and rank (uprobes on ncclAllReduce, ..., HcclAllReduce, ...).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.collective.calls", "{call}", OtelKind::Counter, Num::Int)),
        |s, o| collectives(s, o, |c| Sample::Int(c.calls)),
    )
    .labels(COLLECTIVE),
    Metric::new(
        counter(
            "ethand_process_collective_bytes_total",
            "Bytes of the process's collective calls (element count times data-type size), by \
             library, operation and rank.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.collective.io", "By", OtelKind::Counter, Num::Int)),
        |s, o| collectives(s, o, |c| Sample::Int(c.bytes)),
    )
    .labels(COLLECTIVE),
    Metric::new(
        counter(
            "ethand_process_collective_seconds_total",
            "Host time inside the process's collective calls (enqueue time: NCCL returns before the \
             collective completes), by library, operation and rank.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.collective.time", "s", OtelKind::Counter, Num::Float)),
        |s, o| collectives(s, o, |c| Sample::Nanos(c.time_ns)),
    )
    .labels(COLLECTIVE),
    // Over OTLP the communicator size is the point's value rather than a label.
    Metric::new(
        gauge(
            "ethand_process_collective_rank_info",
            "Rank and communicator size of the process's largest communicator, value 1 \
             (ncclCommInitRank*, ncclCommInitAll, HcclCommInitRootInfo); rank=\"all\" when one \
             process drives every rank.",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.collective.ranks", "{rank}", OtelKind::Gauge, Num::Int)),
        |s, o| {
            for (id, _, g) in gpu_processes(s) {
                let Some(c) = &g.comm else { continue };
                let nranks = c.nranks.to_string();
                o.sample(id, &[&c.library, &rank(g), &nranks], Sample::Int(1));
            }
        },
    )
    .labels(&[
        label("library", "ethand.collective.library"),
        label("rank", "ethand.collective.rank"),
        Label {
            otel: OtelLabel::PointValue,
            ..label("nranks", "")
        },
    ]),
    Metric::new(
        counter(
            "ethand_process_gpu_xid_events_total",
            "Critical XID events of a GPU the process held a compute context on when they happened, \
             by GPU and XID code (codes above 1023 as xid=\"other\"), since ethand started \
             watching; no series for a process without any (NVML event set, \
             nvmlEventTypeXidCriticalError, joined with nvmlDeviceGetComputeRunningProcesses).",
        ),
        Per::Process,
        Otel::Metric(otel("ethand.process.gpu.xid_events", "{event}", OtelKind::Counter, Num::Int)),
        |s, o| {
            for (id, p) in s.processes() {
                for x in &p.gpu_xid_events {
                    let xid = xid_label(x.xid);
                    o.sample(id, &[&x.device, &x.uuid, &xid], Sample::Int(x.count));
                }
            }
        },
    )
    .labels(&[
        label("gpu", "hw.name"),
        label("uuid", "hw.id"),
        super::devices::XID,
    ]),
];
