//! Inline SVG time-series charts of a snapshot's timeline, drawn here (no script, no external resource).
use super::*;

// ---------------------------------------------------------------------------------------
// Charts.

#[derive(Clone, Copy)]
pub(super) enum Scale {
    /// Plain numbers with a unit suffix.
    Plain(&'static str),
    /// Bytes per second, in binary units chosen by the maximum.
    BytesPerSec,
    /// Ratios (0-1) shown as percent.
    Percent,
}

pub(super) struct Series {
    name: &'static str,
    color: &'static str,
    values: Vec<f64>,
}

/// A 1-2-5 step giving about `n` intervals up to `max`.
pub(super) fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

pub(super) fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        ((-step.log10()).ceil() as usize).min(4)
    };
    let s = format!("{v:.decimals$}");
    if v >= 10_000.0 && decimals == 0 {
        count(v as u64)
    } else {
        s
    }
}

pub(super) const W: f64 = 600.0;
pub(super) const H: f64 = 230.0;
pub(super) const ML: f64 = 70.0;
pub(super) const MR: f64 = 14.0;
pub(super) const MT: f64 = 26.0;
pub(super) const MB: f64 = 42.0;

/// Where a chart's values land: the plot area (`pw` by `ph` inside the margins), the x axis
/// from `x0` to 0 and the y axis from 0 to `ymax` in ticks of `step`.
struct Plot {
    x0: f64,
    ymax: f64,
    step: f64,
    pw: f64,
    ph: f64,
}

impl Plot {
    fn px(&self, x: f64) -> f64 {
        ML + (x - self.x0) / (0.0 - self.x0) * self.pw
    }

    fn py(&self, y: f64) -> f64 {
        MT + self.ph - (y / self.ymax).clamp(0.0, 1.0) * self.ph
    }
}

/// The divisor that brings the series' values into the chart's unit, and that unit.
fn unit_of(series: &[Series], scale: Scale) -> (f64, String) {
    match scale {
        Scale::Plain(u) => (1.0, u.to_string()),
        Scale::Percent => (0.01, "%".into()),
        Scale::BytesPerSec => {
            let max = series
                .iter()
                .flat_map(|s| s.values.iter().copied())
                .fold(0.0, f64::max);
            let mut d = 1.0;
            let mut i = 0;
            const U: [&str; 5] = ["B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"];
            while max / d >= 1024.0 && i < U.len() - 1 {
                d *= 1024.0;
                i += 1;
            }
            (d, U[i].into())
        }
    }
}

/// A line chart of `series` over `xs` (seconds relative to the last point, <= 0).
pub(super) fn chart(
    o: &mut String,
    title: &str,
    what: &str,
    xs: &[f64],
    series: &[Series],
    scale: Scale,
) {
    let (div, unit) = unit_of(series, scale);
    let scaled: Vec<Vec<f64>> = series
        .iter()
        .map(|s| s.values.iter().map(|v| v / div).collect())
        .collect();
    let max = scaled.iter().flatten().copied().fold(0.0, f64::max);
    let idle = max <= 0.0;
    let step = if idle { 0.25 } else { nice_step(max, 4.0) };
    let ymax = if idle {
        1.0
    } else {
        (max / step).ceil().max(1.0) * step
    };
    let plot = Plot {
        x0: xs.first().copied().unwrap_or(-1.0).min(-1e-3),
        ymax,
        step,
        pw: W - ML - MR,
        ph: H - MT - MB,
    };

    w!(
        o,
        "<figure class=\"chart\"><figcaption><b>{}</b> <span>{}</span></figcaption>",
        escape(title),
        escape(what)
    );
    w!(
        o,
        "<svg viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\">",
        escape(title)
    );
    y_axis(o, &plot, &unit);
    x_axis(o, &plot);
    lines(o, &plot, xs, series, &scaled, &unit);
    legend(o, series);
    if idle {
        w!(
            o,
            "<text class=\"idle\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no activity in the window</text>",
            ML + plot.pw / 2.0,
            MT + plot.ph / 2.0
        );
    }
    o.push_str("</svg><div class=\"stats\">");
    stats(o, series, &scaled, &unit);
    o.push_str("</div></figure>\n");
}

/// The grid, the y axis's tick labels and its unit.
fn y_axis(o: &mut String, plot: &Plot, unit: &str) {
    let (ymax, step, ph) = (plot.ymax, plot.step, plot.ph);
    let mut y = 0.0;
    while y <= ymax + step * 1e-6 {
        let yy = plot.py(y);
        w!(
            o,
            "<line class=\"grid\" x1=\"{ML}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/>",
            W - MR
        );
        w!(
            o,
            "<text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            ML - 6.0,
            yy + 4.0,
            tick_label(y, step)
        );
        y += step;
    }
    w!(
        o,
        "<text class=\"unit\" x=\"12\" y=\"{:.1}\" transform=\"rotate(-90 12 {:.1})\" text-anchor=\"middle\">{}</text>",
        MT + ph / 2.0,
        MT + ph / 2.0,
        escape(unit)
    );
}

/// The x axis (seconds before the snapshot), then both axis lines.
fn x_axis(o: &mut String, plot: &Plot) {
    let (x0, pw, ph) = (plot.x0, plot.pw, plot.ph);
    let span = -x0;
    let xstep = [
        0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| span / s <= 8.0)
    .unwrap_or(7200.0);
    let mut x = 0.0;
    while x >= x0 - 1e-9 {
        let xx = plot.px(x);
        w!(
            o,
            "<line class=\"xtick\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
            MT + ph,
            MT + ph + 4.0
        );
        let label = if x == 0.0 {
            "0".to_string()
        } else {
            tick_label(x, xstep)
        };
        w!(
            o,
            "<text class=\"tick\" x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            MT + ph + 16.0,
            label
        );
        x -= xstep;
    }
    w!(
        o,
        "<line class=\"axis\" x1=\"{ML}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
        W - MR,
        MT + ph,
        MT + ph
    );
    w!(
        o,
        "<line class=\"axis\" x1=\"{ML}\" x2=\"{ML}\" y1=\"{MT}\" y2=\"{:.1}\"/>",
        MT + ph
    );
    w!(
        o,
        "<text class=\"unit\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds before the snapshot</text>",
        ML + pw / 2.0,
        H - 6.0
    );
}

/// The series: an area under the first, lines, points with tooltips.
fn lines(
    o: &mut String,
    plot: &Plot,
    xs: &[f64],
    series: &[Series],
    scaled: &[Vec<f64>],
    unit: &str,
) {
    for (i, (s, vals)) in series.iter().zip(scaled).enumerate() {
        if vals.is_empty() {
            continue;
        }
        let pts: Vec<(f64, f64)> = xs
            .iter()
            .zip(vals)
            .map(|(&x, &v)| (plot.px(x), plot.py(v)))
            .collect();
        let mut d = String::new();
        for (j, (x, y)) in pts.iter().enumerate() {
            w!(d, "{}{x:.1},{y:.1}", if j == 0 { "M" } else { " L" });
        }
        if i == 0 && pts.len() > 1 {
            let base = MT + plot.ph;
            w!(
                o,
                "<path d=\"{d} L{:.1},{base:.1} L{:.1},{base:.1} Z\" fill=\"{}\" fill-opacity=\"0.12\" stroke=\"none\"/>",
                pts[pts.len() - 1].0,
                pts[0].0,
                s.color
            );
        }
        w!(
            o,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-linejoin=\"round\"/>",
            s.color
        );
        if pts.len() <= 120 {
            for ((x, y), (v, t)) in pts.iter().zip(vals.iter().zip(xs)) {
                w!(
                    o,
                    "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{}\" fill=\"{}\"><title>{}: {} {} at {:.1} s</title></circle>",
                    if pts.len() == 1 { 4.0 } else { 2.2 },
                    s.color,
                    s.name,
                    tick_label(*v, plot.step / 10.0),
                    escape(unit),
                    t
                );
            }
        }
    }
}

/// The legend, right-aligned along the top.
fn legend(o: &mut String, series: &[Series]) {
    let mut lx = W - MR;
    for s in series.iter().rev() {
        let wtxt = 7.0 * s.name.chars().count() as f64 + 22.0;
        lx -= wtxt;
        w!(
            o,
            "<rect x=\"{lx:.1}\" y=\"8\" width=\"12\" height=\"4\" rx=\"1\" fill=\"{}\"/><text class=\"legend\" x=\"{:.1}\" y=\"14\">{}</text>",
            s.color,
            lx + 16.0,
            s.name
        );
    }
}

/// Each series' mean and peak, under the chart.
fn stats(o: &mut String, series: &[Series], scaled: &[Vec<f64>], unit: &str) {
    for (s, vals) in series.iter().zip(scaled) {
        let n = vals.len().max(1) as f64;
        let avg = vals.iter().sum::<f64>() / n;
        let peak = vals.iter().copied().fold(0.0, f64::max);
        let f = |v: f64| {
            format!(
                "{} {}",
                tick_label(v, if v.abs() >= 10.0 { 1.0 } else { 0.01 }),
                unit
            )
        };
        w!(
            o,
            "<span><i style=\"background:{}\"></i>{} avg <b>{}</b> · peak <b>{}</b></span>",
            s.color,
            s.name,
            escape(&f(avg)),
            escape(&f(peak))
        );
    }
}

/// Per-second rate of a per-interval quantity.
fn rate(tl: &[TimelinePoint], f: fn(&TimelinePoint) -> u64) -> Vec<f64> {
    tl.iter()
        .map(|p| {
            if p.interval_ms == 0 {
                0.0
            } else {
                f(p) as f64 * 1000.0 / p.interval_ms as f64
            }
        })
        .collect()
}

/// Share of wall time of a per-interval duration (ns / interval).
fn share(tl: &[TimelinePoint], f: fn(&TimelinePoint) -> u64) -> Vec<f64> {
    tl.iter()
        .map(|p| {
            if p.interval_ms == 0 {
                0.0
            } else {
                f(p) as f64 / (p.interval_ms as f64 * 1e6)
            }
        })
        .collect()
}

pub(super) fn charts(o: &mut String, t: &TreeSnapshot) {
    let tl: &[TimelinePoint] = &t.timeline;
    o.push_str("<section><h2>Over time</h2>");
    if tl.is_empty() {
        let why = if t.source == ethand_snapshot::SnapshotSource::Standalone {
            "This snapshot was measured by a standalone ethand (no daemon was running), which keeps no per-interval history. Run the daemon (<code>ethand run</code>) and take the snapshot from it to get time-series charts."
        } else {
            "The daemon had no per-interval history for this process tree yet (it was seen for less than two collection intervals). Take the snapshot again a few seconds later to get time-series charts."
        };
        w!(
            o,
            "<div class=\"note\"><b>No time series.</b> {why}</div></section>\n"
        );
        return;
    }
    let last = tl.last().map_or(0, |p| p.t_unix_ms);
    let xs: Vec<f64> = tl
        .iter()
        .map(|p| -((last.saturating_sub(p.t_unix_ms)) as f64) / 1000.0)
        .collect();
    let iv = tl.iter().map(|p| p.interval_ms).max().unwrap_or(0);
    w!(
        o,
        "<p class=\"sub\">{} points, one per collection interval ({}), window ending {}. Sums over every process of the tree.</p><div class=\"charts\">",
        tl.len(),
        duration_ns_u(iv * 1_000_000),
        utc(last)
    );
    process_charts(o, tl, &xs);
    let gpu_active = t.total.gpu.is_some()
        || tl.iter().any(|p| {
            p.gpu_launches.unwrap_or(0) + p.gpu_sync_ns + p.gpu_copy_bytes + p.collective_ns > 0
        });
    // Launches only where every interval counted them: an uncounted one is not a 0.
    let launches_counted = tl.iter().all(|p| p.gpu_launches.is_some());
    if gpu_active {
        gpu_charts(o, tl, &xs, launches_counted);
    }
    o.push_str("</div>");
    if !gpu_active {
        o.push_str(
            "<p class=\"sub\">No GPU/NPU runtime calls in the window: GPU charts left out.</p>",
        );
    } else if !launches_counted {
        w!(
            o,
            "<p class=\"sub\">Kernel launches {} over the window: no launches chart.</p>",
            launches_not_measured(t)
        );
    }
    o.push_str("</section>\n");
}

/// CPU, scheduler, syscalls, disk and network over the timeline.
fn process_charts(o: &mut String, tl: &[TimelinePoint], xs: &[f64]) {
    chart(
        o,
        "CPU",
        "cores used (on-CPU time / interval)",
        xs,
        &[Series {
            name: "on-CPU",
            color: "#2563eb",
            values: share(tl, |p| p.oncpu_ns),
        }],
        Scale::Plain("cores"),
    );
    chart(
        o,
        "Scheduler wait",
        "threads runnable but waiting for a CPU (run-queue wait / interval)",
        xs,
        &[Series {
            name: "run-queue wait",
            color: "#dc2626",
            values: share(tl, |p| p.runq_wait_ns),
        }],
        Scale::Plain("threads"),
    );
    chart(
        o,
        "Off-CPU, blocked",
        "threads sleeping or waiting on I/O, locks (blocked time / interval)",
        xs,
        &[Series {
            name: "blocked",
            color: "#7c3aed",
            values: share(tl, |p| p.offcpu_blocked_ns),
        }],
        Scale::Plain("threads"),
    );
    chart(
        o,
        "System calls",
        "calls per second",
        xs,
        &[Series {
            name: "syscalls",
            color: "#0891b2",
            values: rate(tl, |p| p.syscalls),
        }],
        Scale::Plain("calls/s"),
    );
    chart(
        o,
        "Disk",
        "block I/O bytes per second",
        xs,
        &[
            Series {
                name: "read",
                color: "#059669",
                values: rate(tl, |p| p.block_read_bytes),
            },
            Series {
                name: "write",
                color: "#d97706",
                values: rate(tl, |p| p.block_write_bytes),
            },
        ],
        Scale::BytesPerSec,
    );
    chart(
        o,
        "Network",
        "TCP + UDP bytes per second",
        xs,
        &[
            Series {
                name: "received",
                color: "#0d9488",
                values: rate(tl, |p| p.net_rx_bytes),
            },
            Series {
                name: "sent",
                color: "#db2777",
                values: rate(tl, |p| p.net_tx_bytes),
            },
        ],
        Scale::BytesPerSec,
    );
}

/// Launches (where every interval counted them), host time in sync and collectives, copies.
fn gpu_charts(o: &mut String, tl: &[TimelinePoint], xs: &[f64], launches_counted: bool) {
    if launches_counted {
        chart(
            o,
            "GPU/NPU launches",
            "kernel launches and operator executions per second",
            xs,
            &[Series {
                name: "launches",
                color: "#16a34a",
                values: rate(tl, |p| p.gpu_launches.unwrap_or(0)),
            }],
            Scale::Plain("launches/s"),
        );
    }
    chart(
        o,
        "GPU/NPU host time",
        "share of wall time the tree's threads spent blocked in synchronization / inside collectives (summed over threads)",
        xs,
        &[
            Series {
                name: "sync-blocked",
                color: "#dc2626",
                values: share(tl, |p| p.gpu_sync_ns),
            },
            Series {
                name: "collectives",
                color: "#9333ea",
                values: share(tl, |p| p.collective_ns),
            },
        ],
        Scale::Percent,
    );
    chart(
        o,
        "GPU/NPU copies",
        "bytes per second copied by runtime calls (all directions)",
        xs,
        &[Series {
            name: "copies",
            color: "#ca8a04",
            values: rate(tl, |p| p.gpu_copy_bytes),
        }],
        Scale::BytesPerSec,
    );
}
