//! Helpers of ethand's end-to-end tests: start and stop a real daemon, query it through the
//! CLI, and drive workloads (the `ethand-workload` binary of this crate) whose work is known
//! exactly, so that tests compare ethand's numbers with ground truth.
//!
//! The tests need root (they load BPF programs) and a built daemon:
//! `cargo build --release -p ethand`, or `ETHAND_BIN=/path/to/ethand`.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU16, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

pub use ethand_snapshot::{
    BlockStats, NetStats, ProbeState, ProbeStatus, ProcessSnapshot, SelfStatus, SyscallRow,
    TreeSnapshot,
};

pub mod cprog;
pub mod prometheus_server;
pub mod standins;
/// The daemon's collection interval in every test.
pub const INTERVAL_MS: u64 = 200;
/// How long to wait for the daemon to have read the maps after the workload went quiet:
/// four collection intervals.
pub const SETTLE: Duration = Duration::from_millis(4 * INTERVAL_MS);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
const WORKLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Serializes the tests of one binary: each starts its own BPF daemon and measures timing on
/// a small machine. A test that panicked poisons nothing for the next one.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ethand binary: `$ETHAND_BIN`, else `<workspace>/target/release/ethand`.
pub fn ethand_bin() -> PathBuf {
    let p = match std::env::var_os("ETHAND_BIN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/ethand"),
    };
    assert!(
        p.is_file(),
        "no ethand binary at {}: build it first: cargo build --release -p ethand",
        p.display()
    );
    p
}

/// A unique path under /tmp for this test process: /tmp/ethand-test-NAME-PID.EXT.
pub fn temp_path(name: &str, ext: &str) -> PathBuf {
    PathBuf::from(format!(
        "/tmp/ethand-test-{name}-{}.{ext}",
        std::process::id()
    ))
}

/// The next free loopback port from 19500 on (each daemon gets its own).
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(19500);
    loop {
        let p = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(p < 19900, "no free port in 19500..19900");
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// Runs `cmd` to completion with a time limit, capturing stdout and stderr. Panics on timeout.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// `ethand ARGS` with a time limit.
pub fn ethand(args: &[&str]) -> Output {
    run_with_timeout(
        Command::new(ethand_bin())
            .args(args)
            .env_remove("ETHAND_CONFIG"),
        CLI_TIMEOUT,
    )
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `promtool check metrics` on an exposition: it must pass with no complaint (lint included).
pub fn promtool_check(body: &str) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool on PATH");
    p.stdin
        .take()
        .expect("piped")
        .write_all(body.as_bytes())
        .expect("feed promtool");
    let out = p.wait_with_output().expect("promtool");
    let complaints = format!("{}{}", text(&out.stdout), text(&out.stderr));
    eprintln!(
        "observed: promtool {} on {} bytes: {complaints:?}",
        out.status,
        body.len()
    );
    assert!(
        out.status.success() && complaints.trim().is_empty(),
        "promtool check metrics: {}\n{complaints}",
        out.status
    );
}

/// A running `ethand run` with its own config, socket and metrics port. Stopped (SIGTERM,
/// then SIGKILL after 10 s) and cleaned up on drop.
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    pub port: u16,
}

impl Daemon {
    /// Starts a daemon (interval 200 ms, its own socket and /metrics port) with the keys of
    /// `extra_toml` added to its config, and waits until `ethand status` answers.
    pub fn start(name: &str, extra_toml: &str) -> Self {
        Self::start_with(name, extra_toml, &[], &[])
    }

    /// As [`Daemon::start`], run through `wrapper` (e.g. `setpriv ...`: the program and its
    /// arguments, ethand's command line appended) with `env` added to its environment.
    pub fn start_with(
        name: &str,
        extra_toml: &str,
        wrapper: &[String],
        env: &[(&str, String)],
    ) -> Self {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the end-to-end tests load BPF programs: run them as root"
        );
        let socket = temp_path(name, "sock");
        let config = temp_path(name, "toml");
        let log = temp_path(name, "log");
        let port = free_port();
        // Tests switch GPU levels back to back; the rate limit has a test of its own.
        // The CUPTI library and its control file go to a directory of the test's own.
        let cupti_dir = temp_path(name, "cupti");
        let base = format!(
            "[daemon]\ninterval_ms = {INTERVAL_MS}\nsocket = {socket:?}\nlevel_switch_interval_seconds = 0\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\n[gpu]\ncupti_dir = {cupti_dir:?}\n"
        );
        let toml = merge_tables(&base, extra_toml);
        fs::write(&config, toml).expect("write config");
        let logf = fs::File::create(&log).expect("create log");
        let mut cmd = match wrapper.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(ethand_bin());
                c
            }
            None => Command::new(ethand_bin()),
        };
        let child = cmd
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["run", "--config"])
            .arg(&config)
            .env_remove("ETHAND_CONFIG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("dup log"))
            .stderr(logf)
            .spawn()
            .expect("spawn ethand run");
        let mut d = Self {
            child: Some(child),
            socket,
            config,
            log,
            port,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .expect("running")
                .try_wait()
                .expect("try_wait")
            {
                panic!(
                    "ethand run exited during startup ({st}); log:\n{}",
                    self.log_text()
                );
            }
            let ok = Command::new(ethand_bin())
                .args(["status", "--socket"])
                .arg(&self.socket)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            assert!(
                t0.elapsed() < READY_TIMEOUT,
                "ethand not ready after {READY_TIMEOUT:?}; log:\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(100));
        }
        // The socket answers just before the "ready" line is logged.
        let t1 = Instant::now();
        while !self.log_text().contains(" ready ") {
            assert!(
                t1.elapsed() < Duration::from_secs(5),
                "ethand answers but never logged \"ready\"; log:\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The daemon's log so far (stderr and stdout).
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `ethand ARGS --socket S`.
    pub fn cli(&self, args: &[&str]) -> Output {
        let sock = self.socket.to_str().expect("utf-8 path");
        let mut all = args.to_vec();
        all.extend(["--socket", sock]);
        ethand(&all)
    }

    /// `ethand status --json`.
    pub fn status(&self) -> SelfStatus {
        let out = self.cli(&["status", "--json"]);
        assert!(
            out.status.success(),
            "ethand status --json failed ({}): {}",
            out.status,
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ethand status --json is not a SelfStatus: {e}\n{}",
                text(&out.stdout)
            )
        })
    }

    /// `ethand snapshot --pid PID --json` from this daemon.
    pub fn snapshot(&self, pid: u32) -> TreeSnapshot {
        let out = self.cli(&["snapshot", "--pid", &pid.to_string(), "--json"]);
        assert!(
            out.status.success(),
            "ethand snapshot --pid {pid} failed ({}): {}",
            out.status,
            text(&out.stderr)
        );
        let t: TreeSnapshot = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ethand snapshot --json is not a TreeSnapshot: {e}\n{}",
                text(&out.stdout)
            )
        });
        assert_eq!(
            t.source,
            ethand_snapshot::SnapshotSource::Daemon,
            "snapshot source with a daemon running"
        );
        assert_eq!(t.root_pid, pid);
        t
    }

    /// GET /metrics (HTTP/1.0): the body.
    pub fn metrics(&self) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to /metrics");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("send request");
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).expect("read response");
        let resp = text(&resp);
        let (head, body) = resp
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP header end in {resp:?}"));
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "GET /metrics: {head}"
        );
        body.to_string()
    }
}

impl Daemon {
    /// SIGTERM, then waits up to `limit` for the exit: how long it took and the exit status,
    /// or None if it was still running (then it is killed).
    pub fn terminate(&mut self, limit: Duration) -> Option<(Duration, ExitStatus)> {
        let mut child = self.child.take()?;
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().ok().flatten() {
                return Some((t0.elapsed(), st));
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    eprintln!("ethand did not stop within 10 s of SIGTERM: killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        if thread::panicking() {
            eprintln!(
                "---- ethand log ({}), routine lines left out ----\n{}",
                self.log.display(),
                log_excerpt(&self.log_text())
            );
        }
        for p in [&self.socket, &self.config, &self.log] {
            let _ = fs::remove_file(p);
        }
    }
}

/// A failed test's daemon log, short enough that CI's truncated output keeps the other
/// failures: without the per-probe "attached" lines, each line cut at 300 characters.
fn log_excerpt(log: &str) -> String {
    log.lines()
        .filter(|l| !(l.contains(" INFO ") && l.contains(": attached probe=")))
        .map(|l| match l.char_indices().nth(300) {
            Some((i, _)) => format!("{} [...]", &l[..i]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `base` with the keys of `extra` added, table by table (both are "[table]" headers followed
/// by `key = value` lines; TOML allows each header and key only once): a key of `extra` that
/// `base` has replaces it.
pub fn merge_tables(base: &str, extra: &str) -> String {
    let mut tables: Vec<(String, Vec<String>)> = Vec::new();
    for text in [base, extra] {
        let mut current = String::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if line.starts_with('[') {
                current = line.to_string();
                if !tables.iter().any(|(h, _)| *h == current) {
                    tables.push((current.clone(), Vec::new()));
                }
            } else {
                let Some((_, lines)) = tables.iter_mut().find(|(h, _)| *h == current) else {
                    panic!("config line {line:?} before any [table]");
                };
                let key = |l: &str| l.split('=').next().unwrap_or("").trim().to_string();
                match lines.iter_mut().find(|l| key(l) == key(line)) {
                    Some(l) => *l = line.to_string(),
                    None => lines.push(line.to_string()),
                }
            }
        }
    }
    tables
        .iter()
        .map(|(h, lines)| format!("{h}\n{}\n", lines.join("\n")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a workload printed after `ready` or `done`: `key=value` pairs.
#[derive(Debug, Default, Clone)]
pub struct Report(pub BTreeMap<String, String>);

impl Report {
    fn parse(rest: &str) -> Self {
        Self(
            rest.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    pub fn u64(&self, key: &str) -> u64 {
        let v = self
            .0
            .get(key)
            .unwrap_or_else(|| panic!("workload reported no {key}: {:?}", self.0));
        v.parse()
            .unwrap_or_else(|_| panic!("workload's {key}={v} is not a number"))
    }
}

/// A running `ethand-workload MODE ARGS` (see that binary for the protocol). Killed on drop.
pub struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    pub pid: u32,
    what: String,
    /// What it printed with `ready`.
    pub ready: Report,
}

impl Workload {
    /// Starts the workload and waits for its `ready` line.
    pub fn start(bin: &str, args: &[&str]) -> Self {
        let what = format!("ethand-workload {}", args.join(" "));
        let mut cmd = Command::new(bin);
        cmd.args(args);
        Self::spawn(cmd, what)
    }

    /// Spawns `cmd` with piped stdin/stdout and waits for its `ready` line.
    fn spawn(mut cmd: Command, what: String) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let pid = child.id();
        let mut w = Self {
            child,
            stdin,
            lines,
            pid,
            what,
            ready: Report::default(),
        };
        w.ready = w.expect_line("ready");
        w
    }

    fn expect_line(&mut self, word: &str) -> Report {
        let line = self
            .lines
            .recv_timeout(WORKLOAD_TIMEOUT)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: no `{word}` line ({e}); exit status {:?}",
                    self.what,
                    self.child.try_wait()
                )
            });
        let rest = line
            .strip_prefix(word)
            .unwrap_or_else(|| panic!("{}: expected `{word} ...`, got {line:?}", self.what));
        Report::parse(rest)
    }

    /// Sends `go` and waits for `done`; returns what the workload reported.
    pub fn go(&mut self) -> Report {
        self.send_byte();
        self.expect_line("done")
    }

    /// Sends one byte: `go`, or `stop` for the workloads that run until told.
    pub fn send_byte(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(b"g")
            .and_then(|()| stdin.flush())
            .expect("write to workload stdin");
    }

    /// Sends `stop` to a workload that runs until told (after `send_byte` started it) and
    /// waits for its `done`.
    pub fn stop(&mut self) -> Report {
        self.send_byte();
        self.expect_line("done")
    }

    /// Closes stdin (the workload cleans up and exits) and waits for a successful exit.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let t0 = Instant::now();
        let status: ExitStatus = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                t0.elapsed() < WORKLOAD_TIMEOUT,
                "{} did not exit after its stdin closed",
                self.what
            );
            thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{} failed: {status}", self.what);
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Snapshots of a workload's process tree around its measured work: settle, snapshot, `go`,
/// `done`, settle, snapshot. Counters are cumulative, so `after - before` is the work's.
pub struct Measured {
    pub before: TreeSnapshot,
    pub after: TreeSnapshot,
    pub done: Report,
}

pub fn measure(d: &Daemon, w: &mut Workload) -> Measured {
    thread::sleep(SETTLE);
    let before = d.snapshot(w.pid);
    let done = w.go();
    thread::sleep(SETTLE);
    let after = d.snapshot(w.pid);
    Measured {
        before,
        after,
        done,
    }
}

impl Measured {
    /// The process `pid` in the `after` snapshot and in `before` (default: not there yet).
    pub fn proc_pair(&self, pid: u32) -> (ProcessSnapshot, &ProcessSnapshot) {
        let after = find_proc(&self.after, pid);
        let before = self
            .before
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .cloned()
            .unwrap_or_default();
        (before, after)
    }

    /// Change of syscall `nr`'s (count, errors) in process `pid`.
    pub fn syscall_delta(&self, pid: u32, nr: i64) -> (u64, u64) {
        let (b, a) = self.proc_pair(pid);
        let (cb, eb) = syscall(&b, nr);
        let (ca, ea) = syscall(a, nr);
        (ca - cb, ea - eb)
    }
}

pub fn find_proc(t: &TreeSnapshot, pid: u32) -> &ProcessSnapshot {
    t.processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| {
            panic!(
                "pid {pid} not in the snapshot of {}: {:?}",
                t.root_pid,
                t.processes.iter().map(|p| p.pid).collect::<Vec<_>>()
            )
        })
}

/// (count, errors) of syscall `nr` in a process (0, 0 when it made none).
pub fn syscall(p: &ProcessSnapshot, nr: i64) -> (u64, u64) {
    p.syscalls
        .by_nr
        .iter()
        .find(|r| i64::from(r.nr) == nr)
        .map_or((0, 0), |r| (r.count, r.errors))
}

/// Count of a syscall latency class in a process (0 when absent).
pub fn latency_class_count(p: &ProcessSnapshot, class: &str) -> u64 {
    p.syscalls
        .latency
        .iter()
        .find(|h| h.class == class)
        .map_or(0, |h| h.count)
}

/// Asserts that `sched_wakeup` is left unattached as not needed: this machine's kernel keeps
/// run-queue waits itself (`sched_info.run_delay`, CONFIG_SCHED_INFO), which ethand reads at
/// each switch instead of timing waits from a program on every wakeup.
pub fn assert_wakeup_not_needed(probes: &[ProbeStatus]) {
    let p = probe(probes, "sched_wakeup");
    assert!(
        p.state == ProbeState::Disabled && p.detail.starts_with("not needed"),
        "sched_wakeup should be left unattached as not needed: {p:?}"
    );
}

pub fn probe<'a>(probes: &'a [ProbeStatus], name: &str) -> &'a ProbeStatus {
    probes
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no probe {name} in {probes:?}"))
}

/// Per live thread of `pid`, the kernel's scheduler statistics
/// (/proc/PID/task/TID/schedstat): `sum_exec_runtime` (field 1), `run_delay` (field 2,
/// wake-to-run and preempted-to-run time) and `pcount` (field 3, the runs that followed such
/// a wait).
pub fn kernel_schedstat(pid: u32) -> std::collections::BTreeMap<u32, KernelSchedstat> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .flatten()
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse().ok()?;
            let s = fs::read_to_string(e.path().join("schedstat")).ok()?;
            Some((tid, KernelSchedstat::parse(&s)?))
        })
        .collect()
}

/// The same statistics of `pid`'s main thread (/proc/PID/schedstat): the whole process for
/// a single-threaded workload.
pub fn kernel_schedstat_main(pid: u32) -> KernelSchedstat {
    let s = fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
    KernelSchedstat::parse(&s).unwrap_or_else(|| panic!("/proc/{pid}/schedstat: {s:?}"))
}

impl KernelSchedstat {
    /// The three fields of a schedstat file.
    fn parse(s: &str) -> Option<Self> {
        let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
        Some(Self {
            oncpu_ns: f.next()??,
            run_delay_ns: f.next()??,
            runs: f.next()??,
        })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelSchedstat {
    pub oncpu_ns: u64,
    pub run_delay_ns: u64,
    pub runs: u64,
}

/// Threads of `pid` and their (voluntary, involuntary) context switches as the kernel counts
/// them (/proc/PID/task/*/status), summed.
pub fn kernel_switches(pid: u32) -> (u64, u64) {
    let mut total = (0, 0);
    for e in fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .flatten()
    {
        let Ok(s) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |name: &str| -> u64 {
            s.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        total.0 += field("voluntary_ctxt_switches:");
        total.1 += field("nonvoluntary_ctxt_switches:");
    }
    total
}

/// A path that is removed on drop (the workload removes its files itself unless killed).
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A loop block device that only the test's workload uses, backed by a file in /var/tmp;
/// detached and its file removed when the test ends.
///
/// On the disk behind /var/tmp, other processes' IO (the journal, writeback of files other
/// tests wrote) shares the queue with a workload's: the kernel may merge a bio of one process
/// into another's request, which is then charged to the process that created it. A test of
/// exact bytes per process needs a device where the workload's requests are the only ones.
pub struct ScratchDisk {
    /// The device node, "/dev/loopN".
    pub node: PathBuf,
    /// "major:minor", as the block tracepoints report it.
    pub dev: String,
    backing: PathBuf,
}

impl ScratchDisk {
    pub fn new(tag: &str, mib: u64) -> Self {
        let backing = PathBuf::from(format!(
            "/var/tmp/ethand-test-scratch-{tag}-{}.img",
            std::process::id()
        ));
        let f = fs::File::create(&backing)
            .unwrap_or_else(|e| panic!("create {}: {e}", backing.display()));
        f.set_len(mib << 20).expect("size the backing file");
        drop(f);
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&backing)
            .output()
            .expect("run losetup (util-linux)");
        if !out.status.success() {
            let _ = fs::remove_file(&backing);
            panic!(
                "losetup --find --show {}: {}",
                backing.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let node = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        // udev probes a new block device (blkid reads it): let that finish before the
        // workload starts. Without udev, settle fails at once and nothing probes it.
        let _ = Command::new("udevadm")
            .args(["settle", "--timeout=10"])
            .status();
        let md = fs::metadata(&node).unwrap_or_else(|e| panic!("stat {}: {e}", node.display()));
        let rdev = std::os::unix::fs::MetadataExt::rdev(&md);
        let dev = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
        ScratchDisk { node, dev, backing }
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.node).status();
        let _ = fs::remove_file(&self.backing);
    }
}

/// A child process killed and reaped when the test ends, passed or not.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// "major:minor" of the whole disk holding `path` (as the block tracepoints report it).
pub fn disk_of(path: &Path) -> String {
    let md = fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    let dev = std::os::unix::fs::MetadataExt::dev(&md);
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    if sys.join("partition").exists() {
        // A partition: the parent directory is the disk.
        let disk = fs::canonicalize(&sys)
            .expect("sysfs link")
            .parent()
            .expect("parent")
            .join("dev");
        return fs::read_to_string(disk)
            .expect("disk dev")
            .trim()
            .to_string();
    }
    format!("{maj}:{min}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_tables_adds_keys_to_existing_and_new_tables() {
        let m = merge_tables(
            "[daemon]\na = 1\n[prometheus]\nb = 2\n",
            "[prometheus]\nc = 3\n\n[probes.tracepoints]\nd = \"x/y\"\n",
        );
        assert_eq!(
            m,
            "[daemon]\na = 1\n\n[prometheus]\nb = 2\nc = 3\n\n[probes.tracepoints]\nd = \"x/y\"\n"
        );
    }

    #[test]
    fn merge_tables_extra_key_replaces_the_base_one() {
        let m = merge_tables(
            "[daemon]\ninterval_ms = 200\nsocket = \"s\"\n",
            "[daemon]\ninterval_ms = 1000\n",
        );
        assert_eq!(m, "[daemon]\ninterval_ms = 1000\nsocket = \"s\"\n");
    }

    #[test]
    fn report_parses_key_values() {
        let r = Report::parse(" a=1 b=x");
        assert_eq!(r.u64("a"), 1);
        assert_eq!(r.0["b"], "x");
    }
}

impl Daemon {
    /// SIGKILL (the daemon cleans nothing up) and reap: the exit status. Its socket, config
    /// and log files stay until drop.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Workload {
    /// Waits for the workload's next line, which must start with `word` (e.g. `at`, the
    /// pause points of `ethand-load getpid-spread`), and returns its `key=value` pairs.
    pub fn expect(&mut self, word: &str) -> Report {
        self.expect_line(word)
    }
}

/// Resident memory of a process (VmRSS of /proc/PID/status), bytes; 0 when unreadable.
pub fn rss_bytes(pid: u32) -> u64 {
    vm_bytes(pid, "VmRSS")
}

/// The value of the sample `series` (its full text up to the value: name and labels as
/// exposed) in a /metrics body.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The peak resident memory of `pid` so far (`VmHWM`), in bytes (0 when unreadable).
pub fn peak_rss_bytes(pid: u32) -> u64 {
    vm_bytes(pid, "VmHWM")
}

fn vm_bytes(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.0): (status line, body), or the I/O error.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let resp = text(&resp);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

impl Workload {
    /// Starts `program` (any bytes: the path need not be UTF-8) with `argv0` as its argv[0]
    /// and `args`, and waits for its `ready` line.
    pub fn start_os(
        program: &std::ffi::OsStr,
        argv0: &std::ffi::OsStr,
        args: &[&std::ffi::OsStr],
    ) -> Self {
        use std::os::unix::process::CommandExt as _;
        let what = format!("{program:?} {args:?}");
        let mut cmd = Command::new(program);
        cmd.arg0(argv0).args(args);
        Workload::spawn(cmd, what)
    }
}

/// The uid and gid of system user `name`, created (with a group of the same name, or in the
/// existing group of that name) as the Debian package creates ethand's when it is missing.
/// Left in place: the package leaves it too.
pub fn system_user(name: &str) -> (u32, u32) {
    let lookup = || -> Option<(u32, u32)> {
        let out = Command::new("getent")
            .args(["passwd", name])
            .output()
            .ok()?;
        let line = text(&out.stdout);
        let f: Vec<&str> = line.trim().split(':').collect();
        Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
    };
    if let Some(ids) = lookup() {
        return ids;
    }
    let group_exists = Command::new("getent")
        .args(["group", name])
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = Command::new("useradd");
    cmd.args([
        "--system",
        "--no-create-home",
        "--home-dir",
        "/",
        "--shell",
        "/usr/sbin/nologin",
    ]);
    if group_exists {
        cmd.args(["--gid", name]);
    } else {
        cmd.arg("--user-group");
    }
    let out = run_with_timeout(cmd.arg(name), Duration::from_secs(30));
    assert!(
        out.status.success(),
        "useradd {name}: {}",
        text(&out.stderr)
    );
    lookup().unwrap_or_else(|| panic!("user {name} not found after useradd"))
}
