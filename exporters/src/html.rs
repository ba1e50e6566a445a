//! `ethand snapshot --html FILE`: one self-contained HTML report of a process tree, meant to be
//! sent around. No external resource and no JavaScript: inline CSS, inline SVG charts drawn
//! here, and a Content-Security-Policy that forbids loading anything. Every string that comes
//! from the machine (process names, command lines, cgroup paths, device names, findings) goes
//! through [`escape`].
use std::{collections::HashMap, fmt::Write as _};

use ethand_snapshot::{
    ProcessSnapshot, TreeSnapshot,
    devices::DevicesSnapshot,
    diagnosis::{Finding, NotEvaluated, TimelinePoint},
    gpu::{GpuProcessStats, LaunchSample},
};

/// `write!` into a String (cannot fail).
macro_rules! w {
    ($o:expr, $($a:tt)*) => {{ let _ = write!($o, $($a)*); }};
}

/// A process's command line as one string, marked when ethand kept only its start.
fn cmdline_text(p: &ethand_snapshot::ProcessSnapshot) -> String {
    let mut cmd = p.cmdline.join(" ");
    if p.cmdline_truncated {
        cmd.push_str(" [truncated at 4 KiB]");
    }
    cmd
}

/// HTML-escapes text for element content and quoted attribute values. Control characters
/// and characters that hide or reorder text (`text::needs_escape`) are shown as `\u{..}`
/// escapes; noncharacters become
/// U+FFFD, so that the output is always valid HTML text.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if crate::text::needs_escape(c) => {
                for e in c.escape_unicode() {
                    o.push(e);
                }
            }
            c if matches!(c as u32, 0xfdd0..=0xfdef) || (c as u32 & 0xfffe) == 0xfffe => {
                o.push('\u{fffd}')
            }
            c => o.push(c),
        }
    }
    o
}

// ---------------------------------------------------------------------------------------
// Number formatting.

fn count(n: u64) -> String {
    let s = n.to_string();
    let mut o = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            o.push(',');
        }
        o.push(ch);
    }
    o
}

/// "1 error", "2 errors", "3 context switches".
fn plural(n: u64, what: &str) -> String {
    match (n, what.ends_with("ch") || what.ends_with('s')) {
        (1, _) => format!("1 {what}"),
        (_, true) => format!("{} {what}es", count(n)),
        _ => format!("{} {what}s", count(n)),
    }
}

fn bytes_f(b: f64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut i = 0;
    while v.abs() >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else if v.abs() >= 100.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn bytes(b: u64) -> String {
    bytes_f(b as f64)
}

fn dur_s(s: f64) -> String {
    let a = s.abs();
    if a == 0.0 {
        "0 s".into()
    } else if a < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if a < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if a < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if a < 600.0 {
        format!("{s:.2} s")
    } else if a < 7200.0 {
        format!("{:.0} min {:.0} s", (s / 60.0).floor(), s % 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

fn dur(ns: u64) -> String {
    dur_s(ns as f64 / 1e9)
}

fn pct(r: f64) -> String {
    if r != 0.0 && (r * 100.0).abs() < 0.1 {
        format!("{:.2} %", r * 100.0)
    } else {
        format!("{:.1} %", r * 100.0)
    }
}

fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if a >= 1e4 {
        count(v.round() as u64)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Where kernel launches were not counted: "not measured at level calls" (the GPU level the
/// figures were taken at), never a 0.
fn launches_not_measured(t: &TreeSnapshot) -> String {
    match &t.gpu_level {
        Some(l) => format!("not measured at level {}", escape(l)),
        None => "not measured".into(),
    }
}

/// A launch count, or [`launches_not_measured`] (dimmed) where it was not counted.
fn launches_cell(n: Option<u64>, t: &TreeSnapshot) -> String {
    n.map_or_else(
        || format!("<span class=\"na\">{}</span>", launches_not_measured(t)),
        count,
    )
}

/// An evidence value in its unit.
fn evidence_value(v: f64, unit: &str) -> String {
    match unit {
        "ratio" | "share" | "fraction" => pct(v),
        "percent" => format!("{v:.1} %"),
        "bytes" => bytes_f(v),
        "bytes_per_second" => format!("{}/s", bytes_f(v)),
        "seconds" | "s" => dur_s(v),
        "ns" | "nanoseconds" => dur_s(v / 1e9),
        "ms" | "milliseconds" => dur_s(v / 1e3),
        "count" => num(v),
        "per_second" => format!("{} /s", num(v)),
        "cores" => format!("{v:.2} cores"),
        "" => num(v),
        u => format!("{} {}", num(v), escape(u)),
    }
}

/// UTC "YYYY-MM-DD HH:MM:SS" from ms since the epoch (proleptic Gregorian calendar).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------
// Charts.

#[derive(Clone, Copy)]
enum Scale {
    /// Plain numbers with a unit suffix.
    Plain(&'static str),
    /// Bytes per second, in binary units chosen by the maximum.
    BytesPerSec,
    /// Ratios (0-1) shown as percent.
    Percent,
}

struct Series {
    name: &'static str,
    color: &'static str,
    values: Vec<f64>,
}

/// A 1-2-5 step giving about `n` intervals up to `max`.
fn nice_step(max: f64, n: f64) -> f64 {
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

fn tick_label(v: f64, step: f64) -> String {
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

const W: f64 = 600.0;
const H: f64 = 230.0;
const ML: f64 = 70.0;
const MR: f64 = 14.0;
const MT: f64 = 26.0;
const MB: f64 = 42.0;

/// A line chart of `series` over `xs` (seconds relative to the last point, <= 0).
fn chart(o: &mut String, title: &str, what: &str, xs: &[f64], series: &[Series], scale: Scale) {
    let (div, unit): (f64, String) = match scale {
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
    };
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
    let x0 = xs.first().copied().unwrap_or(-1.0).min(-1e-3);
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let px = |x: f64| ML + (x - x0) / (0.0 - x0) * pw;
    let py = |y: f64| MT + ph - (y / ymax).clamp(0.0, 1.0) * ph;

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
    // Grid and y axis.
    let mut y = 0.0;
    while y <= ymax + step * 1e-6 {
        let yy = py(y);
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
        escape(&unit)
    );
    // X axis: seconds before the snapshot.
    let span = -x0;
    let xstep = [
        0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| span / s <= 8.0)
    .unwrap_or(7200.0);
    let mut x = 0.0;
    while x >= x0 - 1e-9 {
        let xx = px(x);
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
    // Series: an area under the first, lines, points with tooltips.
    for (i, (s, vals)) in series.iter().zip(&scaled).enumerate() {
        if vals.is_empty() {
            continue;
        }
        let pts: Vec<(f64, f64)> = xs.iter().zip(vals).map(|(&x, &v)| (px(x), py(v))).collect();
        let mut d = String::new();
        for (j, (x, y)) in pts.iter().enumerate() {
            w!(d, "{}{x:.1},{y:.1}", if j == 0 { "M" } else { " L" });
        }
        if i == 0 && pts.len() > 1 {
            let base = MT + ph;
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
                    tick_label(*v, step / 10.0),
                    escape(&unit),
                    t
                );
            }
        }
    }
    // Legend.
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
    if idle {
        w!(
            o,
            "<text class=\"idle\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no activity in the window</text>",
            ML + pw / 2.0,
            MT + ph / 2.0
        );
    }
    o.push_str("</svg><div class=\"stats\">");
    for (s, vals) in series.iter().zip(&scaled) {
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
    o.push_str("</div></figure>\n");
}

fn charts(o: &mut String, t: &TreeSnapshot) {
    let tl: &[TimelinePoint] = &t.timeline;
    o.push_str("<section><h2>Over time</h2>");
    if tl.is_empty() {
        let why = if t.source == "standalone" {
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
    // Per-second rate of a per-interval quantity.
    let rate = |f: fn(&TimelinePoint) -> u64| -> Vec<f64> {
        tl.iter()
            .map(|p| {
                if p.interval_ms == 0 {
                    0.0
                } else {
                    f(p) as f64 * 1000.0 / p.interval_ms as f64
                }
            })
            .collect()
    };
    // Share of wall time of a per-interval duration (ns / interval).
    let share = |f: fn(&TimelinePoint) -> u64| -> Vec<f64> {
        tl.iter()
            .map(|p| {
                if p.interval_ms == 0 {
                    0.0
                } else {
                    f(p) as f64 / (p.interval_ms as f64 * 1e6)
                }
            })
            .collect()
    };
    let iv = tl.iter().map(|p| p.interval_ms).max().unwrap_or(0);
    w!(
        o,
        "<p class=\"sub\">{} points, one per collection interval ({}), window ending {} UTC. Sums over every process of the tree.</p><div class=\"charts\">",
        tl.len(),
        dur(iv * 1_000_000),
        utc(last)
    );
    chart(
        o,
        "CPU",
        "cores used (on-CPU time / interval)",
        &xs,
        &[Series {
            name: "on-CPU",
            color: "#2563eb",
            values: share(|p| p.oncpu_ns),
        }],
        Scale::Plain("cores"),
    );
    chart(
        o,
        "Scheduler wait",
        "threads runnable but waiting for a CPU (run-queue wait / interval)",
        &xs,
        &[Series {
            name: "run-queue wait",
            color: "#dc2626",
            values: share(|p| p.runq_wait_ns),
        }],
        Scale::Plain("threads"),
    );
    chart(
        o,
        "Off-CPU, blocked",
        "threads sleeping or waiting on I/O, locks (blocked time / interval)",
        &xs,
        &[Series {
            name: "blocked",
            color: "#7c3aed",
            values: share(|p| p.offcpu_blocked_ns),
        }],
        Scale::Plain("threads"),
    );
    chart(
        o,
        "System calls",
        "calls per second",
        &xs,
        &[Series {
            name: "syscalls",
            color: "#0891b2",
            values: rate(|p| p.syscalls),
        }],
        Scale::Plain("calls/s"),
    );
    chart(
        o,
        "Disk",
        "block I/O bytes per second",
        &xs,
        &[
            Series {
                name: "read",
                color: "#059669",
                values: rate(|p| p.block_read_bytes),
            },
            Series {
                name: "write",
                color: "#d97706",
                values: rate(|p| p.block_write_bytes),
            },
        ],
        Scale::BytesPerSec,
    );
    chart(
        o,
        "Network",
        "TCP + UDP bytes per second",
        &xs,
        &[
            Series {
                name: "received",
                color: "#0d9488",
                values: rate(|p| p.net_rx_bytes),
            },
            Series {
                name: "sent",
                color: "#db2777",
                values: rate(|p| p.net_tx_bytes),
            },
        ],
        Scale::BytesPerSec,
    );
    let gpu_active = t.total.gpu.is_some()
        || tl.iter().any(|p| {
            p.gpu_launches.unwrap_or(0) + p.gpu_sync_ns + p.gpu_copy_bytes + p.collective_ns > 0
        });
    // Launches only where every interval counted them: an uncounted one is not a 0.
    let launches_counted = tl.iter().all(|p| p.gpu_launches.is_some());
    if gpu_active && launches_counted {
        chart(
            o,
            "GPU/NPU launches",
            "kernel launches and operator executions per second",
            &xs,
            &[Series {
                name: "launches",
                color: "#16a34a",
                values: rate(|p| p.gpu_launches.unwrap_or(0)),
            }],
            Scale::Plain("launches/s"),
        );
    }
    if gpu_active {
        chart(
            o,
            "GPU/NPU host time",
            "share of wall time the tree's threads spent blocked in synchronization / inside collectives (summed over threads)",
            &xs,
            &[
                Series {
                    name: "sync-blocked",
                    color: "#dc2626",
                    values: share(|p| p.gpu_sync_ns),
                },
                Series {
                    name: "collectives",
                    color: "#9333ea",
                    values: share(|p| p.collective_ns),
                },
            ],
            Scale::Percent,
        );
        chart(
            o,
            "GPU/NPU copies",
            "bytes per second copied by runtime calls (all directions)",
            &xs,
            &[Series {
                name: "copies",
                color: "#ca8a04",
                values: rate(|p| p.gpu_copy_bytes),
            }],
            Scale::BytesPerSec,
        );
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

// ---------------------------------------------------------------------------------------
// Sections.

fn severity_class(s: &str) -> &'static str {
    match s.to_ascii_lowercase().as_str() {
        "critical" | "error" | "high" => "critical",
        "warning" | "warn" | "medium" => "warning",
        _ => "info",
    }
}

/// A warning when node-wide losses may have cut the tree's figures.
fn dropped_events(o: &mut String, d: &[ethand_snapshot::DropCounter]) {
    if d.is_empty() {
        return;
    }
    let total: u64 = d.iter().map(|x| x.count).sum();
    let why: Vec<String> = d
        .iter()
        .map(|x| format!("{} {}", escape(&x.reason), x.count))
        .collect();
    w!(
        o,
        "<section><div class=\"finding warning\"><div class=\"fhead\"><span class=\"badge\">warning</span><h3>{total} events lost while these figures were taken</h3></div><p>Node-wide ({}): some may have been this tree's, so its counts may be low. <code>ethand status</code> shows which maps are full; raise their <code>[maps]</code> sizes (or <code>daemon.max_processes</code>).</p></div></section>\n",
        why.join(", ")
    );
}

/// The rules that could not run: never a green "no findings" when there are any.
fn not_evaluated(o: &mut String, n: &[NotEvaluated], no_findings: bool) {
    let k = n.len();
    w!(
        o,
        "<div class=\"finding partial\"><div class=\"fhead\"><span class=\"badge\">not examined</span><h3>Not fully examined: {k} rule{} could not run</h3></div>",
        if k == 1 { "" } else { "s" }
    );
    if no_findings {
        o.push_str("<p>No finding among the rules that could run. The rules below could not, because a signal they need was not measured: this tree was not found healthy, it was not fully examined.</p>");
    } else {
        o.push_str("<p>Besides the findings above, the rules below could not run because a signal they need was not measured.</p>");
    }
    o.push_str("<ul class=\"notrun\">");
    for x in n {
        let missing: Vec<String> = x
            .missing
            .iter()
            .map(|m| format!("<code>{}</code>", escape(m)))
            .collect();
        w!(
            o,
            "<li><b>{}</b> <span class=\"dim\">rule <code>{}</code></span><br>missing {}",
            escape(&x.title),
            escape(&x.rule),
            if missing.is_empty() {
                "(not stated)".to_string()
            } else {
                missing.join(", ")
            }
        );
        if !x.how.is_empty() {
            w!(o, "<br><span class=\"how\">{}</span>", escape(&x.how));
        }
        o.push_str("</li>");
    }
    o.push_str("</ul></div>\n");
}

fn findings(o: &mut String, f: &[Finding], n: &[NotEvaluated]) {
    o.push_str("<section><h2>Findings</h2>");
    if f.is_empty() && n.is_empty() {
        o.push_str("<div class=\"finding ok\"><div class=\"fhead\"><span class=\"badge\">ok</span><h3>No findings</h3></div><p>The diagnosis rules found nothing to flag in this process tree.</p></div></section>\n");
        return;
    }
    for x in f {
        let cls = severity_class(&x.severity);
        w!(
            o,
            "<div class=\"finding {cls}\"><div class=\"fhead\"><span class=\"badge\">{}</span><h3>{}</h3>",
            escape(&x.severity),
            escape(&x.title)
        );
        if let Some(s) = x.estimated_speedup.filter(|s| s.is_finite()) {
            w!(
                o,
                "<span class=\"speedup\" title=\"estimated speed-up if the cause is removed\">≈ {s:.2}× faster</span>"
            );
        }
        w!(
            o,
            "</div><div class=\"fmeta\">rule <code>{}</code> · impact {}</div>",
            escape(&x.id),
            pct(x.impact)
        );
        if !x.evidence.is_empty() {
            o.push_str("<div class=\"evidence\">");
            for e in &x.evidence {
                w!(
                    o,
                    "<div class=\"ev\"><span class=\"evv\">{}</span><span class=\"evs\">{}</span></div>",
                    evidence_value(e.value, &e.unit),
                    escape(&e.signal)
                );
            }
            o.push_str("</div>");
        }
        if !x.explanation.is_empty() {
            w!(o, "<p>{}</p>", escape(&x.explanation));
        }
        if !x.detail.is_empty() {
            o.push_str("<ul class=\"where\">");
            for d in &x.detail {
                w!(o, "<li><code>{}</code></li>", escape(d));
            }
            o.push_str("</ul>");
        }
        if !x.advice.is_empty() {
            o.push_str("<div class=\"advice\"><b>What to try</b><ol>");
            for a in &x.advice {
                w!(o, "<li>{}</li>", escape(a));
            }
            o.push_str("</ol></div>");
        }
        o.push_str("</div>\n");
    }
    if !n.is_empty() {
        not_evaluated(o, n, f.is_empty());
    }
    o.push_str("</section>\n");
}

fn tile(o: &mut String, label: &str, value: &str, sub: &str) {
    w!(
        o,
        "<div class=\"tile\"><div class=\"tl\">{label}</div><div class=\"tv\">{value}</div><div class=\"ts\">{sub}</div></div>"
    );
}

fn summary(o: &mut String, t: &TreeSnapshot) {
    let tt = &t.total;
    let n = &tt.net;
    o.push_str("<section><h2>Summary</h2><div class=\"tiles\">");
    let period = if t.source == "standalone" {
        format!("over {}", dur(t.measured_ms * 1_000_000))
    } else {
        "since first seen".into()
    };
    tile(
        o,
        "Processes / threads",
        &format!("{} / {}", count(tt.processes), count(tt.threads)),
        "in the tree",
    );
    tile(o, "CPU time", &dur(tt.sched.oncpu_ns), &period);
    tile(
        o,
        "Run-queue wait",
        &dur(tt.sched.runq_wait_ns),
        &plural(
            tt.sched.voluntary_switches + tt.sched.involuntary_switches,
            "context switch",
        ),
    );
    tile(
        o,
        "Syscalls",
        &count(tt.syscalls),
        &format!(
            "{} · {}",
            plural(tt.syscall_errors, "error"),
            dur(tt.syscall_time_ns)
        ),
    );
    tile(
        o,
        "Disk read / write",
        &format!(
            "{} / {}",
            bytes(tt.block_read_bytes),
            bytes(tt.block_write_bytes)
        ),
        &format!(
            "{} / {} ops",
            count(tt.block_read_ops),
            count(tt.block_write_ops)
        ),
    );
    tile(
        o,
        "Network sent / received",
        &format!(
            "{} / {}",
            bytes(n.tcp_tx_bytes + n.udp_tx_bytes),
            bytes(n.tcp_rx_bytes + n.udp_rx_bytes)
        ),
        &format!(
            "{} · {}",
            plural(n.tcp_retransmits, "retransmit"),
            plural(n.tcp_resets_sent + n.tcp_resets_received, "reset")
        ),
    );
    if let Some(g) = &tt.gpu {
        tile(
            o,
            "GPU/NPU launches",
            &launches_cell(g.launches, t),
            &launches_sub(g, t),
        );
        tile(
            o,
            "GPU/NPU sync",
            &dur(g.sync.time_ns),
            &plural(g.sync.calls, "call"),
        );
    }
    o.push_str("</div></section>\n");
}

/// Under a launch count: the graph launches, or where launches were not counted, the launch
/// sample's rate when there is one.
fn launches_sub(g: &GpuProcessStats, t: &TreeSnapshot) -> String {
    if g.launches.is_some() {
        return g
            .graph_launches
            .map_or_else(String::new, |n| plural(n, "graph launch"));
    }
    match t.launch_sample.as_ref().and_then(|l| l.launches_per_second) {
        Some(r) => format!("sampled: {} /s", num(r)),
        None => String::new(),
    }
}

/// Processes in depth-first order with their depth below the root.
fn tree_order(t: &TreeSnapshot) -> Vec<(&ProcessSnapshot, usize)> {
    let Some(root) = t.processes.first() else {
        return Vec::new();
    };
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, p) in t.processes.iter().enumerate().skip(1) {
        children.entry(p.ppid).or_default().push(i);
    }
    let mut seen = vec![false; t.processes.len()];
    let mut out = Vec::new();
    let mut stack = vec![(0usize, 0usize)];
    seen[0] = true;
    while let Some((i, d)) = stack.pop() {
        out.push((&t.processes[i], d));
        if let Some(c) = children.get(&t.processes[i].pid) {
            for &j in c.iter().rev() {
                if !seen[j] {
                    seen[j] = true;
                    stack.push((j, d + 1));
                }
            }
        }
    }
    // Processes whose parent is not in the list (reparented): below the root.
    for (i, p) in t.processes.iter().enumerate() {
        if !seen[i] && p.pid != root.pid {
            out.push((p, 1));
        }
    }
    out
}

fn net_tx(p: &ProcessSnapshot) -> u64 {
    p.net.tcp_tx_bytes + p.net.udp_tx_bytes
}

fn net_rx(p: &ProcessSnapshot) -> u64 {
    p.net.tcp_rx_bytes + p.net.udp_rx_bytes
}

fn disk(p: &ProcessSnapshot, op: &str) -> u64 {
    p.block.iter().filter(|b| b.op == op).map(|b| b.bytes).sum()
}

fn gpu_copy_total(g: &GpuProcessStats) -> (u64, u64) {
    g.copies
        .iter()
        .fold((0, 0), |(c, b), x| (c + x.calls, b + x.bytes))
}

fn process_table(o: &mut String, t: &TreeSnapshot) {
    let gpu_cols = t
        .processes
        .iter()
        .any(|p| p.gpu.is_some() || !p.devices.is_empty());
    let window = t.processes.iter().any(|p| p.window.is_some());
    o.push_str("<section><h2>Process tree</h2><p class=\"sub\">Main process first, then its workers and children, indented by parent. Counters are cumulative since ethand first saw each process");
    if window {
        o.push_str("; <i>CPU now</i> is over the recent window");
    }
    o.push_str(".</p><div class=\"scroll\"><table class=\"procs\"><thead><tr><th>PID</th><th class=\"l\">Process</th><th>CPU</th>");
    if window {
        o.push_str("<th>CPU now</th>");
    }
    o.push_str("<th>Run-queue wait</th><th>Blocked</th><th>Threads</th><th>Syscalls (errors)</th><th>Disk read / write</th><th>Net sent / recv</th>");
    if gpu_cols {
        o.push_str("<th>GPU launches</th><th>GPU copies</th><th>GPU memory live / peak</th><th>Device memory</th>");
    }
    o.push_str("</tr></thead><tbody>");
    for (p, depth) in tree_order(t) {
        let role = if depth == 0 {
            "main"
        } else if p.ppid == t.root_pid {
            "worker"
        } else {
            "child"
        };
        let state = if p.alive {
            String::new()
        } else {
            "<span class=\"exited\">exited</span>".into()
        };
        let cmd = cmdline_text(p);
        let cmd_short: String = if cmd.chars().count() > 140 {
            cmd.chars().take(140).chain("…".chars()).collect()
        } else {
            cmd.clone()
        };
        w!(
            o,
            "<tr><td class=\"pid\">{}</td><td class=\"l name\"><div style=\"padding-left:{}px\">{}<b>{}</b> <span class=\"role {role}\">{role}</span>{state}<div class=\"cmd\" title=\"{}\">{}</div></div></td>",
            p.pid,
            depth.min(12) * 18,
            if depth > 0 {
                "<span class=\"branch\">└</span>"
            } else {
                ""
            },
            escape(&p.comm),
            escape(&cmd),
            escape(&cmd_short)
        );
        w!(o, "<td>{}</td>", dur(p.sched.oncpu_ns));
        if window {
            match &p.window {
                Some(wd) if wd.duration_ms > 0 => w!(
                    o,
                    "<td>{:.2} cores</td>",
                    wd.oncpu_ns as f64 / (wd.duration_ms as f64 * 1e6)
                ),
                _ => o.push_str("<td class=\"na\">–</td>"),
            }
        }
        w!(
            o,
            "<td>{}</td><td>{}</td><td>{}</td><td>{} <span class=\"dim\">({})</span></td><td>{} / {}</td><td>{} / {}</td>",
            dur(p.sched.runq_wait_ns),
            dur(p.sched.offcpu_blocked_ns),
            p.threads.iter().filter(|t| t.alive).count(),
            count(p.syscalls.count),
            count(p.syscalls.errors),
            bytes(disk(p, "read")),
            bytes(disk(p, "write")),
            bytes(net_tx(p)),
            bytes(net_rx(p))
        );
        if gpu_cols {
            match &p.gpu {
                Some(g) => {
                    let (cc, cb) = gpu_copy_total(g);
                    let live: u64 = g.memory.iter().map(|m| m.live_bytes).sum();
                    let peak: u64 = g.memory.iter().map(|m| m.peak_bytes).sum();
                    let sampled = t
                        .launch_sample
                        .as_ref()
                        .filter(|_| g.launches.is_none())
                        .and_then(|l| l.processes.iter().find(|s| s.pid == p.pid))
                        .map_or_else(String::new, |s| {
                            format!(
                                "<div class=\"dim\">{} in the {} sample</div>",
                                count(s.launches),
                                dur(t.launch_sample.as_ref().map_or(0, |l| l.duration_ms)
                                    * 1_000_000)
                            )
                        });
                    w!(
                        o,
                        "<td>{}{sampled}</td><td>{} <span class=\"dim\">({} calls)</span></td><td>{} / {}</td>",
                        launches_cell(g.launches, t),
                        bytes(cb),
                        count(cc),
                        bytes(live),
                        bytes(peak)
                    );
                }
                None => o.push_str(
                    "<td class=\"na\">–</td><td class=\"na\">–</td><td class=\"na\">–</td>",
                ),
            }
            if p.devices.is_empty() {
                o.push_str("<td class=\"na\">–</td>");
            } else {
                let parts: Vec<String> = p
                    .devices
                    .iter()
                    .map(|d| format!("{} {}", escape(&d.device), bytes(d.memory_used_bytes)))
                    .collect();
                w!(o, "<td>{}</td>", parts.join("<br>"));
            }
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table></div>");
    if let Some(root) = t.processes.first() {
        w!(
            o,
            "<p class=\"sub\">Main process: exe <code>{}</code> · cgroup <code>{}</code> · uid {}</p>",
            escape(if root.exe.is_empty() { "?" } else { &root.exe }),
            escape(if root.cgroup.is_empty() {
                "unknown"
            } else {
                &root.cgroup
            }),
            root.uid
        );
    }
    o.push_str("</section>\n");
}

fn threads_and_syscalls(o: &mut String, t: &TreeSnapshot) {
    let mut threads: Vec<_> = t
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |th| (p, th)))
        .collect();
    threads.sort_by_key(|x| std::cmp::Reverse(x.1.sched.oncpu_ns));
    let mut rows: Vec<_> = t
        .processes
        .iter()
        .flat_map(|p| p.syscalls.by_nr.iter().map(move |r| (p, r)))
        .collect();
    rows.sort_by_key(|x| std::cmp::Reverse(x.1.time_ns));
    o.push_str("<section class=\"two\"><div><h2>Top threads by CPU</h2>");
    if threads.is_empty() {
        o.push_str("<div class=\"note\">No threads recorded.</div>");
    } else {
        let max = threads.first().map_or(1, |x| x.1.sched.oncpu_ns.max(1));
        o.push_str("<table><thead><tr><th>PID</th><th>TID</th><th class=\"l\">Thread</th><th class=\"l\">CPU</th><th>Run-queue wait</th><th>Switches vol / invol</th></tr></thead><tbody>");
        for (p, th) in threads.iter().take(12) {
            let frac = th.sched.oncpu_ns as f64 / max as f64 * 100.0;
            w!(
                o,
                "<tr><td>{}</td><td>{}</td><td class=\"l\">{}{}</td><td class=\"l bar\" style=\"{}\">{}</td><td>{}</td><td>{} / {}</td></tr>",
                p.pid,
                th.tid,
                escape(&th.comm),
                if th.alive {
                    ""
                } else {
                    " <span class=\"exited\">exited</span>"
                },
                bar(frac),
                dur(th.sched.oncpu_ns),
                dur(th.sched.runq_wait_ns),
                count(th.sched.voluntary_switches),
                count(th.sched.involuntary_switches)
            );
        }
        o.push_str("</tbody></table>");
        if threads.len() > 12 {
            w!(
                o,
                "<p class=\"sub\">{} more threads not shown.</p>",
                threads.len() - 12
            );
        }
    }
    o.push_str("</div><div><h2>Top system calls by time</h2>");
    if rows.is_empty() {
        o.push_str("<div class=\"note\">No system calls recorded.</div>");
    } else {
        let max = rows.first().map_or(1, |x| x.1.time_ns.max(1));
        o.push_str("<table><thead><tr><th>PID</th><th class=\"l\">Syscall</th><th>Calls</th><th>Errors</th><th class=\"l\">Time</th></tr></thead><tbody>");
        for (p, r) in rows.iter().take(12) {
            let frac = r.time_ns as f64 / max as f64 * 100.0;
            w!(
                o,
                "<tr><td>{}</td><td class=\"l\"><code>{}</code></td><td>{}</td><td>{}</td><td class=\"l bar\" style=\"{}\">{}</td></tr>",
                p.pid,
                escape(&r.name),
                count(r.count),
                count(r.errors),
                bar(frac),
                dur(r.time_ns)
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</div></section>\n");
}

fn disks(o: &mut String, t: &TreeSnapshot) {
    let mut agg: Vec<(String, String, u64, u64, u64, u64)> = Vec::new();
    for b in t.processes.iter().flat_map(|p| &p.block) {
        let name = if b.device_name.is_empty() {
            &b.device
        } else {
            &b.device_name
        };
        match agg.iter_mut().find(|a| a.0 == *name && a.1 == b.op) {
            Some(a) => {
                a.2 += b.ops;
                a.3 += b.bytes;
                a.4 += b.queue_ns;
                a.5 += b.service_ns;
            }
            None => agg.push((
                name.clone(),
                b.op.clone(),
                b.ops,
                b.bytes,
                b.queue_ns,
                b.service_ns,
            )),
        }
    }
    if agg.is_empty() {
        return;
    }
    agg.sort_by_key(|a| std::cmp::Reverse(a.3));
    o.push_str("<section><h2>Disk I/O by device</h2><table><thead><tr><th class=\"l\">Device</th><th class=\"l\">Op</th><th>Requests</th><th>Bytes</th><th>Avg queue</th><th>Avg service</th></tr></thead><tbody>");
    for (dev, op, ops, b, q, s) in agg {
        let avg = |x: u64| x.checked_div(ops).map_or_else(|| "–".to_string(), dur);
        w!(
            o,
            "<tr><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&dev),
            escape(&op),
            count(ops),
            bytes(b),
            avg(q),
            avg(s)
        );
    }
    o.push_str("</tbody></table></section>\n");
}

fn gpu_section(o: &mut String, t: &TreeSnapshot) {
    o.push_str("<section><h2>GPU / NPU runtime</h2>");
    let Some(g) = &t.total.gpu else {
        o.push_str("<div class=\"note\">No process of this tree made a probed GPU/NPU runtime call (libcuda, libnccl, libascendcl, libhccl).</div></section>\n");
        return;
    };
    o.push_str("<div class=\"tiles\">");
    tile(
        o,
        "Launches",
        &launches_cell(g.launches, t),
        &launches_sub(g, t),
    );
    tile(
        o,
        "Host blocked in sync",
        &dur(g.sync.time_ns),
        &plural(g.sync.calls, "call"),
    );
    tile(
        o,
        "Collectives (host)",
        &dur(g.collective_time_ns()),
        &format!("{} created", plural(g.comm_inits, "communicator")),
    );
    tile(
        o,
        "API errors",
        &count(g.errors),
        &format!(
            "{} (size unknown)",
            plural(g.untracked_frees, "untracked free")
        ),
    );
    if let Some(d) = &t.total.gpu_derived {
        match d.launches_per_second {
            Some(r) => tile(
                o,
                "Launch rate",
                &format!("{} /s", num(r)),
                &format!("last {}", dur(d.window_ms * 1_000_000)),
            ),
            None => tile(
                o,
                "Launch rate",
                &format!("<span class=\"na\">{}</span>", launches_not_measured(t)),
                &match t.launch_sample.as_ref().and_then(|l| l.launches_per_second) {
                    Some(r) => format!("sampled: {} /s (below)", num(r)),
                    None => "counted at level process or op".into(),
                },
            ),
        }
        tile(
            o,
            "Sync rate",
            &format!("{} /s", num(d.syncs_per_second)),
            &format!("last {}", dur(d.window_ms * 1_000_000)),
        );
        tile(
            o,
            "Sync-blocked share",
            &pct(d.sync_blocked_ratio),
            "of wall time (summed over threads)",
        );
        tile(
            o,
            "Collective share",
            &pct(d.collective_ratio),
            "of wall time",
        );
        if let Some(u) = d.device_utilization_ratio {
            tile(
                o,
                "Device busy",
                &pct(u),
                &d.device_idle_ratio
                    .map_or(String::new(), |i| format!("idle {}", pct(i))),
            );
        }
        // NVML GPM (Hopper and newer): only where measured.
        for (label, v, sub) in [
            (
                "SM activity",
                d.sm_activity_ratio,
                "SMs with a warp assigned (GPM)",
            ),
            (
                "SM occupancy",
                d.sm_occupancy_ratio,
                "resident warps of the maximum (GPM)",
            ),
            (
                "Tensor activity",
                d.tensor_activity_ratio,
                "tensor pipes busy (GPM)",
            ),
            (
                "DRAM bandwidth",
                d.dram_bandwidth_ratio,
                "of peak memory bandwidth (GPM)",
            ),
        ] {
            if let Some(v) = v {
                tile(o, label, &pct(v), sub);
            }
        }
    }
    o.push_str("</div>");
    if let Some(l) = &t.launch_sample {
        launch_sample(o, l);
    }
    o.push_str("<div class=\"two\">");
    // Copies by direction.
    o.push_str("<div><h3>Copies by direction</h3>");
    if g.copies.is_empty() {
        o.push_str("<div class=\"note\">No copies.</div>");
    } else {
        let max = g.copies.iter().map(|c| c.bytes).max().unwrap_or(1).max(1);
        o.push_str("<table><thead><tr><th class=\"l\">Direction</th><th>Calls</th><th class=\"l\">Bytes</th></tr></thead><tbody>");
        for c in &g.copies {
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td>{}</td><td class=\"l bar\" style=\"{}\">{}</td></tr>",
                escape(&c.direction.replace('_', " ")),
                count(c.calls),
                bar(c.bytes as f64 / max as f64 * 100.0),
                bytes(c.bytes)
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</div><div><h3>Memory by kind</h3>");
    if g.memory.is_empty() {
        o.push_str("<div class=\"note\">No allocations seen.</div>");
    } else {
        o.push_str("<table><thead><tr><th class=\"l\">Kind</th><th>Allocs</th><th>Frees</th><th>Live</th><th>Peak</th></tr></thead><tbody>");
        for m in &g.memory {
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&m.kind.replace('_', " ")),
                count(m.allocs),
                count(m.frees),
                bytes(m.live_bytes),
                bytes(m.peak_bytes)
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</div></div>");
    if !g.collectives.is_empty() {
        o.push_str("<h3>Collectives</h3><table><thead><tr><th class=\"l\">Library</th><th class=\"l\">Operation</th><th>Calls</th><th>Bytes</th><th>Host time</th><th>Avg per call</th></tr></thead><tbody>");
        for c in &g.collectives {
            let avg = c
                .time_ns
                .checked_div(c.timed_calls)
                .map_or_else(|| "–".to_string(), dur);
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&c.library),
                escape(&c.operation.replace('_', " ")),
                count(c.calls),
                bytes(c.bytes),
                dur(c.time_ns),
                avg
            );
        }
        o.push_str("</tbody></table>");
    }
    let ranks: Vec<_> = t
        .processes
        .iter()
        .filter_map(|p| Some((p, p.gpu.as_ref()?.comm.as_ref()?)))
        .collect();
    if !ranks.is_empty() {
        o.push_str("<h3>Ranks</h3><table><thead><tr><th>PID</th><th class=\"l\">Process</th><th class=\"l\">Library</th><th>Rank</th><th>Ranks</th></tr></thead><tbody>");
        for (p, c) in ranks {
            w!(
                o,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>",
                p.pid,
                escape(&p.comm),
                escape(&c.library),
                c.rank
                    .map_or("all (one process)".to_string(), |r| r.to_string()),
                c.nranks
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</section>\n");
}

/// The launches counted on demand for this snapshot (GPU level `calls`).
fn launch_sample(o: &mut String, l: &LaunchSample) {
    let over = dur(l.duration_ms * 1_000_000);
    o.push_str("<div class=\"note sample\"><b>Launch sample:</b> ");
    match (l.launches_per_second, l.launches) {
        (Some(r), n) => w!(
            o,
            "{} launches/s, counted on demand over {over} for this snapshot{}.",
            num(r),
            n.map_or_else(String::new, |n| format!(" ({})", plural(n, "launch")))
        ),
        (None, Some(n)) => w!(
            o,
            "{}, counted on demand over {over} for this snapshot.",
            plural(n, "launch")
        ),
        (None, None) => w!(
            o,
            "no process of the tree could be sampled (tried over {over})."
        ),
    }
    if !l.method.is_empty() {
        w!(o, " <span class=\"dim\">{}</span>", escape(&l.method));
    }
    for n in &l.notes {
        w!(o, "<br><span class=\"dim\">{}</span>", escape(n));
    }
    o.push_str("</div>");
}

/// Inline style of a table cell with a horizontal bar behind its text (`frac`: 0-100).
fn bar(frac: f64) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 100.0)
    } else {
        0.0
    };
    format!("background:linear-gradient(90deg,#dbeafe {f:.1}%,transparent {f:.1}%)")
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "<span class=\"na\">–</span>".to_string(), f)
}

fn devices(o: &mut String, d: &DevicesSnapshot, t: &TreeSnapshot) {
    o.push_str("<section><h2>Devices</h2>");
    if d.collectors.is_empty() && d.gpus.is_empty() && d.npus.is_empty() {
        o.push_str("<div class=\"note\">No device readings in this snapshot.</div></section>\n");
        return;
    }
    if !d.collectors.is_empty() {
        o.push_str("<p class=\"sub\">Collectors: ");
        for (i, c) in d.collectors.iter().enumerate() {
            let cls = c.state.as_str();
            w!(
                o,
                "{}<span class=\"pill {cls}\">{} {}</span>",
                if i > 0 { " " } else { "" },
                escape(&c.name),
                cls
            );
            if !c.detail.is_empty() {
                w!(o, " <span class=\"dim\">{}</span>", escape(&c.detail));
            }
        }
        o.push_str("</p>");
    }
    if !d.gpus.is_empty() {
        o.push_str("<div class=\"scroll\"><table><thead><tr><th class=\"l\">GPU</th><th class=\"l\">Name</th><th>Util</th><th>Mem util</th><th>Memory used / total</th><th>Power</th><th>Temp</th><th>SM clock</th><th>PCIe rx / tx</th><th class=\"l\">Throttle</th><th>ECC corr / uncorr</th><th>XID</th></tr></thead><tbody>");
        for g in &d.gpus {
            let throttle = match &g.throttle_reasons {
                None => "<span class=\"na\">–</span>".to_string(),
                Some(v) if v.is_empty() => "none".into(),
                Some(v) => format!("<span class=\"warn\">{}</span>", escape(&v.join(", "))),
            };
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}<div class=\"cmd\">{}</div></td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td class=\"l\">{}</td><td>{} / {}</td><td>{}</td></tr>",
                escape(&g.label()),
                escape(&g.name),
                escape(&g.uuid),
                opt(g.utilization_ratio, pct),
                opt(g.memory_utilization_ratio, pct),
                opt(g.memory_used_bytes, bytes),
                opt(g.memory_total_bytes, bytes),
                opt(g.power_watts, |w| format!("{w:.0} W")),
                opt(g.temperature_celsius, |c| format!("{c} °C")),
                opt(g.sm_clock_hertz, |h| format!("{} MHz", h / 1_000_000)),
                opt(g.pcie_rx_bytes_per_second, |b| format!("{}/s", bytes(b))),
                opt(g.pcie_tx_bytes_per_second, |b| format!("{}/s", bytes(b))),
                throttle,
                opt(g.ecc_corrected_errors, count),
                opt(g.ecc_uncorrected_errors, count),
                opt(g.xid_errors, |x| match g.last_xid {
                    Some(l) if x > 0 => format!("<span class=\"warn\">{x} (last {l})</span>"),
                    _ => count(x),
                })
            );
        }
        o.push_str("</tbody></table></div>");
    }
    if !d.npus.is_empty() {
        o.push_str("<div class=\"scroll\"><table><thead><tr><th class=\"l\">NPU</th><th class=\"l\">Name</th><th>AI core util</th><th>HBM used / total</th><th>HBM bandwidth</th><th>Power</th><th>Temp</th><th>Health</th></tr></thead><tbody>");
        for n in &d.npus {
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}<div class=\"cmd\">card {} chip {}</div></td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&n.label()),
                escape(&n.name),
                n.card_id,
                n.device_id,
                opt(n.aicore_utilization_ratio, pct),
                opt(n.hbm_used_bytes, bytes),
                opt(n.hbm_total_bytes, bytes),
                opt(n.hbm_bandwidth_utilization_ratio, pct),
                opt(n.power_watts, |w| format!("{w:.0} W")),
                opt(n.temperature_celsius, |c| format!("{c} °C")),
                opt(n.health, |h| match h {
                    0 => "normal".into(),
                    1 => "<span class=\"warn\">minor alarm</span>".into(),
                    2 => "<span class=\"bad\">major alarm</span>".into(),
                    _ => "<span class=\"bad\">critical alarm</span>".into(),
                })
            );
        }
        o.push_str("</tbody></table></div>");
    }
    let pids: Vec<u32> = t.processes.iter().map(|p| p.pid).collect();
    let mine: Vec<_> = d
        .processes
        .iter()
        .filter(|p| pids.contains(&p.pid))
        .collect();
    if !mine.is_empty() {
        o.push_str("<h3>Device memory held by the tree</h3><table><thead><tr><th>PID</th><th class=\"l\">Device</th><th>Memory</th><th>Utilization</th></tr></thead><tbody>");
        for p in &mine {
            w!(
                o,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>",
                p.pid,
                escape(&p.device),
                opt(p.memory_used_bytes, bytes),
                opt(p.utilization_ratio, pct)
            );
        }
        o.push_str("</tbody></table>");
    }
    let others = d.processes.len() - mine.len();
    if others > 0 {
        w!(
            o,
            "<p class=\"sub\">{others} other device memory holders on the node (not in this tree).</p>"
        );
    }
    o.push_str("</section>\n");
}

fn probes(o: &mut String, t: &TreeSnapshot) {
    if t.probes.is_empty() {
        return;
    }
    let attached = t
        .probes
        .iter()
        .filter(|p| p.state == ethand_snapshot::ProbeState::Attached)
        .count();
    w!(
        o,
        "<section><details><summary>Probes: {attached} of {} attached</summary><table><thead><tr><th class=\"l\">Probe</th><th class=\"l\">Attach point</th><th class=\"l\">State</th><th class=\"l\">Detail</th></tr></thead><tbody>",
        t.probes.len()
    );
    for p in &t.probes {
        w!(
            o,
            "<tr><td class=\"l\"><code>{}</code></td><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            escape(&p.name),
            escape(&p.attach_point),
            p.state.as_str(),
            escape(&p.detail)
        );
    }
    o.push_str("</tbody></table></details></section>\n");
}

const CSS: &str = r#"
:root{--fg:#1f2937;--dim:#6b7280;--bg:#f5f7fa;--card:#fff;--line:#e5e7eb;--accent:#2563eb}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Noto Sans","Liberation Sans",sans-serif}
main{max-width:1240px;margin:0 auto;padding:0 20px 40px}
header{background:linear-gradient(135deg,#1e293b,#1e3a8a);color:#fff;padding:22px 0 18px;margin-bottom:18px}
header .in{max-width:1240px;margin:0 auto;padding:0 20px}
header h1{margin:0 0 4px;font-size:24px;font-weight:650;letter-spacing:-.01em}
header h1 .pid{color:#93c5fd}
header .cmdline{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;background:rgba(255,255,255,.08);padding:6px 10px;border-radius:6px;margin:8px 0 10px;word-break:break-all}
header .meta{display:flex;flex-wrap:wrap;gap:6px 22px;font-size:13px;color:#cbd5e1}
header .meta b{color:#fff;font-weight:600}
header .brand{float:right;font-size:12px;color:#93c5fd;letter-spacing:.06em;text-transform:uppercase}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 18px 16px;margin:0 0 16px;box-shadow:0 1px 2px rgba(0,0,0,.04)}
section.two{display:grid;grid-template-columns:1fr 1fr;gap:22px}
.two{display:grid;grid-template-columns:1fr 1fr;gap:22px}
h2{font-size:17px;margin:0 0 10px;font-weight:650}
h3{font-size:14px;margin:12px 0 6px;font-weight:650}
.sub{color:var(--dim);font-size:12.5px;margin:2px 0 10px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;background:#f1f5f9;padding:1px 4px;border-radius:4px}
.note{background:#f8fafc;border:1px dashed #cbd5e1;border-radius:8px;padding:12px 14px;color:#475569}
.finding{border:1px solid var(--line);border-left:6px solid #3b82f6;border-radius:8px;padding:10px 14px;margin:0 0 10px;background:#fbfdff}
.finding.critical{border-left-color:#dc2626;background:#fff7f7}
.finding.warning{border-left-color:#f59e0b;background:#fffbf0}
.finding.ok{border-left-color:#16a34a;background:#f5fdf7}
.finding.partial{border-left-color:#f59e0b;background:#fbfaf7}
.finding ul.notrun{margin:6px 0 2px;padding-left:20px}.notrun li{margin:0 0 6px}.notrun .how{color:#475569}
.note.sample{margin:10px 0}.tv .na{font-size:15px;font-weight:600}
.finding p{margin:6px 0}
.fhead{display:flex;align-items:center;gap:10px}
.fhead h3{margin:0;font-size:15.5px;flex:1}
.badge{font-size:11px;font-weight:700;text-transform:uppercase;letter-spacing:.05em;color:#fff;background:#3b82f6;border-radius:999px;padding:2px 9px}
.critical .badge{background:#dc2626}.warning .badge{background:#d97706}.ok .badge{background:#16a34a}.partial .badge{background:#78716c}
.speedup{font-weight:700;color:#047857;background:#d1fae5;border-radius:6px;padding:2px 8px;white-space:nowrap}
.fmeta{color:var(--dim);font-size:12px;margin:3px 0 6px}
.evidence{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0}
.ev{background:#fff;border:1px solid var(--line);border-radius:6px;padding:4px 10px;display:flex;flex-direction:column;min-width:120px}
.evv{font-size:16px;font-weight:650;font-variant-numeric:tabular-nums}
.evs{font:11.5px ui-monospace,Menlo,Consolas,monospace;color:var(--dim)}
.advice ol{margin:4px 0 2px;padding-left:22px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:10px}
.tile{border:1px solid var(--line);border-radius:8px;padding:9px 12px;background:#fcfdfe}
.tl{font-size:12px;color:var(--dim)}.tv{font-size:19px;font-weight:650;font-variant-numeric:tabular-nums;margin:2px 0}.ts{font-size:12px;color:var(--dim)}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:14px}
figure.chart{margin:0;border:1px solid var(--line);border-radius:8px;padding:8px 10px 6px;background:#fff}
figcaption{font-size:13.5px}figcaption span{color:var(--dim);font-size:12px}
figure svg{width:100%;height:auto;display:block}
svg .grid{stroke:#eef0f3;stroke-width:1}svg .axis{stroke:#9ca3af;stroke-width:1}svg .xtick{stroke:#9ca3af}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",Arial,sans-serif}
svg .tick{font-size:11px;fill:#6b7280}svg .unit{font-size:11px;fill:#4b5563}svg .legend{font-size:11.5px;fill:#374151}
svg .idle{font-size:13px;fill:#9ca3af}
.stats{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px;color:var(--dim);padding:2px 2px 0}
.stats i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.stats b{color:var(--fg);font-weight:600}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
th{font-size:11px;text-transform:uppercase;letter-spacing:.03em;color:var(--dim);font-weight:600;text-align:right;vertical-align:bottom;border-bottom:2px solid var(--line);padding:6px 7px}
td{text-align:right;padding:5px 7px;border-bottom:1px solid #f0f2f5;vertical-align:top;white-space:nowrap}
th.l,td.l{text-align:left}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#f1f5ff}
.scroll{overflow-x:auto}
td.name{white-space:normal;min-width:200px;max-width:340px}
.cmd{font:11px ui-monospace,Menlo,Consolas,monospace;color:var(--dim);overflow-wrap:anywhere;white-space:normal}
.branch{color:#9ca3af;margin-right:4px}
.role{font-size:10.5px;border-radius:4px;padding:0 5px;margin-left:4px;background:#e0e7ff;color:#3730a3}
.role.worker{background:#dcfce7;color:#166534}.role.child{background:#f3f4f6;color:#4b5563}
.exited{font-size:10.5px;border-radius:4px;padding:0 5px;margin-left:4px;background:#fee2e2;color:#991b1b}
.dim,.na{color:#9ca3af}
.warn{color:#b45309;font-weight:600}.bad{color:#b91c1c;font-weight:700}
td.bar{min-width:130px;background-clip:content-box}
.pill{display:inline-block;font-size:12px;border-radius:999px;padding:1px 9px;background:#f3f4f6;color:#374151}
.pill.available{background:#dcfce7;color:#166534}.pill.failed{background:#fee2e2;color:#991b1b}
details summary{cursor:pointer;font-weight:600}
details table{margin-top:8px}
footer{color:var(--dim);font-size:12px;text-align:center;margin-top:10px}
@media (max-width:900px){.charts,.two,section.two{grid-template-columns:1fr}}
@media print{body{background:#fff}section{box-shadow:none;break-inside:avoid}header{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"#;

/// The complete report: one self-contained HTML document.
pub fn render_html(t: &TreeSnapshot) -> String {
    let mut o = String::with_capacity(64 * 1024);
    let root = t.processes.first();
    let comm = root.map_or("?", |p| p.comm.as_str());
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    o.push_str("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n");
    o.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    w!(
        o,
        "<title>ethand report: pid {} ({})</title>\n<style>{CSS}</style></head><body>\n",
        t.root_pid,
        escape(comm)
    );
    // Header.
    w!(
        o,
        "<header><div class=\"in\"><span class=\"brand\">ethand report</span><h1>Process tree of <span class=\"pid\">pid {}</span> · {}</h1>",
        t.root_pid,
        escape(comm)
    );
    let cmd = root.map(cmdline_text).unwrap_or_default();
    w!(
        o,
        "<div class=\"cmdline\">{}</div><div class=\"meta\">",
        if cmd.is_empty() {
            "(no command line)".into()
        } else {
            escape(&cmd)
        }
    );
    w!(
        o,
        "<span>taken <b>{} UTC</b></span>",
        utc(t.taken_at_unix_ms)
    );
    let source = if t.source == "standalone" {
        format!(
            "standalone measurement of <b>{}</b> (no daemon)",
            dur(t.measured_ms * 1_000_000)
        )
    } else if t.source == "daemon" {
        "from the <b>ethand daemon</b> (counters since it first saw each process)".into()
    } else {
        format!("source <b>{}</b>", escape(&t.source))
    };
    w!(o, "<span>{source}</span>");
    if !t.devices.hostname.is_empty() {
        w!(
            o,
            "<span>host <b>{}</b></span>",
            escape(&t.devices.hostname)
        );
    }
    if let Some(r) = root {
        if !r.cgroup.is_empty() {
            w!(o, "<span>cgroup <b>{}</b></span>", escape(&r.cgroup));
        }
        if r.start_time_unix_s > 0 {
            w!(
                o,
                "<span>started <b>{} UTC</b></span>",
                utc(r.start_time_unix_s * 1000)
            );
        }
    }
    w!(
        o,
        "<span><b>{}</b> processes · <b>{}</b> threads</span>",
        count(t.total.processes),
        count(t.total.threads)
    );
    o.push_str("</div></div></header>\n<main>\n");
    dropped_events(&mut o, &t.dropped_events);
    findings(&mut o, &t.findings, &t.not_evaluated);
    summary(&mut o, t);
    charts(&mut o, t);
    process_table(&mut o, t);
    threads_and_syscalls(&mut o, t);
    disks(&mut o, t);
    gpu_section(&mut o, t);
    devices(&mut o, &t.devices, t);
    probes(&mut o, t);
    w!(
        o,
        "<footer>Generated by <b>ethand snapshot --html</b> · snapshot schema v{} · durations are host times measured with eBPF; sizes in binary units (1 KiB = 1024 B).</footer>\n</main></body></html>\n",
        t.schema_version
    );
    o
}

/// `ethand compare --html`: the comparison as one self-contained page: what each snapshot
/// was, the findings that went away, appeared or stayed, and every metric that changed,
/// largest relative change first.
pub fn render_comparison_html(c: &crate::report::Comparison) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let meta = |m: &crate::report::SnapshotMeta| {
        format!(
            "{} snapshot of pid {}, {} process{}, window {:.1} s{}",
            escape(&m.source),
            m.root_pid,
            m.processes,
            if m.processes == 1 { "" } else { "es" },
            m.window_ms as f64 / 1000.0,
            if m.measured_ms > 0 {
                format!(", measured {:.1} s", m.measured_ms as f64 / 1000.0)
            } else {
                String::new()
            }
        )
    };
    let _ = write!(
        o,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\"><title>ethand compare</title><style>\
body{{font-family:system-ui,sans-serif;margin:2em;color:#1d2330;background:#f5f7fb}}h1{{font-size:1.5em}}\
table{{border-collapse:collapse;background:#fff;width:100%}}td,th{{padding:.3em .6em;border-bottom:1px solid #e3e7ef;text-align:right;font-variant-numeric:tabular-nums}}\
td:first-child,th:first-child{{text-align:left}}.up{{color:#b3261e}}.down{{color:#1b7f3b}}.card{{background:#fff;border-radius:8px;padding:1em;margin:1em 0;box-shadow:0 1px 3px #0002}}\
.resolved{{border-left:6px solid #1b7f3b}}.new{{border-left:6px solid #b3261e}}.still{{border-left:6px solid #c98a00}}</style></head><body>"
    );
    let _ = write!(
        o,
        "<h1>ethand compare</h1><div class=\"card\"><b>Before:</b> {}<br><b>After:</b> {}</div>",
        meta(&c.before),
        meta(&c.after)
    );
    let finding = |o: &mut String,
                   class: &str,
                   label: &str,
                   f: &ethand_snapshot::diagnosis::Finding,
                   imp: String| {
        let _ = write!(
            o,
            "<div class=\"card {class}\"><b>{label}</b>: {} <code>{}</code> — impact {imp}</div>",
            escape(&f.title),
            escape(&f.id)
        );
    };
    let _ = write!(o, "<h2>Findings</h2>");
    if c.findings_resolved.is_empty()
        && c.findings_new.is_empty()
        && c.findings_remaining.is_empty()
    {
        let _ = write!(o, "<p>No findings in either snapshot.</p>");
    }
    for f in &c.findings_resolved {
        finding(
            &mut o,
            "resolved",
            "Resolved",
            f,
            format!("{:.2} → -", f.impact),
        );
    }
    for f in &c.findings_new {
        finding(&mut o, "new", "New", f, format!("- → {:.2}", f.impact));
    }
    for (b, a) in &c.findings_remaining {
        finding(
            &mut o,
            "still",
            "Still",
            a,
            format!("{:.2} → {:.2}", b.impact, a.impact),
        );
    }
    // A metric one side did not measure (kernel launches below GPU level `process`) is no
    // change: listed apart.
    let mut rows: Vec<&crate::report::ComparedRow> = c
        .rows
        .iter()
        .filter(|r| r.before != r.after && r.not_measured.is_none())
        .collect();
    let rel = |r: &crate::report::ComparedRow| match (r.before, r.after) {
        (Some(b), Some(a)) if b != 0.0 => ((a - b) / b).abs(),
        _ => f64::INFINITY,
    };
    rows.sort_by(|x, y| {
        rel(y)
            .partial_cmp(&rel(x))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let num = |v: Option<f64>| {
        v.map_or("—".to_string(), |v| {
            if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{}", v as i64)
            } else {
                format!("{v:.4}")
            }
        })
    };
    let _ = write!(
        o,
        "<h2>Changed metrics ({} of {})</h2><table><tr><th>metric</th><th>unit</th><th>before</th><th>after</th><th>change</th><th>relative</th></tr>",
        rows.len(),
        c.rows.len()
    );
    for r in rows {
        let (class, relative) = match (r.before, r.after) {
            (Some(b), Some(a)) if b != 0.0 => {
                let x = (a - b) / b;
                (
                    if x > 0.0 { "up" } else { "down" },
                    format!("{:+.1} %", 100.0 * x),
                )
            }
            _ => ("", "new/gone".to_string()),
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td class=\"{class}\">{}</td></tr>",
            escape(&r.metric),
            escape(&r.unit),
            num(r.before),
            num(r.after),
            num(r.change),
            relative
        );
    }
    let _ = write!(o, "</table>");
    for (side, which) in [
        ("before", "in the before snapshot"),
        ("after", "in the after snapshot"),
        ("both", "in either snapshot"),
    ] {
        let names: Vec<String> = c
            .rows
            .iter()
            .filter(|r| r.not_measured.as_deref() == Some(side))
            .map(|r| format!("<code>{}</code>", escape(&r.metric)))
            .collect();
        if !names.is_empty() {
            let _ = write!(
                o,
                "<div class=\"card\"><b>Not compared</b>, not measured {which} (kernel launches are counted at GPU level process or op, or sampled by <code>ethand snapshot</code>): {}</div>",
                names.join(", ")
            );
        }
    }
    let _ = writeln!(o, "</body></html>");
    o
}
