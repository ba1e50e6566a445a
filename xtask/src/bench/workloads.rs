//! The five workloads of the per-event table, and the record suite's load generator. Each runs
//! in its own child process (`xtask workload NAME`), started by [`measure`] (or
//! [`measure_handshake`]), and prints one result line that [`Measurement::parse`] reads back.
//!
//! Invariant: a workload times only its steady loop; set-up (files, sockets, forks, warm-up,
//! loading a library and waiting for the tracer to attach to it) stays outside the timed
//! region, so "ns per event" is the cost of the events alone.

use std::ffi::{CString, OsStr, c_void};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{hint, io, mem, process, thread};

use anyhow::{Context, Result, bail, ensure};
use clap::ValueEnum;

/// Where the O_DIRECT file goes unless told otherwise: on Debian, disk-backed (unlike /tmp,
/// which may be tmpfs).
pub const DEFAULT_IO_DIR: &str = "/var/tmp";
/// Block size of the O_DIRECT loop.
const IO_BLOCK: usize = 4096;
/// Blocks in the O_DIRECT file (8 MiB): written once before the timed loop, so the loop only
/// overwrites allocated blocks (one block request per op, no allocation).
const IO_FILE_BLOCKS: u64 = 2048;
/// Size of one send() in the TCP transfer.
const TCP_CHUNK: usize = 64 * 1024;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Workload {
    /// `syscall(SYS_getpid)` in a loop: one event = one syscall.
    Getpid,
    /// One byte back and forth over two pipes between two processes on one CPU:
    /// one event = one round trip (2 context switches, 2 writes, 2 reads).
    Pingpong,
    /// Alternate 4 KiB O_DIRECT writes and reads of one file: one event = one IO op
    /// (one syscall and one block request).
    Odirect,
    /// A loopback TCP transfer in 64 KiB writes to a receiver thread on the same CPU:
    /// one event = one send().
    Tcp,
    /// `cuLaunchKernel` of a stand-in libcuda (`--lib`), loaded with dlopen: one event = one
    /// call, i.e. one uprobe hit. Handshake on stdin/stdout (see [`measure_handshake`]).
    Uprobe,
    /// The record suite's load generator, not part of the table: `--iters` getpid calls
    /// spread over `--threads` threads (one per CPU), paced at `--rate` calls/s in total
    /// (0: as fast as possible). Handshake as `uprobe`.
    Paced,
}

impl Workload {
    /// The workloads of the per-event table (not [`Workload::Paced`]).
    pub const ALL: [Workload; 5] = [
        Workload::Getpid,
        Workload::Pingpong,
        Workload::Odirect,
        Workload::Tcp,
        Workload::Uprobe,
    ];

    /// The name on the command line of `xtask workload`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Getpid => "getpid",
            Workload::Pingpong => "pingpong",
            Workload::Odirect => "odirect",
            Workload::Tcp => "tcp",
            Workload::Uprobe => "uprobe",
            Workload::Paced => "paced",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Workload::Getpid => "getpid loop",
            Workload::Pingpong => "pipe ping-pong (1 CPU)",
            Workload::Odirect => "O_DIRECT 4 KiB write/read",
            Workload::Tcp => "loopback TCP, 64 KiB sends",
            Workload::Uprobe => "uprobe: stand-in libcuda cuLaunchKernel",
            Workload::Paced => "paced getpid (record suite)",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Workload::Getpid => "syscall",
            Workload::Pingpong => "round trip (2 switches + 4 syscalls)",
            Workload::Odirect => "IO op (1 syscall + 1 block request)",
            Workload::Tcp => "send() call",
            Workload::Uprobe => "cuLaunchKernel call",
            Workload::Paced => "syscall",
        }
    }
}

/// Iterations (events) per workload run.
#[derive(Clone, Copy, Debug)]
pub struct Iters {
    pub getpid: u64,
    pub pingpong: u64,
    pub odirect: u64,
    /// 64 KiB sends: 16,384 is 1 GiB.
    pub tcp_sends: u64,
    /// cuLaunchKernel calls of the stand-in libcuda.
    pub uprobe: u64,
}

impl Iters {
    pub const FULL: Iters = Iters {
        getpid: 2_000_000,
        // Many round trips: the per-switch cost is half of a difference of two ping-pong
        // medians, so their noise matters twice.
        pingpong: 300_000,
        odirect: 20_000,
        tcp_sends: 16_384,
        // A uprobe hit costs microseconds (a trap into the kernel).
        uprobe: 500_000,
    };
    /// A smoke run: every path exercised, numbers too noisy to publish.
    pub const QUICK: Iters = Iters {
        getpid: 200_000,
        pingpong: 20_000,
        odirect: 2_000,
        tcp_sends: 2_048,
        uprobe: 50_000,
    };

    pub fn of(&self, w: Workload) -> u64 {
        match w {
            Workload::Getpid => self.getpid,
            Workload::Pingpong => self.pingpong,
            Workload::Odirect => self.odirect,
            Workload::Tcp => self.tcp_sends,
            Workload::Uprobe => self.uprobe,
            // Sized by the record suite itself.
            Workload::Paced => self.getpid,
        }
    }
}

/// What one run of a workload measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurement {
    pub elapsed_ns: u64,
    pub events: u64,
    /// Context switches of both processes during the timed loop (ping-pong), from getrusage.
    pub switches: Option<u64>,
    /// Requests completed by the file's block device during the timed loop (O_DIRECT), from
    /// its `stat` file in sysfs; other IO on the device counts too.
    pub block_requests: Option<u64>,
    /// Bytes the receiver got (TCP).
    pub bytes: Option<u64>,
    /// Calls the workload made in all, warm-up included (uprobe: what a tracer attached before
    /// the warm-up should count).
    pub calls: Option<u64>,
    /// What the tracer counted of those calls (uprobe under ethand: `gpu.launches` of the
    /// child in `ethand snapshot`); filled in by the bench, not by the workload.
    pub counted: Option<u64>,
}

impl Measurement {
    pub fn ns_per_event(&self) -> f64 {
        self.elapsed_ns as f64 / self.events as f64
    }

    /// The result line a workload prints: `elapsed_ns=N events=N [switches=N] ...`.
    fn to_line(&self) -> String {
        let mut line = format!("elapsed_ns={} events={}", self.elapsed_ns, self.events);
        for (key, value) in [
            ("switches", self.switches),
            ("block_requests", self.block_requests),
            ("bytes", self.bytes),
            ("calls", self.calls),
            ("counted", self.counted),
        ] {
            if let Some(v) = value {
                line.push_str(&format!(" {key}={v}"));
            }
        }
        line
    }

    fn parse(line: &str) -> Result<Measurement> {
        let mut m = Measurement::default();
        for field in line.split_whitespace() {
            let (key, value) = field
                .split_once('=')
                .with_context(|| format!("field {field:?} is not key=value"))?;
            let value: u64 = value
                .parse()
                .with_context(|| format!("field {field:?}: not a number"))?;
            match key {
                "elapsed_ns" => m.elapsed_ns = value,
                "events" => m.events = value,
                "switches" => m.switches = Some(value),
                "block_requests" => m.block_requests = Some(value),
                "bytes" => m.bytes = Some(value),
                "calls" => m.calls = Some(value),
                "counted" => m.counted = Some(value),
                _ => bail!("unknown field {key:?}"),
            }
        }
        ensure!(
            m.events > 0 && m.elapsed_ns > 0,
            "empty result line {line:?}"
        );
        Ok(m)
    }
}

/// Runs one workload in a child process (this same binary) and reads its result. For the
/// handshake workloads (`uprobe`, `paced`), see [`measure_handshake`].
pub fn measure(w: Workload, iters: u64, io_dir: &Path) -> Result<Measurement> {
    ensure!(
        !w.handshake(),
        "workload {} needs measure_handshake",
        w.name()
    );
    let exe = std::env::current_exe().context("finding xtask's own binary")?;
    let out = Command::new(&exe)
        .args(["workload", w.name(), "--iters", &iters.to_string()])
        .arg("--io-dir")
        .arg(io_dir)
        .output()
        .with_context(|| format!("starting workload {}", w.name()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "workload {} failed ({}): {}",
        w.name(),
        out.status,
        stderr.trim()
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("elapsed_ns="))
        .with_context(|| format!("workload {} printed no result: {stdout}", w.name()))?;
    Measurement::parse(line).with_context(|| format!("workload {}'s result", w.name()))
}

impl Workload {
    /// Whether the child waits for `go` on stdin after its set-up (see [`measure_handshake`]).
    pub fn handshake(self) -> bool {
        matches!(self, Workload::Uprobe | Workload::Paced)
    }
}

/// How long a handshake child may take for its set-up, and for its timed loop.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs a handshake workload: the child (pinned, set up, e.g. the library loaded) prints
/// `ready`, then waits for a line on stdin. `ready(pid)` runs then (e.g. waits until a tracer
/// has attached to what the child loaded, or starts one on its pid); then the child gets `go`
/// and runs its timed loop, prints its result line and waits for stdin to close; `done(pid, m)`
/// runs in between (e.g. reads what a tracer counted of the live child) and may fill in
/// `m.counted`. `args` are the child's extra arguments (`--lib PATH`, `--rate N`, ...).
pub fn measure_handshake(
    w: Workload,
    iters: u64,
    args: &[&OsStr],
    ready: impl FnOnce(u32) -> Result<()>,
    done: impl FnOnce(u32, &mut Measurement) -> Result<()>,
) -> Result<Measurement> {
    ensure!(w.handshake(), "workload {} has no handshake", w.name());
    let exe = std::env::current_exe().context("finding xtask's own binary")?;
    let mut cmd = Command::new(&exe);
    cmd.args(["workload", w.name(), "--iters", &iters.to_string()])
        .args(args);
    measure_child(w.name(), cmd, ready, done)
}

/// [`measure_handshake`] of any program that speaks its protocol (`name` for messages).
pub fn measure_child(
    name: &str,
    mut cmd: Command,
    ready: impl FnOnce(u32) -> Result<()>,
    done: impl FnOnce(u32, &mut Measurement) -> Result<()>,
) -> Result<Measurement> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting workload {name}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take().context("child stdin")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let stderr = child.stderr.take().context("child stderr")?;
    // Lines of stdout through a thread, so that waiting for them can time out.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_text = thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    let result = (|| -> Result<Measurement> {
        let next_line = |what: &str| -> Result<String> {
            rx.recv_timeout(CHILD_TIMEOUT)
                .map_err(|_| anyhow::anyhow!("workload {} exited or hung {what}", name))
        };
        let line = next_line("before it was ready")?;
        ensure!(
            line == "ready",
            "workload {}: expected `ready`, got {line:?}",
            name
        );
        ready(pid)?;
        stdin
            .write_all(b"go\n")
            .context("telling the workload to go")?;
        stdin.flush()?;
        let line = next_line("in its timed loop")?;
        let mut m =
            Measurement::parse(&line).with_context(|| format!("workload {}'s result", name))?;
        done(pid, &mut m)?;
        Ok(m)
    })();
    // Closing stdin lets the child exit.
    drop(stdin);
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().context("waiting for the workload")?;
    let stderr = err_text.join().unwrap_or_default();
    let m = result.with_context(|| format!("its stderr: {}", stderr.trim()))?;
    ensure!(
        status.success(),
        "workload {} failed ({status}): {}",
        name,
        stderr.trim()
    );
    Ok(m)
}

/// The file name of the stand-in libcuda: what userspace-probes recognizes as libcuda.
pub const CUDA_STANDIN_NAME: &str = "libcuda.so.1";

/// Compiles the stand-in libcuda of the end-to-end tests (tests/standins/cuda.c) into
/// `dir/libcuda.so.1`, as tests/src/standins.rs does.
pub fn build_cuda_standin(root: &Path, dir: &Path) -> Result<PathBuf> {
    let src = root.join("tests").join("standins");
    let out = dir.join(CUDA_STANDIN_NAME);
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let res = Command::new(&cc)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-fno-inline",
            "-fno-ipa-icf",
            "-Wall",
        ])
        .arg(format!("-Wl,-soname,{CUDA_STANDIN_NAME}"))
        .arg("-o")
        .arg(&out)
        .arg(src.join("cuda.c"))
        .output()
        .with_context(|| {
            format!(
                "running {} (a C compiler is needed for the uprobe workload)",
                cc.to_string_lossy()
            )
        })?;
    ensure!(
        res.status.success(),
        "compiling the stand-in libcuda ({}) failed: {}",
        src.join("cuda.c").display(),
        String::from_utf8_lossy(&res.stderr).trim()
    );
    Ok(out)
}

#[derive(clap::Args)]
pub struct WorkloadArgs {
    #[arg(value_enum)]
    workload: Workload,
    /// Events to time.
    #[arg(long)]
    iters: u64,
    /// Directory of the O_DIRECT file: a real block-backed file system (not tmpfs).
    #[arg(long, default_value = DEFAULT_IO_DIR)]
    io_dir: PathBuf,
    /// uprobe: the stand-in libcuda to dlopen.
    #[arg(long)]
    lib: Option<PathBuf>,
    /// paced: getpid calls per second in total (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// paced: threads, each pinned to its own CPU (the last ones allowed).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// The child side: runs the workload and prints its result line.
///
/// Every workload runs pinned to one CPU (the last one allowed), with everything it creates
/// (the ping-pong's second process, the TCP receiver thread): the whole event path, tracer
/// included, is then serialized on that CPU, and elapsed time is its cost rather than whatever
/// parallelism and migrations hide or add.
pub fn run(args: WorkloadArgs) -> Result<()> {
    ensure!(args.iters > 0, "--iters must be at least 1");
    let cpus = allowed_cpus()?;
    if args.workload == Workload::Paced {
        return paced(args.iters, args.rate, args.threads, &cpus);
    }
    pin_to(cpus[cpus.len() - 1])?;
    let m = match args.workload {
        Workload::Getpid => getpid(args.iters),
        Workload::Pingpong => pingpong(args.iters)?,
        Workload::Odirect => odirect(args.iters, &args.io_dir)?,
        Workload::Tcp => tcp(args.iters)?,
        Workload::Uprobe => {
            return uprobe(
                args.iters,
                args.lib.as_deref().context("uprobe needs --lib")?,
            );
        }
        Workload::Paced => unreachable!(),
    };
    println!("{}", m.to_line());
    Ok(())
}

/// The child's side of the handshake: `ready`, then wait for `go`.
fn handshake_ready() -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut line = String::new();
    io::stdin()
        .read_line(&mut line)
        .context("waiting for `go`")?;
    ensure!(line.trim() == "go", "expected `go` on stdin, got {line:?}");
    Ok(())
}

/// The child's side after its timed loop: the result line, then wait until stdin closes (the
/// bench may read what a tracer counted of this process meanwhile).
fn handshake_result(m: &Measurement) -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{}", m.to_line())?;
    out.flush()?;
    let mut rest = String::new();
    let _ = io::stdin().read_to_string(&mut rest);
    Ok(())
}

/// `CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ, blockDimX,
/// blockDimY, blockDimZ, unsigned sharedMemBytes, CUstream hStream, void **kernelParams,
/// void **extra)`.
type CuLaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;

/// dlopen the stand-in libcuda, handshake (the tracer attaches meanwhile), then call
/// cuLaunchKernel: a warm-up of a tenth, then `iters` timed calls.
fn uprobe(iters: u64, lib: &Path) -> Result<()> {
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).context("library path")?;
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        bail!("dlopen {}: {}", lib.display(), why.to_string_lossy());
    }
    let sym = unsafe { libc::dlsym(handle, c"cuLaunchKernel".as_ptr()) };
    ensure!(!sym.is_null(), "{} has no cuLaunchKernel", lib.display());
    let launch: CuLaunchKernel = unsafe { mem::transmute::<*mut c_void, CuLaunchKernel>(sym) };
    // Arguments the stand-in accepts (it reads none): a fake function handle, a 1x1x1 grid of
    // 128 threads, the default stream, no parameters.
    let func = 0x1000 as *mut c_void;
    let once = || {
        let rc = unsafe {
            launch(
                hint::black_box(func),
                1,
                1,
                1,
                128,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        hint::black_box(rc) == 0
    };
    handshake_ready()?;
    let warmup = iters / 10;
    let mut ok = (0..warmup).all(|_| once());
    let start = Instant::now();
    ok = ok && (0..iters).all(|_| once());
    let elapsed_ns = start.elapsed().as_nanos() as u64;
    ensure!(ok, "cuLaunchKernel of the stand-in failed");
    handshake_result(&Measurement {
        elapsed_ns,
        events: iters,
        calls: Some(warmup + iters),
        ..Measurement::default()
    })
}

/// `iters` getpid calls over `threads` threads, each pinned to one of the last `threads` CPUs
/// allowed, paced at `rate` calls/s in total (0: unpaced). Timed from `go` to the last thread's
/// end; no warm-up (every call is an event the record suite counts).
fn paced(iters: u64, rate: u64, threads: usize, cpus: &[usize]) -> Result<()> {
    ensure!(
        threads >= 1 && threads <= cpus.len(),
        "--threads {threads}: {} CPU(s) allowed",
        cpus.len()
    );
    let per_thread = iters / threads as u64;
    ensure!(per_thread > 0, "--iters {iters} is less than --threads");
    // Pin the main thread where the first worker runs (it only waits).
    pin_to(cpus[cpus.len() - threads])?;
    let spawn_worker = |k: usize, barrier: std::sync::Arc<std::sync::Barrier>| {
        let cpu = cpus[cpus.len() - threads + k];
        thread::spawn(move || -> Result<u64> {
            pin_to(cpu)?;
            barrier.wait();
            let start = Instant::now();
            // Paced: batches of 64 calls, each not before its time on the schedule.
            const BATCH: u64 = 64;
            let ns_per_call = if rate == 0 {
                0.0
            } else {
                1e9 * threads as f64 / rate as f64
            };
            let mut done = 0;
            while done < per_thread {
                if rate != 0 {
                    let due = Duration::from_nanos((done as f64 * ns_per_call) as u64);
                    while start.elapsed() < due {
                        hint::spin_loop();
                    }
                }
                let n = BATCH.min(per_thread - done);
                for _ in 0..n {
                    hint::black_box(unsafe { libc::syscall(libc::SYS_getpid) });
                }
                done += n;
            }
            Ok(start.elapsed().as_nanos() as u64)
        })
    };
    handshake_ready()?;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|k| spawn_worker(k, barrier.clone()))
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
    }
    let elapsed_ns = start.elapsed().as_nanos() as u64;
    let total = per_thread * threads as u64;
    handshake_result(&Measurement {
        elapsed_ns,
        events: total,
        calls: Some(total),
        ..Measurement::default()
    })
}

fn getpid(iters: u64) -> Measurement {
    let once = || hint::black_box(unsafe { libc::syscall(libc::SYS_getpid) });
    for _ in 0..iters / 10 {
        once();
    }
    let start = Instant::now();
    for _ in 0..iters {
        once();
    }
    Measurement {
        elapsed_ns: start.elapsed().as_nanos() as u64,
        events: iters,
        ..Measurement::default()
    }
}

fn pingpong(iters: u64) -> Result<Measurement> {
    const WARMUP: u64 = 1_000;
    // Both processes share the CPU that `run` pinned us to: every hand-over is a context
    // switch, never a cross-CPU wake-up.
    let (to_child_r, to_child_w) = pipe()?;
    let (to_parent_r, to_parent_w) = pipe()?;

    // SAFETY: this process is single-threaded (the workload child of the bench), and the
    // forked child only calls async-signal-safe functions before `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        let mut ok = (0..WARMUP).all(|_| echo(to_child_r, to_parent_w));
        let before = switches_self();
        ok = ok && (0..iters).all(|_| echo(to_child_r, to_parent_w));
        // Tell the parent how many switches the child had in the timed loop.
        let switches = (switches_self() - before).to_ne_bytes();
        ok = ok && write_all(to_parent_w, &switches);
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    unsafe {
        libc::close(to_child_r);
        libc::close(to_parent_w);
    }

    let round_trip = || write_all(to_child_w, &[1]) && read_exact(to_parent_r, &mut [0]);
    let ok = (0..WARMUP).all(|_| round_trip());
    let before = switches_self();
    let start = Instant::now();
    let ok = ok && (0..iters).all(|_| round_trip());
    let elapsed_ns = start.elapsed().as_nanos() as u64;
    let parent_switches = switches_self() - before;
    let mut child_switches = [0u8; 8];
    let ok = ok && read_exact(to_parent_r, &mut child_switches);
    // Closing our end makes a child still waiting in read() see EOF and exit.
    unsafe {
        libc::close(to_child_w);
        libc::close(to_parent_r);
    }

    let mut status = 0;
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(io::Error::last_os_error()).context("waiting for the ping-pong child");
    }
    ensure!(
        ok && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the ping-pong broke off (pipe error or child failure, wait status {status})"
    );
    Ok(Measurement {
        elapsed_ns,
        events: iters,
        switches: Some(parent_switches + u64::from_ne_bytes(child_switches)),
        ..Measurement::default()
    })
}

/// The CPUs this thread may run on, in increasing order.
fn allowed_cpus() -> Result<Vec<usize>> {
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, mem::size_of_val(&set), &mut set) } != 0 {
        return Err(io::Error::last_os_error()).context("sched_getaffinity");
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    ensure!(!cpus.is_empty(), "empty CPU affinity mask");
    Ok(cpus)
}

/// Pins the calling thread (and the threads and processes it creates later) to `cpu`.
fn pin_to(cpu: usize) -> Result<()> {
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    if unsafe { libc::sched_setaffinity(0, mem::size_of_val(&set), &set) } != 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("pinning to CPU {cpu}"));
    }
    Ok(())
}

fn pipe() -> Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error()).context("pipe");
    }
    Ok((fds[0], fds[1]))
}

/// The ping-pong child's half of a round trip.
fn echo(from: libc::c_int, to: libc::c_int) -> bool {
    let mut byte = [0u8];
    read_exact(from, &mut byte) && write_all(to, &byte)
}

// Raw read/write: the forked child may not allocate or take locks.
fn read_exact(fd: libc::c_int, buf: &mut [u8]) -> bool {
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) == buf.len() as isize }
}

fn write_all(fd: libc::c_int, buf: &[u8]) -> bool {
    unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) == buf.len() as isize }
}

/// Voluntary plus involuntary context switches of this process so far.
fn switches_self() -> u64 {
    let mut ru: libc::rusage = unsafe { mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    (ru.ru_nvcsw + ru.ru_nivcsw) as u64
}

fn odirect(iters: u64, dir: &Path) -> Result<Measurement> {
    let path = dir.join(format!("ethand-bench-odirect.{}", process::id()));
    let _remove = RemoveOnDrop(&path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .with_context(|| {
            format!(
                "opening {} with O_DIRECT (it needs a block-backed file system, not tmpfs)",
                path.display()
            )
        })?;
    let mut buf = AlignedBlock::new();
    buf.as_mut().fill(0xa5);
    // Allocate every block first: the timed loop then overwrites in place.
    for block in 0..IO_FILE_BLOCKS {
        pwrite(&file, buf.as_mut(), block)?;
    }
    file.sync_all().context("fsync of the O_DIRECT file")?;

    let device_stat = block_device_stat(&file)?;
    let requests_before = block_requests(&device_stat)?;
    let start = Instant::now();
    for op in 0..iters {
        let block = (op / 2) % IO_FILE_BLOCKS;
        if op % 2 == 0 {
            pwrite(&file, buf.as_mut(), block)?;
        } else {
            pread(&file, buf.as_mut(), block)?;
        }
    }
    let elapsed_ns = start.elapsed().as_nanos() as u64;
    let requests = block_requests(&device_stat)? - requests_before;
    Ok(Measurement {
        elapsed_ns,
        events: iters,
        block_requests: Some(requests),
        ..Measurement::default()
    })
}

fn pwrite(file: &File, buf: &mut [u8], block: u64) -> Result<()> {
    let off = (block * IO_BLOCK as u64) as libc::off_t;
    let n = unsafe { libc::pwrite(file.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) };
    ensure!(
        n == buf.len() as isize,
        "O_DIRECT pwrite: {}",
        io::Error::last_os_error()
    );
    Ok(())
}

fn pread(file: &File, buf: &mut [u8], block: u64) -> Result<()> {
    let off = (block * IO_BLOCK as u64) as libc::off_t;
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) };
    ensure!(
        n == buf.len() as isize,
        "O_DIRECT pread: {}",
        io::Error::last_os_error()
    );
    Ok(())
}

/// The sysfs `stat` file of the block device that holds `file`.
fn block_device_stat(file: &File) -> Result<PathBuf> {
    let dev = file.metadata()?.dev();
    let path = PathBuf::from(format!(
        "/sys/dev/block/{}:{}/stat",
        libc::major(dev),
        libc::minor(dev)
    ));
    ensure!(
        path.exists(),
        "{} is missing: is the O_DIRECT file on a block device?",
        path.display()
    );
    Ok(path)
}

/// Completed reads plus completed writes (fields 1 and 5 of a block device's stat file).
fn block_requests(stat: &Path) -> Result<u64> {
    let text = fs::read_to_string(stat).with_context(|| format!("reading {}", stat.display()))?;
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    ensure!(fields.len() >= 5, "unexpected {}: {text:?}", stat.display());
    Ok(fields[0] + fields[4])
}

/// One 4 KiB block aligned to 4 KiB, as O_DIRECT requires.
struct AlignedBlock(*mut u8);

impl AlignedBlock {
    const LAYOUT: std::alloc::Layout = match std::alloc::Layout::from_size_align(IO_BLOCK, IO_BLOCK)
    {
        Ok(layout) => layout,
        Err(_) => panic!("bad layout"),
    };

    fn new() -> Self {
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::LAYOUT) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(Self::LAYOUT);
        }
        AlignedBlock(ptr)
    }

    fn as_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.0, IO_BLOCK) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        unsafe { std::alloc::dealloc(self.0, Self::LAYOUT) };
    }
}

struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0);
    }
}

fn tcp(sends: u64) -> Result<Measurement> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback listener")?;
    let addr = listener.local_addr()?;
    let receiver = thread::spawn(move || -> io::Result<u64> {
        let (mut stream, _) = listener.accept()?;
        let mut buf = vec![0u8; TCP_CHUNK];
        let mut received = 0;
        loop {
            match stream.read(&mut buf)? {
                0 => return Ok(received),
                n => received += n as u64,
            }
        }
    });
    let mut stream = TcpStream::connect(addr).context("connecting over loopback")?;
    let buf = vec![0xa5u8; TCP_CHUNK];
    let total = sends * TCP_CHUNK as u64;
    let (mut sent, mut calls) = (0u64, 0u64);

    let start = Instant::now();
    while sent < total {
        let len = (total - sent).min(TCP_CHUNK as u64) as usize;
        sent += stream.write(&buf[..len]).context("send")? as u64;
        calls += 1;
    }
    stream.shutdown(Shutdown::Write)?;
    let received = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the TCP receiver thread panicked"))?
        .context("TCP receiver")?;
    let elapsed_ns = start.elapsed().as_nanos() as u64;

    ensure!(received == total, "sent {total} bytes, received {received}");
    Ok(Measurement {
        elapsed_ns,
        events: calls,
        bytes: Some(received),
        ..Measurement::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_line_round_trips() {
        let m = Measurement {
            elapsed_ns: 123_456,
            events: 1000,
            switches: Some(2000),
            block_requests: None,
            bytes: Some(65536),
            calls: Some(1100),
            counted: None,
        };
        assert_eq!(Measurement::parse(&m.to_line()).unwrap(), m);
        assert!(Measurement::parse("elapsed_ns=1 events=0").is_err());
        assert!(Measurement::parse("elapsed_ns=1 events=2 color=3").is_err());
    }
}
