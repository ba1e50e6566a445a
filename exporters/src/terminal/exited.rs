//! Exited processes of a tree, collapsed per command: a shell loop's 40 short-lived children
//! are one line ("38 x bash, 5 x readlink: 0.02 cores"), not 40 lines of zeros. The root and
//! the live processes keep a line each; the JSON keeps every process.
use std::collections::BTreeMap;

use ethand_snapshot::{ProcessSnapshot, TreeSnapshot};

use super::clean;
use crate::format::{count, seconds_fixed};

/// Commands named on the line; the rest are counted.
const NAMED: usize = 8;

/// The processes that get a line of their own: the root and the live ones.
pub(super) fn listed(t: &TreeSnapshot) -> impl Iterator<Item = &ProcessSnapshot> {
    let root = t.processes.first().map(|p| p.pid);
    t.processes
        .iter()
        .filter(move |p| p.alive || Some(p.pid) == root)
        .collect::<Vec<_>>()
        .into_iter()
}

/// The exited processes (not the root).
fn exited(t: &TreeSnapshot) -> Vec<&ProcessSnapshot> {
    let root = t.processes.first().map(|p| p.pid);
    t.processes
        .iter()
        .filter(|p| !p.alive && Some(p.pid) != root)
        .collect()
}

/// "38 x bash, 5 x readlink" (most first), or "readlink (pid 12)" for a command seen once.
fn by_command(ps: &[&ProcessSnapshot]) -> String {
    let mut groups: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for p in ps {
        let g = groups.entry(clean(&p.comm)).or_default();
        g.0 += 1;
        g.1 = p.pid;
    }
    let mut groups: Vec<(String, (u64, u32))> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let mut parts: Vec<String> = groups
        .iter()
        .take(NAMED)
        .map(|(comm, (n, pid))| match n {
            1 => format!("{comm} (pid {pid})"),
            n => format!("{} x {comm}", count(*n)),
        })
        .collect();
    if groups.len() > NAMED {
        let rest: u64 = groups[NAMED..].iter().map(|g| g.1.0).sum();
        parts.push(format!("{} more", count(rest)));
    }
    parts.join(", ")
}

/// The NOW section's line for the exited processes: their CPU over the tree's window.
pub(super) fn now_line(t: &TreeSnapshot, window_secs: Option<f64>) -> Option<String> {
    let ps = exited(t);
    if ps.is_empty() {
        return None;
    }
    let cores = window_secs.filter(|s| *s > 0.0).map(|secs| {
        let ns: u64 = ps
            .iter()
            .filter_map(|p| p.window.as_ref())
            .map(|w| w.oncpu_ns)
            .sum();
        format!(": {:.2} cores", ns as f64 / 1e9 / secs)
    });
    Some(format!(
        "  exited: {}{}",
        by_command(&ps),
        cores.unwrap_or_default()
    ))
}

/// The LIFETIME section's line for the exited processes: their totals.
pub(super) fn lifetime_line(t: &TreeSnapshot) -> Option<String> {
    let ps = exited(t);
    if ps.is_empty() {
        return None;
    }
    let cpu: u64 = ps.iter().map(|p| p.sched.oncpu_ns).sum();
    let syscalls: u64 = ps.iter().map(|p| p.syscalls.count).sum();
    Some(format!(
        "  exited: {}: cpu {}, syscalls {}",
        by_command(&ps),
        seconds_fixed(cpu),
        count(syscalls)
    ))
}
