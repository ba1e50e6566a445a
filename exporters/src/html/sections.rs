//! The report's sections about the tree: findings, summary tiles, the process table, threads and syscalls, disks and probes.
use super::*;

// ---------------------------------------------------------------------------------------
// Sections.

pub(super) fn severity_class(s: ethand_snapshot::diagnosis::Severity) -> &'static str {
    s.as_str()
}

/// A warning when node-wide losses may have cut the tree's figures.
pub(super) fn dropped_events(o: &mut String, d: &[ethand_snapshot::DropCounter]) {
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
pub(super) fn not_evaluated(o: &mut String, n: &[NotEvaluated], no_findings: bool) {
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

pub(super) fn findings(o: &mut String, f: &[Finding], n: &[NotEvaluated]) {
    o.push_str("<section><h2>Findings</h2>");
    if f.is_empty() && n.is_empty() {
        o.push_str("<div class=\"finding ok\"><div class=\"fhead\"><span class=\"badge\">ok</span><h3>No findings</h3></div><p>The diagnosis rules found nothing to flag in this process tree.</p></div></section>\n");
        return;
    }
    for x in f {
        let cls = severity_class(x.severity);
        w!(
            o,
            "<div class=\"finding {cls}\"><div class=\"fhead\"><span class=\"badge\">{}</span><h3>{}</h3>",
            escape(x.severity.as_str()),
            escape(&x.title)
        );
        if let Some(s) = x.estimated_speedup.filter(|s| s.is_finite()) {
            w!(
                o,
                "<span class=\"speedup\" title=\"estimated speed-up if the cause is removed\">≈ {s:.2}× faster</span>"
            );
        } else {
            o.push_str(
                "<span class=\"speedup\" title=\"no estimate of this rule was checked against a measured fix\">no speed-up estimate</span>",
            );
        }
        w!(
            o,
            "</div><div class=\"fmeta\">rule <code>{}</code> · impact {}</div>",
            escape(&x.id),
            percent(x.impact)
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

pub(super) fn tile(o: &mut String, label: &str, value: &str, sub: &str) {
    w!(
        o,
        "<div class=\"tile\"><div class=\"tl\">{label}</div><div class=\"tv\">{value}</div><div class=\"ts\">{sub}</div></div>"
    );
}

pub(super) fn summary(o: &mut String, t: &TreeSnapshot) {
    let tt = &t.total;
    let n = &tt.net;
    o.push_str("<section><h2>Summary</h2><div class=\"tiles\">");
    let period = if t.source == ethand_snapshot::SnapshotSource::Standalone {
        format!("over {}", duration_ns_u(t.measured_ms * 1_000_000))
    } else {
        "since first seen".into()
    };
    tile(
        o,
        "Processes / threads",
        &format!("{} / {}", count(tt.processes), count(tt.threads)),
        "in the tree",
    );
    tile(o, "CPU time", &duration_ns_u(tt.sched.oncpu_ns), &period);
    tile(
        o,
        "Run-queue wait",
        &duration_ns_u(tt.sched.runq_wait_ns),
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
            duration_ns_u(tt.syscall_time_ns)
        ),
    );
    tile(
        o,
        "Disk read / write",
        &format!(
            "{} / {}",
            bytes_u(tt.block_read_bytes),
            bytes_u(tt.block_write_bytes)
        ),
        &format!(
            "{} / {} ops",
            count(tt.block_read_ops),
            count(tt.block_write_ops)
        ),
    );
    if let Some(own) = tt.proc_write_bytes {
        // Two figures for "written": say what each counts.
        tile(
            o,
            "Written by the processes",
            &bytes_u(own),
            "their own data (write_bytes, /proc/PID/io, live processes); the disk tile counts \
             block-layer bytes, journal and metadata included",
        );
    }
    tile(
        o,
        "Network sent / received",
        &format!("{} / {}", bytes_u(n.tx_bytes()), bytes_u(n.rx_bytes())),
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
            &duration_ns_u(g.sync.time_ns),
            &plural(g.sync.calls, "call"),
        );
    }
    o.push_str("</div></section>\n");
}

/// Under a launch count: the graph launches, or where launches were not counted, the launch
/// sample's rate when there is one.
pub(super) fn launches_sub(g: &GpuProcessStats, t: &TreeSnapshot) -> String {
    if g.launches.is_some() {
        return g
            .graph_launches
            .map_or_else(String::new, |n| plural(n, "graph launch"));
    }
    match t.launch_sample.as_ref().and_then(|l| l.launches_per_second) {
        Some(r) => format!("sampled: {} /s", number(r)),
        None => String::new(),
    }
}

/// Processes in depth-first order with their depth below the root.
pub(super) fn tree_order(t: &TreeSnapshot) -> Vec<(&ProcessSnapshot, usize)> {
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

pub(super) fn process_table(o: &mut String, t: &TreeSnapshot) {
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
        w!(o, "<td>{}</td>", duration_ns_u(p.sched.oncpu_ns));
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
            duration_ns_u(p.sched.runq_wait_ns),
            duration_ns_u(p.sched.offcpu_blocked_ns),
            p.threads.iter().filter(|t| t.alive).count(),
            count(p.syscalls.count),
            count(p.syscalls.errors),
            bytes_u(p.block_bytes("read")),
            bytes_u(p.block_bytes("write")),
            bytes_u(p.net.tx_bytes()),
            bytes_u(p.net.rx_bytes())
        );
        if gpu_cols {
            match &p.gpu {
                Some(g) => {
                    let (cc, cb) = (g.copy_calls_total(), g.copy_bytes_total());
                    let (live, peak) = (g.memory_live_bytes(), g.memory_peak_bytes());
                    let sampled = t
                        .launch_sample
                        .as_ref()
                        .filter(|_| g.launches.is_none())
                        .and_then(|l| l.processes.iter().find(|s| s.pid == p.pid))
                        .map_or_else(String::new, |s| {
                            format!(
                                "<div class=\"dim\">{} in the {} sample</div>",
                                count(s.launches),
                                duration_ns_u(
                                    t.launch_sample.as_ref().map_or(0, |l| l.duration_ms)
                                        * 1_000_000
                                )
                            )
                        });
                    w!(
                        o,
                        "<td>{}{sampled}</td><td>{} <span class=\"dim\">({} calls)</span></td><td>{} / {}</td>",
                        launches_cell(g.launches, t),
                        bytes_u(cb),
                        count(cc),
                        bytes_u(live),
                        bytes_u(peak)
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
                    .map(|d| format!("{} {}", escape(&d.device), bytes_u(d.memory_used_bytes)))
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

pub(super) fn threads_and_syscalls(o: &mut String, t: &TreeSnapshot) {
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
                duration_ns_u(th.sched.oncpu_ns),
                duration_ns_u(th.sched.runq_wait_ns),
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
                duration_ns_u(r.time_ns)
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</div></section>\n");
}

pub(super) fn disks(o: &mut String, t: &TreeSnapshot) {
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
        let avg = |x: u64| {
            x.checked_div(ops)
                .map_or_else(|| "–".to_string(), duration_ns_u)
        };
        w!(
            o,
            "<tr><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&dev),
            escape(&op),
            count(ops),
            bytes_u(b),
            avg(q),
            avg(s)
        );
    }
    o.push_str("</tbody></table></section>\n");
}

pub(super) fn probes(o: &mut String, t: &TreeSnapshot) {
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
