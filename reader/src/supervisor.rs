//! The supervisor: a small single-threaded process the daemon starts before it drops its
//! capabilities (`ethand reader`, the same binary). It keeps CAP_SETUID, CAP_SETGID (to give
//! each worker its owner's credentials) and CAP_SYS_PTRACE (which workers keep to read
//! process memory), runs as the daemon's user, and does one thing: on a request naming a
//! process, it forks a worker as that process's owner and hands the daemon the worker's
//! socket. It parses nothing a user controls (only the kernel's /proc status text), and dies
//! with the daemon; workers die with it.
use std::{
    os::{
        fd::{AsFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    time::{Duration, Instant},
};

use rustix::thread::CapabilitySet;

use crate::{
    creds::{SyscallError, call},
    owner::{self, ProcessError},
    proto::{self, ControlReply, OpenSession, Owner, WireError},
    sandbox::Limits,
    worker,
};

/// An argument of `ethand reader` that is not understood.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("bad argument {0:?}")]
    NotKeyValue(String),
    #[error("bad number in {arg:?}")]
    Number {
        arg: String,
        source: std::num::ParseIntError,
    },
    #[error("bad group in {arg:?}")]
    Group {
        arg: String,
        source: std::num::ParseIntError,
    },
    #[error("unknown argument {0:?}")]
    Unknown(String),
}

/// Why the supervisor opens no session: the text the daemon gets in
/// [`ControlReply::Refused`].
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("busy: {0} readers already running (reader.max_workers)")]
    Busy(usize),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("socketpair: {0}")]
    SocketPair(#[source] std::io::Error),
    #[error("fork: {0}")]
    Fork(#[source] std::io::Error),
}

/// How the daemon starts the supervisor: its own binary's hidden subcommand and these
/// arguments; the control socket is its standard input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// Switch to this identity (uid, gid, groups) after start: the daemon's user.
    pub user: Option<(u32, u32, Vec<u32>)>,
    pub limits: Limits,
}

impl Args {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            format!("--memory-max={}", self.limits.memory_max_bytes),
            format!("--cpu-max={}", self.limits.cpu_max_seconds),
            format!("--max-workers={}", self.limits.max_workers),
        ];
        if let Some((uid, gid, groups)) = &self.user {
            v.push(format!("--uid={uid}"));
            v.push(format!("--gid={gid}"));
            let g: Vec<String> = groups.iter().map(u32::to_string).collect();
            v.push(format!("--groups={}", g.join(",")));
        }
        v
    }

    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut a = Self::default();
        let (mut uid, mut gid, mut groups) = (None, None, Vec::new());
        for arg in args {
            let Some((k, v)) = arg.split_once('=') else {
                return Err(ArgsError::NotKeyValue(arg));
            };
            let num = || {
                v.parse::<u64>().map_err(|source| ArgsError::Number {
                    arg: arg.clone(),
                    source,
                })
            };
            match k {
                "--memory-max" => a.limits.memory_max_bytes = num()?,
                "--cpu-max" => a.limits.cpu_max_seconds = num()?,
                "--max-workers" => a.limits.max_workers = num()? as u32,
                "--uid" => uid = Some(num()? as u32),
                "--gid" => gid = Some(num()? as u32),
                "--groups" => {
                    groups = v
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| {
                            s.parse().map_err(|source| ArgsError::Group {
                                arg: arg.clone(),
                                source,
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
                _ => return Err(ArgsError::Unknown(arg)),
            }
        }
        if let (Some(u), Some(g)) = (uid, gid) {
            a.user = Some((u, g, groups));
        }
        Ok(a)
    }
}

/// What the supervisor keeps.
fn kept() -> CapabilitySet {
    CapabilitySet::SETUID | CapabilitySet::SETGID | CapabilitySet::SYS_PTRACE
}

/// Reduces the supervisor to [`kept`] (those of them it holds), as `user` when given.
fn reduce(user: Option<&(u32, u32, Vec<u32>)>) -> Result<(), SyscallError> {
    use rustix::thread as t;
    let caps = t::capabilities(None).map_err(call("capget"))?;
    let keep = caps.permitted & kept();
    if caps.effective.contains(CapabilitySet::SETPCAP) {
        for cap in 0..=63u32 {
            if keep.bits() & (1u64 << cap) == 0 {
                // SAFETY: prctl with integer arguments; EINVAL past the last capability.
                unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let user = user
        .filter(|(uid, _, _)| *uid != euid)
        .map(|(uid, gid, groups)| Owner {
            uid: *uid,
            gid: *gid,
            groups: groups.clone(),
        });
    crate::creds::assume(user.as_ref(), keep)
}

/// The supervisor's main: serves session requests on standard input until it closes.
pub fn main(args: Args) -> u8 {
    // SAFETY: prctl with integer arguments and a NUL-terminated name; getppid.
    unsafe {
        libc::prctl(
            libc::PR_SET_NAME,
            c"ethand-reader".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() == 1 {
            return 1;
        }
    }
    // SAFETY: standard input is the control socket the daemon handed us; owned from here.
    let mut control = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    if let Err(e) = reduce(args.user.as_ref()) {
        eprintln!("ethand reader: {e}");
        return 1;
    }
    let mut workers: Vec<i32> = Vec::new();
    loop {
        reap(&mut workers);
        let mut pfd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        if n <= 0 {
            continue;
        }
        let req: OpenSession =
            match proto::recv(&mut control, Some(Instant::now() + Duration::from_secs(5))) {
                Ok(r) => r,
                Err(WireError::Malformed(e)) => {
                    eprintln!("ethand reader: bad request: {e}");
                    return 2;
                }
                Err(_) => return 0,
            };
        reap(&mut workers);
        let (reply, fd) = match open(&req, &args.limits, &mut workers, &control) {
            Ok((opened, fd)) => (opened, Some(fd)),
            Err(refusal) => (ControlReply::Refused(refusal.to_string()), None),
        };
        let sent = proto::send_with_fd(&mut control, &reply, fd.as_ref().map(|f| f.as_fd()));
        drop(fd);
        if sent.is_err() {
            return 0;
        }
    }
}

/// Collects exited workers.
fn reap(workers: &mut Vec<i32>) {
    workers.retain(|&pid| {
        let mut status = 0;
        // SAFETY: waits for one of our own children without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        r == 0
    });
}

/// Forks a worker for the owner of the process `req` names: the reply to send (`Opened`)
/// and the daemon's end of its session.
fn open(
    req: &OpenSession,
    limits: &Limits,
    workers: &mut Vec<i32>,
    control: &UnixStream,
) -> Result<(ControlReply, OwnedFd), Refusal> {
    if workers.len() >= limits.max_workers as usize {
        return Err(Refusal::Busy(workers.len()));
    }
    let owner = owner::owner_of(req.pid).map_err(|source| ProcessError::Owner {
        pid: req.pid,
        source,
    })?;
    owner::check_start(req.pid, req.start_ticks)?;
    let (mine, theirs) = UnixStream::pair().map_err(Refusal::SocketPair)?;
    let as_owner = rustix::thread::capabilities(None).is_ok_and(|c| {
        c.effective
            .contains(CapabilitySet::SETUID | CapabilitySet::SETGID)
    });
    // SAFETY: the supervisor is single-threaded; the child only closes descriptors, enters
    // its sandbox and serves its socket.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Refusal::Fork(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(mine);
        let session = keep_only(theirs, control);
        worker::run(session, owner, limits);
    }
    drop(theirs);
    workers.push(pid);
    Ok((
        ControlReply::Opened {
            worker_pid: pid as u32,
            owner,
            as_owner,
        },
        OwnedFd::from(mine),
    ))
}

/// In a new worker: closes every descriptor but the session (standard error stays for the
/// rare message); the control socket first.
fn keep_only(session: UnixStream, control: &UnixStream) -> UnixStream {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let c = control.as_raw_fd();
    // SAFETY: closes our copy of the control socket; `control` is never used in this process.
    unsafe { libc::close(c) };
    let s = session.into_raw_fd();
    // Move the session above everything else, then close the rest.
    // SAFETY: fcntl and close_range on descriptors of this process.
    unsafe {
        let high = libc::fcntl(s, libc::F_DUPFD_CLOEXEC, 64);
        let s = if high >= 0 {
            libc::close(s);
            high
        } else {
            s
        };
        libc::close(0);
        libc::close(1);
        libc::syscall(libc::SYS_close_range, 3u32, (s - 1) as u32, 0u32);
        libc::syscall(libc::SYS_close_range, (s + 1) as u32, u32::MAX, 0u32);
        UnixStream::from_raw_fd(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let a = Args {
            user: Some((998, 997, vec![997, 44])),
            limits: Limits {
                memory_max_bytes: 123,
                cpu_max_seconds: 4,
                max_workers: 5,
            },
        };
        assert_eq!(Args::parse(a.to_args()).unwrap(), a);
        assert!(matches!(
            Args::parse(["--nope=1".to_string()]),
            Err(ArgsError::Unknown(_))
        ));
        let bad = Args::parse(["--uid=x".to_string()]).unwrap_err();
        assert!(matches!(bad, ArgsError::Number { .. }));
        assert_eq!(bad.to_string(), r#"bad number in "--uid=x""#);
        assert!(matches!(
            Args::parse(["--groups=1,x".to_string()]),
            Err(ArgsError::Group { .. })
        ));
        assert!(matches!(
            Args::parse(["--uid".to_string()]),
            Err(ArgsError::NotKeyValue(_))
        ));
    }
}
