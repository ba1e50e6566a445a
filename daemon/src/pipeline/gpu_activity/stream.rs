//! Windows whose entries go out as the probes wrote them, to `ethand record` over the local
//! API (`gpu_trace`), instead of into a snapshot's aggregate: while the daemon runs it owns
//! the CUPTI directory, its control file and the probes, so a recording asks the daemon to
//! open the windows and hand it their entries (docs/design/kernel-launch-sites-and-gpu-tracks.md).
//!
//! The collection loop never waits on a client: entries go into a bounded queue with
//! `try_send`, and what a full queue refuses is counted and said in the last line. The
//! client ends the windows early by closing its side of the connection for writing; a
//! client that goes away ends them at once.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ethand_common::{CuptiRec, CuptiWindowEvent, cupti_window_state};
use ethand_snapshot::kernels::ActivityState;
use ethand_userspace_probes::cupti::ProcessKey;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::Sender;

use super::{CLOSE_GRACE, Channel, MAX_PIDS, aggregate, open_window};
use crate::pipeline::procinfo::monotonic_ns;

/// Streams open at once, at most: each holds windows open in its processes.
pub const MAX_STREAMS: usize = 4;
/// Entries queued for one client, at most (an entry holds up to 64 records: ~5 KiB).
pub const QUEUE_ENTRIES: usize = 2048;
/// The longest stream asked for (`ethand record`'s own bound).
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// What the collection loop hands the connection's task, in this order: `Opened` once,
/// entries, `Done` once (unless the client went away); or `Refused` alone.
#[derive(Debug)]
pub enum Streamed {
    Refused(String),
    Opened(Vec<TracedProcess>),
    Entry(Vec<u8>),
    Done(StreamEnd),
}

/// One process asked for: its window, or why none was opened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TracedProcess {
    pub pid: u32,
    /// The window its entries carry (absent: none opened, see `state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_id: Option<u64>,
    /// Why no window (absent when one was opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ActivityState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The last line: how many entries went out, and how many a full queue refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEnd {
    pub entries: u64,
    pub entries_dropped: u64,
    /// Whether every library said its window is over (false: the grace ran out first).
    pub closed: bool,
}

/// A client's request, started by the collection loop.
pub struct StreamRequest {
    pub pids: Vec<u32>,
    pub duration: Duration,
    pub out: Sender<Streamed>,
    /// Set by the connection's task when the client closed its side for writing.
    pub end: Arc<AtomicBool>,
}

struct Proc {
    pid: u32,
    key: Option<ProcessKey>,
    window_id: u64,
    ended: bool,
}

/// Only the window's events matter here: the entries go out whole.
impl aggregate::CuptiSink for Proc {
    fn partial(&mut self) {}
    fn records(&mut self, _: &[CuptiRec]) {}
    fn name(&mut self, _: u32, _: &[u8]) {}
    fn event(&mut self, e: CuptiWindowEvent) {
        match e.state {
            cupti_window_state::CLOSED
            | cupti_window_state::REFUSED
            | cupti_window_state::FAILED => self.ended = true,
            _ => {}
        }
    }
}

struct Stream {
    procs: Vec<Proc>,
    out: Sender<Streamed>,
    end: Arc<AtomicBool>,
    /// Past this the windows are closed whatever the libraries say.
    give_up: Instant,
    ended_early: bool,
    sent: u64,
    dropped: u64,
}

impl Stream {
    /// One entry to the client, unless its queue is full: the last slot stays free for
    /// `Done`.
    fn send(&mut self, bytes: &[u8]) {
        if self.out.capacity() <= 1 {
            self.dropped += 1;
            return;
        }
        match self.out.try_send(Streamed::Entry(bytes.to_vec())) {
            Ok(()) => self.sent += 1,
            Err(_) => self.dropped += 1,
        }
    }

    fn over(&self, now: Instant) -> bool {
        self.out.is_closed() || now >= self.give_up || self.procs.iter().all(|p| p.ended)
    }
}

/// Opens `pid`'s window, or says why not.
fn open_one(
    channel: &mut Result<&mut Channel, &mut String>,
    pid: u32,
    deadline: u64,
) -> Result<(ProcessKey, u64), (ActivityState, String)> {
    let c = match channel {
        Ok(c) => c,
        Err(e) => {
            return Err((
                ActivityState::Failed,
                format!("GPU activity recording unavailable: {e}"),
            ));
        }
    };
    open_window(c, pid, deadline, u64::from(u32::MAX))
}

/// The open streams, kept by the activity sampler (which owns the channel).
#[derive(Default)]
pub struct Streams {
    open: Vec<Stream>,
}

impl Streams {
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Opens `r`'s windows and tells the client which.
    pub fn start(&mut self, channel: Result<&mut Channel, &mut String>, r: StreamRequest) {
        if self.open.len() >= MAX_STREAMS {
            let _ = r.out.try_send(Streamed::Refused(format!(
                "busy: {MAX_STREAMS} GPU traces are being streamed; try again when one ends"
            )));
            return;
        }
        let duration = r.duration.min(MAX_DURATION);
        let mut traced = Vec::new();
        let mut procs = Vec::new();
        let mut pids = r.pids;
        pids.sort_unstable();
        pids.dedup();
        pids.truncate(MAX_PIDS);
        let deadline = monotonic_ns() + duration.as_nanos() as u64;
        let mut channel = channel;
        for pid in pids {
            let mut t = TracedProcess {
                pid,
                ..Default::default()
            };
            match open_one(&mut channel, pid, deadline) {
                Ok((key, window_id)) => {
                    t.window_id = Some(window_id);
                    procs.push(Proc {
                        pid,
                        key: Some(key),
                        window_id,
                        ended: false,
                    });
                }
                Err((state, detail)) => {
                    t.state = Some(state);
                    t.detail = Some(detail);
                }
            }
            traced.push(t);
        }
        // The queue is empty: the first message always fits.
        if r.out.try_send(Streamed::Opened(traced)).is_err() || procs.is_empty() {
            if let Ok(c) = channel {
                for p in &procs {
                    c.close(p.pid, p.key, p.window_id);
                }
            }
            let _ = r.out.try_send(Streamed::Done(StreamEnd {
                closed: true,
                ..Default::default()
            }));
            return;
        }
        self.open.push(Stream {
            procs,
            out: r.out,
            end: r.end,
            give_up: Instant::now() + duration + CLOSE_GRACE,
            ended_early: false,
            sent: 0,
            dropped: 0,
        });
    }

    /// Hands `item` to the stream whose window it names; false: none does.
    pub fn offer(&mut self, item: &[u8]) -> bool {
        let mut taken = false;
        aggregate::apply(item, |tgid, window_id| {
            let s = self.open.iter_mut().find(|s| {
                s.procs
                    .iter()
                    .any(|p| p.pid == tgid && p.window_id == window_id)
            })?;
            taken = true;
            s.send(item);
            s.procs
                .iter_mut()
                .find(|p| p.pid == tgid && p.window_id == window_id)
        });
        taken
    }

    /// Ends the windows of clients that asked, and closes and answers the streams that are
    /// over (every one with `force`).
    pub fn tick(&mut self, channel: Option<&mut Channel>, force: bool) {
        let Some(channel) = channel else {
            self.open.clear();
            return;
        };
        let now = Instant::now();
        for s in &mut self.open {
            if !s.ended_early && (s.end.load(Ordering::Relaxed) || s.out.is_closed()) {
                s.ended_early = true;
                s.give_up = s.give_up.min(now + CLOSE_GRACE);
                for p in &s.procs {
                    if let Some(key) = p.key {
                        channel.end_early(key, p.window_id);
                    }
                }
            }
        }
        let (over, keep): (Vec<Stream>, Vec<Stream>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|s| force || s.over(now));
        self.open = keep;
        for s in over {
            for p in &s.procs {
                channel.close(p.pid, p.key, p.window_id);
            }
            // The slot kept free by `send`.
            let _ = s.out.try_send(Streamed::Done(StreamEnd {
                entries: s.sent,
                entries_dropped: s.dropped,
                closed: s.procs.iter().all(|p| p.ended),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_common::{CuptiEventHeader, cupti_event};

    fn entry(tgid: u32, window_id: u64, state: Option<u32>) -> Vec<u8> {
        let h = CuptiEventHeader {
            what: if state.is_some() {
                cupti_event::WINDOW
            } else {
                cupti_event::BATCH
            },
            tgid,
            n: 0,
            partial: 0,
            window_id,
        };
        let mut b = bytes_of(&h);
        if let Some(state) = state {
            b.extend(bytes_of(&CuptiWindowEvent {
                state,
                ..Default::default()
            }));
        }
        b
    }

    fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
        // SAFETY: T is a repr(C) struct of integers; its bytes are readable.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn stream(out: Sender<Streamed>, windows: &[(u32, u64)]) -> Stream {
        Stream {
            procs: windows
                .iter()
                .map(|&(pid, window_id)| Proc {
                    pid,
                    key: None,
                    window_id,
                    ended: false,
                })
                .collect(),
            out,
            end: Arc::default(),
            give_up: Instant::now() + Duration::from_secs(60),
            ended_early: false,
            sent: 0,
            dropped: 0,
        }
    }

    /// Entries reach the stream of their (process, window) only, bytes unchanged; a full
    /// queue counts what it refuses and keeps the last slot for the end; the stream is over
    /// once every library closed its window.
    #[test]
    fn entries_go_to_their_stream_and_a_full_queue_counts_its_drops() {
        let (tx1, mut rx1) = tokio::sync::mpsc::channel(4);
        let (tx2, mut rx2) = tokio::sync::mpsc::channel(QUEUE_ENTRIES);
        let mut s = Streams::default();
        s.open.push(stream(tx1, &[(10, 1)]));
        s.open.push(stream(tx2, &[(20, 2), (21, 3)]));
        assert!(!s.offer(&entry(10, 2, None)), "another window of pid 10");
        assert!(!s.offer(&entry(30, 1, None)), "no stream's process");
        for _ in 0..5 {
            assert!(s.offer(&entry(10, 1, None)));
        }
        let e = entry(21, 3, Some(cupti_window_state::OPENED));
        assert!(s.offer(&e));
        assert_eq!((s.open[0].sent, s.open[0].dropped), (3, 2));
        match rx2.try_recv() {
            Ok(Streamed::Entry(b)) => assert_eq!(b, e),
            other => panic!("{other:?}"),
        }
        for (pid, w) in [(20, 2), (21, 3)] {
            assert!(!s.open[1].over(Instant::now()));
            s.offer(&entry(pid, w, Some(cupti_window_state::CLOSED)));
        }
        assert!(s.open[1].over(Instant::now()));
        assert!(!s.open[0].over(Instant::now()));
        // The first stream's client went away: over too.
        rx1.close();
        assert!(s.open[0].over(Instant::now()));
        for _ in 0..3 {
            assert!(matches!(rx1.try_recv(), Ok(Streamed::Entry(_))));
        }
    }
}
