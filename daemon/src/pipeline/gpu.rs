//! GPU/NPU runtime probing: finds libcuda / libnccl / libascendcl / libhccl in every
//! process's mappings, resolves the catalog's symbols in each distinct library file
//! (device + inode) and attaches the two generic uprobe programs there, system-wide, once.
//! Also turns the kernel's per-(process, symbol) counters into the snapshot's GPU picture.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::uprobe::{UProbeAttachPoint, UProbeScope},
};
use ethand_common::{
    GPU_COOKIE_TIME, GpuCallStats, GpuOpDesc, GpuProcState, gpu_dir, gpu_flags, gpu_mem,
};
use ethand_snapshot::{GpuLibraryStatus, ProbeState, ProbeStatus, gpu as g};
use ethand_userspace_probes::{
    MappedLibrary, Runtime,
    catalog::{CATALOG, Category},
    elf::SymbolTable,
    parse_maps,
};
use tracing::{info, warn};

use crate::{
    config::{Config, GpuLevel},
    pipeline::{
        loader::error_chain,
        uprobes::{self, CatalogSymbols, LibraryLinks, Side, UprobeError},
    },
};

pub use crate::pipeline::uprobes::Progs;

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
}

pub struct GpuProbes {
    level: GpuLevel,
    runtimes: Vec<Runtime>,
    rescan: Duration,
    last_scan: Option<Instant>,
    /// Keyed by (dev, inode).
    libs: BTreeMap<(String, u64), Lib>,
    /// Why the programs could not be loaded (then nothing attaches).
    load_error: Option<String>,
    progs: Progs,
    scanner: MapsScanner,
    /// Processes whose maps were read in the last full scan (rescanned each interval, since
    /// a dlopen can happen at any time).
    pub scans: u64,
    /// `gpu.driver_libraries` (empty: look for the system's).
    driver_libraries: Vec<PathBuf>,
    /// The driver libraries were looked for (again once NVML's directory is known).
    preloaded: u8,
}

impl GpuProbes {
    /// Loads the uprobe programs and fills the op table. Failures are recorded, not fatal.
    pub fn new(ebpf: &mut Ebpf, cfg: &Config) -> Self {
        let runtimes = Runtime::ALL
            .into_iter()
            .filter(|r| cfg.gpu.runtimes.iter().any(|n| n == r.as_str()))
            .collect();
        let mut me = Self {
            level: cfg.gpu.level,
            runtimes,
            rescan: Duration::from_millis(cfg.gpu.rescan_interval_ms),
            last_scan: None,
            libs: BTreeMap::new(),
            load_error: None,
            progs: Progs::detect(),
            scanner: MapsScanner::default(),
            scans: 0,
            driver_libraries: cfg.gpu.driver_libraries.clone(),
            preloaded: 0,
        };
        info!(uprobe_multi = me.progs.multi(), "GPU/NPU uprobe programs");
        if let Err(e) = Self::prepare(ebpf, me.progs) {
            warn!(error = %e, "GPU/NPU uprobes unavailable");
            me.load_error = Some(e);
        }
        me
    }

    pub fn progs(&self) -> Progs {
        self.progs
    }

    fn prepare(ebpf: &mut Ebpf, progs: Progs) -> Result<(), String> {
        let mut ops: Array<MapData, GpuOpDesc> = Array::try_from(
            ebpf.take_map("GPU_OPS")
                .ok_or("the BPF object has no GPU_OPS map")?,
        )
        .map_err(|e| error_chain(&e))?;
        for (i, s) in CATALOG.iter().enumerate() {
            ops.set(i as u32, &s.desc, 0).map_err(|e| error_chain(&e))?;
        }
        for name in [progs.entry, progs.ret] {
            uprobes::load(ebpf, name).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    pub fn level(&self) -> GpuLevel {
        self.level
    }

    /// Rescans process mappings when due and attaches to new library files.
    /// `changed`: the processes whose mappings may have changed since the last scan (new,
    /// exec'd, or mmap called), when the syscall probes can tell; None: look at all. A full
    /// look every FULL_SCAN_EVERY scans catches what the hints could miss.
    pub fn tick(&mut self, ebpf: &mut Ebpf, changed: Option<&mut HashSet<u32>>) {
        if self.level == GpuLevel::System || self.load_error.is_some() || self.runtimes.is_empty() {
            return;
        }
        if self.last_scan.is_some_and(|t| t.elapsed() < self.rescan) {
            return;
        }
        self.last_scan = Some(Instant::now());
        self.scans += 1;
        self.preload(ebpf);
        for l in self.libs.values_mut() {
            if l.file.is_some() && l.stamp.is_some() && l.stamp != file_stamp(l.file.as_ref()) {
                warn!(library = %l.status.path, inode = l.status.inode, "runtime library rewritten in place on disk: resolving its symbols again");
                detach(ebpf, self.progs, l);
                let mapped = MappedLibrary {
                    runtime: l.runtime,
                    path: PathBuf::from(&l.status.path),
                    host_path: PathBuf::from(&l.status.host_path),
                    dev: l.status.dev.clone(),
                    inode: l.status.inode,
                };
                let file = l.file.take().ok_or_else(String::new);
                let mut fresh = resolve_file(&mapped, file);
                fresh.status.found_in_pid = l.status.found_in_pid;
                if fresh.status.state != ProbeState::Failed {
                    attach(ebpf, self.progs, &mut fresh, self.level);
                }
                fresh.status.detail = format!(
                    "rewritten in place on disk: symbols resolved again; {}",
                    fresh.status.detail
                );
                *l = fresh;
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
            self.add_library(ebpf, &lib);
        }
    }

    /// Resolves and attaches a library file not probed yet; the new entry, or None when the
    /// file (device, inode) is known already.
    fn add_library(&mut self, ebpf: &mut Ebpf, lib: &MappedLibrary) -> Option<&mut Lib> {
        let key = (lib.dev.clone(), lib.inode);
        if self.libs.contains_key(&key) {
            return None;
        }
        let mut l = resolve(lib);
        if l.status.state != ProbeState::Failed {
            attach(ebpf, self.progs, &mut l, self.level);
        }
        Some(self.libs.entry(key).or_insert(l))
    }

    /// Probes the system's driver libraries before any process maps them: once at the first
    /// scan, and once more when NVML's library (loaded by the device thread) shows where the
    /// driver lives.
    fn preload(&mut self, ebpf: &mut Ebpf) {
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
            if let Some(l) = self.add_library(ebpf, &lib) {
                if l.status.state == ProbeState::Attached {
                    info!(library = %lib.path.display(), "driver library probed at start-up");
                }
                l.status.detail = format!("probed at start-up; {}", l.status.detail);
            }
        }
    }

    /// Switches the level live: detaches everything and re-attaches as the level wants.
    pub fn set_level(&mut self, ebpf: &mut Ebpf, level: GpuLevel) -> Result<String, String> {
        if let Some(e) = &self.load_error {
            return Err(format!("GPU/NPU uprobes unavailable: {e}"));
        }
        let old = self.level;
        self.level = level;
        for l in self.libs.values_mut() {
            detach(ebpf, self.progs, l);
            if level != GpuLevel::System && !l.resolved.is_empty() {
                attach(ebpf, self.progs, l, level);
            } else {
                l.status.state = ProbeState::Disabled;
                l.status.detail = "gpu level is system".into();
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
    pub fn launch_points(&self, pid: u32) -> Result<Vec<LaunchPoints>, String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|e| format!("cannot read its mappings: {e}"))?;
        let mut out: Vec<LaunchPoints> = Vec::new();
        for lib in parse_maps(pid, &text) {
            let key = (lib.dev.clone(), lib.inode);
            if out.iter().any(|(k, _, _)| *k == key) {
                continue;
            }
            let Some(l) = self.libs.get(&key) else {
                if self.runtimes.contains(&lib.runtime) {
                    return Err(format!(
                        "{} is mapped but not probed yet (found at the next rescan)",
                        lib.path.display()
                    ));
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
                    (ProbeState::Failed, e.clone())
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

/// The directory of the NVML library this process loaded (the driver's own directory).
fn nvml_directory() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("libnvidia-ml.so"))
        })
        .and_then(|p| std::path::Path::new(p).parent().map(PathBuf::from))
}

/// The driver libraries (libcuda.so.1, libascendcl.so) in the loader's directories and
/// beside NVML's library, each file once.
fn system_driver_libraries(nvml_dir: Option<&std::path::Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = nvml_dir.into_iter().map(PathBuf::from).collect();
    let mut conf: Vec<PathBuf> = vec![PathBuf::from("/etc/ld.so.conf")];
    if let Ok(d) = std::fs::read_dir("/etc/ld.so.conf.d") {
        let mut more: Vec<PathBuf> = d
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        more.sort();
        conf.extend(more);
    }
    for f in conf {
        // Plain directory lines only; `include` lines name the files read above.
        if let Ok(text) = std::fs::read_to_string(&f) {
            dirs.extend(
                text.lines()
                    .map(|l| l.split('#').next().unwrap_or("").trim())
                    .filter(|l| l.starts_with('/'))
                    .map(PathBuf::from),
            );
        }
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib64",
        "/usr/local/Ascend/ascend-toolkit/latest/lib64",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        for name in ["libcuda.so.1", "libascendcl.so"] {
            let p = d.join(name);
            if p.exists() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// A library file on this host's filesystem, described as a mapping would (device, inode),
/// so that a process mapping it later finds it probed already.
fn library_file(path: &std::path::Path, runtimes: &[Runtime]) -> Option<MappedLibrary> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).ok()?;
    let runtime = Runtime::from_file_name(real.file_name()?.to_str()?)
        .or_else(|| Runtime::from_file_name(path.file_name()?.to_str()?))?;
    if !runtimes.contains(&runtime) {
        return None;
    }
    let m = std::fs::metadata(&real).ok()?;
    let dev = m.dev();
    Some(MappedLibrary {
        runtime,
        path: real.clone(),
        host_path: real,
        // As /proc/PID/maps writes it: major:minor in hex.
        dev: format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev)),
        inode: m.ino(),
    })
}

/// A library file's (device, inode), the path to attach through, and its launch symbols'
/// file offsets.
pub type LaunchPoints = ((String, u64), PathBuf, Vec<u64>);

/// How many of the first scans look for the directory NVML was loaded from.
const PRELOAD_SCANS: u64 = 10;

/// Every this many scans, all processes are looked at, hints or not.
const FULL_SCAN_EVERY: u64 = 15;

/// Reads process mappings, skipping processes whose address space has not changed size since
/// the last scan: a `dlopen` maps new memory and so changes `vsize` in `/proc/PID/stat`,
/// one short line against the hundreds of lines of `/proc/PID/maps`.
#[derive(Default)]
struct MapsScanner {
    /// pid -> (start time, vsize) at the last read of its maps.
    known: HashMap<u32, (u64, u64)>,
}

impl MapsScanner {
    /// Runtime libraries mapped by processes that are new or changed, one per (dev, inode).
    /// `only`: look at these processes alone (the others are known unchanged).
    fn scan(&mut self, runtimes: &[Runtime], only: Option<&HashSet<u32>>) -> Vec<MappedLibrary> {
        let mut seen: HashSet<(String, u64)> = HashSet::new();
        let mut out = Vec::new();
        let pids: Vec<u32> = match only {
            Some(set) => set.iter().copied().collect(),
            None => {
                let Ok(dir) = std::fs::read_dir("/proc") else {
                    return out;
                };
                dir.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                    .collect()
            }
        };
        let me = std::process::id();
        // A full look rebuilds the known set (dropping the dead); a hinted one updates it.
        let (mut alive, previous) = match only {
            Some(_) => (std::mem::take(&mut self.known), HashMap::new()),
            None => (
                HashMap::with_capacity(self.known.len()),
                std::mem::take(&mut self.known),
            ),
        };
        for pid in pids {
            if pid == me {
                continue;
            }
            let Some(id) = start_and_vsize(pid) else {
                alive.remove(&pid);
                continue;
            };
            // Kernel threads have no address space.
            if id.1 == 0 {
                continue;
            }
            let before = match only {
                Some(_) => alive.insert(pid, id),
                None => {
                    alive.insert(pid, id);
                    previous.get(&pid).copied()
                }
            };
            if before == Some(id) {
                continue;
            }
            // A process that exited meanwhile fails to read: it is read again if it comes back.
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
                alive.remove(&pid);
                continue;
            };
            if !text.contains(".so") {
                continue;
            }
            for lib in parse_maps(pid, &text) {
                if runtimes.contains(&lib.runtime) && seen.insert((lib.dev.clone(), lib.inode)) {
                    out.push(lib);
                }
            }
        }
        self.known = alive;
        out
    }
}

/// (start time in ticks, vsize in bytes) from /proc/PID/stat.
fn start_and_vsize(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may contain spaces and parentheses: field 3
    // (state) is index 0, starttime (22) index 19, vsize (23) index 20.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(19);
    let start = f.next()?.parse().ok()?;
    let vsize = f.next()?.parse().ok()?;
    Some((start, vsize))
}

/// (size, mtime in ns) of an open file.
fn file_stamp(file: Option<&std::fs::File>) -> Option<(u64, i128)> {
    use std::os::unix::fs::MetadataExt;
    let m = file?.metadata().ok()?;
    Some((
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

/// Opens the file `lib` describes: its path when that still is the mapped inode, else (the
/// path was replaced since the process mapped it) the mapping itself through
/// /proc/PID/map_files, so that symbols are read from, and probes put on, the file the
/// process runs.
fn open_mapped(lib: &MappedLibrary) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt;
    let is_it = |m: &std::fs::Metadata| m.ino() == lib.inode;
    let by_path = std::fs::File::open(&lib.host_path);
    if let Ok(f) = &by_path
        && f.metadata().is_ok_and(|m| is_it(&m))
    {
        return by_path.map_err(|e| e.to_string());
    }
    let pid = pid_of(&lib.host_path);
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/map_files")) {
        for e in dir.flatten() {
            if std::fs::metadata(e.path()).is_ok_and(|m| is_it(&m))
                && let Ok(f) = std::fs::File::open(e.path())
            {
                return Ok(f);
            }
        }
    }
    Err(match by_path {
        Err(e) => format!("cannot read {}: {e}", lib.host_path.display()),
        Ok(_) => format!(
            "{} was replaced on disk after pid {pid} mapped it (inode {}) and that mapping cannot be opened",
            lib.host_path.display(),
            lib.inode
        ),
    })
}

fn resolve(lib: &MappedLibrary) -> Lib {
    resolve_file(lib, open_mapped(lib))
}

fn resolve_file(lib: &MappedLibrary, file: Result<std::fs::File, String>) -> Lib {
    let mut status = GpuLibraryStatus {
        runtime: lib.runtime.as_str().into(),
        path: lib.path.display().to_string(),
        host_path: lib.host_path.display().to_string(),
        dev: lib.dev.clone(),
        inode: lib.inode,
        found_in_pid: pid_of(&lib.host_path),
        ..Default::default()
    };
    let mut resolved = Vec::new();
    let read = match &file {
        Ok(f) => {
            use std::os::fd::AsRawFd;
            let fd_path = format!("/proc/self/fd/{}", f.as_raw_fd());
            SymbolTable::read(std::path::Path::new(&fd_path))
                .map_err(|e| e.to_string().replace(&fd_path, &status.host_path))
        }
        Err(e) => Err(e.clone()),
    };
    let file = file.ok();
    let stamp = file_stamp(file.as_ref());
    match read {
        Err(e) => {
            status.state = ProbeState::Failed;
            status.detail = e.to_string();
        }
        Ok(table) => {
            let symbols = CatalogSymbols::resolve(&table, lib.runtime);
            resolved = symbols.resolved;
            status.symbols_attached = symbols.found;
            status.symbols_missing = symbols.missing;
            if resolved.is_empty() {
                status.state = ProbeState::Failed;
                status.detail = format!(
                    "none of the {} {} symbols ethand probes is exported by this file ({} functions)",
                    symbols.wanted,
                    lib.runtime.library(),
                    table.len()
                );
            }
        }
    }
    Lib {
        status,
        file,
        runtime: lib.runtime,
        resolved,
        links: LibraryLinks::default(),
        stamp,
    }
}

fn pid_of(host_path: &std::path::Path) -> u32 {
    host_path
        .components()
        .nth(2)
        .and_then(|c| c.as_os_str().to_str()?.parse().ok())
        .unwrap_or(0)
}

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

fn attach(ebpf: &mut Ebpf, progs: Progs, l: &mut Lib, level: GpuLevel) {
    if level == GpuLevel::System || l.resolved.is_empty() {
        return;
    }
    let path = attach_path(l);
    let time_flag = if level == GpuLevel::Op {
        GPU_COOKIE_TIME
    } else {
        0
    };
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
        .map(|(op, off)| uprobes::at_offset(*off, Some(u64::from(*op))))
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

/// The snapshot view of a process's GPU/NPU calls. None when it made no probed call.
/// `launches_counted`: the level in force probes launches; otherwise they stay None.
pub fn process_stats(
    calls: &BTreeMap<(u16, u16), GpuCallStats>,
    state: Option<&GpuProcState>,
    launches_counted: bool,
) -> Option<g::GpuProcessStats> {
    if calls.is_empty() && state.is_none() {
        return None;
    }
    let mut out = g::GpuProcessStats::default();
    if launches_counted {
        out.launches = Some(0);
        out.graph_launches = Some(0);
    }
    let mut copies: BTreeMap<u16, g::GpuCopyStats> = BTreeMap::new();
    let mut mem: Vec<g::GpuMemoryStats> = gpu_mem::NAMES
        .iter()
        .map(|k| g::GpuMemoryStats {
            kind: k.to_string(),
            ..Default::default()
        })
        .collect();
    let mut colls: BTreeMap<(&str, &str), g::CollectiveStats> = BTreeMap::new();
    for ((op, dir), s) in calls {
        let Some(spec) = CATALOG.get(*op as usize) else {
            continue;
        };
        out.errors += s.errors;
        let direction = if spec.category == Category::Copy {
            gpu_dir::NAMES
                .get(*dir as usize)
                .copied()
                .unwrap_or("default")
        } else {
            ""
        };
        out.symbols.push(g::GpuSymbolStats {
            library: spec.runtime.library().into(),
            symbol: spec.name.into(),
            category: spec.category.as_str().into(),
            direction: direction.into(),
            calls: s.calls,
            errors: s.errors,
            bytes: s.bytes,
            time_ns: s.time_ns,
            timed_calls: s.timed_calls,
        });
        let m = (spec.desc.mem as usize).min(gpu_mem::COUNT - 1);
        match spec.category {
            Category::Launch => {
                if let Some(n) = &mut out.launches {
                    *n += s.calls;
                }
            }
            Category::GraphLaunch => {
                if let Some(n) = &mut out.graph_launches {
                    *n += s.calls;
                }
            }
            Category::Copy => {
                let c = copies.entry(*dir).or_insert_with(|| g::GpuCopyStats {
                    direction: direction.into(),
                    ..Default::default()
                });
                c.calls += s.calls;
                c.bytes += s.bytes;
            }
            Category::Alloc => {
                // Successful allocations only: failed ones carry no bytes.
                mem[m].allocs += s.calls - s.errors.min(s.calls);
                mem[m].alloc_bytes += s.bytes;
            }
            // Frees are counted per allocation kind from the kernel's process state below.
            Category::Free => {}
            Category::Sync => add_timed(&mut out.sync, s),
            Category::Group => add_timed(&mut out.groups, s),
            Category::Collective => {
                let c = colls
                    .entry((spec.runtime.as_str(), spec.operation))
                    .or_insert_with(|| g::CollectiveStats {
                        library: spec.runtime.as_str().into(),
                        operation: spec.operation.into(),
                        ..Default::default()
                    });
                c.calls += s.calls;
                c.bytes += s.bytes;
                c.time_ns += s.time_ns;
                c.timed_calls += s.timed_calls;
            }
            Category::CommInit => out.comm_inits += s.calls,
        }
    }
    if let Some(st) = state {
        for (i, m) in mem.iter_mut().enumerate() {
            m.live_bytes = st.live_bytes[i];
            m.peak_bytes = st.peak_bytes[i].max(st.live_bytes[i]);
            m.frees = st.frees[i];
            m.freed_bytes = st.freed_bytes[i];
        }
        out.untracked_frees = st.untracked_frees;
        if st.nranks > 0 {
            out.comm = Some(g::CommRank {
                library: if st.comm_lib == u32::from(ethand_common::gpu_dtype::HCCL) {
                    "hccl".into()
                } else {
                    "nccl".into()
                },
                rank: (st.rank != u32::MAX).then_some(st.rank),
                nranks: st.nranks,
            });
        }
    }
    out.copies = copies.into_values().collect();
    out.memory = mem
        .into_iter()
        .filter(|m| m.allocs + m.frees + m.live_bytes > 0)
        .collect();
    out.collectives = colls.into_values().collect();
    out.symbols
        .sort_by(|a, b| b.calls.cmp(&a.calls).then(a.symbol.cmp(&b.symbol)));
    Some(out)
}

fn add_timed(t: &mut g::GpuTimedCalls, s: &GpuCallStats) {
    t.calls += s.calls;
    t.time_ns += s.time_ns;
    t.timed_calls += s.timed_calls;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_userspace_probes::catalog::op_id;

    fn st(calls: u64, errors: u64, bytes: u64, time_ns: u64, timed: u64) -> GpuCallStats {
        GpuCallStats {
            calls,
            errors,
            bytes,
            time_ns,
            timed_calls: timed,
        }
    }

    #[test]
    fn kernel_counters_become_the_process_picture() {
        let op = |rt, n| op_id(rt, n).unwrap();
        let mut calls = BTreeMap::new();
        calls.insert((op(Runtime::Cuda, "cuLaunchKernel"), 0), st(10, 0, 0, 0, 0));
        calls.insert(
            (op(Runtime::Cuda, "cuLaunchKernel_ptsz"), 0),
            st(5, 0, 0, 0, 0),
        );
        calls.insert((op(Runtime::Cuda, "cuGraphLaunch"), 0), st(2, 0, 0, 0, 0));
        // Two copy symbols in one direction sum; 2D copies carry their own direction.
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpyHtoD_v2"),
                u16::from(gpu_dir::HOST_TO_DEVICE),
            ),
            st(3, 0, 300, 0, 0),
        );
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpy2D_v2"),
                u16::from(gpu_dir::HOST_TO_DEVICE),
            ),
            st(1, 0, 50, 0, 0),
        );
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpy2D_v2"),
                u16::from(gpu_dir::DEVICE_TO_HOST),
            ),
            st(1, 0, 70, 0, 0),
        );
        // One failed allocation: counted as a call and an error, not as an allocation.
        calls.insert(
            (op(Runtime::Cuda, "cuMemAlloc_v2"), 0),
            st(4, 1, 3000, 10, 4),
        );
        calls.insert((op(Runtime::Cuda, "cuMemFree_v2"), 0), st(2, 0, 1000, 0, 0));
        calls.insert(
            (op(Runtime::Cuda, "cuStreamSynchronize"), 0),
            st(6, 0, 0, 600, 6),
        );
        calls.insert(
            (op(Runtime::Nccl, "ncclAllReduce"), 0),
            st(2, 0, 8192, 40, 2),
        );
        calls.insert(
            (op(Runtime::Nccl, "ncclCommInitRankConfig"), 0),
            st(1, 0, 0, 0, 0),
        );
        let mut state = GpuProcState::default();
        state.live_bytes[0] = 2000;
        state.peak_bytes[0] = 3000;
        // Two cuMemFree_v2 calls: one of a tracked device allocation, one untracked.
        state.frees[0] = 1;
        state.freed_bytes[0] = 1000;
        state.untracked_frees = 1;
        state.comm_lib = u32::from(ethand_common::gpu_dtype::NCCL);
        state.rank = 1;
        state.nranks = 4;
        let g = process_stats(&calls, Some(&state), true).unwrap();
        assert_eq!(g.launches, Some(15));
        assert_eq!(g.graph_launches, Some(2));
        // Below `process` a launch count is not taken: absent, never 0.
        let below = process_stats(&calls, Some(&state), false).unwrap();
        assert_eq!((below.launches, below.graph_launches), (None, None));
        assert_eq!(g.copy_bytes("host_to_device"), 350);
        assert_eq!(g.copy_bytes("device_to_host"), 70);
        let dev = g.memory.iter().find(|m| m.kind == "device").unwrap();
        assert_eq!(
            (dev.allocs, dev.alloc_bytes, dev.frees, dev.freed_bytes),
            (3, 3000, 1, 1000)
        );
        assert_eq!((dev.live_bytes, dev.peak_bytes), (2000, 3000));
        assert_eq!((g.sync.calls, g.sync.time_ns), (6, 600));
        assert_eq!(g.collectives.len(), 1);
        assert_eq!(
            (g.collectives[0].operation.as_str(), g.collectives[0].bytes),
            ("all_reduce", 8192)
        );
        assert_eq!(
            g.comm,
            Some(g::CommRank {
                library: "nccl".into(),
                rank: Some(1),
                nranks: 4
            })
        );
        assert_eq!(g.errors, 1);
        assert_eq!(g.symbols.len(), calls.len());
    }

    #[test]
    fn nothing_called_means_no_gpu_section() {
        assert!(process_stats(&BTreeMap::new(), None, true).is_none());
    }
}
