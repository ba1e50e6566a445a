//! The report's "Where in the code": call sites of runtime calls (Python samples and the
//! kernel's exact stacks) and a flame graph of each sampled main thread.
use super::*;
use crate::stacks::{
    call_sites, cpu_thread_line, flame_svg, flame_svg_of, thread_lines, wait_line, wait_site,
};

/// The report's "CPU profile": each profiled thread's CPU time by file and function with a
/// flame graph of its native stacks, and where it blocked.
pub(super) fn cpu_profile(o: &mut String, t: &TreeSnapshot) {
    let Some(p) = &t.cpu_profile else {
        return;
    };
    o.push_str("<section><h2>CPU profile</h2>");
    if p.rate_hz > 0 {
        w!(
            o,
            "<div class=\"note\">Sampled {} times a second on every CPU over {:.1} s for this snapshot: {}.</div>",
            p.rate_hz,
            p.duration_ms as f64 / 1000.0,
            escape(&p.method)
        );
    }
    let mut graphs = 0;
    for th in p.threads.iter().take(8) {
        if let Some(l) = cpu_thread_line(p, th, 4) {
            w!(o, "<h3>{}</h3>", escape(&l));
            if graphs < 3 && !th.folded.is_empty() {
                graphs += 1;
                w!(
                    o,
                    "<div class=\"flame-wrap\">{}</div><div class=\"note\">Flame graph of the thread's native stacks on the CPU: outermost frame at the bottom, kernel frames in blue, width by samples (hover for each frame's share).</div>",
                    flame_svg_of(&th.folded, &th.frames, 1100)
                );
            }
        }
        if let Some(l) = wait_line(p, th) {
            w!(o, "<h3>{}</h3><ul>", escape(&l));
            for s in th.wait_sites.iter().take(4) {
                w!(
                    o,
                    "<li>{} waits, {}: {}</li>",
                    s.count,
                    crate::format::duration_ns_u(s.time_ns.unwrap_or(0)),
                    escape(&wait_site(s))
                );
            }
            o.push_str("</ul>");
        }
    }
    for n in &p.notes {
        w!(o, "<div class=\"note\">{}</div>", escape(n));
    }
    o.push_str("</section>\n");
}

pub(super) fn where_in_code(o: &mut String, t: &TreeSnapshot) {
    let mut kernel: Vec<&ethand_snapshot::stacks::CallSites> = t
        .processes
        .iter()
        .filter_map(|p| p.gpu.as_ref())
        .flat_map(|g| &g.call_sites)
        .collect();
    kernel.sort_by_key(|c| std::cmp::Reverse(c.total));
    let sample = t.stack_sample.as_ref();
    if kernel.is_empty() && sample.is_none() {
        return;
    }
    o.push_str("<section><h2>Where in the code</h2>");
    if let Some(s) = sample {
        w!(
            o,
            "<div class=\"note\">Python frames sampled {} times a second over {:.1} s for this snapshot. {}</div>",
            s.rate_hz,
            s.duration_ms as f64 / 1000.0,
            escape(&s.method)
        );
        if !s.call_sites.is_empty() {
            o.push_str("<h3>Runtime calls, by the Python line they were made from</h3><ul>");
            for c in &s.call_sites {
                if let Some(l) = call_sites(c) {
                    w!(o, "<li>{}</li>", escape(&l));
                }
            }
            o.push_str("</ul>");
        }
        for th in s.threads.iter().filter(|th| th.main_thread).take(3) {
            if let Some(l) = thread_lines(th, 5) {
                w!(o, "<h3>{}</h3>", escape(&l));
            }
            if !th.folded.is_empty() {
                w!(
                    o,
                    "<div class=\"flame-wrap\">{}</div><div class=\"note\">Flame graph of the thread's Python stacks: outermost frame at the bottom, width by samples (hover for each frame's share).</div>",
                    flame_svg(th, 1100)
                );
            }
        }
        for n in &s.notes {
            w!(o, "<div class=\"note\">{}</div>", escape(n));
        }
    }
    if !kernel.is_empty() {
        o.push_str(
            "<h3>Runtime calls, by the user stack the kernel took at each call (exact)</h3><ul>",
        );
        for c in kernel.iter().take(12) {
            if let Some(l) = call_sites(c) {
                w!(o, "<li>{}", escape(&l));
                if let Some((top, _)) = c.top() {
                    o.push_str("<div class=\"note\">");
                    let frames: Vec<String> = top
                        .frames
                        .iter()
                        .take(8)
                        .map(|f| escape(&f.label()))
                        .collect();
                    o.push_str(&frames.join(" &larr; "));
                    o.push_str("</div>");
                }
                o.push_str("</li>");
            }
        }
        o.push_str("</ul>");
    }
    o.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use ethand_snapshot::stacks::{CpuProfile, CpuThreadProfile, FoldedStack, Frame, FrameKind};

    #[test]
    fn the_cpu_profile_section_escapes_names_and_draws_the_flame_graph() {
        let hostile = "<script>\u{1b}[31m";
        let t = ethand_snapshot::TreeSnapshot {
            cpu_profile: Some(CpuProfile {
                duration_ms: 1000,
                rate_hz: 10,
                threads: vec![CpuThreadProfile {
                    pid: 3,
                    tid: 3,
                    name: hostile.into(),
                    main_thread: true,
                    samples: 10,
                    frames: vec![
                        Frame {
                            function: Some(hostile.into()),
                            ..Frame::default()
                        },
                        Frame {
                            kind: FrameKind::Kernel,
                            function: Some("do_syscall_64".into()),
                            ..Frame::default()
                        },
                    ],
                    folded: vec![FoldedStack {
                        frames: vec![0, 1],
                        samples: 10,
                    }],
                    ..CpuThreadProfile::default()
                }],
                notes: vec![hostile.into()],
                ..CpuProfile::default()
            }),
            ..ethand_snapshot::TreeSnapshot::default()
        };
        let html = crate::html::render_html(&t);
        let section = html
            .split("<h2>CPU profile</h2>")
            .nth(1)
            .expect("a CPU profile section");
        assert!(section.contains("<svg class=\"flame\""));
        assert_eq!(
            section
                .split("</section>")
                .next()
                .unwrap()
                .matches("<rect")
                .count(),
            2
        );
        assert!(
            !html.contains("<script>") && !html.contains('\u{1b}'),
            "escaped"
        );
        assert!(section.contains("&lt;script&gt;"));
    }
}
