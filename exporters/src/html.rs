//! `ethand snapshot --html FILE`: one self-contained HTML report of a process tree, meant to be
//! sent around. No external resource and no JavaScript: inline CSS, inline SVG charts drawn
//! here, and a Content-Security-Policy that forbids loading anything. Every string that comes
//! from the machine (process names, command lines, cgroup paths, device names, findings) goes
//! through [`escape`].
use std::{collections::HashMap, fmt::Write as _};

use crate::format::{bytes_u, count, duration_ns_u, in_unit, number, percent, plural, utc};
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

mod charts;
mod gpu;
mod kernels;
mod memory;
mod sections;
mod stacks;

use charts::*;
use gpu::*;
use sections::*;
use stacks::{cpu_profile, where_in_code};

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

/// Where kernel launches were not counted: "not measured at level calls" (the GPU level the
/// figures were taken at), never a 0.
fn launches_not_measured(t: &TreeSnapshot) -> String {
    match t.gpu_level {
        Some(l) => format!("not measured at level {l}"),
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

/// An evidence value in its unit, for markup.
fn evidence_value(v: f64, unit: &str) -> String {
    escape(&in_unit(v, unit))
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
.flame-wrap{overflow-x:auto;background:#fff;border:1px solid var(--line);border-radius:6px;padding:4px}
.flame text{fill:#1f2937;pointer-events:none}
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
    w!(o, "<span>taken <b>{}</b></span>", utc(t.taken_at_unix_ms));
    let source = match t.source {
        ethand_snapshot::SnapshotSource::Standalone => format!(
            "standalone measurement of <b>{}</b> (no daemon)",
            duration_ns_u(t.measured_ms * 1_000_000)
        ),
        ethand_snapshot::SnapshotSource::Daemon => {
            "from the <b>ethand daemon</b> (counters since it first saw each process)".into()
        }
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
                "<span>started <b>{}</b></span>",
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
    memory::memory(&mut o, t);
    threads_and_syscalls(&mut o, t);
    disks(&mut o, t);
    gpu_section(&mut o, t);
    kernels::gpu_activity(&mut o, t);
    where_in_code(&mut o, t);
    cpu_profile(&mut o, t);
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
    outcomes_table(&mut o, c);
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
    // Exact values: the unit has its own column.
    let raw = |v: Option<f64>| {
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
            raw(r.before),
            raw(r.after),
            raw(r.change),
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

/// The comparison's outcomes: what the tree got done, before and after.
fn outcomes_table(o: &mut String, c: &crate::report::Comparison) {
    use std::fmt::Write as _;
    if !c.outcomes.is_empty() {
        let _ = write!(
            o,
            "<h2>Outcomes</h2><table><tr><th>outcome</th><th>before</th><th>after</th><th>after / before</th></tr>"
        );
        let show = |v: Option<f64>, unit: &str| {
            v.map_or("unmeasured".to_string(), |v| {
                crate::format::in_unit(v, unit)
            })
        };
        for r in &c.outcomes {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&r.metric),
                escape(&show(r.before, &r.unit)),
                escape(&show(r.after, &r.unit)),
                r.ratio.map_or("-".to_string(), |x| format!("{x:.2}×"))
            );
        }
        o.push_str("</table>");
    }
}
