//! The trace file: Chrome JSON trace events streamed to FILE.tmp through a bounded buffer.
use std::{
    collections::{HashMap, HashSet},
    fs,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
};

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use ethand_common::{
    GpuOpDesc, RecordEvent, RecordThread, gpu_dtype, gpu_kind, record_kind, record_off,
};
use ethand_userspace_probes::catalog::CATALOG;
use serde_json::{Value, json};

use super::SCHED_TID_BASE;
use crate::pipeline::syscalls_table;

/// Process and thread names, read from /proc when first seen (a thread that exits before
/// it is seen keeps a numbered name).
pub(super) fn comm(path: &str) -> Option<String> {
    // Bytes: a name is not always UTF-8 (invalid sequences become U+FFFD, as in the daemon).
    fs::read(path).ok().map(|b| {
        String::from_utf8_lossy(&b)
            .trim_end_matches('\n')
            .to_string()
    })
}

/// Bytes a GPU/NPU call moved or allocated, where the catalog says which argument holds them.
pub(super) fn gpu_bytes(d: &GpuOpDesc, arg1: u64, arg2: u64) -> Option<u64> {
    match d.kind {
        gpu_kind::COPY | gpu_kind::ALLOC | gpu_kind::REGISTER => Some(arg1),
        gpu_kind::COLLECTIVE => Some(arg1.wrapping_mul(gpu_dtype::size(d.dtype_table, arg2))),
        _ => None,
    }
}

pub(super) fn rwbs_str(v: u64) -> String {
    v.to_le_bytes()
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect()
}

/// A syscall's name as a JSON string.
pub(super) fn quoted_syscall(nr: u64) -> String {
    serde_json::to_string(&syscalls_table::name(nr as u32)).unwrap_or_default()
}

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

/// CPU samples held between two symbolization rounds (half a second): 99 samples a second
/// of 1,000 busy threads fit.
pub(super) const MAX_PENDING_SAMPLES: usize = 100_000;

/// Size of the output buffer: few large writes.
pub(super) const WRITE_BUF: usize = 4 << 20;

/// Writes the trace to FILE.tmp while recording: each drained event is converted and
/// appended at once (one trace event per line), so memory stays bounded by the per-thread
/// state (names, which tracks were named), whatever the duration. Metadata records (`ph:
/// "M"`) are written when a process, thread or scheduler track is first seen; the closing
/// part (drop marker, `metadata`) at the end. Events are in the order the kernel emitted
/// them (when each ended), not sorted: trace viewers sort on import.
pub(super) struct TraceWriter {
    pub(super) w: BufWriter<fs::File>,
    pub(super) tmp: PathBuf,
    t0: u64,
    /// Trace events written so far (a block request is two).
    pub(super) entries: u64,
    /// Recorded events written so far (what `recorded N events` says).
    pub(super) events: u64,
    pub(super) block_id: u64,
    pub(super) procs: HashMap<u32, String>,
    pub(super) threads: HashMap<(u32, u32), String>,
    pub(super) sched_threads: HashSet<(u32, u32)>,
    /// Syscall names by number as JSON strings, looked up once.
    pub(super) syscall_names: Vec<Option<String>>,
    /// The event being formatted.
    pub(super) line: Vec<u8>,
    /// CPU samples waiting for their stacks to be symbolized (see [`Samples`]), and those
    /// lost with it full.
    pub(super) pending: Vec<RecordEvent>,
    pub(super) pending_dropped: u64,
}

impl TraceWriter {
    pub(super) fn new(file: fs::File, tmp: &Path, t0: u64) -> Self {
        Self {
            w: BufWriter::with_capacity(WRITE_BUF, file),
            tmp: tmp.to_path_buf(),
            t0,
            entries: 0,
            events: 0,
            block_id: 0,
            procs: HashMap::new(),
            threads: HashMap::new(),
            sched_threads: HashSet::new(),
            syscall_names: Vec::new(),
            line: Vec::with_capacity(512),
            pending: Vec::new(),
            pending_dropped: 0,
        }
    }

    /// What went wrong while writing, naming the file and what it had written. The caller
    /// removes FILE.tmp: nothing half-written is left behind under FILE's name.
    pub(super) fn error(&self, e: std::io::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "cannot write {}: {e} ({} events written before the error; recording stopped, \
             the partial file removed)",
            self.tmp.display(),
            self.events
        )
    }

    /// Separator and start of the next trace event.
    pub(super) fn begin(&mut self) -> std::io::Result<()> {
        let sep: &[u8] = if self.entries == 0 {
            b"{\"traceEvents\":[\n"
        } else {
            b",\n"
        };
        self.entries += 1;
        self.w.write_all(sep)
    }

    pub(super) fn value(&mut self, v: &Value) -> std::io::Result<()> {
        self.begin()?;
        serde_json::to_writer(&mut self.w, v)?;
        Ok(())
    }

    pub(super) fn learn_process(&mut self, pid: u32) -> std::io::Result<()> {
        if !self.procs.contains_key(&pid)
            && let Some(n) = comm(&format!("/proc/{pid}/comm"))
        {
            self.new_process(pid, n)?;
        }
        if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) {
            for e in dir.flatten() {
                if let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                    self.learn_thread(pid, tid)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn new_process(&mut self, pid: u32, name: String) -> std::io::Result<()> {
        self.value(
            &json!({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}}),
        )?;
        self.value(&json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": pid, "args": {"sort_index": pid}}))?;
        self.procs.insert(pid, name);
        Ok(())
    }

    pub(super) fn learn_thread(&mut self, pid: u32, tid: u32) -> std::io::Result<()> {
        if self.threads.contains_key(&(pid, tid)) {
            return Ok(());
        }
        if !self.procs.contains_key(&pid) {
            let n = comm(&format!("/proc/{pid}/comm")).unwrap_or_else(|| format!("pid {pid}"));
            self.new_process(pid, n)?;
        }
        let n =
            comm(&format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_else(|| format!("tid {tid}"));
        self.value(&json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": format!("{n} ({tid})")}}))?;
        self.value(&json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": 2 * u64::from(tid)}}))?;
        self.threads.insert((pid, tid), n);
        Ok(())
    }

    /// Names the scheduler track of a thread, placed right after the thread.
    pub(super) fn learn_sched(&mut self, pid: u32, tid: u32) -> std::io::Result<()> {
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

    /// Takes every event the ring buffer holds and writes it.
    pub(super) fn drain(&mut self, ring: &mut RingBuf<MapData>) -> std::io::Result<()> {
        while let Some(item) = ring.next() {
            if item.len() < size_of::<RecordEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a RecordEvent (repr(C), integers only); unaligned read.
            let e: RecordEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            drop(item);
            self.event(&e)?;
        }
        Ok(())
    }

    /// One recorded event: one trace event (two for a block request).
    pub(super) fn event(&mut self, e: &RecordEvent) -> std::io::Result<()> {
        if e.kind == record_kind::CPU_SAMPLE {
            // Written once symbolized, by `Samples::write` (at most half a second later).
            if self.pending.len() < MAX_PENDING_SAMPLES {
                self.pending.push(*e);
            } else {
                self.pending_dropped += 1;
            }
            return Ok(());
        }
        self.learn_thread(e.tgid, e.tid)?;
        self.events += 1;
        match e.kind {
            record_kind::ON_CPU | record_kind::OFF_CPU => {
                self.learn_sched(e.tgid, e.tid)?;
                let name: &[u8] = match (e.kind, e.arg0) {
                    (record_kind::ON_CPU, _) => b"running",
                    (_, record_off::BLOCKED) => b"blocked",
                    (_, record_off::PREEMPTED) => b"preempted",
                    _ => b"off-cpu",
                };
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":\"");
                l.extend_from_slice(name);
                l.extend_from_slice(b"\",\"cat\":\"sched\",\"ph\":\"X\",\"ts\":");
                push_ts(l, e.start_ns, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, e.dur_ns);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, e.tgid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, SCHED_TID_BASE + u64::from(e.tid));
                l.extend_from_slice(b",\"args\":{\"tid\":");
                push_u64(l, e.tid.into());
                if e.cpu == u32::MAX {
                    // Still in this state when recording stopped: cut at the end.
                    l.extend_from_slice(b",\"cut_at_end\":true}}");
                } else {
                    l.extend_from_slice(if e.kind == record_kind::ON_CPU {
                        b",\"cpu\":"
                    } else {
                        b",\"woken_on_cpu\":"
                    });
                    push_u64(l, e.cpu.into());
                    l.extend_from_slice(b"}}");
                }
                self.begin()?;
                self.w.write_all(&self.line)
            }
            record_kind::SYSCALL => {
                let ret = e.arg1 as i64;
                let l = &mut self.line;
                l.clear();
                l.extend_from_slice(b"{\"name\":");
                let nr = e.arg0;
                if nr < 4096 {
                    let i = nr as usize;
                    if i >= self.syscall_names.len() {
                        self.syscall_names.resize(i + 1, None);
                    }
                    let n = self.syscall_names[i].get_or_insert_with(|| quoted_syscall(nr));
                    l.extend_from_slice(n.as_bytes());
                } else {
                    l.extend_from_slice(quoted_syscall(nr).as_bytes());
                }
                l.extend_from_slice(b",\"cat\":\"syscall\",\"ph\":\"X\",\"ts\":");
                push_ts(l, e.start_ns, self.t0);
                l.extend_from_slice(b",\"dur\":");
                push_us(l, e.dur_ns);
                l.extend_from_slice(b",\"pid\":");
                push_u64(l, e.tgid.into());
                l.extend_from_slice(b",\"tid\":");
                push_u64(l, e.tid.into());
                // "nr" right before "ret": the bench counts `"nr":39,"ret":`.
                l.extend_from_slice(b",\"args\":{\"nr\":");
                push_u64(l, nr);
                l.extend_from_slice(b",\"ret\":");
                push_i64(l, ret);
                l.extend_from_slice(b",\"cpu\":");
                push_u64(l, e.cpu.into());
                if (-4095..0).contains(&ret) {
                    l.extend_from_slice(b",\"errno\":");
                    push_i64(l, -ret);
                }
                l.extend_from_slice(b"}}");
                self.begin()?;
                self.w.write_all(&self.line)
            }
            record_kind::GPU => {
                let op = e.arg0 as usize;
                let (name, mut args) = match CATALOG.get(op) {
                    Some(s) => {
                        let mut a = json!({
                            "op": op, "library": s.runtime.library(),
                            "category": s.category.as_str(), "ret": e.arg3 as i64 as i32,
                        });
                        if let Some(b) = gpu_bytes(&s.desc, e.arg1, e.arg2) {
                            a["bytes"] = json!(b);
                        }
                        (s.name.to_string(), a)
                    }
                    None => (format!("op {op}"), json!({"op": op})),
                };
                args["cpu"] = json!(e.cpu);
                let rel = self.rel(e.start_ns);
                self.value(&json!({
                    "name": name, "cat": "gpu", "ph": "X", "ts": rel,
                    "dur": e.dur_ns as f64 / 1000.0,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }))
            }
            record_kind::BLOCK => {
                self.block_id += 1;
                let dev = e.arg0 as u32;
                let rwbs = rwbs_str(e.arg3);
                let op = if rwbs.contains('D') {
                    "discard"
                } else if rwbs.contains('W') {
                    "write"
                } else if rwbs.contains('R') {
                    "read"
                } else if rwbs.contains('F') {
                    "flush"
                } else {
                    "other"
                };
                let dur = e.dur_ns as f64 / 1000.0;
                let ts = self.rel(e.start_ns);
                let args = json!({
                    "dev": format!("{}:{}", dev >> 20, dev & 0xfffff), "sector": e.arg1,
                    "bytes": e.arg2, "rwbs": rwbs, "tid": e.tid, "dur_us": dur,
                });
                let name = format!("block {op}");
                let id = self.block_id;
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "b", "id": id, "ts": ts,
                    "pid": e.tgid, "tid": e.tid, "args": args,
                }))?;
                self.value(&json!({
                    "name": name, "cat": "block", "ph": "e", "id": id, "ts": self.rel(e.start_ns + e.dur_ns),
                    "pid": e.tgid, "tid": e.tid,
                }))
            }
            _ => Ok(()),
        }
    }

    pub(super) fn rel(&self, ns: u64) -> f64 {
        (i128::from(ns) - i128::from(self.t0)) as f64 / 1000.0
    }

    /// The slice each live recorded thread was in when recording stopped (running, or off
    /// CPU), cut at the end, so that the timeline does not stop at each thread's last switch.
    pub(super) fn close_open_slices(
        &mut self,
        threads: &BpfHashMap<MapData, u32, RecordThread>,
        t_end: u64,
    ) -> std::io::Result<()> {
        for (tid, t) in threads.iter().filter_map(Result::ok) {
            if !Path::new(&format!("/proc/{}/task/{tid}", t.tgid)).exists() {
                continue; // exited: its last slice was emitted at its last switch-out
            }
            let (kind, start, arg0) = if t.on_ns != 0 {
                (record_kind::ON_CPU, t.on_ns, 0)
            } else if t.off_ns != 0 {
                (record_kind::OFF_CPU, t.off_ns, u64::from(t.off_reason))
            } else {
                continue;
            };
            if start >= t_end {
                continue;
            }
            self.event(&RecordEvent {
                kind,
                tgid: t.tgid,
                tid,
                cpu: u32::MAX,
                start_ns: start,
                dur_ns: t_end - start,
                arg0,
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Closes the trace (drop marker, metadata) and flushes it; the caller renames it.
    pub(super) fn finish(
        mut self,
        root: u32,
        t_end: u64,
        dropped: u64,
        meta: &Value,
    ) -> anyhow::Result<()> {
        let r = (|| -> std::io::Result<()> {
            if dropped > 0 {
                let ts = self.rel(t_end);
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
            serde_json::to_writer(&mut self.w, meta)?;
            self.w.write_all(b"}\n")?;
            self.w.flush()?;
            self.w.get_ref().sync_all()
        })();
        r.map_err(|e| self.error(e))
    }
}
