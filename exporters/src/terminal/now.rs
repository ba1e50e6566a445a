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

/// What a live process's threads are doing now: "running", "2 running, 3 waiting", "1 idle",
/// with the longest wait (an idle one only when there is no other): "(longest: read() on
/// pipe:[1] for 15.2 s)", "1 idle (in clock_nanosleep() for 8.0 s)". Idle: a timed sleep or an event loop's wait (`InFlightSyscall::idle`).
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
    let is_idle = |n: &ethand_snapshot::ThreadNow| {
        n.state != "running" && n.syscall.as_ref().is_some_and(|s| s.idle)
    };
    let idle = live.iter().filter(|n| is_idle(n)).count();
    let longest = |idle_ones: bool| {
        live.iter()
            .filter(|n| is_idle(n) == idle_ones)
            .filter_map(|n| n.syscall.as_ref())
            .filter_map(|s| Some((s.blocked_ns()?, s)))
            .max_by_key(|(ns, _)| *ns)
    };
    let waiting = live.len() - running - idle;
    let parts: Vec<String> = [(running, "running"), (waiting, "waiting"), (idle, "idle")]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    let mut out = parts.join(", ");
    let (label, pick) = match longest(false) {
        Some(w) => ("longest: ", Some(w)),
        None => ("in ", longest(true)),
    };
    if let Some((ns, sc)) = pick {
        let _ = write!(
            out,
            " ({label}{} for {}{:.1} s)",
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
    match &t.window_note {
        Some(why) => {
            let _ = writeln!(o, "NOW (last {secs:.1} s; {})", clean(why));
        }
        None => {
            let _ = writeln!(o, "NOW (last {secs:.1} s)");
        }
    }
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
    for p in super::exited::listed(t) {
        now_line(o, p, usize::from(p.pid != root.pid));
    }
    if let Some(l) = super::exited::now_line(t, Some(secs)) {
        let _ = writeln!(o, "{l}");
    }
    o.push('\n');
}
