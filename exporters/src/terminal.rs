//! Terminal output of a snapshot: `ethand snapshot` (the tree), `ethand status` (the daemon's
//! own state) and `ethand diagnose FILE` (the findings alone). Every value a process chose goes
//! through [`clean`]; every screen goes through [`text::for_terminal_keep_lines`] at the end,
//! so that nothing reaches the terminal raw.
use std::fmt::Write as _;

use ethand_snapshot::{ProcessSnapshot, TreeSnapshot, WorkloadIdentity};

use crate::format::{bytes_u, seconds_fixed};
use crate::text;

mod diagnosis;
mod exited;
mod gpu;
mod kernels;
pub mod memory;
mod now;
mod stacks;
mod status;

pub use diagnosis::diagnosis;
pub use status::status;

/// Printable form of a name that may hold control characters or characters that hide or
/// reorder text ([`text::for_terminal`]).
pub fn clean(s: &str) -> String {
    text::for_terminal(s)
}

/// `ethand snapshot`: the tree now, its diagnosis, then its lifetime totals.
pub fn snapshot(t: &TreeSnapshot) -> String {
    let mut o = String::new();
    let root = &t.processes[0];
    header(&mut o, t);
    loss_warning(&mut o, t);
    now::now_section(&mut o, t);
    memory::memory_section(&mut o, t);
    diagnosis::findings(&mut o, &t.findings, &t.not_evaluated);
    let _ = writeln!(
        o,
        "LIFETIME ({})",
        if t.source == ethand_snapshot::SnapshotSource::Daemon {
            "since ethand first saw each process"
        } else {
            "over the measurement"
        }
    );
    for p in exited::listed(t) {
        proc_line(&mut o, p, usize::from(p.pid != root.pid));
    }
    if let Some(l) = exited::lifetime_line(t) {
        let _ = writeln!(o, "{l}");
    }
    totals(&mut o, t);
    if let Some(g) = &t.total.gpu {
        gpu::gpu_section(&mut o, t, g);
    } else if let Some(l) = &t.launch_sample {
        let _ = writeln!(o, "\nGPU / NPU RUNTIME (uprobes)");
        gpu::launch_sample(&mut o, l);
    }
    if let Some(a) = &t.gpu_activity {
        kernels::gpu_activity(&mut o, a);
    }
    stacks::where_in_code(&mut o, t);
    stacks::cpu_profile(&mut o, t);
    top_syscalls(&mut o, t);
    top_threads(&mut o, t);
    // Every value above that a process chose went through `clean`; this catches any that
    // did not (finding evidence, device names), so nothing reaches the terminal raw.
    text::for_terminal_keep_lines(&o)
}

/// Which tree, how it was measured, and who it works for.
fn header(o: &mut String, t: &TreeSnapshot) {
    let root = &t.processes[0];
    let what = if t.source == ethand_snapshot::SnapshotSource::Daemon {
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
        let _ = writeln!(o, "workload: {}", clean(&workload(w)));
    }
    o.push('\n');
}

/// Events lost node-wide while the figures were taken: the tree's counts may be low.
fn loss_warning(o: &mut String, t: &TreeSnapshot) {
    if t.dropped_events.is_empty() {
        return;
    }
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

/// One line for `ethand snapshot`: "pod ml/trainer-0 container pytorch (containerd 0123456789ab)
/// job job-42 rank 3/8".
fn workload(w: &WorkloadIdentity) -> String {
    let mut parts = Vec::new();
    if w.pod.is_some() || w.namespace.is_some() {
        parts.push(format!(
            "pod {}/{}",
            w.namespace.as_deref().unwrap_or("?"),
            w.pod.as_deref().unwrap_or("?")
        ));
    } else if let Some(uid) = &w.pod_uid {
        parts.push(format!("pod uid {uid}"));
    }
    if w.container.is_some() || w.container_id.is_some() {
        let id: String = w
            .container_id
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(12)
            .collect();
        parts.push(format!(
            "container {} ({} {id})",
            w.container.as_deref().unwrap_or("?"),
            w.container_runtime.as_deref().unwrap_or("?"),
        ));
    }
    if let Some(j) = &w.job_id {
        parts.push(format!("job {j}"));
    }
    if let Some(r) = w.rank {
        let size = [
            "WORLD_SIZE",
            "SLURM_NTASKS",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
        ]
        .iter()
        .find_map(|k| w.env.get(*k));
        match size {
            Some(n) => parts.push(format!("rank {r}/{n}")),
            None => parts.push(format!("rank {r}")),
        }
        if w.rank_source.as_deref() == Some("nccl") {
            parts.push("(rank from NCCL)".into());
        }
    }
    if parts.is_empty() {
        "unknown".into()
    } else {
        parts.join(" ")
    }
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

/// The tree's lifetime sums: scheduler, syscalls, disk and network.
fn totals(o: &mut String, t: &TreeSnapshot) {
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
    if let Some(own) = tt.proc_write_bytes {
        let _ = writeln!(o, "  {}", crate::format::written_note(own));
    }
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
}

/// The ten (process, syscall) pairs that took the most time.
fn top_syscalls(o: &mut String, t: &TreeSnapshot) {
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
}

/// The eight threads of the tree that used the most CPU.
fn top_threads(o: &mut String, t: &TreeSnapshot) {
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
}

#[cfg(test)]
mod tests;
