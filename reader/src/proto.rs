//! What the daemon and the reader say to each other, and how: length-prefixed JSON over Unix
//! stream sockets, every message bounded before anything is allocated for it, every wait
//! bounded by a deadline. Descriptors travel (SCM_RIGHTS) only from the supervisor to the
//! daemon: each new session's socket.
use std::{
    io::{IoSlice, IoSliceMut, Read, Write},
    mem::MaybeUninit,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
        unix::net::UnixStream,
    },
    time::{Duration, Instant},
};

use ethand_snapshot::stacks::Frame;
use ethand_userspace_probes::{Runtime, catalog::CatalogSymbols};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::pyline::LineTable;

/// Largest message either side accepts (bytes of JSON).
pub const MAX_MESSAGE: usize = 16 << 20;
/// Most stacks in one symbolization request, and frames in one stack.
pub const MAX_STACKS: usize = 65_536;
pub const MAX_STACK_FRAMES: usize = 256;
/// Longest name (function, file, module, thread) a reply carries (bytes).
pub const MAX_NAME: usize = 512;
/// Most source lines asked in one request.
pub const MAX_LINES: usize = 4096;
/// Most threads of one Python process in one read.
pub const MAX_THREADS: usize = 4096;
/// Most code objects asked in one `PythonCode` request.
pub const MAX_CODES: usize = 4096;

/// The supervisor's answer to a session request.
#[derive(Debug, Serialize, Deserialize)]
pub enum ControlReply {
    /// The session's socket comes with this message.
    Opened {
        worker_pid: u32,
        owner: Owner,
        /// Whether the worker took the owner's credentials (false: the supervisor lacks
        /// CAP_SETUID/CAP_SETGID, and the worker reads only world-readable files).
        as_owner: bool,
    },
    Refused(String),
}

/// A session request to the supervisor: a worker with the credentials of the owner of this
/// process.
#[derive(Debug, Serialize, Deserialize)]
pub struct OpenSession {
    pub pid: u32,
    /// The process's start time (clock ticks since boot, /proc/PID/stat field 22): a
    /// reused pid is refused.
    pub start_ticks: Option<u64>,
}

/// Whose files and memory a worker reads, and as whom: the filesystem uid and gid of the
/// process and its supplementary groups.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// What identifies a file's contents for caching: never a build id the file itself claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileId {
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

/// One request of a session.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Frames of user stacks of `pid` (innermost first: the first address exact, the others
    /// return addresses). Files in `skip` are not parsed (they made a worker fail before).
    Symbolize {
        pid: u32,
        start_ticks: Option<u64>,
        stacks: Vec<Vec<u64>>,
        /// File and line from DWARF where a file has them.
        code_info: bool,
        /// The source text of each stack's innermost frame with a file and line.
        source_lines: bool,
        /// ... leaving out the first frame and the frames after it in the same file (the
        /// probed runtime library's own frames, when the first is the probed function).
        source_skip_first_module: bool,
        skip: Vec<FileId>,
        deadline_ms: u64,
    },
    /// Lines of source files as `pid` names them (a Python frame's `co_filename`).
    SourceLines {
        pid: u32,
        start_ticks: Option<u64>,
        lines: Vec<(String, u32)>,
        deadline_ms: u64,
    },
    /// Starts reading the Python interpreter of `pid`.
    PythonOpen {
        pid: u32,
        start_ticks: Option<u64>,
        deadline_ms: u64,
    },
    /// Every Python thread's stack of `pid` now.
    PythonStacks { pid: u32, deadline_ms: u64 },
    /// What the in-kernel CPython walk needs of `pid`'s interpreter (`pycode.rs`).
    PythonRuntime {
        pid: u32,
        start_ticks: Option<u64>,
        deadline_ms: u64,
    },
    /// File, function and line table of code objects of `pid` (addresses the walk stored),
    /// read with the layout of CPython 3.`minor`; at most [`MAX_CODES`].
    PythonCode {
        pid: u32,
        start_ticks: Option<u64>,
        minor: u32,
        codes: Vec<u64>,
        deadline_ms: u64,
    },
    /// C++ names `pid` gave (CUDA kernel names CUPTI reported in it), demangled without
    /// their parameters; at most [`crate::demangle::MAX_NAMES`].
    Demangle {
        pid: u32,
        names: Vec<String>,
        deadline_ms: u64,
    },
    /// The catalog's symbols of `runtime` in the library file a process maps (its raw path
    /// inside the root of `pid`, or of the host with pid 0; only the file with that device
    /// and inode), for uprobes.
    ElfSymbols {
        pid: u32,
        path: Vec<u8>,
        dev_major: u32,
        dev_minor: u32,
        inode: u64,
        runtime: Runtime,
        deadline_ms: u64,
    },
}

/// A worker's answer. `Parsing` may come any number of times before the final answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// About to parse this file: if the worker dies now, this file is why.
    Parsing {
        file: FileId,
        name: String,
    },
    Symbolized {
        stacks: Vec<SymStack>,
        /// One line per file that could not be read or parsed, and why.
        notes: Vec<String>,
    },
    Lines(Vec<Option<String>>),
    /// One per name asked, in order: None for a name that is not mangled or not valid.
    Demangled(Vec<Option<String>>),
    PythonOpened {
        version: String,
    },
    PythonStacks(Vec<ThreadStack>),
    PythonRuntime(PyRuntime),
    /// One per code object asked, in the same order: the code object or why not.
    PythonCode(Vec<Result<PyCode, String>>),
    ElfSymbols {
        /// The file that was read.
        file: FileId,
        symbols: CatalogSymbols,
        /// Defined function symbols in the file.
        functions: usize,
    },
    Error(String),
}

/// One symbolized stack.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SymStack {
    pub frames: Vec<Frame>,
    /// The source text of the innermost frame with a file and line, read as the owner.
    pub source: Option<String>,
}

/// One Python thread's stack at one moment.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ThreadStack {
    /// The OS thread id; None where the interpreter does not say.
    pub tid: Option<u32>,
    pub name: Option<String>,
    /// Running or runnable (the OS thread state and py-spy's idle heuristics).
    pub active: bool,
    pub owns_gil: bool,
    /// Innermost first, at most `ethand_snapshot::stacks::MAX_FRAMES`.
    pub frames: Vec<Frame>,
}

/// A CPython interpreter as the in-kernel walk needs it: its minor version (the layout,
/// `ethand_common::py_layout`) and its gilstate TSS key (`autoTSSkey`), whose glibc
/// thread-specific slot holds each thread's own `PyThreadState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PyRuntime {
    pub minor: u32,
    pub tss_key: u32,
}

/// A code object of a live process: where it is and what it is called (names cut to
/// [`MAX_NAME`]), and its line table (see [`PyCode::line`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PyCode {
    /// `co_filename`.
    pub file: String,
    /// `co_qualname` (3.11+, `K.method`), else `co_name`.
    pub function: String,
    /// `co_firstlineno`.
    pub first_line: u32,
    /// `co_lnotab` (3.9) or `co_linetable`, as the process holds it.
    pub line_table: Vec<u8>,
}

impl PyCode {
    /// The line of position `pos` of a frame in this code object (its unit per version:
    /// `pyline`'s module doc), read as CPython 3.`minor` does; None where it has none.
    pub fn line(&self, minor: u32, pos: u32) -> Option<u32> {
        LineTable::of_version(minor)?.line(&self.line_table, self.first_line, pos)
    }
}

/// Why a message could not be exchanged.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the other side closed the connection")]
    Closed,
    #[error("message of {0} bytes is over the limit of {MAX_MESSAGE}")]
    TooLarge(usize),
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Cuts a string to at most `max` bytes on a character boundary.
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Waits until `fd` is readable (or writable) or `deadline` passes.
fn wait(fd: BorrowedFd<'_>, write: bool, deadline: Option<Instant>) -> Result<(), WireError> {
    let Some(deadline) = deadline else {
        return Ok(());
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WireError::TimedOut(Duration::ZERO));
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: if write { libc::POLLOUT } else { libc::POLLIN },
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(());
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
    }
}

fn read_exact(
    s: &mut UnixStream,
    mut buf: &mut [u8],
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    while !buf.is_empty() {
        wait(s.as_fd(), false, deadline)?;
        match s.read(buf) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(WireError::Closed);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_all(
    s: &mut UnixStream,
    mut buf: &[u8],
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    while !buf.is_empty() {
        wait(s.as_fd(), true, deadline)?;
        match s.write(buf) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Err(WireError::Closed),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends one message: its length (u32, little-endian), then its JSON.
pub fn send<T: Serialize>(
    s: &mut UnixStream,
    msg: &T,
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    let body = serde_json::to_vec(msg).map_err(|e| WireError::Malformed(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(WireError::TooLarge(body.len()));
    }
    let mut framed = Vec::with_capacity(4 + body.len());
    framed.extend_from_slice(&(body.len() as u32).to_le_bytes());
    framed.extend_from_slice(&body);
    write_all(s, &framed, deadline)
}

/// Receives one message, refusing one over [`MAX_MESSAGE`] before reading it.
pub fn recv<T: DeserializeOwned>(
    s: &mut UnixStream,
    deadline: Option<Instant>,
) -> Result<T, WireError> {
    let mut len = [0u8; 4];
    read_exact(s, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    read_exact(s, &mut body, deadline)?;
    serde_json::from_slice(&body).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Sends one message with a descriptor attached to its first byte.
pub fn send_with_fd<T: Serialize>(
    s: &mut UnixStream,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), WireError> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let body = serde_json::to_vec(msg).map_err(|e| WireError::Malformed(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(WireError::TooLarge(body.len()));
    }
    let len = (body.len() as u32).to_le_bytes();
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    // The length and the descriptor first, in one call; the body after.
    let n = loop {
        match sendmsg(
            &*s,
            &[IoSlice::new(&len)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    write_all(s, &len[n..], None)?;
    write_all(s, &body, None)
}

/// Receives one message and the descriptor that came with it, if any.
pub fn recv_with_fd<T: DeserializeOwned>(
    s: &mut UnixStream,
    deadline: Option<Instant>,
) -> Result<(T, Option<OwnedFd>), WireError> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let mut len = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    wait(s.as_fd(), false, deadline)?;
    let got = loop {
        match recvmsg(
            &*s,
            &mut [IoSliceMut::new(&mut len)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    let mut fd = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                // One is expected; any more are closed here.
                if fd.is_none() {
                    fd = Some(f);
                }
            }
        }
    }
    if got == 0 {
        return Err(WireError::Closed);
    }
    read_exact(s, &mut len[got..], deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    read_exact(s, &mut body, deadline)?;
    let msg = serde_json::from_slice(&body).map_err(|e| WireError::Malformed(e.to_string()))?;
    Ok((msg, fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_and_without_descriptors() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send(
            &mut a,
            &OpenSession {
                pid: 7,
                start_ticks: Some(9),
            },
            None,
        )
        .unwrap();
        let m: OpenSession = recv(&mut b, Some(Instant::now() + Duration::from_secs(1))).unwrap();
        assert_eq!((m.pid, m.start_ticks), (7, Some(9)));
        let (x, _y) = UnixStream::pair().unwrap();
        send_with_fd(
            &mut a,
            &ControlReply::Refused("busy".into()),
            Some(x.as_fd()),
        )
        .unwrap();
        let (r, fd): (ControlReply, _) = recv_with_fd(&mut b, None).unwrap();
        assert!(matches!(r, ControlReply::Refused(s) if s == "busy"));
        assert!(fd.is_some());
    }

    #[test]
    fn oversized_and_late_messages_are_refused_before_allocation() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            recv::<Reply>(&mut b, None),
            Err(WireError::TooLarge(_))
        ));
        let (_a, mut b) = UnixStream::pair().unwrap();
        let t0 = Instant::now();
        assert!(matches!(
            recv::<Reply>(&mut b, Some(Instant::now() + Duration::from_millis(50))),
            Err(WireError::TimedOut(_))
        ));
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(_a);
        assert!(matches!(
            recv::<Reply>(&mut b, None),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn names_are_cut_on_a_character_boundary() {
        assert_eq!(cut("é".repeat(300), MAX_NAME).len(), MAX_NAME);
        assert_eq!(cut("ab".into(), 1), "a");
    }
}
