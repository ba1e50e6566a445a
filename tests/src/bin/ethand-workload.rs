//! Workloads with known ground truth for ethand's end-to-end tests.
//!
//! Protocol (stdin/stdout, one line each): after its setup the workload prints `ready [k=v ...]`
//! and waits for one byte on stdin; then it does exactly the work its mode describes, prints
//! `done [k=v ...]` and blocks on stdin until it is closed, then cleans up and exits 0. So the
//! measured work is bracketed by two quiet points where the test can take snapshots, and
//! setup (dynamic loader, allocations, children) stays out of the measured deltas.
//!
//! The measured work uses raw libc calls so that its syscalls are exactly the ones named.
//!
//! Modes:
//!   syscalls GETPIDS OPENS       GETPIDS getpid(), then OPENS openat() of a missing path
//!   pingpong ROUNDS              pipe ping-pong with a second thread, both SCHED_BATCH on one CPU
//!   blockio FILE MIB             O_DIRECT overwrite of MIB MiB (1 MiB writes), O_DIRECT read
//!   fdatasync FILE N             N fdatasync() of a file with nothing dirty (cache flushes only)
//!   net TCP_BYTES UDP_N UDP_SIZE TCP bytes and UDP datagrams to a child server over loopback
//!   cpu MS                       busy loop for MS ms of CPU time
//!   runq MS                      two children pinned to one CPU, each burning MS ms of CPU
//!   getpid-loop                  after `go`, getpid() in a loop until a second byte (`stop`)
//!   getpid-exit THREADS N M      after `go`, THREADS threads make N getpid() each and end; after
//!                                stdin closes, M getpid() and _exit(0) (no other syscall between)
//!   net-server UDP_N             (internal) the receiving side of `net`
//!   spin-threads N BURN_US SLEEP_US  after `go`, N threads burning BURN_US, sleeping SLEEP_US, until `stop`
//!   readloop FILE MIB MS direct|cached  1 MiB preads of a MIB MiB file for MS ms (O_DIRECT or page cache)
//!   units THREADS                after `go`, THREADS threads do units of fixed CPU work until
//!                                `stop`; `done units=U wall_ns=W`: the throughput
//!   fsyncwrite FILE KIB MS       pairs of a KIB KiB pwrite (over 64 slots of the file) and an
//!                                fsync, for MS ms; says how many pairs (the only fsyncs it makes)
//!   sleeper N MS                 after `go`, a new thread makes N nanosleep()s of MS ms, then waits
use std::{
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    process::{Command, Stdio},
    time::Duration,
};

#[path = "shared/args.rs"]
mod args;
#[path = "shared/protocol.rs"]
mod protocol;

use protocol::{say, wait_release};

fn main() {
    let args = args::args();
    let arg = |i: usize| args::number("ethand-workload", &args, i);
    match args.first().map(String::as_str) {
        Some("syscalls") => syscalls(arg(1), arg(2)),
        Some("pingpong") => pingpong(arg(1)),
        Some("blockio") => blockio(
            args.get(1).unwrap_or_else(|| fail("blockio FILE MIB")),
            arg(2),
        ),
        Some("fdatasync") => fdatasync(
            args.get(1).unwrap_or_else(|| fail("fdatasync FILE N")),
            arg(2),
        ),
        Some("net") => net(arg(1), arg(2), arg(3) as usize),
        Some("net-server") => net_server(arg(1)),
        Some("cpu") => cpu(arg(1)),
        Some("runq") => runq(arg(1)),
        Some("getpid-loop") => getpid_loop(),
        Some("getpid-exit") => getpid_exit(arg(1), arg(2), arg(3)),
        Some("slow-syscalls") => slow_syscalls(arg(1), arg(2), arg(3)),
        Some("spin-threads") => spin_threads(arg(1), arg(2), arg(3)),
        Some("units") => units(arg(1)),
        Some("readloop") => readloop(
            args.get(1)
                .unwrap_or_else(|| fail("readloop FILE MIB MS direct|cached")),
            arg(2),
            arg(3),
            args.get(4).map_or("", String::as_str),
        ),
        Some("sleeper") => sleeper(arg(1), arg(2)),
        Some("fsyncwrite") => fsyncwrite(
            args.get(1)
                .unwrap_or_else(|| fail("fsyncwrite FILE KIB MS")),
            arg(2) as usize * 1024,
            arg(3),
        ),
        _ => fail(&format!("unknown mode: {args:?}")),
    }
}

fn fail(msg: &str) -> ! {
    protocol::fail("ethand-workload", msg)
}

fn check(ret: libc::c_long, what: &str) -> libc::c_long {
    if ret < 0 {
        fail(&format!("{what}: {}", std::io::Error::last_os_error()));
    }
    ret
}

/// Blocks for the `go` byte.
fn wait_go() {
    if !protocol::wait_byte() {
        fail("stdin closed before `go`");
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity(0) pins the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        check(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) as libc::c_long,
            "sched_setaffinity",
        );
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Spins until the calling thread has used `ns` of CPU time.
fn burn_thread_cpu(ns: u64) {
    let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let mut x = 0u64;
    while clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start < ns {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

fn syscalls(getpids: u64, opens: u64) {
    let path = c"/nonexistent/ethand-test/no-such-file";
    say("ready");
    wait_go();
    for _ in 0..getpids {
        // SAFETY: getpid has no preconditions; the raw syscall avoids any libc caching.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    let mut failed = 0u64;
    for _ in 0..opens {
        // SAFETY: a valid NUL-terminated path.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::O_RDONLY,
                0,
            )
        };
        if fd < 0 {
            failed += 1;
        } else {
            // SAFETY: fd was just opened.
            unsafe { libc::close(fd as i32) };
        }
    }
    say(&format!(
        "done getpid={getpids} openat={opens} openat_failed={failed}"
    ));
    wait_release();
}

fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: valid 2-int array.
    check(
        unsafe { libc::pipe(fds.as_mut_ptr()) } as libc::c_long,
        "pipe",
    );
    (fds[0], fds[1])
}

/// SCHED_BATCH for the calling thread: a woken batch task does not preempt the waker, so each
/// pipe hand-off blocks the writer voluntarily instead of preempting it.
fn sched_batch() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: valid param; 0 is the calling thread.
    check(
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } as libc::c_long,
        "sched_setscheduler",
    );
}

fn pingpong(rounds: u64) {
    let (ping_r, ping_w) = pipe();
    let (pong_r, pong_w) = pipe();
    pin_to_cpu(0);
    sched_batch();
    let helper = std::thread::spawn(move || {
        pin_to_cpu(0);
        sched_batch();
        let mut b = [0u8; 1];
        loop {
            // SAFETY: valid fds and buffer.
            let n = unsafe { libc::read(ping_r, b.as_mut_ptr().cast(), 1) };
            if n != 1 {
                return;
            }
            // SAFETY: as above.
            unsafe { libc::write(pong_w, b.as_ptr().cast(), 1) };
        }
    });
    say("ready");
    wait_go();
    let mut b = [7u8; 1];
    for _ in 0..rounds {
        // SAFETY: valid fds and buffer.
        unsafe {
            check(
                libc::write(ping_w, b.as_ptr().cast(), 1) as libc::c_long,
                "write ping",
            );
            check(
                libc::read(pong_r, b.as_mut_ptr().cast(), 1) as libc::c_long,
                "read pong",
            );
        }
    }
    say(&format!("done rounds={rounds}"));
    wait_release();
    // SAFETY: closing our own fd ends the helper's loop.
    unsafe { libc::close(ping_w) };
    helper.join().expect("helper thread");
}

const MIB: usize = 1 << 20;

/// Setup: the file is created, written and made durable (fsync), so that the measured phase
/// allocates nothing. Measured: O_DIRECT overwrite in 1 MiB writes, O_DIRECT read back: data
/// requests only. No fsync there: O_DIRECT writes reach the device before pwrite returns,
/// and on a filesystem without a journal fsync/fdatasync also write the inode block (its new
/// mtime) from the calling process, which ethand rightly charges to it but which is not part
/// of the known ground truth.
fn blockio(file: &str, mib: u64) {
    let path = std::ffi::CString::new(file).expect("path without NUL");
    let mut buf: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; alignment is a power of two multiple of pointer size.
    if unsafe { libc::posix_memalign(&mut buf, 4096, MIB) } != 0 {
        fail("posix_memalign");
    }
    // SAFETY: buf holds MIB bytes.
    let data = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), MIB) };
    // SAFETY: valid path; the fd is closed at the end.
    let fd = check(
        unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_TRUNC | libc::O_RDWR | libc::O_DIRECT,
                0o600,
            )
        } as libc::c_long,
        "open",
    ) as i32;
    let mut write_all = |pattern: u8| {
        for i in 0..mib as usize {
            data.fill(pattern.wrapping_add(i as u8));
            // SAFETY: aligned buffer of MIB bytes, aligned offset.
            let n = unsafe { libc::pwrite(fd, buf, MIB, (i * MIB) as libc::off_t) };
            if n != MIB as isize {
                fail(&format!(
                    "pwrite {i}: {n} {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
    };
    write_all(0);
    // SAFETY: valid fd.
    check(unsafe { libc::fsync(fd) } as libc::c_long, "fsync (setup)");
    say("ready");
    wait_go();
    write_all(100);
    let mut read = 0usize;
    for i in 0..mib as usize {
        // SAFETY: aligned buffer of MIB bytes, aligned offset.
        let n = unsafe { libc::pread(fd, buf, MIB, (i * MIB) as libc::off_t) };
        if n != MIB as isize {
            fail(&format!(
                "pread {i}: {n} {}",
                std::io::Error::last_os_error()
            ));
        }
        if data.iter().any(|&b| b != 100u8.wrapping_add(i as u8)) {
            fail(&format!("read back wrong data in MiB {i}"));
        }
        read += n as usize;
    }
    say(&format!("done written={} read={read}", mib as usize * MIB));
    wait_release();
    // SAFETY: valid fd, path and allocation.
    unsafe {
        libc::close(fd);
        libc::unlink(path.as_ptr());
        libc::free(buf);
    }
}

/// Setup: a 4 KiB file written and synced. Measured: `n` fdatasync() with nothing to write.
fn fdatasync(file: &str, n: u64) {
    std::fs::write(file, [1u8; 4096]).unwrap_or_else(|e| fail(&format!("write {file}: {e}")));
    let f = std::fs::File::open(file).expect("open");
    f.sync_all().expect("fsync (setup)");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    say("ready");
    wait_go();
    for _ in 0..n {
        // SAFETY: valid fd.
        check(unsafe { libc::fdatasync(fd) } as libc::c_long, "fdatasync");
    }
    say(&format!("done fdatasync={n}"));
    wait_release();
    drop(f);
    let _ = std::fs::remove_file(file);
}

fn net(tcp_bytes: u64, udp_n: u64, udp_size: usize) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut server = Command::new(exe)
        .args(["net-server", &udp_n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("spawn net-server: {e}")));
    let mut from_server = BufReader::new(server.stdout.take().expect("piped"));
    let mut line = String::new();
    from_server.read_line(&mut line).expect("server ports");
    let ports: Vec<u16> = line
        .split_whitespace()
        .filter_map(|w| w.split_once('=')?.1.parse().ok())
        .collect();
    let [tcp_port, udp_port] = ports[..] else {
        fail(&format!("bad server line {line:?}"))
    };
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    let chunk = vec![0x5au8; 64 * 1024];
    let datagram = vec![0xa5u8; udp_size];
    say(&format!("ready server={}", server.id()));
    wait_go();
    let mut tcp = TcpStream::connect(("127.0.0.1", tcp_port)).expect("connect");
    let mut left = tcp_bytes as usize;
    while left > 0 {
        let n = left.min(chunk.len());
        tcp.write_all(&chunk[..n]).expect("tcp write");
        left -= n;
    }
    drop(tcp);
    for _ in 0..udp_n {
        let n = udp
            .send_to(&datagram, ("127.0.0.1", udp_port))
            .expect("udp send");
        assert_eq!(n, udp_size);
    }
    line.clear();
    from_server.read_line(&mut line).expect("server result");
    say(&format!(
        "done tcp_sent={tcp_bytes} udp_sent={} {}",
        udp_n * udp_size as u64,
        line.trim()
    ));
    wait_release();
    drop(server.stdin.take());
    let _ = server.wait();
}

fn net_server(udp_n: u64) {
    let tcp = TcpListener::bind("127.0.0.1:0").expect("tcp bind");
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    say(&format!(
        "ports tcp={} udp={}",
        tcp.local_addr().expect("addr").port(),
        udp.local_addr().expect("addr").port()
    ));
    let (mut conn, _) = tcp.accept().expect("accept");
    let mut buf = vec![0u8; 64 * 1024];
    let mut tcp_rx = 0u64;
    loop {
        let n = std::io::Read::read(&mut conn, &mut buf).expect("tcp read");
        if n == 0 {
            break;
        }
        tcp_rx += n as u64;
    }
    drop(conn);
    let (mut udp_rx, mut udp_packets) = (0u64, 0u64);
    udp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    while udp_packets < udp_n {
        let n = udp.recv(&mut buf).expect("udp recv");
        udp_rx += n as u64;
        udp_packets += 1;
    }
    say(&format!(
        "server_tcp_received={tcp_rx} server_udp_received={udp_rx} server_udp_packets={udp_packets}"
    ));
    wait_release();
}

fn cpu(ms: u64) {
    say("ready");
    wait_go();
    let t0 = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    burn_thread_cpu(ms * 1_000_000);
    let used = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - t0;
    say(&format!("done cpu_ns={used}"));
    wait_release();
}

/// /proc/self/schedstat: (on-CPU ns, run-queue wait ns).
fn own_schedstat() -> (u64, u64) {
    let t = std::fs::read_to_string("/proc/self/schedstat").expect("schedstat");
    let f: Vec<u64> = t
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (f[0], f[1])
}

fn runq(ms: u64) {
    let (hold_r, hold_w) = pipe();
    let (report_r, report_w) = pipe();
    say("ready");
    wait_go();
    let mut pids = Vec::new();
    let parent = std::process::id() as libc::pid_t;
    for _ in 0..2 {
        // SAFETY: the workload is single-threaded here; the child only uses async-signal-safe
        // calls plus its own allocations before exiting with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // A test that drops the workload mid-burn (the html test) kills only this parent:
            // orphaned hogs on CPU 0 would skew the tests after it.
            // SAFETY: prctl and getppid have no memory effects; _exit ends the child.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            }
            // SAFETY: closing our copy of the write end, so that EOF arrives on release.
            unsafe { libc::close(hold_w) };
            pin_to_cpu(0);
            burn_thread_cpu(ms * 1_000_000);
            let (oncpu, wait) = own_schedstat();
            let line = format!("{} {oncpu} {wait}\n", std::process::id());
            // SAFETY: valid fd and buffer; a pipe write under PIPE_BUF is atomic.
            unsafe { libc::write(report_w, line.as_ptr().cast(), line.len()) };
            let mut b = [0u8; 1];
            // SAFETY: blocks until the parent closes hold_w.
            unsafe {
                libc::read(hold_r, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        check(pid as libc::c_long, "fork");
        pids.push(pid);
    }
    // SAFETY: the parent keeps only the read end of the report pipe.
    unsafe { libc::close(report_w) };
    let mut reports =
        BufReader::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(report_r) });
    let mut out = String::from("done");
    for i in 0..2 {
        let mut line = String::new();
        reports.read_line(&mut line).expect("child report");
        let f: Vec<&str> = line.split_whitespace().collect();
        out.push_str(&format!(
            " child{i}={} child{i}_oncpu_ns={} child{i}_runq_ns={}",
            f[0], f[1], f[2]
        ));
    }
    say(&out);
    wait_release();
    // SAFETY: closing the hold pipe releases the children; then reap them.
    unsafe {
        libc::close(hold_w);
        for pid in pids {
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
        }
    }
}

fn getpid_loop() {
    say("ready");
    wait_go();
    let mut pfd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut calls = 0u64;
    loop {
        for _ in 0..1000 {
            // SAFETY: no preconditions.
            unsafe { libc::syscall(libc::SYS_getpid) };
        }
        calls += 1000;
        // SAFETY: valid pollfd; the 1 ms timeout paces the loop.
        if unsafe { libc::poll(&mut pfd, 1, 1) } > 0 {
            break;
        }
    }
    wait_go(); // consume the `stop` byte
    say(&format!("done getpid={calls}"));
    wait_release();
}

/// `getpid-exit THREADS N M`: the last syscalls of threads (and of the process) before
/// they exit are a run of one syscall, which syscall batching holds in the kernel until the
/// exit flushes it.
fn getpid_exit(threads: u64, n: u64, m: u64) {
    say("ready");
    wait_go();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..n {
                    // SAFETY: no preconditions.
                    unsafe { libc::syscall(libc::SYS_getpid) };
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("getpid thread");
    }
    say(&format!("done getpid={}", threads * n));
    wait_release();
    for _ in 0..m {
        // SAFETY: no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    // SAFETY: ends the process at once: exit_group is the only syscall after the getpids.
    unsafe { libc::_exit(0) }
}

/// `n` raw SYS_nanosleep calls of `us` microseconds each (glibc's nanosleep is
/// clock_nanosleep): exactly one syscall per sleep.
fn nanosleeps(n: u64, us: u64) {
    let ts = libc::timespec {
        tv_sec: (us / 1_000_000) as libc::time_t,
        tv_nsec: ((us % 1_000_000) * 1000) as libc::c_long,
    };
    for _ in 0..n {
        // SAFETY: a valid timespec; no remainder wanted.
        check(
            unsafe {
                libc::syscall(
                    libc::SYS_nanosleep,
                    &ts,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            },
            "nanosleep",
        );
    }
}

/// `slow-syscalls N US FAST` (for `ethand record`): after `go`, N nanosleep() of US
/// microseconds each (raw SYS_nanosleep: glibc's nanosleep is clock_nanosleep), then FAST
/// getpid(); one thread.
fn slow_syscalls(n: u64, us: u64, fast: u64) {
    say("ready");
    wait_go();
    nanosleeps(n, us);
    for _ in 0..fast {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    say(&format!("done nanosleep={n} getpid={fast}"));
    wait_release();
}

/// `spin-threads N BURN_US SLEEP_US` (diagnosis tests): after `go`, N threads that each burn
/// BURN_US µs of CPU, then sleep SLEEP_US µs (0: no sleep, they only spin), over and over
/// until a second byte (`stop`); then they are joined. Reports their CPU time.
fn spin_threads(n: u64, burn_us: u64, sleep_us: u64) {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    say("ready");
    wait_go();
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    burn_thread_cpu(burn_us * 1000);
                    if sleep_us > 0 {
                        std::thread::sleep(Duration::from_micros(sleep_us));
                    }
                }
                clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
            })
        })
        .collect();
    wait_go(); // consume the `stop` byte
    stop.store(true, Ordering::Relaxed);
    let cpu: u64 = handles
        .into_iter()
        .map(|h| h.join().expect("spinning thread"))
        .sum();
    say(&format!("done threads={n} cpu_ns={cpu}"));
    wait_release();
}

/// `units THREADS`: after `go`, THREADS threads each do units of a fixed amount of CPU work
/// (2^20 multiply-adds, not timed by any clock: a unit costs the same CPU however the
/// thread is scheduled) until `stop`. `done units=U wall_ns=W`: the throughput a fix of
/// contention is measured by.
fn units(threads: u64) {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    say("ready");
    wait_go();
    let t0 = clock_ns(libc::CLOCK_MONOTONIC);
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut done = 0u64;
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..(1u64 << 20) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(i),
                        );
                    }
                    done += 1;
                }
                std::hint::black_box(x);
                done
            })
        })
        .collect();
    wait_go(); // consume the `stop` byte
    stop.store(true, Ordering::Relaxed);
    let wall = clock_ns(libc::CLOCK_MONOTONIC) - t0;
    let units: u64 = handles
        .into_iter()
        .map(|h| h.join().expect("unit thread"))
        .sum();
    say(&format!("done units={units} wall_ns={wall}"));
    wait_release();
}

/// `readloop FILE MIB MS direct|cached` (diagnosis tests). Setup: a file of MIB MiB written
/// with O_DIRECT and fsynced; `cached` then reads it once through the page cache, so that
/// its later reads are cache hits. Measured: for MS ms, sequential 1 MiB pread()s of the file,
/// round and round: with O_DIRECT (`direct`: every read is a disk read) or through the page
/// cache (`cached`: no disk read at all).
fn readloop(file: &str, mib: u64, ms: u64, how: &str) {
    let direct = match how {
        "direct" => true,
        "cached" => false,
        _ => fail("readloop FILE MIB MS direct|cached"),
    };
    let path = std::ffi::CString::new(file).expect("path without NUL");
    let mut buf: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; alignment is a power of two multiple of pointer size.
    if unsafe { libc::posix_memalign(&mut buf, 4096, MIB) } != 0 {
        fail("posix_memalign");
    }
    // SAFETY: buf holds MIB bytes.
    unsafe { std::ptr::write_bytes(buf.cast::<u8>(), 0x5a, MIB) };
    // SAFETY: valid path.
    let wfd = check(
        unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_DIRECT,
                0o600,
            )
        } as libc::c_long,
        "open for writing",
    ) as i32;
    for i in 0..mib as usize {
        // SAFETY: aligned buffer of MIB bytes, aligned offset.
        let n = unsafe { libc::pwrite(wfd, buf, MIB, (i * MIB) as libc::off_t) };
        if n != MIB as isize {
            fail(&format!(
                "pwrite {i}: {n} {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: valid fd.
    unsafe {
        check(libc::fsync(wfd) as libc::c_long, "fsync (setup)");
        libc::close(wfd);
    }
    let flags = libc::O_RDONLY | if direct { libc::O_DIRECT } else { 0 };
    // SAFETY: valid path.
    let fd = check(
        unsafe { libc::open(path.as_ptr(), flags) } as libc::c_long,
        "open for reading",
    ) as i32;
    let read_at = |i: u64| {
        // SAFETY: aligned buffer of MIB bytes, aligned offset.
        let n = unsafe { libc::pread(fd, buf, MIB, ((i % mib) as usize * MIB) as libc::off_t) };
        if n != MIB as isize {
            fail(&format!(
                "pread {i}: {n} {}",
                std::io::Error::last_os_error()
            ));
        }
    };
    if !direct {
        for i in 0..mib {
            read_at(i);
        }
    }
    say("ready");
    wait_go();
    let t0 = clock_ns(libc::CLOCK_MONOTONIC);
    let mut reads = 0u64;
    while clock_ns(libc::CLOCK_MONOTONIC) - t0 < ms * 1_000_000 {
        read_at(reads);
        reads += 1;
    }
    let took = clock_ns(libc::CLOCK_MONOTONIC) - t0;
    say(&format!(
        "done reads={reads} read={} took_ns={took}",
        reads * MIB as u64
    ));
    wait_release();
    // SAFETY: valid fd, path and allocation.
    unsafe {
        libc::close(fd);
        libc::unlink(path.as_ptr());
        libc::free(buf);
    }
}

/// `sleeper N MS` (off-CPU tests): after `go`, a new thread makes N nanosleep()s of MS ms
/// each, then blocks until release. Reports the thread's tid, its wall time from its first
/// instruction to just before it blocks (`wall_ns`, CLOCK_MONOTONIC), its CPU time then
/// (`cpu_ns`) and the sleep asked for (`asked_ns`): every span the thread spent off CPU in
/// its life, but the last, lies in that wall time.
fn sleeper(n: u64, ms: u64) {
    say("ready");
    wait_go();
    let (report_tx, report_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let t0 = clock_ns(libc::CLOCK_MONOTONIC);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        nanosleeps(n, ms * 1000);
        let cpu = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let wall = clock_ns(libc::CLOCK_MONOTONIC) - t0;
        report_tx.send((tid, wall, cpu)).expect("report");
        let _ = stop_rx.recv();
    });
    let (tid, wall, cpu) = report_rx.recv().expect("sleeper report");
    say(&format!(
        "done tid={tid} wall_ns={wall} cpu_ns={cpu} asked_ns={}",
        n * ms * 1_000_000
    ));
    wait_release();
    drop(stop_tx);
    handle.join().expect("sleeper thread");
}

/// Durable small writes, as a checkpoint or log writer makes them: each pair dirties `size`
/// bytes of the page cache and waits for them (and the journal) to reach the disk.
fn fsyncwrite(file: &str, size: usize, ms: u64) {
    let path = std::ffi::CString::new(file).expect("path without NUL");
    let buf = vec![0x5au8; size];
    // SAFETY: valid path.
    let fd = check(
        unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY,
                0o600,
            )
        } as libc::c_long,
        "open for writing",
    ) as i32;
    say("ready");
    wait_go();
    let t0 = clock_ns(libc::CLOCK_MONOTONIC);
    let mut pairs = 0u64;
    while clock_ns(libc::CLOCK_MONOTONIC) - t0 < ms * 1_000_000 {
        let at = (pairs % 64) as usize * size;
        // SAFETY: buf holds size bytes; valid fd.
        let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), size, at as libc::off_t) };
        if n != size as isize {
            fail(&format!("pwrite: {n} {}", std::io::Error::last_os_error()));
        }
        // SAFETY: valid fd.
        check(unsafe { libc::fsync(fd) } as libc::c_long, "fsync");
        pairs += 1;
    }
    let took = clock_ns(libc::CLOCK_MONOTONIC) - t0;
    say(&format!(
        "done pairs={pairs} bytes={} took_ns={took}",
        pairs * size as u64
    ));
    wait_release();
    // SAFETY: valid fd.
    unsafe { libc::close(fd) };
    let _ = std::fs::remove_file(file);
}
