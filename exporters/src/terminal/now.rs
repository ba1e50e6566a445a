//! The "now" part of a snapshot: the tree's rates over its window and what each process's
//! threads are doing.
use std::fmt::Write as _;

use ethand_snapshot::{ProcessSnapshot, TreeSnapshot};

use super::clean;
use crate::format::bytes_per_second;

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
pub(super) fn now_section(o: &mut String, t: &TreeSnapshot) {
    let Some(w) = crate::report::tree_window(t) else {
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
