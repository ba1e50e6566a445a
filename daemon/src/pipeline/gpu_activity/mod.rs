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
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    programs::uprobe::{UProbeLinkId, UProbeScope},
};
use ethand_common::cupti_kinds;
use ethand_snapshot::{
    gpu::LaunchSample,
    kernels::{ActivityState, GpuActivity, GpuActivityProcess},
};
use ethand_userspace_probes::cupti::{
    ControlError, ControlFile, ControlLock, ProcessKey, WindowRequest,
};
use tracing::{debug, info, warn};

use crate::pipeline::{
    bpf_error::take_map,
    gpu::{GpuProbes, sites::Stack},
    procinfo::{monotonic_ns, unix_ms},
    uprobes,
};

mod aggregate;
mod idle;
mod launch_sites;
mod launches;
mod tracer;

pub use launch_sites::resolve_launch_sites;
pub use launches::JoinedSite;
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

/// The library as installed: its file, its identity and the probe functions' file offsets.
struct Installed {
    path: PathBuf,
    dev: u64,
    ino: u64,
    offsets: [u64; 3],
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
    installed: Option<Installed>,
    ctl: Option<ControlFile>,
    /// The directory's one-writer lock, held while this sampler lives.
    _lock: Option<ControlLock>,
    /// Why recording cannot work here.
    error: Option<String>,
    /// `CUPTI_EVENTS`, mapped only while windows are open: the mapping of its 8 MiB counts
    /// in the daemon's RSS in full (the kernel maps every page at once).
    events: Option<aya::maps::Map>,
    open: Option<BpfHashMap<MapData, u32, u64>>,
    active: Vec<Active>,
    next_window: u64,
    /// The probes on the installed library, for as long as the daemon runs.
    _links: Vec<(&'static str, UProbeLinkId)>,
    /// The launch probes (Err: why kernels cannot be joined to their launches here; None:
    /// `diagnosis.launch_sites` off).
    launches: Option<Result<LaunchTracer, String>>,
}

impl ActivitySampler {
    /// Loads the programs and installs the library and its control file in `dir` (None:
    /// off, `gpu.cupti_dir` empty); `launch_sites`: whether windows trace the launches
    /// (`multi`: with uprobe_multi links).
    pub fn new(ebpf: &mut Ebpf, dir: Option<&Path>, launch_sites: bool, multi: bool) -> Self {
        let mut me = Self {
            installed: None,
            ctl: None,
            _lock: None,
            error: None,
            events: None,
            open: None,
            active: Vec::new(),
            // Unique across restarts: the library opens a window id once.
            next_window: unix_ms().saturating_mul(1000),
            _links: Vec::new(),
            launches: None,
        };
        let Some(dir) = dir else {
            me.error = Some("off (gpu.cupti_dir is empty)".into());
            return me;
        };
        // Before anything is written there: another ethand (the daemon, beside a standalone
        // snapshot) may own the directory, and its jobs follow its files.
        match prepare_dir(dir).and_then(|()| Ok(ControlLock::acquire(dir)?)) {
            Ok(lock) => me._lock = Some(lock),
            Err(e) => {
                let owned = matches!(e.downcast_ref(), Some(ControlError::Owned { .. }));
                let e = format!("{e:#}");
                if owned {
                    info!(error = %e, "GPU activity recording left to the other ethand");
                    me.error = Some(format!(
                        "{e}; `ethand snapshot` without --standalone records through it"
                    ));
                } else {
                    warn!(error = %e, "GPU activity recording unavailable");
                    me.error = Some(e);
                }
                return me;
            }
        }
        let r = (|| -> anyhow::Result<()> {
            for (prog, _) in PROGS {
                uprobes::load(ebpf, prog)?;
            }
            let events = take_map(ebpf, "CUPTI_EVENTS")?;
            // The right type now, rather than at the first window.
            drop(RingBuf::try_from(&events)?);
            me.events = Some(events);
            me.open = Some(BpfHashMap::try_from(take_map(ebpf, "CUPTI_OPEN")?)?);
            let installed = install(dir)?;
            for ((prog, _), off) in PROGS.iter().zip(installed.offsets) {
                let link = uprobes::attach(
                    ebpf,
                    prog,
                    &installed.path,
                    vec![uprobes::at_offset(off, None)],
                    UProbeScope::AllProcesses,
                )?;
                me._links.push((prog, link));
            }
            me.ctl = Some(ControlFile::create(&dir.join(CONTROL_NAME))?);
            info!(library = %installed.path.display(), "GPU activity recording ready: start CUDA jobs with CUDA_INJECTION64_PATH set to the library");
            me.installed = Some(installed);
            Ok(())
        })();
        if launch_sites && r.is_ok() {
            me.launches = Some(LaunchTracer::new(ebpf, multi).map_err(|e| {
                warn!(error = %format!("{e:#}"), "kernels will not be joined to their launch call sites");
                format!("the launch probes could not be set up: {e:#}")
            }));
        }
        if let Err(e) = r {
            warn!(error = %format!("{e:#}"), "GPU activity recording unavailable");
            me.error = Some(format!("{e:#}"));
        }
        me
    }

    /// Where the library is, for `CUDA_INJECTION64_PATH`.
    pub fn library_path(&self) -> Option<&Path> {
        self.installed.as_ref().map(|i| i.path.as_path())
    }

    /// Starts new requests, takes the events that arrived, and answers the windows that are
    /// over (every one with `force`).
    pub fn tick(&mut self, ebpf: &mut Ebpf, gpu: &GpuProbes, new: Vec<Request>, force: bool) {
        for r in new {
            self.start(ebpf, gpu, r);
        }
        self.drain();
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
        let Some((lib_path, lib_dev, lib_ino)) = self
            .installed
            .as_ref()
            .map(|i| (i.path.clone(), i.dev, i.ino))
        else {
            a.notes.push(format!(
                "GPU activity recording unavailable: {}",
                self.error.as_deref().unwrap_or("not set up")
            ));
            a.duration = Duration::ZERO;
            self.active.push(a);
            return;
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
            match injected(pid, &lib_path, lib_dev, lib_ino) {
                // Forked after cuInit: the mapping came along, the library's thread did not.
                // Waiting for its answer would hold the snapshot to the window's grace.
                Ok(true) if control_thread(pid) == Some(false) => {
                    p.settled = Some(settled(
                        pid,
                        ActivityState::Forked,
                        "maps the library without its thread (a child forked after cuInit, such as a DataLoader worker): nothing to record".into(),
                    ));
                    a.processes.push(p);
                    continue;
                }
                Ok(true) => {}
                Ok(false) => {
                    p.settled = Some(settled(
                        pid,
                        ActivityState::NotInjected,
                        format!(
                            "started without CUDA_INJECTION64_PATH={}: nothing recorded",
                            lib_path.display()
                        ),
                    ));
                    a.processes.push(p);
                    continue;
                }
                Err(detail) => {
                    p.settled = Some(settled(pid, ActivityState::Failed, detail));
                    a.processes.push(p);
                    continue;
                }
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
            self.next_window += 1;
            p.window_id = self.next_window;
            if let Err(detail) = self.open_window(&mut p, deadline, budget) {
                p.settled = Some(settled(pid, ActivityState::Failed, detail));
                self.close_window(&mut p);
            }
            a.processes.push(p);
        }
        debug!(pids = ?a.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), "GPU activity windows opened");
        self.active.push(a);
    }

    fn open_window(&mut self, p: &mut Process, deadline: u64, budget: u64) -> Result<(), String> {
        let key = ProcessKey::of(p.pid).map_err(|e| format!("its pid namespace: {e}"))?;
        p.key = Some(key);
        self.open
            .as_mut()
            .expect("loaded")
            .insert(&p.pid, &p.window_id, 0)
            .map_err(|e| format!("CUPTI_OPEN: {e}"))?;
        // The library wakes on this: its events pass the filter by then.
        self.ctl
            .as_mut()
            .expect("created")
            .open(
                key,
                WindowRequest {
                    window_id: p.window_id,
                    deadline_mono_ns: deadline,
                    kinds: cupti_kinds::ALL,
                    max_records: u32::try_from(budget).unwrap_or(u32::MAX),
                },
                monotonic_ns(),
            )
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn close_window(&mut self, p: &mut Process) {
        if let (Some(ctl), Some(key)) = (self.ctl.as_mut(), p.key) {
            ctl.close(key, p.window_id);
        }
        // Another window of the same process (a second snapshot) keeps its entry.
        if let Some(open) = self.open.as_mut()
            && open.get(&p.pid, 0).ok() == Some(p.window_id)
        {
            let _ = open.remove(&p.pid);
        }
    }

    /// Everything the probes wrote, to the windows it belongs to; the rest is dropped.
    fn drain(&mut self) {
        if self.active.is_empty() {
            return;
        }
        let Some(Ok(mut events)) = self.events.as_ref().map(RingBuf::try_from) else {
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
        while let Some(item) = events.next() {
            let active = &mut self.active;
            aggregate::apply(&item, |tgid, window_id| {
                let &(ai, pi) = by_window.get(&(tgid, window_id))?;
                Some(&mut active[ai].processes[pi].window)
            });
        }
        drop(events);
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
            self.close_window(&mut p);
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

fn settled(pid: u32, state: ActivityState, detail: String) -> GpuActivityProcess {
    GpuActivityProcess {
        pid,
        state,
        detail: Some(detail),
        ..Default::default()
    }
}

/// Whether `pid` maps the daemon's library (Ok(false): no libethand_cupti.so at all);
/// another file of that name is named in the error.
fn injected(pid: u32, lib_path: &Path, lib_dev: u64, lib_ino: u64) -> Result<bool, String> {
    let mut maps = ethand_userspace_probes::procmaps::ProcMaps::open(pid)
        .map_err(|e| format!("its mappings: {e}"))?;
    let vmas = maps
        .files(|name| name.ends_with(LIBRARY_NAME.as_bytes()) || name.ends_with(b".so (deleted)"))
        .map_err(|e| format!("its mappings: {e}"))?;
    let mut other = None;
    for v in vmas {
        if !String::from_utf8_lossy(&v.name).contains(LIBRARY_NAME) {
            continue;
        }
        if libc::makedev(v.dev_major, v.dev_minor) == lib_dev && v.inode == lib_ino {
            return Ok(true);
        }
        other = Some(format!(
            "maps another libethand_cupti.so ({}, device {}:{} inode {}): only the daemon's own, {}, is recorded",
            String::from_utf8_lossy(&v.name),
            v.dev_major,
            v.dev_minor,
            v.inode,
            lib_path.display()
        ));
    }
    other.map_or(Ok(false), Err)
}

/// Whether `pid` runs the library's control thread (named `ethand-cupti`); None when its
/// threads cannot be read. A thread name is the process's to set: a process naming one so
/// only makes the daemon wait for an answer that does not come (`no_answer`).
fn control_thread(pid: u32) -> Option<bool> {
    /// Threads looked at, at most (a thread per task entry read: 16 bytes each).
    const MAX_THREADS: usize = 16_384;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    for t in tasks.take(MAX_THREADS) {
        let Ok(t) = t else { continue };
        let mut comm = [0u8; 32];
        let n = std::fs::File::open(t.path().join("comm"))
            .and_then(|mut f| std::io::Read::read(&mut f, &mut comm))
            .unwrap_or(0);
        if comm[..n].trim_ascii_end() == b"ethand-cupti" {
            return Some(true);
        }
    }
    Some(false)
}

/// Creates `dir`, readable by every user's jobs.
fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    // Jobs of every user read it; the daemon's umask (0077 in the unit) took those bits.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| anyhow::anyhow!("making {} readable: {e}", dir.display()))
}

/// Writes the embedded library into `dir` (unless the same bytes are there) and finds its
/// probe functions' offsets in those bytes.
fn install(dir: &Path) -> anyhow::Result<Installed> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let path = dir.join(LIBRARY_NAME);
    let same = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .ok()
        .and_then(|f| {
            let mut have = Vec::with_capacity(LIBRARY.len() + 1);
            f.take(LIBRARY.len() as u64 + 1)
                .read_to_end(&mut have)
                .ok()?;
            Some(have == LIBRARY)
        })
        .unwrap_or(false);
    if !same {
        // A new inode, renamed over the old: processes mapping the old one keep it whole.
        let tmp = dir.join(format!(".{LIBRARY_NAME}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", tmp.display()))?;
        use std::io::Write;
        f.write_all(LIBRARY)
            .and_then(|()| f.sync_all())
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| anyhow::anyhow!("installing {}: {e}", path.display()))?;
    }
    let meta = std::fs::metadata(&path)?;
    let table = ethand_userspace_probes::elf::SymbolTable::parse(LIBRARY)
        .map_err(|e| anyhow::anyhow!("the embedded library: {e}"))?;
    let mut offsets = [0u64; 3];
    for (i, (name, r)) in table
        .resolve(PROGS.iter().map(|(_, f)| *f))
        .into_iter()
        .enumerate()
    {
        offsets[i] = r.map_err(|e| anyhow::anyhow!("the embedded library's {name}: {e}"))?;
    }
    Ok(Installed {
        path,
        dev: meta.dev(),
        ino: meta.ino(),
        offsets,
    })
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
