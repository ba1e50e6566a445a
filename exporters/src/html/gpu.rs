//! The report's GPU/NPU sections: per-process library calls, the launch sample, device readings.
use super::*;

pub(super) fn gpu_section(o: &mut String, t: &TreeSnapshot) {
    o.push_str("<section><h2>GPU / NPU runtime</h2>");
    let Some(g) = &t.total.gpu else {
        o.push_str("<div class=\"note\">No process of this tree made a probed GPU/NPU runtime call (libcuda, libnccl, libascendcl, libhccl).</div></section>\n");
        return;
    };
    o.push_str("<div class=\"tiles\">");
    runtime_tiles(o, t, g);
    if let Some(d) = &t.total.gpu_derived {
        window_tiles(o, t, d);
    }
    o.push_str("</div>");
    if let Some(l) = &t.launch_sample {
        launch_sample(o, l);
    }
    copies_and_memory(o, g);
    collectives(o, g);
    ranks(o, t);
    o.push_str("</section>\n");
}

/// The tree's runtime call totals: launches, sync, collectives, errors.
fn runtime_tiles(o: &mut String, t: &TreeSnapshot, g: &GpuProcessStats) {
    tile(
        o,
        "Launches",
        &launches_cell(g.launches, t),
        &launches_sub(g, t),
    );
    tile(
        o,
        "Host blocked in sync",
        &duration_ns_u(g.sync.time_ns),
        &plural(g.sync.calls, "call"),
    );
    tile(
        o,
        "Collectives (host)",
        &duration_ns_u(g.collective_time_ns()),
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
}

/// The rates and ratios of the last window, and the GPM ratios where measured.
fn window_tiles(o: &mut String, t: &TreeSnapshot, d: &ethand_snapshot::gpu::GpuDerived) {
    match d.launches_per_second {
        Some(r) => tile(
            o,
            "Launch rate",
            &format!("{} /s", number(r)),
            &format!("last {}", duration_ns_u(d.window_ms * 1_000_000)),
        ),
        None => tile(
            o,
            "Launch rate",
            &format!("<span class=\"na\">{}</span>", launches_not_measured(t)),
            &match t.launch_sample.as_ref().and_then(|l| l.launches_per_second) {
                Some(r) => format!("sampled: {} /s (below)", number(r)),
                None => "counted at level process or op".into(),
            },
        ),
    }
    tile(
        o,
        "Sync rate",
        &format!("{} /s", number(d.syncs_per_second)),
        &format!("last {}", duration_ns_u(d.window_ms * 1_000_000)),
    );
    tile(
        o,
        "Sync-blocked share",
        &percent(d.sync_blocked_ratio),
        "of wall time (summed over threads)",
    );
    tile(
        o,
        "Collective share",
        &percent(d.collective_ratio),
        "of wall time",
    );
    if let Some(u) = d.device_utilization_ratio {
        tile(
            o,
            "Device busy",
            &percent(u),
            &d.device_idle_ratio
                .map_or(String::new(), |i| format!("idle {}", percent(i))),
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
            tile(o, label, &percent(v), sub);
        }
    }
}

/// Copies by direction beside memory by kind.
fn copies_and_memory(o: &mut String, g: &GpuProcessStats) {
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
                bytes_u(c.bytes)
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
                bytes_u(m.live_bytes),
                bytes_u(m.peak_bytes)
            );
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("</div></div>");
}

/// Collective operations by library, with their host time.
fn collectives(o: &mut String, g: &GpuProcessStats) {
    if !g.collectives.is_empty() {
        o.push_str("<h3>Collectives</h3><table><thead><tr><th class=\"l\">Library</th><th class=\"l\">Operation</th><th>Calls</th><th>Bytes</th><th>Host time</th><th>Avg per call</th></tr></thead><tbody>");
        for c in &g.collectives {
            let avg = c
                .time_ns
                .checked_div(c.timed_calls)
                .map_or_else(|| "–".to_string(), duration_ns_u);
            w!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&c.library),
                escape(&c.operation.replace('_', " ")),
                count(c.calls),
                bytes_u(c.bytes),
                duration_ns_u(c.time_ns),
                avg
            );
        }
        o.push_str("</tbody></table>");
    }
}

/// The communicator rank of each process that has one.
fn ranks(o: &mut String, t: &TreeSnapshot) {
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
}

/// The launches counted on demand for this snapshot (GPU level `calls`).
pub(super) fn launch_sample(o: &mut String, l: &LaunchSample) {
    let over = duration_ns_u(l.duration_ms * 1_000_000);
    o.push_str("<div class=\"note sample\"><b>Launch sample:</b> ");
    match (l.launches_per_second, l.launches) {
        (Some(r), n) => w!(
            o,
            "{} launches/s, counted on demand over {over} for this snapshot{}.",
            number(r),
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
pub(super) fn bar(frac: f64) -> String {
    let f = if frac.is_finite() {
        frac.clamp(0.0, 100.0)
    } else {
        0.0
    };
    format!("background:linear-gradient(90deg,#dbeafe {f:.1}%,transparent {f:.1}%)")
}

pub(super) fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "<span class=\"na\">–</span>".to_string(), f)
}

pub(super) fn devices(o: &mut String, d: &DevicesSnapshot, t: &TreeSnapshot) {
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
                opt(g.utilization_ratio, percent),
                opt(g.memory_utilization_ratio, percent),
                opt(g.memory_used_bytes, bytes_u),
                opt(g.memory_total_bytes, bytes_u),
                opt(g.power_watts, |w| format!("{w:.0} W")),
                opt(g.temperature_celsius, |c| format!("{c} °C")),
                opt(g.sm_clock_hertz, |h| format!("{} MHz", h / 1_000_000)),
                opt(g.pcie_rx_bytes_per_second, |b| format!("{}/s", bytes_u(b))),
                opt(g.pcie_tx_bytes_per_second, |b| format!("{}/s", bytes_u(b))),
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
                opt(n.aicore_utilization_ratio, percent),
                opt(n.hbm_used_bytes, bytes_u),
                opt(n.hbm_total_bytes, bytes_u),
                opt(n.hbm_bandwidth_utilization_ratio, percent),
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
                opt(p.memory_used_bytes, bytes_u),
                opt(p.utilization_ratio, percent)
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
