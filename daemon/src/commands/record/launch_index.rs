//! The recorded tree's kernel launch calls, for joining each kernel to the call that made it
//! (`gpu_tracks.rs`): fed by the recording's own GPU probes as their events arrive
//! (`trace.rs`), looked up by the kernel's queued time.
use std::collections::{HashMap, VecDeque};

/// Launch calls kept for the join, all processes together (24 bytes each; the oldest of the
/// process that has most leave first): CUPTI hands over its records when a buffer fills,
/// seconds after the launches at most; 2^20 launches are ten seconds of a loop launching
/// 100,000 kernels a second.
const MAX_LAUNCHES: usize = 1 << 20;
/// Launch calls looked at before a kernel's queued time, at most (one thread's calls never
/// overlap: only calls of other threads, begun earlier, lie between).
const MAX_SCAN: usize = 4096;

/// The tree's kernel launch calls (from the recording's own GPU probes), by process, in
/// the order they began: a kernel's launch is the one call whose [start, end] holds the
/// time the host queued it, as in the snapshot's launch call sites (docs/gpu-activity.md).
#[derive(Default)]
pub(super) struct LaunchIndex {
    by_pid: HashMap<u32, VecDeque<(u64, u64, u32)>>,
    total: usize,
}

/// Which launch call holds a kernel's queued time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    One {
        tid: u32,
        start: u64,
    },
    /// Calls of two threads held it: not guessed.
    Ambiguous,
    None,
}

impl LaunchIndex {
    pub(super) fn add(&mut self, pid: u32, tid: u32, start: u64, end: u64) {
        if self.total >= MAX_LAUNCHES
            && let Some(most) = self.by_pid.values_mut().max_by_key(|c| c.len())
            && most.pop_front().is_some()
        {
            self.total -= 1;
        }
        self.total += 1;
        let calls = self.by_pid.entry(pid).or_default();
        // Calls arrive as they end, nearly in order: the place is near the back.
        let mut i = calls.len();
        while i > 0 && calls[i - 1].0 > start {
            i -= 1;
        }
        calls.insert(i, (start, end, tid));
    }

    pub(super) fn find(&self, pid: u32, queued: u64) -> Found {
        let Some(calls) = self.by_pid.get(&pid) else {
            return Found::None;
        };
        let after = calls.partition_point(|c| c.0 <= queued);
        let mut found = Found::None;
        for &(start, end, tid) in calls.range(after.saturating_sub(MAX_SCAN)..after).rev() {
            if end < queued {
                continue;
            }
            found = match found {
                Found::None => Found::One { tid, start },
                _ => return Found::Ambiguous,
            };
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One call holds the queued time: that one; two threads' calls: neither; none: none.
    /// Calls arrive as they end, not as they began.
    #[test]
    fn a_kernel_joins_the_one_call_that_held_its_queued_time() {
        let mut l = LaunchIndex::default();
        // Thread 1: [100, 110], [200, 210]; thread 2: [205, 260] (arrives last, began
        // before thread 1's second call ended); another process: [100, 300].
        l.add(1, 1, 100, 110);
        l.add(1, 1, 200, 210);
        l.add(9, 9, 100, 300);
        l.add(1, 2, 205, 260);
        assert_eq!(l.find(1, 105), Found::One { tid: 1, start: 100 });
        assert_eq!(l.find(1, 110), Found::One { tid: 1, start: 100 });
        assert_eq!(l.find(1, 150), Found::None);
        assert_eq!(l.find(1, 202), Found::One { tid: 1, start: 200 });
        assert_eq!(l.find(1, 207), Found::Ambiguous);
        assert_eq!(l.find(1, 250), Found::One { tid: 2, start: 205 });
        assert_eq!(l.find(1, 99), Found::None);
        assert_eq!(l.find(2, 105), Found::None);
    }

    /// The index keeps the latest calls only.
    #[test]
    fn the_oldest_calls_leave_first() {
        let mut l = LaunchIndex::default();
        for i in 0..(MAX_LAUNCHES as u64 + 10) {
            l.add(1, 1, i * 10, i * 10 + 5);
        }
        assert_eq!(l.by_pid[&1].len(), MAX_LAUNCHES);
        assert_eq!(l.find(1, 52), Found::None);
        let last = (MAX_LAUNCHES as u64 + 9) * 10;
        assert_eq!(
            l.find(1, last + 1),
            Found::One {
                tid: 1,
                start: last
            }
        );
    }
}
