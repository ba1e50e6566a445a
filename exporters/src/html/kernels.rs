//! The report's GPU activity section: what the GPU ran during the snapshot's window, per
//! process recorded by libethand_cupti.so (the terminal's GPU ACTIVITY, as tables).
use super::*;
use ethand_snapshot::kernels::{ActivityState, GpuActivityProcess};

pub(super) fn gpu_activity(o: &mut String, t: &TreeSnapshot) {
    let Some(a) = &t.gpu_activity else {
        return;
    };
    w!(
        o,
        "<section><h2>GPU activity</h2><p class=\"sub\">Kernels, copies and syncs as CUPTI recorded them inside the processes started with libethand_cupti.so, over {:.1} s for this snapshot. Busy is the union of kernel intervals (NVML utilization's definition).</p>",
        a.duration_ms as f64 / 1000.0
    );
    for p in &a.processes {
        process(o, p);
    }
    for n in &a.notes {
        w!(o, "<p class=\"dim\">{}</p>", escape(n));
    }
    o.push_str("</section>\n");
}

fn process(o: &mut String, p: &GpuActivityProcess) {
    let state = p.state.describe();
    w!(o, "<h3>pid {}: {state}</h3>", p.pid);
    if let Some(d) = &p.detail {
        w!(o, "<p class=\"dim\">{}</p>", escape(d));
    }
    if p.state != ActivityState::Recorded {
        return;
    }
    if let Some(why) = &p.incomplete {
        w!(
            o,
            "<div class=\"note\"><b>Incomplete:</b> {}</div>",
            escape(why)
        );
    }
    let of = |ns: u64| match p.window_ns {
        Some(w) if w > 0 => format!(
            "{} <span class=\"dim\">{}</span>",
            duration_ns_u(ns),
            percent(ns as f64 / w as f64)
        ),
        _ => duration_ns_u(ns),
    };
    o.push_str("<table><thead><tr><th>GPU</th><th>Busy</th><th>Kernels</th><th>Kernel time</th><th>Idle: host wait</th><th>Idle: queued</th><th>Idle: copies only</th><th>Unattributed</th><th>Collectives (overlapped)</th></tr></thead><tbody>");
    for d in &p.devices {
        let idle =
            |f: fn(&ethand_snapshot::kernels::IdleSplit) -> u64| opt(d.idle.as_ref().map(f), &of);
        let comm = opt(d.communication.as_ref(), |c| {
            format!(
                "{} ({})",
                duration_ns_u(c.communication_ns),
                duration_ns_u(c.overlapped_ns)
            )
        });
        w!(
            o,
            "<tr><td>{}</td><td style=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{comm}</td></tr>",
            d.device,
            bar(d.busy_fraction.unwrap_or(0.0) * 100.0),
            of(d.busy_ns),
            count(d.kernels),
            duration_ns_u(d.kernel_ns),
            idle(|i| i.host_wait_ns),
            idle(|i| i.kernel_wait_ns),
            idle(|i| i.copy_ns),
            idle(|i| i.unattributed_ns)
        );
    }
    o.push_str("</tbody></table>");
    let total: u64 = p.kernel_classes.iter().map(|c| c.gpu_ns).sum();
    if total > 0 {
        o.push_str("<table><thead><tr><th class=\"l\">Kernel type</th><th>GPU time</th><th>Share</th><th>Launches</th></tr></thead><tbody>");
        for c in &p.kernel_classes {
            let share = c.gpu_ns as f64 / total as f64;
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td>{}</td><td style=\"{}\">{}</td><td>{}</td></tr>",
                c.class.as_str(),
                duration_ns_u(c.gpu_ns),
                bar(share * 100.0),
                percent(share),
                count(c.count)
            );
        }
        o.push_str("</tbody></table>");
    }
    kernels(o, p);
    launch_sites(o, p);
    copies(o, p);
}

fn launch_sites(o: &mut String, p: &GpuActivityProcess) {
    if let Some(why) = &p.launch_sites_unavailable {
        w!(
            o,
            "<p class=\"dim\">Launch call sites not traced: {}</p>",
            escape(why)
        );
    }
    let Some(ls) = &p.launch_sites else {
        return;
    };
    w!(
        o,
        "<p class=\"sub\">Launched from: {}.</p>",
        escape(&crate::stacks::launch_coverage(ls))
    );
    if ls.sites.is_empty() {
        return;
    }
    o.push_str("<table><thead><tr><th>GPU time</th><th>Kernels</th><th class=\"l\">Launched from</th><th class=\"l\">Its kernels</th></tr></thead><tbody>");
    for s in &ls.sites {
        let kernels: Vec<String> = s
            .top
            .iter()
            .map(|k| format!("{} ×{}", escape(k.shown_name()), count(k.count)))
            .collect();
        w!(
            o,
            "<tr><td>{}</td><td>{}</td><td class=\"l cmd\">{}</td><td class=\"l cmd\">{}</td></tr>",
            duration_ns_u(s.gpu_ns),
            count(s.kernels),
            escape(&crate::stacks::launch_site(s)),
            kernels.join("<br>")
        );
    }
    if let Some(other) = &ls.other {
        w!(
            o,
            "<tr><td>{}</td><td>{}</td><td class=\"l\"><i>the other sites</i></td><td></td></tr>",
            duration_ns_u(other.gpu_ns),
            count(other.count)
        );
    }
    o.push_str("</tbody></table>");
}

fn kernels(o: &mut String, p: &GpuActivityProcess) {
    if p.kernels.is_empty() {
        return;
    }
    o.push_str("<table><thead><tr><th>GPU time</th><th>Launches</th><th>Longest</th><th class=\"l\">Type</th><th class=\"l\">Kernel</th></tr></thead><tbody>");
    let row = |o: &mut String,
               k: &ethand_snapshot::kernels::KernelStat,
               class: &str,
               name: String| {
        w!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l cmd\">{name}</td></tr>",
            duration_ns_u(k.gpu_ns),
            count(k.count),
            duration_ns_u(k.max_ns),
            class
        );
    };
    for k in &p.kernels {
        let name = match (&k.demangled, &k.name) {
            (Some(d), Some(raw)) => format!("<span title=\"{}\">{}</span>", escape(raw), escape(d)),
            (None, Some(raw)) => escape(raw),
            _ => "<i>(name lost)</i>".to_string(),
        };
        row(o, k, k.class.as_str(), name);
    }
    if let Some(k) = &p.kernels_other {
        row(o, k, "–", "<i>the other kernels</i>".to_string());
    }
    o.push_str("</tbody></table>");
}

fn copies(o: &mut String, p: &GpuActivityProcess) {
    if p.copies.is_empty() && p.memsets.is_none() && p.syncs.is_empty() {
        return;
    }
    o.push_str("<table><thead><tr><th class=\"l\">Copy</th><th class=\"l\">Memory</th><th>Bytes</th><th>Count</th><th>GPU time</th><th>Bandwidth</th></tr></thead><tbody>");
    for c in &p.copies {
        w!(
            o,
            "<tr><td class=\"l\">{:?}</td><td class=\"l\">{:?} → {:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.kind,
            c.src,
            c.dst,
            bytes_u(c.bytes),
            count(c.count),
            duration_ns_u(c.gpu_ns),
            opt(c.bytes_per_s, crate::format::bytes_per_second)
        );
    }
    if let Some(m) = &p.memsets {
        w!(
            o,
            "<tr><td class=\"l\">memset</td><td class=\"l\">–</td><td>{}</td><td>{}</td><td>{}</td><td>–</td></tr>",
            bytes_u(m.bytes),
            count(m.count),
            duration_ns_u(m.gpu_ns)
        );
    }
    for s in &p.syncs {
        w!(
            o,
            "<tr><td class=\"l\">sync {:?}</td><td class=\"l\">–</td><td>–</td><td>{}</td><td>{} waited</td><td>–</td></tr>",
            s.kind,
            count(s.count),
            duration_ns_u(s.wait_ns)
        );
    }
    o.push_str("</tbody></table>");
    let lost = p.records_dropped_by_cupti + p.records_lost_by_ethand;
    if lost > 0 {
        w!(
            o,
            "<div class=\"note\">Records lost: {} by CUPTI, {} by ethand: the figures above are low.</div>",
            count(p.records_dropped_by_cupti),
            count(p.records_lost_by_ethand)
        );
    }
}
