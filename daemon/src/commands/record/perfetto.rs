//! `-o FILE.pftrace` (any name not ending in .json): Perfetto's native format through
//! `ethand-perfetto` (TracePacket protobuf, interned names, delta-encoded timestamps,
//! deflate-compressed chunks, bounded memory; see that crate for the order and the window).
//!
//! Tracks:
//! - a track per process, one per thread under it: its syscalls and GPU/NPU runtime calls
//!   (nested: a runtime call contains the syscalls it makes) and its CPU and Python samples
//!   (instants named by the innermost frame, `stack` the frames innermost first, one per
//!   line);
//! - "CPU n": the recorded threads' time on that CPU (slices named "<thread> (tid)");
//! - "<thread> (tid) sched", under the thread: its time off the CPU (blocked, preempted) and
//!   the slice it was in when recording stopped (`cut_at_end`);
//! - "block I/O n" under the submitting process: block requests, overlapping ones on
//!   further lanes;
//! - "GPU d stream s" under the process: the kernels, copies and memsets the GPU ran for it
//!   (`gpu_tracks.rs`), after its threads;
//! - "ethand": dropped events, and the recording's summary (the JSON output's `metadata`)
//!   as an instant at the end.
//!
//! Same events, names and arguments as the JSON output (`json.rs`); times are
//! CLOCK_MONOTONIC ns, exact.
use std::{collections::HashMap, fs, io};

use ethand_perfetto::{Arg, Flow, Options, RingOptions, TraceWriter, TrackId};
use serde_json::Value;

use super::trace::{Counting, Encoder, Ending, SchedState, TraceEvent, gpu_work_args};

/// A fast hash: these maps are looked up for every event.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// An event's arguments without an allocation (at most [`Args::MAX`]).
struct Args<'a> {
    a: [Arg<'a>; Args::MAX],
    n: usize,
}

impl<'a> Args<'a> {
    const MAX: usize = 8;

    fn new() -> Self {
        Self {
            a: [Arg::Bool("", false); Self::MAX],
            n: 0,
        }
    }

    fn push(&mut self, a: Arg<'a>) {
        if self.n < Self::MAX {
            self.a[self.n] = a;
            self.n += 1;
        }
    }

    fn get(&self) -> &[Arg<'a>] {
        &self.a[..self.n]
    }
}

/// Overlapping block requests of one process: a lane is free once its last request ended.
#[derive(Default)]
struct Lanes {
    /// Per lane: its track and the end of the request on it.
    lanes: Vec<(TrackId, u64)>,
}

pub(super) struct PerfettoEncoder {
    w: TraceWriter<Counting<fs::File>>,
    processes: Map<u32, TrackId>,
    /// Each thread's track and label, "name (tid)".
    threads: Map<(u32, u32), (TrackId, String)>,
    sched: Map<(u32, u32), TrackId>,
    cpus: Map<u32, TrackId>,
    blocks: Map<u32, Lanes>,
    /// GPU tracks by their number (`Encoder::gpu_track`).
    gpu: Map<u32, TrackId>,
    ethand: Option<TrackId>,
    /// Stacks joined into one string (interned: a repeated stack costs its iid).
    stack: String,
}

impl PerfettoEncoder {
    /// With `ring`, only the end of the recording is kept (`ethand_perfetto::RingOptions`).
    pub(super) fn new(file: fs::File, ring: Option<RingOptions>) -> io::Result<Self> {
        let out = Counting {
            inner: file,
            written: 0,
        };
        let w = match ring {
            Some(r) => TraceWriter::ring(out, Options::default(), r)?,
            None => TraceWriter::new(out, Options::default())?,
        };
        Ok(Self {
            w,
            processes: Map::default(),
            threads: Map::default(),
            sched: Map::default(),
            cpus: Map::default(),
            blocks: Map::default(),
            gpu: Map::default(),
            ethand: None,
            stack: String::new(),
        })
    }

    fn process_track(&mut self, pid: u32) -> io::Result<TrackId> {
        if let Some(&t) = self.processes.get(&pid) {
            return Ok(t);
        }
        let t = self.w.process_track(pid, &format!("pid {pid}"))?;
        self.processes.insert(pid, t);
        Ok(t)
    }

    fn thread_track(&mut self, pid: u32, tid: u32) -> io::Result<TrackId> {
        if let Some((t, _)) = self.threads.get(&(pid, tid)) {
            return Ok(*t);
        }
        self.thread(pid, tid, &format!("tid {tid}"))?;
        Ok(self.threads[&(pid, tid)].0)
    }

    fn sched_track(&mut self, pid: u32, tid: u32) -> io::Result<TrackId> {
        if let Some(&t) = self.sched.get(&(pid, tid)) {
            return Ok(t);
        }
        let parent = self.thread_track(pid, tid)?;
        let name = format!("{} sched", self.threads[&(pid, tid)].1);
        let t = self.w.track(Some(parent), &name, None)?;
        self.sched.insert((pid, tid), t);
        Ok(t)
    }

    fn cpu_track(&mut self, cpu: u32) -> io::Result<TrackId> {
        if let Some(&t) = self.cpus.get(&cpu) {
            return Ok(t);
        }
        let t = self
            .w
            .track(None, &format!("CPU {cpu}"), i32::try_from(cpu).ok())?;
        self.cpus.insert(cpu, t);
        Ok(t)
    }

    fn ethand_track(&mut self) -> io::Result<TrackId> {
        if let Some(t) = self.ethand {
            return Ok(t);
        }
        let t = self.w.track(None, "ethand", Some(-1))?;
        self.ethand = Some(t);
        Ok(t)
    }

    /// A lane under the process free from `start` (requests arrive as they end, so a lane
    /// is checked against its latest request only: a request that began before the lane's
    /// last one ended goes to another lane).
    fn block_lane(&mut self, pid: u32, start: u64, end: u64) -> io::Result<TrackId> {
        let parent = self.process_track(pid)?;
        let lanes = self.blocks.entry(pid).or_default();
        if let Some(l) = lanes.lanes.iter_mut().find(|(_, e)| *e <= start) {
            l.1 = l.1.max(end);
            return Ok(l.0);
        }
        let n = lanes.lanes.len();
        let t = self.w.track(
            Some(parent),
            &format!("block I/O {n}"),
            Some(1000 + i32::try_from(n).unwrap_or(i32::MAX - 1000)),
        )?;
        self.blocks.entry(pid).or_default().lanes.push((t, end));
        Ok(t)
    }

    /// A GPU/NPU runtime call: a slice on its thread's track.
    fn gpu(&mut self, e: &TraceEvent<'_>) -> io::Result<()> {
        let &TraceEvent::Gpu {
            pid,
            tid,
            op,
            name,
            info,
            ret,
            bytes,
            start,
            dur,
            cpu,
            python,
            flow,
        } = e
        else {
            return Ok(());
        };
        let track = self.thread_track(pid, tid)?;
        let joined = match python {
            [] => None,
            f => Some(self.join_stack(f.iter().map(String::as_str)).to_owned()),
        };
        let mut args = Args::new();
        args.push(Arg::Uint("op", op));
        if let Some(i) = info {
            args.push(Arg::Str("library", i.library));
            args.push(Arg::Str("category", i.category));
            args.push(Arg::Int("ret", ret.into()));
        }
        if let Some(b) = bytes {
            args.push(Arg::Uint("bytes", b));
        }
        args.push(Arg::Uint("cpu", cpu.into()));
        if let Some(j) = &joined {
            args.push(Arg::Str("python", j));
        }
        let flow = flow.map_or(Flow::None, Flow::Out);
        self.w
            .slice_in_flow(track, name, "gpu", start, dur, args.get(), flow)
    }

    fn join_stack<'a>(&mut self, frames: impl Iterator<Item = &'a str>) -> &str {
        self.stack.clear();
        for (i, f) in frames.enumerate() {
            if i > 0 {
                self.stack.push('\n');
            }
            self.stack.push_str(f);
        }
        &self.stack
    }
}

impl Encoder for PerfettoEncoder {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        let t = self.w.process_track(pid, name)?;
        self.processes.insert(pid, t);
        Ok(())
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        let parent = self.process_track(pid)?;
        let label = format!("{name} ({tid})");
        let t = self.w.thread_track(parent, pid, tid, &label)?;
        self.threads.insert((pid, tid), (t, label));
        Ok(())
    }

    fn gpu_track(&mut self, pid: u32, track: u32, label: &str) -> io::Result<()> {
        let parent = self.process_track(pid)?;
        // After the block I/O lanes (1000 + n).
        let rank = 100_000 + i32::try_from(track).unwrap_or(i32::MAX - 100_000);
        let t = self.w.track(Some(parent), label, Some(rank))?;
        self.gpu.insert(track, t);
        Ok(())
    }

    fn event(&mut self, e: &TraceEvent<'_>) -> io::Result<()> {
        match *e {
            TraceEvent::Sched {
                pid,
                tid,
                state,
                start,
                dur,
                cpu,
            } => match (state, cpu) {
                (SchedState::Running, Some(cpu)) => {
                    let track = self.cpu_track(cpu)?;
                    self.thread_track(pid, tid)?;
                    let args = [
                        Arg::Uint("pid", pid.into()),
                        Arg::Uint("tid", tid.into()),
                        Arg::Uint("cpu", cpu.into()),
                    ];
                    // The thread's label ("name (tid)"), as its track says it.
                    let name = &self.threads[&(pid, tid)].1;
                    self.w.slice(track, name, "sched", start, dur, &args)
                }
                (state, cpu) => {
                    let track = self.sched_track(pid, tid)?;
                    let mut args = Args::new();
                    args.push(Arg::Uint("tid", tid.into()));
                    match cpu {
                        Some(c) => args.push(Arg::Uint("woken_on_cpu", c.into())),
                        None => args.push(Arg::Bool("cut_at_end", true)),
                    }
                    self.w
                        .slice(track, state.as_str(), "sched", start, dur, args.get())
                }
            },
            TraceEvent::Syscall {
                pid,
                tid,
                nr,
                name,
                start,
                dur,
                ret,
                cpu,
            } => {
                let track = self.thread_track(pid, tid)?;
                let mut args = Args::new();
                args.push(Arg::Uint("nr", nr));
                args.push(Arg::Int("ret", ret));
                args.push(Arg::Uint("cpu", cpu.into()));
                if (-4095..0).contains(&ret) {
                    args.push(Arg::Int("errno", -ret));
                }
                self.w.slice(track, name, "syscall", start, dur, args.get())
            }
            TraceEvent::Gpu { .. } => self.gpu(e),
            TraceEvent::GpuActivity {
                track,
                name,
                demangled,
                start,
                dur,
                launch,
                ..
            } => {
                let Some(&t) = self.gpu.get(&track) else {
                    return Ok(());
                };
                let mut dims = Default::default();
                let (cat, args) = gpu_work_args(e, &mut dims);
                let flow = launch.map_or(Flow::None, |l| Flow::In(l.flow));
                self.w
                    .slice_in_flow(t, demangled.unwrap_or(name), cat, start, dur, &args, flow)
            }
            TraceEvent::Block {
                pid,
                tid,
                id,
                op,
                dev,
                sector,
                bytes,
                rwbs,
                start,
                dur,
            } => {
                let track = self.block_lane(pid, start, start + dur)?;
                let dev = format!("{}:{}", dev >> 20, dev & 0xfffff);
                let args = [
                    Arg::Uint("id", id),
                    Arg::Str("dev", &dev),
                    Arg::Uint("sector", sector),
                    Arg::Uint("bytes", bytes),
                    Arg::Str("rwbs", rwbs),
                    Arg::Uint("tid", tid.into()),
                ];
                self.w
                    .slice(track, &format!("block {op}"), "block", start, dur, &args)
            }
            TraceEvent::CpuSample {
                pid,
                tid,
                ts,
                stack,
            } => {
                let track = self.thread_track(pid, tid)?;
                let name = stack.first().copied().unwrap_or("(no stack)");
                let joined = self.join_stack(stack.iter().copied()).to_owned();
                self.w
                    .instant(track, name, "cpu_sample", ts, &[Arg::Str("stack", &joined)])
            }
            TraceEvent::PythonSample {
                pid,
                tid,
                ts,
                frames,
                active,
                gil,
            } => {
                let track = self.thread_track(pid, tid)?;
                let name = frames.first().map_or("(no Python frame)", String::as_str);
                let joined = self
                    .join_stack(frames.iter().map(String::as_str))
                    .to_owned();
                self.w.instant(
                    track,
                    name,
                    "python_sample",
                    ts,
                    &[
                        Arg::Str("stack", &joined),
                        Arg::Bool("active", active),
                        Arg::Bool("gil", gil),
                    ],
                )
            }
        }
    }

    fn finish(mut self: Box<Self>, end: &Ending<'_>) -> io::Result<()> {
        let track = self.ethand_track()?;
        if end.dropped > 0 {
            let name = format!("ethand: {} events dropped (ring buffer full)", end.dropped);
            self.w.instant(
                track,
                &name,
                "ethand",
                end.t_end,
                &[Arg::Uint("dropped", end.dropped)],
            )?;
        }
        // The summary: scalars as they are, lists and objects as JSON text.
        let mut texts: Vec<(String, String)> = Vec::new();
        let mut args: Vec<(String, Value)> = Vec::new();
        if let Value::Object(m) = end.meta {
            for (k, v) in m {
                match v {
                    Value::Array(_) | Value::Object(_) | Value::String(_) => texts.push((
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                    )),
                    _ => args.push((k.clone(), v.clone())),
                }
            }
        }
        let mut a: Vec<Arg<'_>> = Vec::new();
        for (k, v) in &args {
            match v {
                Value::Bool(b) => a.push(Arg::Bool(k, *b)),
                Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                    (Some(u), _, _) => a.push(Arg::Uint(k, u)),
                    (None, Some(i), _) => a.push(Arg::Int(k, i)),
                    (None, None, Some(f)) => a.push(Arg::Double(k, f)),
                    _ => {}
                },
                _ => {} // null: not measured, left out
            }
        }
        for (k, v) in &texts {
            a.push(Arg::Str(k, v));
        }
        self.w
            .instant(track, "ethand record", "ethand", end.t_end, &a)?;
        let Self { w, .. } = *self;
        let (out, _) = w.finish()?;
        out.inner.sync_all()
    }

    fn written_bytes(&self) -> u64 {
        self.w.written_bytes()
    }

    fn stop_rotating(&mut self, end_ns: u64) -> io::Result<Option<ethand_perfetto::RingStats>> {
        self.w.stop_rotating(end_ns)
    }
}
