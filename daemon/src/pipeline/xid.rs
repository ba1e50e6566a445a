//! XID events attributed to processes. The NVML collector keeps the newest XID events with
//! the pids that held a context on their GPU (`DevicesSnapshot::xid_events`); this ledger
//! counts each event once (by its `seq`) for each of those pids, so that a process's snapshot
//! and `ethand_process_gpu_xid_events_total` show the XIDs of the GPUs it ran on even after
//! the collector's ring moved on.
use std::collections::BTreeMap;

use ethand_snapshot::{
    ProcessSnapshot,
    devices::{DevicesSnapshot, XidEvent},
    gpu::ProcessXid,
};

/// Rows (pid, GPU, code) kept at most; the ones drained longest ago go first. XIDs are rare:
/// this bounds a driver that reports thousands.
pub const MAX_ROWS: usize = 4096;

#[derive(Debug, Default)]
pub struct XidLedger {
    /// The newest `seq` counted (0: none yet).
    last_seq: u64,
    /// (pid, device, code) -> count, uuid, drained first and last (Unix ns).
    rows: BTreeMap<(u32, String, u64), Row>,
}

#[derive(Debug, Clone)]
struct Row {
    uuid: String,
    count: u64,
    first_unix_ns: u64,
    last_unix_ns: u64,
}

impl XidLedger {
    /// Counts the events of `d` not counted yet. A collector that restarted numbers from 1
    /// again: a `seq` below the last one counted starts a new run.
    pub fn observe(&mut self, d: &DevicesSnapshot) {
        let newest = d.xid_events.iter().map(|e| e.seq).max().unwrap_or(0);
        if newest < self.last_seq {
            self.last_seq = 0;
        }
        let after = self.last_seq;
        for e in d.xid_events.iter().filter(|e| e.seq > after) {
            self.count(e);
        }
        self.last_seq = self.last_seq.max(newest);
        if self.rows.len() > MAX_ROWS {
            let mut by_age: Vec<_> = self
                .rows
                .iter()
                .map(|(k, r)| (r.last_unix_ns, k.clone()))
                .collect();
            by_age.sort();
            let excess = self.rows.len() - MAX_ROWS;
            for (_, k) in by_age.into_iter().take(excess) {
                self.rows.remove(&k);
            }
        }
    }

    fn count(&mut self, e: &XidEvent) {
        let device = format!("gpu{}", e.gpu);
        for &pid in &e.pids {
            let r = self
                .rows
                .entry((pid, device.clone(), e.xid))
                .or_insert_with(|| Row {
                    uuid: e.uuid.clone(),
                    count: 0,
                    first_unix_ns: e.drained_unix_ns,
                    last_unix_ns: e.drained_unix_ns,
                });
            r.count += 1;
            r.first_unix_ns = r.first_unix_ns.min(e.drained_unix_ns);
            r.last_unix_ns = r.last_unix_ns.max(e.drained_unix_ns);
        }
    }

    /// The XIDs of `p`: the rows of its pid, unless the process started after the first of
    /// them was drained (a later process that reused the pid).
    pub fn of(&self, p: &ProcessSnapshot) -> Vec<ProcessXid> {
        let started_ns = p.start_time_unix_s.saturating_mul(1_000_000_000);
        self.rows
            .range((p.pid, String::new(), 0)..)
            .take_while(|((pid, _, _), _)| *pid == p.pid)
            // Start times are whole seconds: a process that started in the event's second
            // may have held the context.
            .filter(|(_, r)| {
                p.start_time_unix_s == 0
                    || started_ns <= r.first_unix_ns.saturating_add(999_999_999)
            })
            .map(|((_, device, xid), r)| ProcessXid {
                device: device.clone(),
                uuid: r.uuid.clone(),
                xid: *xid,
                count: r.count,
                last_unix_ns: r.last_unix_ns,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, gpu: u32, xid: u64, at_s: u64, pids: &[u32]) -> XidEvent {
        XidEvent {
            seq,
            gpu,
            uuid: format!("GPU-{gpu}"),
            xid,
            drained_unix_ns: at_s * 1_000_000_000,
            pids: pids.to_vec(),
        }
    }

    fn devices(events: Vec<XidEvent>) -> DevicesSnapshot {
        DevicesSnapshot {
            xid_events: events,
            ..Default::default()
        }
    }

    fn process(pid: u32, start_s: u64) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            start_time_unix_s: start_s,
            ..Default::default()
        }
    }

    #[test]
    fn each_event_counts_once_for_each_process_on_its_gpu() {
        let mut l = XidLedger::default();
        let e1 = event(1, 0, 79, 100, &[10, 11]);
        let e2 = event(2, 0, 79, 105, &[10]);
        let e3 = event(3, 1, 13, 106, &[10]);
        l.observe(&devices(vec![e1.clone()]));
        // The ring still holds event 1 next time: not counted again.
        l.observe(&devices(vec![e1.clone(), e2.clone(), e3.clone()]));
        l.observe(&devices(vec![e1, e2, e3]));
        let of10 = l.of(&process(10, 50));
        assert_eq!(
            of10,
            vec![
                ProcessXid {
                    device: "gpu0".into(),
                    uuid: "GPU-0".into(),
                    xid: 79,
                    count: 2,
                    last_unix_ns: 105_000_000_000,
                },
                ProcessXid {
                    device: "gpu1".into(),
                    uuid: "GPU-1".into(),
                    xid: 13,
                    count: 1,
                    last_unix_ns: 106_000_000_000,
                },
            ]
        );
        assert_eq!(l.of(&process(11, 50))[0].count, 1);
        // A process with no event, and one that reused pid 11 after the event: nothing.
        assert!(l.of(&process(12, 50)).is_empty());
        assert!(l.of(&process(11, 200)).is_empty());
        // Started in the event's second: it may have held the context.
        assert_eq!(l.of(&process(11, 100)).len(), 1);
    }

    #[test]
    fn a_restarted_collector_numbers_from_one_again() {
        let mut l = XidLedger::default();
        l.observe(&devices(vec![event(5, 0, 79, 100, &[10])]));
        l.observe(&devices(vec![event(1, 0, 48, 200, &[10])]));
        let xids: Vec<u64> = l.of(&process(10, 0)).iter().map(|x| x.xid).collect();
        assert_eq!(xids, vec![48, 79]);
    }

    #[test]
    fn rows_are_bounded_oldest_first() {
        let mut l = XidLedger::default();
        let events: Vec<XidEvent> = (0..MAX_ROWS as u64 + 10)
            .map(|i| event(i + 1, 0, 79, 1000 + i, &[i as u32 + 1]))
            .collect();
        l.observe(&devices(events));
        assert_eq!(l.rows.len(), MAX_ROWS);
        assert!(l.of(&process(1, 0)).is_empty(), "the oldest row went first");
        assert_eq!(l.of(&process(MAX_ROWS as u32 + 10, 0)).len(), 1);
    }
}
