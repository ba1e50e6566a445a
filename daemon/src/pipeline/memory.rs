//! Host memory from the kernel's text: a process's resident set by kind, swap and peak
//! (/proc/PID/status), its page faults (/proc/PID/stat), the node's (/proc/meminfo) and the
//! memory cgroups' limits, usage and OOM kills (cgroup v1's memory controller or v2).
//!
//! Every read is bounded and into a reused buffer; nothing here runs under the model lock.
//! Measured on the 2-core development VM under the other builders' load (open, read, close
//! of a small C loop, 20,000 reads each): /proc/PID/status 11-13 us, /proc/PID/stat 9 us,
//! /proc/PID/statm 7 us. `status` alone gives the exact split (RssAnon, RssFile, RssShmem:
//! statm's `shared` lumps file and shmem together) and swap, so a round's sample is one
//! `status` read; the faults (one `stat` more) are read by the sweep and for snapshots.
use std::io::Read as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ethand_snapshot::memory::{CgroupMemory, NodeMemory, ProcessMemory};

/// Longest /proc/PID/status read: the kernel's text is ~1.5 KiB; its only free text is the
/// 15-byte comm (escaped).
const STATUS_MAX: usize = 16 * 1024;
/// /proc/PID/stat: comm (15 bytes) and 52 numbers.
const STAT_MAX: usize = 4 * 1024;
/// Longest /proc/PID/cgroup read (as `procinfo::read`).
const CGROUP_FILE_MAX: usize = 64 * 1024;
/// A cgroup control file (memory.events: six lines of numbers).
const CONTROL_FILE_MAX: usize = 4 * 1024;
/// Deepest cgroup path walked for an ancestor's limit, and longest path accepted.
const CGROUP_DEPTH_MAX: usize = 64;
const CGROUP_PATH_MAX: usize = 4096;
/// Most memory cgroups listed for one tree.
pub const TREE_CGROUPS_MAX: usize = 16;
/// v1 reports "no limit" as the page counter's maximum (0x7FFFFFFFFFFFF000 with 4 KiB
/// pages); anything this large is no limit.
const V1_UNLIMITED: u64 = 1 << 62;

/// What one `status` read gives: bytes, None where the line is missing or garbled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusMemory {
    pub anon: Option<u64>,
    pub file: Option<u64>,
    pub shmem: Option<u64>,
    pub swap: Option<u64>,
    pub hwm: Option<u64>,
}

impl StatusMemory {
    /// Resident set, when all three parts were read.
    pub fn rss(&self) -> Option<u64> {
        self.anon?.checked_add(self.file?)?.checked_add(self.shmem?)
    }
}

/// "RssAnon:\t  1234 kB" lines of /proc/PID/status.
pub fn parse_status(text: &[u8]) -> StatusMemory {
    let mut m = StatusMemory::default();
    for line in text.split(|c| *c == b'\n') {
        let Some(colon) = line.iter().position(|c| *c == b':') else {
            continue;
        };
        let slot = match &line[..colon] {
            b"RssAnon" => &mut m.anon,
            b"RssFile" => &mut m.file,
            b"RssShmem" => &mut m.shmem,
            b"VmSwap" => &mut m.swap,
            b"VmHWM" => &mut m.hwm,
            _ => continue,
        };
        *slot = kb_value(&line[colon + 1..]);
    }
    m
}

/// "   1234 kB" to bytes; None for anything else (no unit, garbage, overflow).
fn kb_value(v: &[u8]) -> Option<u64> {
    let v = std::str::from_utf8(v).ok()?;
    let mut words = v.split_ascii_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    if words.next()? != "kB" || words.next().is_some() {
        return None;
    }
    n.checked_mul(1024)
}

/// (minflt, majflt) of /proc/PID/stat: fields 10 and 12, counted after the last ')' (comm
/// may hold spaces and parentheses).
pub fn parse_stat_faults(text: &[u8]) -> Option<(u64, u64)> {
    let close = text.iter().rposition(|c| *c == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // After ')': state(3) ppid pgrp session tty_nr tpgid flags minflt(10) cminflt majflt(12).
    let minflt = fields.nth(7)?.parse().ok()?;
    let majflt = fields.nth(1)?.parse().ok()?;
    Some((minflt, majflt))
}

/// Reads at most `max` bytes of `path` into `buf` (cleared first); false when it could not
/// be read.
fn read_bounded(path: &str, max: usize, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    std::fs::File::open(path)
        .and_then(|f| f.take(max as u64).read_to_end(buf))
        .is_ok()
}

/// A round's sample of one process: one `status` read. None when the process is gone (or
/// is a zombie or kernel thread: no RssAnon line).
pub fn sample(pid: u32, buf: &mut Vec<u8>) -> Option<StatusMemory> {
    if !read_bounded(&format!("/proc/{pid}/status"), STATUS_MAX, buf) {
        return None;
    }
    let s = parse_status(buf);
    s.anon.is_some().then_some(s)
}

/// The faults of one process (one `stat` read).
pub fn faults(pid: u32, buf: &mut Vec<u8>) -> Option<(u64, u64)> {
    read_bounded(&format!("/proc/{pid}/stat"), STAT_MAX, buf)
        .then(|| parse_stat_faults(buf))
        .flatten()
}

/// A process's memory now: `status` and `stat`; None when neither could be read.
pub fn read_process(pid: u32) -> Option<ProcessMemory> {
    let mut buf = Vec::with_capacity(4096);
    let s = sample(pid, &mut buf);
    let f = faults(pid, &mut buf);
    if s.is_none() && f.is_none() {
        return None;
    }
    Some(to_process_memory(s.unwrap_or_default(), f))
}

pub fn to_process_memory(s: StatusMemory, f: Option<(u64, u64)>) -> ProcessMemory {
    ProcessMemory {
        rss_bytes: s.rss(),
        anon_bytes: s.anon,
        file_bytes: s.file,
        shmem_bytes: s.shmem,
        swap_bytes: s.swap,
        rss_hwm_bytes: s.hwm,
        minor_faults: f.map(|f| f.0),
        major_faults: f.map(|f| f.1),
        window: None,
    }
}

/// /proc/meminfo's MemTotal, MemAvailable, SwapTotal, SwapFree; None without the first two.
pub fn parse_meminfo(text: &[u8]) -> Option<NodeMemory> {
    let (mut total, mut avail, mut swap_total, mut swap_free) = (None, None, None, None);
    for line in text.split(|c| *c == b'\n') {
        let Some(colon) = line.iter().position(|c| *c == b':') else {
            continue;
        };
        let slot = match &line[..colon] {
            b"MemTotal" => &mut total,
            b"MemAvailable" => &mut avail,
            b"SwapTotal" => &mut swap_total,
            b"SwapFree" => &mut swap_free,
            _ => continue,
        };
        *slot = kb_value(&line[colon + 1..]);
    }
    Some(NodeMemory {
        total_bytes: total?,
        available_bytes: avail?,
        swap_total_bytes: swap_total.unwrap_or(0),
        swap_free_bytes: swap_free.unwrap_or(0),
    })
}

pub fn node_memory() -> Option<NodeMemory> {
    let mut buf = Vec::new();
    read_bounded("/proc/meminfo", 16 * 1024, &mut buf)
        .then(|| parse_meminfo(&buf))
        .flatten()
}

/// Which hierarchy holds a process's memory cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The memory cgroup's path of /proc/PID/cgroup: the v1 line whose controllers include
/// `memory` ("4:memory:/a"), else the v2 line ("0::/a") when `v2_has_memory`. The path is
/// checked by [`safe_relative`] before any use.
pub fn parse_memory_cgroup(text: &[u8], v2_has_memory: bool) -> Option<(CgroupVersion, String)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some((CgroupVersion::V1, path.to_string()));
        }
        if controllers.is_empty() && v2_has_memory {
            v2 = Some((CgroupVersion::V2, path.to_string()));
        }
    }
    v2
}

/// A cgroup path as /proc/PID/cgroup writes it ("/a/b"), as the components to open beneath
/// the hierarchy's mount. Refused: a path not starting with '/', `..` or `.` components (a
/// process in another cgroup namespace sees "/../x": outside ours), NUL, more than
/// [`CGROUP_DEPTH_MAX`] levels or [`CGROUP_PATH_MAX`] bytes.
pub fn safe_relative(path: &str) -> Result<Vec<&str>, &'static str> {
    if path.len() > CGROUP_PATH_MAX {
        return Err("cgroup path too long");
    }
    let rest = path.strip_prefix('/').ok_or("cgroup path not absolute")?;
    let parts: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    if parts
        .iter()
        .any(|c| *c == ".." || *c == "." || c.contains('\0'))
    {
        return Err("cgroup path outside ethand's cgroup namespace");
    }
    if parts.len() > CGROUP_DEPTH_MAX {
        return Err("cgroup path too deep");
    }
    Ok(parts)
}

/// A hierarchy's mount, held open: files are opened beneath it only.
pub struct Hierarchy {
    dir: OwnedFd,
    pub version: CgroupVersion,
}

impl Hierarchy {
    pub fn open(path: &str, version: CgroupVersion) -> Option<Self> {
        let c = std::ffi::CString::new(path).ok()?;
        // SAFETY: a NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a descriptor we just opened and nobody else owns.
        (fd >= 0).then(|| Self {
            dir: unsafe { OwnedFd::from_raw_fd(fd) },
            version,
        })
    }

    /// Opens `components/file` beneath the mount: openat2 with RESOLVE_BENEATH and no
    /// symlinks where the kernel has it (5.6+), else openat of the checked components.
    pub fn read(&self, components: &[&str], file: &str, buf: &mut Vec<u8>) -> bool {
        let mut rel = components.join("/");
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(file);
        let Ok(c) = std::ffi::CString::new(rel) else {
            return false;
        };
        // SAFETY: a plain C struct; all-zero is valid.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
        how.resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: valid pointers for the call's duration; the result is owned below.
        let mut fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        } as i32;
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            // SAFETY: as above; the components were checked by `safe_relative`.
            fd = unsafe {
                libc::openat(
                    self.dir.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                )
            };
        }
        if fd < 0 {
            return false;
        }
        // SAFETY: a descriptor we just opened.
        let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        buf.clear();
        f.take(CONTROL_FILE_MAX as u64).read_to_end(buf).is_ok()
    }
}

/// The memory controller's hierarchies on this host: v1's own (/sys/fs/cgroup/memory), and
/// the unified one when memory is among its controllers (pure v2 or hybrid).
pub struct MemoryHierarchies {
    v1: Option<Hierarchy>,
    v2: Option<Hierarchy>,
}

impl MemoryHierarchies {
    pub fn find() -> Self {
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes")
            .exists()
            .then(|| Hierarchy::open("/sys/fs/cgroup/memory", CgroupVersion::V1))
            .flatten();
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .find(|root| {
                std::fs::read_to_string(format!("{root}/cgroup.controllers"))
                    .is_ok_and(|c| c.split_ascii_whitespace().any(|w| w == "memory"))
            })
            .and_then(|root| Hierarchy::open(root, CgroupVersion::V2));
        Self { v1, v2 }
    }

    /// The memory cgroup of `pid` (path and hierarchy) from its /proc/PID/cgroup.
    pub fn cgroup_of(&self, pid: u32) -> Option<(CgroupVersion, String)> {
        let mut buf = Vec::new();
        read_bounded(&format!("/proc/{pid}/cgroup"), CGROUP_FILE_MAX, &mut buf)
            .then(|| parse_memory_cgroup(&buf, self.v2.is_some()))
            .flatten()
            .filter(|(v, _)| match v {
                CgroupVersion::V1 => self.v1.is_some(),
                CgroupVersion::V2 => self.v2.is_some(),
            })
    }

    /// Limit (the lowest of the cgroup and its ancestors), usage and OOM figures.
    pub fn read(&self, version: CgroupVersion, path: &str) -> CgroupMemory {
        let mut out = CgroupMemory {
            path: path.to_string(),
            version: match version {
                CgroupVersion::V1 => "v1",
                CgroupVersion::V2 => "v2",
            }
            .into(),
            ..Default::default()
        };
        let h = match version {
            CgroupVersion::V1 => self.v1.as_ref(),
            CgroupVersion::V2 => self.v2.as_ref(),
        };
        let Some(h) = h else {
            out.note = "memory controller not mounted".into();
            return out;
        };
        let parts = match safe_relative(path) {
            Ok(p) => p,
            Err(why) => {
                out.note = why.into();
                return out;
            }
        };
        let mut buf = Vec::new();
        let (limit_file, usage_file) = match version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            CgroupVersion::V2 => ("memory.max", "memory.current"),
        };
        if h.read(&parts, usage_file, &mut buf) {
            out.usage_bytes = parse_number(&buf);
        } else {
            out.note = format!("{usage_file} unreadable");
        }
        // The limit in force is the lowest on the way up (v1 with use_hierarchy, always v2).
        for depth in (0..=parts.len()).rev() {
            if h.read(&parts[..depth], limit_file, &mut buf) {
                if let Some(l) = parse_limit(&buf, version) {
                    if out.limit_bytes.is_none_or(|cur| l < cur) {
                        out.limit_bytes = Some(l);
                        out.limit_path = Some(format!("/{}", parts[..depth].join("/")));
                    }
                }
            }
        }
        match version {
            CgroupVersion::V1 => {
                if h.read(&parts, "memory.oom_control", &mut buf) {
                    out.oom_kills = keyed(&buf, "oom_kill");
                }
            }
            CgroupVersion::V2 => {
                if h.read(&parts, "memory.events", &mut buf) {
                    out.oom_events = keyed(&buf, "oom");
                    out.oom_kills = keyed(&buf, "oom_kill");
                }
            }
        }
        out
    }
}

/// One decimal number and a newline.
fn parse_number(buf: &[u8]) -> Option<u64> {
    std::str::from_utf8(buf).ok()?.trim().parse().ok()
}

/// A limit file: a number, "max" (v2) or v1's near-2^63 for no limit: None.
pub fn parse_limit(buf: &[u8], version: CgroupVersion) -> Option<u64> {
    let n = parse_number(buf)?;
    (version == CgroupVersion::V2 || n < V1_UNLIMITED).then_some(n)
}

/// "key N" lines (memory.events, memory.oom_control).
pub fn keyed(buf: &[u8], key: &str) -> Option<u64> {
    std::str::from_utf8(buf).ok()?.lines().find_map(|l| {
        let mut w = l.split_ascii_whitespace();
        (w.next()? == key).then(|| w.next()?.parse().ok())?
    })
}

/// The memory cgroups of `pids` (at most [`TREE_CGROUPS_MAX`]), each read once.
pub fn tree_cgroups(pids: &[u32]) -> Vec<CgroupMemory> {
    let h = MemoryHierarchies::find();
    let mut by_path: Vec<((CgroupVersion, String), Vec<u32>)> = Vec::new();
    for &pid in pids {
        let Some(cg) = h.cgroup_of(pid) else {
            continue;
        };
        match by_path.iter().position(|(k, _)| *k == cg) {
            Some(i) => by_path[i].1.push(pid),
            None if by_path.len() < TREE_CGROUPS_MAX => by_path.push((cg, vec![pid])),
            None => {}
        }
    }
    by_path
        .into_iter()
        .map(|((version, path), pids)| CgroupMemory {
            pids,
            ..h.read(version, &path)
        })
        .collect()
}

#[cfg(test)]
mod tests;
