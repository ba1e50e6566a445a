//! The OTLP side of the catalog: [`METRICS`] is [`crate::catalog`] seen as OTLP metrics (one
//! per OTel name; several Prometheus families may share one, a histogram may make two), each
//! turned into an observable instrument whose callback walks its entries' `observe` with a
//! [`Sink`] that writes data points. docs/otlp.md's table is generated from it
//! ([`markdown_table`]).
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, Meter};

use crate::catalog::{
    self, Metric, Otel, OtelLabel, OtelMetric, Output, Per, Sample, Scope, Selected, Sink, Subject,
};
pub use crate::catalog::{Num, OtelKind as Kind};
use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{NodeSnapshot, OtlpStatus, ProcessSnapshot};

/// One snapshot, its selected processes with their identity attributes, and export health.
pub struct View {
    pub(crate) snap: Arc<NodeSnapshot>,
    selected: Selected,
    /// The identity attributes of each selected process, in `selected` order.
    identities: Vec<Vec<KeyValue>>,
    otlp: OtlpStatus,
}

impl View {
    pub(crate) fn new(
        snap: Arc<NodeSnapshot>,
        selection: &ExportSelection,
        otlp: OtlpStatus,
    ) -> Self {
        let selected = Selected::new(&snap, selection);
        let identities = selected
            .indices
            .iter()
            .map(|&i| process_identity(&snap.processes[i]))
            .collect();
        Self {
            snap,
            selected,
            identities,
            otlp,
        }
    }

    #[cfg(test)]
    pub(crate) fn each_proc(&self) -> impl Iterator<Item = (&ProcessSnapshot, &[KeyValue])> {
        self.selected
            .indices
            .iter()
            .zip(&self.identities)
            .map(|(&i, id)| (&self.snap.processes[i], id.as_slice()))
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            snap: &self.snap,
            selected: &self.selected,
            otlp: &self.otlp,
        }
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

/// ethand.cgroup and the cgroup's workload identity, then `extra`.
pub(crate) fn cg(
    c: &ethand_snapshot::CgroupSnapshot,
    extra: &[(&'static str, &str)],
) -> Vec<KeyValue> {
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

pub(crate) fn secs(ns: u64) -> V {
    V::F(ns as f64 / 1e9)
}

/// Data points of one metric: attribute sets with their value. A set observed twice (pid
/// reuse within the exit grace period) is summed, as Prometheus does.
#[derive(Default)]
pub struct Points(BTreeMap<String, (Vec<KeyValue>, V)>);

impl Points {
    pub(crate) fn add(&mut self, attrs: Vec<KeyValue>, v: V) {
        let key = format!("{attrs:?}");
        match self.0.get_mut(&key) {
            Some((_, old)) => *old = old.merge(v),
            None => {
                self.0.insert(key, (attrs, v));
            }
        }
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
    pub(crate) num: Num,
    /// The Prometheus families it carries (comma-separated), as in docs/metrics.md.
    pub prometheus: String,
    /// Attributes besides the process identity (per-process metrics) or the hw.* identity.
    pub attributes: String,
    pub description: &'static str,
    /// Catalog entries, each with the part of its samples this metric carries.
    pub(crate) sources: Vec<(&'static Metric, Part)>,
}

/// Points per batch of a metric that is neither per process nor per cgroup (node, device:
/// tens of points), the SDK's default.
pub const FIXED_POINTS_LIMIT: usize = 2_000;

impl MetricSpec {
    /// Most points this metric carries per batch: `per_selection` where their number grows
    /// with the selected processes or the cgroups, else [`FIXED_POINTS_LIMIT`]. (The SDK
    /// reserves a table of that many entries per metric: one limit for all would cost
    /// megabytes for nothing.)
    pub fn points_limit(&self, per_selection: usize) -> usize {
        if self
            .sources
            .iter()
            .any(|(m, _)| matches!(m.per, Per::Process | Per::Cgroup))
        {
            per_selection.max(1)
        } else {
            FIXED_POINTS_LIMIT
        }
    }
}

/// Which part of a catalog entry's samples an OTLP metric carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The value as is (nanoseconds as seconds).
    Whole,
    /// A histogram's total, in seconds.
    Sum,
    /// A histogram's observation count.
    Count,
}

impl Part {
    fn suffix(self) -> &'static str {
        match self {
            Part::Whole => "",
            Part::Sum => " (_sum)",
            Part::Count => " (_count)",
        }
    }
}

impl MetricSpec {
    /// The data points this metric has in `view`.
    pub fn points(&self, view: &View) -> Points {
        let mut points = Points::default();
        let scope = view.scope();
        for &(metric, part) in &self.sources {
            let mut sink = PointSink {
                view,
                metric,
                otel: otel_of(metric, part),
                part,
                points: &mut points,
            };
            (metric.observe)(&scope, &mut sink);
        }
        points
    }
}

/// The OTLP metric `part` of `metric` makes.
fn otel_of(metric: &Metric, part: Part) -> Option<&OtelMetric> {
    match (&metric.otel, part) {
        (Otel::Metric(o), Part::Whole) => Some(o),
        (Otel::Histogram { sum, .. }, Part::Sum) => sum.as_ref(),
        (Otel::Histogram { count, .. }, Part::Count) => count.as_ref(),
        _ => None,
    }
}

/// The OTLP side of [`Sink`]: identity attributes by subject, the labels as attributes, then
/// the metric's constant attributes.
struct PointSink<'a> {
    view: &'a View,
    metric: &'static Metric,
    otel: Option<&'static OtelMetric>,
    part: Part,
    points: &'a mut Points,
}

impl Sink for PointSink<'_> {
    fn sample(&mut self, subject: Subject<'_>, values: &[&str], value: Sample<'_>) {
        let count = |counts: &[u64]| counts.iter().fold(0u64, |n, &c| n.saturating_add(c));
        let v = match (self.part, value) {
            (Part::Whole, Sample::Int(n)) => V::U(n),
            (Part::Whole, Sample::Float(x)) => V::F(x),
            (Part::Whole, Sample::Nanos(ns)) => secs(ns),
            (Part::Sum, Sample::Hist { sum_ns, .. }) => secs(sum_ns),
            (Part::Sum, Sample::HistEstimated(counts)) => secs(catalog::estimated_sum_ns(counts)),
            (Part::Count, Sample::Hist { counts, .. } | Sample::HistEstimated(counts)) => {
                V::U(count(counts))
            }
            _ => {
                debug_assert!(
                    false,
                    "{}: {value:?} as {:?}",
                    self.metric.prometheus.name, self.part
                );
                return;
            }
        };
        let mut v = v;
        let mut attrs = match subject {
            Subject::Node => Vec::with_capacity(values.len()),
            Subject::Process(i) => self.view.identities[i].clone(),
            Subject::Cgroup(c) => cg(c, &[]),
            Subject::Gpu(g) => gpu_hw(g, &[]),
            Subject::Npu(n) => npu_hw(n, &[]),
            // dcgm-exporter's aliases are for Prometheus dashboards only.
            Subject::DcgmGpu { .. } => return,
        };
        for (label, value) in self.metric.labels.iter().zip(values) {
            if label.otel_only.is_some_and(|known| !known.contains(value)) {
                return;
            }
            if let OtelLabel::PointValue = label.otel {
                v = V::U(value.parse().unwrap_or(0));
            } else if !(label.omit_empty && value.is_empty()) {
                let otel_value = label.otel_value(value).to_owned();
                attrs.push(KeyValue::new(label.otel_name(), otel_value));
            }
        }
        for &(k, c) in self.otel.map_or(&[][..], |o| o.constant) {
            attrs.push(KeyValue::new(k, c.to_owned()));
        }
        self.points.add(attrs, v);
    }
}

/// Every metric the OTLP export carries: the catalog's, then those not in it yet.
pub const METRICS: Metrics = Metrics;

/// The list behind [`METRICS`], built from the catalog once.
#[derive(Clone, Copy, Debug)]
pub struct Metrics;

static SPECS: LazyLock<Vec<MetricSpec>> = LazyLock::new(from_catalog);

impl Metrics {
    pub fn iter(self) -> std::slice::Iter<'static, MetricSpec> {
        SPECS.iter()
    }
}

impl IntoIterator for Metrics {
    type Item = &'static MetricSpec;
    type IntoIter = std::slice::Iter<'static, MetricSpec>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// One [`MetricSpec`] per OTel name, in catalog order; an OTel name several entries map to
/// (a GPU's and an NPU's utilization, say) carries all of them.
fn from_catalog() -> Vec<MetricSpec> {
    let mut specs: Vec<MetricSpec> = Vec::new();
    for metric in catalog::all() {
        for part in [Part::Whole, Part::Sum, Part::Count] {
            let Some(o) = otel_of(metric, part) else {
                continue;
            };
            let family = format!("{}{}", metric.prometheus.name, part.suffix());
            if let Some(spec) = specs.iter_mut().find(|s| s.name == o.name) {
                debug_assert!(spec.unit == o.unit && spec.kind == o.kind && spec.num == o.num);
                spec.prometheus = format!("{}, {family}", spec.prometheus);
                spec.sources.push((metric, part));
                continue;
            }
            specs.push(MetricSpec {
                name: o.name,
                unit: o.unit,
                kind: o.kind,
                num: o.num,
                prometheus: family,
                attributes: attributes_doc(metric, o),
                description: metric.prometheus.help,
                sources: vec![(metric, part)],
            });
        }
    }
    for metric in catalog::all() {
        if let Otel::Elsewhere(name) = metric.otel {
            assert!(
                specs.iter().any(|s| s.name == name),
                "{}: no OTLP metric {name}",
                metric.prometheus.name
            );
        }
    }
    specs
}

/// The attributes column of docs/otlp.md: identity, labels (with their values where few),
/// constant attributes.
fn attributes_doc(metric: &Metric, o: &OtelMetric) -> String {
    let identity = match metric.per {
        Per::Node | Per::Process => None,
        Per::Cgroup => Some("ethand.cgroup, k8s.*".to_owned()),
        Per::Device => Some("hw.*".to_owned()),
    };
    let labels = metric.labels.iter().filter_map(|l| {
        Some(match (&l.otel, l.values) {
            (OtelLabel::PointValue, _) => return None,
            (OtelLabel::Renamed(name, map), _) => {
                let values: Vec<String> = map.iter().map(|(p, o)| format!("{o} = {p}")).collect();
                format!("{name} ({})", values.join(", "))
            }
            (_, "") => l.otel_name().to_owned(),
            (_, values) => format!("{} ({values})", l.otel_name()),
        })
    });
    let constant = o.constant.iter().map(|(k, v)| format!("{k}={v}"));
    identity
        .into_iter()
        .chain(labels)
        .chain(constant)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prometheus families with no OTLP metric of their own, and why.
pub static NOT_EXPORTED: LazyLock<Vec<(&'static str, &'static str)>> = LazyLock::new(|| {
    catalog::all()
        .filter_map(|m| match (&m.otel, m.output) {
            // One row for all of dcgm-exporter's names.
            (Otel::NotExported(why), Output::DcgmAlias) => Some(("DCGM_FI_*", *why)),
            (Otel::NotExported(why), _) => Some((m.prometheus.name, *why)),
            _ => None,
        })
        .fold(Vec::new(), |mut rows, row| {
            if !rows.contains(&row) {
                rows.push(row);
            }
            rows
        })
});

/// Builds the observable instrument of `m`; its callback observes what `points` returns.
pub(crate) fn register(
    meter: &Meter,
    m: &'static MetricSpec,
    points: impl Fn() -> Points + Send + Sync + 'static,
) -> Box<dyn Any + Send + Sync> {
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
            &m.attributes
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
    for (prom, why) in NOT_EXPORTED.iter() {
        let _ = writeln!(out, "| `{prom}` | not exported | | | {why} |");
    }
    out
}
