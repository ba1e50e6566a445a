//! Call sites and thread profiles ([`ethand_snapshot::stacks`]) as people read them: the one
//! phrase of a site that the terminal, the HTML report and the findings share, and the flame
//! graph of a thread as inline SVG. Names and paths are the process's: the phrases are
//! returned raw for the caller to escape for its medium; the SVG escapes them itself.
use std::fmt::Write as _;

use ethand_snapshot::stacks::{
    CallSite, CallSites, CpuProfile, CpuThreadProfile, FoldedStack, Frame, FrameKind, SiteBasis,
    ThreadProfile,
};

use crate::format;

/// "train.py:41 in step(): `loss.item()`": where a site is, with its source text.
pub fn site(s: &CallSite) -> String {
    place(s.key_frame(), s.source.as_deref())
}

/// The same phrase for a kernel launch site.
pub fn launch_site(s: &ethand_snapshot::kernels::LaunchSite) -> String {
    if s.frames.is_empty() {
        return "(stack not taken)".into();
    }
    place(s.key_frame(), s.source.as_deref())
}

fn place(key: Option<&Frame>, source: Option<&str>) -> String {
    let mut o = key.map_or_else(|| "(no frame)".to_string(), |f| f.label());
    if let Some(src) = source {
        let _ = write!(o, ": `{src}`");
    }
    o
}

/// "7,538 of 7,540 kernels joined to their launch call (2 queued outside every traced
/// launch)": how much of the window the launch sites cover.
pub fn launch_coverage(ls: &ethand_snapshot::kernels::LaunchSites) -> String {
    let mut apart = Vec::new();
    for (n, what) in [
        (
            ls.kernels_without_queued_time,
            "without a queued time (CUDA graphs)",
        ),
        (
            ls.kernels_without_launch,
            "queued outside every traced launch",
        ),
        (
            ls.kernels_ambiguous,
            "queued while two threads were launching",
        ),
    ] {
        if n > 0 {
            apart.push(format!("{} {what}", format::count(n)));
        }
    }
    let mut o = format!(
        "{} of {} joined to their launch call",
        format::count(ls.kernels_joined),
        format::plural(ls.kernels, "kernel")
    );
    if !apart.is_empty() {
        let _ = write!(o, " ({})", apart.join(", "));
    }
    if ls.launches_over_budget > 0 {
        let _ = write!(
            o,
            "; {} launches over the window's budget not kept",
            format::count(ls.launches_over_budget)
        );
    }
    o
}

/// "cuStreamSynchronize: 99.0 % of the time inside it from train.py:41 in step(): `loss.item()`
/// (pid 12)", naming the busiest site.
pub fn call_sites(c: &CallSites) -> Option<String> {
    let (top, share) = c.top()?;
    let what = match c.basis {
        SiteBasis::Samples => format!(
            "{} of {} inside it",
            format::percent(share),
            format::plural(c.total, "sample")
        ),
        SiteBasis::Calls => format!(
            "{} of {}",
            format::percent(share),
            format::plural(c.total, "call")
        ),
    };
    let more = match c.sites.len() + usize::from(c.other > 0) {
        0 | 1 => String::new(),
        n => format!("; {n} sites in all"),
    };
    Some(format!(
        "{}: {what} from {} (pid {}{more})",
        c.call,
        site(top),
        c.pid
    ))
}

/// "main thread of pid 12 (MainThread): 62.0 % at decode.py:186 in decode(): `...`, 20.0 %
/// at ...": where a thread's samples were, its `n` busiest lines.
pub fn thread_lines(t: &ThreadProfile, n: usize) -> Option<String> {
    if t.samples == 0 || t.top_lines.is_empty() {
        return None;
    }
    let lines: Vec<String> = t
        .top_lines
        .iter()
        .take(n)
        .map(|l| {
            format!(
                "{} at {}",
                format::percent(l.count as f64 / t.samples as f64),
                site(l)
            )
        })
        .collect();
    let who = if t.main_thread {
        format!("main thread of pid {}", t.pid)
    } else {
        format!("thread {} of pid {}", t.tid, t.pid)
    };
    Some(format!(
        "{who} ({}): {} ({} on a CPU, {} inside runtime calls, of {})",
        t.name,
        lines.join(", "),
        format::percent(t.active_samples as f64 / t.samples as f64),
        format::percent(t.in_runtime_call_samples as f64 / t.samples as f64),
        format::plural(t.samples, "sample"),
    ))
}

/// "main thread of pid 12 (python3): on a CPU 96.0 % of the window; by file: libcuda.so.1
/// 61.0 %, [kernel] 20.0 %; by function: cuLaunchKernel 40.0 %, ...": where a thread's CPU
/// time went, its `n` busiest files and functions. None for a thread never sampled on a CPU.
pub fn cpu_thread_line(p: &CpuProfile, t: &CpuThreadProfile, n: usize) -> Option<String> {
    if t.samples == 0 {
        return None;
    }
    let of = |k: u64| format::percent(k as f64 / t.samples as f64);
    let modules: Vec<String> = t
        .by_module
        .iter()
        .take(n)
        .map(|m| format!("{} {}", m.name, of(m.samples)))
        .collect();
    let functions: Vec<String> = t
        .top_functions
        .iter()
        .take(n)
        .map(|f| format!("{} {}", f.frame.label(), of(f.samples)))
        .collect();
    let full = p.full_samples();
    let on_cpu = if full > 0.0 {
        format!(
            "on a CPU {} of the window",
            format::percent((t.samples as f64 / full).min(1.0))
        )
    } else {
        format::plural(t.samples, "sample")
    };
    Some(format!(
        "{}: {on_cpu}; by file: {}; by function: {}",
        who(t),
        modules.join(", "),
        functions.join(", ")
    ))
}

/// "thread 13 of pid 12 (pt_data_worker): blocked 40 times, 1.9 s (95.0 % of the window),
/// of which 12 ≥ 1.0 ms listed, longest in futex_wait from at::...": every wait of a thread
/// summed, and where the long ones (≥ `offcpu_min_ns`, the ones with stacks) blocked. None
/// for a thread that never waited.
pub fn wait_line(p: &CpuProfile, t: &CpuThreadProfile) -> Option<String> {
    let top = t.wait_sites.first();
    if t.waits == 0 && top.is_none() {
        return None;
    }
    let share = (p.duration_ms > 0).then(|| {
        format!(
            " ({} of the window)",
            format::percent((t.wait_ns as f64 / 1e6 / p.duration_ms as f64).min(1.0))
        )
    });
    // Files from before every wait was summed have no long-wait count: all were long.
    let long = t.long_waits.map(|n| {
        format!(
            ", of which {} ≥ {} listed",
            format::count(n),
            format::duration_ns_u(p.offcpu_min_ns)
        )
    });
    let site = match top {
        Some(top) => {
            let top_share = if t.wait_ns > 0 && t.wait_sites.len() > 1 {
                format!(
                    " ({} of it)",
                    format::percent(top.time_ns.unwrap_or(0) as f64 / t.wait_ns as f64)
                )
            } else {
                String::new()
            };
            format!(", longest in {}{top_share}", wait_site(top))
        }
        None => String::new(),
    };
    Some(format!(
        "{}: blocked {}, {}{}{}{site}",
        who(t),
        format::plural(t.waits, "time"),
        format::duration_ns_u(t.wait_ns),
        share.unwrap_or_default(),
        long.unwrap_or_default(),
    ))
}

/// "clock_nanosleep() from sleeper": the syscall a wait is in (else the kernel function,
/// past the scheduler's own) and the innermost user function outside the C library that led
/// there.
pub fn wait_site(s: &CallSite) -> String {
    let kernel: Vec<&Frame> = s
        .frames
        .iter()
        .filter(|f| f.kind == FrameKind::Kernel)
        .collect();
    let syscall = kernel.iter().find_map(|f| {
        let n = f.function.as_deref()?;
        [
            "__x64_sys_",
            "__arm64_sys_",
            "__ia32_sys_",
            "__se_sys_",
            "__do_sys_",
        ]
        .iter()
        .find_map(|p| n.strip_prefix(p))
        .map(|sys| format!("{sys}()"))
    });
    let in_kernel = syscall.or_else(|| {
        kernel
            .iter()
            .find(|f| {
                f.function.as_deref().is_none_or(|n| {
                    !(n.starts_with("schedule")
                        || n.starts_with("__schedule")
                        || n.starts_with("preempt_schedule")
                        || n.starts_with("io_schedule"))
                })
            })
            .map(|f| f.label())
    });
    let users: Vec<&Frame> = s
        .frames
        .iter()
        .filter(|f| f.kind != FrameKind::Kernel)
        .collect();
    let system = |f: &&Frame| {
        f.module.as_deref().is_some_and(|m| {
            let b = m.rsplit('/').next().unwrap_or(m);
            [
                "libc.so",
                "libc-",
                "libpthread",
                "ld-linux",
                "ld-musl",
                "[vdso]",
            ]
            .iter()
            .any(|p| b.starts_with(p))
        })
    };
    let user = users.iter().find(|f| !system(f)).or_else(|| users.first());
    match (in_kernel, user) {
        (Some(k), Some(u)) => format!("{k} from {}", u.label()),
        (Some(k), None) => k,
        (None, Some(u)) => u.label(),
        (None, None) => "(no stack)".into(),
    }
}

fn who(t: &CpuThreadProfile) -> String {
    if t.main_thread {
        format!("main thread of pid {} ({})", t.pid, t.name)
    } else {
        format!("thread {} of pid {} ({})", t.tid, t.pid, t.name)
    }
}

/// A flame graph of one thread's sampled Python stacks (see [`flame_svg_of`]).
pub fn flame_svg(t: &ThreadProfile, width: u32) -> String {
    flame_svg_of(&t.folded, &t.frames, width)
}

/// A flame graph of one thread's stacks (`folded`: outermost first, indexes into `frames`):
/// outermost frame at the bottom, width by samples, one `<rect>` and `<title>` per frame
/// (hover shows the whole label and share); kernel frames in a cooler hue. Self-contained
/// SVG, no script.
pub fn flame_svg_of(folded: &[FoldedStack], frames: &[Frame], width: u32) -> String {
    const ROW: u32 = 17;
    // Merge the folded stacks into a tree: (frame index path) -> samples.
    #[derive(Default)]
    struct Node {
        samples: u64,
        children: Vec<(u32, Node)>,
    }
    let mut root = Node::default();
    for s in folded {
        root.samples += s.samples;
        let mut n = &mut root;
        for &f in &s.frames {
            let i = match n.children.iter().position(|(k, _)| *k == f) {
                Some(i) => i,
                None => {
                    n.children.push((f, Node::default()));
                    n.children.len() - 1
                }
            };
            n = &mut n.children[i].1;
            n.samples += s.samples;
        }
    }
    fn depth(n: &Node) -> u32 {
        n.children
            .iter()
            .map(|(_, c)| 1 + depth(c))
            .max()
            .unwrap_or(0)
    }
    let rows = depth(&root).max(1);
    let height = rows * ROW + 4;
    let total = root.samples.max(1) as f64;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="flame" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">"#
    );
    #[allow(clippy::too_many_arguments)]
    fn draw(
        o: &mut String,
        frames: &[Frame],
        n: &Node,
        x: f64,
        level: u32,
        rows: u32,
        total: f64,
        width: f64,
    ) {
        let mut cx = x;
        for (f, c) in &n.children {
            let w = c.samples as f64 / total * width;
            if w >= 0.5 {
                let y = (rows - 1 - level) * ROW + 2;
                let frame = frames.get(*f as usize);
                let label = frame.map_or_else(|| "?".to_string(), |fr| fr.label());
                let base = if frame.is_some_and(|fr| fr.kind == FrameKind::Kernel) {
                    190
                } else {
                    10
                };
                // Warm colours; a stable hue per label so a function keeps its colour.
                let h = label
                    .bytes()
                    .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b.into()));
                let share = format::percent(c.samples as f64 / total);
                let _ = write!(
                    o,
                    r#"<g><title>{} ({share}, {} samples)</title><rect x="{cx:.1}" y="{y}" width="{:.1}" height="{}" fill="hsl({},80%,{}%)" rx="2"/>"#,
                    xml(&label),
                    c.samples,
                    (w - 1.0).max(0.5),
                    ROW - 1,
                    base + h % 40,
                    55 + h % 15,
                );
                // Text only where it fits (6.6 px per character at 11 px monospace).
                let fits = ((w - 6.0) / 6.6) as usize;
                if fits >= 3 {
                    let shown: String = if label.chars().count() > fits {
                        label
                            .chars()
                            .take(fits.saturating_sub(2))
                            .chain("..".chars())
                            .collect()
                    } else {
                        label
                    };
                    let _ = write!(
                        o,
                        r#"<text x="{:.1}" y="{}">{}</text>"#,
                        cx + 3.0,
                        y + ROW - 5,
                        xml(&shown)
                    );
                }
                o.push_str("</g>");
                draw(o, frames, c, cx, level + 1, rows, total, width);
            }
            cx += w;
        }
    }
    draw(&mut o, frames, &root, 0.0, 0, rows, total, f64::from(width));
    o.push_str("</svg>");
    o
}

/// Escapes for SVG text and attributes; hidden and control characters as visible escapes.
fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in crate::text::for_terminal(s).chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_snapshot::stacks::{FoldedStack, Frame, FrameKind};

    fn py(f: &str, line: u32) -> Frame {
        Frame {
            kind: FrameKind::Python,
            function: Some(f.into()),
            file: Some("/w/train.py".into()),
            line: Some(line),
            ..Frame::default()
        }
    }

    #[test]
    fn a_site_phrase_names_call_share_line_and_source() {
        let c = CallSites {
            pid: 7,
            call: "cuStreamSynchronize".into(),
            category: "sync".into(),
            basis: SiteBasis::Samples,
            total: 200,
            sites: vec![CallSite {
                frames: vec![py("step", 41), py("<module>", 90)],
                count: 198,
                time_ns: None,
                source: Some("loss.item()".into()),
            }],
            other: 2,
            unattributed: None,
        };
        assert_eq!(
            call_sites(&c).unwrap(),
            "cuStreamSynchronize: 99.0 % of 200 samples inside it from train.py:41 in step(): `loss.item()` (pid 7; 2 sites in all)"
        );
    }

    #[test]
    fn the_flame_graph_has_one_box_per_frame_and_escapes_names() {
        let t = ThreadProfile {
            pid: 1,
            tid: 1,
            name: "MainThread".into(),
            main_thread: true,
            samples: 4,
            frames: vec![py("<module>", 1), py("a", 2), py("<b>\u{202e}", 3)],
            folded: vec![
                FoldedStack {
                    frames: vec![0, 1],
                    samples: 3,
                },
                FoldedStack {
                    frames: vec![0, 2],
                    samples: 1,
                },
            ],
            ..ThreadProfile::default()
        };
        let svg = flame_svg(&t, 800);
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("train.py:2 in a() (75.0 %, 3 samples)"));
        assert!(svg.contains("&lt;b&gt;\\u{202e}"), "{svg}");
        assert!(!svg.contains('\u{202e}'));
    }

    fn kernel(f: &str) -> Frame {
        Frame {
            kind: FrameKind::Kernel,
            function: Some(f.into()),
            ..Frame::default()
        }
    }

    fn native(f: &str, module: &str) -> Frame {
        Frame {
            function: Some(f.into()),
            module: Some(module.into()),
            ..Frame::default()
        }
    }

    fn profile() -> CpuProfile {
        CpuProfile {
            duration_ms: 2000,
            rate_hz: 100,
            threads: vec![CpuThreadProfile {
                pid: 9,
                tid: 9,
                name: "<b>\u{1b}[31m".into(),
                main_thread: true,
                samples: 150,
                by_module: vec![
                    ethand_snapshot::stacks::Share {
                        name: "libcuda.so.1".into(),
                        samples: 90,
                    },
                    ethand_snapshot::stacks::Share {
                        name: "[kernel]".into(),
                        samples: 60,
                    },
                ],
                top_functions: vec![ethand_snapshot::stacks::FrameShare {
                    frame: native("cuLaunchKernel", "/usr/lib/libcuda.so.1"),
                    samples: 90,
                }],
                waits: 10,
                wait_ns: 500_000_000,
                wait_sites: vec![CallSite {
                    frames: vec![
                        kernel("__schedule"),
                        kernel("futex_wait"),
                        kernel("__x64_sys_futex"),
                        native("__futex_abstimed_wait_common", "/lib/libc.so.6"),
                        native("PyThread_acquire_lock_timed", "/usr/bin/python3.12"),
                    ],
                    count: 10,
                    time_ns: Some(500_000_000),
                    source: None,
                }],
                ..CpuThreadProfile::default()
            }],
            ..CpuProfile::default()
        }
    }

    #[test]
    fn cpu_lines_give_shares_of_the_window_files_functions_and_waits() {
        let p = profile();
        let t = &p.threads[0];
        assert_eq!(
            cpu_thread_line(&p, t, 3).unwrap(),
            "main thread of pid 9 (<b>\u{1b}[31m): on a CPU 75.0 % of the window; by file: libcuda.so.1 60.0 %, [kernel] 40.0 %; by function: cuLaunchKernel 60.0 %"
        );
        // The syscall and the first user function outside the C library.
        assert_eq!(
            wait_line(&p, t).unwrap(),
            "main thread of pid 9 (<b>\u{1b}[31m): blocked 10 times, 500.0 ms (25.0 % of the window), longest in futex() from PyThread_acquire_lock_timed"
        );
        // Every wait summed; the long ones listed by stack.
        let mut all = t.clone();
        (all.waits, all.wait_ns) = (2_010, 1_500_000_000);
        (all.long_waits, all.long_wait_ns) = (Some(10), Some(500_000_000));
        let p1 = CpuProfile {
            offcpu_min_ns: 1_000_000,
            ..p.clone()
        };
        assert_eq!(
            wait_line(&p1, &all).unwrap(),
            "main thread of pid 9 (<b>\u{1b}[31m): blocked 2,010 times, 1.50 s (75.0 % of the window), of which 10 ≥ 1.0 ms listed, longest in futex() from PyThread_acquire_lock_timed"
        );
        // Only short waits: summed, none listed.
        all.wait_sites.clear();
        all.long_waits = Some(0);
        assert!(
            wait_line(&p1, &all)
                .unwrap()
                .ends_with("of which 0 ≥ 1.0 ms listed")
        );
        // No syscall frame: the first kernel function past the scheduler.
        let s = CallSite {
            frames: vec![
                kernel("schedule"),
                kernel("io_schedule"),
                kernel("folio_wait_bit"),
            ],
            ..CallSite::default()
        };
        assert_eq!(wait_site(&s), "folio_wait_bit");
        assert_eq!(wait_site(&CallSite::default()), "(no stack)");
        let idle = CpuThreadProfile::default();
        assert!(cpu_thread_line(&p, &idle, 3).is_none() && wait_line(&p, &idle).is_none());
    }
}
