//! Which processes get their own series, held from round to round.
//!
//! A plain "top N by CPU of the last window" changes its members at every scrape when many
//! processes are about equally busy (1,000 workers waking once a second): in two minutes 103
//! distinct pids had series, most in one or two of 24 scrapes, so `rate()` had holes and the
//! head of Prometheus filled with series nobody could use. [`Selection`] keeps a process from
//! the round it is picked until it exits or has used no CPU for
//! [`SelectionPolicy::hold_ms`], admits only processes older than
//! [`SelectionPolicy::min_age_ms`] (short-lived ones are carried by the per-cgroup and
//! per-comm series), and lets a newcomer displace a held process only when it uses at least
//! twice its CPU and the held one has had its series for the hold time.
use std::cmp::Reverse;
use std::collections::HashMap;

use crate::ProcessSnapshot;

/// Which of a snapshot's processes an output (/metrics, OTLP) gives series of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportSelection {
    /// The snapshot's processes are the selection already: the daemon's [`Selection`], held
    /// between rounds.
    Preselected,
    /// Picked from this snapshot alone ([`select_once`]): a tool or a test with one snapshot.
    Once(SelectionPolicy),
}

impl Default for ExportSelection {
    /// No slots: only named processes and GPU/NPU users.
    fn default() -> Self {
        Self::Once(SelectionPolicy::default())
    }
}

impl ExportSelection {
    /// The `n` busiest processes of this snapshot, with GPU/NPU users.
    pub fn top(n: usize) -> Self {
        Self::Once(SelectionPolicy {
            top_n: n,
            ..SelectionPolicy::default()
        })
    }

    /// The selected processes, as indices into `procs` in their order.
    pub fn indices(&self, procs: &[ProcessSnapshot]) -> Vec<usize> {
        match self {
            Self::Preselected => (0..procs.len()).collect(),
            Self::Once(policy) => select_once(procs, policy),
        }
    }
}

/// What [`Selection`] picks from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelectionPolicy {
    /// Slots for the busiest processes (by CPU time in the window; cumulative CPU time for a
    /// process without a window). Processes without CPU time are never picked for a slot.
    pub top_n: usize,
    pub pids: Vec<u32>,
    /// Exact process names (comm).
    pub comms: Vec<String>,
    /// Substrings of the cgroup path; empty patterns are ignored.
    pub cgroups: Vec<String>,
    /// A process holds its slot until it exits or has used no CPU for this long.
    pub hold_ms: u64,
    /// Only processes at least this old (by `start_time_unix_s`) take a slot.
    pub min_age_ms: u64,
}

impl SelectionPolicy {
    /// Named by pid, comm or cgroup, or a GPU/NPU user (runtime calls probed, or device
    /// memory the driver reports): always selected, outside the slots (GPU users are few and
    /// the reason ethand runs).
    pub fn always(&self, p: &ProcessSnapshot) -> bool {
        p.gpu.is_some()
            || !p.devices.is_empty()
            || self.pids.contains(&p.pid)
            || self.comms.contains(&p.comm)
            || self
                .cgroups
                .iter()
                .any(|c| !c.is_empty() && p.cgroup.contains(c.as_str()))
    }
}

/// CPU time the selection ranks by: the window's, else the lifetime's.
pub fn recent_cpu_ns(p: &ProcessSnapshot) -> u64 {
    p.window.as_ref().map_or(p.sched.oncpu_ns, |w| w.oncpu_ns)
}

/// One-shot selection (no history): the top N by recent CPU plus the named processes and GPU
/// users. For a single snapshot (standalone output, tests); the daemon uses [`Selection`].
pub fn select_once(procs: &[ProcessSnapshot], policy: &SelectionPolicy) -> Vec<usize> {
    let mut ranked: Vec<usize> = (0..procs.len())
        .filter(|&i| recent_cpu_ns(&procs[i]) > 0)
        .collect();
    // Ties go to the lower pid so that the selection is stable between scrapes.
    ranked.sort_by_key(|&i| (Reverse(recent_cpu_ns(&procs[i])), procs[i].pid));
    let mut picked = vec![false; procs.len()];
    for &i in ranked.iter().take(policy.top_n) {
        picked[i] = true;
    }
    (0..procs.len())
        .filter(|&i| picked[i] || policy.always(&procs[i]))
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Held {
    since_ms: u64,
    last_active_ms: u64,
}

/// The slot holders between rounds, keyed by (pid, start_time_ns) so that a reused pid is a
/// new process.
#[derive(Debug, Default)]
pub struct Selection {
    held: HashMap<(u32, u64), Held>,
}

/// A newcomer displaces a held process only with at least this factor of its CPU time...
const DISPLACE_FACTOR: u64 = 2;
/// ...and at least this much more CPU in the window (noise between near-idle processes).
const DISPLACE_MARGIN_NS: u64 = 10_000_000;

impl Selection {
    pub fn new() -> Self {
        Self::default()
    }

    /// Processes holding a slot now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The processes of `procs` (indices) that get series this round at `now_unix_ms`:
    /// the slot holders and the always-selected ones.
    pub fn pick(
        &mut self,
        procs: &[ProcessSnapshot],
        policy: &SelectionPolicy,
        now_unix_ms: u64,
    ) -> Vec<usize> {
        let key = |p: &ProcessSnapshot| (p.pid, p.start_time_ns);
        let index: HashMap<(u32, u64), usize> =
            procs.iter().enumerate().map(|(i, p)| (key(p), i)).collect();
        // Gone from the model (exited and reclaimed), or quiet for the hold time.
        self.held.retain(|k, h| {
            let Some(&i) = index.get(k) else {
                return false;
            };
            if recent_cpu_ns(&procs[i]) > 0 {
                h.last_active_ms = now_unix_ms;
            }
            now_unix_ms.saturating_sub(h.last_active_ms) < policy.hold_ms
        });
        if policy.top_n == 0 {
            self.held.clear();
        }
        let old_enough = |p: &ProcessSnapshot| {
            p.start_time_unix_s == 0
                || now_unix_ms.saturating_sub(p.start_time_unix_s.saturating_mul(1000))
                    >= policy.min_age_ms
        };
        let mut candidates: Vec<usize> = (0..procs.len())
            .filter(|&i| {
                let p = &procs[i];
                recent_cpu_ns(p) > 0
                    && !self.held.contains_key(&key(p))
                    && !policy.always(p)
                    && old_enough(p)
            })
            .collect();
        candidates.sort_by_key(|&i| (Reverse(recent_cpu_ns(&procs[i])), procs[i].pid));
        for i in candidates {
            let p = &procs[i];
            let fresh = Held {
                since_ms: now_unix_ms,
                last_active_ms: now_unix_ms,
            };
            if self.held.len() < policy.top_n {
                self.held.insert(key(p), fresh);
                continue;
            }
            // The weakest holder that has had its series for the hold time.
            let weakest = self
                .held
                .iter()
                .filter(|(_, h)| now_unix_ms.saturating_sub(h.since_ms) >= policy.hold_ms)
                .map(|(k, _)| (recent_cpu_ns(&procs[index[k]]), *k))
                .min_by_key(|&(cpu, k)| (cpu, Reverse(k)));
            let cpu = recent_cpu_ns(p);
            match weakest {
                Some((weak_cpu, k))
                    if cpu >= weak_cpu.saturating_mul(DISPLACE_FACTOR)
                        && cpu >= weak_cpu.saturating_add(DISPLACE_MARGIN_NS) =>
                {
                    self.held.remove(&k);
                    self.held.insert(key(p), fresh);
                }
                // Candidates come busiest first: no later one displaces anybody either.
                _ => break,
            }
        }
        (0..procs.len())
            .filter(|&i| self.held.contains_key(&key(&procs[i])) || policy.always(&procs[i]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WindowStats;

    const NOW: u64 = 1_000_000_000;

    fn proc(pid: u32, cpu_ms: u64, age_s: u64) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            start_time_ns: u64::from(pid) * 7,
            start_time_unix_s: NOW / 1000 - age_s,
            comm: format!("p{pid}"),
            window: Some(WindowStats {
                duration_ms: 10_000,
                oncpu_ns: cpu_ms * 1_000_000,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn policy(top_n: usize) -> SelectionPolicy {
        SelectionPolicy {
            top_n,
            hold_ms: 300_000,
            min_age_ms: 30_000,
            ..Default::default()
        }
    }

    fn pids(procs: &[ProcessSnapshot], picked: &[usize]) -> Vec<u32> {
        let mut v: Vec<u32> = picked.iter().map(|&i| procs[i].pid).collect();
        v.sort();
        v
    }

    /// 100 equally busy processes whose order changes every round: the first round's picks
    /// keep their slots for the whole hour, nobody else gets one.
    #[test]
    fn equally_busy_processes_do_not_rotate() {
        let policy = policy(5);
        let mut sel = Selection::new();
        let mut first = None;
        for round in 0..3600u64 {
            let procs: Vec<ProcessSnapshot> = (1..=100u32)
                .map(|pid| proc(pid, 50 + (u64::from(pid) * 31 + round * 17) % 13, 600))
                .collect();
            let picked = pids(&procs, &sel.pick(&procs, &policy, NOW + round * 1000));
            assert_eq!(picked.len(), 5);
            match &first {
                None => first = Some(picked),
                Some(f) => assert_eq!(&picked, f, "round {round}"),
            }
        }
    }

    #[test]
    fn young_processes_wait_for_min_age() {
        let policy = policy(5);
        let mut sel = Selection::new();
        let procs = vec![proc(1, 900, 5), proc(2, 10, 600)];
        assert_eq!(pids(&procs, &sel.pick(&procs, &policy, NOW)), vec![2]);
        let procs = vec![proc(1, 900, 35), proc(2, 10, 630)];
        assert_eq!(
            pids(&procs, &sel.pick(&procs, &policy, NOW + 30_000)),
            vec![1, 2]
        );
    }

    #[test]
    fn quiet_processes_leave_after_the_hold_and_exited_ones_at_once() {
        let policy = policy(5);
        let mut sel = Selection::new();
        let busy = vec![proc(1, 100, 600), proc(2, 100, 600)];
        assert_eq!(pids(&busy, &sel.pick(&busy, &policy, NOW)), vec![1, 2]);
        // pid 1 goes quiet: kept until 300 s after its last CPU use.
        let quiet = vec![proc(1, 0, 600), proc(2, 100, 600)];
        assert_eq!(
            pids(&quiet, &sel.pick(&quiet, &policy, NOW + 299_000)),
            vec![1, 2]
        );
        assert_eq!(
            pids(&quiet, &sel.pick(&quiet, &policy, NOW + 300_000)),
            vec![2]
        );
        // pid 2 is gone from the snapshot: its slot frees at once.
        let gone = vec![proc(1, 0, 600)];
        assert!(sel.pick(&gone, &policy, NOW + 301_000).is_empty());
        assert_eq!(sel.held(), 0);
    }

    #[test]
    fn a_much_busier_newcomer_displaces_the_weakest_after_the_hold() {
        let policy = policy(2);
        let mut sel = Selection::new();
        let mut procs = vec![proc(1, 50, 600), proc(2, 40, 600), proc(3, 30, 600)];
        assert_eq!(pids(&procs, &sel.pick(&procs, &policy, NOW)), vec![1, 2]);
        // pid 3 becomes 10x busier, but the holders have had their series for 10 s only.
        procs[2] = proc(3, 500, 600);
        assert_eq!(
            pids(&procs, &sel.pick(&procs, &policy, NOW + 10_000)),
            vec![1, 2]
        );
        // After the hold the weakest (pid 2) gives its slot up.
        assert_eq!(
            pids(&procs, &sel.pick(&procs, &policy, NOW + 300_000)),
            vec![1, 3]
        );
        // Not twice as busy as the weakest holder (pid 1, 50 ms): no change.
        procs[1] = proc(2, 90, 600);
        assert_eq!(
            pids(&procs, &sel.pick(&procs, &policy, NOW + 900_000)),
            vec![1, 3]
        );
        // Twice as busy and 10 ms more: pid 1 gives way.
        procs[1] = proc(2, 100, 600);
        assert_eq!(
            pids(&procs, &sel.pick(&procs, &policy, NOW + 901_000)),
            vec![2, 3]
        );
    }

    #[test]
    fn named_and_gpu_processes_are_outside_the_slots() {
        let mut policy = policy(1);
        policy.comms = vec!["p7".into()];
        let mut sel = Selection::new();
        let mut gpu = proc(9, 0, 1);
        gpu.gpu = Some(Default::default());
        let procs = vec![proc(1, 100, 600), proc(2, 90, 600), proc(7, 0, 1), gpu];
        assert_eq!(pids(&procs, &sel.pick(&procs, &policy, NOW)), vec![1, 7, 9]);
        assert_eq!(sel.held(), 1);
    }

    #[test]
    fn a_reused_pid_is_a_new_process() {
        let policy = policy(1);
        let mut sel = Selection::new();
        let procs = vec![proc(1, 100, 600)];
        sel.pick(&procs, &policy, NOW);
        let mut reused = proc(1, 100, 5);
        reused.start_time_ns += 1;
        let procs = vec![reused];
        // The old process is gone; the new one with its pid is too young for a slot.
        assert!(sel.pick(&procs, &policy, NOW + 1000).is_empty());
    }
}
