//! OTLP metrics export of the latest [`NodeSnapshot`] (gRPC or HTTP/protobuf), docs/otlp.md.
//!
//! Every metric is an asynchronous (observable) instrument of the OpenTelemetry SDK whose
//! callback reads the newest snapshot; a [`PeriodicReader`] collects them every interval with
//! cumulative temporality and hands the batch to [`RetryingExporter`], which wraps the OTLP
//! exporter of `opentelemetry-otlp`:
//! - a failed request is retried with exponential backoff (100 ms doubling, at most 5 s) as
//!   long as the next attempt still fits in 90 % of the export interval;
//! - a batch whose retries ran out is dropped and counted; counters are cumulative, so the next
//!   batch that gets through carries the totals again: a drop loses resolution, not totals;
//! - the reader exports synchronously on its own thread, so at most one batch exists at a time
//!   and nothing queues up while the endpoint is down: memory stays bounded.
//!
//! Names follow OpenTelemetry's semantic conventions where they have one (`process.cpu.time`,
//! `hw.gpu.utilization`, `hw.gpu.memory.usage`, ...) and `ethand.*` otherwise, with UCUM units.
//! [`METRICS`] is the one declaration of every exported metric: the instruments are built from
//! it and docs/otlp.md's table is generated from it ([`markdown_table`]); a test checks that
//! every Prometheus family is mapped or deliberately left out ([`NOT_EXPORTED`]).
//!
//! Per-process points exist for the same processes as Prometheus' per-process series
//! ([`ExportSelection`]: top N by CPU, GPU/NPU users, configured pids/comms/cgroups).
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, Meter, MeterProvider as _};
use opentelemetry_otlp::{
    MetricExporter, Protocol, RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

use crate::prometheus::top_syscalls;
use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{NodeSnapshot, OtlpStatus, ProbeState, ProcessSnapshot};

/// First retry delay; it doubles per retry up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }

    /// The endpoint used when none is configured.
    pub fn default_endpoint(self) -> &'static str {
        match self {
            Self::Grpc => "http://localhost:4317",
            Self::HttpProtobuf => "http://localhost:4318/v1/metrics",
        }
    }
}

/// What the daemon's `[otlp]` section resolves to.
#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// Empty: [`OtlpProtocol::default_endpoint`].
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub headers: BTreeMap<String, String>,
    pub interval: Duration,
    pub timeout: Duration,
    /// Override the built-in resource attributes.
    pub resource_attributes: BTreeMap<String, String>,
    /// `host.name`.
    pub host_name: String,
    /// `k8s.node.name`, when known.
    pub node_name: Option<String>,
    /// `service.version`.
    pub service_version: String,
    /// Which processes get per-process points (as for /metrics).
    pub selection: ExportSelection,
}

impl OtlpOptions {
    pub fn endpoint(&self) -> &str {
        if self.endpoint.is_empty() {
            self.protocol.default_endpoint()
        } else {
            &self.endpoint
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("building the OTLP exporter for {endpoint}: {message}")]
    Build { endpoint: String, message: String },
    #[error("shutting the OTLP exporter down: {0}")]
    Shutdown(String),
}

/// Export counters, shared by the exporter (writes) and the daemon (reads into `ethand status`).
#[derive(Debug, Default)]
pub struct OtlpStats {
    endpoint: String,
    protocol: &'static str,
    exports_ok: AtomicU64,
    exports_failed: AtomicU64,
    dropped_batches: AtomicU64,
    last_success_unix_ms: AtomicU64,
    last_export_duration_us: AtomicU64,
    last_error: Mutex<String>,
    /// The last batch was dropped: logged once per outage.
    failing: AtomicBool,
}

impl OtlpStats {
    pub fn status(&self) -> OtlpStatus {
        OtlpStatus {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol.to_owned(),
            exports_ok: self.exports_ok.load(Ordering::Relaxed),
            exports_failed: self.exports_failed.load(Ordering::Relaxed),
            dropped_batches: self.dropped_batches.load(Ordering::Relaxed),
            last_success_unix_ms: self.last_success_unix_ms.load(Ordering::Relaxed),
            last_error: self.last_error.lock().expect("lock").clone(),
            last_export_duration_us: self.last_export_duration_us.load(Ordering::Relaxed),
        }
    }
}

/// The running export: meter provider, periodic reader thread and the instruments.
pub struct OtlpExporter {
    provider: SdkMeterProvider,
    stats: Arc<OtlpStats>,
    final_flush: Arc<AtomicBool>,
    _instruments: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Builds the exporter and starts the reader thread; the first export happens one interval
    /// from now. `latest` returns the newest snapshot (cheap: an `Arc` clone). Call it from a
    /// plain thread or a Tokio `spawn_blocking` task: the exporter keeps its own small runtime.
    pub fn start(
        opts: OtlpOptions,
        latest: impl Fn() -> Arc<NodeSnapshot> + Send + Sync + 'static,
    ) -> Result<Self, OtlpError> {
        let stats = Arc::new(OtlpStats {
            endpoint: opts.endpoint().to_owned(),
            protocol: opts.protocol.as_str(),
            ..Default::default()
        });
        let source = Arc::new(Source {
            latest: Box::new(latest),
            selection: opts.selection.clone(),
            stats: stats.clone(),
            cache: Mutex::new(None),
        });
        let final_flush = Arc::new(AtomicBool::new(false));
        let exporter =
            RetryingExporter::new(&opts, stats.clone(), source.clone(), final_flush.clone())?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(opts.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource(&opts))
            .with_reader(reader)
            .build();
        let meter = provider.meter("ethand");
        let instruments = METRICS
            .iter()
            .map(|m| register(&meter, m, source.clone()))
            .collect();
        Ok(Self {
            provider,
            stats,
            final_flush,
            _instruments: instruments,
        })
    }

    pub fn stats(&self) -> Arc<OtlpStats> {
        self.stats.clone()
    }

    /// Exports once more (one attempt, at most the export timeout: no retries) and stops the
    /// reader thread. Blocks: call it from a plain thread or `spawn_blocking`.
    pub fn shutdown(self) -> Result<(), OtlpError> {
        self.final_flush.store(true, Ordering::Relaxed);
        self.provider
            .shutdown()
            .map_err(|e| OtlpError::Shutdown(e.to_string()))
    }
}

/// service.name, service.version, host.name, k8s.node.name, then the configured attributes.
fn resource(opts: &OtlpOptions) -> Resource {
    let mut attrs: BTreeMap<String, String> = BTreeMap::new();
    attrs.insert("service.name".into(), "ethand".into());
    attrs.insert("service.version".into(), opts.service_version.clone());
    if !opts.host_name.is_empty() {
        attrs.insert("host.name".into(), opts.host_name.clone());
    }
    if let Some(node) = opts.node_name.as_ref().filter(|n| !n.is_empty()) {
        attrs.insert("k8s.node.name".into(), node.clone());
    }
    for (k, v) in &opts.resource_attributes {
        attrs.insert(k.clone(), v.clone());
    }
    Resource::builder_empty()
        .with_attributes(attrs.into_iter().map(|(k, v)| KeyValue::new(k, v)))
        .build()
}

/// The newest snapshot and what every callback of one collection derives from it once.
struct Source {
    latest: Box<dyn Fn() -> Arc<NodeSnapshot> + Send + Sync>,
    selection: ExportSelection,
    stats: Arc<OtlpStats>,
    /// The view of the snapshot being collected; cleared after each export so that no old
    /// snapshot is kept alive between collections.
    cache: Mutex<Option<Arc<View>>>,
}

impl Source {
    fn view(&self) -> Arc<View> {
        let snap = (self.latest)();
        let mut cache = self.cache.lock().expect("lock");
        if let Some(v) = cache.as_ref()
            && Arc::ptr_eq(&v.snap, &snap)
        {
            return v.clone();
        }
        let v = Arc::new(View::new(snap, &self.selection, self.stats.status()));
        *cache = Some(v.clone());
        v
    }

    fn clear(&self) {
        *self.cache.lock().expect("lock") = None;
    }
}

/// One snapshot, its selected processes with their identity attributes, and export health.
pub struct View {
    snap: Arc<NodeSnapshot>,
    procs: Vec<(usize, Vec<KeyValue>)>,
    otlp: OtlpStatus,
}

impl View {
    fn new(snap: Arc<NodeSnapshot>, selection: &ExportSelection, otlp: OtlpStatus) -> Self {
        let procs = selection
            .indices(&snap.processes)
            .into_iter()
            .map(|i| (i, process_identity(&snap.processes[i])))
            .collect();
        Self { snap, procs, otlp }
    }

    fn each_proc(&self) -> impl Iterator<Item = (&ProcessSnapshot, &[KeyValue])> {
        self.procs
            .iter()
            .map(|(i, id)| (&self.snap.processes[*i], id.as_slice()))
    }
}

/// process.pid, process.executable.name, and the workload identity where known.
fn process_identity(p: &ProcessSnapshot) -> Vec<KeyValue> {
    let mut id = vec![
        KeyValue::new("process.pid", i64::from(p.pid)),
        KeyValue::new("process.executable.name", p.comm.clone()),
    ];
    if let Some(w) = &p.workload {
        workload_attributes(w, &mut id);
    }
    id
}

fn workload_attributes(w: &ethand_snapshot::WorkloadIdentity, out: &mut Vec<KeyValue>) {
    let pairs = [
        ("k8s.pod.name", &w.pod),
        ("k8s.namespace.name", &w.namespace),
        ("k8s.pod.uid", &w.pod_uid),
        ("k8s.container.name", &w.container),
        ("container.id", &w.container_id),
        ("ethand.job.id", &w.job_id),
    ];
    for (k, v) in pairs {
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            out.push(KeyValue::new(k, v.clone()));
        }
    }
    if let Some(r) = w.rank {
        out.push(KeyValue::new("ethand.rank", i64::from(r)));
    }
}

// ---------------------------------------------------------------------------------------------
// The metrics.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic cumulative sum.
    Counter,
    /// Non-monotonic cumulative sum (OTel's UpDownCounter), as the semantic conventions ask for
    /// hw.gpu.memory.*.
    UpDownCounter,
    Gauge,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::UpDownCounter => "updowncounter",
            Self::Gauge => "gauge",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Int,
    Float,
}

/// A value as observed: integers stay exact; nanoseconds become float seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    U(u64),
    F(f64),
}

impl V {
    fn merge(self, o: V) -> V {
        match (self, o) {
            (V::U(a), V::U(b)) => V::U(a.saturating_add(b)),
            (a, b) => V::F(a.f64() + b.f64()),
        }
    }
    pub fn f64(self) -> f64 {
        match self {
            V::U(v) => v as f64,
            V::F(v) => v,
        }
    }
    fn u64(self) -> u64 {
        match self {
            V::U(v) => v,
            V::F(v) => v.max(0.0) as u64,
        }
    }
}

fn secs(ns: u64) -> V {
    V::F(ns as f64 / 1e9)
}

/// Data points of one metric: attribute sets with their value. A set observed twice (pid
/// reuse within the exit grace period) is summed, as Prometheus does.
#[derive(Default)]
pub struct Points(BTreeMap<String, (Vec<KeyValue>, V)>);

impl Points {
    fn add(&mut self, attrs: Vec<KeyValue>, v: V) {
        let key = format!("{attrs:?}");
        match self.0.get_mut(&key) {
            Some((_, old)) => *old = old.merge(v),
            None => {
                self.0.insert(key, (attrs, v));
            }
        }
    }
    fn proc(&mut self, id: &[KeyValue], extra: &[(&'static str, &str)], v: V) {
        let mut attrs = id.to_vec();
        attrs.extend(extra.iter().map(|&(k, s)| KeyValue::new(k, s.to_owned())));
        self.add(attrs, v);
    }
    fn plain(&mut self, attrs: &[(&'static str, &str)], v: V) {
        self.add(
            attrs
                .iter()
                .map(|&(k, s)| KeyValue::new(k, s.to_owned()))
                .collect(),
            v,
        );
    }
    pub fn iter(&self) -> impl Iterator<Item = (&[KeyValue], V)> {
        self.0.values().map(|(a, v)| (a.as_slice(), *v))
    }
}

/// One exported metric.
pub struct MetricSpec {
    pub name: &'static str,
    /// UCUM.
    pub unit: &'static str,
    pub kind: Kind,
    num: Num,
    /// The Prometheus families it carries (comma-separated), as in docs/metrics.md.
    pub prometheus: &'static str,
    /// Attributes besides the process identity (per-process metrics) or the hw.* identity.
    pub attributes: &'static str,
    pub description: &'static str,
    observe: fn(&View, &mut Points),
}

impl MetricSpec {
    /// The data points this metric has in `view`.
    pub fn points(&self, view: &View) -> Points {
        let mut p = Points::default();
        (self.observe)(view, &mut p);
        p
    }
}

/// Prometheus families with no OTLP metric of their own, and why.
pub const NOT_EXPORTED: &[(&str, &str)] = &[
    (
        "ethand_build_info",
        "the version is the resource attribute service.version",
    ),
    (
        "ethand_gpu_info",
        "name, PCI bus id and driver are attributes (hw.model, ethand.pci_bus_id, \
         ethand.driver.version) of every hw.* point",
    ),
    (
        "ethand_npu_info",
        "as ethand_gpu_info, on the NPU's hw.* points",
    ),
    (
        "ethand_process_workload_info",
        "container, pod, job and rank are attributes of every per-process point",
    ),
    (
        "DCGM_FI_*",
        "dcgm-exporter aliases exist for existing Prometheus dashboards only",
    ),
];

const PROC: &str =
    "process.pid, process.executable.name, k8s.*, container.id, ethand.job.id, ethand.rank";
const HW: &str = "hw.id, hw.name, hw.type, hw.model, hw.vendor";

macro_rules! spec {
    ($name:expr, $unit:expr, $kind:ident, $num:ident, $prom:expr, $attrs:expr, $desc:expr, $f:expr) => {
        MetricSpec {
            name: $name,
            unit: $unit,
            kind: Kind::$kind,
            num: Num::$num,
            prometheus: $prom,
            attributes: $attrs,
            description: $desc,
            observe: $f,
        }
    };
}

/// Every metric the OTLP export carries; the single source of the instruments and the docs.
pub const METRICS: &[MetricSpec] = &[
    // --- per process: scheduler
    spec!(
        "process.cpu.time",
        "s",
        Counter,
        Float,
        "ethand_process_cpu_seconds_total",
        PROC,
        "Time the process's threads ran on a CPU: the kernel's own charge (sum_exec_runtime, as in /proc/PID/schedstat) (sched_switch).",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], secs(p.sched.oncpu_ns))
        }
    ),
    spec!(
        "ethand.process.offcpu.time",
        "s",
        Counter,
        Float,
        "ethand_process_offcpu_seconds_total",
        "ethand.offcpu.reason (blocked, preempted)",
        "Time the process's threads were off CPU, by how they left it.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(
                id,
                &[("ethand.offcpu.reason", "blocked")],
                secs(p.sched.offcpu_blocked_ns),
            );
            o.proc(
                id,
                &[("ethand.offcpu.reason", "preempted")],
                secs(p.sched.offcpu_preempted_ns),
            );
        }
    ),
    spec!(
        "ethand.process.runq.wait.time",
        "s",
        Counter,
        Float,
        "ethand_process_runq_wait_seconds (_sum)",
        "",
        "Time the process's threads waited runnable for a CPU.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], secs(p.sched.runq_wait_ns))
        }
    ),
    spec!(
        "ethand.process.runq.waits",
        "{wait}",
        Counter,
        Int,
        "ethand_process_runq_wait_seconds (_count)",
        "",
        "Waits of the process's threads for a CPU (the latency buckets are not exported over OTLP).",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], V::U(p.sched.runq_wait_hist.iter().sum()))
        }
    ),
    spec!(
        "process.context_switches",
        "{count}",
        Counter,
        Int,
        "ethand_process_context_switches_total",
        "process.context_switch_type (voluntary, involuntary)",
        "Context switches of the process's threads.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(
                id,
                &[("process.context_switch_type", "voluntary")],
                V::U(p.sched.voluntary_switches),
            );
            o.proc(
                id,
                &[("process.context_switch_type", "involuntary")],
                V::U(p.sched.involuntary_switches),
            );
        }
    ),
    spec!(
        "process.thread.count",
        "{thread}",
        Gauge,
        Int,
        "ethand_process_threads",
        "",
        "Live threads of the process.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(
                id,
                &[],
                V::U(p.threads.iter().filter(|t| t.alive).count() as u64),
            )
        }
    ),
    // --- per process: syscalls
    spec!(
        "ethand.process.syscalls",
        "{call}",
        Counter,
        Int,
        "ethand_process_syscalls_total",
        "ethand.syscall (8 with the most time, then \"other\")",
        "System calls made by the process.",
        |v, o| for (p, id) in v.each_proc() {
            for s in top_syscalls(p) {
                o.proc(id, &[("ethand.syscall", &s.name)], V::U(s.count))
            }
        }
    ),
    spec!(
        "ethand.process.syscall.errors",
        "{call}",
        Counter,
        Int,
        "ethand_process_syscall_errors_total",
        "ethand.syscall",
        "System calls of the process that returned an error.",
        |v, o| for (p, id) in v.each_proc() {
            for s in top_syscalls(p) {
                o.proc(id, &[("ethand.syscall", &s.name)], V::U(s.errors))
            }
        }
    ),
    spec!(
        "ethand.process.syscall.time",
        "s",
        Counter,
        Float,
        "ethand_process_syscall_seconds_total",
        "ethand.syscall",
        "Time the process spent in system calls.",
        |v, o| for (p, id) in v.each_proc() {
            for s in top_syscalls(p) {
                o.proc(id, &[("ethand.syscall", &s.name)], secs(s.time_ns))
            }
        }
    ),
    spec!(
        "ethand.process.syscall.blocking.calls",
        "{call}",
        Counter,
        Int,
        "ethand_process_syscall_latency_seconds (_count)",
        "ethand.syscall.class (read_write, futex, poll, sleep, io_uring, open_close_sync, net)",
        "Blocking system calls of the process by class (the latency buckets are not exported over OTLP).",
        |v, o| for (p, id) in v.each_proc() {
            for h in &p.syscalls.latency {
                o.proc(
                    id,
                    &[("ethand.syscall.class", &h.class)],
                    V::U(h.buckets.iter().sum()),
                )
            }
        }
    ),
    // --- per process: block and network
    spec!(
        "ethand.process.block.io",
        "By",
        Counter,
        Int,
        "ethand_process_block_io_bytes_total",
        "system.device, ethand.block.op (read, write, flush, discard, other)",
        "Bytes of the block I/O requests the process submitted, counted at completion.",
        |v, o| for (p, id) in v.each_proc() {
            for b in &p.block {
                o.proc(
                    id,
                    &[("system.device", device(b)), ("ethand.block.op", &b.op)],
                    V::U(b.bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.block.operations",
        "{operation}",
        Counter,
        Int,
        "ethand_process_block_io_operations_total",
        "system.device, ethand.block.op",
        "Block I/O requests the process submitted, counted at completion.",
        |v, o| for (p, id) in v.each_proc() {
            for b in &p.block {
                o.proc(
                    id,
                    &[("system.device", device(b)), ("ethand.block.op", &b.op)],
                    V::U(b.ops),
                )
            }
        }
    ),
    spec!(
        "process.network.io",
        "By",
        Counter,
        Int,
        "ethand_process_network_bytes_total",
        "network.transport (tcp, udp), network.io.direction (transmit, receive)",
        "Bytes the process's TCP and UDP sockets sent or received.",
        |v, o| for (p, id) in v.each_proc() {
            for (t, d, n) in net(&p.net) {
                o.proc(
                    id,
                    &[("network.transport", t), ("network.io.direction", d)],
                    V::U(n),
                )
            }
        }
    ),
    spec!(
        "ethand.process.tcp.retransmits",
        "{segment}",
        Counter,
        Int,
        "ethand_process_tcp_retransmits_total",
        "",
        "TCP segments retransmitted on the process's sockets.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], V::U(p.net.tcp_retransmits))
        }
    ),
    spec!(
        "ethand.process.tcp.connections.opened",
        "{connection}",
        Counter,
        Int,
        "ethand_process_tcp_connections_opened_total",
        "",
        "TCP connections the process opened that reached ESTABLISHED.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], V::U(p.net.tcp_active_opens))
        }
    ),
    spec!(
        "ethand.process.tcp.connections.closed",
        "{connection}",
        Counter,
        Int,
        "ethand_process_tcp_connections_closed_total",
        "",
        "TCP connections of the process that closed after being open.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(id, &[], V::U(p.net.tcp_closes))
        }
    ),
    spec!(
        "ethand.process.tcp.resets",
        "{reset}",
        Counter,
        Int,
        "ethand_process_tcp_resets_total",
        "network.io.direction (transmit = sent, receive = received)",
        "TCP resets the process's sockets sent or received.",
        |v, o| for (p, id) in v.each_proc() {
            o.proc(
                id,
                &[("network.io.direction", "transmit")],
                V::U(p.net.tcp_resets_sent),
            );
            o.proc(
                id,
                &[("network.io.direction", "receive")],
                V::U(p.net.tcp_resets_received),
            );
        }
    ),
    // --- per process: GPU/NPU runtimes (uprobes)
    spec!(
        "ethand.process.gpu.launches",
        "{launch}",
        Counter,
        Int,
        "ethand_process_gpu_launches_total",
        "ethand.gpu.launch.kind (kernel, graph)",
        "Kernel launches, CUDA graph launches and Ascend operator executions of the process.",
        // No point where launches were not counted (GPU level below `process`): never a 0.
        |v, o| for (p, id) in v.each_proc() {
            let Some(g) = &p.gpu else { continue };
            if let Some(n) = g.launches {
                o.proc(id, &[("ethand.gpu.launch.kind", "kernel")], V::U(n));
            }
            if let Some(n) = g.graph_launches.filter(|&n| n > 0) {
                o.proc(id, &[("ethand.gpu.launch.kind", "graph")], V::U(n))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memcpy.io",
        "By",
        Counter,
        Int,
        "ethand_process_gpu_memcpy_bytes_total",
        "ethand.gpu.copy.direction (host_to_device, device_to_host, device_to_device, peer, default, host_to_host)",
        "Bytes the process asked the runtime to copy.",
        |v, o| for (p, id) in v.each_proc() {
            for c in p.gpu.iter().flat_map(|g| &g.copies) {
                o.proc(
                    id,
                    &[("ethand.gpu.copy.direction", &c.direction)],
                    V::U(c.bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memcpy.calls",
        "{call}",
        Counter,
        Int,
        "ethand_process_gpu_memcpy_calls_total",
        "ethand.gpu.copy.direction",
        "Copy calls of the process.",
        |v, o| for (p, id) in v.each_proc() {
            for c in p.gpu.iter().flat_map(|g| &g.copies) {
                o.proc(
                    id,
                    &[("ethand.gpu.copy.direction", &c.direction)],
                    V::U(c.calls),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.sync.time",
        "s",
        Counter,
        Float,
        "ethand_process_gpu_sync_seconds_total",
        "",
        "Host time the process spent blocked in stream, context, event or device synchronization.",
        |v, o| for (p, id) in v.each_proc() {
            if let Some(g) = &p.gpu {
                o.proc(id, &[], secs(g.sync.time_ns))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.sync.calls",
        "{call}",
        Counter,
        Int,
        "ethand_process_gpu_sync_calls_total",
        "",
        "Synchronization calls of the process.",
        |v, o| for (p, id) in v.each_proc() {
            if let Some(g) = &p.gpu {
                o.proc(id, &[], V::U(g.sync.calls))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memory.allocated",
        "By",
        UpDownCounter,
        Int,
        "ethand_process_gpu_memory_allocated_bytes",
        "ethand.gpu.memory.kind (device, managed, host_pinned, host_registered)",
        "Memory the process allocated through the runtime and has not freed.",
        |v, o| for (p, id) in v.each_proc() {
            for m in p.gpu.iter().flat_map(|g| &g.memory) {
                o.proc(
                    id,
                    &[("ethand.gpu.memory.kind", &m.kind)],
                    V::U(m.live_bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memory.peak",
        "By",
        Gauge,
        Int,
        "ethand_process_gpu_memory_peak_bytes",
        "ethand.gpu.memory.kind",
        "Highest ethand.process.gpu.memory.allocated seen.",
        |v, o| for (p, id) in v.each_proc() {
            for m in p.gpu.iter().flat_map(|g| &g.memory) {
                o.proc(
                    id,
                    &[("ethand.gpu.memory.kind", &m.kind)],
                    V::U(m.peak_bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memory.allocations",
        "{allocation}",
        Counter,
        Int,
        "ethand_process_gpu_memory_allocations_total",
        "ethand.gpu.memory.kind",
        "Successful runtime allocations of the process.",
        |v, o| for (p, id) in v.each_proc() {
            for m in p.gpu.iter().flat_map(|g| &g.memory) {
                o.proc(id, &[("ethand.gpu.memory.kind", &m.kind)], V::U(m.allocs))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.memory.frees",
        "{free}",
        Counter,
        Int,
        "ethand_process_gpu_memory_frees_total",
        "ethand.gpu.memory.kind",
        "Runtime frees of the process.",
        |v, o| for (p, id) in v.each_proc() {
            for m in p.gpu.iter().flat_map(|g| &g.memory) {
                o.proc(id, &[("ethand.gpu.memory.kind", &m.kind)], V::U(m.frees))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.api.errors",
        "{call}",
        Counter,
        Int,
        "ethand_process_gpu_api_errors_total",
        "ethand.gpu.library",
        "Probed runtime calls of the process that returned an error status.",
        |v, o| for (p, id) in v.each_proc() {
            for s in p.gpu.iter().flat_map(|g| &g.symbols) {
                o.proc(id, &[("ethand.gpu.library", &s.library)], V::U(s.errors))
            }
        }
    ),
    spec!(
        "ethand.process.gpu.api.calls",
        "{call}",
        Counter,
        Int,
        "ethand_process_gpu_api_calls_total",
        "ethand.gpu.library, ethand.gpu.symbol",
        "Calls of each probed runtime symbol by the process.",
        |v, o| for (p, id) in v.each_proc() {
            for s in p.gpu.iter().flat_map(|g| &g.symbols) {
                o.proc(
                    id,
                    &[
                        ("ethand.gpu.library", &s.library),
                        ("ethand.gpu.symbol", &s.symbol),
                    ],
                    V::U(s.calls),
                )
            }
        }
    ),
    spec!(
        "ethand.process.collective.calls",
        "{call}",
        Counter,
        Int,
        "ethand_process_collective_calls_total",
        "ethand.collective.library (nccl, hccl), ethand.collective.operation, ethand.collective.rank",
        "Collective and point-to-point calls of the process.",
        |v, o| collectives(v, o, |c| V::U(c.calls))
    ),
    spec!(
        "ethand.process.collective.io",
        "By",
        Counter,
        Int,
        "ethand_process_collective_bytes_total",
        "as ethand.process.collective.calls",
        "Bytes of the process's collective calls (element count times data-type size).",
        |v, o| collectives(v, o, |c| V::U(c.bytes))
    ),
    spec!(
        "ethand.process.collective.time",
        "s",
        Counter,
        Float,
        "ethand_process_collective_seconds_total",
        "as ethand.process.collective.calls",
        "Host time inside the process's collective calls (enqueue time).",
        |v, o| collectives(v, o, |c| secs(c.time_ns))
    ),
    spec!(
        "ethand.process.collective.ranks",
        "{rank}",
        Gauge,
        Int,
        "ethand_process_collective_rank_info",
        "ethand.collective.library, ethand.collective.rank",
        "Size of the process's largest communicator; its rank is the attribute (\"all\": one process drives every rank).",
        |v, o| for (p, id) in v.each_proc() {
            let Some(c) = p.gpu.as_ref().and_then(|g| g.comm.as_ref()) else {
                continue;
            };
            let rank = c.rank.map_or("all".to_string(), |r| r.to_string());
            o.proc(
                id,
                &[
                    ("ethand.collective.library", &c.library),
                    ("ethand.collective.rank", &rank),
                ],
                V::U(u64::from(c.nranks)),
            )
        }
    ),
    // --- per process: what the device drivers report
    spec!(
        "ethand.process.gpu.memory.usage",
        "By",
        UpDownCounter,
        Int,
        "ethand_process_gpu_memory_bytes, ethand_process_npu_memory_bytes",
        "hw.id (device uuid, else gpu0/npu0), hw.name",
        "Device memory held by the process, per device, as the driver reports it (NVML, DCMI).",
        |v, o| for (p, id) in v.each_proc() {
            for d in &p.devices {
                o.proc(
                    id,
                    &[("hw.id", dev_id(d)), ("hw.name", &d.device)],
                    V::U(d.memory_used_bytes),
                )
            }
        }
    ),
    spec!(
        "ethand.process.gpu.utilization",
        "1",
        Gauge,
        Float,
        "ethand_process_gpu_utilization_ratio",
        "hw.id, hw.name",
        "Share of the device's SMs the process used in the driver's newest sample, 0-1.",
        |v, o| for (p, id) in v.each_proc() {
            for d in &p.devices {
                if let Some(u) = d.utilization_ratio {
                    o.proc(id, &[("hw.id", dev_id(d)), ("hw.name", &d.device)], V::F(u))
                }
            }
        }
    ),
    // --- per cgroup (every process, exited ones included)
    spec!(
        "ethand.cgroup.cpu.time",
        "s",
        Counter,
        Float,
        "ethand_cgroup_cpu_seconds_total",
        "ethand.cgroup, k8s.*",
        "CPU time of all the cgroup's processes, exited ones included.",
        |v, o| for c in &v.snap.cgroups {
            o.add(cg(c, &[]), secs(c.oncpu_ns))
        }
    ),
    spec!(
        "ethand.cgroup.offcpu.time",
        "s",
        Counter,
        Float,
        "ethand_cgroup_offcpu_seconds_total",
        "ethand.cgroup, k8s.*, ethand.offcpu.reason",
        "Off-CPU time, blocked or preempted, of all the cgroup's processes.",
        |v, o| for c in &v.snap.cgroups {
            o.add(
                cg(c, &[("ethand.offcpu.reason", "blocked")]),
                secs(c.offcpu_blocked_ns),
            );
            o.add(
                cg(c, &[("ethand.offcpu.reason", "preempted")]),
                secs(c.offcpu_preempted_ns),
            );
        }
    ),
    spec!(
        "ethand.cgroup.runq.wait.time",
        "s",
        Counter,
        Float,
        "ethand_cgroup_runq_wait_seconds_total",
        "ethand.cgroup, k8s.*",
        "Time all the cgroup's processes waited runnable for a CPU.",
        |v, o| for c in &v.snap.cgroups {
            o.add(cg(c, &[]), secs(c.runq_wait_ns))
        }
    ),
    spec!(
        "ethand.cgroup.syscalls",
        "{call}",
        Counter,
        Int,
        "ethand_cgroup_syscalls_total",
        "ethand.cgroup, k8s.*",
        "System calls of all the cgroup's processes.",
        |v, o| for c in &v.snap.cgroups {
            o.add(cg(c, &[]), V::U(c.syscalls))
        }
    ),
    spec!(
        "ethand.cgroup.syscall.time",
        "s",
        Counter,
        Float,
        "ethand_cgroup_syscall_seconds_total",
        "ethand.cgroup, k8s.*",
        "Time in system calls of all the cgroup's processes.",
        |v, o| for c in &v.snap.cgroups {
            o.add(cg(c, &[]), secs(c.syscall_time_ns))
        }
    ),
    spec!(
        "ethand.cgroup.block.io",
        "By",
        Counter,
        Int,
        "ethand_cgroup_block_io_bytes_total",
        "ethand.cgroup, k8s.*, ethand.block.op (read, write)",
        "Block I/O bytes of all the cgroup's processes.",
        |v, o| for c in &v.snap.cgroups {
            o.add(
                cg(c, &[("ethand.block.op", "read")]),
                V::U(c.block_read_bytes),
            );
            o.add(
                cg(c, &[("ethand.block.op", "write")]),
                V::U(c.block_write_bytes),
            );
        }
    ),
    spec!(
        "ethand.cgroup.network.io",
        "By",
        Counter,
        Int,
        "ethand_cgroup_network_bytes_total",
        "ethand.cgroup, k8s.*, network.transport, network.io.direction",
        "TCP and UDP bytes sent or received by all the cgroup's processes.",
        |v, o| for c in &v.snap.cgroups {
            for (t, d, n) in net(&c.net) {
                o.add(
                    cg(c, &[("network.transport", t), ("network.io.direction", d)]),
                    V::U(n),
                )
            }
        }
    ),
    spec!(
        "ethand.cgroup.processes",
        "{process}",
        Gauge,
        Int,
        "ethand_cgroup_processes",
        "ethand.cgroup, k8s.*",
        "Processes of the cgroup that ethand tracks now.",
        |v, o| for c in &v.snap.cgroups {
            o.add(cg(c, &[]), V::U(c.processes))
        }
    ),
    // --- per process name (every process, exited ones included)
    spec!(
        "ethand.comm.cpu.time",
        "s",
        Counter,
        Float,
        "ethand_comm_cpu_seconds_total",
        "process.executable.name",
        "CPU time of all processes with this name, exited ones included.",
        |v, o| for c in &v.snap.comms {
            o.plain(&[("process.executable.name", &c.comm)], secs(c.oncpu_ns))
        }
    ),
    spec!(
        "ethand.comm.runq.wait.time",
        "s",
        Counter,
        Float,
        "ethand_comm_runq_wait_seconds_total",
        "process.executable.name",
        "Time all processes with this name waited runnable for a CPU.",
        |v, o| for c in &v.snap.comms {
            o.plain(
                &[("process.executable.name", &c.comm)],
                secs(c.runq_wait_ns),
            )
        }
    ),
    spec!(
        "ethand.comm.syscalls",
        "{call}",
        Counter,
        Int,
        "ethand_comm_syscalls_total",
        "process.executable.name",
        "System calls of all processes with this name.",
        |v, o| for c in &v.snap.comms {
            o.plain(&[("process.executable.name", &c.comm)], V::U(c.syscalls))
        }
    ),
    spec!(
        "ethand.comm.processes",
        "{process}",
        Gauge,
        Int,
        "ethand_comm_processes",
        "process.executable.name",
        "Processes with this name that ethand tracks now.",
        |v, o| for c in &v.snap.comms {
            o.plain(&[("process.executable.name", &c.comm)], V::U(c.processes))
        }
    ),
    spec!(
        "ethand.comm.exited.processes",
        "{process}",
        Counter,
        Int,
        "ethand_comm_exited_processes_total",
        "process.executable.name",
        "Processes with this name that exited and left ethand's model.",
        |v, o| for c in &v.snap.comms {
            o.plain(&[("process.executable.name", &c.comm)], V::U(c.exited))
        }
    ),
    // --- node block I/O latency
    spec!(
        "ethand.block.io.queue.time",
        "s",
        Counter,
        Float,
        "ethand_block_io_queue_seconds (_sum)",
        "system.device, ethand.block.op",
        "Time block I/O requests waited between submission and dispatch, all processes (buckets not exported over OTLP).",
        |v, o| for b in &v.snap.block_devices {
            o.plain(
                &[("system.device", device(b)), ("ethand.block.op", &b.op)],
                secs(b.queue_ns),
            )
        }
    ),
    spec!(
        "ethand.block.io.service.time",
        "s",
        Counter,
        Float,
        "ethand_block_io_service_seconds (_sum)",
        "system.device, ethand.block.op",
        "Time the device took to complete block I/O requests, all processes (buckets not exported over OTLP).",
        |v, o| for b in &v.snap.block_devices {
            o.plain(
                &[("system.device", device(b)), ("ethand.block.op", &b.op)],
                secs(b.service_ns),
            )
        }
    ),
    spec!(
        "ethand.block.io.requests",
        "{request}",
        Counter,
        Int,
        "ethand_block_io_queue_seconds (_count), ethand_block_io_service_seconds (_count)",
        "system.device, ethand.block.op",
        "Completed block I/O requests, all processes.",
        |v, o| for b in &v.snap.block_devices {
            o.plain(
                &[("system.device", device(b)), ("ethand.block.op", &b.op)],
                V::U(b.service_hist.iter().sum()),
            )
        }
    ),
    // --- devices (NVML, DCMI)
    spec!(
        "ethand.device.collector.up",
        "1",
        Gauge,
        Int,
        "ethand_device_collector_up",
        "ethand.collector (nvml, dcmi)",
        "1 when the device collector's library is loaded and its last collection succeeded.",
        |v, o| for c in &v.snap.devices.collectors {
            o.plain(
                &[("ethand.collector", &c.name)],
                V::U(u64::from(
                    c.state == ethand_snapshot::devices::CollectorState::Available,
                )),
            )
        }
    ),
    spec!(
        "hw.gpu.utilization",
        "1",
        Gauge,
        Float,
        "ethand_gpu_utilization_ratio, ethand_npu_aicore_utilization_ratio",
        HW,
        "Share of the last sample period in which a kernel ran (GPU) or AI-core utilization (NPU), 0-1.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.utilization_ratio {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.aicore_utilization_ratio {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.memory.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_memory_utilization_ratio, ethand_npu_hbm_bandwidth_utilization_ratio",
        HW,
        "Share of time device memory was read or written (GPU) or HBM bandwidth utilization (NPU), 0-1.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_utilization_ratio {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_bandwidth_utilization_ratio {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    // GPM (Hopper and newer): no points where unsupported or not yet measured.
    spec!(
        "ethand.gpu.sm.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_sm_activity_ratio",
        HW,
        "Share of time the SMs had at least one warp assigned, averaged over the SMs, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_activity_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.sm.occupancy",
        "1",
        Gauge,
        Float,
        "ethand_gpu_sm_occupancy_ratio",
        HW,
        "Resident warps as a share of the most the SMs can hold, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_occupancy_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.tensor.activity",
        "1",
        Gauge,
        Float,
        "ethand_gpu_tensor_activity_ratio",
        HW,
        "Share of time the tensor pipes (any precision) were busy, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.tensor_activity_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.memory.bandwidth.utilization",
        "1",
        Gauge,
        Float,
        "ethand_gpu_dram_bandwidth_ratio",
        HW,
        "GPU memory (DRAM) bandwidth used as a share of its peak, over the last device interval, 0-1 (NVML GPM; Hopper and newer).",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.dram_bandwidth_ratio {
                o.add(gpu_hw(g, &[]), V::F(x))
            }
        }
    ),
    spec!(
        "hw.gpu.memory.usage",
        "By",
        UpDownCounter,
        Int,
        "ethand_gpu_memory_used_bytes, ethand_npu_hbm_used_bytes",
        HW,
        "Device memory in use.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_used_bytes {
                    o.add(gpu_hw(g, &[]), V::U(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_used_bytes {
                    o.add(npu_hw(n, &[]), V::U(x))
                }
            }
        }
    ),
    spec!(
        "hw.gpu.memory.limit",
        "By",
        UpDownCounter,
        Int,
        "ethand_gpu_memory_total_bytes, ethand_npu_hbm_total_bytes",
        HW,
        "Installed device memory.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.memory_total_bytes {
                    o.add(gpu_hw(g, &[]), V::U(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.hbm_total_bytes {
                    o.add(npu_hw(n, &[]), V::U(x))
                }
            }
        }
    ),
    spec!(
        "hw.power",
        "W",
        Gauge,
        Float,
        "ethand_gpu_power_watts, ethand_npu_power_watts",
        HW,
        "Power draw of the device.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.power_watts {
                    o.add(gpu_hw(g, &[]), V::F(x))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.power_watts {
                    o.add(npu_hw(n, &[]), V::F(x))
                }
            }
        }
    ),
    spec!(
        "hw.energy",
        "J",
        Counter,
        Float,
        "ethand_gpu_energy_joules_total",
        HW,
        "Energy the GPU used since the driver was loaded.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.energy_millijoules {
                o.add(gpu_hw(g, &[]), V::F(x as f64 / 1e3))
            }
        }
    ),
    spec!(
        "hw.temperature",
        "Cel",
        Gauge,
        Float,
        "ethand_gpu_temperature_celsius, ethand_npu_temperature_celsius, ethand_npu_hbm_temperature_celsius",
        "hw.*, hw.sensor_location (core, hbm)",
        "Temperature of the device's core, or of an NPU's HBM.",
        |v, o| {
            for g in &v.snap.devices.gpus {
                if let Some(x) = g.temperature_celsius {
                    o.add(gpu_hw(g, &[("hw.sensor_location", "core")]), V::F(x as f64))
                }
            }
            for n in &v.snap.devices.npus {
                if let Some(x) = n.temperature_celsius {
                    o.add(npu_hw(n, &[("hw.sensor_location", "core")]), V::F(x as f64))
                }
                if let Some(x) = n.hbm_temperature_celsius {
                    o.add(npu_hw(n, &[("hw.sensor_location", "hbm")]), V::F(x as f64))
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.clock.sm",
        "Hz",
        Gauge,
        Int,
        "ethand_gpu_sm_clock_hertz",
        HW,
        "Current SM clock.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.sm_clock_hertz {
                o.add(gpu_hw(g, &[]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.clock.memory",
        "Hz",
        Gauge,
        Int,
        "ethand_gpu_memory_clock_hertz",
        HW,
        "Current memory clock.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.memory_clock_hertz {
                o.add(gpu_hw(g, &[]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.pcie.throughput",
        "By/s",
        Gauge,
        Int,
        "ethand_gpu_pcie_tx_bytes_per_second, ethand_gpu_pcie_rx_bytes_per_second",
        "hw.*, network.io.direction (transmit = GPU to host, receive)",
        "PCIe throughput over NVML's last 20 ms sample.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.pcie_tx_bytes_per_second {
                o.add(gpu_hw(g, &[("network.io.direction", "transmit")]), V::U(x))
            }
            if let Some(x) = g.pcie_rx_bytes_per_second {
                o.add(gpu_hw(g, &[("network.io.direction", "receive")]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.nvlink.io",
        "By",
        Counter,
        Int,
        "ethand_gpu_nvlink_bytes_total",
        "hw.*, ethand.nvlink, network.io.direction",
        "Payload bytes sent or received over each active NVLink since the driver was loaded.",
        |v, o| for g in &v.snap.devices.gpus {
            for l in &g.nvlinks {
                let link = l.link.to_string();
                if let Some(x) = l.tx_bytes {
                    o.add(
                        gpu_hw(
                            g,
                            &[
                                ("ethand.nvlink", &link),
                                ("network.io.direction", "transmit"),
                            ],
                        ),
                        V::U(x),
                    )
                }
                if let Some(x) = l.rx_bytes {
                    o.add(
                        gpu_hw(
                            g,
                            &[
                                ("ethand.nvlink", &link),
                                ("network.io.direction", "receive"),
                            ],
                        ),
                        V::U(x),
                    )
                }
            }
        }
    ),
    spec!(
        "ethand.gpu.nvlink.errors",
        "{error}",
        Counter,
        Int,
        "ethand_gpu_nvlink_errors_total",
        "hw.*, ethand.nvlink, error.type (replay, recovery, crc_flit, crc_data)",
        "NVLink data link errors.",
        |v, o| for g in &v.snap.devices.gpus {
            for l in &g.nvlinks {
                let link = l.link.to_string();
                for (t, x) in [
                    ("replay", l.replay_errors),
                    ("recovery", l.recovery_errors),
                    ("crc_flit", l.crc_flit_errors),
                    ("crc_data", l.crc_data_errors),
                ] {
                    if let Some(x) = x {
                        o.add(
                            gpu_hw(g, &[("ethand.nvlink", &link), ("error.type", t)]),
                            V::U(x),
                        )
                    }
                }
            }
        }
    ),
    spec!(
        "hw.errors",
        "{error}",
        Counter,
        Int,
        "ethand_gpu_ecc_errors_total, ethand_gpu_xid_errors_total",
        "hw.*, error.type (ecc_corrected, ecc_uncorrected, xid)",
        "GPU memory ECC errors since the driver was loaded; critical XID events since ethand started watching.",
        |v, o| for g in &v.snap.devices.gpus {
            if let Some(x) = g.ecc_corrected_errors {
                o.add(gpu_hw(g, &[("error.type", "ecc_corrected")]), V::U(x))
            }
            if let Some(x) = g.ecc_uncorrected_errors {
                o.add(gpu_hw(g, &[("error.type", "ecc_uncorrected")]), V::U(x))
            }
            if let Some(x) = g.xid_errors {
                o.add(gpu_hw(g, &[("error.type", "xid")]), V::U(x))
            }
        }
    ),
    spec!(
        "ethand.gpu.throttle",
        "1",
        Gauge,
        Int,
        "ethand_gpu_throttle_reason",
        "hw.*, ethand.throttle.reason",
        "1 for each clock throttle reason active now, 0 for the others.",
        |v, o| for g in &v.snap.devices.gpus {
            let Some(active) = &g.throttle_reasons else {
                continue;
            };
            for r in ethand_snapshot::devices::THROTTLE_REASONS {
                o.add(
                    gpu_hw(g, &[("ethand.throttle.reason", r)]),
                    V::U(u64::from(active.iter().any(|a| a == r))),
                )
            }
        }
    ),
    spec!(
        "ethand.npu.health",
        "1",
        Gauge,
        Int,
        "ethand_npu_health",
        HW,
        "DCMI health: 0 normal, 1 minor, 2 major, 3 critical alarm.",
        |v, o| for n in &v.snap.devices.npus {
            if let Some(x) = n.health {
                o.add(npu_hw(n, &[]), V::U(u64::from(x)))
            }
        }
    ),
    // --- ethand itself
    spec!(
        "ethand.probe.state",
        "1",
        Gauge,
        Int,
        "ethand_probe_state",
        "ethand.probe, ethand.probe.state (attached, unsupported, disabled, failed, waiting)",
        "1 for each probe's current state, 0 for the others.",
        |v, o| for p in &v.snap.ethand.probes {
            for s in [
                ProbeState::Attached,
                ProbeState::Unsupported,
                ProbeState::Disabled,
                ProbeState::Failed,
                ProbeState::Waiting,
            ] {
                o.plain(
                    &[
                        ("ethand.probe", &p.name),
                        ("ethand.probe.state", s.as_str()),
                    ],
                    V::U(u64::from(p.state == s)),
                )
            }
        }
    ),
    spec!(
        "ethand.bpf.program.runs",
        "{run}",
        Counter,
        Int,
        "ethand_bpf_program_runs_total",
        "ethand.bpf.program",
        "Runs of each BPF program while the kernel's BPF statistics were on.",
        |v, o| for p in &v.snap.ethand.programs {
            o.plain(&[("ethand.bpf.program", &p.name)], V::U(p.run_count))
        }
    ),
    spec!(
        "ethand.bpf.program.time",
        "s",
        Counter,
        Float,
        "ethand_bpf_program_run_seconds_total",
        "ethand.bpf.program",
        "Time spent running each BPF program while the kernel's BPF statistics were on.",
        |v, o| for p in &v.snap.ethand.programs {
            o.plain(&[("ethand.bpf.program", &p.name)], secs(p.run_time_ns))
        }
    ),
    spec!(
        "ethand.bpf.stats.enabled.time",
        "s",
        Counter,
        Float,
        "ethand_bpf_stats_enabled_seconds_total",
        "",
        "Time the kernel's BPF run-time statistics were on.",
        |v, o| o.plain(&[], V::F(v.snap.ethand.bpf_stats_enabled_ms as f64 / 1e3))
    ),
    spec!(
        "ethand.bpf.map.entries",
        "{entry}",
        Gauge,
        Int,
        "ethand_bpf_map_entries",
        "ethand.bpf.map",
        "Entries in each BPF map.",
        |v, o| for m in &v.snap.ethand.maps {
            o.plain(&[("ethand.bpf.map", &m.name)], V::U(m.entries))
        }
    ),
    spec!(
        "ethand.bpf.map.capacity",
        "{entry}",
        Gauge,
        Int,
        "ethand_bpf_map_capacity_entries",
        "ethand.bpf.map",
        "Maximum entries of each BPF map.",
        |v, o| for m in &v.snap.ethand.maps {
            o.plain(&[("ethand.bpf.map", &m.name)], V::U(m.capacity))
        }
    ),
    spec!(
        "ethand.bpf.dropped_events",
        "{event}",
        Counter,
        Int,
        "ethand_bpf_dropped_events_total",
        "ethand.drop.reason, ethand.drop.loss (true, false)",
        "Events ethand could not account (map full, ring buffer full, wakeup slot taken); loss=false marks informational cases: mismatches and events the kernel did not report.",
        |v, o| for d in &v.snap.ethand.dropped {
            o.plain(
                &[
                    ("ethand.drop.reason", &d.reason),
                    ("ethand.drop.loss", if d.loss { "true" } else { "false" }),
                ],
                V::U(d.count),
            )
        }
    ),
    spec!(
        "ethand.self.cpu.time",
        "s",
        Counter,
        Float,
        "ethand_self_cpu_seconds_total",
        "",
        "CPU time used by the ethand daemon, user and system.",
        |v, o| o.plain(&[], V::F(v.snap.ethand.cpu_seconds))
    ),
    spec!(
        "ethand.self.memory.usage",
        "By",
        Gauge,
        Int,
        "ethand_self_resident_memory_bytes",
        "",
        "Resident memory of the ethand daemon.",
        |v, o| o.plain(&[], V::U(v.snap.ethand.rss_bytes))
    ),
    spec!(
        "ethand.tracked_processes",
        "{process}",
        Gauge,
        Int,
        "ethand_tracked_processes",
        "",
        "Processes in ethand's model, exited ones within the grace period included.",
        |v, o| o.plain(&[], V::U(v.snap.ethand.tracked_processes))
    ),
    spec!(
        "ethand.processes.overflow",
        "{process}",
        Counter,
        Int,
        "ethand_processes_overflow_total",
        "",
        "Processes ethand did not track because its model was full.",
        |v, o| o.plain(&[], V::U(v.snap.ethand.processes_overflow))
    ),
    spec!(
        "ethand.otlp.exports",
        "{request}",
        Counter,
        Int,
        "ethand_otlp_exports_total",
        "ethand.otlp.result (ok, failed)",
        "OTLP export requests by outcome (each retry counts); as of the previous export.",
        |v, o| {
            o.plain(&[("ethand.otlp.result", "ok")], V::U(v.otlp.exports_ok));
            o.plain(
                &[("ethand.otlp.result", "failed")],
                V::U(v.otlp.exports_failed),
            );
        }
    ),
    spec!(
        "ethand.otlp.dropped_batches",
        "{batch}",
        Counter,
        Int,
        "ethand_otlp_dropped_batches_total",
        "",
        "OTLP batches given up after their retries ran out of time.",
        |v, o| o.plain(&[], V::U(v.otlp.dropped_batches))
    ),
    spec!(
        "ethand.otlp.export.duration",
        "s",
        Gauge,
        Float,
        "ethand_otlp_last_export_duration_seconds",
        "",
        "How long the last successful export request took (encode, send, answer); as of the \
         previous export.",
        |v, o| o.plain(&[], V::F(v.otlp.last_export_duration_us as f64 / 1e6))
    ),
    spec!(
        "ethand.server.connections",
        "{connection}",
        Gauge,
        Int,
        "ethand_server_connections",
        "ethand.server (metrics, api)",
        "Connections open to ethand's servers (/metrics, the local API).",
        |v, o| for c in &v.snap.ethand.servers {
            o.plain(&[("ethand.server", c.server.as_str())], V::U(c.open));
        }
    ),
    spec!(
        "ethand.server.connections.refused",
        "{connection}",
        Counter,
        Int,
        "ethand_server_connections_refused_total",
        "ethand.server, ethand.reason (limit, peer_limit)",
        "Connections closed at once: the server, or that peer (address and local user), had its cap open.",
        |v, o| for c in &v.snap.ethand.servers {
            let s = c.server.as_str();
            o.plain(
                &[("ethand.server", s), ("ethand.reason", "limit")],
                V::U(c.refused_limit),
            );
            o.plain(
                &[("ethand.server", s), ("ethand.reason", "peer_limit")],
                V::U(c.refused_peer_limit),
            );
        }
    ),
    spec!(
        "ethand.server.connections.timed_out",
        "{connection}",
        Counter,
        Int,
        "ethand_server_connections_timed_out_total",
        "ethand.server",
        "Connections closed for sending a request too slowly, idling, or not reading a reply.",
        |v, o| for c in &v.snap.ethand.servers {
            o.plain(&[("ethand.server", c.server.as_str())], V::U(c.timed_out));
        }
    ),
    spec!(
        "ethand.server.accept_errors",
        "{error}",
        Counter,
        Int,
        "ethand_server_accept_errors_total",
        "ethand.server",
        "accept(2) failures of ethand's servers (out of descriptors, say), each followed by a pause.",
        |v, o| for c in &v.snap.ethand.servers {
            o.plain(
                &[("ethand.server", c.server.as_str())],
                V::U(c.accept_errors),
            );
        }
    ),
];

fn device(b: &ethand_snapshot::BlockStats) -> &str {
    if b.device_name.is_empty() {
        &b.device
    } else {
        &b.device_name
    }
}

fn net(n: &ethand_snapshot::NetStats) -> [(&'static str, &'static str, u64); 4] {
    [
        ("tcp", "transmit", n.tcp_tx_bytes),
        ("tcp", "receive", n.tcp_rx_bytes),
        ("udp", "transmit", n.udp_tx_bytes),
        ("udp", "receive", n.udp_rx_bytes),
    ]
}

fn dev_id(d: &ethand_snapshot::gpu::ProcessDeviceUsage) -> &str {
    if d.uuid.is_empty() {
        &d.device
    } else {
        &d.uuid
    }
}

fn collectives(v: &View, o: &mut Points, f: fn(&ethand_snapshot::gpu::CollectiveStats) -> V) {
    for (p, id) in v.each_proc() {
        let Some(g) = &p.gpu else { continue };
        let rank = match &g.comm {
            Some(c) => c.rank.map_or("all".to_string(), |r| r.to_string()),
            None => String::new(),
        };
        for c in &g.collectives {
            o.proc(
                id,
                &[
                    ("ethand.collective.library", &c.library),
                    ("ethand.collective.operation", &c.operation),
                    ("ethand.collective.rank", &rank),
                ],
                f(c),
            );
        }
    }
}

fn cg(c: &ethand_snapshot::CgroupSnapshot, extra: &[(&'static str, &str)]) -> Vec<KeyValue> {
    let mut a = vec![KeyValue::new("ethand.cgroup", c.cgroup.clone())];
    if let Some(w) = &c.workload {
        workload_attributes(w, &mut a);
    }
    a.extend(extra.iter().map(|&(k, s)| KeyValue::new(k, s.to_owned())));
    a
}

/// The hw.* identity of one device (GPU or NPU), then `extra`.
#[allow(clippy::too_many_arguments)] // one call per device kind, all fields named there
fn hw(
    id: &str,
    name: String,
    kind: &'static str,
    model: &str,
    vendor: &'static str,
    pci: &str,
    driver: &str,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("hw.id", id.to_owned()),
        KeyValue::new("hw.name", name),
        KeyValue::new("hw.type", kind),
        KeyValue::new("hw.vendor", vendor),
    ];
    for (k, v) in [
        ("hw.model", model),
        ("ethand.pci_bus_id", pci),
        ("ethand.driver.version", driver),
    ] {
        if !v.is_empty() {
            a.push(KeyValue::new(k, v.to_owned()));
        }
    }
    a.extend(extra.iter().map(|&(k, s)| KeyValue::new(k, s.to_owned())));
    a
}

fn gpu_hw(
    g: &ethand_snapshot::devices::GpuDevice,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let label = g.label();
    let id = if g.uuid.is_empty() {
        label.clone()
    } else {
        g.uuid.clone()
    };
    hw(
        &id,
        label,
        "gpu",
        &g.name,
        "NVIDIA",
        &g.pci_bus_id,
        &g.driver_version,
        extra,
    )
}

fn npu_hw(
    n: &ethand_snapshot::devices::NpuDevice,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
    let label = n.label();
    let id = if n.uuid.is_empty() {
        label.clone()
    } else {
        n.uuid.clone()
    };
    hw(
        &id,
        label,
        "npu",
        &n.name,
        "Huawei",
        &n.pci_bus_id,
        &n.driver_version,
        extra,
    )
}

/// Builds the observable instrument of `m`; its callback reads the current view.
fn register(
    meter: &Meter,
    m: &'static MetricSpec,
    source: Arc<Source>,
) -> Box<dyn Any + Send + Sync> {
    let points = move || m.points(&source.view());
    match (m.kind, m.num) {
        (Kind::Counter, Num::Int) => Box::new(
            meter
                .u64_observable_counter(m.name)
                .with_unit(m.unit)
                .with_description(m.description)
                .with_callback(move |o: &dyn AsyncInstrument<u64>| {
                    for (a, v) in points().iter() {
                        o.observe(v.u64(), a)
                    }
                })
                .build(),
        ),
        (Kind::Counter, Num::Float) => Box::new(
            meter
                .f64_observable_counter(m.name)
                .with_unit(m.unit)
                .with_description(m.description)
                .with_callback(move |o: &dyn AsyncInstrument<f64>| {
                    for (a, v) in points().iter() {
                        o.observe(v.f64(), a)
                    }
                })
                .build(),
        ),
        (Kind::UpDownCounter, _) => Box::new(
            meter
                .i64_observable_up_down_counter(m.name)
                .with_unit(m.unit)
                .with_description(m.description)
                .with_callback(move |o: &dyn AsyncInstrument<i64>| {
                    for (a, v) in points().iter() {
                        o.observe(i64::try_from(v.u64()).unwrap_or(i64::MAX), a)
                    }
                })
                .build(),
        ),
        (Kind::Gauge, Num::Int) => Box::new(
            meter
                .u64_observable_gauge(m.name)
                .with_unit(m.unit)
                .with_description(m.description)
                .with_callback(move |o: &dyn AsyncInstrument<u64>| {
                    for (a, v) in points().iter() {
                        o.observe(v.u64(), a)
                    }
                })
                .build(),
        ),
        (Kind::Gauge, Num::Float) => Box::new(
            meter
                .f64_observable_gauge(m.name)
                .with_unit(m.unit)
                .with_description(m.description)
                .with_callback(move |o: &dyn AsyncInstrument<f64>| {
                    for (a, v) in points().iter() {
                        o.observe(v.f64(), a)
                    }
                })
                .build(),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Export with retries.

/// The OTLP exporter of `opentelemetry-otlp` (its own retries off), retried here with
/// exponential backoff within the export interval, on a runtime of its own.
pub struct RetryingExporter {
    inner: MetricExporter,
    /// A current-thread runtime: every export drives it from the reader thread, so the daemon's
    /// runtime (and its shutdown) never matters to the export.
    rt: Option<tokio::runtime::Runtime>,
    stats: Arc<OtlpStats>,
    source: Arc<Source>,
    final_flush: Arc<AtomicBool>,
    /// Retries stop when the next attempt would end after this much time from the first.
    budget: Duration,
    timeout: Duration,
}

impl std::fmt::Debug for RetryingExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryingExporter")
            .field("budget", &self.budget)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RetryingExporter {
    fn new(
        opts: &OtlpOptions,
        stats: Arc<OtlpStats>,
        source: Arc<Source>,
        final_flush: Arc<AtomicBool>,
    ) -> Result<Self, OtlpError> {
        let endpoint = opts.endpoint().to_owned();
        let err = |message: String| OtlpError::Build {
            endpoint: endpoint.clone(),
            message,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(e.to_string()))?;
        // tonic's channel spawns its worker on the runtime that is current when it is built.
        let _enter = rt.enter();
        let inner = match opts.protocol {
            OtlpProtocol::Grpc => {
                let mut headers = http::HeaderMap::new();
                for (k, v) in &opts.headers {
                    let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|e| err(format!("header {k}: {e}")))?;
                    let value = http::HeaderValue::from_str(v)
                        .map_err(|e| err(format!("header {k}: {e}")))?;
                    headers.insert(name, value);
                }
                MetricExporter::builder()
                    .with_temporality(Temporality::Cumulative)
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout(opts.timeout)
                    .with_metadata(
                        opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(
                            headers,
                        ),
                    )
                    .with_retry_policy(RetryPolicy::disabled())
                    .build()
            }
            OtlpProtocol::HttpProtobuf => MetricExporter::builder()
                .with_temporality(Temporality::Cumulative)
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint.clone())
                .with_timeout(opts.timeout)
                .with_headers(opts.headers.clone().into_iter().collect::<HashMap<_, _>>())
                .with_retry_policy(RetryPolicy::disabled())
                .build(),
        }
        .map_err(|e| err(e.to_string()))?;
        drop(_enter);
        Ok(Self {
            inner,
            rt: Some(rt),
            stats,
            source,
            final_flush,
            budget: opts.interval.mul_f64(0.9),
            timeout: opts.timeout,
        })
    }

    fn export_blocking(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        // The callbacks have run: the view of this collection is no longer needed.
        self.source.clear();
        let rt = self.rt.as_ref().expect("runtime lives until drop");
        let final_flush = self.final_flush.load(Ordering::Relaxed);
        let start = Instant::now();
        let mut delay = INITIAL_BACKOFF;
        loop {
            let left = if final_flush {
                self.timeout
            } else {
                self.budget.saturating_sub(start.elapsed())
            };
            let attempt = self.timeout.min(left).max(Duration::from_millis(1));
            let attempt_start = Instant::now();
            let result = rt.block_on(async {
                match tokio::time::timeout(attempt, self.inner.export(metrics)).await {
                    Ok(r) => r,
                    Err(_) => Err(OTelSdkError::Timeout(attempt)),
                }
            });
            match result {
                Ok(()) => {
                    let took = attempt_start.elapsed().as_micros().max(1);
                    self.stats
                        .last_export_duration_us
                        .store(took as u64, Ordering::Relaxed);
                    self.stats.exports_ok.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .last_success_unix_ms
                        .store(unix_ms(), Ordering::Relaxed);
                    if self.stats.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            endpoint = %self.stats.endpoint,
                            dropped_batches = self.stats.dropped_batches.load(Ordering::Relaxed),
                            "OTLP export recovered"
                        );
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.stats.exports_failed.fetch_add(1, Ordering::Relaxed);
                    *self.stats.last_error.lock().expect("lock") = e.to_string();
                    // Another attempt only if it can start after the backoff and still have a
                    // tenth of the timeout (at least 50 ms) to run.
                    let min_attempt = (self.timeout / 10).max(Duration::from_millis(50));
                    let left = self.budget.saturating_sub(start.elapsed());
                    if final_flush || left < delay + min_attempt {
                        self.stats.dropped_batches.fetch_add(1, Ordering::Relaxed);
                        if !self.stats.failing.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                endpoint = %self.stats.endpoint,
                                error = %e,
                                "OTLP export failing: dropping batches until the endpoint \
                                 answers (ethand_otlp_dropped_batches_total)"
                            );
                        }
                        return Err(e);
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

impl PushMetricExporter for RetryingExporter {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        // The periodic reader calls this on its own thread and blocks on the future anyway.
        std::future::ready(self.export_blocking(metrics))
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

impl Drop for RetryingExporter {
    fn drop(&mut self) {
        // Safe from any context, async included (dropping a runtime inside one panics).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Documentation.

/// The name mapping of docs/otlp.md (between its `<!-- otlp-table -->` markers).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Prometheus | OTLP name | unit | type | attributes |\n|---|---|---|---|---|\n",
    );
    for m in METRICS {
        let prom = m
            .prometheus
            .split(", ")
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let attrs = if m.attributes.is_empty() {
            "-"
        } else {
            m.attributes
        };
        let _ = writeln!(
            out,
            "| {prom} | `{}` | `{}` | {} | {} |",
            m.name,
            m.unit,
            m.kind.as_str(),
            attrs.replace('|', "\\|")
        );
    }
    for (prom, why) in NOT_EXPORTED {
        let _ = writeln!(out, "| `{prom}` | not exported | | | {why} |");
    }
    out
}

#[cfg(test)]
mod tests;
