//! What the GPU ran, for one snapshot: kernels, copies, memsets and syncs recorded by CUPTI
//! inside the tree's processes that were started with `libethand_cupti.so`
//! (`CUDA_INJECTION64_PATH`), for the snapshot's window only (docs/gpu-activity.md).
//!
//! The daemon installs the library (embedded in its binary) and its control file in
//! `gpu.cupti_dir`, and attaches the three probe programs to the installed file at start-up
//! (before it drops the capabilities that attaching a uprobe needs). The library calls the
//! probe functions only inside a window, so they cost nothing between windows; a process
//! calling them outside one costs itself a trap and a map lookup (`CUPTI_OPEN`). Between
//! windows the library sleeps on the control file's futex and CUPTI is not even loaded. A
//! snapshot enters each injected process in `CUPTI_OPEN` and writes its slot (a window id and
//! a deadline); the library records, hands over its records through the probe functions and
//! closes the window itself at the deadline. The collection loop drains the ring buffer each
//! round and answers when every process has said the window is over (or after a grace).
//! Only the daemon's own build of the library is probed, found by (device, inode), with the
//! offsets of the embedded bytes: no file a process maps is parsed.
use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use aya::{Ebpf, maps::RingBuf};
use ethand_snapshot::{
    gpu::LaunchSample,
    kernels::{ActivityState, GpuActivity, GpuActivityProcess},
};
use ethand_userspace_probes::cupti::ProcessKey;
use tracing::{debug, info, warn};

use crate::pipeline::{
    gpu::{GpuProbes, sites::Stack},
    procinfo::{monotonic_ns, unix_ms},
};

mod aggregate;
mod channel;
mod idle;
mod launch_sites;
mod launches;
mod stream;
mod tracer;

pub use aggregate::{
    CuptiSink, MAX_NAMES, apply as apply_cupti_event, closed_by, cut_short, ended as window_ended,
    name_text,
};
pub use channel::{Channel, ChannelError, control_thread, maps_a_library};
pub use launch_sites::resolve_launch_sites;
pub use launches::JoinedSite;
pub use stream::{
    MAX_DURATION as MAX_STREAM_DURATION, QUEUE_ENTRIES, StreamEnd, StreamRequest, Streamed,
    TracedProcess,
};
use tracer::{LaunchTracer, LinkKey};

/// The library, built from cupti/ by build.rs.
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libethand_cupti.so"));
pub const LIBRARY_NAME: &str = "libethand_cupti.so";
pub const CONTROL_NAME: &str = "ethand-cupti.ctl";

/// The probe programs and the library functions they attach to.
pub const PROGS: [(&str, &str); 3] = [
    ("cupti_batch", "ethand_cupti_batch"),
    ("cupti_name", "ethand_cupti_name"),
    ("cupti_window", "ethand_cupti_window"),
];

pub const METHOD: &str = "CUPTI activity (concurrent kernels, memcpy, memset, synchronization) recorded inside processes started with libethand_cupti.so (CUDA_INJECTION64_PATH), for this window only; CUPTI is loaded at the window's start and detached after it";

/// At most this many processes are recorded for one snapshot.
pub const MAX_PIDS: usize = 64;
/// Records summed for one snapshot, all its processes together: bounds the daemon's memory
/// (16 bytes per kernel kept for the busy-time union).
pub const RECORD_BUDGET: u64 = 1_000_000;
/// How long after its deadline a window's end is waited for.
const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// A snapshot's request, answered by the collection loop (which owns the probes).
pub struct Request {
    pub pids: Vec<u32>,
    pub duration: Duration,
    pub reply: std::sync::mpsc::SyncSender<Recorded>,
}

/// The answer: the tree's activity, and its processes' launch call sites before their
/// frames are read (`resolve_launch_sites`, once the snapshot is built).
#[derive(Default)]
pub struct Recorded {
    pub activity: GpuActivity,
    pub launch_sites: Vec<RawLaunchSites>,
}

/// One process's launch call sites as the kernel keyed them, with the user stacks they name.
pub struct RawLaunchSites {
    pub pid: u32,
    pub sites: Vec<JoinedSite>,
    pub stacks: HashMap<u32, Stack>,
}

struct Process {
    pid: u32,
    key: Option<ProcessKey>,
    /// The launch probes attached for this window (library file, pid), released at its end.
    traced: Vec<LinkKey>,
    window_id: u64,
    window: aggregate::Window,
    /// Decided before any window (not injected, attach failed).
    settled: Option<GpuActivityProcess>,
}

struct Active {
    started: Instant,
    started_unix_ms: u64,
    duration: Duration,
    processes: Vec<Process>,
    notes: Vec<String>,
    reply: std::sync::mpsc::SyncSender<Recorded>,
}

pub struct ActivitySampler {
    /// Err: why recording cannot work here.
    channel: Result<Channel, String>,
    active: Vec<Active>,
    /// The launch probes (Err: why kernels cannot be joined to their launches here; None:
    /// `diagnosis.launch_sites` off).
    launches: Option<Result<LaunchTracer, String>>,
    /// Windows whose entries go out raw, to `ethand record` (stream.rs).
    streams: stream::Streams,
}

impl ActivitySampler {
    /// Loads the programs and installs the library and its control file in `dir` (None:
    /// off, `gpu.cupti_dir` empty); `launch_sites`: whether windows trace the launches
    /// (`multi`: with uprobe_multi links).
    pub fn new(ebpf: &mut Ebpf, dir: Option<&Path>, launch_sites: bool, multi: bool) -> Self {
        let channel = match dir {
            None => Err("off (gpu.cupti_dir is empty)".into()),
            Some(dir) => Channel::new(ebpf, dir).map_err(|e| match e {
                ChannelError::Owned(e) => {
                    info!(error = %e, "GPU activity recording left to the other ethand");
                    format!("{e}; `ethand snapshot` without --standalone records through it")
                }
                ChannelError::Failed(e) => {
                    warn!(error = %e, "GPU activity recording unavailable");
                    e
                }
            }),
        };
        let launches = (launch_sites && channel.is_ok()).then(|| {
            LaunchTracer::new(ebpf, multi).map_err(|e| {
                warn!(error = %format!("{e:#}"), "kernels will not be joined to their launch call sites");
                format!("the launch probes could not be set up: {e:#}")
            })
        });
        Self {
            channel,
            active: Vec::new(),
            launches,
            streams: stream::Streams::default(),
        }
    }

    /// Where the library is, for `CUDA_INJECTION64_PATH`.
    pub fn library_path(&self) -> Option<&Path> {
        self.channel.as_ref().ok().map(Channel::library_path)
    }

    /// Starts new requests (a snapshot's, a recording's stream), takes the events that
    /// arrived, and answers the windows that are over (every one with `force`).
    pub fn tick(
        &mut self,
        ebpf: &mut Ebpf,
        gpu: &GpuProbes,
        (new, new_streams): (Vec<Request>, Vec<StreamRequest>),
        force: bool,
    ) {
        for r in new {
            self.start(ebpf, gpu, r);
        }
        for r in new_streams {
            self.streams.start(self.channel.as_mut(), r);
        }
        self.drain();
        self.streams.tick(self.channel.as_mut().ok(), force);
        let now = Instant::now();
        let (due, keep): (Vec<Active>, Vec<Active>) =
            std::mem::take(&mut self.active).into_iter().partition(|a| {
                // Every library said its window is over (at the deadline, or at once when
                // refused), or the grace after the deadline is spent.
                force
                    || now >= a.started + a.duration + CLOSE_GRACE
                    || a.processes
                        .iter()
                        .all(|p| p.settled.is_some() || p.window.done())
            });
        self.active = keep;
        for a in due {
            self.finish(ebpf, a);
        }
        if self.active.is_empty()
            && let Some(Ok(t)) = self.launches.as_mut()
            && t.links.is_empty()
        {
            t.clear_stacks();
        }
    }

    fn start(&mut self, ebpf: &mut Ebpf, gpu: &GpuProbes, r: Request) {
        let mut a = Active {
            started: Instant::now(),
            started_unix_ms: unix_ms(),
            duration: r.duration,
            processes: Vec::new(),
            notes: Vec::new(),
            reply: r.reply,
        };
        let channel = match self.channel.as_mut() {
            Ok(c) => c,
            Err(e) => {
                a.notes
                    .push(format!("GPU activity recording unavailable: {e}"));
                a.duration = Duration::ZERO;
                self.active.push(a);
                return;
            }
        };
        let mut pids = r.pids;
        pids.sort_unstable();
        pids.dedup();
        if pids.len() > MAX_PIDS {
            a.notes.push(format!(
                "{} processes map a GPU runtime; the first {MAX_PIDS} by pid were recorded",
                pids.len()
            ));
            pids.truncate(MAX_PIDS);
        }
        let budget = RECORD_BUDGET / pids.len().max(1) as u64;
        let deadline = monotonic_ns() + r.duration.as_nanos() as u64;
        for pid in pids {
            let mut p = Process {
                pid,
                key: None,
                traced: Vec::new(),
                window_id: 0,
                window: aggregate::Window::new(budget),
                settled: None,
            };
            if let Err((state, detail)) = may_record(channel, pid) {
                p.settled = Some(settled(pid, state, detail));
                a.processes.push(p);
                continue;
            }
            // Before the window opens, so that its first kernels find their launches.
            match self.launches.as_mut() {
                None => {}
                Some(Ok(t)) => {
                    let traced = t.attach(ebpf, gpu, pid, &mut p.traced);
                    p.window.trace_launches(traced);
                }
                Some(Err(e)) => p.window.trace_launches(Err(e.clone())),
            }
            p.window_id = channel.next_window_id();
            match channel.open(pid, p.window_id, deadline, budget) {
                Ok(key) => p.key = Some(key),
                Err(detail) => {
                    p.settled = Some(settled(pid, ActivityState::Failed, detail));
                    channel.close(pid, None, p.window_id);
                }
            }
            a.processes.push(p);
        }
        debug!(pids = ?a.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), "GPU activity windows opened");
        self.active.push(a);
    }

    fn close_window(&mut self, p: &Process) {
        if let Ok(c) = self.channel.as_mut() {
            c.close(p.pid, p.key, p.window_id);
        }
    }

    /// Everything the probes wrote, to the windows it belongs to; the rest is dropped.
    fn drain(&mut self) {
        if self.active.is_empty() && self.streams.is_empty() {
            return;
        }
        let Ok(channel) = self.channel.as_ref() else {
            return;
        };
        let mut by_window: HashMap<(u32, u64), (usize, usize)> = HashMap::new();
        for (ai, a) in self.active.iter().enumerate() {
            for (pi, p) in a.processes.iter().enumerate() {
                if p.window_id != 0 {
                    by_window.insert((p.pid, p.window_id), (ai, pi));
                }
            }
        }
        let active = &mut self.active;
        let streams = &mut self.streams;
        channel.drain(|item| {
            if streams.offer(item) {
                return;
            }
            aggregate::apply(item, |tgid, window_id| {
                let &(ai, pi) = by_window.get(&(tgid, window_id))?;
                Some(&mut active[ai].processes[pi].window)
            });
        });
        let Some(Ok(mut launches)) = self
            .launches
            .as_ref()
            .and_then(|l| l.as_ref().ok())
            .map(|t| RingBuf::try_from(&t.events))
        else {
            return;
        };
        while let Some(item) = launches.next() {
            let active = &mut self.active;
            aggregate::apply_launch(&item, |tgid, window_id| {
                let &(ai, pi) = by_window.get(&(tgid, window_id))?;
                Some(&mut active[ai].processes[pi].window)
            });
        }
    }

    fn finish(&mut self, ebpf: &mut Ebpf, mut a: Active) {
        let elapsed = a.started.elapsed();
        let mut processes = Vec::new();
        let mut launch_sites = Vec::new();
        for mut p in std::mem::take(&mut a.processes) {
            self.close_window(&p);
            if let Some(Ok(t)) = self.launches.as_mut() {
                t.release(ebpf, std::mem::take(&mut p.traced));
            }
            processes.push(match p.settled {
                Some(s) => s,
                None => {
                    let (done, joined) = p.window.finish(p.pid);
                    if let (Some(j), Some(Ok(t))) = (joined, self.launches.as_ref()) {
                        launch_sites.push(RawLaunchSites {
                            pid: p.pid,
                            stacks: t.stacks_of(&j.sites),
                            sites: j.sites,
                        });
                    }
                    done
                }
            });
        }
        let _ = a.reply.try_send(Recorded {
            activity: GpuActivity {
                method: METHOD.into(),
                started_unix_ms: a.started_unix_ms,
                duration_ms: elapsed.as_millis() as u64,
                processes,
                notes: a.notes,
            },
            launch_sites,
        });
    }
}

/// Kernels recorded per launch counted below which a window's records are called incomplete:
/// each launch call makes at least one kernel (a graph launch many), so a healthy window
/// records as many kernels per second as the uprobes count launches.
const MIN_KERNELS_PER_LAUNCH: f64 = 0.5;
/// Launches a process must have made in the launch sample for the check to say anything.
const MIN_LAUNCHES: u64 = 100;
/// The launch sample and the window must be about as long (both start with the snapshot; at
/// the defaults both last 2 s): a job that launches in bursts is otherwise compared over
/// different stretches of its work.
const MAX_LENGTH_RATIO: f64 = 1.5;

/// Demangles the recorded kernels' C++ names, in the reader as each process's owner (the
/// names are the process's to choose); after the model lock is released.
pub fn demangle_kernels(
    activity: &mut Option<GpuActivity>,
    reader: &crate::pipeline::reader::ReaderHandle,
) {
    let Some(a) = activity else { return };
    for p in a.processes.iter_mut() {
        launch_sites::demangle_sites(p, reader);
        let mangled: Vec<usize> = (0..p.kernels.len())
            .filter(|i| {
                p.kernels[*i]
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("_Z"))
            })
            .collect();
        if mangled.is_empty() {
            continue;
        }
        let names: Vec<String> = mangled
            .iter()
            .filter_map(|i| p.kernels[*i].name.clone())
            .collect();
        for (i, d) in mangled.iter().zip(reader.demangle(p.pid, &names)) {
            p.kernels[*i].demangled = d;
        }
    }
}

/// Marks the processes whose records fell short of their launches, counted by the snapshot's
/// launch sample over about the same time: a tool that registers its own CUPTI activity
/// buffers during the window takes the records from the library's current buffer on (the
/// stand-in CUPTI does so; not yet seen on a GPU).
pub fn check_against_launches(activity: &mut Option<GpuActivity>, launches: &Option<LaunchSample>) {
    let (Some(activity), Some(launches)) = (activity.as_mut(), launches.as_ref()) else {
        return;
    };
    if launches.duration_ms == 0 {
        return;
    }
    for p in activity.processes.iter_mut() {
        let (ActivityState::Recorded, Some(window_ns)) = (p.state, p.window_ns) else {
            continue;
        };
        let Some(counted) = launches.processes.iter().find(|l| l.pid == p.pid) else {
            continue;
        };
        let sample_ns = launches.duration_ms as f64 * 1e6;
        let ratio = window_ns as f64 / sample_ns;
        if counted.launches < MIN_LAUNCHES
            || window_ns == 0
            || !(1.0 / MAX_LENGTH_RATIO..=MAX_LENGTH_RATIO).contains(&ratio)
        {
            continue;
        }
        let kernels: u64 = p.devices.iter().map(|d| d.kernels).sum();
        let recorded_per_s = kernels as f64 * 1e9 / window_ns as f64;
        let counted_per_s = counted.launches as f64 * 1e9 / sample_ns;
        if recorded_per_s < MIN_KERNELS_PER_LAUNCH * counted_per_s {
            p.incomplete = Some(format!(
                "{recorded_per_s:.0} kernels/s recorded against {counted_per_s:.0} launches/s counted by the uprobes: records stopped short (another tool may have taken CUPTI's activity buffers during the window); the figures cover part of the window"
            ));
        }
    }
}

/// Whether a window may be opened in `pid`: it maps the channel's library and runs its
/// thread; otherwise its state and why.
fn may_record(channel: &Channel, pid: u32) -> Result<(), (ActivityState, String)> {
    match channel.injected(pid) {
        // Forked after cuInit: the mapping came along, the library's thread did not.
        // Waiting for its answer would hold the window to its grace.
        Ok(true) if control_thread(pid) == Some(false) => Err((
            ActivityState::Forked,
            "maps the library without its thread (a child forked after cuInit, such as a DataLoader worker): nothing to record".into(),
        )),
        Ok(true) => Ok(()),
        Ok(false) => Err((
            ActivityState::NotInjected,
            format!(
                "started without CUDA_INJECTION64_PATH={}: nothing recorded",
                channel.library_path().display()
            ),
        )),
        Err(detail) => Err((ActivityState::Failed, detail)),
    }
}

/// Opens a window in `pid` (it maps the channel's library and runs its thread) until
/// `deadline_mono_ns`: its key and window id; otherwise its state and why.
pub fn open_window(
    channel: &mut Channel,
    pid: u32,
    deadline_mono_ns: u64,
    max_records: u64,
) -> Result<(ProcessKey, u64), (ActivityState, String)> {
    may_record(channel, pid)?;
    let window_id = channel.next_window_id();
    channel
        .open(pid, window_id, deadline_mono_ns, max_records)
        .map(|key| (key, window_id))
        .map_err(|detail| {
            channel.close(pid, None, window_id);
            (ActivityState::Failed, detail)
        })
}

fn settled(pid: u32, state: ActivityState, detail: String) -> GpuActivityProcess {
    GpuActivityProcess {
        pid,
        state,
        detail: Some(detail),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_snapshot::{gpu::LaunchSampleProcess, kernels::DeviceActivity};

    fn recorded(pid: u32, kernels: u64, window_ns: u64) -> GpuActivityProcess {
        GpuActivityProcess {
            pid,
            state: ActivityState::Recorded,
            window_ns: Some(window_ns),
            devices: vec![DeviceActivity {
                kernels,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Rates as on the H200 (2026-12-07): a 4.98 s window of a loop launching ~1,850 kernels
    /// a second recorded 9,616; a window that recorded a quarter of that is short.
    #[test]
    fn records_short_of_the_launches_are_called_incomplete() {
        let launches = LaunchSample {
            duration_ms: 4000,
            processes: vec![
                LaunchSampleProcess {
                    pid: 1,
                    launches: 5550,
                },
                LaunchSampleProcess {
                    pid: 2,
                    launches: 5550,
                },
                LaunchSampleProcess {
                    pid: 3,
                    launches: 60,
                },
            ],
            ..Default::default()
        };
        let mut a = Some(GpuActivity {
            processes: vec![
                recorded(1, 9616, 4_984_549_990),
                recorded(2, 2565, 4_982_611_614),
                // Too few launches to say: a process mostly idle.
                recorded(3, 2, 4_982_611_614),
                // Not counted at all.
                recorded(4, 0, 4_982_611_614),
                // A window three times the sample's length: not compared.
                recorded(5, 2565, 9_000_000_000),
            ],
            ..Default::default()
        });
        check_against_launches(&mut a, &Some(launches));
        let a = a.expect("kept");
        let flagged: Vec<u32> = a
            .processes
            .iter()
            .filter(|p| p.incomplete.is_some())
            .map(|p| p.pid)
            .collect();
        assert_eq!(flagged, vec![2]);
        let why = a.processes[1].incomplete.as_deref().unwrap();
        assert!(
            why.contains("515 kernels/s") && why.contains("1388 launches/s"),
            "{why}"
        );
    }
}
