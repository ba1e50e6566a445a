//! The one thing the running daemon would need CAP_SYS_ADMIN for: switching the kernel's BPF
//! run-time statistics (ethand's own cost per program) on and off, which BPF_ENABLE_STATS
//! allows only with that capability, each time. CAP_SYS_ADMIN also passes the kernel's
//! `bpf_capable()` and much else, so the daemon does not keep it: with
//! `daemon.bpf_stats = "sampled"` it starts this helper before it drops its capabilities.
//! The helper (`ethand bpf-stats-helper`, the same binary) reduces itself to CAP_SYS_ADMIN
//! alone, as the daemon's user, and reads nothing but single bytes from its stdin: `1` turns
//! the statistics on (it holds the descriptor that keeps them on), `0` off; each is answered
//! with one byte, 0 or the errno. Anything else, or the end of its stdin, ends it; it also
//! dies with the daemon (PR_SET_PDEATHSIG).
use std::{
    io::{self, Read as _, Write as _},
    os::fd::{AsRawFd, OwnedFd},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use crate::privilege::{self, CAP_SYS_ADMIN, RunAs};

/// The hidden subcommand that runs the helper.
pub const SUBCOMMAND: &str = "bpf-stats-helper";

/// Written once the helper holds CAP_SYS_ADMIN alone and waits for commands.
const READY: u8 = b'R';
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// The daemon's end of the helper.
pub struct StatsHelper {
    child: Child,
    tx: ChildStdin,
    rx: ChildStdout,
}

impl StatsHelper {
    /// Starts the helper (as `user` when given) and waits until it has reduced itself.
    pub fn spawn(user: Option<&RunAs>) -> io::Result<Self> {
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(SUBCOMMAND);
        if let Some(u) = user {
            cmd.arg("--user").arg(&u.name);
        }
        let mut child = cmd
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let tx = child.stdin.take().expect("piped");
        let rx = child.stdout.take().expect("piped");
        let mut h = Self { child, tx, rx };
        match h.read_byte(Duration::from_secs(5))? {
            READY => Ok(h),
            e => Err(io::Error::other(format!(
                "the helper could not reduce itself to CAP_SYS_ADMIN ({})",
                io::Error::from_raw_os_error(i32::from(e))
            ))),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Turns the statistics on or off; the helper's errno on failure.
    pub fn set(&mut self, on: bool) -> io::Result<()> {
        self.tx.write_all(if on { b"1" } else { b"0" })?;
        match self.read_byte(ANSWER_TIMEOUT)? {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(i32::from(e))),
        }
    }

    fn read_byte(&mut self, timeout: Duration) -> io::Result<u8> {
        let mut pfd = libc::pollfd {
            fd: self.rx.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the BPF statistics helper did not answer",
            ));
        }
        let mut b = [0u8; 1];
        self.rx.read_exact(&mut b)?;
        Ok(b[0])
    }
}

impl Drop for StatsHelper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The helper process: `ethand bpf-stats-helper [--user NAME]`. Returns its exit code.
pub fn main(user: Option<&str>) -> u8 {
    // SAFETY: prctl and getppid with integer arguments and a NUL-terminated name.
    unsafe {
        // Its own name in ps and top (exec'd as /proc/self/exe, it would be "exe").
        libc::prctl(
            libc::PR_SET_NAME,
            c"ethand-stats".as_ptr() as libc::c_ulong,
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
    let mut out = io::stdout().lock();
    let run_as = match user.map(RunAs::lookup).transpose() {
        Ok(u) => u.flatten(),
        Err(e) => {
            eprintln!("ethand bpf-stats-helper: {e}");
            let _ = out
                .write_all(&[libc::EINVAL as u8])
                .and_then(|()| out.flush());
            return 2;
        }
    };
    if let Err(e) = privilege::drop_to(1u64 << CAP_SYS_ADMIN, run_as.as_ref()) {
        eprintln!("ethand bpf-stats-helper: {e}");
        let _ = out
            .write_all(&[libc::EPERM as u8])
            .and_then(|()| out.flush());
        return 1;
    }
    if privilege::effective() != 1u64 << CAP_SYS_ADMIN {
        eprintln!("ethand bpf-stats-helper: CAP_SYS_ADMIN is not held");
        let _ = out
            .write_all(&[libc::EPERM as u8])
            .and_then(|()| out.flush());
        return 1;
    }
    // SAFETY: prctl with integer arguments: nothing this process could exec gains privileges.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if out.write_all(&[READY]).and_then(|()| out.flush()).is_err() {
        return 1;
    }
    let mut stats: Option<OwnedFd> = None;
    let mut input = io::stdin().lock();
    let mut cmd = [0u8; 1];
    loop {
        if input.read_exact(&mut cmd).is_err() {
            return 0;
        }
        let errno = match cmd[0] {
            b'1' if stats.is_some() => 0,
            b'1' => match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => {
                    stats = Some(fd);
                    0
                }
                Err(e) => e.io_error.raw_os_error().unwrap_or(libc::EIO).clamp(1, 255) as u8,
            },
            b'0' => {
                stats = None;
                0
            }
            _ => return 2,
        };
        if out.write_all(&[errno]).and_then(|()| out.flush()).is_err() {
            return 0;
        }
    }
}
