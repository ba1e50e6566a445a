//! The report's memory section: the tree's resident memory by kind and its peak, each live
//! process's split, swap, faults and growth over the window, and the memory cgroups' limits.
use super::*;
use crate::format::bytes_per_second;
use crate::terminal::memory::cgroup_line;

pub(super) fn memory(o: &mut String, t: &TreeSnapshot) {
    let Some(tot) = t.memory_totals() else {
        return;
    };
    let peak = t.total.memory_peak_rss_bytes.map_or(String::new(), |p| {
        format!("; peak {} over the window", bytes_u(p))
    });
    w!(
        o,
        "<section><h2>Memory</h2><p class=\"sub\">Resident {} (anonymous {}, file {}, shmem {}), swap {}{peak}. Read from /proc/PID/status when the snapshot was taken; growth and peak from the daemon's samples over the window.</p>",
        bytes_u(tot.rss_bytes),
        bytes_u(tot.anon_bytes),
        bytes_u(tot.file_bytes),
        bytes_u(tot.shmem_bytes),
        bytes_u(tot.swap_bytes)
    );
    o.push_str("<table><thead><tr><th>PID</th><th class=\"l\">Command</th><th>Resident</th><th>Anonymous</th><th>File</th><th>Shmem</th><th>Swap</th><th>Peak (window)</th><th>Growth</th><th>Minor faults</th><th>Major faults</th></tr></thead><tbody>");
    let mut procs: Vec<_> = t
        .processes
        .iter()
        .filter_map(|p| Some((p, p.memory_now()?)))
        .collect();
    procs.sort_by_key(|(_, m)| std::cmp::Reverse(m.rss_bytes.unwrap_or(0)));
    let b = |v: Option<u64>| v.map_or_else(|| "–".to_string(), bytes_u);
    let c = |v: Option<u64>| v.map_or_else(|| "–".to_string(), count);
    for (p, m) in procs {
        let w = m.window.as_ref();
        let growth = w.and_then(|w| w.rss_growth_bytes_per_second()).map_or_else(
            || "–".to_string(),
            |g| {
                let sign = if g < 0.0 { "-" } else { "" };
                format!("{sign}{}", bytes_per_second(g.abs()))
            },
        );
        w!(
            o,
            "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            p.pid,
            escape(&p.comm),
            b(m.rss_bytes),
            b(m.anon_bytes),
            b(m.file_bytes),
            b(m.shmem_bytes),
            b(m.swap_bytes),
            b(w.map(|w| w.peak_rss_bytes)),
            growth,
            c(m.minor_faults),
            c(m.major_faults)
        );
    }
    o.push_str("</tbody></table><ul>");
    for cg in &t.memory_cgroups {
        w!(o, "<li>{}</li>", escape(&cgroup_line(cg)));
    }
    if let Some(n) = &t.node_memory {
        w!(
            o,
            "<li>node: {} available of {}</li>",
            bytes_u(n.available_bytes),
            bytes_u(n.total_bytes)
        );
    }
    o.push_str("</ul></section>\n");
}
