//! Load and identity workloads for ethand's end-to-end tests (tests/e2e/churn.rs and
//! escaping.rs). Same protocol as `ethand-workload`: `ready [k=v ...]`, one byte on stdin
//! (`go`), the work, `done [k=v ...]`, then it blocks until stdin is closed.
//!
//! Modes:
//!   churn RATE SECONDS FORKERS [fork|vfork]  FORKERS processes together create RATE child
//!                                  processes per second for SECONDS with fork() (default) or
//!                                  vfork(); every child exits at once (_exit(0))
//!   getpid-spread N SECONDS STOPS  exactly N getpid() spread over SECONDS (one slice every
//!                                  100 ms); STOPS times it pauses, prints `at made=K` and
//!                                  waits for a byte before going on
//!   pid-reuse A B                  child A makes A getpid() and exits; child B is created with
//!                                  A's pid (clone3 set_tid) and makes B getpid(), then waits
//!   named NAME_HEX|-               sets its own comm (prctl PR_SET_NAME) to the bytes NAME_HEX
//!                                  (`-`: keeps its name); after `go`, 1000 getpid()

#[path = "shared/args.rs"]
mod args;
#[path = "shared/protocol.rs"]
mod protocol;

use protocol::{say, wait_release};

fn main() {
    let args = args::args();
    let arg = |i: usize| args::number("ethand-load", &args, i);
    match args.first().map(String::as_str) {
        Some("churn") => churn(
            arg(1),
            arg(2),
            arg(3),
            args.get(4).is_some_and(|s| s == "vfork"),
        ),
        Some("getpid-spread") => getpid_spread(arg(1), arg(2), arg(3)),
        Some("pid-reuse") => pid_reuse(arg(1), arg(2)),
        Some("named") => named(args.get(1).map_or("", String::as_str)),
        _ => fail(&format!("unknown mode: {args:?}")),
    }
}

fn fail(msg: &str) -> ! {
    protocol::fail("ethand-load", msg)
}

/// Blocks for one byte on stdin (`go`, or the test's go-ahead after a pause).
fn wait_byte() {
    if !protocol::wait_byte() {
        fail("stdin closed while waiting for a byte");
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn getpids(n: u64) {
    for _ in 0..n {
        // SAFETY: no preconditions; the raw syscall avoids any libc caching.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
}

fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: valid 2-int array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        fail("pipe");
    }
    (fds[0], fds[1])
}

extern "C" fn exit_now(_: *mut libc::c_void) -> libc::c_int {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(0) }
}

/// One forker: `rate` children per second for `secs`, paced against the monotonic clock
/// (behind schedule it forks back to back). Children are reaped by the kernel (SIGCHLD
/// ignored). Returns (children forked, fork failures, ns taken).
fn fork_paced(rate: u64, secs: u64, vfork: bool) -> (u64, u64, u64) {
    let t0 = now_ns();
    let end = t0 + secs * 1_000_000_000;
    let (mut made, mut failed) = (0u64, 0u64);
    // The stack of a vfork child: one child at a time (vfork suspends us until it exits).
    let mut stack = vec![0u128; 4096];
    // SAFETY: one past the end of the allocation, 16-byte aligned (u128 elements).
    let stack_top = unsafe { stack.as_mut_ptr().add(stack.len()) }.cast::<libc::c_void>();
    loop {
        let now = now_ns();
        if now >= end {
            break;
        }
        let due = (u128::from(now - t0) * u128::from(rate) / 1_000_000_000) as u64;
        if made >= due {
            // Ahead of schedule: sleep about one child's share.
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: (1_000_000_000 / rate.max(1)).min(1_000_000) as libc::c_long,
            };
            // SAFETY: valid timespec.
            unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            continue;
        }
        // SAFETY: the fork child calls only _exit; the vfork child runs `exit_now` on its own
        // stack (the parent is suspended until it exits).
        match unsafe {
            if vfork {
                libc::clone(
                    exit_now,
                    stack_top,
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                    std::ptr::null_mut(),
                )
            } else {
                libc::fork()
            }
        } {
            0 => unsafe { libc::_exit(0) },
            -1 => failed += 1,
            _ => made += 1,
        }
    }
    (made, failed, now_ns() - t0)
}

fn churn(rate: u64, secs: u64, forkers: u64, vfork: bool) {
    // SAFETY: ignoring SIGCHLD makes the kernel reap the children (inherited by the forkers).
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    let (report_r, report_w) = pipe();
    let (go_r, go_w) = pipe();
    let mut pids = Vec::new();
    for i in 0..forkers {
        // SAFETY: single-threaded here; the forker uses raw calls and its own stack only.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let share = rate / forkers + u64::from(i < rate % forkers);
            let mut b = [0u8; 1];
            // SAFETY: blocks until the parent writes the start byte(s).
            unsafe { libc::read(go_r, b.as_mut_ptr().cast(), 1) };
            let (made, failed, took) = fork_paced(share, secs, vfork);
            let line = format!("{made} {failed} {took}\n");
            // SAFETY: a pipe write under PIPE_BUF is atomic.
            unsafe {
                libc::write(report_w, line.as_ptr().cast(), line.len());
                libc::_exit(0);
            }
        }
        if pid < 0 {
            fail("fork forker");
        }
        pids.push(pid);
    }
    // SAFETY: the parent keeps only the read end of the report pipe.
    unsafe { libc::close(report_w) };
    say(&format!(
        "ready forkers={}",
        pids.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",")
    ));
    wait_byte();
    let t0 = now_ns();
    let start = vec![1u8; forkers as usize];
    // SAFETY: valid buffer; wakes every forker at once.
    unsafe { libc::write(go_w, start.as_ptr().cast(), start.len()) };
    let mut text = String::new();
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: valid buffer.
        let n = unsafe { libc::read(report_r, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n as usize]));
    }
    let wall = now_ns() - t0;
    let (mut made, mut failed, mut slowest) = (0u64, 0u64, 0u64);
    for l in text.lines() {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        made += f[0];
        failed += f[1];
        slowest = slowest.max(f[2]);
    }
    say(&format!(
        "done spawned={made} failed={failed} forker_ns={slowest} wall_ns={wall}"
    ));
    wait_release();
}

fn getpid_spread(n: u64, secs: u64, stops: u64) {
    let slices = (secs * 10).max(1);
    let stop_every = (slices / (stops + 1)).max(1);
    say(&format!("ready slices={slices}"));
    wait_byte();
    let t0 = now_ns();
    let mut made = 0u64;
    let mut paused = 0u64;
    for i in 0..slices {
        let upto = n * (i + 1) / slices;
        getpids(upto - made);
        made = upto;
        if (i + 1) % stop_every == 0 && paused < stops && i + 1 < slices {
            say(&format!("at made={made}"));
            wait_byte();
            paused += 1;
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // SAFETY: valid timespec (clock_nanosleep through libc: not a getpid).
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
    say(&format!("done getpid={made} took_ns={}", now_ns() - t0));
    wait_release();
}

/// Sets the calling process's comm to `name` (bytes; the kernel keeps 15 and a NUL).
fn set_comm(name: &[u8]) {
    let mut b = [0u8; 16];
    let n = name.len().min(15);
    b[..n].copy_from_slice(&name[..n]);
    // SAFETY: a valid NUL-terminated buffer of 16 bytes.
    if unsafe { libc::prctl(libc::PR_SET_NAME, b.as_ptr()) } != 0 {
        fail("prctl PR_SET_NAME");
    }
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// fork() that gives the child exactly `pid` (clone3 with set_tid; needs CAP_SYS_ADMIN).
/// Ok(0) in the child, Ok(pid) in the parent, Err(errno) when the pid is taken.
fn fork_with_pid(pid: i32) -> Result<i32, i32> {
    let tid = [pid];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork; the child only makes raw calls and exits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as i32)
    }
}

/// In a child: the name, `n` getpid(), then wait until `hold_r` reaches EOF (the parent
/// closed `hold_w`, of which the child drops its copy), and exit.
fn child_work(n: u64, hold_r: i32, hold_w: i32, done_w: i32) -> ! {
    // SAFETY: our copy of the write end, else EOF never comes.
    unsafe { libc::close(hold_w) };
    set_comm(b"reuse-child");
    getpids(n);
    // SAFETY: valid fds and buffers; _exit skips the parent's atexit handlers.
    unsafe {
        libc::write(done_w, b"x".as_ptr().cast(), 1);
        let mut b = [0u8; 1];
        libc::read(hold_r, b.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

fn pid_reuse(a: u64, b: u64) {
    let (a_hold_r, a_hold_w) = pipe();
    let (b_hold_r, b_hold_w) = pipe();
    let (done_r, done_w) = pipe();
    say("ready");
    wait_byte();
    let wait_done = || {
        let mut x = [0u8; 1];
        // SAFETY: valid fd and buffer.
        if unsafe { libc::read(done_r, x.as_mut_ptr().cast(), 1) } != 1 {
            fail("child did not report");
        }
    };
    // SAFETY: single-threaded; the child runs child_work only.
    let pid_a = unsafe { libc::fork() };
    if pid_a == 0 {
        child_work(a, a_hold_r, a_hold_w, done_w);
    }
    if pid_a < 0 {
        fail("fork A");
    }
    wait_done();
    // A stays alive for a while (ethand reads its /proc metadata), then exits and is reaped
    // so that its pid is free; B gets the same pid at once.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let a_start = start_ticks(pid_a);
    // SAFETY: closing our write end releases A; reaping frees its pid.
    unsafe {
        libc::close(a_hold_w);
        let mut st = 0;
        libc::waitpid(pid_a, &mut st, 0);
    }
    let pid_b = match fork_with_pid(pid_a) {
        Ok(0) => child_work(b, b_hold_r, b_hold_w, done_w),
        Ok(p) => p,
        Err(e) => fail(&format!(
            "clone3 set_tid={pid_a}: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    };
    wait_done();
    say(&format!(
        "done pid_a={pid_a} pid_b={pid_b} a={a} b={b} a_start_ticks={a_start} b_start_ticks={}",
        start_ticks(pid_b)
    ));
    wait_release();
    // SAFETY: releases B, then reaps it.
    unsafe {
        libc::close(b_hold_w);
        let mut st = 0;
        libc::waitpid(pid_b, &mut st, 0);
    }
}

/// Field 22 of /proc/PID/stat (start time in clock ticks after boot).
fn start_ticks(pid: i32) -> u64 {
    let t = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
    let t = String::from_utf8_lossy(&t);
    let close = t.rfind(')').unwrap_or(0);
    t[close + 1..]
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn named(name_hex: &str) {
    let name: Vec<u8> = (0..name_hex.len() / 2)
        .map(|i| u8::from_str_radix(&name_hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|_| fail("named NAME_HEX: not hex"));
    // "-": keep the name exec gave (the file's name).
    if name_hex != "-" {
        set_comm(&name);
    }
    say("ready");
    wait_byte();
    getpids(1000);
    say("done getpid=1000");
    wait_release();
}
