//! Prometheus text exposition (format 0.0.4) of a [`NodeSnapshot`].
//!
//! Cardinality is bounded: only the processes [`PrometheusOptions`] selects get per-process
//! series (labels `pid`, `comm`). Per-cgroup series render `NodeSnapshot::cgroups` (totals of
//! every process of the cgroup, exited ones included) and the node block latency histograms
//! `NodeSnapshot::block_devices`, whatever the selection. Per process, syscalls beyond the
//! [`TOP_SYSCALLS`] with the most time are summed into `syscall="other"`. The kernel's log2
//! histograms become classic Prometheus histograms.
//!
//! The families are those of [`crate::catalog`], walked in its order: this module only
//! encodes them (escaping, Go's float format for `le`, one pre-sized output buffer).
use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use crate::catalog::Desc;
#[cfg(test)]
use crate::catalog::MetricType;
#[cfg(test)]
use crate::catalog::histogram;
use crate::catalog::{self, Metric, Output, Sample, Scope, Selected, Sink, Subject};
#[cfg(test)]
use crate::catalog::{counter, gauge};
use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{self as snapshot, HIST_BUCKETS, NodeSnapshot, ProcessSnapshot};

/// `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub use crate::catalog::TOP_SYSCALLS;

/// What /metrics renders besides the node-wide series. Every process, selected or not, is
/// also counted in its cgroup's and its name's series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrometheusOptions {
    /// Which processes get per-process series.
    pub selection: ExportSelection,
    /// Also expose the GPU series under dcgm-exporter's names and labels (`DCGM_FI_DEV_*`).
    pub dcgm_aliases: bool,
    /// Put the owning workload's labels (`namespace`, `pod`, `container`, `job_id`, `rank`,
    /// where known) on a GPU's device series and its dcgm-exporter aliases, when every
    /// compute process on the GPU belongs to one workload ([`gpu_owners`]). One label set
    /// per GPU at a time: the series change labels when the GPU changes hands.
    pub device_workload_labels: bool,
}

/// Renders the snapshot in the Prometheus text format ([`CONTENT_TYPE`]).
pub fn render(snap: &NodeSnapshot, opts: &PrometheusOptions) -> String {
    // Sized from the selection: ~100 bytes a sample line, ~170 lines a selected process.
    let mut registry =
        Exposition::with_capacity(64 * 1024 + snap.processes.len().min(100_000) * 2048);
    let selected = Selected::new(snap, &opts.selection);
    let procs: Vec<&ProcessSnapshot> = selected
        .indices
        .iter()
        .map(|&i| &snap.processes[i])
        .collect();
    let process_labels = process_label_sets(&procs);
    let owners = if opts.device_workload_labels {
        gpu_owners(snap)
    } else {
        GpuOwners::new()
    };
    let otlp = snap.ethand.otlp.clone().unwrap_or_default();
    let scope = Scope {
        snap,
        selected: &selected,
        otlp: &otlp,
    };
    for m in catalog::all() {
        encode(&mut registry, m, &scope, &process_labels, &owners, opts);
    }
    registry.out
}

/// Every family [`render`] can emit: (name as exposed, type, help text), in exposition order.
pub fn metric_catalog() -> Vec<(&'static str, &'static str, &'static str)> {
    catalog::prometheus_families().collect()
}

/// Writes one catalog metric's family: `observe` fills it through a [`FamilySink`].
fn encode(
    registry: &mut Exposition,
    metric: &'static Metric,
    scope: &Scope,
    process_labels: &[Labels],
    gpu_owners: &GpuOwners,
    opts: &PrometheusOptions,
) {
    match metric.output {
        Output::Both => {}
        Output::DcgmAlias if opts.dcgm_aliases => {}
        Output::DcgmAlias | Output::OtlpOnly => return,
    }
    let mut sink = FamilySink {
        metric,
        process_labels,
        gpu_owners,
        series: Series::Empty,
    };
    (metric.observe)(scope, &mut sink);
    match sink.series {
        Series::Empty => {}
        Series::Int(f) => f.register(registry),
        Series::Float(f) => f.register(registry),
        Series::Nanos(f) => f.register(registry),
        Series::Hist(f) => f.register(registry),
    }
}

/// One family being filled, typed by its first sample's value.
enum Series {
    Empty,
    Int(Family<u64>),
    Float(Family<f64>),
    Nanos(Family<Nanos>),
    Hist(Family<Hist>),
}

/// The Prometheus side of [`Sink`]: identity labels by subject, then the metric's labels.
struct FamilySink<'a> {
    metric: &'static Metric,
    /// [`process_label_sets`] of the selected processes, by [`Subject::Process`] index.
    process_labels: &'a [Labels],
    /// The workload labels of each GPU with one owner, by NVML index ([`gpu_owners`]).
    gpu_owners: &'a GpuOwners,
    series: Series,
}

impl Sink for FamilySink<'_> {
    fn sample(&mut self, subject: Subject<'_>, values: &[&str], value: Sample<'_>) {
        let mut l = match subject {
            Subject::Node => Labels::with_capacity(values.len()),
            Subject::Process(i) => self.process_labels[i].clone(),
            Subject::Cgroup(c) => {
                let mut l = labels(&[("cgroup", c.cgroup.as_str())], &[]);
                if let Some(w) = &c.workload {
                    l.extend(workload_labels(w, false));
                }
                l
            }
            Subject::Gpu(g) => {
                let mut l = labels(&[("gpu", &g.label()), ("uuid", &g.uuid)], &[]);
                if let Some(w) = self.gpu_owners.get(&g.index) {
                    l.extend(w.iter().cloned());
                }
                l
            }
            Subject::Npu(n) => labels(&[("npu", &n.label()), ("uuid", &n.uuid)], &[]),
            Subject::DcgmGpu { gpu: g, hostname } => {
                let mut l = dcgm_labels(g, hostname);
                if let Some(w) = self.gpu_owners.get(&g.index) {
                    l.extend(w.iter().cloned());
                }
                l
            }
        };
        for (label, v) in self.metric.labels.iter().zip(values) {
            if !(label.omit_empty && v.is_empty()) {
                set_label(&mut l, label.prometheus, v);
            }
        }
        let desc = &self.metric.prometheus;
        if let Series::Empty = self.series {
            self.series = match value {
                Sample::Int(_) => Series::Int(Family::new(desc)),
                Sample::Float(_) => Series::Float(Family::new(desc)),
                Sample::Nanos(_) => Series::Nanos(Family::new(desc)),
                Sample::Hist { .. } | Sample::HistEstimated(_) => Series::Hist(Family::new(desc)),
            };
        }
        match (&mut self.series, value) {
            (Series::Int(f), Sample::Int(n)) => f.add(l, n),
            (Series::Float(f), Sample::Float(x)) => f.add(l, x),
            (Series::Nanos(f), Sample::Nanos(ns)) => f.add(l, Nanos(ns)),
            (Series::Hist(f), Sample::Hist { counts, sum_ns }) => {
                f.add(l, Hist::new(counts, sum_ns))
            }
            (Series::Hist(f), Sample::HistEstimated(counts)) => f.add(l, Hist::estimated(counts)),
            _ => debug_assert!(false, "{}: samples of two value types", desc.name),
        }
    }
}

/// dcgm-exporter's labels of a GPU, in its order.
fn dcgm_labels(g: &snapshot::devices::GpuDevice, hostname: &str) -> Labels {
    let index = g.index.to_string();
    let device = format!("nvidia{}", g.minor_number.unwrap_or(g.index));
    let mut l = labels(
        &[
            ("gpu", &index),
            ("UUID", &g.uuid),
            ("pci_bus_id", &g.pci_bus_id),
            ("device", &device),
            ("modelName", &g.name),
        ],
        &[],
    );
    if !hostname.is_empty() {
        l.push(("Hostname", hostname.to_owned()));
    }
    if !g.driver_version.is_empty() {
        l.push(("DCGM_FI_DRIVER_VERSION", g.driver_version.clone()));
    }
    l
}

/// Workload labels by GPU (NVML index).
pub(crate) type GpuOwners = BTreeMap<u32, Labels>;

/// The GPUs with one owner: every compute process the collector lists on the GPU
/// (`DevicesSnapshot::processes`) is a process of the snapshot (by pid; a live one first)
/// with the same namespace, pod, container, job and rank, at least one of them known. Its
/// [`workload_labels`] with job and rank. A GPU without processes, shared by two
/// workloads, or with a process of unknown workload has none. Computed once per render.
pub(crate) fn gpu_owners(snap: &NodeSnapshot) -> GpuOwners {
    let mut by_pid: BTreeMap<u32, &ProcessSnapshot> = BTreeMap::new();
    for p in &snap.processes {
        let e = by_pid.entry(p.pid).or_insert(p);
        if p.alive && !e.alive {
            *e = p;
        }
    }
    type Key<'a> = (
        &'a Option<String>,
        &'a Option<String>,
        &'a Option<String>,
        &'a Option<String>,
        Option<u32>,
    );
    let mut out = GpuOwners::new();
    for g in &snap.devices.gpus {
        let device = g.label();
        let mut owner: Option<(Key, &snapshot::WorkloadIdentity)> = None;
        let mut shared = false;
        for dp in snap.devices.processes.iter().filter(|d| d.device == device) {
            let Some(w) = by_pid.get(&dp.pid).and_then(|p| p.workload.as_ref()) else {
                shared = true;
                break;
            };
            let key: Key = (&w.namespace, &w.pod, &w.container, &w.job_id, w.rank);
            match &owner {
                None => owner = Some((key, w)),
                Some((k, _)) if *k == key => {}
                Some(_) => {
                    shared = true;
                    break;
                }
            }
        }
        if shared {
            continue;
        }
        if let Some((_, w)) = owner {
            let l = workload_labels(w, true);
            if !l.is_empty() {
                out.insert(g.index, l);
            }
        }
    }
    out
}

/// Sets `key` to `value`, replacing an identity label of that name (the collective series'
/// `rank` is the communicator's, not the workload's).
fn set_label(l: &mut Labels, key: &'static str, value: &str) {
    match l.iter_mut().find(|(k, _)| *k == key) {
        Some(e) => e.1 = value.to_owned(),
        None => l.push((key, value.to_owned())),
    }
}

/// Label pairs in exposition order.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// `pid`, `comm`, then the process's workload labels where known: `namespace`, `pod`,
/// `container` (dcgm-exporter's names), `job_id`, `rank`. A process has one value of each, so
/// they add no series. (`job_id`, not `job`: Prometheus' scrape target label is `job`.)
pub(crate) fn process_labels(p: &ProcessSnapshot) -> Labels {
    let mut l = labels(
        &[("pid", &p.pid.to_string()), ("comm", p.comm.as_str())],
        &[],
    );
    if let Some(w) = &p.workload {
        l.extend(workload_labels(w, true));
    }
    l
}

/// The known Kubernetes labels of an identity, and with `job` its job and rank.
pub(crate) fn workload_labels(w: &snapshot::WorkloadIdentity, job: bool) -> Labels {
    let mut l = Labels::new();
    for (k, v) in [
        ("namespace", &w.namespace),
        ("pod", &w.pod),
        ("container", &w.container),
    ] {
        if let Some(v) = v {
            l.push((k, v.clone()));
        }
    }
    if job {
        if let Some(j) = &w.job_id {
            l.push(("job_id", j.clone()));
        }
        if let Some(r) = w.rank {
            l.push(("rank", r.to_string()));
        }
    }
    l
}

/// `base` plus `extra`; a key of `extra` already in `base` replaces its value (the collective
/// series' `rank` is the communicator's).
/// [`process_labels`] of each process, told apart where two would share one label set: a
/// pid reused within the exit grace period by a process of the same name. The newest keeps
/// the plain labels; each older one gets `start_time_ns` (as in `ethand snapshot --json`), so
/// two processes are never summed into one series.
pub(crate) fn process_label_sets(procs: &[&ProcessSnapshot]) -> Vec<Labels> {
    let sets: Vec<Labels> = procs.iter().map(|p| process_labels(p)).collect();
    let mut newest: BTreeMap<&Labels, u64> = BTreeMap::new();
    for (l, p) in sets.iter().zip(procs) {
        let n = newest.entry(l).or_insert(p.start_time_ns);
        *n = (*n).max(p.start_time_ns);
    }
    let newest: Vec<u64> = sets.iter().map(|l| newest[l]).collect();
    sets.into_iter()
        .zip(procs.iter().zip(newest))
        .map(|(l, (p, n))| {
            if p.start_time_ns < n {
                with_extra(&l, &[("start_time_ns", &p.start_time_ns.to_string())])
            } else {
                l
            }
        })
        .collect()
}

pub(crate) fn with_extra(base: &Labels, extra: &[(&'static str, &str)]) -> Labels {
    let mut l = base.clone();
    for &(k, v) in extra {
        match l.iter_mut().find(|(lk, _)| *lk == k) {
            Some(e) => e.1 = v.to_owned(),
            None => l.push((k, v.to_owned())),
        }
    }
    l
}

pub(crate) fn labels(base: &[(&'static str, &str)], extra: &[(&'static str, &str)]) -> Labels {
    base.iter()
        .chain(extra)
        .map(|&(k, v)| (k, v.to_owned()))
        .collect()
}

/// One family computed from the snapshot. A label set added twice is summed (pid reuse within
/// the exit grace period, two devices with one name) so no series is ever duplicated; the
/// BTreeMap keeps the output order stable between scrapes.
#[derive(Debug)]
pub(crate) struct Family<V> {
    desc: &'static Desc,
    series: BTreeMap<Labels, V>,
}

impl<V: Value> Family<V> {
    pub(crate) fn new(desc: &'static Desc) -> Self {
        Self {
            desc,
            series: BTreeMap::new(),
        }
    }

    pub(crate) fn add(&mut self, labels: Labels, value: V) {
        self.series.entry(labels).or_default().merge(&value);
    }

    /// Writes the family out (nothing when it has no series, not even its HELP and TYPE).
    pub(crate) fn register(self, e: &mut Exposition) {
        if self.series.is_empty() {
            return;
        }
        e.descriptor(self.desc);
        for (labels, value) in &self.series {
            e.labels.clear();
            encode_labels(labels, &mut e.labels);
            value.write(self.desc.name, &e.labels, &mut e.out);
        }
    }
}

/// The Prometheus text format (0.0.4), written straight into one pre-sized String.
///
/// prometheus-client's encoder (what this replaced; its output is the reference of the test
/// `output_matches_prometheus_client`) encodes a series' label set again for every bucket
/// line and formats each bucket bound anew: at 10,000 series that, the cloning around it and
/// the output's regrowth made a scrape take 1.5 times its budget. Here a series' labels are
/// escaped once, the bucket bounds are formatted once per process, and the output is
/// written once.
pub(crate) struct Exposition {
    out: String,
    /// The current series' label set, escaped, without braces.
    labels: String,
}

impl Exposition {
    fn with_capacity(bytes: usize) -> Self {
        Self {
            out: String::with_capacity(bytes),
            labels: String::new(),
        }
    }

    fn descriptor(&mut self, d: &Desc) {
        let help = d.help.strip_suffix('.').unwrap_or(d.help);
        let out = &mut self.out;
        out.push_str("# HELP ");
        out.push_str(d.name);
        out.push(' ');
        escape(help, false, out);
        out.push_str(".\n# TYPE ");
        out.push_str(d.name);
        out.push(' ');
        out.push_str(d.kind.as_str());
        out.push('\n');
    }
}

/// `k="v",k2="v2"` with the values escaped.
fn encode_labels(labels: &Labels, out: &mut String) {
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        escape(v, true, out);
        out.push('"');
    }
}

/// The text format's escapes: backslash and newline, and in label values the double quote.
fn escape(s: &str, quote: bool, out: &mut String) {
    let mut last = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'"' if quote => "\\\"",
            _ => continue,
        };
        out.push_str(&s[last..i]);
        out.push_str(esc);
        last = i + 1;
    }
    out.push_str(&s[last..]);
}

/// `name_suffix{labels,k="v"} ` (braces only when there is a label).
fn sample_start(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &str,
    extra: Option<(&str, &str)>,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        out.push_str(labels);
        if let Some((k, v)) = extra {
            if !labels.is_empty() {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            out.push_str(v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
}

fn write_u64(out: &mut String, v: u64) {
    out.push_str(itoa::Buffer::new().format(v));
    out.push('\n');
}

fn write_f64(out: &mut String, v: f64) {
    if v.is_finite() {
        out.push_str(dtoa::Buffer::new().format_finite(v));
    } else if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_sign_positive() {
        out.push_str("+Inf");
    } else {
        out.push_str("-Inf");
    }
    out.push('\n');
}

pub(crate) trait Value: Default + fmt::Debug {
    fn merge(&mut self, other: &Self);
    /// The series' sample line(s); `labels` is its escaped label set without braces.
    fn write(&self, name: &str, labels: &str, out: &mut String);
}

impl Value for u64 {
    fn merge(&mut self, other: &Self) {
        *self = self.saturating_add(*other);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        sample_start(out, name, "", labels, None);
        write_u64(out, *self);
    }
}

impl Value for f64 {
    fn merge(&mut self, other: &Self) {
        *self += other;
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        sample_start(out, name, "", labels, None);
        write_f64(out, *self);
    }
}

/// Nanoseconds, summed as integers and exposed as seconds, so sums carry no rounding error.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Nanos(pub(crate) u64);

impl Value for Nanos {
    fn merge(&mut self, other: &Self) {
        self.0 = self.0.saturating_add(other.0);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        (self.0 as f64 / 1e9).write(name, labels, out);
    }
}

/// A log2 histogram as the kernel keeps it: per-bucket (not cumulative) counts.
#[derive(Clone, Debug, Default)]
struct Hist {
    buckets: [u64; HIST_BUCKETS],
    sum_ns: u64,
}

/// The exposed buckets' upper bounds, as powers of two of nanoseconds: every second power
/// from 2^10 ns (1.024 µs; shorter waits and calls are all "fast") to 2^30 ns (1.07 s), then
/// 2^31 ns (2.15 s), then +Inf. 14 buckets rather than the kernel's 32 (which start at 2 ns)
/// keep a histogram series at 16 lines; each bound is one of the kernel's, so the
/// cumulative counts are exact. The kernel's last bucket also holds everything above
/// 2^31 ns (ethand_common::log2_bucket): it goes to +Inf.
const EXPOSED_POW2: [usize; 12] = [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 31];

/// Number of buckets a histogram series exposes (+Inf included).
pub const EXPOSED_BUCKETS: usize = EXPOSED_POW2.len() + 1;

/// The exposed buckets' bounds in seconds, +Inf last.
pub fn exposed_bucket_bounds_seconds() -> Vec<f64> {
    EXPOSED_POW2
        .iter()
        .map(|&k| (1u64 << k) as f64 / 1e9)
        .chain([f64::INFINITY])
        .collect()
}

/// Bucket bounds for the exposition, as `le` values: client_golang's formatting (Go's
/// `strconv.FormatFloat(v, 'g', -1, 64)`, so series match those of Go exporters).
static LE: LazyLock<Vec<String>> = LazyLock::new(|| {
    exposed_bucket_bounds_seconds()
        .into_iter()
        .map(go_float)
        .collect()
});

/// Go's shortest `%g`: exponent notation outside [1e-4, 1e6) with at least two exponent
/// digits; whole numbers below 1e6 as integers.
fn go_float(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        }
        .into();
    }
    if v.fract() == 0.0 && v.abs() < 1e6 {
        return (v as i64).to_string();
    }
    if (1e-4..1e6).contains(&v.abs()) {
        return format!("{v}");
    }
    let sci = format!("{v:e}");
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    format!("{mantissa}e{exponent:+03}")
}

impl Hist {
    fn new(counts: &[u64], sum_ns: u64) -> Self {
        let mut buckets = [0u64; HIST_BUCKETS];
        for (i, &n) in counts.iter().enumerate() {
            let b = &mut buckets[i.min(HIST_BUCKETS - 1)];
            *b = b.saturating_add(n);
        }
        Self { buckets, sum_ns }
    }

    /// For histograms without a recorded total ([`catalog::estimated_sum_ns`]).
    fn estimated(counts: &[u64]) -> Self {
        let mut h = Self::new(counts, 0);
        h.sum_ns = catalog::estimated_sum_ns(counts);
        h
    }
}

impl Hist {
    /// Per exposed bucket (not cumulative): the kernel's buckets below each bound, +Inf last.
    fn exposed(&self) -> [u64; EXPOSED_BUCKETS] {
        let mut out = [0u64; EXPOSED_BUCKETS];
        for (i, &n) in self.buckets.iter().enumerate() {
            // Kernel bucket i holds [2^i, 2^(i+1)) ns: under the first bound 2^k with k > i.
            let j = EXPOSED_POW2
                .iter()
                .position(|&k| i < k)
                .unwrap_or(EXPOSED_BUCKETS - 1);
            out[j] = out[j].saturating_add(n);
        }
        out
    }
}

impl Value for Hist {
    fn merge(&mut self, other: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a = a.saturating_add(b);
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }
    fn write(&self, name: &str, labels: &str, out: &mut String) {
        let mut cumulative = 0u64;
        for (le, n) in LE.iter().zip(self.exposed()) {
            cumulative = cumulative.saturating_add(n);
            sample_start(out, name, "_bucket", labels, Some(("le", le)));
            write_u64(out, cumulative);
        }
        sample_start(out, name, "_sum", labels, None);
        write_f64(out, self.sum_ns as f64 / 1e9);
        sample_start(out, name, "_count", labels, None);
        write_u64(out, cumulative);
    }
}

#[cfg(test)]
mod device_tests;

#[cfg(test)]
mod workload_label_tests {
    use super::*;
    use ethand_snapshot::gpu::{CollectiveStats, CommRank, GpuProcessStats};
    use ethand_snapshot::{CgroupSnapshot, WorkloadIdentity};

    /// Workload labels on per-process and per-cgroup series; the collective series keep the
    /// communicator's rank (one `rank` label, never two).
    #[test]
    fn workload_labels_on_process_and_cgroup_series() {
        let w = WorkloadIdentity {
            container_runtime: Some("containerd".into()),
            container_id: Some("ab".repeat(32)),
            container: Some("pytorch".into()),
            pod: Some("trainer-0".into()),
            namespace: Some("ml".into()),
            job_id: Some("job-42".into()),
            rank: Some(3),
            ..Default::default()
        };
        let p = ProcessSnapshot {
            pid: 7,
            comm: "python".into(),
            cgroup: "/kubepods/pod1/x".into(),
            sched: snapshot::SchedStats {
                oncpu_ns: 5,
                ..Default::default()
            },
            gpu: Some(GpuProcessStats {
                collectives: vec![CollectiveStats {
                    library: "nccl".into(),
                    operation: "all_reduce".into(),
                    calls: 1,
                    ..Default::default()
                }],
                comm: Some(CommRank {
                    library: "nccl".into(),
                    rank: Some(1),
                    nranks: 4,
                }),
                ..Default::default()
            }),
            workload: Some(w.clone()),
            ..Default::default()
        };
        let snap = NodeSnapshot {
            processes: vec![p],
            cgroups: vec![CgroupSnapshot {
                cgroup: "/kubepods/pod1/x".into(),
                workload: Some(w),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(
            &snap,
            &PrometheusOptions {
                selection: ExportSelection::top(5),
                ..Default::default()
            },
        );
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_string()
        };
        assert_eq!(
            line("ethand_process_cpu_seconds_total{"),
            "ethand_process_cpu_seconds_total{pid=\"7\",comm=\"python\",namespace=\"ml\",pod=\"trainer-0\",container=\"pytorch\",job_id=\"job-42\",rank=\"3\"} 5e-9"
        );
        let info = line("ethand_process_workload_info{");
        assert!(
            info.contains(&format!("container_id=\"{}\"", "ab".repeat(32))),
            "{info}"
        );
        assert!(info.contains("container_runtime=\"containerd\""), "{info}");
        let coll = line("ethand_process_collective_calls_total{");
        assert_eq!(coll.matches("rank=").count(), 1, "{coll}");
        assert!(
            coll.contains("rank=\"1\"") && coll.contains("job_id=\"job-42\""),
            "{coll}"
        );
        let cg = line("ethand_cgroup_cpu_seconds_total{");
        assert!(
            cg.contains("namespace=\"ml\",pod=\"trainer-0\",container=\"pytorch\"")
                && !cg.contains("job_id"),
            "{cg}"
        );
    }
}

/// The hand-written exposition against prometheus-client's encoder, byte for byte.
#[cfg(test)]
mod exposition_tests {
    use super::*;
    use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    enum Sample {
        Int(u64),
        Float(f64),
        Hist(Box<Hist>),
    }

    /// A family as prometheus-client encodes it.
    #[derive(Debug)]
    struct Reference {
        kind: MetricType,
        series: Vec<(Labels, Sample)>,
    }

    impl EncodeMetric for Reference {
        fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
            for (labels, sample) in &self.series {
                let mut e = encoder.encode_family(labels)?;
                match (sample, self.kind) {
                    (Sample::Int(v), MetricType::Counter) => {
                        e.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Sample::Int(v), _) => e.encode_gauge(v)?,
                    (Sample::Float(v), MetricType::Counter) => {
                        e.encode_counter::<NoLabelSet, _, f64>(v, None)?
                    }
                    (Sample::Float(v), _) => e.encode_gauge(v)?,
                    (Sample::Hist(h), _) => {
                        let buckets: Vec<(f64, u64)> = exposed_bucket_bounds_seconds()
                            .into_iter()
                            .zip(h.exposed())
                            .collect();
                        let count = h.buckets.iter().sum();
                        e.encode_histogram::<NoLabelSet>(
                            h.sum_ns as f64 / 1e9,
                            count,
                            &buckets,
                            None,
                        )?
                    }
                }
            }
            Ok(())
        }

        fn metric_type(&self) -> prometheus_client::metrics::MetricType {
            match self.kind {
                MetricType::Counter => prometheus_client::metrics::MetricType::Counter,
                MetricType::Gauge => prometheus_client::metrics::MetricType::Gauge,
                MetricType::Histogram => prometheus_client::metrics::MetricType::Histogram,
            }
        }
    }

    static INTS: Desc = counter(
        "ethand_test_ints_total",
        "Counts, with a backslash \\ and a\nnewline in the help.",
    );
    static FLOATS: Desc = gauge("ethand_test_floats", "Floats of every kind");
    static SECONDS: Desc = counter("ethand_test_seconds_total", "Nanoseconds as seconds.");
    static HISTS: Desc = histogram("ethand_test_latency_seconds", "Histograms.");

    fn label_sets() -> Vec<Labels> {
        vec![
            Labels::new(),
            labels(&[("pid", "1"), ("comm", "plain")], &[]),
            labels(&[("pid", "2"), ("comm", "q\"uote \\back\nline")], &[]),
            labels(&[("pid", "3"), ("comm", "")], &[("syscall", "read")]),
            labels(&[("pid", "4"), ("comm", "ünïcode\u{fffd}\t\u{1b}")], &[]),
        ]
    }

    #[test]
    fn output_matches_prometheus_client() {
        let ints = [0, 1, 42, u64::MAX];
        let floats = [
            0.0,
            -0.0,
            1.5,
            1e-7,
            123_456_789.123,
            1e22,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let sets = label_sets();
        let mut ours = Exposition::with_capacity(0);
        let mut registry = Registry::default();
        let mut reference = |desc: &'static Desc, series: Vec<(Labels, Sample)>| {
            let name = desc.name.strip_suffix("_total").unwrap_or(desc.name);
            let help = desc.help.strip_suffix('.').unwrap_or(desc.help);
            registry.register(
                name,
                help,
                Reference {
                    kind: desc.kind,
                    series,
                },
            );
        };

        let mut fam = Family::<u64>::new(&INTS);
        let mut refs = Vec::new();
        for (l, v) in sets.iter().zip(ints.iter().cycle()) {
            fam.add(l.clone(), *v);
            refs.push((l.clone(), Sample::Int(*v)));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&INTS, refs);

        let mut fam = Family::<f64>::new(&FLOATS);
        let mut refs = Vec::new();
        for (i, v) in floats.iter().enumerate() {
            let l = labels(&[("i", &format!("{i:02}"))], &[]);
            fam.add(l.clone(), *v);
            // As added to a family: merged into a 0.0 (-0.0 becomes 0.0).
            let mut merged = 0.0;
            merged.merge(v);
            refs.push((l, Sample::Float(merged)));
        }
        fam.register(&mut ours);
        reference(&FLOATS, refs);

        let mut fam = Family::<Nanos>::new(&SECONDS);
        let mut refs = Vec::new();
        for (l, ns) in sets
            .iter()
            .zip([0, 1, 999_999_999, 1_234_567_890_123, u64::MAX])
        {
            fam.add(l.clone(), Nanos(ns));
            refs.push((l.clone(), Sample::Float(ns as f64 / 1e9)));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&SECONDS, refs);

        let mut fam = Family::<Hist>::new(&HISTS);
        let mut refs = Vec::new();
        for (k, l) in sets.iter().enumerate() {
            let counts: Vec<u64> = (0..HIST_BUCKETS as u64)
                .map(|b| (b * 7 + k as u64) % 5)
                .collect();
            let h = Hist::new(&counts, 123_456_789 * k as u64);
            fam.add(l.clone(), h.clone());
            refs.push((l.clone(), Sample::Hist(Box::new(h))));
        }
        refs.sort_by(|a, b| a.0.cmp(&b.0));
        fam.register(&mut ours);
        reference(&HISTS, refs);

        // A family without series writes nothing, as the registry skips it.
        Family::<u64>::new(&INTS).register(&mut ours);

        let mut expected = String::new();
        prometheus_text::encode(&mut expected, &registry).unwrap();
        assert!(expected.contains("le=\"1.024e-06\"") && expected.contains("le=\"+Inf\""));
        for (i, (a, b)) in ours.out.lines().zip(expected.lines()).enumerate() {
            assert_eq!(a, b, "line {i}");
        }
        assert_eq!(ours.out, expected);
    }

    #[test]
    fn bucket_bounds_as_go_writes_them() {
        assert_eq!(go_float(2e-9), "2e-09");
        assert_eq!(go_float(0.000131072), "0.000131072");
        assert_eq!(go_float(2.147483648), "2.147483648");
        assert_eq!(go_float(4.0), "4");
        assert_eq!(go_float(1e6), "1e+06");
        assert_eq!(go_float(1.5e300), "1.5e+300");
        assert_eq!(LE[0], "1.024e-06");
        assert_eq!(LE[5], "0.001048576");
        assert_eq!(LE[EXPOSED_BUCKETS - 2], "2.147483648");
        assert_eq!(LE[EXPOSED_BUCKETS - 1], "+Inf");
        assert_eq!(LE.len(), 13);
    }

    /// Each exposed bucket sums the kernel's buckets below its bound: the cumulative counts
    /// at 2^k ns are those of the kernel's log2 histogram, the rest is in +Inf.
    #[test]
    fn kernel_buckets_fold_into_the_exposed_ones() {
        let mut counts = [0u64; HIST_BUCKETS];
        for (i, c) in counts.iter_mut().enumerate() {
            *c = 1 << (i % 8);
        }
        let h = Hist::new(&counts, 0);
        let exposed = h.exposed();
        assert_eq!(exposed.iter().sum::<u64>(), counts.iter().sum::<u64>());
        let mut cumulative = 0;
        for (j, &k) in EXPOSED_POW2.iter().enumerate() {
            cumulative += exposed[j];
            assert_eq!(cumulative, counts[..k].iter().sum::<u64>(), "le 2^{k} ns");
        }
        assert_eq!(exposed[EXPOSED_BUCKETS - 1], counts[31]);
    }
}
