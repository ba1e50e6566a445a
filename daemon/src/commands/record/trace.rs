//! What a recording writes, whatever the format: each kernel `RecordEvent` (and each sample)
//! decoded once into a [`TraceEvent`], processes and threads named once from /proc, and both
//! handed to every output's [`Encoder`] (`json.rs`, `perfetto.rs`), which streams it to its
//! FILE.tmp with bounded memory.
use std::{collections::HashMap, fs, io, path::PathBuf};

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use ethand_common::{
    GpuOpDesc, RecordEvent, RecordThread, gpu_dtype, gpu_kind, record_gpu_op_ret, record_kind,
    record_off,
};
use ethand_snapshot::kernels::{CopyKind, KernelClass, MemoryKind};
use ethand_userspace_probes::catalog::{CATALOG, Category};
use serde_json::Value;

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

/// A thread's scheduler state over a slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SchedState {
    Running,
    Blocked,
    Preempted,
    /// Off the CPU for a reason the kernel did not tell.
    OffCpu,
}

impl SchedState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Blocked => "blocked",
            Self::Preempted => "preempted",
            Self::OffCpu => "off-cpu",
        }
    }
}

/// A GPU/NPU runtime call's catalog entry, when the op is known.
#[derive(Clone, Copy, Debug)]
pub(super) struct GpuOpInfo {
    pub library: &'static str,
    pub category: &'static str,
}

/// What a GPU track's slice is.
#[derive(Clone, Copy, Debug)]
pub(super) enum GpuWork {
    Kernel {
        name_id: u32,
        grid: [u32; 3],
        block: [u32; 3],
    },
    Copy {
        kind: CopyKind,
        src: MemoryKind,
        dst: MemoryKind,
        bytes: u64,
    },
    Memset {
        bytes: u64,
    },
}

/// A kernel's launch call, as the kernel's slice refers to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LaunchLink {
    pub tid: u32,
    /// When the host queued the kernel (CLOCK_MONOTONIC), inside the call.
    pub queued: u64,
    pub flow: u64,
}

/// The flow id of a launch call: the same for the call's slice and its kernel's. Non-zero
/// (two calls of one thread never start at the same ns) and under 2^53, so that a JSON
/// reader's doubles hold it exactly.
pub(super) fn launch_flow(tid: u32, start_ns: u64) -> u64 {
    let h = start_ns.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(tid).rotate_left(40);
    (h >> 11) | 1
}

/// One recorded event as every output sees it (times: CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
pub(super) enum TraceEvent<'a> {
    /// `cpu`: where it ran (running) or was woken (off the CPU); None: still in this state
    /// when recording stopped, cut at the end.
    Sched {
        pid: u32,
        tid: u32,
        state: SchedState,
        start: u64,
        dur: u64,
        cpu: Option<u32>,
    },
    Syscall {
        pid: u32,
        tid: u32,
        nr: u64,
        name: &'a str,
        start: u64,
        dur: u64,
        ret: i64,
        cpu: u32,
    },
    Gpu {
        pid: u32,
        tid: u32,
        op: u64,
        name: &'a str,
        info: Option<GpuOpInfo>,
        ret: i32,
        bytes: Option<u64>,
        start: u64,
        dur: u64,
        cpu: u32,
        /// The calling thread's Python frames, innermost first (empty: none walked).
        python: &'a [String],
        /// A kernel launch while GPU tracks are recorded: the flow to its kernel.
        flow: Option<u64>,
    },
    /// `id`: the request's number in this recording (from 1).
    Block {
        pid: u32,
        tid: u32,
        id: u64,
        op: &'static str,
        dev: u32,
        sector: u64,
        bytes: u64,
        rwbs: &'a str,
        start: u64,
        dur: u64,
    },
    /// Frames innermost first, kernel then user.
    CpuSample {
        pid: u32,
        tid: u32,
        ts: u64,
        stack: &'a [&'a str],
    },
    /// Work the GPU ran (`gpu_tracks.rs`), on the process's GPU track `track` (announced
    /// by [`Encoder::gpu_track`]). `name`: the kernel's name as CUPTI gave it, or the copy's
    /// direction, or "memset"; `demangled` where it is a mangled C++ name.
    GpuActivity {
        pid: u32,
        track: u32,
        what: GpuWork,
        name: &'a str,
        demangled: Option<&'a str>,
        class: Option<KernelClass>,
        device: u32,
        stream: u32,
        correlation: u32,
        start: u64,
        dur: u64,
        /// The launch call that made this kernel: its thread, the kernel's queued time
        /// (inside the call) and their flow.
        launch: Option<LaunchLink>,
    },
    /// Python frames innermost first.
    PythonSample {
        pid: u32,
        tid: u32,
        ts: u64,
        frames: &'a [String],
        active: bool,
        gil: bool,
    },
}

/// How a recording ends, for the closing part of each output.
pub(super) struct Ending<'a> {
    pub root: u32,
    pub t_end: u64,
    /// Events the kernel could not put in the ring buffer.
    pub dropped: u64,
    pub meta: &'a Value,
}

/// One output format, streaming to its file.
pub(super) trait Encoder {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()>;
    /// After the thread's process.
    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()>;
    /// A GPU track of the process (a device's stream), numbered from 0 across the
    /// recording, before its first event; after the process.
    fn gpu_track(&mut self, pid: u32, track: u32, label: &str) -> io::Result<()>;
    fn event(&mut self, e: &TraceEvent<'_>) -> io::Result<()>;
    /// The closing part, flushed and synced to disk.
    fn finish(self: Box<Self>, end: &Ending<'_>) -> io::Result<()>;
    /// Bytes on disk so far.
    fn written_bytes(&self) -> u64;
    /// A ring output: the recording ends at `end_ns`; no more segments started or
    /// dropped; what it kept. None: no ring.
    fn stop_rotating(&mut self, _end_ns: u64) -> io::Result<Option<ethand_perfetto::RingStats>> {
        Ok(None)
    }
}

/// Counts what passes to the file (for `--max-size` and the summary).
pub(super) struct Counting<W> {
    pub inner: W,
    pub written: u64,
}

impl<W: io::Write> io::Write for Counting<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(b)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// CPU samples held between two symbolization rounds (half a second): 99 samples a second
/// of 1,000 busy threads fit.
pub(super) const MAX_PENDING_SAMPLES: usize = 100_000;
/// GPU calls held until their Python frames are read (`gpu_python.rs`); past it a call is
/// written at once, with no Python frames.
pub(super) const MAX_PENDING_GPU: usize = 100_000;

/// Decodes the recording and feeds every output.
pub(super) struct TraceWriter {
    pub(super) outputs: Vec<Box<dyn Encoder>>,
    /// The outputs' FILE.tmp, for error messages.
    pub(super) tmp: Vec<PathBuf>,
    /// Recorded events written so far (what `recorded N events` says).
    pub(super) events: u64,
    pub(super) block_id: u64,
    pub(super) procs: HashMap<u32, String>,
    pub(super) threads: HashMap<(u32, u32), String>,
    /// CPU samples waiting for their stacks to be symbolized (see `Samples`), and those
    /// lost with it full.
    pub(super) pending: Vec<RecordEvent>,
    pub(super) pending_dropped: u64,
    /// GPU calls with a Python stack, waiting for its frames (see `GpuPython`).
    pub(super) pending_gpu: Vec<RecordEvent>,
    /// Syscall names by number, looked up once (the table is a list).
    syscall_names: Vec<Option<String>>,
    /// Kernel launch calls, kept while GPU tracks are recorded (their kernels' flows).
    pub(super) launches: Option<super::launch_index::LaunchIndex>,
}

impl TraceWriter {
    pub(super) fn new(outputs: Vec<Box<dyn Encoder>>, tmp: Vec<PathBuf>) -> Self {
        Self {
            outputs,
            tmp,
            events: 0,
            block_id: 0,
            procs: HashMap::new(),
            threads: HashMap::new(),
            pending: Vec::new(),
            pending_dropped: 0,
            pending_gpu: Vec::new(),
            syscall_names: Vec::new(),
            launches: None,
        }
    }

    /// What went wrong while writing, naming the files and what they had. The caller
    /// removes each FILE.tmp: nothing half-written is left behind under FILE's name.
    pub(super) fn error(&self, e: io::Error) -> anyhow::Error {
        let files: Vec<String> = self.tmp.iter().map(|p| p.display().to_string()).collect();
        anyhow::anyhow!(
            "cannot write {}: {e} ({} events written before the error; recording stopped, \
             the partial file removed)",
            files.join(" and "),
            self.events
        )
    }

    /// Bytes on disk so far, the largest output's.
    pub(super) fn written_bytes(&self) -> u64 {
        self.outputs
            .iter()
            .map(|o| o.written_bytes())
            .max()
            .unwrap_or(0)
    }

    pub(super) fn emit(&mut self, e: &TraceEvent<'_>) -> io::Result<()> {
        self.events += 1;
        for o in &mut self.outputs {
            o.event(e)?;
        }
        Ok(())
    }

    pub(super) fn learn_process(&mut self, pid: u32) -> io::Result<()> {
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

    fn new_process(&mut self, pid: u32, name: String) -> io::Result<()> {
        for o in &mut self.outputs {
            o.process(pid, &name)?;
        }
        self.procs.insert(pid, name);
        Ok(())
    }

    pub(super) fn learn_thread(&mut self, pid: u32, tid: u32) -> io::Result<()> {
        if self.threads.contains_key(&(pid, tid)) {
            return Ok(());
        }
        if !self.procs.contains_key(&pid) {
            let n = comm(&format!("/proc/{pid}/comm")).unwrap_or_else(|| format!("pid {pid}"));
            self.new_process(pid, n)?;
        }
        let n =
            comm(&format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_else(|| format!("tid {tid}"));
        for o in &mut self.outputs {
            o.thread(pid, tid, &n)?;
        }
        self.threads.insert((pid, tid), n);
        Ok(())
    }

    /// A GPU track of `pid` (`gpu_tracks.rs` numbers them), announced to every output.
    pub(super) fn gpu_track(&mut self, pid: u32, track: u32, label: &str) -> io::Result<()> {
        if !self.procs.contains_key(&pid) {
            let n = comm(&format!("/proc/{pid}/comm")).unwrap_or_else(|| format!("pid {pid}"));
            self.new_process(pid, n)?;
        }
        for o in &mut self.outputs {
            o.gpu_track(pid, track, label)?;
        }
        Ok(())
    }

    /// Takes every event the ring buffer holds and writes it.
    pub(super) fn drain(&mut self, ring: &mut RingBuf<MapData>) -> io::Result<()> {
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

    /// One recorded event.
    pub(super) fn event(&mut self, e: &RecordEvent) -> io::Result<()> {
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
        let (pid, tid, start, dur) = (e.tgid, e.tid, e.start_ns, e.dur_ns);
        match e.kind {
            record_kind::ON_CPU | record_kind::OFF_CPU => {
                let state = match (e.kind, e.arg0) {
                    (record_kind::ON_CPU, _) => SchedState::Running,
                    (_, record_off::BLOCKED) => SchedState::Blocked,
                    (_, record_off::PREEMPTED) => SchedState::Preempted,
                    _ => SchedState::OffCpu,
                };
                let cpu = (e.cpu != u32::MAX).then_some(e.cpu);
                self.emit(&TraceEvent::Sched {
                    pid,
                    tid,
                    state,
                    start,
                    dur,
                    cpu,
                })
            }
            record_kind::SYSCALL => {
                let nr = e.arg0;
                let i = usize::try_from(nr).unwrap_or(usize::MAX).min(4096);
                if i >= self.syscall_names.len() {
                    self.syscall_names.resize(i + 1, None);
                }
                // Taken out while the event is written (it borrows the writer); numbers past
                // 4096 share the last slot, looked up each time.
                let name = match self.syscall_names[i].take() {
                    Some(n) if i < 4096 => n,
                    _ => syscalls_table::name(nr as u32),
                };
                let r = self.emit(&TraceEvent::Syscall {
                    pid,
                    tid,
                    nr,
                    name: &name,
                    start,
                    dur,
                    ret: e.arg1 as i64,
                    cpu: e.cpu,
                });
                if i < 4096 {
                    self.syscall_names[i] = Some(name);
                }
                r
            }
            record_kind::GPU => {
                // Indexed as it arrives, for the kernels that come before the call is
                // written (its Python frames are read first).
                if let Some(l) = self.launches.as_mut()
                    && CATALOG
                        .get(record_gpu_op_ret(e.arg0).0 as usize)
                        .is_some_and(|s| s.category == Category::Launch)
                {
                    l.add(pid, tid, start, start.saturating_add(dur));
                }
                // Written once its Python frames are read, by `GpuPython::write`.
                if e.arg3 != 0 && self.pending_gpu.len() < MAX_PENDING_GPU {
                    self.pending_gpu.push(*e);
                    return Ok(());
                }
                self.gpu(e, &[])
            }
            record_kind::BLOCK => {
                self.block_id += 1;
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
                self.emit(&TraceEvent::Block {
                    pid,
                    tid,
                    id: self.block_id,
                    op,
                    dev: e.arg0 as u32,
                    sector: e.arg1,
                    bytes: e.arg2,
                    rwbs: &rwbs,
                    start,
                    dur,
                })
            }
            _ => Ok(()),
        }
    }

    /// A GPU/NPU runtime call, with the calling thread's Python frames.
    pub(super) fn gpu(&mut self, e: &RecordEvent, python: &[String]) -> io::Result<()> {
        let (op, ret) = record_gpu_op_ret(e.arg0);
        let spec = CATALOG.get(op as usize);
        let fallback = format!("op {op}");
        let flow = (self.launches.is_some()
            && spec.is_some_and(|s| s.category == Category::Launch))
        .then(|| launch_flow(e.tid, e.start_ns));
        self.emit(&TraceEvent::Gpu {
            pid: e.tgid,
            tid: e.tid,
            op,
            name: spec.map_or(fallback.as_str(), |s| s.name),
            info: spec.map(|s| GpuOpInfo {
                library: s.runtime.library(),
                category: s.category.as_str(),
            }),
            ret,
            bytes: spec.and_then(|s| gpu_bytes(&s.desc, e.arg1, e.arg2)),
            start: e.start_ns,
            dur: e.dur_ns,
            cpu: e.cpu,
            python,
            flow,
        })
    }

    /// The slice each live recorded thread was in when recording stopped (running, or off
    /// CPU), cut at the end, so that the timeline does not stop at each thread's last switch.
    pub(super) fn close_open_slices(
        &mut self,
        threads: &BpfHashMap<MapData, u32, RecordThread>,
        t_end: u64,
    ) -> io::Result<()> {
        for (tid, t) in threads.iter().filter_map(Result::ok) {
            if !std::path::Path::new(&format!("/proc/{}/task/{tid}", t.tgid)).exists() {
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

    /// Closes every output (drop marker, metadata), flushed and synced; the caller renames.
    /// The rings' figures (one ring: `--ring` allows Perfetto outputs only, and two of
    /// them keep the same events).
    pub(super) fn stop_rotating(
        &mut self,
        end_ns: u64,
    ) -> anyhow::Result<Option<ethand_perfetto::RingStats>> {
        let mut first = None;
        for i in 0..self.outputs.len() {
            let r = self.outputs[i]
                .stop_rotating(end_ns)
                .map_err(|e| self.error(e))?;
            first = first.or(r);
        }
        Ok(first)
    }

    pub(super) fn finish(self, end: &Ending<'_>) -> anyhow::Result<()> {
        let Self {
            outputs,
            tmp,
            events,
            ..
        } = self;
        for o in outputs {
            o.finish(end).map_err(|e| {
                let files: Vec<String> = tmp.iter().map(|p| p.display().to_string()).collect();
                anyhow::anyhow!(
                    "cannot write {}: {e} ({events} events written before the error; \
                     recording stopped, the partial file removed)",
                    files.join(" and ")
                )
            })?;
        }
        Ok(())
    }
}

/// A GPU slice's category and arguments, the same in every output; `dims` holds the
/// kernel's grid and block as written ("x,y,z").
pub(super) fn gpu_work_args<'a>(
    e: &TraceEvent<'a>,
    dims: &'a mut [String; 2],
) -> (&'static str, Vec<ethand_perfetto::Arg<'a>>) {
    use ethand_perfetto::Arg;
    let &TraceEvent::GpuActivity {
        what,
        name,
        demangled,
        class,
        device,
        stream,
        correlation,
        ..
    } = e
    else {
        return ("gpu_kernel", Vec::new());
    };
    let mut args = vec![
        Arg::Uint("device", device.into()),
        Arg::Uint("stream", stream.into()),
        Arg::Uint("correlation", correlation.into()),
    ];
    let category = match what {
        GpuWork::Kernel { grid, block, .. } => {
            let [g, b] = dims;
            *g = format!("{},{},{}", grid[0], grid[1], grid[2]);
            *b = format!("{},{},{}", block[0], block[1], block[2]);
            if demangled.is_some() {
                args.push(Arg::Str("mangled", name));
            }
            if let Some(c) = class {
                args.push(Arg::Str("class", c.as_str()));
            }
            args.push(Arg::Str("grid", g));
            args.push(Arg::Str("block", b));
            "gpu_kernel"
        }
        GpuWork::Copy {
            src, dst, bytes, ..
        } => {
            args.push(Arg::Str("src", src.as_str()));
            args.push(Arg::Str("dst", dst.as_str()));
            args.push(Arg::Uint("bytes", bytes));
            "gpu_memcpy"
        }
        GpuWork::Memset { bytes } => {
            args.push(Arg::Uint("bytes", bytes));
            "gpu_memset"
        }
    };
    (category, args)
}
