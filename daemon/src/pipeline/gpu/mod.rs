//! GPU/NPU runtime probing: finds libcuda / libnccl / libascendcl / libhccl in every
//! process's mappings, resolves the catalog's symbols in each distinct library file
//! (device + inode) and attaches the two generic uprobe programs there, system-wide, once.
//! Also turns the kernel's per-(process, symbol) counters into the snapshot's GPU picture.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::uprobe::{UProbeAttachPoint, UProbeScope},
};
use ethand_common::{
    GPU_COOKIE_GEN_SHIFT, GPU_COOKIE_TIME, GPU_GEN_MASK, GpuCallStats, GpuOpDesc, GpuProcState,
    gpu_dir, gpu_flags, gpu_mem,
};
use ethand_reader::FileId;
use ethand_snapshot::{GpuLibraryStatus, ProbeState, ProbeStatus, gpu as g};
use ethand_userspace_probes::{
    DiscoveryError, MappedLibrary, Runtime,
    catalog::{CATALOG, CatalogSymbols, Category},
    discover,
};
use tracing::{info, warn};

use crate::{
    config::{GpuLevel, GpuPlan},
    pipeline::{
        bpf_error::{error_chain, take_map},
        reader::ReaderHandle,
        uprobes::{self, LibraryLinks, Side, UprobeError, UprobeSetupError},
    },
};

pub use crate::pipeline::uprobes::Progs;

mod libraries;
pub mod python;
mod resolver;
pub mod sites;
mod stats;

use libraries::*;
pub use stats::process_stats;

struct Lib {
    status: GpuLibraryStatus,
    /// The file, held open: later attaches (level changes) go through /proc/self/fd/N, which
    /// stays valid after the process it was found in has exited.
    file: Option<std::fs::File>,
    runtime: Runtime,
    /// (op id, file offset) of every resolved symbol.
    resolved: Vec<(u16, u64)>,
    links: LibraryLinks,
    /// (size, mtime ns) of the file when its symbols were resolved: a file rewritten in place
    /// (same inode, `cp new old`) moves its functions, so the probes must move too.
    stamp: Option<(u64, i128)>,
    /// The mapping it was found as.
    mapped: MappedLibrary,
}

/// Why the level could not be switched.
#[derive(Debug, thiserror::Error)]
pub enum SetLevelError {
    /// The programs were never loaded (the start-up error, kept).
    #[error("GPU/NPU uprobes unavailable: {0}")]
    Unavailable(#[source] Arc<UprobeSetupError>),
    #[error("cannot switch the probes' generation: {}", error_chain(source))]
    Generation { source: aya::maps::MapError },
}

/// Why the launches of a process cannot be counted by a launch sample.
#[derive(Debug, thiserror::Error)]
pub enum LaunchPointsError {
    #[error("cannot read its mappings: {source}")]
    Mappings { source: DiscoveryError },
    /// A runtime library it maps has not been probed yet.
    #[error("{} is mapped but not probed yet (found at the next rescan)", .path.display())]
    NotProbedYet { path: PathBuf },
}

pub struct GpuProbes {
    level: GpuLevel,
    runtimes: Vec<Runtime>,
    rescan: Duration,
    last_scan: Option<Instant>,
    /// Keyed by (dev, inode).
    libs: BTreeMap<(String, u64), Lib>,
    /// Why the programs could not be loaded (then nothing attaches).
    load_error: Option<Arc<UprobeSetupError>>,
    progs: Progs,
    scanner: MapsScanner,
    /// Processes whose maps were read in the last full scan (rescanned each interval, since
    /// a dlopen can happen at any time).
    pub scans: u64,
    /// `gpu.driver_libraries` (empty: look for the system's).
    driver_libraries: Vec<PathBuf>,
    /// The driver libraries were looked for (again once NVML's directory is known).
    preloaded: u8,
    /// Symbols of new files, read by the reader off the collection loop.
    resolver: resolver::Resolver,
    /// The files waiting for their symbols, held open by the daemon to attach through.
    opened: HashMap<resolver::Key, (MappedLibrary, std::fs::File)>,
    /// Files found by the start-up look for driver libraries.
    preloaded_keys: HashSet<resolver::Key>,
    /// Files rewritten in place, their symbols being read again.
    rewritten_keys: HashSet<resolver::Key>,
    /// The active generation of the links (`GPU_GEN`; see `ethand_common::GPU_COOKIE_GEN_SHIFT`).
    generation: u64,
    generation_map: Option<Array<MapData, u64>>,
}

impl GpuProbes {
    /// Loads the uprobe programs and fills the op table. Failures are recorded, not fatal.
    pub fn new(ebpf: &mut Ebpf, plan: &GpuPlan, reader: ReaderHandle) -> Self {
        let mut me = Self {
            level: plan.level,
            runtimes: plan.runtimes.clone(),
            rescan: plan.rescan,
            last_scan: None,
            libs: BTreeMap::new(),
            load_error: None,
            progs: Progs::detect(),
            scanner: MapsScanner::default(),
            scans: 0,
            driver_libraries: plan.driver_libraries.clone(),
            preloaded: 0,
            resolver: resolver::Resolver::start(reader),
            opened: HashMap::new(),
            preloaded_keys: HashSet::new(),
            rewritten_keys: HashSet::new(),
            generation: 0,
            generation_map: None,
        };
        info!(uprobe_multi = me.progs.multi(), "GPU/NPU uprobe programs");
        match Self::prepare(ebpf, me.progs) {
            Ok(generation) => me.generation_map = Some(generation),
            Err(e) => {
                warn!(error = %e, "GPU/NPU uprobes unavailable");
                me.load_error = Some(Arc::new(e));
            }
        }
        me
    }

    pub fn progs(&self) -> Progs {
        self.progs
    }

    fn prepare(ebpf: &mut Ebpf, progs: Progs) -> Result<Array<MapData, u64>, UprobeSetupError> {
        let mut ops: Array<MapData, GpuOpDesc> = Array::try_from(take_map(ebpf, "GPU_OPS")?)?;
        for (i, s) in CATALOG.iter().enumerate() {
            ops.set(i as u32, &s.desc, 0)?;
        }
        let mut generation: Array<MapData, u64> = Array::try_from(take_map(ebpf, "GPU_GEN")?)?;
        generation.set(0, &0, 0)?;
        for name in [progs.entry, progs.ret] {
            uprobes::load(ebpf, name)?;
        }
        Ok(generation)
    }

    pub fn level(&self) -> GpuLevel {
        self.level
    }

    /// Rescans process mappings when due and attaches to new library files.
    /// `changed`: the processes whose mappings may have changed since the last scan (new,
    /// exec'd, or mmap called), when the syscall probes can tell; None: look at all. A full
    /// look every FULL_SCAN_EVERY scans catches what the hints could miss.
    pub fn tick(&mut self, ebpf: &mut Ebpf, changed: Option<&mut HashSet<u32>>) {
        let done = self.resolver.done();
        self.take_resolved(ebpf, done);
        if self.level == GpuLevel::System || self.load_error.is_some() || self.runtimes.is_empty() {
            return;
        }
        if self.last_scan.is_some_and(|t| t.elapsed() < self.rescan) {
            return;
        }
        self.last_scan = Some(Instant::now());
        self.scans += 1;
        self.preload();
        let rewritten: Vec<resolver::Key> = self
            .libs
            .iter()
            .filter(|(_, l)| {
                l.file.is_some() && l.stamp.is_some() && l.stamp != file_stamp(l.file.as_ref())
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in rewritten {
            let Some(mut l) = self.libs.remove(&key) else {
                continue;
            };
            warn!(library = %l.status.path, inode = l.status.inode, "runtime library rewritten in place on disk: resolving its symbols again");
            detach(ebpf, self.progs, &mut l);
            // Read again as the daemon holds it: the process it was found in may be gone.
            let Some(file) = l.file.take() else { continue };
            let lib = held(&l.mapped, &file);
            if self.resolver.submit(key.clone(), lib.clone()) {
                self.rewritten_keys.insert(key.clone());
                self.opened.insert(key, (lib, file));
            }
        }
        let only = match changed {
            Some(set) if self.scans % FULL_SCAN_EVERY != 1 && !self.scanner.known.is_empty() => {
                Some(std::mem::take(set))
            }
            Some(set) => {
                set.clear();
                None
            }
            None => None,
        };
        for lib in self.scanner.scan(&self.runtimes, only.as_ref()) {
            self.add_library(&lib);
        }
    }

    /// Waits (start-up only, at most `limit`) until the files found so far have their symbols
    /// and are attached: the first GPU process after `ready` is counted from its first call.
    pub fn settle(&mut self, ebpf: &mut Ebpf, limit: Duration) {
        let done = self.resolver.wait(limit);
        self.take_resolved(ebpf, done);
    }

    /// Enters the files whose symbols came back, attached as the level wants.
    fn take_resolved(&mut self, ebpf: &mut Ebpf, done: Vec<resolver::Done>) {
        for d in done {
            let Some((_, file)) = self.opened.remove(&d.key) else {
                continue;
            };
            let mut l = resolved(&d.lib, file, d.answer);
            if l.status.state != ProbeState::Failed {
                attach(ebpf, self.progs, &mut l, self.level, self.generation);
            }
            if self.rewritten_keys.remove(&d.key) {
                l.status.detail = format!(
                    "rewritten in place on disk: symbols resolved again; {}",
                    l.status.detail
                );
            }
            if self.preloaded_keys.contains(&d.key) {
                if l.status.state == ProbeState::Attached {
                    info!(library = %d.lib.path.display(), "driver library probed at start-up");
                }
                l.status.detail = format!("probed at start-up; {}", l.status.detail);
            }
            self.libs.insert(d.key, l);
        }
    }

    /// Asks for the symbols of a library file not known yet (none when the file (device,
    /// inode) is probed or being resolved already). The daemon opens the file itself (only
    /// the mapped one, never blocking) to attach through; the reader parses it.
    fn add_library(&mut self, lib: &MappedLibrary) {
        let key = (lib.dev(), lib.inode);
        if self.libs.contains_key(&key) || self.resolver.is_pending(&key) {
            return;
        }
        match lib.open() {
            // Found in a process that has exited since: the next that maps it is asked.
            Err(_)
                if lib.pid != 0
                    && !std::path::Path::new(&format!("/proc/{}", lib.pid)).exists() => {}
            Err(e) => {
                let l = failed(lib, format!("cannot open it: {e}"));
                warn!(library = %l.status.host_path, error = %l.status.detail, "runtime library not probed");
                self.libs.insert(key, l);
            }
            Ok(file) => {
                if self.resolver.submit(key.clone(), lib.clone()) {
                    self.opened.insert(key, (lib.clone(), file));
                }
            }
        }
    }

    /// Probes the system's driver libraries before any process maps them: once at the first
    /// scan, and once more when NVML's library (loaded by the device thread) shows where the
    /// driver lives.
    fn preload(&mut self) {
        // NVML is loaded by the device thread, soon after start-up or never (no GPU): looked
        // for at the first PRELOAD_SCANS scans only.
        let nvml_dir = (self.driver_libraries.is_empty() && self.scans <= PRELOAD_SCANS)
            .then(nvml_directory)
            .flatten();
        let want = if nvml_dir.is_some() { 2 } else { 1 };
        if self.preloaded >= want {
            return;
        }
        self.preloaded = want;
        let paths = if self.driver_libraries.is_empty() {
            system_driver_libraries(nvml_dir.as_deref())
        } else {
            self.driver_libraries.clone()
        };
        for path in paths {
            let Some(lib) = library_file(&path, &self.runtimes) else {
                continue;
            };
            self.preloaded_keys.insert((lib.dev(), lib.inode));
            self.add_library(&lib);
        }
    }

    /// Switches the level live without losing or doubling a call: the new level's links are
    /// attached first under a new generation (they do not count yet), the generation is
    /// made active in one map write, and only then are the old links detached.
    /// The Ok message is for the API client.
    pub fn set_level(&mut self, ebpf: &mut Ebpf, level: GpuLevel) -> Result<String, SetLevelError> {
        if let Some(e) = &self.load_error {
            return Err(SetLevelError::Unavailable(e.clone()));
        }
        let old = self.level;
        let generation = (self.generation + 1) & GPU_GEN_MASK;
        let mut fresh: Vec<(resolver::Key, Lib)> = Vec::new();
        for (k, l) in &self.libs {
            // A shadow of the library with no links: attached at the new level.
            let mut n = Lib {
                status: l.status.clone(),
                file: None,
                runtime: l.runtime,
                resolved: l.resolved.clone(),
                links: LibraryLinks::default(),
                stamp: l.stamp,
                mapped: l.mapped.clone(),
            };
            if level != GpuLevel::System && !l.resolved.is_empty() {
                attach_through(ebpf, self.progs, &mut n, level, generation, attach_path(l));
            } else {
                n.status.state = ProbeState::Disabled;
                n.status.detail = "gpu level is system".into();
            }
            fresh.push((k.clone(), n));
        }
        // From here on only the new links count.
        if let Some(m) = &mut self.generation_map {
            m.set(0, &generation, 0)
                .map_err(|source| SetLevelError::Generation { source })?;
        }
        self.generation = generation;
        self.level = level;
        for (k, n) in fresh {
            if let Some(l) = self.libs.get_mut(&k) {
                detach(ebpf, self.progs, l);
                l.links = n.links;
                l.status = n.status;
            }
        }
        if level != GpuLevel::System {
            // Libraries loaded while at `system` are found by a full scan.
            self.scanner = MapsScanner::default();
            self.last_scan = None;
            self.tick(ebpf, None);
        }
        info!(
            from = old.as_str(),
            to = level.as_str(),
            libraries = self.libs.len(),
            "GPU level changed"
        );
        Ok(format!(
            "level {} (was {}); {} library file(s) probed",
            level.as_str(),
            old.as_str(),
            self.libs
                .values()
                .filter(|l| l.status.state == ProbeState::Attached)
                .count()
        ))
    }

    /// Where the kernel launches of `pid` can be counted: per probed library file it maps,
    /// the path to attach through and the file offsets of its launch symbols.
    pub fn launch_points(&self, pid: u32) -> Result<Vec<LaunchPoints>, LaunchPointsError> {
        let libs = discover(pid).map_err(|source| LaunchPointsError::Mappings { source })?;
        let mut out: Vec<LaunchPoints> = Vec::new();
        for lib in libs {
            let key = (lib.dev(), lib.inode);
            if out.iter().any(|(k, _, _)| *k == key) {
                continue;
            }
            let Some(l) = self.libs.get(&key) else {
                if self.runtimes.contains(&lib.runtime) {
                    return Err(LaunchPointsError::NotProbedYet { path: lib.path });
                }
                continue;
            };
            let offsets: Vec<u64> = l
                .resolved
                .iter()
                .filter(|(op, _)| CATALOG[*op as usize].category == Category::Launch)
                .map(|(_, off)| *off)
                .collect();
            if offsets.is_empty() {
                continue;
            }
            out.push((key, attach_path(l), offsets));
        }
        Ok(out)
    }

    pub fn libraries(&self) -> Vec<GpuLibraryStatus> {
        use std::os::unix::fs::MetadataExt;
        self.libs
            .values()
            .map(|l| {
                let mut s = l.status.clone();
                // Replaced (package upgrade: rename over it) or deleted: the probes stay for the
                // processes that still map it.
                if l.file.as_ref().and_then(|f| f.metadata().ok()).is_some_and(|m| m.nlink() == 0) {
                    s.detail.push_str("; file replaced or deleted on disk: still probed for the processes that map it");
                }
                s
            })
            .chain(self.opened.values().map(|(lib, _)| GpuLibraryStatus {
                state: ProbeState::Waiting,
                detail: "its symbols are being read".into(),
                ..status_of(lib)
            }))
            .collect()
    }

    /// One status line per runtime for `ethand status` / `ethand_probe_state`.
    pub fn probe_status(&self) -> Vec<ProbeStatus> {
        self.runtimes_all()
            .map(|(rt, enabled)| {
                let name = format!("uprobe_{}", rt.as_str());
                let attach_point = format!("uprobe/{}", rt.library());
                let mine: Vec<&Lib> = self.libs.values().filter(|l| l.runtime == rt).collect();
                let (state, detail) = if !enabled {
                    (
                        ProbeState::Disabled,
                        format!("gpu.runtimes does not list {:?}", rt.as_str()),
                    )
                } else if self.level == GpuLevel::System {
                    (ProbeState::Disabled, "gpu.level = system".into())
                } else if let Some(e) = &self.load_error {
                    (ProbeState::Failed, e.to_string())
                } else if mine.is_empty() {
                    (
                        ProbeState::Waiting,
                        format!("no process has loaded {} yet", rt.library()),
                    )
                } else if mine.iter().any(|l| l.status.state == ProbeState::Attached) {
                    let n = mine
                        .iter()
                        .filter(|l| l.status.state == ProbeState::Attached)
                        .count();
                    let failed: Vec<String> = mine
                        .iter()
                        .filter(|l| l.status.state != ProbeState::Attached)
                        .map(|l| format!("{}: {}", l.status.path, l.status.detail))
                        .collect();
                    let mut d = format!("{n} library file(s)");
                    if !failed.is_empty() {
                        d.push_str(&format!("; not attached: {}", failed.join("; ")));
                    }
                    (ProbeState::Attached, d)
                } else {
                    let d: Vec<String> = mine
                        .iter()
                        .map(|l| format!("{}: {}", l.status.path, l.status.detail))
                        .collect();
                    (ProbeState::Failed, d.join("; "))
                };
                ProbeStatus {
                    name,
                    attach_point,
                    state,
                    detail,
                }
            })
            .collect()
    }

    fn runtimes_all(&self) -> impl Iterator<Item = (Runtime, bool)> + '_ {
        Runtime::ALL
            .into_iter()
            .map(|r| (r, self.runtimes.contains(&r)))
    }
}

/// A library file's (device, inode), the path to attach through, and its launch symbols'
/// file offsets.
pub type LaunchPoints = ((String, u64), PathBuf, Vec<u64>);

/// How many of the first scans look for the directory NVML was loaded from.
const PRELOAD_SCANS: u64 = 10;

/// Every this many scans, all processes are looked at, hints or not.
const FULL_SCAN_EVERY: u64 = 15;

/// Whether `op` is probed at all at `level`: kernel launches and device-to-device async
/// copies only from `process` on.
fn probed_at(op: u16, level: GpuLevel) -> bool {
    match level {
        GpuLevel::System => false,
        GpuLevel::Calls => !CATALOG[op as usize].enqueues_device_work(),
        GpuLevel::Process | GpuLevel::Op => true,
    }
}

fn needs_return(op: u16, level: GpuLevel) -> bool {
    level == GpuLevel::Op
        || CATALOG[op as usize].desc.flags & (gpu_flags::TIMED | gpu_flags::RET) != 0
}

fn attach(ebpf: &mut Ebpf, progs: Progs, l: &mut Lib, level: GpuLevel, generation: u64) {
    let path = attach_path(l);
    attach_through(ebpf, progs, l, level, generation, path);
}

/// Attaches `l`'s probes as `level` wants, through `path`, with links of generation `generation`.
fn attach_through(
    ebpf: &mut Ebpf,
    progs: Progs,
    l: &mut Lib,
    level: GpuLevel,
    generation: u64,
    path: PathBuf,
) {
    if level == GpuLevel::System || l.resolved.is_empty() {
        return;
    }
    let time_flag = if level == GpuLevel::Op {
        GPU_COOKIE_TIME
    } else {
        0
    } | (generation << GPU_COOKIE_GEN_SHIFT);
    let entry_points: Vec<UProbeAttachPoint> = l
        .resolved
        .iter()
        .filter(|(op, _)| probed_at(*op, level))
        .map(|(op, off)| uprobes::at_offset(*off, Some(u64::from(*op) | time_flag)))
        .collect();
    if entry_points.is_empty() {
        l.status.state = ProbeState::Disabled;
        l.status.detail = format!(
            "only launch and device-copy symbols resolved: not probed at level {}",
            level.as_str()
        );
        return;
    }
    let return_points: Vec<UProbeAttachPoint> = l
        .resolved
        .iter()
        .filter(|(op, _)| probed_at(*op, level) && needs_return(*op, level))
        .map(|(op, off)| {
            uprobes::at_offset(
                *off,
                Some(u64::from(*op) | (generation << GPU_COOKIE_GEN_SHIFT)),
            )
        })
        .collect();
    let result = l
        .links
        .attach(
            ebpf,
            progs,
            &path,
            entry_points,
            return_points,
            UProbeScope::AllProcesses,
        )
        .map_err(|(side, e)| match (side, e) {
            (Side::Entry, UprobeError::Missing(_)) => "entry program missing".to_string(),
            (Side::Return, UprobeError::Missing(_)) => "return program missing".to_string(),
            (Side::Entry, e @ UprobeError::Attach { .. }) => format!("uprobe: {}", e.detail()),
            (Side::Return, e @ UprobeError::Attach { .. }) => {
                format!("uretprobe: {}", e.detail())
            }
            (_, e) => e.detail(),
        });
    match result {
        Ok(()) => {
            l.status.state = ProbeState::Attached;
            let probed = l.resolved.iter().filter(|(op, _)| probed_at(*op, level));
            let unprobed = l.resolved.len() - probed.clone().count();
            l.status.detail = format!(
                "{} symbols, {} timed{}",
                probed.clone().count(),
                probed.filter(|(op, _)| needs_return(*op, level)).count(),
                if unprobed > 0 {
                    format!(
                        "; {unprobed} launch and device-copy symbols not probed at level {}",
                        level.as_str()
                    )
                } else {
                    String::new()
                }
            );
            info!(library = %l.status.path, pid = l.status.found_in_pid, symbols = l.resolved.len(), missing = l.status.symbols_missing.len(), "attached GPU/NPU runtime probes");
        }
        Err(e) => {
            detach(ebpf, progs, l);
            warn!(library = %l.status.path, error = %e, "attaching runtime probes failed");
            l.status.state = ProbeState::Failed;
            l.status.detail = e;
        }
    }
}

/// The held-open file (valid after the process it was found in has exited), else its path.
fn attach_path(l: &Lib) -> PathBuf {
    match &l.file {
        Some(f) => {
            use std::os::fd::AsRawFd;
            PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
        }
        None => PathBuf::from(&l.status.host_path),
    }
}

fn detach(ebpf: &mut Ebpf, progs: Progs, l: &mut Lib) {
    l.links.detach(ebpf, progs);
}
