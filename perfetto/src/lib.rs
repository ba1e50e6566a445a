//! A streaming writer of Perfetto's native trace format: a `Trace` proto, i.e. a stream of
//! `TracePacket`s (protos/perfetto/trace/trace_packet.proto), as the Perfetto UI and
//! trace_processor read fastest.
//!
//! What it writes:
//! - tracks: one per process, one per thread (under its process), and named child or global
//!   tracks ([`TraceWriter::track`]); each `TrackDescriptor` once, before its first event;
//! - slices as `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pairs and instants, with event names,
//!   categories, argument names and string argument values interned (an `iid` per distinct
//!   string, its `InternedData` written once, before its first use);
//! - timestamps delta-encoded on the main sequence (a sequence-scoped incremental clock, 64,
//!   whose snapshot ties it to `CLOCK_MONOTONIC`), so an event costs a byte or two of time;
//! - packets deflate-compressed in chunks (`compressed_packets`, zlib, each under 512 KiB as
//!   Perfetto asks), so memory holds one chunk, never the trace.
//!
//! Order: callers report a slice when it ends (the kernel emits a slice at its end), so the
//! writer reorders in a bounded window ([`Options::reorder_window_ns`]): an event leaves the
//! window, in timestamp order, once something [`Options::reorder_window_ns`] later has
//! arrived. A slice that began before what already left (longer than the window: a thread
//! blocked for seconds) is "late": late slices are kept apart (at most
//! [`Options::max_late`]), sorted, and written as a sequence of their own with absolute
//! `CLOCK_MONOTONIC` timestamps and names written out (no interning): every sequence is in
//! timestamp order, as trace_processor's import expects, and memory stays bounded. The
//! window itself holds at most [`Options::max_pending`] events; past that the oldest leave
//! early (later arrivals before them become late, nothing is lost).
//!
//! Nesting on one track is the caller's: slices on a track nest or follow each other (a
//! runtime call containing its syscalls), never partly overlap (give overlapping work tracks
//! of its own). At equal timestamps ends come before instants before begins, the inner slice
//! ending first and the outer beginning first.
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};

use flate2::Compression;
use flate2::write::ZlibEncoder;

#[cfg(feature = "decode")]
pub mod decode;
mod proto;
mod ring;

pub use ring::{RingOptions, RingStats};
#[cfg(test)]
mod tests;

/// A track's uuid.
pub type TrackId = u64;

/// Clock ids (protos/perfetto/common/builtin_clock.proto, clock_snapshot.proto).
const CLOCK_MONOTONIC: u64 = 3;
/// The main sequence's incremental clock: sequence-scoped ids start at 64.
const CLOCK_INCREMENTAL: u64 = 64;

/// TracePacket.sequence_flags.
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u64 = 2;

/// TrackEvent.Type.
const TYPE_SLICE_BEGIN: u64 = 1;
const TYPE_SLICE_END: u64 = 2;
const TYPE_INSTANT: u64 = 3;

/// The sequence of the incremental clock and the interned strings.
const MAIN_SEQUENCE: u64 = 1;

/// How the writer trades memory for order and size.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How long after an event's timestamp the writer waits for earlier ones (ns).
    pub reorder_window_ns: u64,
    /// Most events held in the window; past it the oldest leave early.
    pub max_pending: usize,
    /// Most late slices held before they are written as a sequence of their own.
    pub max_late: usize,
    /// Uncompressed bytes per compressed chunk (Perfetto: each compressed packet under
    /// 512 KiB; text-like packets compress five to ten times).
    pub chunk_bytes: usize,
    /// zlib level, 0-9.
    pub level: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            // The recorder drains its ring buffer every 20 ms and symbolizes samples within
            // a few drains: a quarter second covers both.
            reorder_window_ns: 250_000_000,
            // About 20 MB at ~170 bytes an event (400,000 events a second in the window); a
            // faster stream leaves early (more late slices, nothing lost).
            max_pending: 100_000,
            max_late: 1 << 16,
            chunk_bytes: 1 << 20,
            level: 6,
        }
    }
}

/// An argument of a slice or instant (a `DebugAnnotation`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg<'a> {
    Int(&'a str, i64),
    Uint(&'a str, u64),
    Bool(&'a str, bool),
    Double(&'a str, f64),
    /// Interned: a value that repeats (a stack, a library) costs its iid.
    Str(&'a str, &'a str),
}

/// What the writer did, for the caller's summary and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Slices and instants written.
    pub events: u64,
    /// Packets written (before compression).
    pub packets: u64,
    /// Bytes of packets before compression.
    pub raw_bytes: u64,
    /// Bytes written to the output.
    pub written_bytes: u64,
    /// Slices that began before the window had moved past them, written on late sequences.
    pub late_slices: u64,
    /// Sequences written (the main one and one per batch of late slices).
    pub sequences: u64,
    /// Events that left the window early because it was full.
    pub forced: u64,
    /// Most events in the window at once.
    pub max_pending: u64,
}

/// A stored argument: its name and string values as iids.
#[derive(Clone, Copy, Debug)]
enum Val {
    Int(i64),
    Uint(u64),
    Bool(bool),
    Double(f64),
    Str(u64),
}

#[derive(Debug)]
struct Event {
    name: u64,
    category: u64,
    args: Box<[(u64, Val)]>,
    flow: Flow,
}

/// A slice's part in a flow (an arrow between two slices, as from a launch call to the
/// kernel it made): it starts the flow `id` or ends it. The two ends are matched by `id`
/// alone, whichever comes first; an id nobody ends draws nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flow {
    #[default]
    None,
    /// `TrackEvent.flow_ids`.
    Out(u64),
    /// `TrackEvent.terminating_flow_ids`.
    In(u64),
}

impl Flow {
    fn write(self, ev: &mut Vec<u8>) {
        match self {
            Self::None => {}
            Self::Out(id) => proto::fixed64(ev, 47, id),
            Self::In(id) => proto::fixed64(ev, 48, id),
        }
    }
}

/// Ends, then instants, then begins at one timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    End,
    Instant,
    Begin,
}

impl Phase {
    /// TrackEvent.Type.
    fn event_type(self) -> u64 {
        match self {
            Self::Begin => TYPE_SLICE_BEGIN,
            Self::End => TYPE_SLICE_END,
            Self::Instant => TYPE_INSTANT,
        }
    }
}

/// What sits in the window: a slice's begin (its end is queued when the begin leaves), a
/// slice's end, or an instant.
#[derive(Debug)]
struct Pending {
    ts: u64,
    phase: Phase,
    /// At equal (ts, phase): begins of longer slices first, ends of later-begun slices first.
    tiebreak: u64,
    /// Arrival order, last key: equal events keep it.
    order: u64,
    /// The slice's end (for a begin) or start (for an end).
    other: u64,
    event: Option<Event>,
    track: TrackId,
}

impl Pending {
    /// The end of the slice whose begin this is.
    fn end(&self) -> Self {
        Self {
            ts: self.other,
            phase: Phase::End,
            tiebreak: u64::MAX - self.ts,
            order: self.order,
            other: self.ts,
            event: None,
            track: self.track,
        }
    }

    fn key(&self) -> (u64, Phase, u64, u64) {
        (self.ts, self.phase, self.tiebreak, self.order)
    }
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key().cmp(&o.key())
    }
}

/// Interned strings of one kind (InternedData field), iids from 1. A string is (re)defined
/// on the sequence before the first event that uses it since the last clear: `emitted` holds
/// the generation (one per clear) each iid was last defined in.
#[derive(Debug)]
struct Table {
    field: u32,
    ids: HashMap<Box<str>, u64, foldhash::fast::RandomState>,
    strings: Vec<Box<str>>,
    emitted: Vec<u32>,
    generation: u32,
    /// Needed since the last InternedData packet: written before the next event.
    fresh: Vec<u64>,
}

impl Table {
    fn new(field: u32) -> Self {
        Self {
            field,
            ids: HashMap::default(),
            strings: Vec::new(),
            emitted: Vec::new(),
            generation: 1,
            fresh: Vec::new(),
        }
    }

    fn intern(&mut self, s: &str) -> u64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        self.strings.push(s.into());
        self.emitted.push(0);
        let id = self.strings.len() as u64;
        self.ids.insert(s.into(), id);
        id
    }

    /// An event about to be written uses `id`.
    fn need(&mut self, id: u64) {
        let g = &mut self.emitted[(id - 1) as usize];
        if *g != self.generation {
            *g = self.generation;
            self.fresh.push(id);
        }
    }

    /// The sequence was cleared: every string is defined again before its next use.
    fn clear(&mut self) {
        self.generation += 1;
        self.fresh.clear();
    }

    fn get(&self, id: u64) -> &str {
        &self.strings[(id - 1) as usize]
    }
}

/// InternedData fields (protos/perfetto/trace/interned_data/interned_data.proto).
const INTERNED_CATEGORIES: u32 = 1;
const INTERNED_NAMES: u32 = 2;
const INTERNED_ARG_NAMES: u32 = 3;
const INTERNED_ARG_STRINGS: u32 = 29;

/// Streams a Perfetto trace to `W`; [`TraceWriter::finish`] writes what is left.
pub struct TraceWriter<W: Write> {
    out: W,
    opts: Options,
    /// Uncompressed packets of the current chunk (each as `Trace.packet`, field 1).
    chunk: Vec<u8>,
    /// Sorted by [`Pending::key`]: most events arrive near the newest, so an insert scans a
    /// few entries from the back and moves few (a heap moved every event through ~18
    /// levels of cache misses).
    window: VecDeque<Pending>,
    late: Vec<Pending>,
    /// The newest timestamp that has arrived (what moves the window).
    newest: u64,
    /// The timestamp of the last event that left the window (main sequence clock).
    last_ts: u64,
    left_any: bool,
    order: u64,
    next_track: TrackId,
    next_sequence: u64,
    /// What the main sequence's incremental clock reads (the last timestamp written on it
    /// since its clock snapshot).
    delta_base: u64,
    names: Table,
    categories: Table,
    arg_names: Table,
    arg_strings: Table,
    /// Every track's descriptor packet: a ring's segment describes them all again.
    descriptors: Vec<Vec<u8>>,
    /// Ring mode: the newest segments kept on disk (see [`ring`]).
    ring: Option<ring::Ring>,
    stats: Stats,
    buf_packet: Vec<u8>,
    buf_event: Vec<u8>,
    buf_arg: Vec<u8>,
}

impl<W: Write> std::fmt::Debug for TraceWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<W: Write> TraceWriter<W> {
    /// Starts the trace: the main sequence's clock (incremental, equal to
    /// `CLOCK_MONOTONIC`, which becomes the trace's clock).
    pub fn new(out: W, opts: Options) -> io::Result<Self> {
        Self::start(out, opts, None)
    }

    /// A ring: the trace is written as segments into `ring.dir`, the oldest dropped once
    /// the newer ones cover [`RingOptions::keep_ns`] (or pass [`RingOptions::max_bytes`]);
    /// [`TraceWriter::finish`] writes the kept ones to `out`, each decodable without those
    /// before it.
    pub fn ring(out: W, opts: Options, ring: RingOptions) -> io::Result<Self> {
        let r = ring::Ring::new(ring)?;
        Self::start(out, opts, Some(r))
    }

    fn start(out: W, opts: Options, ring: Option<ring::Ring>) -> io::Result<Self> {
        let mut w = Self {
            out,
            opts,
            chunk: Vec::with_capacity(opts.chunk_bytes + 4096),
            window: VecDeque::new(),
            late: Vec::new(),
            newest: 0,
            last_ts: 0,
            left_any: false,
            order: 0,
            next_track: 1,
            next_sequence: MAIN_SEQUENCE + 1,
            delta_base: 0,
            names: Table::new(INTERNED_NAMES),
            categories: Table::new(INTERNED_CATEGORIES),
            arg_names: Table::new(INTERNED_ARG_NAMES),
            arg_strings: Table::new(INTERNED_ARG_STRINGS),
            descriptors: Vec::new(),
            ring,
            stats: Stats {
                sequences: 1,
                ..Stats::default()
            },
            buf_packet: Vec::new(),
            buf_event: Vec::new(),
            buf_arg: Vec::new(),
        };
        w.clear_main_sequence()?;
        Ok(w)
    }

    /// The main sequence's first packet (and a ring segment's): incremental state cleared,
    /// the clock snapshot, the packet defaults.
    fn clear_main_sequence(&mut self) -> io::Result<()> {
        let mut p = Vec::new();
        proto::uint(&mut p, 10, MAIN_SEQUENCE);
        proto::uint(&mut p, 13, SEQ_INCREMENTAL_STATE_CLEARED);
        proto::boolean(&mut p, 87, true);
        // ClockSnapshot: clock 64 (incremental) and CLOCK_MONOTONIC both read 0 here, i.e.
        // clock 64 is CLOCK_MONOTONIC delta-encoded; CLOCK_MONOTONIC is the trace's clock.
        proto::message(&mut p, 6, |c| {
            proto::message(c, 1, |k| {
                proto::uint(k, 1, CLOCK_INCREMENTAL);
                proto::uint(k, 2, 0);
                proto::boolean(k, 3, true);
            });
            proto::message(c, 1, |k| {
                proto::uint(k, 1, CLOCK_MONOTONIC);
                proto::uint(k, 2, 0);
            });
            proto::uint(c, 2, CLOCK_MONOTONIC);
        });
        // TracePacketDefaults: timestamps on this sequence are clock 64's.
        proto::message(&mut p, 59, |d| proto::uint(d, 58, CLOCK_INCREMENTAL));
        self.delta_base = 0;
        self.packet(&p)
    }

    /// What was written so far (compressed chunks): for a size limit.
    pub fn written_bytes(&self) -> u64 {
        self.stats.written_bytes
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn new_track(&mut self, build: impl FnOnce(&mut Vec<u8>)) -> io::Result<TrackId> {
        let uuid = self.next_track;
        self.next_track += 1;
        let mut p = Vec::new();
        proto::uint(&mut p, 10, MAIN_SEQUENCE);
        proto::message(&mut p, 60, |t| {
            proto::uint(t, 1, uuid);
            build(t);
        });
        self.packet(&p)?;
        self.descriptors.push(p);
        Ok(uuid)
    }

    /// A process's track (its threads' tracks go under it).
    pub fn process_track(&mut self, pid: u32, name: &str) -> io::Result<TrackId> {
        self.new_track(|t| {
            proto::message(t, 3, |d| {
                proto::int(d, 1, i64::from(pid));
                proto::string(d, 6, name);
            });
        })
    }

    /// A thread's track, under its process's.
    pub fn thread_track(
        &mut self,
        process: TrackId,
        pid: u32,
        tid: u32,
        name: &str,
    ) -> io::Result<TrackId> {
        self.new_track(|t| {
            proto::uint(t, 5, process);
            proto::message(t, 4, |d| {
                proto::int(d, 1, i64::from(pid));
                proto::int(d, 2, i64::from(tid));
                proto::string(d, 5, name);
            });
        })
    }

    /// A named track, under `parent` or global; `rank` orders siblings (lower first).
    pub fn track(
        &mut self,
        parent: Option<TrackId>,
        name: &str,
        rank: Option<i32>,
    ) -> io::Result<TrackId> {
        self.new_track(|t| {
            if let Some(p) = parent {
                proto::uint(t, 5, p);
            }
            proto::string(t, 2, name);
            if let Some(r) = rank {
                proto::int(t, 12, i64::from(r));
            }
        })
    }

    fn event(&mut self, name: &str, category: &str, args: &[Arg<'_>]) -> Event {
        let args = args
            .iter()
            .map(|a| match *a {
                Arg::Int(k, v) => (self.arg_names.intern(k), Val::Int(v)),
                Arg::Uint(k, v) => (self.arg_names.intern(k), Val::Uint(v)),
                Arg::Bool(k, v) => (self.arg_names.intern(k), Val::Bool(v)),
                Arg::Double(k, v) => (self.arg_names.intern(k), Val::Double(v)),
                Arg::Str(k, v) => (
                    self.arg_names.intern(k),
                    Val::Str(self.arg_strings.intern(v)),
                ),
            })
            .collect();
        Event {
            name: self.names.intern(name),
            category: self.categories.intern(category),
            args,
            flow: Flow::None,
        }
    }

    /// A slice on `track` from `start_ns` for `dur_ns` (CLOCK_MONOTONIC).
    pub fn slice(
        &mut self,
        track: TrackId,
        name: &str,
        category: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.slice_in_flow(track, name, category, start_ns, dur_ns, args, Flow::None)
    }

    /// A slice with its part in a flow.
    #[allow(clippy::too_many_arguments)]
    pub fn slice_in_flow(
        &mut self,
        track: TrackId,
        name: &str,
        category: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &[Arg<'_>],
        flow: Flow,
    ) -> io::Result<()> {
        let end = start_ns.saturating_add(dur_ns);
        let mut event = self.event(name, category, args);
        event.flow = flow;
        self.stats.events += 1;
        let p = Pending {
            ts: start_ns,
            phase: Phase::Begin,
            tiebreak: u64::MAX - end,
            order: self.next_order(),
            other: end,
            event: Some(event),
            track,
        };
        self.arrive(p, end)
    }

    /// An instant on `track` at `ts_ns`.
    pub fn instant(
        &mut self,
        track: TrackId,
        name: &str,
        category: &str,
        ts_ns: u64,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        let event = self.event(name, category, args);
        self.stats.events += 1;
        let p = Pending {
            ts: ts_ns,
            phase: Phase::Instant,
            tiebreak: 0,
            order: self.next_order(),
            other: ts_ns,
            event: Some(event),
            track,
        };
        self.arrive(p, ts_ns)
    }

    fn next_order(&mut self) -> u64 {
        self.order += 1;
        self.order
    }

    /// Into the window, or among the late ones if the window has moved past its start.
    fn arrive(&mut self, p: Pending, newest: u64) -> io::Result<()> {
        if self.left_any && p.ts < self.last_ts {
            self.stats.late_slices += 1;
            self.late.push(p);
            if self.late.len() >= self.opts.max_late {
                self.write_late()?;
            }
            return Ok(());
        }
        self.insert(p);
        self.stats.max_pending = self.stats.max_pending.max(self.window.len() as u64);
        self.newest = self.newest.max(newest);
        let horizon = self.newest.saturating_sub(self.opts.reorder_window_ns);
        while let Some(first) = self.window.front() {
            let full = self.window.len() > self.opts.max_pending;
            if first.ts > horizon && !full {
                break;
            }
            if full {
                self.stats.forced += 1;
            }
            let first = self.window.pop_front().expect("a front");
            self.leave(first)?;
        }
        Ok(())
    }

    /// Into the sorted window: a short scan from the back (arrivals, near the newest), then
    /// from the front (the end of a short slice whose begin just left), else a binary search.
    fn insert(&mut self, p: Pending) {
        const SCAN: usize = 16;
        let key = p.key();
        let n = self.window.len();
        let mut i = n;
        while i > 0 && n - i < SCAN {
            if self.window[i - 1].key() <= key {
                self.window.insert(i, p);
                return;
            }
            i -= 1;
        }
        let front = i.min(SCAN);
        for j in 0..front {
            if self.window[j].key() > key {
                self.window.insert(j, p);
                return;
            }
        }
        // window[..front] <= key < window[i..]: the first entry above it lies in between.
        let (mut lo, mut hi) = (front, i);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.window[mid].key() <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.window.insert(lo, p);
    }

    /// An event leaves the window: written on the main sequence; a begin queues its end.
    fn leave(&mut self, mut p: Pending) -> io::Result<()> {
        if let Some(r) = self.ring.as_mut()
            && r.due(p.ts)
        {
            self.rotate(&p)?;
        }
        if p.phase != Phase::End
            && let Some(e) = &p.event
        {
            self.names.need(e.name);
            self.categories.need(e.category);
            for &(k, v) in e.args.iter() {
                self.arg_names.need(k);
                if let Val::Str(id) = v {
                    self.arg_strings.need(id);
                }
            }
        }
        if let Some(r) = self.ring.as_mut() {
            r.note(p.ts, p.phase != Phase::End);
        }
        self.write_interned()?;
        // Delta from the previous packet with a timestamp on this sequence.
        let delta = p.ts - self.delta_base;
        self.delta_base = p.ts;
        self.left_any = true;
        self.last_ts = p.ts;
        let ty = p.phase.event_type();
        // Reused buffers: no allocation per event once they have grown.
        let (mut pk, mut ev, mut arg) = (
            std::mem::take(&mut self.buf_packet),
            std::mem::take(&mut self.buf_event),
            std::mem::take(&mut self.buf_arg),
        );
        ev.clear();
        proto::uint(&mut ev, 9, ty);
        proto::uint(&mut ev, 11, p.track);
        if p.phase != Phase::End
            && let Some(e) = &p.event
        {
            proto::uint(&mut ev, 3, e.category);
            proto::uint(&mut ev, 10, e.name);
            for &(k, v) in e.args.iter() {
                arg.clear();
                proto::uint(&mut arg, 1, k);
                match v {
                    Val::Str(id) => proto::uint(&mut arg, 17, id),
                    v => value(&mut arg, v),
                }
                proto::bytes(&mut ev, 4, &arg);
            }
            e.flow.write(&mut ev);
        }
        pk.clear();
        proto::uint(&mut pk, 8, delta);
        proto::uint(&mut pk, 10, MAIN_SEQUENCE);
        proto::uint(&mut pk, 13, SEQ_NEEDS_INCREMENTAL_STATE);
        proto::bytes(&mut pk, 11, &ev);
        let r = self.packet(&pk);
        (self.buf_packet, self.buf_event, self.buf_arg) = (pk, ev, arg);
        r?;
        if p.phase == Phase::Begin {
            // The end keeps what the slice is: a ring segment that starts while it is open
            // begins it again for readers that lack the segment with its begin.
            let mut end = p.end();
            end.event = p.event.take();
            self.insert(end);
        }
        Ok(())
    }

    /// A new ring segment from `ts`: the slices open now (their ends in the window) set
    /// aside as a sequence of their own for the case that the segments before are dropped,
    /// then the main sequence cleared, every track described again, strings defined anew.
    /// `next` is the event that starts it (out of the window already).
    fn rotate(&mut self, next: &Pending) -> io::Result<()> {
        self.flush_chunk()?;
        let ts = next.ts;
        let mut open: Vec<&Pending> = self
            .window
            .iter()
            .chain(std::iter::once(next))
            .filter(|p| p.phase == Phase::End)
            .collect();
        // Begin order: earlier first, the longer (outer) first at one timestamp.
        open.sort_by_key(|p| (p.other, u64::MAX - p.ts, p.order));
        let mut opening = Vec::new();
        if !open.is_empty() {
            let seq = self.next_sequence;
            self.next_sequence += 1;
            for (i, p) in open.iter().enumerate() {
                let pk = self.absolute_packet(
                    p.other,
                    seq,
                    i == 0,
                    Phase::Begin,
                    p.track,
                    p.event.as_ref(),
                );
                proto::bytes(&mut opening, 1, &pk);
            }
        }
        self.ring.as_mut().expect("rotating a ring").next_segment(
            ts,
            opening,
            open.len() as u64,
        )?;
        for t in [
            &mut self.names,
            &mut self.categories,
            &mut self.arg_names,
            &mut self.arg_strings,
        ] {
            t.clear();
        }
        self.clear_main_sequence()?;
        let descriptors = std::mem::take(&mut self.descriptors);
        for d in &descriptors {
            self.packet(d)?;
        }
        self.descriptors = descriptors;
        Ok(())
    }

    /// A packet on a sequence of its own: absolute CLOCK_MONOTONIC time, names written out.
    fn absolute_packet(
        &self,
        ts: u64,
        seq: u64,
        first: bool,
        phase: Phase,
        track: TrackId,
        event: Option<&Event>,
    ) -> Vec<u8> {
        let mut pk = Vec::with_capacity(96);
        proto::uint(&mut pk, 8, ts);
        proto::uint(&mut pk, 10, seq);
        if first {
            proto::uint(&mut pk, 13, SEQ_INCREMENTAL_STATE_CLEARED);
            proto::boolean(&mut pk, 87, true);
        }
        proto::uint(&mut pk, 58, CLOCK_MONOTONIC);
        let ty = phase.event_type();
        proto::message(&mut pk, 11, |e| {
            proto::uint(e, 9, ty);
            proto::uint(e, 11, track);
            if phase != Phase::End
                && let Some(ev) = event
            {
                proto::string(e, 22, self.categories.get(ev.category));
                proto::string(e, 23, self.names.get(ev.name));
                for &(k, v) in ev.args.iter() {
                    proto::message(e, 4, |a| {
                        proto::string(a, 10, self.arg_names.get(k));
                        match v {
                            Val::Str(id) => proto::string(a, 6, self.arg_strings.get(id)),
                            v => value(a, v),
                        }
                    });
                }
                ev.flow.write(e);
            }
        });
        pk
    }

    /// Strings interned since the last InternedData packet, before the event that uses them.
    fn write_interned(&mut self) -> io::Result<()> {
        let tables = [
            &mut self.names,
            &mut self.categories,
            &mut self.arg_names,
            &mut self.arg_strings,
        ];
        if tables.iter().all(|t| t.fresh.is_empty()) {
            return Ok(());
        }
        let mut p = Vec::new();
        proto::uint(&mut p, 10, MAIN_SEQUENCE);
        proto::uint(&mut p, 13, SEQ_NEEDS_INCREMENTAL_STATE);
        proto::message(&mut p, 12, |d| {
            for t in tables {
                for id in t.fresh.drain(..) {
                    // EventName/EventCategory/DebugAnnotationName: iid 1, name 2;
                    // InternedString: iid 1, str 2 (bytes): the same encoding.
                    let s = &t.strings[(id - 1) as usize];
                    proto::message(d, t.field, |e| {
                        proto::uint(e, 1, id);
                        proto::string(e, 2, s);
                    });
                }
            }
        });
        self.packet(&p)
    }

    /// The late slices, sorted, as a sequence of their own: absolute CLOCK_MONOTONIC
    /// timestamps, names written out.
    fn write_late(&mut self) -> io::Result<()> {
        if self.late.is_empty() {
            return Ok(());
        }
        let late = std::mem::take(&mut self.late);
        let mut events: Vec<Pending> = Vec::with_capacity(late.len() * 2);
        for p in late {
            if p.phase == Phase::Begin {
                events.push(p.end());
            }
            events.push(p);
        }
        events.sort_unstable();
        let seq = self.next_sequence;
        self.next_sequence += 1;
        self.stats.sequences += 1;
        for (i, p) in events.iter().enumerate() {
            if let Some(r) = self.ring.as_mut() {
                r.note(p.ts, p.phase != Phase::End);
            }
            let pk = self.absolute_packet(p.ts, seq, i == 0, p.phase, p.track, p.event.as_ref());
            self.packet(&pk)?;
        }
        Ok(())
    }

    /// One packet into the chunk; a full chunk is compressed and written.
    fn packet(&mut self, p: &[u8]) -> io::Result<()> {
        proto::bytes(&mut self.chunk, 1, p);
        self.stats.packets += 1;
        self.stats.raw_bytes += p.len() as u64;
        if self.chunk.len() >= self.opts.chunk_bytes {
            self.flush_chunk()?;
        }
        Ok(())
    }

    fn flush_chunk(&mut self) -> io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let mut z = ZlibEncoder::new(
            Vec::with_capacity(self.chunk.len() / 4),
            Compression::new(self.opts.level.min(9)),
        );
        z.write_all(&self.chunk)?;
        let compressed = z.finish()?;
        self.chunk.clear();
        let mut outer = Vec::with_capacity(compressed.len() + 16);
        proto::message(&mut outer, 1, |p| proto::bytes(p, 50, &compressed));
        match self.ring.as_mut() {
            Some(r) => r.write(&outer)?,
            None => self.out.write_all(&outer)?,
        }
        self.stats.written_bytes += outer.len() as u64;
        Ok(())
    }

    /// Everything still in the window and the late slices, the last chunk; returns the
    /// output (not synced) and the figures.
    pub fn finish(mut self) -> io::Result<(W, Stats)> {
        self.stop_rotating(self.newest)?;
        while let Some(p) = self.window.pop_front() {
            self.leave(p)?;
        }
        self.write_late()?;
        self.flush_chunk()?;
        if let Some(r) = self.ring.take() {
            r.assemble(&mut self.out)?;
        }
        self.out.flush()?;
        Ok((self.out, self.stats))
    }

    /// Ring mode: the trace ends at `end_ns` (or its newest event, if later): what is older
    /// than the time kept before it goes, and no segment is started or dropped from now on
    /// (what a summary written next says stays true). Returns what the ring kept and
    /// dropped; None: not a ring. Only the first call drops.
    pub fn stop_rotating(&mut self, end_ns: u64) -> io::Result<Option<RingStats>> {
        let Some(r) = self.ring.as_mut() else {
            return Ok(None);
        };
        if r.stopped() {
            return Ok(Some(r.stats()));
        }
        r.stop(end_ns.max(self.newest))?;
        let st = r.stats();
        // Late slices still held that ended before the kept trace begins go with the
        // segments of their time.
        if st.segments_dropped > 0
            && let Some(from) = st.kept_from_ns
        {
            let before = self.late.len();
            self.late.retain(|p| p.other >= from);
            r.drop_events((before - self.late.len()) as u64);
        }
        Ok(Some(r.stats()))
    }
}

/// A DebugAnnotation's value (not a string).
fn value(a: &mut Vec<u8>, v: Val) {
    match v {
        Val::Bool(b) => proto::boolean(a, 2, b),
        Val::Uint(u) => proto::uint(a, 3, u),
        Val::Int(i) => proto::int(a, 4, i),
        Val::Double(d) => proto::double(a, 5, d),
        Val::Str(_) => unreachable!("strings are written by the caller"),
    }
}
