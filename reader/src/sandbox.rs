//! The box a worker parses hostile bytes in. Each worker is a forked process that, before it
//! reads a byte of a request:
//! - dies with its supervisor (PR_SET_PDEATHSIG) and keeps no descriptor but its session;
//! - is bounded: RLIMIT_DATA (heap and private writable memory; file mappings such as a
//!   large ELF file are not counted), RLIMIT_CPU, RLIMIT_NOFILE, no file writes
//!   (RLIMIT_FSIZE 0), no core dumps; the kernel's OOM killer takes it first
//!   (oom_score_adj 1000), never the daemon;
//! - takes the credentials of the process's owner (filesystem uid and gid, supplementary
//!   groups) and keeps CAP_SYS_PTRACE alone (reading another process's memory and /proc
//!   entries): no CAP_DAC_READ_SEARCH or CAP_DAC_OVERRIDE, so every file it opens is one the
//!   owner may read;
//! - cannot be inspected by that owner (not dumpable; it holds a capability the owner lacks),
//!   gains nothing by exec (no_new_privs);
//! - runs under a seccomp filter that allows reading files and process memory, mapping
//!   memory and answering on its socket (the only descriptor it may write to, with standard
//!   error); anything else (exec, sockets, ptrace, writing memory, fork, ...) fails with
//!   EPERM;
//! - and is killed by the kernel (SIGALRM) when a request outlasts its deadline.
use std::collections::BTreeMap;

use rustix::{
    process::{Resource, Rlimit},
    thread::CapabilitySet,
};

use crate::{
    creds::{SyscallError, call},
    proto::Owner,
};

/// Why a worker could not enter its box (it then answers this, and exits).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Call(#[from] SyscallError),
    #[error("setrlimit {resource:?}: {source}")]
    Rlimit {
        resource: Resource,
        source: rustix::io::Errno,
    },
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
}

/// Why the seccomp filter was not installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: {0}")]
    Arch(#[source] seccompiler::BackendError),
    #[error("seccomp filter: {0}")]
    Filter(#[source] seccompiler::BackendError),
    #[error("seccomp program: {0}")]
    Program(#[source] seccompiler::BackendError),
    #[error("seccomp: {0}")]
    Apply(#[source] seccompiler::Error),
}

/// Bounds of every worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_DATA of a worker (bytes).
    pub memory_max_bytes: u64,
    /// RLIMIT_CPU of a worker over its life (seconds); a session is reopened after it.
    pub cpu_max_seconds: u64,
    /// Workers alive at once; more sessions are refused ("busy").
    pub max_workers: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_max_bytes: 256 << 20,
            cpu_max_seconds: 120,
            max_workers: 4,
        }
    }
}

/// Descriptors a worker may hold at once.
const OPEN_FILES: u64 = 256;

fn rlimit(resource: Resource, cur: u64, max: u64) -> Result<(), SandboxError> {
    rustix::process::setrlimit(
        resource,
        Rlimit {
            current: Some(cur),
            maximum: Some(max),
        },
    )
    .map_err(|source| SandboxError::Rlimit { resource, source })
}

/// What [`enter`] could do.
#[derive(Clone, Copy, Debug)]
pub struct Entered {
    /// The worker took the owner's credentials.
    pub as_owner: bool,
}

/// Puts the calling (single-threaded, freshly forked) process in the box, as `owner`.
pub fn enter(owner: &Owner, limits: &Limits, session_fd: i32) -> Result<Entered, SandboxError> {
    use rustix::thread as t;
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(call("PR_SET_PDEATHSIG"))?;
    // Raising one's own OOM score needs no privilege, but /proc/self of a process that is not
    // dumpable (as the supervisor is not) belongs to root: dumpable for that one write, which
    // comes before RLIMIT_FSIZE (at 0 any write to a file, /proc's included, raises SIGXFSZ).
    // Best effort: /proc may be absent.
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable);
    let _ = std::fs::write("/proc/self/oom_score_adj", b"1000");
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(call("PR_SET_DUMPABLE"))?;
    rlimit(
        Resource::Data,
        limits.memory_max_bytes,
        limits.memory_max_bytes,
    )?;
    rlimit(
        Resource::Cpu,
        limits.cpu_max_seconds,
        limits.cpu_max_seconds.saturating_add(1),
    )?;
    rlimit(Resource::Nofile, OPEN_FILES, OPEN_FILES)?;
    rlimit(Resource::Fsize, 0, 0)?;
    rlimit(Resource::Core, 0, 0)?;
    let caps = t::capabilities(None).map_err(call("capget"))?;
    let can_switch = caps
        .effective
        .contains(CapabilitySet::SETUID | CapabilitySet::SETGID);
    let keep = caps.permitted & CapabilitySet::SYS_PTRACE;
    crate::creds::assume(can_switch.then_some(owner), keep)?;
    // SIGALRM ends the worker when a request outlasts its deadline (its default action).
    // SAFETY: resets one signal's disposition to the default.
    unsafe { libc::signal(libc::SIGALRM, libc::SIG_DFL) };
    install_seccomp(session_fd)?;
    Ok(Entered {
        as_owner: can_switch,
    })
}

/// Arms (Some) or disarms (None) the deadline of the request being served.
pub fn deadline(ms: Option<u64>) {
    let v = ms.unwrap_or(0).max(u64::from(ms.is_some()));
    let it = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: (v / 1000) as libc::time_t,
            tv_usec: ((v % 1000) * 1000) as libc::suseconds_t,
        },
    };
    // SAFETY: setitimer with a valid itimerval and no old value wanted.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
}

/// `PROCMAP_QUERY` (see `ethand_userspace_probes::procmaps`): the one ioctl a worker makes.
const PROCMAP_QUERY: u64 = 0xC068_6611;

/// The system calls a worker may make.
fn allowed(session_fd: i32) -> Vec<(i64, Vec<seccompiler::SeccompRule>)> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let any = |nr: libc::c_long| (nr, Vec::new());
    let mut v: Vec<(i64, Vec<SeccompRule>)> = [
        // Files and process memory.
        libc::SYS_read,
        libc::SYS_pread64,
        libc::SYS_readv,
        libc::SYS_preadv,
        libc::SYS_process_vm_readv,
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_close,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_lseek,
        libc::SYS_readlinkat,
        libc::SYS_getdents64,
        libc::SYS_getcwd,
        libc::SYS_fcntl,
        libc::SYS_dup,
        // Memory.
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_brk,
        // Its session (writes are limited to it and standard error below).
        libc::SYS_recvmsg,
        libc::SYS_recvfrom,
        libc::SYS_poll,
        libc::SYS_ppoll,
        // Time, the deadline, ending.
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_setitimer,
        libc::SYS_getitimer,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_sigaltstack,
        // The runtime's small needs.
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_getrandom,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_getuid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getegid,
        libc::SYS_uname,
    ]
    .into_iter()
    .map(any)
    .collect();
    #[cfg(target_arch = "x86_64")]
    v.extend(
        [
            libc::SYS_open,
            libc::SYS_stat,
            libc::SYS_lstat,
            libc::SYS_readlink,
            libc::SYS_access,
            libc::SYS_arch_prctl,
        ]
        .into_iter()
        .map(any),
    );
    // Writes go to its session and standard error only: a worker holds CAP_SYS_PTRACE, and
    // a descriptor of another process's memory (/proc/PID/mem) must stay unwritable even if
    // the worker were made to open one.
    let fd_is = |fd: u64| {
        SeccompRule::new(vec![
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, fd)
                .expect("condition"),
        ])
        .expect("rule")
    };
    for nr in [libc::SYS_write, libc::SYS_writev] {
        v.push((nr, vec![fd_is(session_fd as u64), fd_is(2)]));
    }
    for nr in [libc::SYS_sendmsg, libc::SYS_sendto] {
        v.push((nr, vec![fd_is(session_fd as u64)]));
    }
    // An abort (a panic, a failed allocation) signals the worker itself, and nobody else.
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u64;
    v.push((
        libc::SYS_tgkill,
        vec![
            SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, me)
                    .expect("condition"),
            ])
            .expect("rule"),
        ],
    ));
    v.push((
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, PROCMAP_QUERY)
                    .expect("condition"),
            ])
            .expect("rule"),
        ],
    ));
    v
}

/// Installs the filter: the calls in [`allowed`] pass, every other fails with EPERM.
pub fn install_seccomp(session_fd: i32) -> Result<(), SeccompError> {
    let arch: seccompiler::TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(SeccompError::Arch)?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        allowed(session_fd).into_iter().collect();
    let filter = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        seccompiler::SeccompAction::Allow,
        arch,
    )
    .map_err(SeccompError::Filter)?;
    let prog: seccompiler::BpfProgram = filter.try_into().map_err(SeccompError::Program)?;
    seccompiler::apply_filter(&prog).map_err(SeccompError::Apply)
}
