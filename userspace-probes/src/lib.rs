//! Discovery of GPU/NPU runtime libraries mapped by a process, for uprobe attachment, and
//! what a process maps read by what the kernel says (`procmaps`).
//! A library is identified by the (device, inode) of its file so that a library shared by
//! many processes (or seen through different container paths) is probed once.
use std::{collections::BTreeMap, path::PathBuf};

pub mod catalog;
pub mod cupti;
pub mod devices;
pub mod elf;
pub mod procmaps;

/// The runtime libraries ethand knows how to probe.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Runtime {
    Cuda,
    Nccl,
    AscendCl,
    Hccl,
}

impl Runtime {
    pub const ALL: [Self; 4] = [Self::Cuda, Self::Nccl, Self::AscendCl, Self::Hccl];

    /// The library's base name: "libcuda", "libnccl", "libascendcl", "libhccl".
    pub fn library(self) -> &'static str {
        match self {
            Self::Cuda => "libcuda",
            Self::Nccl => "libnccl",
            Self::AscendCl => "libascendcl",
            Self::Hccl => "libhccl",
        }
    }

    /// Short name used in labels: "cuda", "nccl", "ascendcl", "hccl".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Nccl => "nccl",
            Self::AscendCl => "ascendcl",
            Self::Hccl => "hccl",
        }
    }

    /// The runtime a mapped file name belongs to, from its file name (`libcuda.so.580.1`).
    pub fn from_file_name(name: &str) -> Option<Self> {
        let stem = name.split(".so").next()?;
        if !name.contains(".so") {
            return None;
        }
        match stem {
            "libcuda" => Some(Self::Cuda),
            "libnccl" => Some(Self::Nccl),
            "libascendcl" => Some(Self::AscendCl),
            "libhccl" => Some(Self::Hccl),
            _ => None,
        }
    }
}

/// A mapped runtime library file, as the kernel describes the mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLibrary {
    pub runtime: Runtime,
    /// Path as the process sees it (inside its mount namespace), raw: spaces and newlines
    /// kept.
    pub path: PathBuf,
    /// The process it was found in: `path` is resolved inside its root. 0: the host's root
    /// (a driver library probed at start-up).
    pub pid: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
}

impl MappedLibrary {
    /// "major:minor" in hex, as /proc/PID/maps writes a device.
    pub fn dev(&self) -> String {
        format!("{:02x}:{:02x}", self.dev_major, self.dev_minor)
    }

    /// Where the file is for a person reading `ethand status`: `/proc/PID/root/<path>`.
    pub fn host_path(&self) -> String {
        if self.pid == 0 {
            self.path.display().to_string()
        } else {
            format!("/proc/{}/root{}", self.pid, self.path.display())
        }
    }

    /// The mapping, for [`procmaps::open_mapped`].
    pub fn vma(&self) -> procmaps::Vma {
        use std::os::unix::ffi::OsStrExt;
        procmaps::Vma {
            start: 0,
            end: 0,
            offset: 0,
            dev_major: self.dev_major,
            dev_minor: self.dev_minor,
            inode: self.inode,
            executable: true,
            name: self.path.as_os_str().as_bytes().to_vec(),
        }
    }

    /// Opens the file itself: a regular file with this device and inode, inside the root of
    /// the process it was found in (never a FIFO or device: nothing blocks).
    pub fn open(&self) -> Result<std::fs::File, procmaps::OpenError> {
        let root = if self.pid == 0 {
            procmaps::host_root()
        } else {
            procmaps::open_root(self.pid)
        }
        .map_err(|e| {
            procmaps::OpenError::Io(format!("cannot open /proc/{}/root: {e}", self.pid))
        })?;
        procmaps::open_mapped(&root, &self.vma())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot read /proc/{pid}/maps: {source}")]
    Maps { pid: u32, source: std::io::Error },
}

/// Whether a maps line's name may be a runtime library (the text spells these names as they
/// are): the cheap look before the kernel is asked.
fn may_be_runtime(name: &[u8]) -> bool {
    Runtime::ALL.iter().any(|r| {
        let lib = r.library().as_bytes();
        name.windows(lib.len()).any(|w| w == lib)
    })
}

/// The runtime a mapping's raw name belongs to, from its file name.
fn runtime_of(name: &[u8]) -> Option<Runtime> {
    let base = name.rsplit(|&c| c == b'/').next()?;
    Runtime::from_file_name(&String::from_utf8_lossy(base))
}

/// The runtime libraries process `pid` has mapped now, one per file (device, inode), as the
/// kernel names them (a path with spaces or newlines is found like any other).
pub fn discover(pid: u32) -> Result<Vec<MappedLibrary>, DiscoveryError> {
    let mut maps =
        procmaps::ProcMaps::open(pid).map_err(|source| DiscoveryError::Maps { pid, source })?;
    let vmas = maps
        .candidates(may_be_runtime)
        .map_err(|source| DiscoveryError::Maps { pid, source })?;
    Ok(libraries(pid, vmas))
}

/// The runtime libraries among `vmas` (file mappings of process `pid`), one per file.
pub fn libraries(pid: u32, vmas: Vec<procmaps::Vma>) -> Vec<MappedLibrary> {
    let mut seen: BTreeMap<(u32, u32, u64), MappedLibrary> = BTreeMap::new();
    for v in vmas {
        if !v.is_file() {
            continue;
        }
        let Some(runtime) = runtime_of(&v.name) else {
            continue;
        };
        seen.entry((v.dev_major, v.dev_minor, v.inode))
            .or_insert_with(|| MappedLibrary {
                runtime,
                path: v.path(),
                pid,
                dev_major: v.dev_major,
                dev_minor: v.dev_minor,
                inode: v.inode,
            });
    }
    seen.into_values().collect()
}

/// The runtime libraries of a maps text (the text alone: names as spelled, escapes undone).
/// For the fuzz target and tests; the daemon asks the kernel ([`discover`]).
pub fn parse_maps(pid: u32, text: &str) -> Vec<MappedLibrary> {
    let vmas = text
        .lines()
        .take(procmaps::MAX_VMAS)
        .filter_map(|l| procmaps::parse_line(l.as_bytes()))
        .collect();
    libraries(pid, vmas)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `procfs` fuzz target: a name that is not an absolute path is no file.
    #[test]
    fn relative_names_are_not_libraries() {
        let maps =
            "7f0000300000-7f0000400000 r-xp 00000000 fd:01 99 \u{fffd}opt/lib/libnccl.so.2\n";
        assert!(parse_maps(42, maps).is_empty());
    }

    const MAPS: &str = "\
7f0000000000-7f0000100000 r--p 00000000 fd:01 1234 /usr/local/nvidia/lib64/libcuda.so.580.159.04
7f0000100000-7f0000200000 r-xp 00100000 fd:01 1234 /usr/local/nvidia/lib64/libcuda.so.580.159.04
7f0000300000-7f0000400000 r-xp 00000000 fd:01 99 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f0000500000-7f0000600000 r-xp 00000000 fd:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000700000-7f0000800000 r-xp 00000000 fd:01 55 /usr/lib/libcudart.so.13
7f0000900000-7f0000a00000 r-xp 00000000 00:00 0 [heap]
";

    #[test]
    fn finds_each_runtime_file_once() {
        let libs = parse_maps(42, MAPS);
        assert_eq!(libs.len(), 2, "{libs:?}");
        let cuda = libs.iter().find(|l| l.runtime == Runtime::Cuda).unwrap();
        assert_eq!(cuda.inode, 1234);
        assert_eq!(
            cuda.host_path(),
            "/proc/42/root/usr/local/nvidia/lib64/libcuda.so.580.159.04"
        );
        assert_eq!(cuda.dev(), "fd:01");
        assert!(libs.iter().any(|l| l.runtime == Runtime::Nccl));
    }

    #[test]
    fn names() {
        assert_eq!(Runtime::from_file_name("libcuda.so"), Some(Runtime::Cuda));
        assert_eq!(Runtime::from_file_name("libcudart.so.13"), None);
        assert_eq!(Runtime::from_file_name("libhccl.so"), Some(Runtime::Hccl));
        assert_eq!(Runtime::from_file_name("libnccl"), None);
    }

    /// Names the text cannot spell plainly are found as they are: a space, a newline.
    #[test]
    fn hostile_names_are_libraries_too() {
        let maps = "7f00-7f10 r-xp 00000000 fd:01 5 /opt/a b\\012c/libcuda.so.1\n";
        let libs = parse_maps(1, maps);
        assert_eq!(libs.len(), 1);
        assert_eq!(libs[0].path, PathBuf::from("/opt/a b\nc/libcuda.so.1"));
    }

    #[test]
    fn reads_own_maps() {
        // This test process maps no GPU runtime: discovery succeeds and finds none.
        assert!(discover(std::process::id()).unwrap().is_empty());
    }
}
