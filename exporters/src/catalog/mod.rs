//! The metric catalog: every metric ethand exports, declared once.
//!
//! An entry ([`Metric`]) holds the Prometheus family (name as exposed, type, help), its labels
//! with their OpenTelemetry attribute names, what the family becomes over OTLP ([`Otel`]: one
//! metric, a histogram's sum and count as two, or not exported and why) and one `observe`
//! function that reads the snapshot and emits samples into a [`Sink`]. The Prometheus text
//! encoder (`crate::prometheus`) and the OTLP encoder (`crate::otlp`) both walk [`all`] and
//! implement [`Sink`]; neither declares a metric of its own. Adding a metric is adding one
//! entry to one area's list.
//!
//! The order of [`all`] is the exposition order of /metrics (and of docs/metrics.md).
//! A value the snapshot does not have (`None`) emits no sample, never a 0.
use std::cmp::Reverse;
use std::sync::OnceLock;

use ethand_snapshot::devices::{GpuDevice, NpuDevice};
use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{
    self as snapshot, CgroupSnapshot, HIST_BUCKETS, NodeSnapshot, OtlpStatus, ProcessSnapshot,
    SyscallRow,
};

mod block;
mod cgroup;
mod comm;
pub(crate) mod dcgm;
pub(crate) mod devices;
mod gpu;
mod process;
mod self_;

/// Per process, syscalls beyond this many (ranked by time) are summed into `syscall="other"`.
pub const TOP_SYSCALLS: usize = 8;

/// The areas, in exposition order.
pub(crate) const AREAS: &[&[Metric]] = &[
    process::METRICS,
    gpu::METRICS,
    cgroup::METRICS,
    comm::METRICS,
    block::METRICS,
    self_::METRICS,
    devices::METRICS,
    dcgm::METRICS,
];

/// Every metric, in exposition order.
pub(crate) fn all() -> impl Iterator<Item = &'static Metric> {
    AREAS.iter().copied().flatten()
}

/// The Prometheus metric types ethand exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// A Prometheus family's descriptor.
#[derive(Debug)]
pub(crate) struct Desc {
    /// As exposed: counters include `_total`.
    pub(crate) name: &'static str,
    pub(crate) kind: MetricType,
    pub(crate) help: &'static str,
}

pub(crate) const fn counter(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Counter,
        help,
    }
}
pub(crate) const fn gauge(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Gauge,
        help,
    }
}
pub(crate) const fn histogram(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        kind: MetricType::Histogram,
        help,
    }
}

/// One metric: one Prometheus family and what it is over OTLP.
pub(crate) struct Metric {
    pub(crate) prometheus: Desc,
    /// In the order `observe` gives their values, after the subject's identity labels.
    pub(crate) labels: &'static [Label],
    /// Whose series these are: documents the identity labels the encoders add.
    pub(crate) per: Per,
    pub(crate) otel: Otel,
    /// Which outputs have it.
    pub(crate) output: Output,
    pub(crate) observe: fn(&Scope, &mut dyn Sink),
}

/// Which outputs carry a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// /metrics and, as `otel` says, OTLP.
    Both,
    /// /metrics only with `PrometheusOptions::dcgm_aliases` (dcgm-exporter's names).
    DcgmAlias,
    /// OTLP only: the Prometheus families named in `prometheus.name` carry the same data
    /// their own way (`Otel::Elsewhere` there).
    OtlpOnly,
}

/// Whose series a metric has; each encoder adds that subject's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Per {
    Node,
    /// The selected processes: Prometheus `pid`, `comm` and workload labels; OTLP
    /// `process.pid`, `process.executable.name` and `k8s.*`.
    Process,
    /// `cgroup` and the workload labels; OTLP `ethand.cgroup` and `k8s.*`.
    Cgroup,
    /// `gpu`/`npu` and `uuid` (GPUs: with `PrometheusOptions::device_workload_labels`, also
    /// the owning workload's labels); OTLP `hw.*`.
    Device,
}

/// A label: its Prometheus name and what it is over OTLP.
pub(crate) struct Label {
    pub(crate) prometheus: &'static str,
    pub(crate) otel: OtelLabel,
    /// Its values, for the docs ("blocked, preempted"); empty when open-ended.
    pub(crate) values: &'static str,
    /// An empty value means "no such label" rather than `label=""`.
    pub(crate) omit_empty: bool,
    /// Over OTLP, only samples with one of these values (the rest is /metrics only).
    pub(crate) otel_only: Option<&'static [&'static str]>,
}

pub(crate) enum OtelLabel {
    /// An attribute of this name with the same values.
    Attribute(&'static str),
    /// An attribute of this name whose values are renamed: (Prometheus value, OTLP value).
    Renamed(&'static str, &'static [(&'static str, &'static str)]),
    /// Not an attribute: the label's number is the point's value (an `_info` family's
    /// communicator size, say).
    PointValue,
}

pub(crate) const fn label(prometheus: &'static str, otel: &'static str) -> Label {
    Label {
        prometheus,
        otel: OtelLabel::Attribute(otel),
        values: "",
        omit_empty: false,
        otel_only: None,
    }
}

impl Label {
    pub(crate) const fn values(self, values: &'static str) -> Self {
        Self { values, ..self }
    }
    pub(crate) const fn otel_only(self, values: &'static [&'static str]) -> Self {
        Self {
            otel_only: Some(values),
            ..self
        }
    }
    pub(crate) const fn omit_empty(self) -> Self {
        Self {
            omit_empty: true,
            ..self
        }
    }

    pub(crate) fn otel_name(&self) -> &'static str {
        match self.otel {
            OtelLabel::Attribute(n) | OtelLabel::Renamed(n, _) => n,
            OtelLabel::PointValue => "",
        }
    }

    pub(crate) fn otel_value<'a>(&self, prometheus_value: &'a str) -> &'a str {
        match self.otel {
            OtelLabel::Attribute(_) | OtelLabel::PointValue => prometheus_value,
            OtelLabel::Renamed(_, map) => map
                .iter()
                .find(|(p, _)| *p == prometheus_value)
                .map_or(prometheus_value, |(_, o)| o),
        }
    }
}

/// What a Prometheus family is over OTLP.
pub(crate) enum Otel {
    /// One OTLP metric with the same points.
    Metric(OtelMetric),
    /// A histogram's total (in seconds) and its observation count as two OTLP metrics, either
    /// left out where `None`; OTLP carries no buckets.
    Histogram {
        sum: Option<OtelMetric>,
        count: Option<OtelMetric>,
    },
    /// Not exported over OTLP, and why.
    NotExported(&'static str),
    /// Over OTLP as the named metric of an OTLP-only entry, which reads the data its own way.
    Elsewhere(&'static str),
}

/// OTLP instrument kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtelKind {
    /// Monotonic cumulative sum.
    Counter,
    /// Non-monotonic cumulative sum (OTel's UpDownCounter), as the semantic conventions ask for
    /// hw.gpu.memory.*.
    UpDownCounter,
    Gauge,
}

impl OtelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::UpDownCounter => "updowncounter",
            Self::Gauge => "gauge",
        }
    }
}

/// Whether an OTLP instrument observes integers or floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Num {
    Int,
    Float,
}

/// One OTLP metric.
pub(crate) struct OtelMetric {
    pub(crate) name: &'static str,
    /// UCUM.
    pub(crate) unit: &'static str,
    pub(crate) kind: OtelKind,
    pub(crate) num: Num,
    /// Attributes every point of this family has over OTLP, after its labels (several
    /// Prometheus families may make one OTLP metric, told apart by these).
    pub(crate) constant: &'static [(&'static str, &'static str)],
}

pub(crate) const fn otel(
    name: &'static str,
    unit: &'static str,
    kind: OtelKind,
    num: Num,
) -> OtelMetric {
    OtelMetric {
        name,
        unit,
        kind,
        num,
        constant: &[],
    }
}

impl OtelMetric {
    pub(crate) const fn with(self, constant: &'static [(&'static str, &'static str)]) -> Self {
        Self { constant, ..self }
    }
}

/// One sample's value, typed as the snapshot holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sample<'a> {
    Int(u64),
    Float(f64),
    /// Exposed as seconds.
    Nanos(u64),
    /// A kernel log2 histogram (per-bucket counts) and its recorded total.
    Hist {
        counts: &'a [u64],
        sum_ns: u64,
    },
    /// A log2 histogram without a recorded total: its sum is estimated from the buckets.
    HistEstimated(&'a [u64]),
}

/// Whose sample it is: each encoder turns it into its identity labels or attributes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Subject<'a> {
    Node,
    /// Index into [`Scope::processes`].
    Process(usize),
    Cgroup(&'a CgroupSnapshot),
    Gpu(&'a GpuDevice),
    Npu(&'a NpuDevice),
    /// A GPU under dcgm-exporter's labels (the node's hostname among them).
    DcgmGpu {
        gpu: &'a GpuDevice,
        hostname: &'a str,
    },
}

/// Where `observe` puts samples; one sink per metric.
pub(crate) trait Sink {
    /// `labels`: the values of [`Metric::labels`], in their order.
    fn sample(&mut self, subject: Subject<'_>, labels: &[&str], value: Sample<'_>);
}

/// The processes an export selection picks, and what their series derive from them once.
pub(crate) struct Selected {
    pub(crate) indices: Vec<usize>,
    top_syscalls: OnceLock<Vec<Vec<SyscallSeries>>>,
}

impl Selected {
    pub(crate) fn new(snap: &NodeSnapshot, selection: &ExportSelection) -> Self {
        Self {
            indices: selection.indices(&snap.processes),
            top_syscalls: OnceLock::new(),
        }
    }
}

/// What `observe` reads: the snapshot, the selected processes and the OTLP export's state.
pub(crate) struct Scope<'a> {
    pub(crate) snap: &'a NodeSnapshot,
    pub(crate) selected: &'a Selected,
    /// The exporter's own counters: /metrics reads the snapshot's, OTLP its live ones.
    pub(crate) otlp: &'a OtlpStatus,
}

impl<'a> Scope<'a> {
    /// The selected processes with their subject.
    pub(crate) fn processes(&self) -> impl Iterator<Item = (Subject<'a>, &'a ProcessSnapshot)> {
        let snap = self.snap;
        self.selected
            .indices
            .iter()
            .enumerate()
            .map(move |(i, &p)| (Subject::Process(i), &snap.processes[p]))
    }

    /// [`top_syscalls`] of each selected process, computed once per scope.
    pub(crate) fn top_syscalls(&self) -> &'a [Vec<SyscallSeries>] {
        self.selected.top_syscalls.get_or_init(|| {
            self.selected
                .indices
                .iter()
                .map(|&i| top_syscalls(&self.snap.processes[i]))
                .collect()
        })
    }
}

/// Every Prometheus family: (name as exposed, type, help text), in exposition order.
pub(crate) fn prometheus_families()
-> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    all().filter(|m| m.output != Output::OtlpOnly).map(|m| {
        let d = &m.prometheus;
        (d.name, d.kind.as_str(), d.help)
    })
}

/// The counters behind one `syscall` label value.
#[derive(Debug)]
pub(crate) struct SyscallSeries {
    pub(crate) name: String,
    pub(crate) count: u64,
    pub(crate) errors: u64,
    pub(crate) time_ns: u64,
}

/// The [`TOP_SYSCALLS`] with the most time, then "other": what the process's totals leave
/// beyond them, or the remaining rows' sum should the totals fall short of the rows.
pub(crate) fn top_syscalls(p: &ProcessSnapshot) -> Vec<SyscallSeries> {
    let s = &p.syscalls;
    let mut rows: Vec<_> = s.by_nr.iter().collect();
    rows.sort_by_key(|r| (Reverse(r.time_ns), r.nr));
    let (top, rest) = rows.split_at(rows.len().min(TOP_SYSCALLS));
    let mut out: Vec<_> = top
        .iter()
        .map(|r| SyscallSeries {
            name: if r.name.is_empty() {
                format!("nr_{}", r.nr)
            } else {
                r.name.clone()
            },
            count: r.count,
            errors: r.errors,
            time_ns: r.time_ns,
        })
        .collect();
    let left = |total: u64, field: fn(&SyscallRow) -> u64| {
        let top: u64 = top.iter().map(|r| field(r)).sum();
        let rest: u64 = rest.iter().map(|r| field(r)).sum();
        total.saturating_sub(top).max(rest)
    };
    let other = SyscallSeries {
        name: "other".to_owned(),
        count: left(s.count, |r| r.count),
        errors: left(s.errors, |r| r.errors),
        time_ns: left(s.time_ns, |r| r.time_ns),
    };
    if !rest.is_empty() || other.count > 0 || other.errors > 0 || other.time_ns > 0 {
        out.push(other);
    }
    out
}

/// For histograms without a recorded total: each observation counts as its bucket's
/// geometric midpoint, 2^(i+0.5) ns, or the lower bound 2^31 ns in the open last bucket.
pub(crate) fn estimated_sum_ns(counts: &[u64]) -> u64 {
    let mut buckets = [0u64; HIST_BUCKETS];
    for (i, &n) in counts.iter().enumerate() {
        let b = &mut buckets[i.min(HIST_BUCKETS - 1)];
        *b = b.saturating_add(n);
    }
    buckets.iter().enumerate().fold(0u64, |sum, (i, &n)| {
        let each = if i == HIST_BUCKETS - 1 {
            1u64 << i
        } else {
            2f64.powf(i as f64 + 0.5) as u64
        };
        sum.saturating_add(n.saturating_mul(each))
    })
}

/// TCP and UDP bytes by (protocol, direction).
pub(crate) fn net_bytes(n: &snapshot::NetStats) -> [(&'static str, &'static str, u64); 4] {
    [
        ("tcp", "transmit", n.tcp_tx_bytes),
        ("tcp", "receive", n.tcp_rx_bytes),
        ("udp", "transmit", n.udp_tx_bytes),
        ("udp", "receive", n.udp_rx_bytes),
    ]
}

/// The device's name where known ("nvme0n1"), else its major:minor.
pub(crate) fn device_label(b: &snapshot::BlockStats) -> &str {
    if b.device_name.is_empty() {
        &b.device
    } else {
        &b.device_name
    }
}

/// Labels shared by several areas.
pub(crate) mod labels {
    use super::{Label, label};

    pub(crate) const OFFCPU_REASON: Label =
        label("reason", "ethand.offcpu.reason").values("blocked, preempted");
    pub(crate) const PROTOCOL: Label = label("protocol", "network.transport").values("tcp, udp");
    pub(crate) const DIRECTION: Label =
        label("direction", "network.io.direction").values("transmit, receive");
    pub(crate) const BLOCK_DEVICE: Label = label("device", "system.device");
    pub(crate) const BLOCK_OP: Label =
        label("op", "ethand.block.op").values("read, write, flush, discard, other");
    pub(crate) const COMM: Label = label("comm", "process.executable.name");
}

impl Metric {
    /// A metric with no labels besides its subject's identity, and no dcgm alias.
    pub(crate) const fn new(
        prometheus: Desc,
        per: Per,
        otel: Otel,
        observe: fn(&Scope, &mut dyn Sink),
    ) -> Self {
        Self {
            prometheus,
            labels: &[],
            per,
            otel,
            output: Output::Both,
            observe,
        }
    }

    pub(crate) const fn labels(self, labels: &'static [Label]) -> Self {
        Self { labels, ..self }
    }
}
