//! The comparison of two snapshots (`ethand compare BEFORE.json AFTER.json`): rows matched by
//! (scope, metric), rates over each side's own basis, and the terminal, CSV and JSON forms.
use super::*;

/// What a compared snapshot was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// "daemon" or "standalone".
    pub source: String,
    pub root_pid: u32,
    pub taken_at_unix_ms: u64,
    /// Standalone measurement time (0 from a daemon).
    pub measured_ms: u64,
    /// The tree's window (0: none).
    pub window_ms: u64,
    pub processes: u64,
    /// What this side's `rate.*` rows divide by: "window" (window change / window
    /// duration), "measured" (totals / `measured_ms`) or "none" (no rates).
    pub rate_basis: String,
}

/// One metric in both snapshots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComparedRow {
    /// "total" (the comparison covers the tree totals, its window and derived signals).
    pub scope: String,
    pub metric: String,
    pub unit: String,
    /// None: the metric is absent from that snapshot (e.g. no GPU calls, no window).
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// after - before, when both are known.
    pub change: Option<f64>,
    /// after / before, when both are known and before is not 0.
    pub ratio: Option<f64>,
    /// "before", "after" or "both": the snapshot that did not measure the metric at all
    /// (kernel launches below GPU level `process`), as opposed to one where it is absent
    /// because nothing happened. Its value is None and the row is no change. Absent: measured
    /// wherever the snapshot could.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
}

/// `ethand compare BEFORE.json AFTER.json`: two snapshots of a workload (typically before and
/// after a change), metric by metric and finding by finding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// [`COMPARISON_SCHEMA_VERSION`].
    pub schema_version: u32,
    pub before: SnapshotMeta,
    pub after: SnapshotMeta,
    /// The tree totals, window and derived metrics matched by name (before's order, then
    /// the ones only after has), then the `rate.*` rows.
    pub rows: Vec<ComparedRow>,
    /// What the tree got done, before and after: the diagnosis signals of each snapshot
    /// that measure throughput (cores used, GPU busy, I/O and network rates, syncs and
    /// collectives per second), computed as the snapshot's findings compute them, so a
    /// figure here is the one its findings quote. Filled by the caller that computes signals
    /// (`ethand compare`); empty otherwise. Shown first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<ComparedRow>,
    /// Findings of `before` whose id `after` does not have (before's rank order).
    pub findings_resolved: Vec<Finding>,
    /// Findings of `after` whose id `before` does not have (after's rank order).
    pub findings_new: Vec<Finding>,
    /// Findings in both, as (before, after), in before's rank order. JSON: `[before, after]`.
    pub findings_remaining: Vec<(Finding, Finding)>,
}

/// A counter that has a window figure: (metric, window field (None: not counted), GPU
/// counter).
pub(super) type RateCounter = (&'static str, fn(&WindowStats) -> Option<u64>, bool);

/// The metrics of kernel launches, which GPU levels below `process` do not count.
pub(super) const LAUNCH_METRICS: &[&str] = &[
    "gpu.launches",
    "gpu.graph_launches",
    "window.gpu_launches",
    "derived.gpu.launches_per_second",
];

/// The metrics `t` did not measure at all (not absent because nothing happened): kernel
/// launches, where its GPU figures were taken below level `process`.
pub(super) fn unmeasured_metrics(t: &TreeSnapshot) -> &'static [&'static str] {
    let launches_not_counted = t.total.gpu.as_ref().is_some_and(|g| g.launches.is_none())
        || t.total
            .gpu_derived
            .as_ref()
            .is_some_and(|d| d.launches_per_second.is_none());
    if launches_not_counted {
        LAUNCH_METRICS
    } else {
        &[]
    }
}

pub(super) fn rate_counters() -> Vec<RateCounter> {
    vec![
        ("sched.oncpu_ns", |w| Some(w.oncpu_ns), false),
        (
            "sched.offcpu_blocked_ns",
            |w| Some(w.offcpu_blocked_ns),
            false,
        ),
        (
            "sched.offcpu_preempted_ns",
            |w| Some(w.offcpu_preempted_ns),
            false,
        ),
        ("sched.runq_wait_ns", |w| Some(w.runq_wait_ns), false),
        ("syscalls.count", |w| Some(w.syscalls), false),
        ("syscalls.time_ns", |w| Some(w.syscall_time_ns), false),
        ("block.read_bytes", |w| Some(w.block_read_bytes), false),
        ("block.write_bytes", |w| Some(w.block_write_bytes), false),
        ("net.tx_bytes", |w| Some(w.net_tx_bytes), false),
        ("net.rx_bytes", |w| Some(w.net_rx_bytes), false),
        ("gpu.launches", |w| w.gpu_launches, true),
        ("gpu.sync.time_ns", |w| Some(w.gpu_sync_ns), true),
        (
            "gpu.copies.host_to_device.bytes",
            |w| Some(w.gpu_copy_h2d_bytes),
            true,
        ),
        (
            "gpu.copies.device_to_host.bytes",
            |w| Some(w.gpu_copy_d2h_bytes),
            true,
        ),
        (
            "gpu.copies.bytes",
            |w| Some(w.gpu_copy_h2d_bytes + w.gpu_copy_d2h_bytes + w.gpu_copy_other_bytes),
            true,
        ),
        ("gpu.collectives.calls", |w| Some(w.collective_calls), true),
        ("gpu.collectives.time_ns", |w| Some(w.collective_ns), true),
    ]
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Basis {
    Window,
    Measured,
    None,
}

impl Basis {
    fn as_str(self) -> &'static str {
        match self {
            Basis::Window => "window",
            Basis::Measured => "measured",
            Basis::None => "none",
        }
    }
}

pub(super) struct Side<'a> {
    t: &'a TreeSnapshot,
    rows: Vec<MetricRow>,
    /// metric -> index in `rows`
    index: std::collections::HashMap<String, usize>,
    window: Option<WindowStats>,
    basis: Basis,
    /// [`unmeasured_metrics`] of `t`.
    unmeasured: &'static [&'static str],
}

impl Side<'_> {
    fn value(&self, metric: &str) -> Option<f64> {
        self.index.get(metric).map(|&i| self.rows[i].value)
    }

    /// Per second rate of a counter on this side's basis. A counter absent from the totals
    /// (a tree without GPU calls) counts as 0; one not measured (launches below GPU level
    /// `process`) has no rate.
    fn rate(&self, metric: &str, field: fn(&WindowStats) -> Option<u64>) -> Option<f64> {
        if self.unmeasured.contains(&metric) {
            return None;
        }
        match self.basis {
            Basis::Window => {
                let w = self.window.as_ref()?;
                let n = match field(w) {
                    Some(n) => n,
                    // Not counted because the tree made no GPU calls: none happened.
                    None if self.t.total.gpu.is_none() => 0,
                    None => return None,
                };
                Some(n as f64 * 1000.0 / w.duration_ms as f64)
            }
            Basis::Measured => {
                Some(self.value(metric).unwrap_or(0.0) * 1000.0 / self.t.measured_ms as f64)
            }
            Basis::None => None,
        }
    }

    fn meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            source: self.t.source.as_str().to_string(),
            root_pid: self.t.root_pid,
            taken_at_unix_ms: self.t.taken_at_unix_ms,
            measured_ms: self.t.measured_ms,
            window_ms: self.window.as_ref().map_or(0, |w| w.duration_ms),
            processes: self.t.total.processes,
            rate_basis: self.basis.as_str().into(),
        }
    }
}

/// One row: both sides, the change and the ratio after / before (None where either side
/// is unmeasured, or before is 0).
pub fn compared(
    scope: &str,
    metric: &str,
    unit: &str,
    b: Option<f64>,
    a: Option<f64>,
) -> ComparedRow {
    let (change, ratio) = match (b, a) {
        (Some(b), Some(a)) => (Some(a - b), (b != 0.0).then(|| a / b)),
        _ => (None, None),
    };
    ComparedRow {
        scope: scope.into(),
        metric: metric.into(),
        unit: unit.into(),
        before: b,
        after: a,
        change,
        ratio,
        not_measured: None,
    }
}

/// [`ComparedRow::not_measured`] of a metric each side did (false) or did not (true) measure.
pub(super) fn not_measured(before: bool, after: bool) -> Option<String> {
    match (before, after) {
        (true, true) => Some("both".into()),
        (true, false) => Some("before".into()),
        (false, true) => Some("after".into()),
        (false, false) => None,
    }
}

/// Compares two snapshots of (typically) the same workload.
///
/// - Only the `total` scope is compared (tree totals, the tree's window and `derived.*`
///   signals), matched by metric name: pids differ between runs, so processes are not.
/// - The two snapshots may cover different durations, so the main counters (CPU and
///   scheduler time, syscalls, block and network bytes, GPU launches, sync time, copy bytes,
///   collectives: those the window tracks) are also compared as rates, in rows named
///   `rate.<metric>` (unit `per_second`). Rates use, when **both** snapshots have a window,
///   the window change divided by the window duration for both (the same kind of figure on
///   each side: "what it was doing lately"); otherwise each side divides its totals by its
///   `measured_ms` (standalone snapshots, whose totals cover exactly the measurement), or
///   falls back to its own window when it has no `measured_ms`; a side with neither has no
///   rate. [`SnapshotMeta::rate_basis`] says which was used. GPU rate rows appear only when
///   one of the snapshots has GPU figures.
/// - Findings are matched by id: resolved (before only), new (after only), remaining (both).
pub fn compare(before: &TreeSnapshot, after: &TreeSnapshot) -> Comparison {
    fn side(t: &TreeSnapshot) -> Side<'_> {
        let mut rows = Vec::new();
        total_rows(t, &mut rows);
        let mut index = std::collections::HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            index.entry(r.metric.clone()).or_insert(i);
        }
        Side {
            t,
            rows,
            index,
            window: tree_window(t),
            basis: Basis::None,
            unmeasured: unmeasured_metrics(t),
        }
    }
    let mut b = side(before);
    let mut a = side(after);
    let both_windows = b.window.is_some() && a.window.is_some();
    for s in [&mut b, &mut a] {
        s.basis = if both_windows {
            Basis::Window
        } else if s.t.measured_ms > 0 {
            Basis::Measured
        } else if s.window.is_some() {
            Basis::Window
        } else {
            Basis::None
        };
    }

    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in b.rows.iter().chain(a.rows.iter()) {
        if !seen.insert(r.metric.as_str()) {
            continue;
        }
        let mut row = compared(
            "total",
            &r.metric,
            &r.unit,
            b.value(&r.metric),
            a.value(&r.metric),
        );
        let m = r.metric.as_str();
        row.not_measured = not_measured(b.unmeasured.contains(&m), a.unmeasured.contains(&m));
        rows.push(row);
    }
    let gpu = before.total.gpu.is_some() || after.total.gpu.is_some();
    for (metric, field, is_gpu) in rate_counters() {
        if is_gpu && !gpu {
            continue;
        }
        let mut row = compared(
            "total",
            &format!("rate.{metric}"),
            unit::PER_SECOND,
            b.rate(metric, field),
            a.rate(metric, field),
        );
        row.not_measured = not_measured(
            b.unmeasured.contains(&metric),
            a.unmeasured.contains(&metric),
        );
        rows.push(row);
    }

    let mut findings_resolved = Vec::new();
    let mut findings_remaining = Vec::new();
    let mut matched = vec![false; after.findings.len()];
    for f in &before.findings {
        let hit = after
            .findings
            .iter()
            .enumerate()
            .position(|(i, g)| !matched[i] && g.id == f.id);
        match hit {
            Some(i) => {
                matched[i] = true;
                findings_remaining.push((f.clone(), after.findings[i].clone()));
            }
            None => findings_resolved.push(f.clone()),
        }
    }
    let findings_new = after
        .findings
        .iter()
        .zip(&matched)
        .filter(|(_, m)| !**m)
        .map(|(f, _)| f.clone())
        .collect();
    Comparison {
        schema_version: COMPARISON_SCHEMA_VERSION,
        before: b.meta(),
        after: a.meta(),
        rows,
        outcomes: Vec::new(),
        findings_resolved,
        findings_new,
        findings_remaining,
    }
}

/// `ethand compare --csv`: header `scope,metric,unit,before,after,change,ratio` (empty field:
/// unknown), the compared rows, then one row per finding: `finding,<id>,impact,<impact
/// before>,<impact after>,<change>,<ratio>` (resolved: no after; new: no before), in the
/// order resolved, remaining, new. RFC 4180 quoting, LF line ends.
pub fn comparison_to_csv(c: &Comparison) -> String {
    let mut o = String::from("scope,metric,unit,before,after,change,ratio\n");
    let mut line = |r: &ComparedRow| {
        csv_line(
            &mut o,
            &[
                &r.scope,
                &r.metric,
                &r.unit,
                &csv_num(r.before),
                &csv_num(r.after),
                &csv_num(r.change),
                &csv_num(r.ratio),
            ],
        )
    };
    for r in c.outcomes.iter().chain(&c.rows) {
        line(r);
    }
    for f in &c.findings_resolved {
        line(&compared(
            "finding",
            &f.id,
            unit::IMPACT,
            Some(f.impact),
            None,
        ));
    }
    for (b, a) in &c.findings_remaining {
        line(&compared(
            "finding",
            &b.id,
            unit::IMPACT,
            Some(b.impact),
            Some(a.impact),
        ));
    }
    for f in &c.findings_new {
        line(&compared(
            "finding",
            &f.id,
            unit::IMPACT,
            None,
            Some(f.impact),
        ));
    }
    o
}

/// Relative change used to rank rows: |change| / |before|; infinite when the metric appeared,
/// disappeared or grew from 0; None when nothing changed or one side did not measure it.
pub(super) fn relative_change(r: &ComparedRow) -> Option<f64> {
    if r.not_measured.is_some() {
        return None;
    }
    match (r.before, r.after) {
        (Some(b), Some(a)) => {
            let d = a - b;
            if d == 0.0 || !d.is_finite() {
                None
            } else if b == 0.0 {
                Some(f64::INFINITY)
            } else {
                Some((d / b).abs())
            }
        }
        (None, None) => None,
        _ => Some(f64::INFINITY),
    }
}

/// A value in its unit; `base` is the unit of the counter a `rate.*` row comes from.
pub(super) fn human(v: f64, unit: &str, base: Option<&str>) -> String {
    match unit {
        unit::NS => duration_ns(v),
        unit::BYTES => bytes(v),
        unit::COUNT | unit::IMPACT => exact(v),
        unit::RATIO => significant(v),
        unit::PER_SECOND => match base {
            Some(unit::BYTES) => bytes_per_second(v),
            // ns per second: seconds of the activity per second of wall time.
            Some(unit::NS) => format!("{:.3}s/s", v / 1e9),
            _ => format!("{v:.1}/s"),
        },
        _ => in_unit(v, unit),
    }
}

pub(super) fn describe(m: &SnapshotMeta) -> String {
    let mut s = format!(
        "{} snapshot of pid {} ({} process{}) at {}",
        if m.source.is_empty() { "?" } else { &m.source },
        m.root_pid,
        m.processes,
        if m.processes == 1 { "" } else { "es" },
        utc(m.taken_at_unix_ms)
    );
    if m.measured_ms > 0 {
        let _ = write!(s, ", measured {:.1}s", m.measured_ms as f64 / 1000.0);
    }
    if m.window_ms > 0 {
        let _ = write!(s, ", window {:.1}s", m.window_ms as f64 / 1000.0);
    }
    let _ = write!(s, "; rates over: {}", m.rate_basis);
    s
}

pub(super) struct Paint(bool);

impl Paint {
    fn p(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

/// Terminal form of a comparison: the [`RENDER_TOP`] metrics that changed most (by relative
/// change; appeared, disappeared or from-zero first), then the findings: resolved, new and
/// still there, with their titles and impact before -> after. `color`: ANSI colors.
pub fn render_comparison(c: &Comparison, color: bool) -> String {
    let paint = Paint(color);
    let mut o = String::new();
    let _ = writeln!(o, "{} {}", paint.p("1", "before:"), describe(&c.before));
    let _ = writeln!(o, "{} {}", paint.p("1", "after: "), describe(&c.after));
    outcomes(&mut o, c, &paint);
    let _ = writeln!(o);
    findings(&mut o, c, &paint);
    most_changed(&mut o, c, &paint);
    not_compared(&mut o, c);
    o
}

/// "Outcomes": what the tree got done, before and after, each with its ratio.
fn outcomes(o: &mut String, c: &Comparison, paint: &Paint) {
    if c.outcomes.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{}",
        paint.p(
            "1",
            "Outcomes (what the tree got done, as its findings measure it)"
        )
    );
    let width = c
        .outcomes
        .iter()
        .map(|r| r.metric.chars().count())
        .max()
        .unwrap_or(6)
        .clamp(6, 64);
    let _ = writeln!(
        o,
        "{}",
        paint.p(
            "1",
            &format!(
                "{:<width$}  {:>14}  {:>14}  {:>12}",
                "OUTCOME", "BEFORE", "AFTER", "AFTER/BEFORE"
            )
        )
    );
    let show =
        |v: Option<f64>, unit: &str| v.map_or("unmeasured".to_string(), |v| in_unit(v, unit));
    for r in &c.outcomes {
        let ratio = r.ratio.map_or("-".to_string(), |x| format!("{x:.2}x"));
        let _ = writeln!(
            o,
            "{:<width$}  {:>14}  {:>14}  {:>12}",
            for_terminal(&r.metric),
            show(r.before, &r.unit),
            show(r.after, &r.unit),
            ratio
        );
    }
}

/// The [`RENDER_TOP`] metrics that changed most, by relative change.
fn most_changed(o: &mut String, c: &Comparison, paint: &Paint) {
    let units: BTreeMap<&str, &str> = c
        .rows
        .iter()
        .map(|r| (r.metric.as_str(), r.unit.as_str()))
        .collect();
    let mut ranked: Vec<(f64, &ComparedRow)> = c
        .rows
        .iter()
        .filter_map(|r| relative_change(r).map(|x| (x, r)))
        .collect();
    ranked.sort_by(|x, y| {
        y.0.total_cmp(&x.0)
            .then_with(|| {
                let dx = x.1.change.map_or(0.0, f64::abs);
                let dy = y.1.change.map_or(0.0, f64::abs);
                dy.total_cmp(&dx)
            })
            .then_with(|| x.1.metric.cmp(&y.1.metric))
    });
    let shown: Vec<&(f64, &ComparedRow)> = ranked.iter().take(RENDER_TOP).collect();
    let _ = writeln!(o);
    if shown.is_empty() {
        let _ = writeln!(o, "no metric changed");
    } else {
        let width = shown
            .iter()
            .map(|(_, r)| r.metric.chars().count())
            .max()
            .unwrap_or(6)
            .clamp(6, 64);
        let _ = writeln!(
            o,
            "{}",
            paint.p(
                "1",
                &format!(
                    "Most changed: {} of {} metrics ({} changed), by relative change",
                    shown.len(),
                    c.rows.len(),
                    ranked.len()
                )
            )
        );
        let _ = writeln!(
            o,
            "{}",
            paint.p(
                "1",
                &format!(
                    "{:<width$}  {:>14}  {:>14}  {:>14}  {:>9}",
                    "METRIC", "BEFORE", "AFTER", "CHANGE", "RELATIVE"
                )
            )
        );
        for (rel, r) in shown {
            changed_row(o, *rel, r, &units, width, paint);
        }
    }
}

/// One metric's line: before, after, change (colored by direction) and relative change.
fn changed_row(
    o: &mut String,
    rel: f64,
    r: &ComparedRow,
    units: &BTreeMap<&str, &str>,
    width: usize,
    paint: &Paint,
) {
    let base = r
        .metric
        .strip_prefix("rate.")
        .and_then(|m| units.get(m).copied());
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| human(v, &r.unit, base));
    let change = r.change.map_or("-".to_string(), |d| {
        let s = human(d, &r.unit, base);
        if d > 0.0 { format!("+{s}") } else { s }
    });
    let relative = match (r.before, r.after) {
        (None, Some(_)) => "appeared".to_string(),
        (Some(_), None) => "gone".to_string(),
        _ if rel.is_infinite() => "from 0".to_string(),
        _ => {
            let pct = r.change.unwrap_or(0.0) / r.before.unwrap_or(1.0).abs() * 100.0;
            format!("{pct:+.1}%")
        }
    };
    let code = if r.change.unwrap_or(0.0) > 0.0 || r.before.is_none() {
        "33"
    } else {
        "36"
    };
    let _ = writeln!(
        o,
        "{:<width$}  {:>14}  {:>14}  {}  {:>9}",
        for_terminal(&r.metric),
        fmt(r.before),
        fmt(r.after),
        paint.p(code, &format!("{change:>14}")),
        relative
    );
}

/// Metrics a side did not measure: no change to show, and not a change from 0.
fn not_compared(o: &mut String, c: &Comparison) {
    let mut blank = true;
    for side in ["before", "after", "both"] {
        let names: Vec<String> = c
            .rows
            .iter()
            .filter(|r| r.not_measured.as_deref() == Some(side))
            .map(|r| for_terminal(&r.metric))
            .collect();
        if names.is_empty() {
            continue;
        }
        let which = match side {
            "both" => "in either snapshot",
            "before" => "in before",
            _ => "in after",
        };
        if std::mem::take(&mut blank) {
            let _ = writeln!(o);
        }
        let _ = writeln!(
            o,
            "not compared, not measured {which} (kernel launches are counted at GPU level process or op, or sampled by `ethand snapshot`): {}",
            names.join(", ")
        );
    }
}

/// The findings: resolved, new and still there, with their impact before -> after.
fn findings(o: &mut String, c: &Comparison, paint: &Paint) {
    let impact = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    if c.findings_resolved.is_empty()
        && c.findings_new.is_empty()
        && c.findings_remaining.is_empty()
    {
        let _ = writeln!(o, "findings: none in either snapshot");
    }
    for f in &c.findings_resolved {
        let _ = writeln!(
            o,
            "{} {} ({}), impact {} -> -",
            paint.p("32;1", "resolved:"),
            for_terminal(&f.title),
            for_terminal(&f.id),
            impact(Some(f.impact))
        );
    }
    for f in &c.findings_new {
        let _ = writeln!(
            o,
            "{} {} ({}, {}), impact - -> {}",
            paint.p("31;1", "new:     "),
            for_terminal(&f.title),
            for_terminal(&f.id),
            for_terminal(f.severity.as_str()),
            impact(Some(f.impact))
        );
    }
    for (b, a) in &c.findings_remaining {
        let _ = writeln!(
            o,
            "{} {} ({}), impact {} -> {}",
            paint.p("33;1", "still:   "),
            for_terminal(&a.title),
            for_terminal(&a.id),
            impact(Some(b.impact)),
            impact(Some(a.impact))
        );
    }
}
