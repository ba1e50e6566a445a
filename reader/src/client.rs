//! The daemon's side: starts the supervisor, opens sessions (one worker each, as the owner of
//! the process asked about) and asks them with deadlines. Nothing here waits longer than a
//! request's deadline plus a small margin: a worker that is late is abandoned (the kernel
//! ends it at its own deadline) and what it was asked for says why. A file a worker was
//! parsing when it died is remembered by its identity (device, inode, size, mtime) and not
//! parsed again; the request is retried without it.
use std::{
    collections::HashMap,
    os::unix::net::UnixStream,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ethand_snapshot::stacks::Frame;
use ethand_userspace_probes::{MappedLibrary, catalog::CatalogSymbols};

use crate::{
    proto::{
        self, ControlReply, FileId, MAX_CODES, OpenSession, Owner, PyCode, PyRuntime, Reply,
        Request, SymStack, ThreadStack, WireError,
    },
    supervisor::Args,
};

/// Time a worker's answer may take beyond its deadline (its own clock and the transfer).
const MARGIN: Duration = Duration::from_millis(300);
/// Time the supervisor has to fork a worker.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Files remembered as having made a worker fail.
const MAX_BLAMED: usize = 4096;
/// Retries of one symbolization after a worker died on a file.
const RETRIES: usize = 3;

/// Why the reader gave no answer. What the supervisor and the workers say crosses the
/// boundary as text (`ControlReply::Refused`, `Reply::Error`: their `Refusal` and
/// `WorkerError` written out); the rest is this side's own view of the exchange.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    /// The supervisor's `ControlReply::Refused`: busy, or the process is gone or unreadable.
    #[error("the reader refused: {0}")]
    Refused(String),
    #[error("the reader did not answer within {0:?}")]
    TimedOut(Duration),
    /// The worker's session ended mid-request: "parsing FILE (how)" or "reading (how)".
    #[error("the reader ended while {0}")]
    Died(String),
    /// The worker's `Reply::Error` (the request failed, the worker serves on), or an answer
    /// of the wrong kind.
    #[error("{0}")]
    Failed(String),
    #[error("the reader is not running: the supervisor exited ({0})")]
    SupervisorExited(std::process::ExitStatus),
    /// The control socket failed (the supervisor is killed: the stream may be out of step).
    #[error("the reader is not running: {0}")]
    Control(#[source] WireError),
    #[error("this session ended earlier")]
    Broken,
}

/// Counters for `ethand status`.
#[derive(Debug, Default)]
pub struct Stats {
    pub sessions: AtomicU64,
    pub refused: AtomicU64,
    pub timeouts: AtomicU64,
    pub died: AtomicU64,
}

struct Control {
    stream: UnixStream,
    child: Child,
}

/// A running supervisor.
pub struct Reader {
    control: Mutex<Control>,
    blamed: Arc<Mutex<HashMap<FileId, String>>>,
    pub stats: Arc<Stats>,
    pid: u32,
}

impl Reader {
    /// Starts the supervisor: `command` is the binary and hidden subcommand that runs
    /// [`crate::supervisor::main`]; `args` its identity and limits.
    pub fn spawn(mut command: Command, args: &Args) -> std::io::Result<Self> {
        let (mine, theirs) = UnixStream::pair()?;
        let child = command
            .args(args.to_args())
            .env_clear()
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let pid = child.id();
        Ok(Self {
            control: Mutex::new(Control {
                stream: mine,
                child,
            }),
            blamed: Arc::default(),
            stats: Arc::default(),
            pid,
        })
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A worker as the owner of `pid` (which must still be the process that started at
    /// `start_ticks`, when given).
    pub fn session(&self, pid: u32, start_ticks: Option<u64>) -> Result<Session, ReaderError> {
        let mut c = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(Some(status)) = c.child.try_wait() {
            return Err(ReaderError::SupervisorExited(status));
        }
        let deadline = Instant::now() + OPEN_TIMEOUT;
        let sent = proto::send(
            &mut c.stream,
            &OpenSession { pid, start_ticks },
            Some(deadline),
        );
        let got =
            sent.and_then(|()| proto::recv_with_fd::<ControlReply>(&mut c.stream, Some(deadline)));
        match got {
            Ok((
                ControlReply::Opened {
                    worker_pid,
                    owner,
                    as_owner,
                },
                Some(fd),
            )) => {
                self.stats.sessions.fetch_add(1, Ordering::Relaxed);
                Ok(Session {
                    stream: UnixStream::from(fd),
                    owner,
                    as_owner,
                    worker_pid,
                    broken: false,
                    blamed: self.blamed.clone(),
                    stats: self.stats.clone(),
                })
            }
            Ok((ControlReply::Opened { .. }, None)) => {
                Err(ReaderError::Failed("the supervisor sent no session".into()))
            }
            Ok((ControlReply::Refused(why), _)) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                Err(ReaderError::Refused(why))
            }
            Err(e) => {
                // The control stream may be out of step now: the supervisor is of no more use.
                let _ = c.child.kill();
                Err(ReaderError::Control(e))
            }
        }
    }

    /// Files that made a worker fail, and how (for status and tests).
    pub fn blamed(&self) -> Vec<(FileId, String)> {
        let b = self.blamed.lock().unwrap_or_else(|e| e.into_inner());
        b.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// The catalog's symbols in a runtime library file (see [`Session::elf_symbols`]), read
    /// as the owner of the process it was found in (the daemon's user for a host file).
    pub fn elf_symbols(
        &self,
        lib: &MappedLibrary,
        deadline: Duration,
    ) -> Result<(FileId, CatalogSymbols, usize), ReaderError> {
        let pid = if lib.pid == 0 {
            std::process::id()
        } else {
            lib.pid
        };
        self.session(pid, None)?.elf_symbols(lib, deadline)
    }

    /// Frames of `stacks` of process `pid` (see [`Request::Symbolize`]), retried without a
    /// file that made a worker die; frames that could not be symbolized keep their module and
    /// offset where known and say why (`Frame::unresolved`).
    pub fn symbolize(
        &self,
        pid: u32,
        start_ticks: Option<u64>,
        stacks: &[Vec<u64>],
        opts: SymbolizeOptions,
    ) -> Symbolized {
        let mut notes = Vec::new();
        for _ in 0..=RETRIES {
            let mut session = match self.session(pid, start_ticks) {
                Ok(s) => s,
                Err(e) => {
                    notes.push(e.to_string());
                    break;
                }
            };
            match session.symbolize(pid, start_ticks, stacks, opts) {
                Ok((stacks, mut n)) => {
                    notes.append(&mut n);
                    return Symbolized { stacks, notes };
                }
                // Retry: the next worker skips the file this one died on.
                Err(e @ ReaderError::Died(_)) => notes.push(e.to_string()),
                Err(e) => {
                    notes.push(e.to_string());
                    let why = match e {
                        ReaderError::TimedOut(_) => TIMED_OUT,
                        _ => FAILED,
                    };
                    return Symbolized {
                        stacks: unresolved(stacks, why),
                        notes,
                    };
                }
            }
        }
        Symbolized {
            stacks: unresolved(stacks, FAILED),
            notes,
        }
    }
}

/// `Frame::unresolved` of a frame whose whole request timed out or failed: worth asking
/// again later, unlike a file that cannot be read.
pub const TIMED_OUT: &str = "symbolization timed out";
pub const FAILED: &str = "symbolization failed";
pub const NO_READER: &str = "no reader";

/// Whether a stack's frames were left unresolved by a failed request (not by their files).
pub fn is_transient(stack: &SymStack) -> bool {
    stack.frames.iter().any(|f| {
        matches!(
            f.unresolved.as_deref(),
            Some(TIMED_OUT | FAILED | NO_READER)
        )
    })
}

impl Drop for Reader {
    fn drop(&mut self) {
        let c = self.control.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = c.child.kill();
        let _ = c.child.wait();
    }
}

/// Stacks as raw addresses, each frame saying why it has no name.
pub fn unresolved(stacks: &[Vec<u64>], why: &str) -> Vec<SymStack> {
    stacks
        .iter()
        .map(|ips| SymStack {
            frames: ips
                .iter()
                .enumerate()
                .map(|(i, ip)| Frame {
                    offset: Some(*ip),
                    unresolved: (i == 0 || *ip != 0).then(|| why.to_string()),
                    ..Frame::default()
                })
                .collect(),
            source: None,
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
pub struct SymbolizeOptions {
    pub code_info: bool,
    pub source_lines: bool,
    /// Source lines leave out the first frame's file (the probed runtime library).
    pub source_skip_first_module: bool,
    pub deadline: Duration,
}

/// What [`Reader::symbolize`] gives: one stack per stack asked, and what went wrong.
#[derive(Debug, Default)]
pub struct Symbolized {
    pub stacks: Vec<SymStack>,
    pub notes: Vec<String>,
}

/// One worker, as one owner.
pub struct Session {
    stream: UnixStream,
    pub owner: Owner,
    /// The worker took the owner's credentials.
    pub as_owner: bool,
    pub worker_pid: u32,
    broken: bool,
    blamed: Arc<Mutex<HashMap<FileId, String>>>,
    stats: Arc<Stats>,
}

impl Session {
    /// Whether this session can still be asked.
    pub fn alive(&self) -> bool {
        !self.broken
    }

    fn call(&mut self, req: &Request, deadline: Duration) -> Result<Reply, ReaderError> {
        if self.broken {
            return Err(ReaderError::Broken);
        }
        let until = Instant::now() + deadline + MARGIN;
        let mut parsing: Option<(FileId, String)> = None;
        let r = proto::send(&mut self.stream, req, Some(until)).and_then(|()| {
            loop {
                match proto::recv::<Reply>(&mut self.stream, Some(until)) {
                    Ok(Reply::Parsing { file, name }) => parsing = Some((file, name)),
                    other => break other,
                }
            }
        });
        match r {
            Ok(Reply::Error(e)) => Err(ReaderError::Failed(e)),
            Ok(reply) => Ok(reply),
            Err(e) => {
                self.broken = true;
                let timed_out = matches!(e, WireError::TimedOut(_));
                if timed_out {
                    self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.stats.died.fetch_add(1, Ordering::Relaxed);
                }
                let how = if timed_out {
                    format!("past its deadline of {deadline:?}")
                } else {
                    "killed by its memory or CPU limit, or a fault".to_string()
                };
                match parsing {
                    Some((file, name)) => {
                        let mut b = self.blamed.lock().unwrap_or_else(|e| e.into_inner());
                        if b.len() < MAX_BLAMED {
                            b.insert(file, how.clone());
                        }
                        Err(ReaderError::Died(format!("parsing {name} ({how})")))
                    }
                    None if timed_out => Err(ReaderError::TimedOut(deadline)),
                    None => Err(ReaderError::Died(format!("reading ({how})"))),
                }
            }
        }
    }

    /// See [`Request::Symbolize`]; files blamed earlier are skipped.
    pub fn symbolize(
        &mut self,
        pid: u32,
        start_ticks: Option<u64>,
        stacks: &[Vec<u64>],
        opts: SymbolizeOptions,
    ) -> Result<(Vec<SymStack>, Vec<String>), ReaderError> {
        let skip: Vec<FileId> = self
            .blamed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        let req = Request::Symbolize {
            pid,
            start_ticks,
            stacks: stacks.to_vec(),
            code_info: opts.code_info,
            source_lines: opts.source_lines,
            source_skip_first_module: opts.source_skip_first_module,
            skip,
            deadline_ms: opts.deadline.as_millis() as u64,
        };
        match self.call(&req, opts.deadline)? {
            Reply::Symbolized { stacks: got, notes } if got.len() == stacks.len() => {
                Ok((got, notes))
            }
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// Lines of Python source files as `pid` names them, read as its owner.
    pub fn source_lines(
        &mut self,
        pid: u32,
        start_ticks: Option<u64>,
        lines: &[(String, u32)],
        deadline: Duration,
    ) -> Result<Vec<Option<String>>, ReaderError> {
        let req = Request::SourceLines {
            pid,
            start_ticks,
            lines: lines.to_vec(),
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::Lines(v) if v.len() == lines.len() => Ok(v),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// Starts reading `pid`'s Python interpreter; its version.
    pub fn python_open(
        &mut self,
        pid: u32,
        start_ticks: Option<u64>,
        deadline: Duration,
    ) -> Result<String, ReaderError> {
        let req = Request::PythonOpen {
            pid,
            start_ticks,
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::PythonOpened { version } => Ok(version),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// What the in-kernel CPython walk needs of `pid`'s interpreter: its minor version and
    /// its gilstate TSS key (read anew each time: ask again after an exec).
    pub fn python_runtime(
        &mut self,
        pid: u32,
        start_ticks: Option<u64>,
        deadline: Duration,
    ) -> Result<PyRuntime, ReaderError> {
        let req = Request::PythonRuntime {
            pid,
            start_ticks,
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::PythonRuntime(r) => Ok(r),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// The code objects at `codes` in `pid` (a CPython 3.`minor`), one answer each in
    /// order: the code object, or why it could not be read (freed, not a code object, a
    /// fault, or "ask again" past what one reply carries). At most [`MAX_CODES`].
    pub fn python_code(
        &mut self,
        pid: u32,
        start_ticks: Option<u64>,
        minor: u32,
        codes: &[u64],
        deadline: Duration,
    ) -> Result<Vec<Result<PyCode, String>>, ReaderError> {
        if codes.len() > MAX_CODES {
            return Err(ReaderError::Failed(format!(
                "{} code objects asked at once; at most {MAX_CODES}",
                codes.len()
            )));
        }
        let req = Request::PythonCode {
            pid,
            start_ticks,
            minor,
            codes: codes.to_vec(),
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::PythonCode(v) if v.len() == codes.len() => Ok(v),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// The catalog's symbols of `runtime` in the library file `lib` (see
    /// [`Request::ElfSymbols`]): (the file read, the symbols, its defined functions).
    pub fn elf_symbols(
        &mut self,
        lib: &MappedLibrary,
        deadline: Duration,
    ) -> Result<(FileId, CatalogSymbols, usize), ReaderError> {
        use std::os::unix::ffi::OsStrExt;
        let req = Request::ElfSymbols {
            pid: lib.pid,
            path: lib.path.as_os_str().as_bytes().to_vec(),
            dev_major: lib.dev_major,
            dev_minor: lib.dev_minor,
            inode: lib.inode,
            runtime: lib.runtime,
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::ElfSymbols {
                file,
                symbols,
                functions,
            } => Ok((file, symbols, functions)),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// See [`Request::Demangle`]: one answer per name, in order.
    pub fn demangle(
        &mut self,
        pid: u32,
        names: &[String],
        deadline: Duration,
    ) -> Result<Vec<Option<String>>, ReaderError> {
        let names = &names[..names.len().min(crate::demangle::MAX_NAMES)];
        let req = Request::Demangle {
            pid,
            names: names.to_vec(),
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::Demangled(v) if v.len() == names.len() => Ok(v),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }

    /// Every Python thread's stack of `pid` (opened before) now.
    pub fn python_stacks(
        &mut self,
        pid: u32,
        deadline: Duration,
    ) -> Result<Vec<ThreadStack>, ReaderError> {
        let req = Request::PythonStacks {
            pid,
            deadline_ms: deadline.as_millis() as u64,
        };
        match self.call(&req, deadline)? {
            Reply::PythonStacks(v) => Ok(v),
            other => Err(ReaderError::Failed(format!("unexpected answer {other:?}"))),
        }
    }
}
