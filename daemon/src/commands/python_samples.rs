//! Python frames for `ethand record`: the stacks of the tree's Python threads, read from
//! outside the processes (by the reader, as each process's owner: `python_readers.rs`, as the
//! snapshot's stack sample reads them) every `1 / hz` s on a thread of their own, for the whole recording. Reads take
//! 0.1 to 1 ms each, so they stay off the loop that drains the ring buffer; the samples reach
//! it through a bounded channel, and what does not fit is counted, never waited for.
//!
//! **Invariant:** nothing here stops or writes to a recorded process; a process that cannot be
//! read is a note in the trace's metadata, never an error of the recording.
use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::pipeline::{
    procinfo::{self, monotonic_ns},
    python_readers::{PythonReaders, ReadError},
    reader::ReaderHandle,
    stack_sample::{self, MAX_PROCESSES},
};

/// Samples in flight between the reader thread and the writer: two seconds of 50 threads at
/// 99 a second.
const CHANNEL: usize = 10_000;
/// How often the tree is searched for new Python processes.
const RESCAN: Duration = Duration::from_secs(1);

/// One thread's Python stack at one moment.
pub struct PySample {
    /// CLOCK_MONOTONIC, as the kernel's events.
    pub ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// On a CPU or runnable (py-spy's idle heuristics and the OS thread state).
    pub active: bool,
    pub owns_gil: bool,
    /// Frame labels ("train.py:41 in step()"), innermost first.
    pub frames: Vec<String>,
}

/// What the reader did, for the trace's metadata.
#[derive(Default)]
pub struct PyStats {
    /// Processes read at least once.
    pub processes: Vec<u32>,
    pub reads: u64,
    /// Reads that failed (a stack torn while the thread moved on): lost, not guessed.
    pub read_errors: u64,
    /// Samples the writer had no room for.
    pub dropped: u64,
    pub notes: Vec<String>,
}

pub struct PythonSampler {
    pub samples: Receiver<PySample>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<PyStats>,
}

impl PythonSampler {
    /// Starts reading the Python processes of the tree of `root` (and those it starts later)
    /// `hz` times a second.
    pub fn start(reader: ReaderHandle, root: u32, hz: u32) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel(CHANNEL);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("python-samples".into())
            .spawn(move || read_loop(&reader, root, hz, &tx, &flag))?;
        Ok(Self {
            samples: rx,
            stop,
            thread,
        })
    }

    /// Stops the reader; the samples it sent stay in `samples`.
    pub fn stop(self) -> (Receiver<PySample>, PyStats) {
        self.stop.store(true, Ordering::Relaxed);
        let stats = self.thread.join().unwrap_or_else(|_| PyStats {
            notes: vec!["the Python frame reader stopped unexpectedly".into()],
            ..PyStats::default()
        });
        (self.samples, stats)
    }
}

fn read_loop(
    reader: &ReaderHandle,
    root: u32,
    hz: u32,
    tx: &SyncSender<PySample>,
    stop: &AtomicBool,
) -> PyStats {
    let mut stats = PyStats::default();
    let mut readers = PythonReaders::new(reader);
    // Processes already tried: Python or not, each is opened once.
    let mut tried: HashSet<u32> = HashSet::new();
    let period = Duration::from_secs(1) / hz.max(1);
    let mut next_scan = Instant::now();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_scan {
            next_scan = now + RESCAN;
            for pid in readers.pids() {
                if !procinfo::exists(pid) {
                    readers.close(pid);
                }
            }
            for pid in procinfo::descendants(root) {
                if !tried.insert(pid) {
                    continue;
                }
                if readers.pids().len() >= MAX_PROCESSES {
                    if ethand_reader::python::looks_like_python(pid) {
                        stats.notes.push(format!(
                            "process {pid} not read: at most {MAX_PROCESSES} Python processes"
                        ));
                    }
                    continue;
                }
                match readers.open(pid) {
                    Ok(true) => stats.processes.push(pid),
                    Ok(false) => {}
                    Err(e) => stats.notes.push(e),
                }
            }
        }
        for pid in readers.pids() {
            stats.reads += 1;
            let ns = monotonic_ns();
            match readers.stacks(pid) {
                Ok(stacks) => {
                    for t in stacks {
                        // A thread the interpreter does not map to an OS thread has no track.
                        let Some(tid) = t.tid else { continue };
                        let s = PySample {
                            ns,
                            pid,
                            tid,
                            active: t.active,
                            owns_gil: t.owns_gil,
                            frames: t.frames.iter().map(|f| f.label()).collect(),
                        };
                        match tx.try_send(s) {
                            Ok(()) => {}
                            Err(TrySendError::Full(_)) => stats.dropped += 1,
                            Err(TrySendError::Disconnected(_)) => return stats,
                        }
                    }
                }
                Err(ReadError::Torn(_)) => stats.read_errors += 1,
                Err(ReadError::Lost(note)) => {
                    stats.read_errors += 1;
                    stats.notes.push(note);
                }
            }
        }
        stack_sample::wait_tick(&mut next, period);
    }
    stats
}
