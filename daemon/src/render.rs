//! Terminal output of `ethand status` and `ethand snapshot`.
use std::fmt::Write as _;

use ethand_exporters::format::{bytes_per_second, bytes_u, in_unit, seconds_fixed};
use ethand_snapshot::{ProcessSnapshot, SelfStatus, TreeSnapshot};

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
        bytes_u(s.rss_bytes)
    );
    let _ = writeln!(
        o,
        "tracked processes: {} (overflow {})",
        s.tracked_processes, s.processes_overflow
    );
    if let Some(age) = s.last_round_age_ms {
        let _ = writeln!(
            o,
            "last collection round: {} ago{}",
            ethand_exporters::format::duration_ns_u(age.saturating_mul(1_000_000)),
            if age > 10 * 1000 {
                " (STALE: the collection loop is behind or stopped)"
            } else {
                ""
            }
        );
    }
    if let Some(r) = &s.reader {
        match (&r.pid, &r.unavailable) {
            (Some(pid), _) => {
                let _ = writeln!(
                    o,
                    "reader: pid {pid}; {} workers started, {} refused (busy), {} late, {} ended by a limit or fault",
                    r.sessions, r.refused, r.timeouts, r.died
                );
            }
            (None, Some(why)) => {
                let _ = writeln!(o, "reader: not running: {}", crate::render::clean(why));
            }
            _ => {}
        }
        for b in &r.blamed_files {
            let _ = writeln!(o, "  not parsed again: {}", crate::render::clean(b));
        }
    }
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
            seconds_fixed(p.run_time_ns),
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
    bytes_per_second(b as f64 / secs)
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
        seconds_fixed(s.oncpu_ns),
        seconds_fixed(s.offcpu_blocked_ns),
        seconds_fixed(s.offcpu_preempted_ns),
        seconds_fixed(s.runq_wait_ns),
        s.voluntary_switches,
        s.involuntary_switches,
        p.syscalls.count,
        p.syscalls.errors,
        seconds_fixed(p.syscalls.time_ns),
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
        seconds_fixed(tt.sched.oncpu_ns),
        seconds_fixed(tt.sched.offcpu_blocked_ns),
        seconds_fixed(tt.sched.offcpu_preempted_ns),
        seconds_fixed(tt.sched.runq_wait_ns)
    );
    let _ = writeln!(
        o,
        "syscalls {} ({} errors) taking {}",
        tt.syscalls,
        tt.syscall_errors,
        seconds_fixed(tt.syscall_time_ns)
    );
    let _ = writeln!(
        o,
        "disk: read {} in {} ops, written {} in {} ops",
        bytes_u(tt.block_read_bytes),
        tt.block_read_ops,
        bytes_u(tt.block_write_bytes),
        tt.block_write_ops
    );
    let n = &tt.net;
    let _ = writeln!(
        o,
        "network: tcp sent {} received {}, udp sent {} received {}, retransmits {}, connects {}, closes {}, resets {}/{}",
        bytes_u(n.tcp_tx_bytes),
        bytes_u(n.tcp_rx_bytes),
        bytes_u(n.udp_tx_bytes),
        bytes_u(n.udp_rx_bytes),
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
    where_in_code(&mut o, t);
    cpu_profile(&mut o, t);
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
            seconds_fixed(r.time_ns)
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
            seconds_fixed(th.sched.oncpu_ns),
            seconds_fixed(th.sched.runq_wait_ns)
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
            bytes_u(c.bytes)
        );
    }
    if g.sync.calls > 0 {
        let _ = writeln!(
            o,
            "  sync {:>9} calls, host blocked {}",
            g.sync.calls,
            seconds_fixed(g.sync.time_ns)
        );
    }
    for m in &g.memory {
        let _ = writeln!(
            o,
            "  memory {:<15} live {:>11} peak {:>11} ({} allocs, {} frees)",
            m.kind,
            bytes_u(m.live_bytes),
            bytes_u(m.peak_bytes),
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
            bytes_u(c.bytes),
            seconds_fixed(c.time_ns)
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
                bytes_u(dev.memory_used_bytes),
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
            seconds_fixed(s.time_ns)
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "  {:<32} {:>9} {:>11} {:>12}",
            s.symbol,
            s.calls,
            bytes_u(s.bytes),
            t
        );
    }
}

/// Call sites of runtime calls (kernel stacks, exact; Python samples) and where the sampled
/// threads' time went.
fn where_in_code(o: &mut String, t: &TreeSnapshot) {
    use ethand_exporters::stacks;
    let kernel: Vec<&ethand_snapshot::stacks::CallSites> = t
        .processes
        .iter()
        .filter_map(|p| p.gpu.as_ref())
        .flat_map(|g| &g.call_sites)
        .collect();
    let sample = t.stack_sample.as_ref();
    if kernel.is_empty() && sample.is_none() {
        return;
    }
    let _ = writeln!(o, "\nWHERE IN THE CODE");
    if let Some(s) = sample {
        let cost = match s.sampler_cpu_ns {
            Some(ns) if s.reads > 0 => format!(
                "; {} reads cost ethand {} of CPU, {} each",
                s.reads,
                ethand_exporters::format::duration_ns_u(ns),
                ethand_exporters::format::duration_ns_u(ns / s.reads)
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "  Python frames sampled {}/s over {:.1}s for this snapshot{cost}",
            s.rate_hz,
            s.duration_ms as f64 / 1000.0
        );
        for c in s.call_sites.iter().take(8) {
            if let Some(line) = stacks::call_sites(c) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
            call_stack(o, c);
        }
        for th in s.threads.iter().take(4) {
            if let Some(line) = stacks::thread_lines(th, 3) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
        }
        for n in &s.notes {
            let _ = writeln!(o, "    {}", clean(n));
        }
    }
    if !kernel.is_empty() {
        let _ = writeln!(
            o,
            "  user stacks the kernel took at each call (exact counts):"
        );
        let mut kernel = kernel;
        kernel.sort_by(|a, b| b.total.cmp(&a.total));
        for c in kernel.iter().take(8) {
            if let Some(line) = stacks::call_sites(c) {
                let _ = writeln!(o, "  {}", clean(&line));
            }
            if let Some(u) = c.unattributed.filter(|u| *u > 0) {
                let _ = writeln!(
                    o,
                    "    {u} calls without a stack (stack map full or unreadable)"
                );
            }
            call_stack(o, c);
        }
    }
}

/// The native profile of the sample window: each profiled thread's CPU time by file and
/// function, and where it blocked.
fn cpu_profile(o: &mut String, t: &TreeSnapshot) {
    use ethand_exporters::stacks;
    let Some(p) = &t.cpu_profile else {
        return;
    };
    let _ = writeln!(o, "\nCPU PROFILE");
    if p.rate_hz > 0 {
        let _ = writeln!(
            o,
            "  sampled {}/s on every CPU over {:.1}s, waits of at least {} caught where they block",
            p.rate_hz,
            p.duration_ms as f64 / 1000.0,
            ethand_exporters::format::duration_ns_u(p.offcpu_min_ns)
        );
    }
    for th in p.threads.iter().take(6) {
        if let Some(l) = stacks::cpu_thread_line(p, th, 3) {
            let _ = writeln!(o, "  {}", clean(&l));
        }
        if let Some(l) = stacks::wait_line(p, th) {
            let _ = writeln!(o, "  {}", clean(&l));
        }
    }
    let lost = p.lost_stacks.unwrap_or(0) + p.lost_samples.unwrap_or(0);
    if lost > 0 {
        let _ = writeln!(
            o,
            "    {lost} samples or waits without a stack or lost (profile maps full)"
        );
    }
    for n in &p.notes {
        let _ = writeln!(o, "    {}", clean(n));
    }
}

/// The callers of a call's busiest site, innermost first, a few frames.
fn call_stack(o: &mut String, c: &ethand_snapshot::stacks::CallSites) {
    if let Some((top, _)) = c.top() {
        for f in top.frames.iter().skip(1).take(4) {
            let _ = writeln!(o, "      <- {}", clean(&f.label()));
        }
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
            .map(|e| format!("{} = {}", clean(&e.signal), in_unit(e.value, &e.unit)))
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
mod tests;
