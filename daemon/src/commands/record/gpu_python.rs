//! The Python frames of each recorded GPU call (issue 41): the recording's GPU probe walks
//! the calling thread's CPython frames in the kernel, as the daemon's does, and the event
//! carries the stack's hash. Here the recorded processes are registered with the walk (the
//! daemon's [`PyWalker`], on the recording's own maps), and a call with a Python stack is
//! held until the reader has read the stack's code objects, at most [`HOLD`] (under the
//! Perfetto writer's reorder window, so it is still written in order), then written with its
//! frames. Code objects are read while the process lives: a call made just before its
//! process exits can be written with frames "not read yet".
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use ethand_common::{ProcKey, RecordEvent};

use crate::pipeline::{
    gpu::python::{PyFrames, PyWalker, Retention, WalkState},
    reader::ReaderHandle,
};

use super::trace::TraceWriter;

/// Longest a GPU call waits for its Python frames before it is written with what is known.
const HOLD: Duration = Duration::from_millis(200);
/// Python stacks a recording keeps read (520 bytes each: 2 MiB); past it, only those of the
/// calls held. A call still running when its stack is let go (over this many other stacks
/// since it began) is written without frames.
const KEPT_STACKS: usize = 4096;
/// Longest the end of a recording waits for the frames of the calls still held.
const LAST_WAIT: Duration = Duration::from_secs(1);

/// The recording's processes as the walk keys them: `ethand record` follows its tree by tgid
/// (registered with start time 0, see `PyProc::proc_start_ns`).
fn proc_key(tgid: u32) -> ProcKey {
    ProcKey {
        tgid,
        _pad0: 0,
        proc_start_ns: 0,
    }
}

pub(super) struct GpuPython {
    walker: PyWalker,
    frames: Arc<Mutex<PyFrames>>,
    held: Vec<(RecordEvent, Instant)>,
    /// What was told of each process's walk (a line on stderr, the summary's `python_walks`).
    told: HashMap<u32, String>,
    /// Calls written with Python frames, and those written before all were read.
    pub(super) with_frames: u64,
    pub(super) partly_read: u64,
}

impl GpuPython {
    pub(super) fn new(ebpf: &mut aya::Ebpf, enabled: bool, reader: ReaderHandle) -> Self {
        let frames = Arc::new(Mutex::new(PyFrames::default()));
        Self {
            walker: PyWalker::new(
                ebpf,
                enabled,
                reader,
                frames.clone(),
                Retention::UpTo(KEPT_STACKS),
            ),
            frames,
            held: Vec::new(),
            told: HashMap::new(),
            with_frames: 0,
            partly_read: 0,
        }
    }

    /// One round (at each drain): the recorded processes registered, the held calls' stacks
    /// asked for, and the calls whose frames are read (or that waited [`HOLD`]) written.
    pub(super) fn write(&mut self, tw: &mut TraceWriter) -> std::io::Result<()> {
        let now = Instant::now();
        self.held.extend(
            std::mem::take(&mut tw.pending_gpu)
                .into_iter()
                .map(|e| (e, now)),
        );
        let procs: Vec<u32> = tw.procs.keys().copied().collect();
        self.walker.round(
            procs.iter().map(|p| proc_key(*p)),
            self.held.iter().map(|(e, _)| (proc_key(e.tgid), e.arg3)),
        );
        self.tell(&procs);
        self.flush(tw, |_, since| since.elapsed() >= HOLD)
    }

    /// At the end: waits up to [`LAST_WAIT`] for the held calls' frames, then writes them all.
    pub(super) fn finish(&mut self, tw: &mut TraceWriter) -> std::io::Result<()> {
        let until = Instant::now() + LAST_WAIT;
        self.write(tw)?;
        while !self.held.is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
            self.write(tw)?;
        }
        self.flush(tw, |_, _| true)
    }

    /// What the summary says of each process's walk, by pid.
    pub(super) fn walks(&self) -> &HashMap<u32, String> {
        &self.told
    }

    /// Writes the held calls whose frames are all read, and those `due` says to write anyway.
    fn flush(
        &mut self,
        tw: &mut TraceWriter,
        due: impl Fn(&RecordEvent, Instant) -> bool,
    ) -> std::io::Result<()> {
        let frames = self.frames.clone();
        let frames = frames.lock().unwrap_or_else(PoisonError::into_inner);
        let mut kept = Vec::new();
        for (e, since) in std::mem::take(&mut self.held) {
            let got = frames.frames(&proc_key(e.tgid), e.arg3).unwrap_or_default();
            let read = !got.is_empty() && got.iter().all(|f| f.unresolved.is_none());
            if !read && !due(&e, since) {
                kept.push((e, since));
                continue;
            }
            let labels: Vec<String> = got.iter().map(|f| f.label()).collect();
            if !labels.is_empty() {
                self.with_frames += 1;
                if !read {
                    self.partly_read += 1;
                }
            }
            tw.gpu(&e, &labels)?;
        }
        self.held = kept;
        Ok(())
    }

    /// Says once per process whether its Python frames are walked.
    fn tell(&mut self, procs: &[u32]) {
        let frames = self.frames.lock().unwrap_or_else(PoisonError::into_inner);
        for pid in procs {
            if self.told.contains_key(pid) {
                continue;
            }
            let said = match frames.procs.get(&proc_key(*pid)).map(|p| &p.state) {
                Some(WalkState::Walked { minor }) => {
                    format!("the Python frames of its GPU calls are walked (CPython 3.{minor})")
                }
                Some(WalkState::Refused(why)) => {
                    format!("the Python frames of its GPU calls are not walked: {why}")
                }
                _ => continue,
            };
            eprintln!("ethand: pid {pid}: {said}");
            self.told.insert(*pid, said);
        }
    }
}
