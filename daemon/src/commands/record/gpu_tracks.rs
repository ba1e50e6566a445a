//! What the GPU ran, on tracks of its own beside the host's (issue 42): the kernels, copies
//! and memsets that libethand_cupti.so records inside the tree's injected processes, for the
//! recording's length. The recording opens each process's window itself, through the CUPTI
//! directory's channel (`gpu_activity::Channel`); with the daemon running, the daemon owns
//! that directory, and the recording asks it to open the windows and stream their entries
//! over the local API instead (`serve/gpu_trace.rs`): one decoder and one writer either way
//! (docs/record.md).
//!
//! Times: CUPTI's clock, mapped to CLOCK_MONOTONIC by the clock pair the library read when
//! its window opened (records are written as they come, before the closing pair exists; the
//! two clocks drift apart by microseconds over minutes). Tracks: one per process, device and
//! stream ("GPU d stream s"), and a further lane where work overlapped the lane's last (a
//! CUDA graph's parallel branches report their graph's stream).
use std::{
    collections::{BTreeSet, HashMap},
    io,
    path::Path,
    time::{Duration, Instant},
};

use aya::Ebpf;
use ethand_common::{
    CuptiRec, CuptiWindowEvent, cupti_close_reason, cupti_rec_kind, cupti_window_state,
};
use ethand_snapshot::kernels::{ActivityState, CopyKind, KernelClass, MemoryKind};
use ethand_userspace_probes::cupti::ProcessKey;
use serde_json::{Value, json};

use super::daemon_stream::{Incoming, TraceStream};
use super::launch_index::{Found, LaunchIndex};
use super::trace::{GpuWork, LaunchLink, TraceEvent, TraceWriter, launch_flow};
use crate::pipeline::{
    gpu_activity::{
        Channel, ChannelError, CuptiSink, MAX_NAMES, StreamEnd, apply_cupti_event, closed_by,
        cut_short, maps_a_library, name_text, open_window, window_ended,
    },
    procinfo::monotonic_ns,
    reader::ReaderHandle,
};

/// Processes of the tree recorded at most (as a snapshot's).
const MAX_PIDS: usize = crate::pipeline::gpu_activity::MAX_PIDS;
/// Records held while a process's clock pair has not come yet (it comes first: these are
/// only for a library that sends out of order).
const MAX_UNMAPPED: usize = 100_000;
/// GPU tracks (lanes of a device's stream) in one recording, at most.
const MAX_TRACKS: u32 = 4096;
/// How long the end of the recording waits for the libraries' last records.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// Through the daemon: its collection rounds (a second at the defaults) come between the
/// end asked for, the libraries' last records and its `done`.
const DAEMON_CLOSE_GRACE: Duration = Duration::from_secs(8);

/// Where the windows' entries come from.
enum Source {
    /// The recording's own channel (no daemon owns the CUPTI directory).
    Own(Box<Channel>),
    /// The running daemon's stream, and how it ended (`done`, or why it broke off).
    Daemon {
        stream: TraceStream,
        socket: std::path::PathBuf,
        end: Option<StreamEnd>,
        broken: Option<String>,
    },
}

impl Source {
    /// Every entry that arrived, to `each`.
    fn drain(&mut self, mut each: impl FnMut(&[u8])) {
        match self {
            Self::Own(c) => c.drain(each),
            Self::Daemon {
                stream,
                end,
                broken,
                ..
            } => {
                while let Ok(item) = stream.incoming.try_recv() {
                    match item {
                        Incoming::Entry(b) => each(&b),
                        Incoming::Done(e) => *end = Some(e),
                        Incoming::Broken(why) => *broken = Some(why),
                    }
                }
            }
        }
    }

    /// Whether nothing more will come (the daemon's stream ended).
    fn finished(&self) -> bool {
        match self {
            Self::Own(_) => false,
            Self::Daemon { end, broken, .. } => end.is_some() || broken.is_some(),
        }
    }
}

/// One recorded process's window.
struct Proc {
    pid: u32,
    key: Option<ProcessKey>,
    window_id: u64,
    /// Kernel names by id: the name CUPTI gave and, where it is a mangled C++ name, its
    /// demangling (by the reader, as the process's owner).
    names: HashMap<u32, (String, Option<String>)>,
    /// Names come in since the last demangling.
    fresh: Vec<u32>,
    /// CUPTI's clock minus CLOCK_MONOTONIC, from the opening pair.
    offset: Option<i128>,
    recs: Vec<CuptiRec>,
    /// Records that reached the recording, of every kind (against what the library says
    /// it handed over: the ring buffers' losses).
    received: u64,
    opened: Option<CuptiWindowEvent>,
    /// CLOSED, REFUSED or FAILED.
    ended: Option<CuptiWindowEvent>,
    partial: u64,
    kernels: u64,
    copies: u64,
    memsets: u64,
    /// Syncs: the host's waits, drawn by its runtime calls on the thread's track.
    syncs: u64,
    /// Records with no GPU time (CUPTI had no timestamp), of a kind not known, or past the
    /// bound on tracks.
    not_drawn: u64,
    /// Records that came before the clock pair, past what is held.
    unmapped: u64,
    /// Kernels joined to their launch call; held by calls of two threads at once; held by
    /// none (launched before the recording, or a graph's); with no queued time.
    joined: u64,
    ambiguous: u64,
    without_launch: u64,
    without_queued: u64,
}

impl Proc {
    fn new(pid: u32, key: Option<ProcessKey>, window_id: u64) -> Self {
        Self {
            pid,
            key,
            window_id,
            names: HashMap::new(),
            fresh: Vec::new(),
            offset: None,
            recs: Vec::new(),
            received: 0,
            opened: None,
            ended: None,
            partial: 0,
            kernels: 0,
            copies: 0,
            memsets: 0,
            syncs: 0,
            not_drawn: 0,
            unmapped: 0,
            joined: 0,
            ambiguous: 0,
            without_launch: 0,
            without_queued: 0,
        }
    }
}

impl CuptiSink for Proc {
    fn partial(&mut self) {
        self.partial += 1;
    }
    fn records(&mut self, recs: &[CuptiRec]) {
        self.received += recs.len() as u64;
        for r in recs {
            if self.offset.is_none() && self.recs.len() >= MAX_UNMAPPED {
                self.unmapped += 1;
            } else {
                self.recs.push(*r);
            }
        }
    }
    fn name(&mut self, id: u32, bytes: &[u8]) {
        if self.names.len() >= MAX_NAMES && !self.names.contains_key(&id) {
            return;
        }
        self.names.insert(id, (name_text(bytes), None));
        self.fresh.push(id);
    }
    fn event(&mut self, e: CuptiWindowEvent) {
        match e.state {
            cupti_window_state::OPENED => {
                self.offset = Some(i128::from(e.clock_cupti) - i128::from(e.clock_mono));
                self.opened = Some(e);
            }
            cupti_window_state::CLOSED
            | cupti_window_state::REFUSED
            | cupti_window_state::FAILED => self.ended = Some(e),
            _ => {}
        }
    }
}

/// Where GPU work goes: a lane of a process's device and stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LaneKey {
    pid: u32,
    device: u32,
    stream: u32,
}

pub(super) struct GpuTracks {
    source: Option<Source>,
    procs: Vec<Proc>,
    /// Per (process, device, stream): each lane's track index and the end of its last work.
    lanes: HashMap<LaneKey, Vec<(u32, u64)>>,
    next_track: u32,
    /// What the summary says of processes not recorded, and why none were.
    notes: Vec<Value>,
    reader: ReaderHandle,
}

impl GpuTracks {
    /// Opens a window, until `deadline` after now, in every process of `tree` that maps the
    /// library; `dir`: `gpu.cupti_dir` (None: off); `socket`: the daemon's, asked when it
    /// owns `dir`. Why nothing is recorded goes to `warnings`.
    pub(super) fn start(
        ebpf: &mut Ebpf,
        (dir, socket): (Option<&Path>, &Path),
        tree: &BTreeSet<u32>,
        duration: Duration,
        reader: ReaderHandle,
        warnings: &mut Vec<String>,
    ) -> Self {
        let mut me = Self {
            source: None,
            procs: Vec::new(),
            lanes: HashMap::new(),
            next_track: 0,
            notes: Vec::new(),
            reader,
        };
        // Nothing installed or probed for a tree that never loaded the library.
        if !tree.iter().take(MAX_PIDS).any(|&p| maps_a_library(p)) {
            me.notes
                .push(json!({"unavailable": "no process of the tree maps libethand_cupti.so"}));
            return me;
        }
        let Some(dir) = dir else {
            me.unavailable(warnings, "gpu.cupti_dir is empty".into());
            return me;
        };
        let mut channel = match Channel::new(ebpf, dir) {
            Ok(c) => c,
            Err(ChannelError::Owned(e)) => {
                me.through_daemon(socket, tree, duration, warnings, &e);
                return me;
            }
            Err(ChannelError::Failed(e)) => {
                me.unavailable(warnings, e);
                return me;
            }
        };
        let deadline = monotonic_ns() + duration.as_nanos() as u64;
        for &pid in tree.iter().take(MAX_PIDS) {
            let not = |state: ActivityState, detail: String| json!({"pid": pid, "state": state, "detail": detail});
            match open_window(&mut channel, pid, deadline, u64::from(u32::MAX)) {
                Ok((key, window_id)) => me.procs.push(Proc::new(pid, Some(key), window_id)),
                // Not a CUDA process, or one started without the library: not listed.
                Err((ActivityState::NotInjected, _)) => {}
                Err((state, detail)) => me.notes.push(not(state, detail)),
            }
        }
        if me.procs.is_empty() {
            warnings.push(format!(
                "GPU tracks not recorded: no process of the tree was started with CUDA_INJECTION64_PATH={}",
                channel.library_path().display()
            ));
        }
        me.source = Some(Source::Own(Box::new(channel)));
        me
    }

    /// The daemon owns the CUPTI directory (`owned` says so): it opens the windows and
    /// streams their entries.
    fn through_daemon(
        &mut self,
        socket: &Path,
        tree: &BTreeSet<u32>,
        duration: Duration,
        warnings: &mut Vec<String>,
        owned: &str,
    ) {
        let pids: Vec<u32> = tree
            .iter()
            .copied()
            .filter(|&p| maps_a_library(p))
            .take(MAX_PIDS)
            .collect();
        let (traced, stream) = match TraceStream::open(socket, &pids, duration) {
            Ok(t) => t,
            Err(e) => {
                self.unavailable(warnings, format!("{owned}; asking that daemon: {e}"));
                return;
            }
        };
        for t in traced {
            match (t.window_id, t.state) {
                (Some(w), _) => self.procs.push(Proc::new(t.pid, None, w)),
                // Not a CUDA process, or one started without the library: not listed.
                (None, Some(ActivityState::NotInjected)) => {}
                (None, state) => self
                    .notes
                    .push(json!({"pid": t.pid, "state": state, "detail": t.detail})),
            }
        }
        if self.procs.is_empty() {
            warnings.push(
                "GPU tracks not recorded: the daemon opened no window (no process of the tree was started with its libethand_cupti.so)".into(),
            );
        } else {
            eprintln!(
                "ethand: GPU tracks through the running daemon ({}): {} process(es)",
                socket.display(),
                self.procs.len()
            );
        }
        self.source = Some(Source::Daemon {
            stream,
            socket: socket.to_path_buf(),
            end: None,
            broken: None,
        });
    }

    /// Whether any window is open (the recording then keeps its launch calls).
    pub(super) fn recording(&self) -> bool {
        !self.procs.is_empty()
    }

    fn unavailable(&mut self, warnings: &mut Vec<String>, why: String) {
        eprintln!("ethand: warning: GPU tracks not recorded: {why}");
        warnings.push(format!("GPU tracks not recorded: {why}"));
        self.notes.push(json!({"unavailable": why}));
    }

    /// Takes what the libraries handed over and writes it.
    pub(super) fn write(&mut self, tw: &mut TraceWriter) -> io::Result<()> {
        let Some(source) = self.source.as_mut() else {
            return Ok(());
        };
        let procs = &mut self.procs;
        source.drain(|item| {
            apply_cupti_event(item, |tgid, window_id| {
                procs
                    .iter_mut()
                    .find(|p| p.pid == tgid && p.window_id == window_id)
            });
        });
        for i in 0..self.procs.len() {
            self.demangle(i);
            if self.procs[i].offset.is_some() {
                let recs = std::mem::take(&mut self.procs[i].recs);
                for r in &recs {
                    self.emit(tw, i, r)?;
                }
            }
        }
        Ok(())
    }

    /// The names come in since the last round, demangled by the reader as their owner.
    fn demangle(&mut self, i: usize) {
        let p = &mut self.procs[i];
        if p.fresh.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut p.fresh);
        let raw: Vec<String> = ids.iter().map(|id| p.names[id].0.clone()).collect();
        let demangled = self.reader.demangle(p.pid, &raw);
        for (id, d) in ids.into_iter().zip(demangled) {
            if let Some(n) = p.names.get_mut(&id) {
                n.1 = d;
            }
        }
    }

    /// A lane of `key` free at `start`: its track index (a new track, announced to the
    /// outputs, where none is).
    fn lane(
        &mut self,
        tw: &mut TraceWriter,
        key: LaneKey,
        start: u64,
        end: u64,
    ) -> io::Result<Option<u32>> {
        let lanes = self.lanes.entry(key).or_default();
        if let Some(l) = lanes.iter_mut().find(|(_, e)| *e <= start) {
            l.1 = l.1.max(end);
            return Ok(Some(l.0));
        }
        // The streams are the process's to make: past the bound, work goes undrawn.
        if self.next_track >= MAX_TRACKS {
            return Ok(None);
        }
        let n = lanes.len();
        let track = self.next_track;
        self.next_track += 1;
        lanes.push((track, end));
        let mut label = format!("GPU {} stream {}", key.device, key.stream);
        if n > 0 {
            label.push_str(&format!(" ({})", n + 1));
        }
        tw.gpu_track(key.pid, track, &label)?;
        Ok(Some(track))
    }

    fn emit(&mut self, tw: &mut TraceWriter, i: usize, r: &CuptiRec) -> io::Result<()> {
        let p = &mut self.procs[i];
        let offset = p.offset.expect("mapped");
        if r.kind == cupti_rec_kind::SYNC {
            p.syncs += 1;
            return Ok(());
        }
        if r.start == 0 || r.end < r.start {
            p.not_drawn += 1;
            return Ok(());
        }
        let start = u64::try_from(i128::from(r.start) - offset).unwrap_or(0);
        let dur = r.end - r.start;
        let what = match r.kind {
            cupti_rec_kind::KERNEL => {
                p.kernels += 1;
                GpuWork::Kernel {
                    name_id: r.name_id,
                    grid: r.grid,
                    block: r.block,
                }
            }
            cupti_rec_kind::MEMCPY => {
                p.copies += 1;
                GpuWork::Copy {
                    kind: CopyKind::from_cupti(r.copy_kind),
                    src: MemoryKind::from_cupti(r.src_kind),
                    dst: MemoryKind::from_cupti(r.dst_kind),
                    bytes: r.bytes,
                }
            }
            cupti_rec_kind::MEMSET => {
                p.memsets += 1;
                GpuWork::Memset { bytes: r.bytes }
            }
            _ => {
                p.not_drawn += 1;
                return Ok(());
            }
        };
        let pid = p.pid;
        let launch = match what {
            GpuWork::Kernel { .. } => link(p, tw.launches.as_ref(), r.queued, offset),
            _ => None,
        };
        let key = LaneKey {
            pid,
            device: r.device,
            stream: r.stream,
        };
        let Some(track) = self.lane(tw, key, start, start + dur)? else {
            self.procs[i].not_drawn += 1;
            return Ok(());
        };
        let p = &self.procs[i];
        let fallback;
        let (name, demangled) = match what {
            GpuWork::Kernel { name_id, .. } => match p.names.get(&name_id) {
                Some((n, d)) => (n.as_str(), d.as_deref()),
                None => {
                    fallback = format!("kernel #{name_id}");
                    (fallback.as_str(), None)
                }
            },
            GpuWork::Copy { kind, .. } => (kind.as_str(), None),
            GpuWork::Memset { .. } => ("memset", None),
        };
        let class = match what {
            GpuWork::Kernel { .. } => Some(KernelClass::of(name)),
            _ => None,
        };
        tw.emit(&TraceEvent::GpuActivity {
            pid,
            track,
            what,
            name,
            demangled,
            class,
            device: r.device,
            stream: r.stream,
            correlation: r.correlation,
            start,
            dur,
            launch,
        })
    }

    /// Ends every window (the libraries flush what they hold), waits up to the grace for
    /// their last records, writes them; what the summary says.
    pub(super) fn finish(&mut self, tw: &mut TraceWriter) -> io::Result<Value> {
        let grace = match self.source.as_mut() {
            Some(Source::Own(c)) => {
                for p in &self.procs {
                    if let Some(key) = p.key {
                        c.end_early(key, p.window_id);
                    }
                }
                CLOSE_GRACE
            }
            Some(Source::Daemon { stream, .. }) => {
                stream.end();
                DAEMON_CLOSE_GRACE
            }
            None => Duration::ZERO,
        };
        let until = Instant::now() + grace;
        loop {
            self.write(tw)?;
            let waiting = match &self.source {
                // The daemon's `done` comes after the libraries' last records.
                Some(s @ Source::Daemon { .. }) => !s.finished(),
                _ => self
                    .procs
                    .iter()
                    .any(|p| p.opened.is_some() && p.ended.is_none()),
            };
            if !waiting || Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match self.source.take() {
            Some(Source::Own(mut c)) => {
                for p in &self.procs {
                    c.close(p.pid, p.key, p.window_id);
                }
            }
            Some(Source::Daemon {
                socket,
                end,
                broken,
                ..
            }) => self.notes.push(json!({
                "through_daemon": socket,
                // Entries the daemon's queue refused (the recording read too slowly).
                "entries_dropped_by_daemon": end.map(|e| e.entries_dropped),
                "stream_broken": broken,
            })),
            None => {}
        }
        let mut processes: Vec<Value> = self.procs.iter().map(summary).collect();
        processes.append(&mut self.notes);
        Ok(json!(processes))
    }
}

/// The launch call of a kernel queued at `queued` (CUPTI's clock; 0: unknown), counted.
fn link(
    p: &mut Proc,
    index: Option<&LaunchIndex>,
    queued: u64,
    offset: i128,
) -> Option<LaunchLink> {
    if queued == 0 {
        p.without_queued += 1;
        return None;
    }
    let q = u64::try_from(i128::from(queued) - offset).ok()?;
    match index?.find(p.pid, q) {
        Found::One { tid, start } => {
            p.joined += 1;
            Some(LaunchLink {
                tid,
                queued: q,
                flow: launch_flow(tid, start),
            })
        }
        Found::Ambiguous => {
            p.ambiguous += 1;
            None
        }
        Found::None => {
            p.without_launch += 1;
            None
        }
    }
}

/// A recorded process's line in the summary.
fn summary(p: &Proc) -> Value {
    let (state, detail) = match (&p.opened, &p.ended) {
        (_, Some(e)) if e.state != cupti_window_state::CLOSED => {
            let (state, detail) = window_ended(e);
            (state, Some(detail))
        }
        (Some(o), Some(e)) if e.reason == cupti_close_reason::ANOTHER_WINDOW => (
            ActivityState::Recorded,
            Some(cut_short(e.clock_mono.saturating_sub(o.clock_mono))),
        ),
        (Some(_), _) => (ActivityState::Recorded, None),
        (None, _) => (ActivityState::NoAnswer, None),
    };
    let closed = p.ended.filter(|e| e.state == cupti_window_state::CLOSED);
    json!({
        "pid": p.pid,
        "state": state,
        "detail": detail,
        "cupti_version": p.opened.map(|e| e.cupti_version),
        "kernels": p.kernels,
        "copies": p.copies,
        "memsets": p.memsets,
        "syncs": p.syncs,
        "records_not_drawn": p.not_drawn,
        "records_before_the_clock": p.unmapped,
        "entries_partly_read": p.partial,
        // Kernels joined to the launch call that made them (a flow from the call's slice
        // to the kernel's), and why the others are not.
        "kernels_joined_to_their_launch": p.joined,
        "kernels_ambiguous": p.ambiguous,
        "kernels_without_launch": p.without_launch,
        "kernels_without_queued_time": p.without_queued,
        // Known once the window closed: absent before, never 0 for unknown.
        "records_dropped_by_cupti": closed.map(|e| e.dropped),
        // Handed over by the library but never read here: a ring buffer that filled
        // between drains (the daemon's, drained once a round, through its stream).
        "records_lost_by_ethand": closed.map(|e| e.records.saturating_sub(p.received)),
        // deadline, asked (the recording ended), max_records or another_window.
        "window_closed_by": closed.map(|e| closed_by(&e)),
    })
}
