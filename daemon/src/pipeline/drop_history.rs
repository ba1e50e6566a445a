//! When node-wide losses happened. A full kernel map or ring buffer (and a full model) loses
//! events of whichever processes made them: the counters say how many, node-wide, not whose.
//! Kept as the points where those counters changed, so that a snapshot can say how many were
//! lost while its own figures were being taken (`TreeSnapshot::dropped_events`).
use std::collections::VecDeque;

use ethand_snapshot::DropCounter;

/// Change points kept: one per collection round while losses go on (an hour at the default
/// interval). Beyond it the oldest go and earlier spans are counted from the oldest kept.
const POINTS: usize = 4096;

/// The reason under which processes the model could not track are counted.
pub const MODEL_FULL: &str = "processes_overflow";

#[derive(Default)]
pub struct DropHistory {
    /// Names of the counters, in the order of each point's values.
    reasons: Vec<String>,
    /// (unix ms, cumulative count per reason), oldest first; a point only where one changed.
    points: VecDeque<(u64, Vec<u64>)>,
}

impl DropHistory {
    /// The losses counted at `now_ms` (`drops`' loss counters and the model's overflow).
    pub fn record(&mut self, now_ms: u64, drops: &[DropCounter], overflow: u64) {
        let values: Vec<u64> = drops
            .iter()
            .filter(|d| d.loss)
            .map(|d| d.count)
            .chain([overflow])
            .collect();
        if self.reasons.is_empty() {
            self.reasons = drops
                .iter()
                .filter(|d| d.loss)
                .map(|d| d.reason.clone())
                .chain([MODEL_FULL.to_string()])
                .collect();
        }
        if values.len() != self.reasons.len() {
            return;
        }
        let changed = match self.points.back() {
            Some((_, last)) => *last != values,
            None => values.iter().any(|v| *v > 0),
        };
        if changed {
            if self.points.len() == POINTS {
                self.points.pop_front();
            }
            self.points.push_back((now_ms, values));
        }
    }

    /// What was lost after `since_ms`, per reason (only reasons with losses).
    pub fn since(&self, since_ms: u64) -> Vec<DropCounter> {
        let Some((_, now)) = self.points.back() else {
            return Vec::new();
        };
        let zero = vec![0; self.reasons.len()];
        let base = self
            .points
            .iter()
            .rev()
            .find(|(t, _)| *t <= since_ms)
            .map(|(_, v)| v)
            .unwrap_or(if self.points.len() == POINTS {
                &self.points[0].1
            } else {
                &zero
            });
        self.reasons
            .iter()
            .zip(now.iter().zip(base))
            .filter(|(_, (n, b))| n > b)
            .map(|(reason, (n, b))| DropCounter {
                reason: reason.clone(),
                count: n - b,
                loss: true,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drops(threads_full: u64, info: u64) -> Vec<DropCounter> {
        vec![
            DropCounter {
                reason: "threads_full".into(),
                count: threads_full,
                loss: true,
            },
            DropCounter {
                reason: "unmatched".into(),
                count: info,
                loss: false,
            },
        ]
    }

    #[test]
    fn counts_only_what_was_lost_after_the_start_of_a_span() {
        let mut h = DropHistory::default();
        h.record(1_000, &drops(0, 5), 0);
        assert!(h.since(0).is_empty(), "nothing lost yet");
        h.record(2_000, &drops(10, 9), 0);
        h.record(3_000, &drops(10, 9), 0);
        h.record(4_000, &drops(25, 9), 3);
        let all = h.since(0);
        assert_eq!(
            all.iter()
                .map(|d| (d.reason.as_str(), d.count))
                .collect::<Vec<_>>(),
            [("threads_full", 25), (MODEL_FULL, 3)]
        );
        // A process first seen at 2.5 s: only the losses of the 4 s round.
        let late = h.since(2_500);
        assert_eq!(late.iter().map(|d| d.count).sum::<u64>(), 15 + 3);
        assert!(h.since(4_000).is_empty());
    }
}
