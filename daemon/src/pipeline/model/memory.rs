//! Host memory in the model: each process's latest reading and its samples over time (for
//! the window's peak and growth), and which processes are due a sample this round.
//!
//! Samples are taken outside the model lock by the collection loop
//! (`serve::daemon::Daemon::sample_memory`): the processes that ran in the round (their
//! on-CPU time moved; a process that did not run cannot have grown its anonymous memory),
//! and every process every [`MEMORY_SWEEP_ROUNDS`] rounds (a tenth of them each round, by
//! pid), so that file and shmem pages (which others can bring in or the kernel reclaim),
//! swap-outs of idle processes and faults are caught too. So a round costs one
//! /proc/PID/status read (~12 us) per process that ran, plus the sweep's status and stat
//! reads (~21 us) for a tenth of the processes: at 1,000 processes of which 50 run, ~0.6 ms
//! plus ~2.1 ms a round.
use std::collections::VecDeque;

use ethand_common::ProcKey;
use ethand_snapshot::memory::{MemoryWindow, ProcessMemory};

use super::history::{COARSE_MS, FINE_MS};
use crate::pipeline::memory::StatusMemory;

/// Every this many rounds, every live process is sampled (and its faults read).
pub const MEMORY_SWEEP_ROUNDS: u64 = 10;

/// One sample: resident set and its anonymous part, and the highest resident set of the
/// samples it stands for (itself and those thinned away before it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct MemPoint {
    rss: u64,
    anon: u64,
    peak_rss: u64,
}

/// A process's memory as the model holds it.
#[derive(Debug, Default)]
pub struct ProcMemory {
    latest: StatusMemory,
    /// (minor, major) of the last sweep.
    faults: Option<(u64, u64)>,
    /// Wall-clock ms, ascending; a point only when a figure changed (the value holds until
    /// the next), thinned like the totals' history but keeping each thinned span's peak.
    samples: VecDeque<(u64, MemPoint)>,
}

impl ProcMemory {
    pub(super) fn record(&mut self, now_ms: u64, s: StatusMemory, faults: Option<(u64, u64)>) {
        self.latest = s;
        if faults.is_some() {
            self.faults = faults;
        }
        let (Some(rss), Some(anon)) = (s.rss(), s.anon) else {
            return;
        };
        if self
            .samples
            .back()
            .is_some_and(|(_, p)| p.rss == rss && p.anon == anon)
        {
            return;
        }
        self.samples.push_back((
            now_ms,
            MemPoint {
                rss,
                anon,
                peak_rss: rss,
            },
        ));
    }

    /// Drops points older than the horizon (but the one that gives the value there), and
    /// beyond FINE_MS keeps the last point of each COARSE_MS bucket, with the peak of the
    /// points it replaces.
    pub(super) fn thin(&mut self, now_ms: u64, history_ms: u64) {
        let horizon = now_ms.saturating_sub(history_ms);
        while self.samples.len() >= 2 && self.samples[1].0 <= horizon {
            self.samples.pop_front();
        }
        let fine_from = now_ms.saturating_sub(FINE_MS);
        let mut kept: VecDeque<(u64, MemPoint)> = VecDeque::with_capacity(self.samples.len());
        let mut carried_peak = 0;
        let n = self.samples.len();
        for i in 0..n {
            let (t, mut p) = self.samples[i];
            let next_same_bucket = i + 1 < n
                && t < fine_from
                && self.samples[i + 1].0 < fine_from
                && self.samples[i + 1].0 / COARSE_MS == t / COARSE_MS;
            if next_same_bucket {
                carried_peak = carried_peak.max(p.peak_rss);
                continue;
            }
            p.peak_rss = p.peak_rss.max(carried_peak);
            carried_peak = 0;
            kept.push_back((t, p));
        }
        self.samples = kept;
    }

    /// The latest reading, with the window's samples from `then_ms` to `now_ms`.
    pub(super) fn snapshot(&self, then_ms: u64, now_ms: u64) -> ProcessMemory {
        let mut m = crate::pipeline::memory::to_process_memory(self.latest, self.faults);
        m.window = self.window(then_ms, now_ms);
        m
    }

    fn window(&self, then_ms: u64, now_ms: u64) -> Option<MemoryWindow> {
        let start = self.samples.partition_point(|(t, _)| *t <= then_ms);
        // The value at the window's start (the latest point at or before it), then those in.
        let first_idx = start.checked_sub(1).unwrap_or(0);
        let in_window: Vec<&(u64, MemPoint)> = self
            .samples
            .range(first_idx..)
            .filter(|(t, _)| *t <= now_ms)
            .collect();
        let (t0, first) = **in_window.first()?;
        let (_, last) = **in_window.last()?;
        Some(MemoryWindow {
            duration_ms: now_ms.saturating_sub(t0.max(then_ms)),
            samples: in_window.len() as u64,
            // The point at the window's start stands for itself only, not its thinned past.
            peak_rss_bytes: in_window
                .iter()
                .enumerate()
                .map(|(i, (_, p))| if i == 0 { p.rss } else { p.peak_rss })
                .max()
                .unwrap_or(first.rss),
            first_rss_bytes: first.rss,
            last_rss_bytes: last.rss,
            first_anon_bytes: first.anon,
            last_anon_bytes: last.anon,
        })
    }

    /// Resident set at `t` (the latest sample at or before it).
    pub(super) fn rss_at(&self, t: u64) -> Option<u64> {
        let n = self.samples.partition_point(|(pt, _)| *pt <= t);
        n.checked_sub(1).map(|i| self.samples[i].1.rss)
    }

    /// Sample times from `then_ms` on.
    pub(super) fn times_from(&self, then_ms: u64) -> impl Iterator<Item = u64> + '_ {
        self.samples
            .iter()
            .map(|(t, _)| *t)
            .filter(move |t| *t >= then_ms)
    }
}

/// One process's reading, taken by the collection loop outside the model lock.
pub struct MemoryReading {
    pub key: ProcKey,
    pub status: Option<StatusMemory>,
    pub faults: Option<(u64, u64)>,
}

/// Which processes to sample this round, each with whether its faults are due too (the
/// sweep's share).
#[derive(Default)]
pub struct MemoryDue {
    pub keys: Vec<(ProcKey, bool)>,
}

impl super::Model {
    /// The processes due a sample: those that ran in the last ingest, and the sweep's
    /// tenth of the live ones (pid modulo [`MEMORY_SWEEP_ROUNDS`] = the round's), so that
    /// the sweep costs the same every round rather than a burst every tenth; taken once per
    /// round.
    pub fn take_memory_due(&mut self) -> MemoryDue {
        let slot = self.round % MEMORY_SWEEP_ROUNDS;
        let in_sweep = |k: &ProcKey| u64::from(k.tgid) % MEMORY_SWEEP_ROUNDS == slot;
        let mut keys: Vec<(ProcKey, bool)> = self
            .procs
            .values()
            .filter(|p| p.alive && in_sweep(&p.key))
            .map(|p| (p.key, true))
            .collect();
        keys.extend(
            std::mem::take(&mut self.memory_ran)
                .into_iter()
                .filter(|k| !in_sweep(k))
                .map(|k| (k, false)),
        );
        MemoryDue { keys }
    }

    /// Enters the readings taken for [`Self::take_memory_due`]'s processes.
    pub fn record_memory(&mut self, readings: Vec<MemoryReading>, now_ms: u64) {
        let history_ms = self.history_ms;
        for r in readings {
            let (Some(p), Some(status)) = (self.procs.get_mut(&r.key), r.status) else {
                continue;
            };
            if !p.alive {
                continue;
            }
            let m = p.memory.get_or_insert_with(Default::default);
            m.record(now_ms, status, r.faults);
            if m.samples.len() > 2 * (FINE_MS / 1000) as usize {
                m.thin(now_ms, history_ms);
            }
        }
    }

    /// The tree's highest resident set over the window: its processes' samples summed at
    /// each sampling instant.
    pub fn memory_peak(&self, keys: &[ProcKey], window_ms: u64) -> Option<u64> {
        let (now_ms, _) = *self.rounds.last()?;
        let then_ms = now_ms.saturating_sub(window_ms);
        let mems: Vec<&ProcMemory> = keys
            .iter()
            .filter_map(|k| self.procs.get(k)?.memory.as_deref())
            .collect();
        let mut times: Vec<u64> = mems.iter().flat_map(|m| m.times_from(then_ms)).collect();
        times.sort_unstable();
        times.dedup();
        times.push(then_ms);
        times
            .into_iter()
            .map(|t| mems.iter().filter_map(|m| m.rss_at(t)).sum::<u64>())
            .max()
            .filter(|peak| *peak > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(rss_mib: u64, anon_mib: u64) -> StatusMemory {
        StatusMemory {
            anon: Some(anon_mib << 20),
            file: Some((rss_mib - anon_mib) << 20),
            shmem: Some(0),
            swap: Some(0),
            hwm: None,
        }
    }

    #[test]
    fn window_peak_survives_thinning() {
        let mut m = ProcMemory::default();
        // 100 s of samples, a 900 MiB spike at 20 s, 100 MiB otherwise.
        for s in 0..100u64 {
            let rss = if s == 20 { 900 } else { 100 + s % 2 };
            m.record(s * 1000, st(rss, 50), None);
            m.thin(s * 1000, 600_000);
        }
        assert!(m.samples.len() < 60, "{} points", m.samples.len());
        let w = m.window(0, 99_000).expect("window");
        assert_eq!(w.peak_rss_bytes, 900 << 20);
        // A window after the spike does not see it.
        let w = m.window(50_000, 99_000).expect("window");
        assert_eq!(w.peak_rss_bytes, 101 << 20);
    }

    /// A process is due a sample in the rounds it ran, and in its sweep slot only when idle.
    #[test]
    fn due_when_it_ran_and_in_its_sweep_slot() {
        use ethand_common::ThreadStats;
        // The test process stands in for a live one (start time 0: not checked).
        let me = std::process::id();
        let mut m = super::super::Model::new(1000, 60, 30, 100);
        let key = ProcKey {
            tgid: me,
            _pad0: 0,
            proc_start_ns: 0,
        };
        let mut oncpu = 0;
        let mut due_rounds = Vec::new();
        for round in 1..=20u64 {
            // Runs in rounds 1-3 only.
            if round <= 3 {
                oncpu += 1000;
            }
            let raw = super::super::RawRead {
                threads: vec![(
                    me,
                    ThreadStats {
                        tgid: me,
                        proc_start_ns: 0,
                        oncpu_ns: oncpu,
                        ..Default::default()
                    },
                )],
                ..Default::default()
            };
            m.ingest(&raw, round * 1000);
            let due = m.take_memory_due();
            if let Some((_, faults)) = due.keys.iter().find(|(k, _)| *k == key) {
                due_rounds.push((round, *faults));
            }
        }
        // Ran: rounds 1-3 (faults only in its sweep slot); idle: only its sweep slot.
        let slot = u64::from(me) % MEMORY_SWEEP_ROUNDS;
        let expected: Vec<(u64, bool)> = (1..=20u64)
            .filter(|r| *r <= 3 || r % MEMORY_SWEEP_ROUNDS == slot)
            .map(|r| (r, r % MEMORY_SWEEP_ROUNDS == slot))
            .collect();
        assert_eq!(due_rounds, expected);
    }

    #[test]
    fn growth_over_the_window() {
        let mut m = ProcMemory::default();
        for s in 0..=10u64 {
            m.record(s * 1000, st(100 + 10 * s, 10 * s), None);
        }
        let w = m.window(0, 10_000).expect("window");
        assert_eq!(w.duration_ms, 10_000);
        assert_eq!(w.rss_growth_bytes_per_second(), Some((10u64 << 20) as f64));
        assert_eq!(w.anon_growth_bytes_per_second(), Some((10u64 << 20) as f64));
        // Steady: unchanged samples add no points, growth 0 over the whole span.
        let mut steady = ProcMemory::default();
        for s in 0..=10u64 {
            steady.record(s * 1000, st(500, 400), None);
        }
        assert_eq!(steady.samples.len(), 1);
        let w = steady.window(0, 10_000).expect("window");
        assert_eq!(w.rss_growth_bytes_per_second(), Some(0.0));
        assert_eq!(w.peak_rss_bytes, 500 << 20);
    }
}
