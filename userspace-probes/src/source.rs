//! One line of a source file a process names (a Python script in its frames, a C file in the
//! DWARF of its binary), read for a person to see. The path is the process's to choose and the
//! daemon reads with privileges the process lacks (CAP_DAC_READ_SEARCH): it is resolved inside
//! the process's root (`openat2` with `RESOLVE_IN_ROOT`, so neither `..` nor a symbolic link
//! leaves it; relative paths from its working directory), and only a regular file that the
//! process's user owns or that everyone may read is read, at most [`MAX_SOURCE_FILE`] bytes.
use std::{
    ffi::CString,
    io::{BufRead, BufReader},
    os::fd::{FromRawFd, OwnedFd},
};

/// Longest source line kept (characters).
pub const MAX_SOURCE: usize = 200;
/// Largest source file read for a line (bytes).
pub const MAX_SOURCE_FILE: u64 = 16 << 20;

/// Line `line` (1-based) of `file` as process `pid` (whose user is `proc_uid`) sees it,
/// trimmed and cut to [`MAX_SOURCE`] characters; None when it cannot or may not be read.
pub fn line(pid: u32, proc_uid: u32, file: &str, line: u32) -> Option<String> {
    if line == 0 || file.contains('\0') {
        return None;
    }
    let (base, rel) = match file.strip_prefix('/') {
        Some(r) => (format!("/proc/{pid}/root"), r),
        None => (format!("/proc/{pid}/cwd"), file),
    };
    let dir = std::fs::File::open(&base).ok()?;
    let f = open_in_root(&dir, rel)?;
    let md = f.metadata().ok()?;
    use std::os::unix::fs::MetadataExt;
    if !md.is_file()
        || md.len() > MAX_SOURCE_FILE
        || !(md.uid() == proc_uid || md.mode() & 0o004 != 0)
    {
        return None;
    }
    let text = BufReader::new(f).lines().nth(line as usize - 1)?.ok()?;
    let t = text.trim();
    (!t.is_empty()).then(|| t.chars().take(MAX_SOURCE).collect())
}

/// The user a process runs as (the owner of /proc/PID).
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// `openat2(dir, rel, O_RDONLY|O_NOCTTY|O_NONBLOCK, RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS)`.
fn open_in_root(dir: &std::fs::File, rel: &str) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_IN_ROOT: u64 = 0x10;
    let path = CString::new(rel).ok()?;
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 reads `path` and `how` (sized as passed) and returns a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor openat2 just returned, owned by nobody else.
    Some(std::fs::File::from(unsafe {
        OwnedFd::from_raw_fd(fd as i32)
    }))
}
