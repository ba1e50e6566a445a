//! What a hostile local user does to a root daemon (tests/e2e/hostile.rs), bounded in count
//! and time and aimed at loopback only. Same protocol as `ethand-workload`: `ready [k=v ...]`,
//! one byte on stdin (`go`), the work, `done [k=v ...]`, then it blocks until stdin closes.
//!
//! Modes:
//!   conn-flood PORT IDLE SLOW SECONDS  for SECONDS, keeps up to IDLE connections to
//!                                  127.0.0.1:PORT open that send nothing, and up to SLOW that
//!                                  send a /metrics request and never read the reply; closed
//!                                  ones are opened again every 100 ms (attempts are counted)
//!   argv-sleepers N BYTES          N children, each with BYTES of command line (in arguments
//!                                  of at most 120 KiB), that sleep until stdin closes
//!   hold BYTES...                  (the children: sleeps until killed)
//!   cap-probe PID OTHERS_FILE ROOT_FILE  after `go`, tries what a compromised daemon would
//!                                  with the privileges this runs with, and reports each as
//!                                  `ok` or the errno: create a BPF map, open a system-wide
//!                                  perf event, read process PID's environment, ptrace-attach
//!                                  to it, signal it, read and write OTHERS_FILE (another
//!                                  user's 0600 file), write ROOT_FILE (root's 0644 file),
//!                                  become uid 0
use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd,
    process::{Child, Command},
    time::{Duration, Instant},
};

#[path = "shared/args.rs"]
mod args;
#[path = "shared/protocol.rs"]
mod protocol;

use protocol::{say, wait_release};

fn main() {
    let args = args::args();
    let arg = |i: usize| args::number("ethand-hostile", &args, i);
    match args.first().map(String::as_str) {
        Some("conn-flood") => conn_flood(arg(1) as u16, arg(2), arg(3), arg(4)),
        Some("argv-sleepers") => argv_sleepers(arg(1), arg(2)),
        Some("cap-probe") => cap_probe(
            arg(1) as libc::pid_t,
            args.get(2)
                .unwrap_or_else(|| fail("cap-probe PID OTHERS_FILE ROOT_FILE")),
            args.get(3)
                .unwrap_or_else(|| fail("cap-probe PID OTHERS_FILE ROOT_FILE")),
        ),
        Some("hold") => {
            // Dies with the process that started it, however that one ends.
            // SAFETY: prctl and getppid with integer arguments.
            unsafe {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                if libc::getppid() == 1 {
                    std::process::exit(0);
                }
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        _ => fail(&format!("unknown mode: {args:?}")),
    }
}

fn fail(msg: &str) -> ! {
    protocol::fail("ethand-hostile", msg)
}

fn wait_byte() {
    if !protocol::wait_byte() {
        fail("stdin closed while waiting for a byte");
    }
}

/// True when the server has closed `s` (EOF or an error); false while it is open.
fn closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a non-blocking peek into a 1-byte buffer of our own socket.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0 || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock)
}

fn conn_flood(port: u16, idle: u64, slow: u64, secs: u64) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    say("ready");
    wait_byte();
    let connect = || TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok();
    let mut idle_conns: Vec<TcpStream> = Vec::new();
    let mut slow_conns: Vec<(TcpStream, Instant)> = Vec::new();
    let (mut attempts, mut failed) = (0u64, 0u64);
    let (mut idle_peak, mut slow_peak) = (0usize, 0usize);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        idle_conns.retain(|s| !closed(s));
        while (idle_conns.len() as u64) < idle && t0.elapsed() < Duration::from_secs(secs) {
            attempts += 1;
            match connect() {
                Some(s) => idle_conns.push(s),
                None => {
                    failed += 1;
                    break;
                }
            }
        }
        // A reader that never reads cannot see the server give up (the reply stays queued):
        // it starts over once the server must have.
        slow_conns.retain(|(_, t)| t.elapsed() < Duration::from_secs(12));
        while (slow_conns.len() as u64) < slow && t0.elapsed() < Duration::from_secs(secs) {
            attempts += 1;
            let Some(s) = connect() else {
                failed += 1;
                break;
            };
            // The smallest receive buffer: the reply stalls at once.
            let one: libc::c_int = 1;
            // SAFETY: setsockopt on our own socket with a valid int.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&one as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            let mut w = &s;
            let _ = w.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            slow_conns.push((s, Instant::now()));
        }
        idle_peak = idle_peak.max(idle_conns.len());
        slow_peak = slow_peak.max(slow_conns.len());
        std::thread::sleep(Duration::from_millis(100));
    }
    say(&format!(
        "done attempts={attempts} failed={failed} idle_peak={idle_peak} slow_peak={slow_peak}"
    ));
    drop((idle_conns, slow_conns));
    wait_release();
}

fn argv_sleepers(n: u64, bytes: u64) {
    // The kernel takes arguments of at most 128 KiB each.
    let arg = (bytes as usize).clamp(2, 120 * 1024);
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&format!("current_exe: {e}")));
    let chunks = (bytes as usize).div_ceil(arg);
    let junk: Vec<String> = (0..chunks)
        .map(|i| {
            let c = char::from(b'a' + (i % 26) as u8);
            std::iter::repeat_n(c, arg - 1).collect()
        })
        .collect();
    let mut children: Vec<Child> = Vec::new();
    for _ in 0..n {
        match Command::new(&exe).arg("hold").args(&junk).spawn() {
            Ok(c) => children.push(c),
            Err(e) => fail(&format!("spawn: {e}")),
        }
    }
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    say(&format!(
        "ready children={} arg_bytes={} first={}",
        children.len(),
        chunks * arg,
        pids.first().map_or("", String::as_str)
    ));
    wait_byte();
    say("done");
    wait_release();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `ok`, or the errno's name, of a call that returned `rc` (negative: failed).
fn outcome(rc: i64) -> String {
    if rc >= 0 {
        return "ok".into();
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::ESRCH) => "ESRCH".into(),
        Some(e) => format!("errno{e}"),
        None => "error".into(),
    }
}

fn open_outcome(path: &str, flags: libc::c_int) -> String {
    let c = std::ffi::CString::new(path).unwrap_or_else(|_| fail("a path with NUL"));
    // SAFETY: open with a NUL-terminated path; the descriptor is closed at once.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    let r = outcome(fd.into());
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    r
}

fn cap_probe(pid: libc::pid_t, others_file: &str, root_file: &str) {
    say("ready");
    wait_byte();
    // BPF_MAP_CREATE of a one-entry array: needs CAP_BPF or CAP_SYS_ADMIN (bpf_capable).
    #[repr(C)]
    struct MapAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        rest: [u8; 112],
    }
    let attr = MapAttr {
        map_type: 2,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        rest: [0; 112],
    };
    // SAFETY: bpf(BPF_MAP_CREATE) with a zero-filled attribute of the size given.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, &attr, size_of::<MapAttr>()) };
    let bpf = outcome(fd);
    // A CPU-clock counter of every process on CPU 0: system-wide monitoring (CAP_PERFMON).
    // struct perf_event_attr (PERF_ATTR_SIZE_VER7, 128 bytes): type, size, config, the rest 0.
    #[repr(C)]
    struct PerfAttr {
        kind: u32,
        size: u32,
        config: u64,
        rest: [u64; 14],
    }
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
    let pa = PerfAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: size_of::<PerfAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        rest: [0; 14],
    };
    // SAFETY: perf_event_open with a filled attribute: any process (-1) on CPU 0.
    let perf = outcome(unsafe { libc::syscall(libc::SYS_perf_event_open, &pa, -1, 0, -1, 0) });
    let environ = {
        let path = format!("/proc/{pid}/environ");
        match std::fs::read(&path) {
            Ok(_) => "ok".to_string(),
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => "EACCES".into(),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => "EPERM".into(),
            Err(e) => format!("{e}"),
        }
    };
    // SAFETY: ptrace(PTRACE_SEIZE) of a pid; the tracee is released when this process exits.
    let ptrace = outcome(unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            0,
        )
    });
    // SAFETY: signal 0 only checks permission.
    let kill = outcome(unsafe { libc::kill(pid, 0) }.into());
    let read_others = open_outcome(others_file, libc::O_RDONLY);
    let write_others = open_outcome(others_file, libc::O_WRONLY | libc::O_APPEND);
    let write_root = open_outcome(root_file, libc::O_WRONLY | libc::O_APPEND);
    // SAFETY: setuid with an integer; on success this process is root, and exits right after.
    let setuid = outcome(unsafe { libc::syscall(libc::SYS_setuid, 0) });
    say(&format!(
        "done bpf_map_create={bpf} perf_event_open={perf} read_environ={environ} ptrace_attach={ptrace} \
         kill={kill} read_others_file={read_others} write_others_file={write_others} \
         write_root_file={write_root} setuid_root={setuid}"
    ));
    wait_release();
}
