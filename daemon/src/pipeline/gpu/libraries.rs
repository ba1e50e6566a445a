//! Finding the runtime library files to probe: the driver libraries on this host, the ones
//! processes map (read from /proc only where an address space changed), each opened as the
//! file the process runs and its catalog symbols resolved.
use super::*;

/// The directory of the NVML library this process loaded (the driver's own directory).
pub(super) fn nvml_directory() -> Option<PathBuf> {
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
pub(super) fn system_driver_libraries(nvml_dir: Option<&std::path::Path>) -> Vec<PathBuf> {
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
pub(super) fn library_file(path: &std::path::Path, runtimes: &[Runtime]) -> Option<MappedLibrary> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).ok()?;
    let runtime = Runtime::from_file_name(real.file_name()?.to_str()?)
        .or_else(|| Runtime::from_file_name(path.file_name()?.to_str()?))?;
    if !runtimes.contains(&runtime) {
        return None;
    }
    let m = std::fs::metadata(&real).ok()?;
    Some(MappedLibrary {
        runtime,
        path: real,
        pid: 0,
        dev_major: libc::major(m.dev()),
        dev_minor: libc::minor(m.dev()),
        inode: m.ino(),
    })
}

/// Reads process mappings, skipping processes whose address space has not changed size since
/// the last scan: a `dlopen` maps new memory and so changes `vsize` in `/proc/PID/stat`,
/// one short line against the hundreds of lines of `/proc/PID/maps`.
#[derive(Default)]
pub(super) struct MapsScanner {
    /// pid -> (start time, vsize) at the last read of its maps.
    pub(super) known: HashMap<u32, (u64, u64)>,
}

impl MapsScanner {
    /// Runtime libraries mapped by processes that are new or changed, one per (dev, inode).
    /// `only`: look at these processes alone (the others are known unchanged).
    pub(super) fn scan(
        &mut self,
        runtimes: &[Runtime],
        only: Option<&HashSet<u32>>,
    ) -> Vec<MappedLibrary> {
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
            let Ok(libs) = discover(pid) else {
                alive.remove(&pid);
                continue;
            };
            for lib in libs {
                if runtimes.contains(&lib.runtime) && seen.insert((lib.dev(), lib.inode)) {
                    out.push(lib);
                }
            }
        }
        self.known = alive;
        out
    }
}

/// (start time in ticks, vsize in bytes) from /proc/PID/stat.
pub(super) fn start_and_vsize(pid: u32) -> Option<(u64, u64)> {
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
pub(super) fn file_stamp(file: Option<&std::fs::File>) -> Option<(u64, i128)> {
    use std::os::unix::fs::MetadataExt;
    let m = file?.metadata().ok()?;
    Some((
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

/// A library file the daemon holds open, described for reading it again: by the path the
/// daemon sees it at, on the host (the process it was found in may be gone).
pub(super) fn held(lib: &MappedLibrary, file: &std::fs::File) -> MappedLibrary {
    use std::os::fd::AsRawFd;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .unwrap_or_else(|_| lib.path.clone());
    MappedLibrary {
        path,
        pid: 0,
        ..lib.clone()
    }
}

/// The status of a library file, before its symbols are known.
pub(super) fn status_of(lib: &MappedLibrary) -> GpuLibraryStatus {
    GpuLibraryStatus {
        runtime: lib.runtime.as_str().into(),
        path: lib.path.display().to_string(),
        host_path: lib.host_path(),
        dev: lib.dev(),
        inode: lib.inode,
        found_in_pid: lib.pid,
        ..Default::default()
    }
}

/// A library that cannot be probed, and why.
pub(super) fn failed(lib: &MappedLibrary, why: String) -> Lib {
    let mut status = status_of(lib);
    status.state = ProbeState::Failed;
    status.detail = why;
    Lib {
        status,
        file: None,
        runtime: lib.runtime,
        resolved: Vec::new(),
        links: LibraryLinks::default(),
        stamp: None,
        mapped: lib.clone(),
    }
}

/// A library file whose catalog symbols the reader found (`answer`), with the file the
/// daemon holds open to attach through (the same device and inode; it must not have changed
/// between the two opens).
pub(super) fn resolved(
    lib: &MappedLibrary,
    file: std::fs::File,
    answer: Result<(FileId, CatalogSymbols, usize), String>,
) -> Lib {
    let (id, symbols, functions) = match answer {
        Ok(a) => a,
        Err(e) => return failed(lib, e),
    };
    let stamp = file_stamp(Some(&file));
    let same_inode = {
        use std::os::unix::fs::MetadataExt;
        file.metadata().is_ok_and(|m| {
            m.ino() == id.inode
                && libc::major(m.dev()) == id.dev_major
                && libc::minor(m.dev()) == id.dev_minor
        })
    };
    if !same_inode || stamp != Some((id.size, i128::from(id.mtime_ns))) {
        return failed(
            lib,
            "the file changed while its symbols were read (found again at a later rescan)".into(),
        );
    }
    let mut status = status_of(lib);
    status.symbols_attached = symbols.found.clone();
    status.symbols_missing = symbols.missing.clone();
    if symbols.resolved.is_empty() {
        status.state = ProbeState::Failed;
        status.detail = format!(
            "none of the {} {} symbols ethand probes is exported by this file ({functions} functions)",
            symbols.wanted,
            lib.runtime.library(),
        );
    }
    Lib {
        status,
        file: Some(file),
        runtime: lib.runtime,
        resolved: symbols.resolved,
        links: LibraryLinks::default(),
        stamp,
        mapped: lib.clone(),
    }
}
