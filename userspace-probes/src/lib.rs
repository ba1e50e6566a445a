//! Discovery of GPU/NPU runtime libraries mapped by a process, for uprobe attachment.
//! A library is identified by the (device, inode) of its file so that a library shared by
//! many processes (or seen through different container paths) is probed once.
use std::{collections::BTreeMap, fs, path::PathBuf};

pub mod catalog;
pub mod devices;
pub mod elf;
pub mod python;
pub mod source;

/// The runtime libraries ethand knows how to probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// A mapped runtime library file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLibrary {
    pub runtime: Runtime,
    /// Path as the process sees it (inside its mount namespace).
    pub path: PathBuf,
    /// `/proc/PID/root/<path>`: the same file reachable from ethand's namespace.
    pub host_path: PathBuf,
    pub dev: String,
    pub inode: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot read /proc/{pid}/maps: {source}")]
    Maps { pid: u32, source: std::io::Error },
}

/// Parses the text of `/proc/PID/maps` into the runtime libraries it maps, one per file.
pub fn parse_maps(pid: u32, text: &str) -> Vec<MappedLibrary> {
    let mut seen: BTreeMap<(String, u64), MappedLibrary> = BTreeMap::new();
    for line in text.lines() {
        // address perms offset dev inode path
        let mut f = line
            .splitn(6, char::is_whitespace)
            .filter(|s| !s.is_empty());
        let (Some(_addr), Some(_perms), Some(_off), Some(dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let path = path.trim();
        // Files are absolute; anything else ([heap], [vdso], anon names) is not a library.
        if !path.starts_with('/') {
            continue;
        }
        if line.ends_with(" (deleted)") {
            continue; // replaced on disk: the next rescan finds the new file
        }
        let Ok(inode) = inode.parse::<u64>() else {
            continue;
        };
        let Some(name) = path.rsplit('/').next() else {
            continue;
        };
        let Some(runtime) = Runtime::from_file_name(name) else {
            continue;
        };
        seen.entry((dev.to_string(), inode))
            .or_insert_with(|| MappedLibrary {
                runtime,
                path: PathBuf::from(path),
                host_path: PathBuf::from(format!("/proc/{pid}/root{path}")),
                dev: dev.to_string(),
                inode,
            });
    }
    seen.into_values().collect()
}

/// The runtime libraries process `pid` has mapped now.
pub fn discover(pid: u32) -> Result<Vec<MappedLibrary>, DiscoveryError> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|source| DiscoveryError::Maps { pid, source })?;
    Ok(parse_maps(pid, &text))
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
            cuda.host_path,
            PathBuf::from("/proc/42/root/usr/local/nvidia/lib64/libcuda.so.580.159.04")
        );
        assert!(libs.iter().any(|l| l.runtime == Runtime::Nccl));
    }

    #[test]
    fn names() {
        assert_eq!(Runtime::from_file_name("libcuda.so"), Some(Runtime::Cuda));
        assert_eq!(Runtime::from_file_name("libcudart.so.13"), None);
        assert_eq!(Runtime::from_file_name("libhccl.so"), Some(Runtime::Hccl));
        assert_eq!(Runtime::from_file_name("libnccl"), None);
    }

    #[test]
    fn reads_own_maps() {
        // This test process maps no GPU runtime: discovery succeeds and finds none.
        assert!(discover(std::process::id()).unwrap().is_empty());
    }
}
