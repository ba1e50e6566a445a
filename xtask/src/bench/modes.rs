//! The modes a workload runs under: nothing attached, ethand, or bpftrace doing the same
//! accounting (`accounting.bt`).
//!
//! Invariants: [`attach`] returns only once the tracer is attached, and the [`Tracer`] it returns
//! stops its process (signal, then SIGKILL after a timeout) when dropped, so no daemon or
//! bpftrace outlives the bench, whatever error ends it.

use std::fs::{self, File};
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

/// The bpftrace program of the `bpftrace` mode.
pub const BPFTRACE_SCRIPT: &str = include_str!("accounting.bt");

/// How long a tracer may take to attach.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a tracer may take to exit after its stop signal before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nothing attached: the baseline.
    None,
    /// `ethand run` with its default probes.
    Ethand,
    /// bpftrace running `accounting.bt`.
    Bpftrace,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::None, Mode::Ethand, Mode::Bpftrace];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Ethand => "ethand",
            Mode::Bpftrace => "bpftrace",
        }
    }
}

/// The binaries the tracing modes run.
pub struct Tools {
    pub ethand: Option<PathBuf>,
    pub bpftrace: Option<PathBuf>,
}

/// Starts `mode`'s tracer and waits until it is attached; `None` for the baseline. `dir` holds
/// its config, script and log.
pub fn attach(mode: Mode, tools: &Tools, dir: &Path) -> Result<Option<Tracer>> {
    let tool = |t: &Option<PathBuf>| {
        t.clone()
            .with_context(|| format!("no binary for mode {}", mode.name()))
    };
    match mode {
        Mode::None => Ok(None),
        Mode::Ethand => start_ethand(&tool(&tools.ethand)?, dir).map(Some),
        Mode::Bpftrace => start_bpftrace(&tool(&tools.bpftrace)?, dir).map(Some),
    }
}

/// `ethand run` with a config that moves its socket and /metrics port out of the way of an
/// installed daemon. Ready when `ethand status` answers.
fn start_ethand(bin: &Path, dir: &Path) -> Result<Tracer> {
    let socket = dir.join("ethand.sock");
    let config = dir.join("ethand.toml");
    let port = free_loopback_port()?;
    fs::write(
        &config,
        format!(
            "[daemon]\nsocket = \"{}\"\n\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
            socket.display()
        ),
    )
    .context("writing ethand's config")?;

    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("--config").arg(&config);
    let mut tracer = Tracer::spawn("ethand", cmd, dir.join("ethand.log"), libc::SIGTERM)?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        tracer.ensure_running("before it was ready")?;
        let status = Command::new(bin)
            .arg("status")
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {} status", bin.display()))?;
        if status.status.success() {
            tracer.ready_output = String::from_utf8_lossy(&status.stdout).into_owned();
            return Ok(tracer);
        }
        if Instant::now() > deadline {
            bail!(
                "ethand did not answer `ethand status` within {} s; its log:\n{}",
                READY_TIMEOUT.as_secs(),
                tracer.log_tail()
            );
        }
        sleep(POLL);
    }
}

/// bpftrace with `accounting.bt`. Ready when it has announced "Attaching N probes..." and
/// holds N perf-event (or BPF link) file descriptors, one per attached probe.
fn start_bpftrace(bin: &Path, dir: &Path) -> Result<Tracer> {
    let script = dir.join("accounting.bt");
    fs::write(&script, BPFTRACE_SCRIPT).context("writing the bpftrace script")?;
    let mut cmd = Command::new(bin);
    // ethand's largest per-key maps have 65536 entries; bpftrace's default is 4096.
    cmd.env("BPFTRACE_MAP_KEYS_MAX", "65536").arg(&script);
    let mut tracer = Tracer::spawn("bpftrace", cmd, dir.join("bpftrace.log"), libc::SIGINT)?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        tracer.ensure_running("before it attached")?;
        let log = tracer.log();
        if let Some(line) = log.lines().find(|l| l.starts_with("Attaching ")) {
            let probes: usize = line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("unexpected bpftrace line {line:?}"))?;
            if attach_fds(tracer.child.id()) >= probes {
                tracer.ready_output = line.to_string();
                return Ok(tracer);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "bpftrace did not attach within {} s; its output:\n{}",
                READY_TIMEOUT.as_secs(),
                tracer.log_tail()
            );
        }
        sleep(POLL);
    }
}

/// File descriptors of `pid` that hold an attached BPF program.
fn attach_fds(pid: u32) -> usize {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|fd| fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target.contains("perf_event") || target.contains("bpf_link")
        })
        .count()
}

fn free_loopback_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// A tracer process, stopped when dropped.
pub struct Tracer {
    name: &'static str,
    child: Child,
    stop_signal: libc::c_int,
    log: PathBuf,
    /// What the tracer said when it became ready (`ethand status`, bpftrace's attach line).
    pub ready_output: String,
}

impl Tracer {
    fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
        stop_signal: libc::c_int,
    ) -> Result<Tracer> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Tracer {
            name,
            child,
            stop_signal,
            log,
            ready_output: String::new(),
        })
    }

    /// Fails if the tracer has exited: whatever ran meanwhile was not traced.
    pub fn ensure_running(&mut self, when: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}) {when}; its output:\n{}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Stops the tracer after a run. A tracer that died during the run is an error (the run
    /// was not traced); one that exits badly after its stop signal is only reported.
    pub fn finish(mut self) -> Result<()> {
        self.ensure_running("while the workloads ran")?;
        let status = self.stop()?;
        if !status.success() {
            eprintln!(
                "warning: {} exited with {status} after signal {}; its output:\n{}",
                self.name,
                self.stop_signal,
                self.log_tail()
            );
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        unsafe { libc::kill(self.child.id() as libc::pid_t, self.stop_signal) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            sleep(POLL);
        }
        eprintln!(
            "warning: {} did not exit within {} s of signal {}: killing it",
            self.name,
            STOP_TIMEOUT.as_secs(),
            self.stop_signal
        );
        self.child.kill()?;
        Ok(self.child.wait()?)
    }

    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: stopping {}: {e:#}", self.name);
        }
    }
}
