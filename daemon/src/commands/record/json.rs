//! `-o FILE.json`: the Chrome JSON trace format (chrome://tracing, Perfetto's legacy
//! importer), one trace event per line, streamed through a bounded buffer.
//!
//! Layout (`{"traceEvents":[...],"displayTimeUnit":"ns","metadata":{...}}`; times in µs from
//! the start of the recording, exact to the ns: three decimals):
//! - events in the order the kernel emitted them, i.e. as each ended, not sorted by start
//!   (Perfetto and chrome://tracing sort on import);
//! - one `pid` per process, one `tid` per thread, named from /proc (`ph: "M"`), written when
//!   the process or thread is first seen;
//! - syscalls and GPU/NPU calls: complete events (`ph: "X"`) on the thread's own track;
//! - scheduler slices: complete events on a companion track of each thread,
//!   `tid = SCHED_TID_BASE + tid`, named "<thread> (sched)", placed right after the thread;
//!   `args.tid` gives the real thread id;
//! - block requests: async slices (`ph: "b"`/`"e"`, `cat: "block"`) of the submitting process;
//! - CPU and Python samples: thread-scoped instants (`ph: "i"`) named by the innermost frame,
//!   `args.stack` innermost first;
//! - GPU work (kernels, copies, memsets: `gpu_tracks.rs`): complete events (`cat:
//!   "gpu_kernel"`, `"gpu_memcpy"`, `"gpu_memset"`) on a track per device and stream of the
//!   process, `tid = GPU_TID_BASE + n`, named "GPU d stream s";
//! - drops: in `metadata.dropped` and, when non-zero, a global instant event.
use std::{
    collections::HashSet,
    fs,
    io::{self, BufWriter, Write as _},
};

use serde_json::{Value, json};

use ethand_perfetto::Arg;

use super::trace::{Counting, Encoder, Ending, SchedState, TraceEvent, gpu_work_args};
use super::{GPU_TID_BASE, SCHED_TID_BASE};

/// Decimal digits of `v` (the hot path formats integers without `fmt`).
pub(super) fn push_u64(l: &mut Vec<u8>, mut v: u64) {
    let mut d = [0u8; 20];
    let mut i = d.len();
    loop {
        i -= 1;
        d[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    l.extend_from_slice(&d[i..]);
}

pub(super) fn push_i64(l: &mut Vec<u8>, v: i64) {
    if v < 0 {
        l.push(b'-');
    }
    push_u64(l, v.unsigned_abs());
}

/// ns as µs, exact (three decimals).
pub(super) fn push_us(l: &mut Vec<u8>, ns: u64) {
    push_u64(l, ns / 1000);
    let f = (ns % 1000) as u16;
    l.extend_from_slice(&[
        b'.',
        b'0' + (f / 100) as u8,
        b'0' + (f / 10 % 10) as u8,
        b'0' + (f % 10) as u8,
    ]);
}

/// µs from the start of the recording (negative for what started before).
pub(super) fn push_ts(l: &mut Vec<u8>, ns: u64, t0: u64) {
    if ns < t0 {
        l.push(b'-');
        push_us(l, t0 - ns);
    } else {
        push_us(l, ns - t0);
    }
}

/// Size of the output buffer: few large writes.
const WRITE_BUF: usize = 4 << 20;

pub(super) struct JsonEncoder {
    w: BufWriter<Counting<fs::File>>,
    t0: u64,
    /// Trace events written so far (a block request is two).
    entries: u64,
    /// Thread names (for the scheduler tracks) and which scheduler tracks are named.
    threads: std::collections::HashMap<(u32, u32), String>,
    sched_threads: HashSet<(u32, u32)>,
    /// The event being formatted.
    line: Vec<u8>,
}

impl JsonEncoder {
    pub(super) fn new(file: fs::File, t0: u64) -> Self {
        Self {
            w: BufWriter::with_capacity(
                WRITE_BUF,
                Counting {
                    inner: file,
                    written: 0,
                },
            ),
            t0,
            entries: 0,
            threads: Default::default(),
            sched_threads: HashSet::new(),
            line: Vec::with_capacity(512),
        }
    }

    /// Separator and start of the next trace event.
    fn begin(&mut self) -> io::Result<()> {
        let sep: &[u8] = if self.entries == 0 {
            b"{\"traceEvents\":[\n"
        } else {
            b",\n"
        };
        self.entries += 1;
        self.w.write_all(sep)
    }

    fn value(&mut self, v: &Value) -> io::Result<()> {
        self.begin()?;
        serde_json::to_writer(&mut self.w, v)?;
        Ok(())
    }

    fn line(&mut self) -> io::Result<()> {
        self.begin()?;
        self.w.write_all(&self.line)
    }

    fn rel(&self, ns: u64) -> f64 {
        (i128::from(ns) - i128::from(self.t0)) as f64 / 1000.0
    }

    /// Names the scheduler track of a thread, placed right after the thread.
    fn learn_sched(&mut self, pid: u32, tid: u32) -> io::Result<()> {
        if !self.sched_threads.insert((pid, tid)) {
            return Ok(());
        }
        let n = self
            .threads
            .get(&(pid, tid))
            .cloned()
            .unwrap_or_else(|| format!("tid {tid}"));
        let st = SCHED_TID_BASE + u64::from(tid);
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": st, "args": {"name": format!("{n} ({tid}) sched")}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": st, "args": {"sort_index": 2 * u64::from(tid) + 1}}))
    }
}

impl JsonEncoder {
    /// Scheduler slices and syscalls, the most frequent events: formatted by hand.
    fn line_event(&mut self, e: &TraceEvent<'_>) -> io::Result<()> {
        match *e {
            TraceEvent::Sched {
                pid,
                tid,
                state,
                start,
                dur,
                cpu,
            } => {
                self.learn_sched(pid, tid)?;
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":\"");
                l.extend_from_slice(state.as_str().as_bytes());
                l.extend_from_slice(b"\",\"cat\":\"sched\",\"ph\":\"X\",\"ts\":");
                push_ts(l, start, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, dur);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, pid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, SCHED_TID_BASE + u64::from(tid));
                l.extend_from_slice(b",\"args\":{\"tid\":");
                push_u64(l, tid.into());
                match cpu {
                    // Still in this state when recording stopped: cut at the end.
                    None => l.extend_from_slice(b",\"cut_at_end\":true}}"),
                    Some(cpu) => {
                        l.extend_from_slice(if state == SchedState::Running {
                            b",\"cpu\":"
                        } else {
                            b",\"woken_on_cpu\":"
                        });
                        push_u64(l, cpu.into());
                        l.extend_from_slice(b"}}");
                    }
                }
                self.line()
            }
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
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":");
                serde_json::to_writer(&mut *l, name)?;
                l.extend_from_slice(b",\"cat\":\"syscall\",\"ph\":\"X\",\"ts\":");
                push_ts(l, start, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, dur);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, pid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, tid.into());
                // "nr" right before "ret": the bench counts `"nr":39,"ret":`.
                l.extend_from_slice(b",\"args\":{\"nr\":");
                push_u64(l, nr);
                l.extend_from_slice(b",\"ret\":");
                push_i64(l, ret);
                l.extend_from_slice(b",\"cpu\":");
                push_u64(l, cpu.into());
                if (-4095..0).contains(&ret) {
                    l.extend_from_slice(b",\"errno\":");
                    push_i64(l, -ret);
                }
                l.extend_from_slice(b"}}");
                self.line()
            }
            _ => Ok(()),
        }
    }
}

impl Encoder for JsonEncoder {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        self.value(
            &json!({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}}),
        )?;
        self.value(&json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": pid, "args": {"sort_index": pid}}))
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": format!("{name} ({tid})")}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": 2 * u64::from(tid)}}))?;
        self.threads.insert((pid, tid), name.to_owned());
        Ok(())
    }

    fn gpu_track(&mut self, pid: u32, track: u32, label: &str) -> io::Result<()> {
        let tid = GPU_TID_BASE + u64::from(track);
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}))
    }

    fn event(&mut self, e: &TraceEvent<'_>) -> io::Result<()> {
        match *e {
            TraceEvent::Sched { .. } | TraceEvent::Syscall { .. } => self.line_event(e),
            TraceEvent::GpuActivity {
                pid,
                track,
                name,
                demangled,
                start,
                dur,
                launch,
                ..
            } => {
                // The flow from the launch call (bound to the slice around the kernel's
                // queued time on the launching thread) to the kernel.
                if let Some(l) = launch {
                    let (ts, te) = (self.rel(l.queued), self.rel(start));
                    self.value(&json!({
                        "name": "launch", "cat": "gpu_flow", "ph": "s", "id": l.flow, "ts": ts,
                        "pid": pid, "tid": l.tid,
                    }))?;
                    self.value(&json!({
                        "name": "launch", "cat": "gpu_flow", "ph": "f", "bp": "e", "id": l.flow,
                        "ts": te, "pid": pid, "tid": GPU_TID_BASE + u64::from(track),
                    }))?;
                }
                let mut dims = Default::default();
                let (cat, args) = gpu_work_args(e, &mut dims);
                let args: serde_json::Map<String, Value> = args
                    .iter()
                    .map(|a| match *a {
                        Arg::Int(k, v) => (k.to_owned(), json!(v)),
                        Arg::Uint(k, v) => (k.to_owned(), json!(v)),
                        Arg::Bool(k, v) => (k.to_owned(), json!(v)),
                        Arg::Double(k, v) => (k.to_owned(), json!(v)),
                        Arg::Str(k, v) => (k.to_owned(), json!(v)),
                    })
                    .collect();
                let ts = self.rel(start);
                self.value(&json!({
                    "name": demangled.unwrap_or(name), "cat": cat, "ph": "X", "ts": ts,
                    "dur": dur as f64 / 1000.0,
                    "pid": pid, "tid": GPU_TID_BASE + u64::from(track), "args": args,
                }))
            }
            TraceEvent::Gpu {
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
                ..
            } => {
                let mut args = match info {
                    Some(i) => json!({
                        "op": op, "library": i.library, "category": i.category, "ret": ret,
                    }),
                    None => json!({"op": op}),
                };
                if let Some(b) = bytes {
                    args["bytes"] = json!(b);
                }
                args["cpu"] = json!(cpu);
                if !python.is_empty() {
                    args["python"] = json!(python);
                }
                let ts = self.rel(start);
                self.value(&json!({
                    "name": name, "cat": "gpu", "ph": "X", "ts": ts,
                    "dur": dur as f64 / 1000.0,
                    "pid": pid, "tid": tid, "args": args,
                }))
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
                let dur_us = dur as f64 / 1000.0;
                let args = json!({
                    "dev": format!("{}:{}", dev >> 20, dev & 0xfffff), "sector": sector,
                    "bytes": bytes, "rwbs": rwbs, "tid": tid, "dur_us": dur_us,
                });
                let name = format!("block {op}");
                let (ts, te) = (self.rel(start), self.rel(start + dur));
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "b", "id": id, "ts": ts,
                    "pid": pid, "tid": tid, "args": args,
                }))?;
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "e", "id": id, "ts": te,
                    "pid": pid, "tid": tid,
                }))
            }
            TraceEvent::CpuSample {
                pid,
                tid,
                ts,
                stack,
            } => {
                let name = stack.first().copied().unwrap_or("(no stack)");
                let ts = self.rel(ts);
                self.value(&json!({
                    "name": name, "cat": "cpu_sample", "ph": "i", "s": "t", "ts": ts,
                    "pid": pid, "tid": tid, "args": {"stack": stack},
                }))
            }
            TraceEvent::PythonSample {
                pid,
                tid,
                ts,
                frames,
                active,
                gil,
            } => {
                let name = frames.first().map_or("(no Python frame)", String::as_str);
                let ts = self.rel(ts);
                self.value(&json!({
                    "name": name, "cat": "python_sample", "ph": "i", "s": "t", "ts": ts,
                    "pid": pid, "tid": tid,
                    "args": {"stack": frames, "active": active, "gil": gil},
                }))
            }
        }
    }

    fn finish(mut self: Box<Self>, end: &Ending<'_>) -> io::Result<()> {
        if end.dropped > 0 {
            let ts = self.rel(end.t_end);
            let (dropped, root) = (end.dropped, end.root);
            self.value(&json!({
                "name": format!("ethand: {dropped} events dropped (ring buffer full)"),
                "cat": "ethand", "ph": "i", "s": "g", "ts": ts, "pid": root, "tid": root,
                "args": {"dropped": dropped},
            }))?;
        }
        if self.entries == 0 {
            self.w.write_all(b"{\"traceEvents\":[")?;
        }
        self.w
            .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"metadata\":")?;
        serde_json::to_writer(&mut self.w, end.meta)?;
        self.w.write_all(b"}\n")?;
        self.w.flush()?;
        self.w.get_ref().inner.sync_all()
    }

    fn written_bytes(&self) -> u64 {
        self.w.get_ref().written
    }
}
