//! Terminal output of `ethand status` and `ethand snapshot`.
use std::fmt::Write as _;

use ethand_snapshot::{ProcessSnapshot, SelfStatus, TreeSnapshot};

fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Printable form of a name that may hold control characters or characters that hide or
/// reorder text (`ethand_exporters::text`).
pub fn clean(s: &str) -> String {
    ethand_exporters::text::for_terminal(s)
}

pub fn status(s: &SelfStatus) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "ethand {} (pid {}), cpu {:.2}s, rss {}",
        s.version,
        s.pid,
        s.cpu_seconds,
        bytes(s.rss_bytes)
    );
    let _ = writeln!(
        o,
        "tracked processes: {} (overflow {})",
        s.tracked_processes, s.processes_overflow
    );
    if !s.socket_access.is_empty() {
        let _ = writeln!(o, "local API socket: {}", s.socket_access);
    }
    if !s.user.is_empty() {
        let _ = writeln!(o, "runs as: {}", s.user);
    }
    if !s.capabilities.is_empty() {
        let _ = writeln!(o, "capabilities kept: {}", s.capabilities.join(" "));
    }
    for c in &s.servers {
        let _ = writeln!(
            o,
            "{} connections: {} open (at most {}, {} per peer); refused {} at the server's cap, {} at a peer's; {} timed out; {} accept errors",
            if c.server == "metrics" {
                "/metrics"
            } else {
                "local API"
            },
            c.open,
            c.max,
            c.max_per_peer,
            c.refused_limit,
            c.refused_peer_limit,
            c.timed_out,
            c.accept_errors
        );
    }
    let _ = writeln!(
        o,
        "\nPROBE                 STATE        ATTACHED TO                         DETAIL"
    );
    for p in &s.probes {
        let _ = writeln!(
            o,
            "{:<21} {:<12} {:<35} {}",
            p.name,
            p.state.as_str(),
            p.attach_point,
            p.detail
        );
    }
    let _ = writeln!(o, "\nGPU/NPU level: {}", s.gpu_level);
    for l in &s.gpu_libraries {
        let _ = writeln!(
            o,
            "  {:<9} {:<9} {} (dev {} inode {}, first seen in pid {}): {}",
            l.runtime,
            l.state.as_str(),
            l.path,
            l.dev,
            l.inode,
            l.found_in_pid,
            l.detail
        );
        if !l.symbols_missing.is_empty() {
            let _ = writeln!(
                o,
                "            not probed: {}",
                l.symbols_missing.join(", ")
            );
        }
    }
    let _ = writeln!(o, "\nMAP            ENTRIES   CAPACITY  FILL");
    for m in &s.maps {
        let fill = if m.capacity > 0 {
            100.0 * m.entries as f64 / m.capacity as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "{:<14} {:>8} {:>10} {:>5.1}%",
            m.name, m.entries, m.capacity, fill
        );
    }
    let _ = writeln!(
        o,
        "\nPROGRAM COST (BPF stats {}, counted during {:.1}s)\nPROGRAM                  RUNS        TOTAL      AVG/RUN",
        s.bpf_stats,
        s.bpf_stats_enabled_ms as f64 / 1000.0
    );
    for p in &s.programs {
        let avg = p.run_time_ns.checked_div(p.run_count).unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<22} {:>10} {:>12} {:>9} ns",
            p.name,
            p.run_count,
            secs(p.run_time_ns),
            avg
        );
    }
    let _ = writeln!(o, "\nDROPPED / UNMATCHED EVENTS");
    for d in &s.dropped {
        let _ = writeln!(
            o,
            "{:<26} {:>10}{}",
            d.reason,
            d.count,
            if d.loss { "" } else { "  (informational)" }
        );
    }
    // Library paths and probe details come from other users' files: nothing raw.
    ethand_exporters::text::for_terminal_keep_lines(&o)
}

/// Bytes per second over `secs`.
fn rate_bytes(b: u64, secs: f64) -> String {
    format!("{}/s", bytes((b as f64 / secs) as u64))
}

/// What a live process's threads are doing now: "running", "2 running, 3 blocked", or the
/// longest wait when all are blocked ("blocked in read() on pipe:[1] for 15.2 s").
fn threads_now(p: &ProcessSnapshot) -> String {
    let live: Vec<_> = p
        .threads
        .iter()
        .filter(|t| t.alive)
        .filter_map(|t| t.now.as_ref())
        .collect();
    if live.is_empty() {
        return String::new();
    }
    let running = live.iter().filter(|n| n.state == "running").count();
    let longest = live
        .iter()
        .filter_map(|n| n.syscall.as_ref())
        .filter_map(|s| Some((s.blocked_ns()?, s)))
        .max_by_key(|(ns, _)| *ns);
    let waiting = live.len() - running;
    let mut out = match (running, waiting) {
        (r, 0) => format!("{r} running"),
        (0, w) => format!("{w} waiting"),
        (r, w) => format!("{r} running, {w} waiting"),
    };
    if let Some((ns, sc)) = longest {
        let _ = write!(
            out,
            " (longest: {} for {}{:.1} s)",
            clean(&sc.describe()),
            if sc.elapsed_ns.is_none() {
                "at least "
            } else {
                ""
            },
            ns as f64 / 1e9
        );
    }
    out
}

/// One process's line of the "now" table: its rates over its window.
fn now_line(o: &mut String, p: &ProcessSnapshot, depth: usize) {
    let state = if p.alive {
        threads_now(p)
    } else {
        "exited".to_string()
    };
    match p.window.as_ref().filter(|w| w.duration_ms > 0) {
        Some(w) => {
            let secs = w.duration_ms as f64 / 1000.0;
            let _ = writeln!(
                o,
                "{:indent$}{:<7} {:<16} cores {:>5.2}  runq {:>5.2} s/s  syscalls {:>8.0}/s  {}",
                "",
                p.pid,
                clean(&p.comm),
                w.oncpu_ns as f64 / 1e9 / secs,
                w.runq_wait_ns as f64 / 1e9 / secs,
                w.syscalls as f64 / secs,
                state,
                indent = depth * 2
            );
        }
        None => {
            let _ = writeln!(
                o,
                "{:indent$}{:<7} {:<16} (no window)  {}",
                "",
                p.pid,
                clean(&p.comm),
                state,
                indent = depth * 2
            );
        }
    }
}

/// The tree's rates over the window, first thing in the snapshot.
fn now_section(o: &mut String, t: &TreeSnapshot) {
    let Some(w) = ethand_exporters::report::tree_window(t) else {
        let _ = writeln!(
            o,
            "NOW: no window yet (the daemon has not collected two rounds of these processes)\n"
        );
        return;
    };
    let secs = w.duration_ms as f64 / 1000.0;
    let _ = writeln!(o, "NOW (last {secs:.1} s)");
    let _ = writeln!(
        o,
        "  cpu {:.2} cores, run-queue wait {:.2} s/s, blocked {:.2} s/s",
        w.oncpu_ns as f64 / 1e9 / secs,
        w.runq_wait_ns as f64 / 1e9 / secs,
        w.offcpu_blocked_ns as f64 / 1e9 / secs
    );
    let _ = writeln!(
        o,
        "  syscalls {:.0}/s ({:.3} s/s in them); disk read {}, write {}; network sent {}, received {}",
        w.syscalls as f64 / secs,
        w.syscall_time_ns as f64 / 1e9 / secs,
        rate_bytes(w.block_read_bytes, secs),
        rate_bytes(w.block_write_bytes, secs),
        rate_bytes(w.net_tx_bytes, secs),
        rate_bytes(w.net_rx_bytes, secs)
    );
    if t.total.gpu.is_some() {
        let launches = match w.gpu_launches {
            Some(n) => format!("{:.0}/s", n as f64 / secs),
            None => match t.launch_sample.as_ref().and_then(|l| l.launches_per_second) {
                Some(r) => format!("{r:.0}/s (sampled)"),
                None => "not counted".to_string(),
            },
        };
        let _ = writeln!(
            o,
            "  GPU: launches {launches}, syncs {:.0}/s blocking {:.2} s/s, copies H2D {} D2H {}, collectives {:.2} s/s",
            w.gpu_sync_calls as f64 / secs,
            w.gpu_sync_ns as f64 / 1e9 / secs,
            rate_bytes(w.gpu_copy_h2d_bytes, secs),
            rate_bytes(w.gpu_copy_d2h_bytes, secs),
            w.collective_ns as f64 / 1e9 / secs
        );
    }
    let root = &t.processes[0];
    for p in &t.processes {
        now_line(o, p, usize::from(p.pid != root.pid));
    }
    o.push('\n');
}

fn proc_line(o: &mut String, p: &ProcessSnapshot, depth: usize) {
    let s = &p.sched;
    let _ = writeln!(
        o,
        "{:indent$}{:<7} {:<16} {}  cpu {:>9}  blocked {:>9}  preempted {:>9}  runq {:>9}  switches {}/{}  syscalls {} ({} err, {})",
        "",
        p.pid,
        clean(&p.comm),
        if p.alive { "    " } else { "exit" },
        secs(s.oncpu_ns),
        secs(s.offcpu_blocked_ns),
        secs(s.offcpu_preempted_ns),
        secs(s.runq_wait_ns),
        s.voluntary_switches,
        s.involuntary_switches,
        p.syscalls.count,
        p.syscalls.errors,
        secs(p.syscalls.time_ns),
        indent = depth * 2
    );
}

pub fn snapshot(t: &TreeSnapshot) -> String {
    let mut o = String::new();
    let root = &t.processes[0];
    let what = if t.source == "daemon" {
        "now, then totals since ethand first saw each process".to_string()
    } else {
        format!(
            "measured for {:.1}s by a standalone ethand (no daemon running)",
            t.measured_ms as f64 / 1000.0
        )
    };
    let _ = writeln!(
        o,
        "process tree of {} ({}) — {}",
        root.pid,
        clean(&root.comm),
        what
    );
    let _ = writeln!(
        o,
        "cmdline: {}{}",
        clean(&root.cmdline.join(" ")),
        if root.cmdline_truncated {
            " [truncated at 4 KiB]"
        } else {
            ""
        }
    );
    let _ = writeln!(o, "cgroup: {}", clean(&root.cgroup));
    if let Some(w) = &root.workload {
        let _ = writeln!(o, "workload: {}", clean(&crate::attribution::describe(w)));
    }
    o.push('\n');
    if !t.dropped_events.is_empty() {
        let total: u64 = t.dropped_events.iter().map(|d| d.count).sum();
        let why: Vec<String> = t
            .dropped_events
            .iter()
            .map(|d| format!("{} {}", d.reason, d.count))
            .collect();
        let _ = writeln!(
            o,
            "WARNING: {total} events were lost node-wide while these figures were taken ({}): \
             some may have been this tree's, so its counts may be low. `ethand status` shows \
             which maps are full; raise their [maps] sizes (or daemon.max_processes).\n",
            why.join(", ")
        );
    }
    now_section(&mut o, t);
    findings(&mut o, &t.findings, &t.not_evaluated);
    let _ = writeln!(
        o,
        "LIFETIME ({})",
        if t.source == "daemon" {
            "since ethand first saw each process"
        } else {
            "over the measurement"
        }
    );
    for p in &t.processes {
        proc_line(&mut o, p, usize::from(p.pid != root.pid));
    }
    let tt = &t.total;
    let _ = writeln!(
        o,
        "\nTOTAL {} processes, {} threads: cpu {}, off-cpu blocked {}, preempted {}, run-queue wait {}",
        tt.processes,
        tt.threads,
        secs(tt.sched.oncpu_ns),
        secs(tt.sched.offcpu_blocked_ns),
        secs(tt.sched.offcpu_preempted_ns),
        secs(tt.sched.runq_wait_ns)
    );
    let _ = writeln!(
        o,
        "syscalls {} ({} errors) taking {}",
        tt.syscalls,
        tt.syscall_errors,
        secs(tt.syscall_time_ns)
    );
    let _ = writeln!(
        o,
        "disk: read {} in {} ops, written {} in {} ops",
        bytes(tt.block_read_bytes),
        tt.block_read_ops,
        bytes(tt.block_write_bytes),
        tt.block_write_ops
    );
    let n = &tt.net;
    let _ = writeln!(
        o,
        "network: tcp sent {} received {}, udp sent {} received {}, retransmits {}, connects {}, closes {}, resets {}/{}",
        bytes(n.tcp_tx_bytes),
        bytes(n.tcp_rx_bytes),
        bytes(n.udp_tx_bytes),
        bytes(n.udp_rx_bytes),
        n.tcp_retransmits,
        n.tcp_active_opens,
        n.tcp_closes,
        n.tcp_resets_sent,
        n.tcp_resets_received
    );
    if let Some(g) = &tt.gpu {
        gpu_section(
            &mut o,
            g,
            tt.gpu_derived.as_ref(),
            &t.processes,
            t.gpu_level.as_deref(),
            t.launch_sample.as_ref(),
        );
    } else if let Some(l) = &t.launch_sample {
        let _ = writeln!(o, "\nGPU / NPU RUNTIME (uprobes)");
        launch_sample(&mut o, l);
    }
    let mut rows: Vec<_> = t
        .processes
        .iter()
        .flat_map(|p| p.syscalls.by_nr.iter().map(move |r| (p.pid, r)))
        .collect();
    rows.sort_by_key(|a| std::cmp::Reverse(a.1.time_ns));
    let _ = writeln!(
        o,
        "\nTOP SYSCALLS BY TIME\n  PID     SYSCALL              COUNT     ERRORS        TIME"
    );
    for (pid, r) in rows.iter().take(10) {
        let _ = writeln!(
            o,
            "  {:<7} {:<18} {:>9} {:>10} {:>11}",
            pid,
            r.name,
            r.count,
            r.errors,
            secs(r.time_ns)
        );
    }
    let mut threads: Vec<_> = t
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |th| (p.pid, th)))
        .collect();
    threads.sort_by_key(|a| std::cmp::Reverse(a.1.sched.oncpu_ns));
    let _ = writeln!(
        o,
        "\nTOP THREADS BY CPU\n  PID     TID     COMM                   CPU        RUNQ"
    );
    for (pid, th) in threads.iter().take(8) {
        let _ = writeln!(
            o,
            "  {:<7} {:<7} {:<16} {:>11} {:>11}",
            pid,
            th.tid,
            clean(&th.comm),
            secs(th.sched.oncpu_ns),
            secs(th.sched.runq_wait_ns)
        );
    }
    // Every value above that a process chose went through `clean`; this catches any that
    // did not (finding evidence, device names), so nothing reaches the terminal raw.
    ethand_exporters::text::for_terminal_keep_lines(&o)
}

fn gpu_section(
    o: &mut String,
    g: &ethand_snapshot::gpu::GpuProcessStats,
    d: Option<&ethand_snapshot::gpu::GpuDerived>,
    procs: &[ethand_snapshot::ProcessSnapshot],
    level: Option<&str>,
    sample: Option<&ethand_snapshot::gpu::LaunchSample>,
) {
    let _ = writeln!(o, "\nGPU / NPU RUNTIME (uprobes)");
    match g.launches {
        None => {
            let at = level.map_or_else(
                || "the GPU level in force".to_string(),
                |l| format!("level {}", clean(l)),
            );
            let _ = writeln!(
                o,
                "  launches and device-to-device async copies not counted at {at} (`ethand level process` counts them, at a cost per call), api errors {}",
                g.errors
            );
        }
        Some(n) => {
            let graph = g
                .graph_launches
                .map_or_else(|| "not counted".to_string(), |n| n.to_string());
            let _ = writeln!(
                o,
                "  launches {n} (graph launches {graph}), api errors {}",
                g.errors
            );
        }
    }
    if let Some(d) = d {
        let util = match (d.device_utilization_ratio, d.device_idle_ratio) {
            (Some(u), Some(i)) => format!(", device busy {:.0}% idle {:.0}%", 100.0 * u, 100.0 * i),
            _ => String::new(),
        };
        let launches = d
            .launches_per_second
            .map(|r| format!(" {r:.0} launches/s,"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  last {:.0}s:{launches} {:.1} syncs/s, host blocked in sync {:.1}% of wall time, in collectives {:.1}%{}",
            d.window_ms as f64 / 1000.0,
            d.syncs_per_second,
            100.0 * d.sync_blocked_ratio,
            100.0 * d.collective_ratio,
            util
        );
        // NVML GPM (Hopper and newer): only the ratios that were measured.
        let gpm: Vec<String> = [
            ("SM activity", d.sm_activity_ratio),
            ("SM occupancy", d.sm_occupancy_ratio),
            ("tensor activity", d.tensor_activity_ratio),
            ("DRAM bandwidth", d.dram_bandwidth_ratio),
        ]
        .into_iter()
        .filter_map(|(what, v)| Some(format!("{what} {:.0}%", 100.0 * v?)))
        .collect();
        if !gpm.is_empty() {
            let _ = writeln!(o, "  GPU (GPM, window mean): {}", gpm.join(", "));
        }
    }
    if let Some(l) = sample {
        launch_sample(o, l);
    }
    for c in &g.copies {
        let _ = writeln!(
            o,
            "  copy {:<17} {:>9} calls {:>11}",
            c.direction,
            c.calls,
            bytes(c.bytes)
        );
    }
    if g.sync.calls > 0 {
        let _ = writeln!(
            o,
            "  sync {:>9} calls, host blocked {}",
            g.sync.calls,
            secs(g.sync.time_ns)
        );
    }
    for m in &g.memory {
        let _ = writeln!(
            o,
            "  memory {:<15} live {:>11} peak {:>11} ({} allocs, {} frees)",
            m.kind,
            bytes(m.live_bytes),
            bytes(m.peak_bytes),
            m.allocs,
            m.frees
        );
    }
    if g.untracked_frees > 0 {
        let _ = writeln!(
            o,
            "  {} frees of memory allocated before ethand attached",
            g.untracked_frees
        );
    }
    for c in &g.collectives {
        let _ = writeln!(
            o,
            "  {} {:<15} {:>9} calls {:>11} host {}",
            c.library,
            c.operation,
            c.calls,
            bytes(c.bytes),
            secs(c.time_ns)
        );
    }
    for p in procs {
        if let Some(c) = p.gpu.as_ref().and_then(|g| g.comm.as_ref()) {
            let rank = c.rank.map_or("all".to_string(), |r| r.to_string());
            let _ = writeln!(
                o,
                "  pid {} {} rank {} of {}",
                p.pid, c.library, rank, c.nranks
            );
        }
        for dev in &p.devices {
            let util = dev
                .utilization_ratio
                .map(|u| format!(", sm {:.0}%", 100.0 * u))
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "  pid {} on {}: {} device memory{}",
                p.pid,
                dev.device,
                bytes(dev.memory_used_bytes),
                util
            );
        }
    }
    let mut syms: Vec<_> = g.symbols.iter().collect();
    syms.sort_by_key(|a| std::cmp::Reverse(a.calls));
    let _ = writeln!(
        o,
        "  TOP SYMBOLS                         CALLS       BYTES    HOST TIME"
    );
    for s in syms.iter().take(8) {
        let t = if s.timed_calls > 0 {
            secs(s.time_ns)
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "  {:<32} {:>9} {:>11} {:>12}",
            s.symbol,
            s.calls,
            bytes(s.bytes),
            t
        );
    }
}

/// The launches counted on demand for this snapshot (GPU level `calls`).
fn launch_sample(o: &mut String, l: &ethand_snapshot::gpu::LaunchSample) {
    let over = l.duration_ms as f64 / 1000.0;
    let counted = match (l.launches_per_second, l.launches) {
        (Some(r), _) => {
            format!("{r:.0} launches/s, counted on demand over {over:.1}s for this snapshot")
        }
        (None, Some(n)) => {
            format!("{n} launches, counted on demand over {over:.1}s for this snapshot")
        }
        (None, None) => format!("no process of the tree could be sampled (tried over {over:.1}s)"),
    };
    let _ = writeln!(o, "  launch sample: {counted}");
    if !l.method.is_empty() {
        let _ = writeln!(o, "    how: {}", clean(&l.method));
    }
    for p in &l.processes {
        let _ = writeln!(o, "    pid {}: {} launches", p.pid, p.launches);
    }
    for n in &l.notes {
        let _ = writeln!(o, "    {}", clean(n));
    }
}

/// The diagnosis part of a snapshot alone (`ethand diagnose FILE`).
pub fn diagnosis(t: &TreeSnapshot) -> String {
    let mut o = String::new();
    findings(&mut o, &t.findings, &t.not_evaluated);
    // Rule text may come from a file: nothing raw reaches the terminal.
    ethand_exporters::text::for_terminal_keep_lines(&o)
}

fn findings(
    o: &mut String,
    f: &[ethand_snapshot::diagnosis::Finding],
    not_run: &[ethand_snapshot::diagnosis::NotEvaluated],
) {
    if f.is_empty() && not_run.is_empty() {
        let _ = writeln!(o, "DIAGNOSIS: no bottleneck found by the rules\n");
        return;
    }
    if f.is_empty() {
        // Not a clean bill of health: some rules could not look.
        let _ = writeln!(
            o,
            "DIAGNOSIS: no finding among the rules that could run; {} could not (below)",
            not_run.len()
        );
        not_evaluated(o, not_run);
        return;
    }
    let _ = writeln!(
        o,
        "DIAGNOSIS ({} finding{}, highest impact first)",
        f.len(),
        if f.len() == 1 { "" } else { "s" }
    );
    for (i, x) in f.iter().enumerate() {
        let gain = x
            .estimated_speedup
            .map(|s| format!(" — up to ~{s:.1}x if fixed"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "{}. [{}] {}{}",
            i + 1,
            clean(&x.severity),
            clean(&x.title),
            gain
        );
        let ev: Vec<String> = x
            .evidence
            .iter()
            .map(|e| format!("{} = {}", clean(&e.signal), evidence_value(e)))
            .collect();
        if !ev.is_empty() {
            let _ = writeln!(o, "   evidence: {}", ev.join(", "));
        }
        for d in &x.detail {
            let _ = writeln!(o, "   where: {}", clean(d));
        }
        let _ = writeln!(o, "   why: {}", clean(&x.explanation));
        for a in &x.advice {
            let _ = writeln!(o, "   - {}", clean(a));
        }
    }
    if not_run.is_empty() {
        let _ = writeln!(o);
    } else {
        let _ = writeln!(
            o,
            "NOT EVALUATED ({} rule{} could not run: a signal was not measured)",
            not_run.len(),
            if not_run.len() == 1 { "" } else { "s" }
        );
        not_evaluated(o, not_run);
    }
}

/// The rules that could not run, each with the signals it lacks and how to get them.
fn not_evaluated(o: &mut String, n: &[ethand_snapshot::diagnosis::NotEvaluated]) {
    for x in n {
        let missing: Vec<String> = x.missing.iter().map(|m| clean(m)).collect();
        let _ = writeln!(
            o,
            "Could not run: {} ({}): missing {}; {}",
            clean(&x.rule),
            clean(&x.title),
            if missing.is_empty() {
                "(not stated)".to_string()
            } else {
                missing.join(", ")
            },
            clean(&x.how)
        );
    }
    let _ = writeln!(o);
}

fn evidence_value(e: &ethand_snapshot::diagnosis::Evidence) -> String {
    match e.unit.as_str() {
        "ratio" => format!("{:.0}%", 100.0 * e.value),
        "bytes" => bytes(e.value as u64),
        "per_second" => format!("{:.1}/s", e.value),
        "seconds" => format!("{:.3}s", e.value),
        _ => {
            if e.value.fract() == 0.0 {
                format!("{}", e.value as i64)
            } else {
                format!("{:.2}", e.value)
            }
        }
    }
}

/// One progress line on stderr ("measuring pid 42: 3/10 s"), rewritten in place and cleared
/// on drop; nothing at all when stderr is not a terminal (a file, a pipe, the journal).
pub struct Progress {
    label: String,
    total_s: u64,
    shown_s: Option<u64>,
    on: bool,
}

/// Back to the start of the line, and the line erased.
const CLEAR_LINE: &str = "\r\x1b[K";

impl Progress {
    pub fn new(label: String, total: std::time::Duration) -> Self {
        use std::io::IsTerminal as _;
        Self {
            label,
            total_s: total.as_secs(),
            shown_s: None,
            on: std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&mut self, elapsed: std::time::Duration) {
        if let Some(line) = self.on.then(|| self.update(elapsed)).flatten() {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }

    /// What to write for `elapsed`: None when the shown second has not changed.
    fn update(&mut self, elapsed: std::time::Duration) -> Option<String> {
        let s = elapsed.as_secs().min(self.total_s);
        if self.shown_s == Some(s) {
            return None;
        }
        self.shown_s = Some(s);
        Some(format!(
            "{CLEAR_LINE}{}: {s}/{} s",
            self.label, self.total_s
        ))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.on && self.shown_s.is_some() {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), CLEAR_LINE.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_snapshot::DropCounter;

    #[test]
    fn progress_line_is_rewritten_once_per_second() {
        let mut p = Progress {
            label: "measuring pid 42".into(),
            total_s: 3,
            shown_s: None,
            on: false,
        };
        let ms = std::time::Duration::from_millis;
        let lines: Vec<Option<String>> = [250, 900, 1000, 2600, 3100, 3500]
            .into_iter()
            .map(|t| p.update(ms(t)))
            .collect();
        let want = |s: &str| Some(format!("\r\x1b[Kmeasuring pid 42: {s} s"));
        assert_eq!(
            lines,
            [
                want("0/3"),
                None,
                want("1/3"),
                want("2/3"),
                want("3/3"),
                None
            ]
        );
    }

    fn fixture(name: &str) -> serde_json::Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/gpu-h200")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("JSON")
    }

    /// Real snapshots of an H200 (tests/fixtures/gpu-h200) on the terminal: the GPU section,
    /// no raw control or hidden character, and the loss warning when there were losses.
    #[test]
    fn real_h200_snapshots_on_the_terminal() {
        let v = fixture("gpu-check-snapshots.json");
        for (label, pair) in v.as_object().expect("object") {
            let mut t: TreeSnapshot = serde_json::from_value(pair["after"].clone()).expect("tree");
            let out = snapshot(&t);
            assert!(
                out.contains(&format!("process tree of {}", t.root_pid)),
                "{label}"
            );
            assert!(
                !out.chars()
                    .any(|c| c != '\n' && ethand_exporters::text::needs_escape(c)),
                "{label}: raw control or hidden characters"
            );
            assert!(
                !out.contains("WARNING"),
                "{label}: a warning without losses"
            );
            t.dropped_events = vec![DropCounter {
                reason: "threads_full".into(),
                count: 12,
                loss: true,
            }];
            let warned = snapshot(&t);
            assert!(
                warned.contains("WARNING: 12 events were lost node-wide")
                    && warned.contains("threads_full 12"),
                "{label}: {warned}"
            );
        }
        let s: SelfStatus =
            serde_json::from_value(fixture("status-after-workloads.json")).expect("status");
        let out = status(&s);
        assert!(out.contains("CAP_PERFMON"), "{out}");
        assert!(out.contains("runs as: ethand (uid "), "{out}");
        assert!(out.contains("/metrics connections: "), "{out}");
    }

    #[test]
    fn a_cut_command_line_says_so() {
        let v = fixture("gpu-check-snapshots.json");
        let mut t: TreeSnapshot = serde_json::from_value(v["cupy"]["after"].clone()).expect("tree");
        t.processes[0].cmdline = vec!["python3".into(), "x".repeat(4000)];
        t.processes[0].cmdline_truncated = true;
        assert!(snapshot(&t).contains(" [truncated at 4 KiB]\n"));
    }

    /// A GPU tree whose figures were taken at level `calls`: launches not counted.
    fn tree_at_calls() -> TreeSnapshot {
        use ethand_snapshot::gpu::{GpuDerived, GpuProcessStats, GpuTimedCalls};
        let g = GpuProcessStats {
            launches: None,
            sync: GpuTimedCalls {
                calls: 40,
                time_ns: 1_000_000_000,
                timed_calls: 40,
            },
            ..Default::default()
        };
        TreeSnapshot {
            source: "daemon".into(),
            root_pid: 10,
            processes: vec![ProcessSnapshot {
                pid: 10,
                comm: "train".into(),
                alive: true,
                gpu: Some(g.clone()),
                ..Default::default()
            }],
            total: ethand_snapshot::TreeTotals {
                processes: 1,
                gpu: Some(g),
                gpu_derived: Some(GpuDerived {
                    window_ms: 5000,
                    syncs_per_second: 8.0,
                    sync_blocked_ratio: 0.2,
                    ..Default::default()
                }),
                ..Default::default()
            },
            gpu_level: Some("calls".into()),
            ..Default::default()
        }
    }

    fn not_evaluated() -> Vec<ethand_snapshot::diagnosis::NotEvaluated> {
        vec![
            ethand_snapshot::diagnosis::NotEvaluated {
                rule: "launch_bound".into(),
                title: "Kernel launch overhead".into(),
                missing: vec!["gpu.launches_per_second".into()],
                how: "count launches: `ethand level process`".into(),
            },
            ethand_snapshot::diagnosis::NotEvaluated {
                rule: "gpm\u{1b}[31m".into(),
                title: "Low SM \u{202e}activity".into(),
                missing: vec![
                    "gpu.sm_activity_ratio".into(),
                    "gpu.dram_bandwidth_ratio".into(),
                ],
                how: "a GPU with GPM (Hopper or newer)".into(),
            },
        ]
    }

    /// Launches are "not counted at level calls" only when not counted (never a 0); the
    /// launch sample, the sync rate and the GPM ratios that were measured are printed.
    #[test]
    fn launches_not_counted_and_the_launch_sample() {
        use ethand_snapshot::gpu::{LaunchSample, LaunchSampleProcess};
        let mut t = tree_at_calls();
        let out = snapshot(&t);
        assert!(
            out.contains("launches and device-to-device async copies not counted at level calls"),
            "{out}"
        );
        assert!(!out.contains("launches 0"), "{out}");
        assert!(!out.contains("launches/s"), "{out}");
        assert!(out.contains("8.0 syncs/s"), "{out}");
        assert!(!out.contains("GPM"), "no GPM ratio measured: {out}");
        assert!(!out.contains("launch sample"), "{out}");

        t.launch_sample = Some(LaunchSample {
            method: "uprobes on cuLaunchKernel*\u{1b}[2J".into(),
            duration_ms: 2000,
            launches: Some(2468),
            launches_per_second: Some(1234.0),
            processes: vec![LaunchSampleProcess {
                pid: 10,
                launches: 2468,
            }],
            notes: vec!["pid 11: no runtime library mapped".into()],
            ..Default::default()
        });
        if let Some(d) = t.total.gpu_derived.as_mut() {
            d.sm_activity_ratio = Some(0.75);
            d.dram_bandwidth_ratio = Some(0.125);
        }
        let out = snapshot(&t);
        assert!(
            out.contains(
                "  launch sample: 1234 launches/s, counted on demand over 2.0s for this snapshot\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("    how: uprobes on cuLaunchKernel*\\u{1b}[2J\n"),
            "{out}"
        );
        assert!(out.contains("    pid 10: 2468 launches\n"), "{out}");
        assert!(
            out.contains("    pid 11: no runtime library mapped\n"),
            "{out}"
        );
        assert!(
            out.contains("  GPU (GPM, window mean): SM activity 75%, DRAM bandwidth 12%\n"),
            "{out}"
        );
        assert!(!out.contains('\u{1b}'), "raw escape: {out}");

        // Counted (level process): a 0 is a 0.
        let mut t = tree_at_calls();
        t.gpu_level = Some("process".into());
        for g in [&mut t.processes[0].gpu, &mut t.total.gpu] {
            let g = g.as_mut().unwrap();
            g.launches = Some(0);
            g.graph_launches = Some(0);
        }
        t.total.gpu_derived.as_mut().unwrap().launches_per_second = Some(0.0);
        let out = snapshot(&t);
        assert!(
            out.contains("  launches 0 (graph launches 0), api errors 0"),
            "{out}"
        );
        assert!(out.contains("last 5s: 0 launches/s, 8.0 syncs/s"), "{out}");
        assert!(!out.contains("not counted"), "{out}");
    }

    /// Rules that could not run: never "no bottleneck found", and each is listed with what it
    /// lacks and how to get it, escaped.
    #[test]
    fn rules_that_could_not_run_are_not_a_clean_bill() {
        let mut t = tree_at_calls();
        assert!(snapshot(&t).contains("DIAGNOSIS: no bottleneck found by the rules\n"));
        t.not_evaluated = not_evaluated();
        for out in [snapshot(&t), diagnosis(&t)] {
            assert!(!out.contains("no bottleneck found"), "{out}");
            assert!(
                out.contains(
                    "DIAGNOSIS: no finding among the rules that could run; 2 could not (below)\n"
                ),
                "{out}"
            );
            assert!(
                out.contains(
                    "Could not run: launch_bound (Kernel launch overhead): missing gpu.launches_per_second; count launches: `ethand level process`\n"
                ),
                "{out}"
            );
            assert!(
                out.contains(
                    "Could not run: gpm\\u{1b}[31m (Low SM \\u{202e}activity): missing gpu.sm_activity_ratio, gpu.dram_bandwidth_ratio; a GPU with GPM (Hopper or newer)\n"
                ),
                "{out}"
            );
            assert!(
                !out.contains('\u{1b}') && !out.contains('\u{202e}'),
                "raw control or hidden characters: {out}"
            );
        }

        // With findings: the findings, then the rules that could not run.
        t.findings = vec![ethand_snapshot::diagnosis::Finding {
            id: "sync_heavy".into(),
            title: "Synchronization heavy".into(),
            severity: "warning".into(),
            explanation: "The host waits.".into(),
            ..Default::default()
        }];
        t.not_evaluated.truncate(1);
        let out = diagnosis(&t);
        assert!(
            out.starts_with("DIAGNOSIS (1 finding, highest impact first)\n"),
            "{out}"
        );
        let f = out
            .find("1. [warning] Synchronization heavy")
            .expect("finding");
        let n = out
            .find("NOT EVALUATED (1 rule could not run: a signal was not measured)\nCould not run: launch_bound")
            .expect("not evaluated section");
        assert!(f < n, "{out}");
    }
}
