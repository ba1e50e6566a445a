//! The way to the libethand_cupti.so of injected processes, for whoever opens windows (the
//! daemon's snapshots, `ethand record`): the directory's one-writer lock, the library
//! installed there and probed for all processes, its control file, and the maps the probes
//! write (`CUPTI_OPEN`: which windows pass; `CUPTI_EVENTS`: what they hand over).
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    programs::uprobe::{UProbeLinkId, UProbeScope},
};
use ethand_common::cupti_kinds;
use ethand_userspace_probes::cupti::{
    ControlError, ControlFile, ControlLock, ProcessKey, WindowRequest,
};
use tracing::info;

use super::{CONTROL_NAME, LIBRARY, LIBRARY_NAME, PROGS};
use crate::pipeline::{
    bpf_error::take_map,
    procinfo::{monotonic_ns, unix_ms},
    uprobes,
};

/// Why no channel: another ethand owns the directory (its jobs follow its files), or
/// something failed.
#[derive(Debug)]
pub enum ChannelError {
    Owned(String),
    Failed(String),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Owned(e) | Self::Failed(e) => f.write_str(e),
        }
    }
}

/// The library as installed: its file, its identity and the probe functions' file offsets.
struct Installed {
    path: PathBuf,
    dev: u64,
    ino: u64,
    offsets: [u64; 3],
}

pub struct Channel {
    installed: Installed,
    ctl: ControlFile,
    /// The directory's one-writer lock, held while the channel lives.
    _lock: ControlLock,
    /// `CUPTI_EVENTS`, mapped only while drained: the mapping of its 8 MiB counts in the
    /// RSS in full (the kernel maps every page at once).
    events: aya::maps::Map,
    open: BpfHashMap<MapData, u32, u64>,
    next_window: u64,
    /// The probes on the installed library, for as long as the channel lives.
    _links: Vec<(&'static str, UProbeLinkId)>,
}

impl Channel {
    /// Takes `dir`'s lock, installs the library and its control file there and attaches
    /// the probe programs to the installed file.
    pub fn new(ebpf: &mut Ebpf, dir: &Path) -> Result<Self, ChannelError> {
        // Before anything is written there: another ethand (the daemon, beside a standalone
        // snapshot or a recording) may own the directory, and its jobs follow its files.
        let lock = match prepare_dir(dir).and_then(|()| Ok(ControlLock::acquire(dir)?)) {
            Ok(lock) => lock,
            Err(e) => {
                let owned = matches!(e.downcast_ref(), Some(ControlError::Owned { .. }));
                let e = format!("{e:#}");
                return Err(if owned {
                    ChannelError::Owned(e)
                } else {
                    ChannelError::Failed(e)
                });
            }
        };
        let r = (|| -> anyhow::Result<Self> {
            for (prog, _) in PROGS {
                uprobes::load(ebpf, prog)?;
            }
            let events = take_map(ebpf, "CUPTI_EVENTS")?;
            // The right type now, rather than at the first window.
            drop(RingBuf::try_from(&events)?);
            let open = BpfHashMap::try_from(take_map(ebpf, "CUPTI_OPEN")?)?;
            let installed = install(dir)?;
            let mut links = Vec::new();
            for ((prog, _), off) in PROGS.into_iter().zip(installed.offsets) {
                let link = uprobes::attach(
                    ebpf,
                    prog,
                    &installed.path,
                    vec![uprobes::at_offset(off, None)],
                    UProbeScope::AllProcesses,
                )?;
                links.push((prog, link));
            }
            let ctl = ControlFile::create(&dir.join(CONTROL_NAME))?;
            info!(library = %installed.path.display(), "GPU activity recording ready: start CUDA jobs with CUDA_INJECTION64_PATH set to the library");
            Ok(Self {
                installed,
                ctl,
                _lock: lock,
                events,
                open,
                // Unique across restarts: the library opens a window id once.
                next_window: unix_ms().saturating_mul(1000),
                _links: links,
            })
        })();
        r.map_err(|e| ChannelError::Failed(format!("{e:#}")))
    }

    /// Where the library is, for `CUDA_INJECTION64_PATH`.
    pub fn library_path(&self) -> &Path {
        &self.installed.path
    }

    /// Whether `pid` maps this library (Ok(false): no libethand_cupti.so at all); another
    /// file of that name is named in the error.
    pub fn injected(&self, pid: u32) -> Result<bool, String> {
        let i = &self.installed;
        injected(pid, &i.path, i.dev, i.ino)
    }

    /// A new window id (the library opens each once).
    pub fn next_window_id(&mut self) -> u64 {
        self.next_window += 1;
        self.next_window
    }

    /// Lets `window_id`'s events of `pid` pass the probes and wakes its library: it records
    /// every kind until `deadline_mono_ns` or `max_records`.
    pub fn open(
        &mut self,
        pid: u32,
        window_id: u64,
        deadline_mono_ns: u64,
        max_records: u64,
    ) -> Result<ProcessKey, String> {
        let key = ProcessKey::of(pid).map_err(|e| format!("its pid namespace: {e}"))?;
        self.open
            .insert(&pid, &window_id, 0)
            .map_err(|e| format!("CUPTI_OPEN: {e}"))?;
        // The library wakes on this: its events pass the filter by then.
        self.ctl
            .open(
                key,
                WindowRequest {
                    window_id,
                    deadline_mono_ns,
                    kinds: cupti_kinds::ALL,
                    max_records: u32::try_from(max_records).unwrap_or(u32::MAX),
                },
                monotonic_ns(),
            )
            .map_err(|e| e.to_string())?;
        Ok(key)
    }

    /// Tells a library its window is over now, before its deadline; its last records and
    /// its CLOSED event still pass the probes until [`Channel::close`].
    pub fn end_early(&mut self, key: ProcessKey, window_id: u64) {
        self.ctl.close(key, window_id);
    }

    /// Tells `pid`'s library its window is over (if it was opened) and stops its events.
    pub fn close(&mut self, pid: u32, key: Option<ProcessKey>, window_id: u64) {
        if let Some(key) = key {
            self.ctl.close(key, window_id);
        }
        // Another window of the same process (a second snapshot) keeps its entry.
        if self.open.get(&pid, 0).ok() == Some(window_id) {
            let _ = self.open.remove(&pid);
        }
    }

    /// Every entry the probes wrote so far, to `each`.
    pub fn drain(&self, mut each: impl FnMut(&[u8])) {
        let Ok(mut events) = RingBuf::try_from(&self.events) else {
            return;
        };
        while let Some(item) = events.next() {
            each(&item);
        }
    }
}

/// Whether `pid` maps the library at `lib_path` (Ok(false): no libethand_cupti.so at all);
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

/// Whether `pid` maps a file named libethand_cupti.so at all (which one is not asked):
/// whether a channel is worth opening for it.
pub fn maps_a_library(pid: u32) -> bool {
    injected(pid, Path::new(""), u64::MAX, u64::MAX) != Ok(false)
}

/// Whether `pid` runs the library's control thread (named `ethand-cupti`); None when its
/// threads cannot be read. A thread name is the process's to set: a process naming one so
/// only makes the caller wait for an answer that does not come (`no_answer`).
pub fn control_thread(pid: u32) -> Option<bool> {
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
