//! A process's mappings as the kernel describes them, and the files behind them opened by what
//! is mapped, never by what a path says.
//!
//! The text of `/proc/PID/maps` cannot be decoded reliably: the kernel escapes only a newline
//! (as `\012`), so a file literally named `a\012b` prints the same as `a<newline>b`, and a
//! live file named `x (deleted)` looks deleted. Whoever owns the process chooses those names.
//! So:
//! - [`ProcMaps`] asks the kernel with the `PROCMAP_QUERY` ioctl (Linux 6.11+): start, end,
//!   offset, device, inode and the raw path bytes of each mapping. On older kernels it reads
//!   the text, bounded (at most [`MAX_LINE`] bytes a line, [`MAX_VMAS`] lines), and undoes the
//!   one escape; the ambiguity left is settled by the check below.
//! - [`open_mapped`] opens a mapping's file inside the process's root (`openat2` with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, `O_PATH`: no FIFO or device is ever opened for
//!   reading, so nothing can block), accepts it only when it is a regular file whose
//!   (device, inode) are the mapping's, and only then reopens it for reading through
//!   `/proc/self/fd`. The reopen checks permissions with the caller's credentials: run as the
//!   process's owner, it reads only what that user may read.
//!
//! Nothing here parses file contents.
use std::{
    ffi::OsStr,
    fs::File,
    io::{BufRead, BufReader, Read, Seek},
    os::{
        fd::{AsFd, AsRawFd},
        unix::ffi::OsStrExt,
    },
    path::PathBuf,
};

/// Longest maps line read (the kernel's paths are at most PATH_MAX, 4096 bytes, escaped).
pub const MAX_LINE: usize = 16 * 1024;
/// Most mappings looked at in one process (the kernel's default `vm.max_map_count` is 65530).
pub const MAX_VMAS: usize = 262_144;
/// Longest path asked of `PROCMAP_QUERY` (the kernel's PATH_MAX plus " (deleted)").
const NAME_BUF: usize = 4096 + 16;

/// One mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// 0 for memory no file backs.
    pub inode: u64,
    pub executable: bool,
    /// The mapping's name as the kernel gives it: a file's path inside the process's root
    /// (raw bytes; a deleted file ends with " (deleted)"), or `[heap]`, `[vdso]`,
    /// `[anon:NAME]`; empty for anonymous memory.
    pub name: Vec<u8>,
}

impl Vma {
    /// Whether a file backs it (its name is a path and it has an inode).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.name.first() == Some(&b'/')
    }

    /// The name as a path (raw bytes kept: spaces and newlines included).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(&self.name))
    }

    /// The file offset of `addr`, an address inside this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr.saturating_sub(self.start).saturating_add(self.offset)
    }

    /// "major:minor" in hex, as /proc/PID/maps writes a device.
    pub fn dev_string(&self) -> String {
        format!("{:02x}:{:02x}", self.dev_major, self.dev_minor)
    }
}

/// `struct procmap_query` of include/uapi/linux/fs.h.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const QUERY_VMA_EXECUTABLE: u64 = 0x04;
const QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
const QUERY_FILE_BACKED_VMA: u64 = 0x20;
/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
    | ((size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;

/// How mappings are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The `PROCMAP_QUERY` ioctl: raw paths.
    Query,
    /// The text, bounded and unescaped (kernels before 6.11).
    Text,
}

/// `/proc/PID/maps`, held open.
pub struct ProcMaps {
    file: File,
    method: Method,
}

impl ProcMaps {
    /// Opens `/proc/PID/maps` (the kernel checks at open that the caller may read it).
    pub fn open(pid: u32) -> std::io::Result<Self> {
        Self::from_file(File::open(format!("/proc/{pid}/maps"))?)
    }

    /// Wraps an open maps file, finding out whether the kernel answers `PROCMAP_QUERY`.
    pub fn from_file(file: File) -> std::io::Result<Self> {
        let mut me = Self {
            file,
            method: Method::Query,
        };
        match me.query(0, QUERY_COVERING_OR_NEXT_VMA, false) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => me.method = Method::Text,
            _ => {}
        }
        Ok(me)
    }

    /// Reads the text even where the kernel would answer the ioctl (tests of the fallback).
    pub fn force_text(&mut self) {
        self.method = Method::Text;
    }

    pub fn method(&self) -> Method {
        self.method
    }

    /// One `PROCMAP_QUERY`; None when no mapping matches (ENOENT).
    fn query(&self, addr: u64, flags: u64, name: bool) -> std::io::Result<Option<Vma>> {
        let mut buf = vec![0u8; if name { NAME_BUF } else { 0 }];
        let mut q = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_flags: flags,
            query_addr: addr,
            ..ProcmapQuery::default()
        };
        if name {
            q.vma_name_size = buf.len() as u32;
            q.vma_name_addr = buf.as_mut_ptr() as u64;
        }
        // SAFETY: the ioctl reads and writes one procmap_query and writes at most
        // vma_name_size bytes into `buf`, which lives until after the call.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                PROCMAP_QUERY as _,
                &mut q as *mut ProcmapQuery,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        // The kernel counts the terminating NUL in vma_name_size.
        let len = (q.vma_name_size as usize).saturating_sub(1).min(buf.len());
        buf.truncate(len);
        Ok(Some(Vma {
            start: q.vma_start,
            end: q.vma_end,
            offset: q.vma_offset,
            dev_major: q.dev_major,
            dev_minor: q.dev_minor,
            inode: q.inode,
            executable: q.vma_flags & QUERY_VMA_EXECUTABLE != 0,
            name: buf,
        }))
    }

    /// The mapping that holds `addr`.
    pub fn at(&mut self, addr: u64) -> std::io::Result<Option<Vma>> {
        match self.method {
            Method::Query => self.query(addr, 0, true),
            Method::Text => {
                let mut found = None;
                self.each_text(|v| {
                    if (v.start..v.end).contains(&addr) {
                        found = Some(v);
                        false
                    } else {
                        true
                    }
                })?;
                Ok(found)
            }
        }
    }

    /// Every file-backed mapping whose name `want` accepts (called with the raw name), in
    /// address order, at most [`MAX_VMAS`] looked at.
    pub fn files(&mut self, mut want: impl FnMut(&[u8]) -> bool) -> std::io::Result<Vec<Vma>> {
        let mut out = Vec::new();
        match self.method {
            Method::Query => {
                let mut addr = 0u64;
                for _ in 0..MAX_VMAS {
                    let Some(v) = self.query(
                        addr,
                        QUERY_COVERING_OR_NEXT_VMA | QUERY_FILE_BACKED_VMA,
                        true,
                    )?
                    else {
                        break;
                    };
                    if v.end <= addr {
                        break;
                    }
                    addr = v.end;
                    if v.is_file() && want(&v.name) {
                        out.push(v);
                    }
                }
            }
            Method::Text => self.each_text(|v| {
                if v.is_file() && want(&v.name) {
                    out.push(v);
                }
                true
            })?,
        }
        Ok(out)
    }

    /// The file-backed mappings whose name, as the text spells it (escapes undone), passes
    /// `pre` (a cheap look that keeps few), each then asked of the kernel (raw path, device,
    /// inode): one ioctl per candidate instead of one per mapping, and only the candidates
    /// held in memory.
    pub fn candidates(&mut self, mut pre: impl FnMut(&[u8]) -> bool) -> std::io::Result<Vec<Vma>> {
        let mut picked = Vec::new();
        self.each_text(|v| {
            if v.is_file() && pre(&v.name) {
                picked.push(v);
            }
            true
        })?;
        if self.method == Method::Text {
            return Ok(picked);
        }
        let mut out = Vec::with_capacity(picked.len());
        for v in picked {
            if let Some(q) = self.query(v.start, 0, true)?
                && q.is_file()
            {
                out.push(q);
            }
        }
        Ok(out)
    }

    /// Walks the text, line by line, bounded; `f` returns false to stop.
    fn each_text(&mut self, mut f: impl FnMut(Vma) -> bool) -> std::io::Result<()> {
        self.file.rewind()?;
        let mut r = BufReader::new((&self.file).take(u64::MAX));
        let mut line = Vec::with_capacity(256);
        for _ in 0..MAX_VMAS {
            line.clear();
            let n = read_line_capped(&mut r, &mut line, MAX_LINE)?;
            if n == 0 {
                break;
            }
            if let Some(v) = parse_line(&line)
                && !f(v)
            {
                break;
            }
        }
        Ok(())
    }
}

/// Reads one line (without its newline) into `buf`, keeping at most `cap` bytes of it; the
/// rest of a longer line is read and dropped. Returns the bytes consumed (0 at the end).
fn read_line_capped(r: &mut impl BufRead, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(consumed);
        }
        let (part, done) = match memchr(b'\n', chunk) {
            Some(i) => (&chunk[..i], i + 1),
            None => (chunk, chunk.len()),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&part[..part.len().min(room)]);
        let ended = done > part.len();
        consumed += done;
        r.consume(done);
        if ended {
            return Ok(consumed);
        }
    }
}

fn memchr(b: u8, s: &[u8]) -> Option<usize> {
    s.iter().position(|&c| c == b)
}

/// One maps line: "start-end perms offset major:minor inode   name". The name starts after
/// the inode and its padding; `\012` (the kernel's only escape) becomes a newline.
pub fn parse_line(line: &[u8]) -> Option<Vma> {
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let start = rest.iter().position(|&c| c != b' ')?;
        let s = &rest[start..];
        let end = s.iter().position(|&c| c == b' ').unwrap_or(s.len());
        rest = &s[end..];
        Some(&s[..end])
    };
    let range = std::str::from_utf8(field()?).ok()?;
    let perms = field()?;
    let offset = u64::from_str_radix(std::str::from_utf8(field()?).ok()?, 16).ok()?;
    let dev = std::str::from_utf8(field()?).ok()?;
    let inode: u64 = std::str::from_utf8(field()?).ok()?.parse().ok()?;
    let (lo, hi) = range.split_once('-')?;
    let (maj, min) = dev.split_once(':')?;
    let name_start = rest.iter().position(|&c| c != b' ').unwrap_or(rest.len());
    Some(Vma {
        start: u64::from_str_radix(lo, 16).ok()?,
        end: u64::from_str_radix(hi, 16).ok()?,
        offset,
        dev_major: u32::from_str_radix(maj, 16).ok()?,
        dev_minor: u32::from_str_radix(min, 16).ok()?,
        inode,
        executable: perms.get(2) == Some(&b'x'),
        name: unescape(&rest[name_start..]),
    })
}

/// Undoes the one escape of maps text: `\012` is a newline.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(b"\\012") {
            out.push(b'\n');
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Why a mapped file was not opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("the mapping has no file")]
    NoFile,
    #[error("its path no longer names a file in the process's root")]
    Missing,
    #[error("its path now names a {0}, not the mapped file")]
    NotRegular(&'static str),
    #[error("its path now names another file than the mapped one (replaced or deleted)")]
    Replaced,
    #[error("not readable by this reader: {0}")]
    Denied(String),
    #[error("{0}")]
    Io(String),
}

/// The kind of a file from its mode, for messages.
fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        _ => "special file",
    }
}

/// `openat2(dir, path, O_PATH | O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: a
/// handle that opens nothing for reading (a FIFO or device is never opened), resolved inside
/// `dir` as if it were `/` (neither `..` nor a symbolic link leaves it).
pub fn path_in_root(dir: &impl AsFd, path: &[u8]) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel: &[u8] = match path.iter().position(|&c| c != b'/') {
        Some(i) => &path[i..],
        None => b".",
    };
    let fd = rustix::fs::openat2(
        dir,
        OsStr::from_bytes(rel),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(File::from(fd))
}

/// Reopens an `O_PATH` handle of a regular file for reading: the kernel checks read
/// permission now, with the caller's credentials.
pub fn reopen_for_reading(handle: &File) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
}

use std::os::unix::fs::OpenOptionsExt as _;

/// A regular file at `path` inside `root`, opened for reading; None-like errors for anything
/// else (a FIFO, a device, a directory), without opening it.
pub fn open_regular_in_root(
    root: &impl AsFd,
    path: &[u8],
) -> Result<(File, libc::stat), OpenError> {
    let handle = path_in_root(root, path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => OpenError::Missing,
        Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Denied(e.to_string()),
        _ => OpenError::Io(e.to_string()),
    })?;
    let st = fstat(&handle)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(OpenError::NotRegular(kind(st.st_mode)));
    }
    let f = reopen_for_reading(&handle).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Denied(e.to_string()),
        _ => OpenError::Io(e.to_string()),
    })?;
    Ok((f, st))
}

fn fstat(f: &File) -> Result<libc::stat, OpenError> {
    // SAFETY: fstat fills one zeroed stat for a descriptor we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(f.as_raw_fd(), &mut st) != 0 {
            return Err(OpenError::Io(std::io::Error::last_os_error().to_string()));
        }
        Ok(st)
    }
}

/// Whether `f` is on overlayfs. Before Linux 6.8 a mapping of an overlay file names the
/// underlying file's device (its inode is the same), so there the inode alone decides.
fn is_overlay(f: &File) -> bool {
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    // SAFETY: fstatfs fills one zeroed statfs for a descriptor we own.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::fstatfs(f.as_raw_fd(), &mut s) == 0 && s.f_type as i64 == OVERLAYFS_SUPER_MAGIC
    }
}

/// Whether `st` is the file a mapping of (major, minor, inode) maps.
pub fn same_file(st: &libc::stat, major: u32, minor: u32, inode: u64) -> bool {
    st.st_ino == inode && libc::major(st.st_dev) == major && libc::minor(st.st_dev) == minor
}

/// Opens the file `vma` maps, from inside the process's root directory `root` (an open
/// handle of `/proc/PID/root`, or `/` for the host): only a regular file that is the mapped
/// one (same device and inode), reopened for reading with the caller's credentials. A name
/// ending in " (deleted)" is also tried without that suffix (a live file may be named so,
/// and a deleted one may have been replaced): the device and inode decide.
///
/// The kernel names a mapping as seen from the reader's root: a chroot'd process's files by
/// their host paths, which its own root does not have. So where the process's root has no
/// such file, the name is tried from the reader's root too; again only the mapped file
/// (same device and inode) is accepted.
pub fn open_mapped(root: &impl AsFd, vma: &Vma) -> Result<File, OpenError> {
    match open_mapped_in(root, vma) {
        Ok(f) => Ok(f),
        Err(first @ (OpenError::Missing | OpenError::Replaced | OpenError::NotRegular(_))) => {
            let Ok(host) = host_root() else {
                return Err(first);
            };
            open_mapped_in(&host, vma).map_err(|_| first)
        }
        Err(e) => Err(e),
    }
}

fn open_mapped_in(root: &impl AsFd, vma: &Vma) -> Result<File, OpenError> {
    if !vma.is_file() {
        return Err(OpenError::NoFile);
    }
    let mut candidates: Vec<&[u8]> = vec![&vma.name];
    if let Some(stripped) = vma.name.strip_suffix(b" (deleted)") {
        candidates.push(stripped);
    }
    let mut last = OpenError::Missing;
    for c in candidates {
        let handle = match path_in_root(root, c) {
            Ok(h) => h,
            Err(e) => {
                last = match e.raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) => OpenError::Missing,
                    Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Denied(e.to_string()),
                    _ => OpenError::Io(e.to_string()),
                };
                continue;
            }
        };
        let st = fstat(&handle)?;
        if !same_file(&st, vma.dev_major, vma.dev_minor, vma.inode)
            && !(st.st_ino == vma.inode && is_overlay(&handle))
        {
            last = if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                OpenError::NotRegular(kind(st.st_mode))
            } else {
                OpenError::Replaced
            };
            continue;
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(OpenError::NotRegular(kind(st.st_mode)));
        }
        return reopen_for_reading(&handle).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Denied(e.to_string()),
            _ => OpenError::Io(e.to_string()),
        });
    }
    Err(last)
}

/// An `O_PATH` handle of a process's root directory (`/proc/PID/root`).
pub fn open_root(pid: u32) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/root"))
}

/// An `O_PATH` handle of `/`.
pub fn host_root() -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_ioctl_request_number_is_the_kernels() {
        assert_eq!(size_of::<ProcmapQuery>(), 104);
        assert_eq!(PROCMAP_QUERY, 0xC068_6611);
    }

    #[test]
    fn text_lines_parse_with_spaces_and_escaped_newlines_in_names() {
        let v = parse_line(b"7f00-7f10 r-xp 00001000 fd:01 1234   /opt/a b\\012c/libcuda.so.1")
            .unwrap();
        assert_eq!(
            (v.start, v.end, v.offset, v.inode),
            (0x7f00, 0x7f10, 0x1000, 1234)
        );
        assert_eq!((v.dev_major, v.dev_minor), (0xfd, 1));
        assert_eq!(v.name, b"/opt/a b\nc/libcuda.so.1");
        assert!(v.executable && v.is_file());
        let anon = parse_line(b"7a00-7b00 rw-p 00000000 00:00 0 ").unwrap();
        assert!(anon.name.is_empty() && !anon.is_file());
        let vdso = parse_line(b"7ff0-7ff2 r-xp 00000000 00:00 0      [vdso]").unwrap();
        assert_eq!(vdso.name, b"[vdso]");
        assert!(parse_line(b"garbage").is_none());
        assert!(parse_line(b"").is_none());
    }

    #[test]
    fn long_lines_are_cut_not_buffered_whole() {
        let mut text = b"1-2 r--p 0 00:00 0 /".to_vec();
        text.extend(std::iter::repeat_n(b'a', MAX_LINE * 3));
        text.extend_from_slice(b"\n3-4 r--p 0 00:00 0 /b\n");
        let mut r = BufReader::new(&text[..]);
        let mut line = Vec::new();
        read_line_capped(&mut r, &mut line, MAX_LINE).unwrap();
        assert_eq!(line.len(), MAX_LINE);
        line.clear();
        read_line_capped(&mut r, &mut line, MAX_LINE).unwrap();
        assert_eq!(parse_line(&line).unwrap().name, b"/b");
    }

    /// Not a runtime's name: the other tests of this process (`reads_own_maps`) run at the
    /// same time and find no GPU runtime mapped.
    const MAPPED_NAME: &str = "libethand-procmaps-test.so.1";

    /// This process maps a file whose name has a space and a newline; a FIFO sits where the
    /// escaped text would point. The query gives the raw name, the file opens, and a FIFO
    /// never blocks the opener.
    fn mapped_file_with_hostile_name(method: Method) {
        let dir = std::env::temp_dir().join(format!(
            "ethand-procmaps-{}-{:?}",
            std::process::id(),
            method
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a b\nc")).unwrap();
        std::fs::create_dir_all(dir.join("a b\\012c")).unwrap();
        let real = dir.join(format!("a b\nc/{MAPPED_NAME}"));
        std::fs::write(&real, vec![7u8; 8192]).unwrap();
        // Where a reader that does not undo the escape would look: a FIFO.
        let fifo = dir.join(format!("a b\\012c/{MAPPED_NAME}"));
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let f = File::open(&real).unwrap();
        // SAFETY: a read-only private mapping of our own file, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let mut maps = ProcMaps::open(std::process::id()).unwrap();
        if method == Method::Text {
            maps.force_text();
        }
        let v = maps.at(addr as u64 + 100).unwrap().expect("mapping");
        assert_eq!(v.name, real.as_os_str().as_bytes());
        assert_eq!(v.inode, std::fs::metadata(&real).unwrap().ino());
        assert_eq!(v.file_offset(addr as u64 + 100), 100);
        let found = maps.files(|n| n.ends_with(MAPPED_NAME.as_bytes())).unwrap();
        assert!(
            found.iter().any(|x| x.name == real.as_os_str().as_bytes()),
            "{found:?}"
        );
        let root = host_root().unwrap();
        let mut opened = open_mapped(&root, &v).expect("opens the mapped file");
        let mut b = [0u8; 4];
        opened.read_exact(&mut b).unwrap();
        assert_eq!(b, [7; 4]);
        // The same mapping described with the FIFO's name: refused without blocking.
        let mut at_fifo = v.clone();
        at_fifo.name = fifo.as_os_str().as_bytes().to_vec();
        assert_eq!(
            open_mapped(&root, &at_fifo).unwrap_err(),
            OpenError::NotRegular("FIFO")
        );
        // Replaced on disk: another file at the path is not the mapped one.
        std::fs::remove_file(&real).unwrap();
        std::fs::write(&real, b"other").unwrap();
        assert_eq!(open_mapped(&root, &v).unwrap_err(), OpenError::Replaced);
        // SAFETY: unmaps what we mapped.
        unsafe { libc::munmap(addr, 8192) };
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn query_gives_raw_names_and_opening_checks_the_inode() {
        let maps = ProcMaps::open(std::process::id()).unwrap();
        if maps.method() != Method::Query {
            eprintln!("skipped: this kernel has no PROCMAP_QUERY (before 6.11)");
            return;
        }
        mapped_file_with_hostile_name(Method::Query);
    }

    #[test]
    fn the_text_fallback_decodes_the_escape_and_checks_the_inode() {
        mapped_file_with_hostile_name(Method::Text);
    }

    #[test]
    fn a_path_cannot_leave_the_root() {
        let dir = std::env::temp_dir().join(format!("ethand-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("r")).unwrap();
        std::fs::write(dir.join("outside"), b"secret").unwrap();
        std::os::unix::fs::symlink("/../outside", dir.join("r/link")).unwrap();
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir.join("r"))
            .unwrap();
        assert_eq!(
            open_regular_in_root(&root, b"/../outside").unwrap_err(),
            OpenError::Missing
        );
        assert_eq!(
            open_regular_in_root(&root, b"/link").unwrap_err(),
            OpenError::Missing
        );
        std::fs::write(dir.join("r/in"), b"ok").unwrap();
        assert!(open_regular_in_root(&root, b"in").is_ok());
        assert_eq!(
            open_regular_in_root(&root, b"/").unwrap_err(),
            OpenError::NotRegular("directory")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
