//! Reads a trace back with Perfetto's own definitions (`perfetto_protos`, compiled from the
//! published .proto files) and checks the rules trace_processor's import relies on; returns
//! the slices and instants with every reference resolved. For tests and the bench only.
//!
//! Checked, each an error naming the packet:
//! - the file is a `Trace`; `compressed_packets` inflate (zlib) to a `Trace` of packets, none
//!   compressed again;
//! - every packet has a sequence id; one that needs incremental state comes after a packet
//!   that cleared it on its sequence;
//! - timestamps resolve (a builtin clock, or a sequence's clock of a `ClockSnapshot`; the
//!   incremental clock as deltas) and never go back within a sequence;
//! - a track is described before its events, its parent before it, and described again (a
//!   ring segment) only as it was;
//! - interned names, categories, argument names and string values are defined on the event's
//!   sequence before the event (since the last clear);
//! - per track, in timestamp order (ends before instants before begins at one timestamp),
//!   every end closes an open slice and nothing is left open.
use std::collections::HashMap;
use std::io::Read as _;

use perfetto_protos::debug_annotation::debug_annotation;
use perfetto_protos::trace_packet::TracePacket;
use perfetto_protos::track_event::track_event;
use protobuf::Message as _;

/// A described track.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Track {
    pub uuid: u64,
    pub parent: Option<u64>,
    pub name: String,
    /// Process tracks: the pid; thread tracks: pid and tid.
    pub pid: Option<i32>,
    pub tid: Option<i32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Uint(u64),
    Bool(bool),
    Double(f64),
    Str(String),
}

/// A slice (begin and end matched) or an instant (`end_ns == None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub track: u64,
    pub name: String,
    pub category: String,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    pub args: Vec<(String, Value)>,
    /// `flow_ids` and `terminating_flow_ids`.
    pub flows_out: Vec<u64>,
    pub flows_in: Vec<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub tracks: HashMap<u64, Track>,
    pub events: Vec<Event>,
    pub packets: usize,
    pub sequences: usize,
    pub compressed_chunks: usize,
}

impl Decoded {
    /// The track's thread (pid, tid), walking up from child tracks.
    pub fn thread_of(&self, mut track: u64) -> Option<(i32, i32)> {
        for _ in 0..64 {
            let t = self.tracks.get(&track)?;
            if let (Some(p), Some(tid)) = (t.pid, t.tid) {
                return Some((p, tid));
            }
            track = t.parent?;
        }
        None
    }
}

#[derive(Default)]
struct Sequence {
    cleared: bool,
    default_clock: Option<u32>,
    /// Clock id -> (value of that clock, CLOCK_MONOTONIC) at the snapshot, incremental?
    clocks: HashMap<u32, (u64, u64, bool)>,
    /// The incremental clock's current value.
    incremental_now: HashMap<u32, u64>,
    last_ts: Option<u64>,
    names: HashMap<u64, String>,
    categories: HashMap<u64, String>,
    arg_names: HashMap<u64, String>,
    arg_strings: HashMap<u64, String>,
}

/// A begin, end or instant, before matching.
struct Raw {
    ts: u64,
    phase: u8,
    index: usize,
    ty: track_event::Type,
    event: Event,
}

const CLOCK_MONOTONIC: u32 = 3;

/// The packets of a `Trace` (field 1, length-delimited), one at a time: a trace of millions
/// of events is never held decoded.
fn packets(bytes: &[u8]) -> impl Iterator<Item = Result<&[u8], String>> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let r = next_packet(bytes, &mut at);
        if r.is_err() {
            at = bytes.len();
        }
        Some(r)
    })
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at).ok_or("a varint runs past the end")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint of more than ten bytes".into())
}

fn next_packet<'a>(bytes: &'a [u8], at: &mut usize) -> Result<&'a [u8], String> {
    let tag = varint(bytes, at)?;
    if tag != (1 << 3 | 2) {
        return Err(format!(
            "not a Trace: field tag {tag} where packets (1) are"
        ));
    }
    let len = usize::try_from(varint(bytes, at)?).map_err(|_| "a huge length")?;
    let end = at
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or("a packet runs past the end")?;
    let p = &bytes[*at..end];
    *at = end;
    Ok(p)
}

/// Decodes and checks `bytes` (a whole trace file).
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    let mut st = State::default();
    for p in packets(bytes) {
        let p = TracePacket::parse_from_bytes(p?).map_err(|e| format!("not a TracePacket: {e}"))?;
        if p.has_compressed_packets() {
            st.d.compressed_chunks += 1;
            let c = p.compressed_packets();
            if c.len() >= 512 << 10 {
                return Err(format!(
                    "a compressed packet of {} bytes (Perfetto: < 512 KiB)",
                    c.len()
                ));
            }
            let mut raw = Vec::new();
            flate2::read::ZlibDecoder::new(c)
                .read_to_end(&mut raw)
                .map_err(|e| format!("compressed_packets do not inflate: {e}"))?;
            for q in packets(&raw) {
                let q = TracePacket::parse_from_bytes(q?)
                    .map_err(|e| format!("inflated chunk: {e}"))?;
                if q.has_compressed_packets() {
                    return Err("compressed packets inside compressed packets".into());
                }
                st.packet(&q)?;
            }
        } else {
            st.packet(&p)?;
        }
    }
    st.finish()
}

#[derive(Default)]
struct State {
    d: Decoded,
    seqs: HashMap<u32, Sequence>,
    raw: Vec<Raw>,
}

impl State {
    fn packet(&mut self, p: &TracePacket) -> Result<(), String> {
        let index = self.d.packets;
        self.d.packets += 1;
        let d = &mut self.d;
        let raw = &mut self.raw;
        let at = |what: String| format!("packet {index}: {what}");
        let seq_id = p.trusted_packet_sequence_id();
        if seq_id == 0 {
            return Err(at("no trusted_packet_sequence_id".into()));
        }
        let s = self.seqs.entry(seq_id).or_default();
        let flags = p.sequence_flags();
        if flags & 1 != 0 || p.incremental_state_cleared() {
            *s = Sequence {
                cleared: true,
                ..Sequence::default()
            };
        }
        if flags & 2 != 0 && !s.cleared {
            return Err(at(format!(
                "needs incremental state, sequence {seq_id} was never cleared"
            )));
        }
        if let Some(def) = p.trace_packet_defaults.as_ref() {
            s.default_clock = def.timestamp_clock_id;
        }
        if p.has_clock_snapshot() {
            let cs = p.clock_snapshot();
            let mono = cs
                .clocks
                .iter()
                .find(|c| c.clock_id() == CLOCK_MONOTONIC)
                .map(|c| c.timestamp())
                .ok_or_else(|| at("clock snapshot without CLOCK_MONOTONIC".into()))?;
            for c in &cs.clocks {
                s.clocks
                    .insert(c.clock_id(), (c.timestamp(), mono, c.is_incremental()));
                if c.is_incremental() {
                    s.incremental_now.insert(c.clock_id(), c.timestamp());
                }
            }
        }
        if let Some(i) = p.interned_data.as_ref() {
            for n in &i.event_names {
                s.names.insert(n.iid(), n.name().to_owned());
            }
            for n in &i.event_categories {
                s.categories.insert(n.iid(), n.name().to_owned());
            }
            for n in &i.debug_annotation_names {
                s.arg_names.insert(n.iid(), n.name().to_owned());
            }
            for n in &i.debug_annotation_string_values {
                s.arg_strings
                    .insert(n.iid(), String::from_utf8_lossy(n.str()).into_owned());
            }
        }
        if p.has_track_descriptor() {
            describe(d, p.track_descriptor()).map_err(at)?;
        }
        if p.timestamp.is_some() {
            let clock = p
                .timestamp_clock_id
                .or(s.default_clock)
                .unwrap_or(6 /* BOOTTIME */);
            let ts = if clock == CLOCK_MONOTONIC {
                p.timestamp()
            } else {
                let &(at_snap, mono, incremental) = s
                    .clocks
                    .get(&clock)
                    .ok_or_else(|| at(format!("clock {clock} has no snapshot")))?;
                let value = if incremental {
                    let now = s.incremental_now.entry(clock).or_insert(at_snap);
                    *now += p.timestamp();
                    *now
                } else {
                    p.timestamp()
                };
                (value - at_snap) + mono
            };
            if s.last_ts.is_some_and(|l| ts < l) {
                return Err(at(format!(
                    "timestamp {ts} before {} on sequence {seq_id}",
                    s.last_ts.unwrap_or(0)
                )));
            }
            s.last_ts = Some(ts);
            if p.has_track_event() {
                let e = p.track_event();
                if !d.tracks.contains_key(&e.track_uuid()) {
                    return Err(at(format!("event on undescribed track {}", e.track_uuid())));
                }
                let (phase, ty, event) = track_event(s, e, ts, seq_id).map_err(at)?;
                raw.push(Raw {
                    ts,
                    phase,
                    index,
                    ty,
                    event,
                });
            }
        } else if p.has_track_event() {
            return Err(at("a track event without a timestamp".into()));
        }
        Ok(())
    }

    fn finish(self) -> Result<Decoded, String> {
        let State {
            mut d,
            seqs,
            mut raw,
        } = self;
        d.sequences = seqs.len();
        // Match begins and ends per track in timestamp order, as the import does.
        raw.sort_by_key(|r| (r.ts, r.phase, r.index));
        let mut open: HashMap<u64, Vec<Event>> = HashMap::new();
        for r in raw {
            match r.ty {
                track_event::Type::TYPE_SLICE_BEGIN => {
                    open.entry(r.event.track).or_default().push(r.event)
                }
                track_event::Type::TYPE_SLICE_END => {
                    let mut e =
                        open.get_mut(&r.event.track)
                            .and_then(Vec::pop)
                            .ok_or_else(|| {
                                format!(
                                    "packet {}: an end on track {} with nothing open",
                                    r.index, r.event.track
                                )
                            })?;
                    e.end_ns = Some(r.ts);
                    d.events.push(e);
                }
                _ => d.events.push(r.event),
            }
        }
        if let Some((track, left)) = open.iter().find(|(_, v)| !v.is_empty()) {
            return Err(format!(
                "{} slice(s) left open on track {track}: {:?}",
                left.len(),
                left[0]
            ));
        }
        Ok(d)
    }
}

/// A track described (again only as it was: a ring segment's start).
fn describe(
    d: &mut Decoded,
    t: &perfetto_protos::track_descriptor::TrackDescriptor,
) -> Result<(), String> {
    let parent = t.parent_uuid.filter(|&u| u != 0);
    if let Some(pu) = parent
        && !d.tracks.contains_key(&pu)
    {
        return Err(format!("track {} before its parent {pu}", t.uuid()));
    }
    let (pid, tid, name) = if let Some(th) = t.thread.as_ref() {
        (Some(th.pid()), Some(th.tid()), th.thread_name().to_owned())
    } else if let Some(pr) = t.process.as_ref() {
        (Some(pr.pid()), None, pr.process_name().to_owned())
    } else {
        (None, None, t.name().to_owned())
    };
    let track = Track {
        uuid: t.uuid(),
        parent,
        name,
        pid,
        tid,
    };
    // Described again (a ring segment's start): only as it was.
    if let Some(was) = d.tracks.get(&t.uuid()) {
        if *was != track {
            return Err(format!(
                "track {} described again differently: {was:?} then {track:?}",
                t.uuid()
            ));
        }
    } else {
        d.tracks.insert(t.uuid(), track);
    }
    Ok(())
}

/// A track event's phase (ends, instants, begins), type and contents, its interned
/// references resolved on its sequence.
fn track_event(
    s: &Sequence,
    e: &perfetto_protos::track_event::TrackEvent,
    ts: u64,
    seq_id: u32,
) -> Result<(u8, track_event::Type, Event), String> {
    let lookup = |m: &HashMap<u64, String>, id: u64, what: &str| {
        m.get(&id)
            .cloned()
            .ok_or_else(|| format!("{what} iid {id} not interned on sequence {seq_id}"))
    };
    let name = match &e.name_field {
        Some(track_event::Name_field::NameIid(id)) => lookup(&s.names, *id, "name")?,
        Some(track_event::Name_field::Name(n)) => n.clone(),
        _ => String::new(),
    };
    let category = match (e.category_iids.first(), e.categories.first()) {
        (Some(id), _) => lookup(&s.categories, *id, "category")?,
        (None, Some(c)) => c.clone(),
        _ => String::new(),
    };
    let mut args = Vec::new();
    for a in &e.debug_annotations {
        let k = match &a.name_field {
            Some(debug_annotation::Name_field::NameIid(id)) => {
                lookup(&s.arg_names, *id, "argument name")?
            }
            Some(debug_annotation::Name_field::Name(n)) => n.clone(),
            _ => return Err("an argument without a name".into()),
        };
        let v = match &a.value {
            Some(debug_annotation::Value::BoolValue(b)) => Value::Bool(*b),
            Some(debug_annotation::Value::UintValue(u)) => Value::Uint(*u),
            Some(debug_annotation::Value::IntValue(i)) => Value::Int(*i),
            Some(debug_annotation::Value::DoubleValue(f)) => Value::Double(*f),
            Some(debug_annotation::Value::StringValue(t)) => Value::Str(t.clone()),
            Some(debug_annotation::Value::StringValueIid(id)) => {
                Value::Str(lookup(&s.arg_strings, *id, "string value")?)
            }
            other => return Err(format!("argument {k}: {other:?}")),
        };
        args.push((k, v));
    }
    let ty = e.type_();
    let phase = match ty {
        track_event::Type::TYPE_SLICE_END => 0,
        track_event::Type::TYPE_INSTANT => 1,
        track_event::Type::TYPE_SLICE_BEGIN => 2,
        other => return Err(format!("event type {other:?}")),
    };
    Ok((
        phase,
        ty,
        Event {
            track: e.track_uuid(),
            name,
            category,
            start_ns: ts,
            end_ns: None,
            args,
            flows_out: e.flow_ids.clone(),
            flows_in: e.terminating_flow_ids.clone(),
        },
    ))
}
