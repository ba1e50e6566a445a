//! Least privilege after start-up (docs/security.md, "Least privilege").
//!
//! Start-up needs more than running does: mounting tracefs, loading programs and creating
//! maps, attaching the kernel probes, handing the API socket to its group. Once that is done
//! the daemon keeps only what later work needs (uprobes on libraries loaded later, `ethand
//! level`, /proc of every process, the sampled BPF statistics) and drops every other
//! capability from the effective, permitted, inheritable, ambient and bounding sets of
//! **every thread**: capabilities are per thread in Linux, and tokio's workers exist before
//! the probes are loaded. Each thread drops its own sets in a signal handler (the way glibc
//! applies setuid to all threads); the result is checked in /proc/self/task/*/status.
//!
//! `stats_helper.rs`: the one process that keeps CAP_SYS_ADMIN, for the sampled BPF
//! statistics.
pub mod stats_helper;

use std::{
    collections::HashSet,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::config::Plan;

pub const CAP_CHOWN: u32 = 0;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SETGID: u32 = 6;
pub const CAP_SETUID: u32 = 7;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Names of every capability (bit = index), as the kernel's capability.h has them.
const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

pub fn cap_name(bit: u32) -> String {
    NAMES
        .get(bit as usize)
        .map_or_else(|| format!("CAP_{bit}"), |n| (*n).to_string())
}

/// The names of the capabilities in `mask`, lowest bit first.
pub fn names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|b| mask & (1u64 << b) != 0)
        .map(cap_name)
        .collect()
}

/// What the running daemon still needs, for this configuration:
/// - CAP_PERFMON: uprobes on runtime libraries loaded after start-up and on `ethand level`
///   (a uprobe perf event needs it; programs and maps exist already, so CAP_BPF does not),
///   and the CPU-clock perf events of a snapshot's CPU profile.
/// - CAP_SYS_PTRACE: /proc/PID/maps, environ, exe and root/ of other users' processes.
/// - CAP_DAC_READ_SEARCH: opening those libraries and paths whatever their modes.
///
/// Never CAP_SYS_ADMIN: with `daemon.bpf_stats = "sampled"` the statistics are switched by a
/// helper process that holds it alone and takes nothing but one byte (`stats_helper.rs`);
/// "always" turns them on once, at start-up.
pub fn runtime_caps(plan: &Plan) -> u64 {
    let mut keep = (1u64 << CAP_SYS_PTRACE) | (1u64 << CAP_DAC_READ_SEARCH);
    if plan.opens_perf_events() {
        keep |= 1u64 << CAP_PERFMON;
    }
    keep
}

/// The user the daemon becomes after start-up (`daemon.user`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Its supplementary groups (the primary one included), as `initgroups` would set them.
    pub groups: Vec<u32>,
}

impl RunAs {
    /// `name` from the user database; None for "" (stay who we are). The error's text is
    /// the message for `daemon.user`.
    pub fn lookup(name: &str) -> Result<Option<Self>, UserLookupError> {
        if name.is_empty() {
            return Ok(None);
        }
        let cname = std::ffi::CString::new(name).map_err(|source| UserLookupError::NotAName {
            name: name.into(),
            source,
        })?;
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: getpwnam_r with a zeroed passwd, our buffer and its length; the fields used
        // are copied out before the buffer goes.
        let (uid, gid) = unsafe {
            let mut pw: libc::passwd = std::mem::zeroed();
            let mut out: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwnam_r(
                cname.as_ptr(),
                &mut pw,
                buf.as_mut_ptr(),
                buf.len(),
                &mut out,
            );
            if rc != 0 || out.is_null() {
                return Err(UserLookupError::NoSuchUser {
                    name: name.into(),
                    // rc is the errno of a failed lookup; 0 with no entry: not there.
                    source: (rc != 0).then(|| std::io::Error::from_raw_os_error(rc)),
                });
            }
            (pw.pw_uid, pw.pw_gid)
        };
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut n = groups.len() as libc::c_int;
        // SAFETY: getgrouplist fills at most n entries of our buffer and sets n.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        groups.truncate(if rc < 0 { 1 } else { n.max(0) as usize });
        if groups.is_empty() {
            groups.push(gid);
        }
        Ok(Some(Self {
            name: name.into(),
            uid,
            gid,
            groups,
        }))
    }

    /// "ethand (uid 998, gid 998)".
    pub fn describe(&self) -> String {
        format!("{} (uid {}, gid {})", self.name, self.uid, self.gid)
    }
}

/// Why `daemon.user` names no user to become.
#[derive(Debug, thiserror::Error)]
pub enum UserLookupError {
    #[error("daemon.user = {name:?} is not a user name")]
    NotAName {
        name: String,
        source: std::ffi::NulError,
    },
    /// Not in the user database, or the lookup failed (`source`: its errno).
    #[error(
        "daemon.user = {name:?}: no such user (create it, e.g. useradd --system --no-create-home --shell /usr/sbin/nologin {name}, or set daemon.user = \"\")"
    )]
    NoSuchUser {
        name: String,
        source: Option<std::io::Error>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("cannot install the capability-drop signal handler: {0}")]
    Handler(std::io::Error),
    #[error("thread {tid} could not drop its capabilities: {source}")]
    Thread { tid: i32, source: std::io::Error },
    #[error("threads did not drop their capabilities within {0:?}")]
    Timeout(Duration),
    #[error("cannot run as {user}: {why}")]
    User { user: String, why: String },
    #[error("after the drop, thread {tid} still has CapEff {eff:x} CapPrm {prm:x} (want {want:x})")]
    Left {
        tid: i32,
        eff: u64,
        prm: u64,
        want: u64,
    },
}

/// What [`drop_to`] did.
#[derive(Debug)]
pub struct Dropped {
    /// The user every thread switched to, if one was asked for and not already in force.
    pub user: Option<String>,
    /// Effective (= permitted) set afterwards.
    pub kept: u64,
    /// Capabilities given up (effective or permitted before).
    pub dropped: u64,
    /// Whether the bounding set was reduced too (needs CAP_SETPCAP at the time).
    pub bounding: bool,
    pub threads: usize,
}

// The target every thread applies in the signal handler (raw syscalls only there).
static KEEP: AtomicU64 = AtomicU64::new(0);
static LAST_CAP: AtomicU32 = AtomicU32::new(40);
static DROP_BOUNDING: AtomicBool = AtomicBool::new(false);
static DONE: AtomicUsize = AtomicUsize::new(0);
static FAILED_TID: AtomicI32 = AtomicI32::new(0);
static FAILED_ERRNO: AtomicI32 = AtomicI32::new(0);
// The identity to switch to (SWITCH_USER set): uid, gid, and the supplementary groups.
static SWITCH_USER: AtomicBool = AtomicBool::new(false);
static TARGET_UID: AtomicU32 = AtomicU32::new(0);
static TARGET_GID: AtomicU32 = AtomicU32::new(0);
static TARGET_GROUPS: Mutex<Vec<libc::gid_t>> = Mutex::new(Vec::new());
// The group list as the handler reads it: filled before any signal is sent, never changed
// while handlers run (a Mutex is not async-signal-safe; a pointer and a length are).
static GROUPS_PTR: AtomicUsize = AtomicUsize::new(0);
static GROUPS_LEN: AtomicUsize = AtomicUsize::new(0);

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// (effective, permitted) of the calling thread.
fn capget() -> std::io::Result<(u64, u64)> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array, as capget(2) wants for version 3.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

/// The calling thread's effective set (0 when it cannot be read).
pub fn effective() -> u64 {
    capget().map_or(0, |(eff, _)| eff)
}

/// Switches the calling thread to the target user and groups, its capabilities untouched
/// (SECBIT_NO_SETUID_FIXUP, locked with NOROOT so that uid 0 means nothing again). Raw
/// syscalls: glibc's wrappers would signal every thread themselves. Async-signal-safe.
fn switch_user_here() -> Result<(), i32> {
    let errno = || {
        // SAFETY: reading this thread's errno.
        unsafe { *libc::__errno_location() }
    };
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED;
    let (uid, gid) = (
        TARGET_UID.load(Ordering::SeqCst),
        TARGET_GID.load(Ordering::SeqCst),
    );
    let (ptr, len) = (
        GROUPS_PTR.load(Ordering::SeqCst),
        GROUPS_LEN.load(Ordering::SeqCst),
    );
    // SAFETY: raw syscalls with integer arguments; the group list outlives every handler.
    unsafe {
        if libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) != 0 {
            return Err(errno());
        }
        if libc::syscall(libc::SYS_setgroups, len, ptr as *const libc::gid_t) != 0 {
            return Err(errno());
        }
        if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
            return Err(errno());
        }
        if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            return Err(errno());
        }
    }
    Ok(())
}

/// Applies the target to the calling thread. Async-signal-safe: raw syscalls and atomics.
fn apply_here() -> Result<(), i32> {
    if SWITCH_USER.load(Ordering::SeqCst) {
        switch_user_here()?;
    }
    let keep = KEEP.load(Ordering::SeqCst);
    if DROP_BOUNDING.load(Ordering::SeqCst) {
        for cap in 0..=LAST_CAP.load(Ordering::SeqCst) {
            // Only what the bounding set still holds: a thread started by an already reduced
            // thread (a CUDA thread of NVML's, seen on a GPU host) inherits the reduced
            // bounding set without CAP_SETPCAP, and dropping again would fail with EPERM.
            // SAFETY: prctl with integer arguments.
            let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
            if keep & (1u64 << cap) == 0 && held == 1 {
                // SAFETY: prctl with integer arguments.
                let rc =
                    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
                // SAFETY: reading this thread's errno.
                if rc != 0 && unsafe { *libc::__errno_location() } != libc::EINVAL {
                    // SAFETY: as above.
                    return Err(unsafe { *libc::__errno_location() });
                }
            }
        }
    }
    if capset_to(keep) != 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(())
}

/// Sets the calling thread's effective and permitted sets to `keep`, inheritable empty (the
/// ambient set, a subset of it, empties with it). capset(2)'s return value; async-signal-safe.
fn capset_to(keep: u64) -> libc::c_long {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: keep as u32,
            permitted: keep as u32,
            inheritable: 0,
        },
        CapData {
            effective: (keep >> 32) as u32,
            permitted: (keep >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: header and a two-element data array, as capset(2) wants for version 3.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) }
}

extern "C" fn on_signal(_sig: libc::c_int) {
    // SAFETY: errno of this thread, saved and restored around the handler.
    let saved = unsafe { *libc::__errno_location() };
    if let Err(errno) = apply_here() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        FAILED_TID.store(tid, Ordering::SeqCst);
        FAILED_ERRNO.store(errno, Ordering::SeqCst);
    }
    DONE.fetch_add(1, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

fn thread_ids() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Real, effective, saved and filesystem uid of one of our threads, from /proc.
fn thread_uids(tid: i32) -> Option<[u32; 4]> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let line = s.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let v: Vec<u32> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    v.try_into().ok()
}

/// CapEff and CapPrm of one of our threads, from /proc.
fn thread_caps(tid: i32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some((field("CapEff:")?, field("CapPrm:")?))
}

/// Reduces every thread of the process to `keep` (effective = permitted = `keep`,
/// inheritable and ambient empty, bounding = `keep` when CAP_SETPCAP allows), switching each
/// to `user` first when one is given and not already in force. Capabilities not held are not
/// gained: the result is `keep` ∩ what the process had.
pub fn drop_to(keep: u64, user: Option<&RunAs>) -> Result<Dropped, PrivilegeError> {
    const LIMIT: Duration = Duration::from_secs(5);
    let (eff, prm) = capget().map_err(PrivilegeError::Handler)?;
    let keep = keep & prm;
    // SAFETY: getresuid-free check: geteuid/getegid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let switch = user.filter(|u| u.uid != euid || u.gid != egid);
    if let Some(u) = switch {
        let need = (1u64 << CAP_SETUID) | (1u64 << CAP_SETGID) | (1u64 << CAP_SETPCAP);
        if eff & need != need {
            return Err(PrivilegeError::User {
                user: u.describe(),
                why: "switching users needs CAP_SETUID, CAP_SETGID and CAP_SETPCAP at start-up (run as root, or start as that user: the systemd unit's User=)".into(),
            });
        }
        let mut groups = TARGET_GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        *groups = u.groups.clone();
        GROUPS_PTR.store(groups.as_ptr() as usize, Ordering::SeqCst);
        GROUPS_LEN.store(groups.len(), Ordering::SeqCst);
        TARGET_UID.store(u.uid, Ordering::SeqCst);
        TARGET_GID.store(u.gid, Ordering::SeqCst);
    }
    SWITCH_USER.store(switch.is_some(), Ordering::SeqCst);
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    KEEP.store(keep, Ordering::SeqCst);
    LAST_CAP.store(last_cap, Ordering::SeqCst);
    let bounding = eff & (1u64 << CAP_SETPCAP) != 0;
    DROP_BOUNDING.store(bounding, Ordering::SeqCst);
    let sig = libc::SIGRTMIN() + 6;
    // SAFETY: a zeroed sigaction with a handler that only makes raw syscalls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(PrivilegeError::Handler(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: getpid / gettid have no preconditions.
    let (pid, me) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    let mut handled: HashSet<i32> = HashSet::from([me]);
    let t0 = Instant::now();
    let mut sent = 0;
    // Threads started meanwhile by a thread not yet reduced are caught by the next round.
    loop {
        let new: Vec<i32> = thread_ids()
            .into_iter()
            .filter(|t| !handled.contains(t))
            .collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            handled.insert(tid);
            // SAFETY: signals one of our own threads.
            if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) } == 0 {
                sent += 1;
            }
        }
        while DONE.load(Ordering::SeqCst) < sent {
            if t0.elapsed() > LIMIT {
                return Err(PrivilegeError::Timeout(LIMIT));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    apply_here().map_err(|e| PrivilegeError::Thread {
        tid: me,
        source: std::io::Error::from_raw_os_error(e),
    })?;
    let failed = FAILED_TID.load(Ordering::SeqCst);
    if failed != 0 {
        return Err(PrivilegeError::Thread {
            tid: failed,
            source: std::io::Error::from_raw_os_error(FAILED_ERRNO.load(Ordering::SeqCst)),
        });
    }
    let threads = thread_ids();
    for &tid in &threads {
        if let Some((e, p)) = thread_caps(tid) {
            if e != keep || p != keep {
                return Err(PrivilegeError::Left {
                    tid,
                    eff: e,
                    prm: p,
                    want: keep,
                });
            }
        }
        if let (Some(u), Some(uids)) = (switch, thread_uids(tid)) {
            if uids != [u.uid; 4] {
                return Err(PrivilegeError::User {
                    user: u.describe(),
                    why: format!("thread {tid} still has uids {uids:?}"),
                });
            }
        }
    }
    Ok(Dropped {
        user: switch.map(RunAs::describe),
        kept: keep,
        dropped: (eff | prm) & !keep,
        bounding,
        threads: threads.len(),
    })
}

/// One line for logs: "CAP_A, CAP_B" or "none".
pub fn list(mask: u64) -> String {
    let n = names(mask);
    if n.is_empty() {
        "none".into()
    } else {
        n.join(", ")
    }
}

/// The gid of group `name`, None when there is no such group.
pub fn group_id(name: &str) -> Option<u32> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getgrnam_r with a zeroed group, our buffer and its length.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        );
        (rc == 0 && !out.is_null()).then_some(grp.gr_gid)
    }
}

/// Who this process runs as, for `ethand status`: "ethand (uid 998, gid 998)", or
/// "root (uid 0, ...)".
pub fn current_user() -> String {
    // SAFETY: geteuid/getegid have no preconditions; getpwuid_r with our buffer.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let name = unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (rc == 0 && !out.is_null()).then(|| {
            std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned()
        })
    };
    format!(
        "{} (uid {uid}, gid {gid})",
        name.unwrap_or_else(|| "?".into())
    )
}

/// The name of group `gid`, None when there is no such group.
pub fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getgrgid_r with a zeroed group, our buffer and its length; the name is copied
    // out of the buffer before it goes.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut out);
        (rc == 0 && !out.is_null()).then(|| {
            std::ffi::CStr::from_ptr(grp.gr_name)
                .to_string_lossy()
                .into_owned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kernels_numbering() {
        assert_eq!(cap_name(CAP_BPF), "CAP_BPF");
        assert_eq!(cap_name(CAP_PERFMON), "CAP_PERFMON");
        assert_eq!(cap_name(CAP_SYS_ADMIN), "CAP_SYS_ADMIN");
        assert_eq!(cap_name(CAP_SYS_PTRACE), "CAP_SYS_PTRACE");
        assert_eq!(cap_name(CAP_SETPCAP), "CAP_SETPCAP");
        assert_eq!(cap_name(CAP_DAC_READ_SEARCH), "CAP_DAC_READ_SEARCH");
        assert_eq!(list(0), "none");
        assert_eq!(
            list((1 << CAP_CHOWN) | (1 << CAP_BPF)),
            "CAP_CHOWN, CAP_BPF"
        );
    }

    /// A thread born of an already reduced thread: no CAP_SETPCAP, the bounding set already
    /// reduced. Applying the target must succeed (on a GPU host it failed with EPERM for a
    /// CUDA thread NVML started during the drop). In a forked child: capabilities are per
    /// thread and this one must not reduce the test harness.
    #[test]
    fn a_thread_born_reduced_applies_the_target() {
        let (eff, prm) = capget().expect("capget");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root's CAP_SETPCAP to reduce a thread (run as root in CI)");
            return;
        }
        assert!(
            eff & (1 << CAP_SETPCAP) != 0,
            "this test needs CAP_SETPCAP (root, as in CI)"
        );
        const CAP_SYS_BOOT: u32 = 22;
        let keep = prm & !(1u64 << CAP_SYS_BOOT) & !(1u64 << CAP_SETPCAP);
        // SAFETY: the child makes raw syscalls only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: prctl with integer arguments.
            unsafe {
                // The bounding set of a reduced thread: `keep` (CAP_SETPCAP goes last).
                for cap in (0..=40u32).rev() {
                    if keep & (1u64 << cap) == 0
                        && libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) == 1
                        && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                    {
                        libc::_exit(101);
                    }
                }
                if capset_to(keep) != 0 {
                    libc::_exit(102);
                }
            }
            KEEP.store(keep, Ordering::SeqCst);
            LAST_CAP.store(40, Ordering::SeqCst);
            DROP_BOUNDING.store(true, Ordering::SeqCst);
            let code = match apply_here() {
                Ok(()) => 0,
                Err(errno) => errno.clamp(1, 100),
            };
            // SAFETY: ends the child without running the harness's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "apply_here in a reduced thread failed (1-100: errno, 101/102: set-up)"
        );
    }

    #[test]
    fn kept_set_follows_the_config() {
        let mut plan = Plan::defaults();
        assert_eq!(
            list(runtime_caps(&plan)),
            "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_PERFMON"
        );
        // CAP_SYS_ADMIN stays with the statistics helper whatever the mode.
        plan.collect.bpf_stats = crate::config::BpfStatsMode::Always;
        assert_eq!(
            list(runtime_caps(&plan)),
            "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_PERFMON"
        );
        plan.gpu.runtimes.clear();
        // The snapshot's CPU profile opens perf events too.
        assert_eq!(
            list(runtime_caps(&plan)),
            "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_PERFMON"
        );
        plan.cpu_profile = Err("off");
        assert_eq!(
            list(runtime_caps(&plan)),
            "CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE"
        );
    }
}
