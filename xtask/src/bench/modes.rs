//! The modes a workload runs under: nothing attached, ethand, or bpftrace doing the same
//! accounting (`accounting.bt`); and each tracer with its scheduler accounting only, to time
//! context switches directly.
//!
//! Invariants: [`attach`] returns only once the tracer is attached, and the [`Tracer`] it returns
//! stops its process (signal, then SIGKILL after a timeout) when dropped, so no daemon or
//! bpftrace outlives the bench, whatever error ends it.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::ValueEnum;

use super::workloads::{self, Measurement, Workload};
use serde_json::Value as Json;

/// The bpftrace program of the `bpftrace` mode; [`sched_script`] derives `bpftrace-sched`'s.
pub const BPFTRACE_SCRIPT: &str = include_str!("accounting.bt");
/// The lines around the scheduler part of [`BPFTRACE_SCRIPT`].
const SCHED_BEGIN: &str = "// [sched]";
const SCHED_END: &str = "// [/sched]";
/// The lines around the uprobe part of [`BPFTRACE_SCRIPT`], and the placeholder in it that
/// becomes the stand-in libcuda's path.
const UPROBE_BEGIN: &str = "// [uprobe]";
const UPROBE_END: &str = "// [/uprobe]";
const LIBCUDA_PLACEHOLDER: &str = "LIBCUDA";

/// The probe families the `ethand-sched` mode turns off (keys of `[probes]`, see
/// daemon/src/default.toml): everything but `sched`.
const ETHAND_SCHED_ONLY: &str =
    "[probes]\nsyscalls = false\nblock = false\nnet = false\nlifecycle = false\n";

/// How long a tracer may take to attach.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a tracer may take to exit after its stop signal before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// How long ethand may take to find and attach to a library a process loaded (its rescan
/// interval is 2 s by default).
const LIBRARY_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nothing attached: the baseline.
    None,
    /// `ethand run` with its default probes.
    Ethand,
    /// bpftrace running `accounting.bt`.
    Bpftrace,
    /// `ethand run` with only its scheduler probes (`[probes]` sched on, the rest off); runs
    /// the ping-pong only.
    EthandSched,
    /// bpftrace running only the scheduler part of `accounting.bt`; runs the ping-pong only.
    BpftraceSched,
    /// The kernel's floor: empty BPF programs on sys_enter, sys_exit and sched_switch, and on
    /// sched_wakeup where ethand attaches one (`xtask floor-probes`); runs the getpid loop and
    /// the ping-pong only.
    Floor,
    /// As floor, with one `bpf_ktime_get_ns()` in each syscall program (what timing a syscall
    /// needs); runs the getpid loop and the ping-pong only.
    FloorClock,
    /// Empty BPF programs on the scheduler hooks only (as floor); runs the ping-pong only.
    FloorSched,
}

impl Mode {
    pub const ALL: [Mode; 8] = [
        Mode::None,
        Mode::Ethand,
        Mode::Bpftrace,
        Mode::EthandSched,
        Mode::BpftraceSched,
        Mode::Floor,
        Mode::FloorClock,
        Mode::FloorSched,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Ethand => "ethand",
            Mode::Bpftrace => "bpftrace",
            Mode::EthandSched => "ethand-sched",
            Mode::BpftraceSched => "bpftrace-sched",
            Mode::Floor => "floor",
            Mode::FloorClock => "floor-clock",
            Mode::FloorSched => "floor-sched",
        }
    }

    /// The workloads run under this mode. The scheduler-only modes exist to time context
    /// switches, and only the ping-pong switches much.
    pub fn workloads(self) -> &'static [Workload] {
        match self {
            Mode::EthandSched | Mode::BpftraceSched | Mode::FloorSched => &[Workload::Pingpong],
            Mode::Floor | Mode::FloorClock => &[Workload::Getpid, Workload::Pingpong],
            _ => &Workload::ALL,
        }
    }

    /// Whether the mode runs ethand (else bpftrace, or nothing).
    pub fn runs_ethand(self) -> bool {
        matches!(self, Mode::Ethand | Mode::EthandSched)
    }

    pub fn runs_bpftrace(self) -> bool {
        matches!(self, Mode::Bpftrace | Mode::BpftraceSched)
    }
}

/// The binaries the tracing modes run.
pub struct Tools {
    pub ethand: Option<PathBuf>,
    pub bpftrace: Option<PathBuf>,
    /// The stand-in libcuda of the uprobe workload (bpftrace probes it by path); None: the
    /// uprobe part of the script is left out.
    pub cuda: Option<PathBuf>,
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
        // GPU level process: the default (calls) does not probe kernel launches, and the
        // uprobe row measures what one probed launch costs.
        Mode::Ethand => start_ethand(
            &tool(&tools.ethand)?,
            dir,
            "",
            "[gpu]\nlevel = \"process\"\n",
        )
        .map(Some),
        Mode::EthandSched => {
            start_ethand(&tool(&tools.ethand)?, dir, "", ETHAND_SCHED_ONLY).map(Some)
        }
        Mode::Bpftrace => start_bpftrace(
            &tool(&tools.bpftrace)?,
            dir,
            &full_script(tools.cuda.as_deref())?,
        )
        .map(Some),
        Mode::BpftraceSched => {
            start_bpftrace(&tool(&tools.bpftrace)?, dir, &sched_script()?).map(Some)
        }
        Mode::Floor => start_floor(dir, &[]).map(Some),
        Mode::FloorClock => start_floor(dir, &["--clock"]).map(Some),
        Mode::FloorSched => start_floor(dir, &["--sched-only"]).map(Some),
    }
}

/// `xtask floor-probes ARGS` (this same binary): ready when it says it attached.
fn start_floor(dir: &Path, args: &[&str]) -> Result<Tracer> {
    let exe = std::env::current_exe().context("finding the xtask binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("floor-probes").args(args);
    let mut tracer = Tracer::spawn("floor-probes", cmd, dir.join("floor.log"), libc::SIGINT)?;
    tracer.wait_ready(|t| {
        Ok(t.log()
            .lines()
            .find(|l| l.starts_with("Attached "))
            .map(str::to_string))
    })?;
    Ok(tracer)
}

/// [`BPFTRACE_SCRIPT`] as the `bpftrace` mode runs it: the uprobe part on `cuda` (the
/// placeholder replaced by its path), or without the uprobe part (and its map's `clear()`)
/// when there is no stand-in library.
pub fn full_script(cuda: Option<&Path>) -> Result<String> {
    with_uprobe(BPFTRACE_SCRIPT, cuda)
}

fn with_uprobe(script: &str, cuda: Option<&Path>) -> Result<String> {
    let lines: Vec<&str> = script.lines().collect();
    let find = |marker: &str| {
        lines
            .iter()
            .position(|l| l.trim() == marker)
            .with_context(|| format!("accounting.bt has no {marker:?} line"))
    };
    let (begin, end) = (find(UPROBE_BEGIN)?, find(UPROBE_END)?);
    ensure!(
        begin < end,
        "accounting.bt: {UPROBE_END:?} before {UPROBE_BEGIN:?}"
    );
    let out = match cuda {
        Some(lib) => {
            let lib = lib.to_str().context("stand-in libcuda path is not UTF-8")?;
            ensure!(
                !lib.contains(|c: char| c.is_whitespace() || c == ':' || c == '"'),
                "stand-in libcuda path {lib:?}: bpftrace cannot probe a path with spaces, \
                 colons or quotes"
            );
            ensure!(
                script.contains(LIBCUDA_PLACEHOLDER),
                "accounting.bt has no {LIBCUDA_PLACEHOLDER}"
            );
            script.replace(LIBCUDA_PLACEHOLDER, lib)
        }
        None => {
            let maps: BTreeSet<&str> = lines[begin + 1..end]
                .iter()
                .flat_map(|l| map_names(l))
                .collect();
            let kept: Vec<String> = lines[..begin]
                .iter()
                .chain(&lines[end + 1..])
                .map(|l| {
                    maps.iter().fold(l.to_string(), |l, m| {
                        l.replace(&format!(" clear(@{m});"), "")
                            .replace(&format!("clear(@{m}); "), "")
                            .replace(&format!("clear(@{m});"), "")
                    })
                })
                .collect();
            kept.join("\n") + "\n"
        }
    };
    Ok(out)
}

/// The scheduler part of [`BPFTRACE_SCRIPT`] as a program of its own: the lines between
/// [`SCHED_BEGIN`] and [`SCHED_END`], and an END block with the script's `clear()` calls of
/// the maps those lines use.
pub fn sched_script() -> Result<String> {
    sched_subset(BPFTRACE_SCRIPT)
}

fn sched_subset(script: &str) -> Result<String> {
    let lines: Vec<&str> = script.lines().collect();
    let find = |marker: &str| {
        lines
            .iter()
            .position(|l| l.trim() == marker)
            .with_context(|| format!("accounting.bt has no {marker:?} line"))
    };
    let (begin, end) = (find(SCHED_BEGIN)?, find(SCHED_END)?);
    ensure!(
        begin < end,
        "accounting.bt: {SCHED_END:?} before {SCHED_BEGIN:?}"
    );
    let part = &lines[begin + 1..end];
    let maps: BTreeSet<&str> = part.iter().flat_map(|l| map_names(l)).collect();

    let end_start = lines
        .iter()
        .position(|l| l.starts_with("END {"))
        .context("accounting.bt has no `END {` line")?;
    let end_len = lines[end_start..]
        .iter()
        .position(|l| l.trim() == "}")
        .context("accounting.bt: END block not closed by a `}` line")?;
    let clears: Vec<String> = lines[end_start..=end_start + end_len]
        .iter()
        .flat_map(|l| l.split(';'))
        .filter_map(|stmt| {
            let name = stmt.trim().strip_prefix("clear(@")?.strip_suffix(')')?;
            maps.contains(name).then(|| format!("clear(@{name});"))
        })
        .collect();
    ensure!(
        clears.len() == maps.len(),
        "accounting.bt: END clears {} of the {} maps of the scheduler part",
        clears.len(),
        maps.len()
    );
    Ok(format!(
        "// Generated by `cargo xtask bench` from accounting.bt: its scheduler part only.\n\n\
         {}\n\nEND {{ {} }}\n",
        part.join("\n"),
        clears.join(" ")
    ))
}

/// The names of the maps (`@name`) a line of bpftrace uses.
fn map_names(line: &str) -> impl Iterator<Item = &str> {
    line.split('@').skip(1).filter_map(|rest| {
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (len > 0).then(|| &rest[..len])
    })
}

/// `ethand run` with a config that moves its socket and /metrics port out of the way of an
/// installed daemon, plus `daemon_extra` (lines of `[daemon]`) and `sections` (more tables).
/// Ready when `ethand status` answers.
pub fn start_ethand(bin: &Path, dir: &Path, daemon_extra: &str, sections: &str) -> Result<Tracer> {
    let socket = ethand_socket(dir);
    let config = dir.join("ethand.toml");
    let port = free_loopback_port()?;
    fs::write(
        &config,
        format!(
            "[daemon]\nsocket = \"{}\"\n{daemon_extra}\n\
             [prometheus]\nlisten = \"127.0.0.1:{port}\"\n\n{sections}",
            socket.display()
        ),
    )
    .context("writing ethand's config")?;

    let mut cmd = Command::new(bin);
    cmd.arg("run").arg("--config").arg(&config);
    let mut tracer = Tracer::spawn("ethand", cmd, dir.join("ethand.log"), libc::SIGTERM)?;
    tracer.ethand = Some((bin.to_path_buf(), socket.clone()));
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

fn ethand_socket(dir: &Path) -> PathBuf {
    dir.join("ethand.sock")
}

/// What one ethand BPF program cost, by the kernel's BPF run-time statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramCost {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

impl ProgramCost {
    /// Average run time (None without runs).
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.run_count > 0).then(|| self.run_time_ns as f64 / self.run_count as f64)
    }
}

/// Runs `work` under `ethand run` with its default probes (plus `sections`, more config
/// tables) and the kernel's BPF run-time statistics on (`daemon.bpf_stats = "always"`, which costs every program run: never used in
/// a timed mode), then returns `programs` of `ethand status --json`, from a snapshot the daemon
/// took after `work`.
pub fn ethand_program_costs(
    bin: &Path,
    dir: &Path,
    sections: &str,
    work: impl FnOnce(&mut Tracer) -> Result<()>,
) -> Result<Vec<ProgramCost>> {
    let mut tracer = start_ethand(bin, dir, "bpf_stats = \"always\"\n", sections)?;
    work(&mut tracer)?;
    tracer.ensure_running("while the workloads ran")?;
    // `status` answers from the snapshot of the daemon's last collection (every
    // daemon.interval_ms). The one current now may predate the end of `work`; the next one
    // (its statistics have been on longer) cannot.
    let socket = ethand_socket(dir);
    let enabled_ms = |status: &Json| status.get("bpf_stats_enabled_ms").and_then(Json::as_u64);
    let current = enabled_ms(&ethand_status_json(bin, &socket)?);
    let deadline = Instant::now() + READY_TIMEOUT;
    let status = loop {
        sleep(POLL);
        let status = ethand_status_json(bin, &socket)?;
        if enabled_ms(&status) != current {
            break status;
        }
        ensure!(
            Instant::now() < deadline,
            "ethand took no new snapshot within {} s (bpf_stats_enabled_ms stays {current:?})",
            READY_TIMEOUT.as_secs()
        );
    };
    let costs = parse_program_costs(&status)?;
    tracer.finish()?;
    Ok(costs)
}

/// `ethand snapshot --json --pid PID ARGS` against the daemon at `socket`.
pub fn snapshot_json(bin: &Path, socket: &Path, pid: u32, args: &[&str]) -> Result<Json> {
    let out = Command::new(bin)
        .args(["snapshot", "--json", "--pid", &pid.to_string()])
        .args(args)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} snapshot", bin.display()))?;
    ensure!(
        out.status.success(),
        "`ethand snapshot --pid {pid} --json {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice(&out.stdout).context("parsing `ethand snapshot --json`")
}

fn ethand_status_json(bin: &Path, socket: &Path) -> Result<Json> {
    let out = Command::new(bin)
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} status --json", bin.display()))?;
    ensure!(
        out.status.success(),
        "`ethand status --json` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice::<Json>(&out.stdout).context("parsing `ethand status --json`")
}

/// `programs[]` {name, run_count, run_time_ns} of `ethand status --json`, after checking that
/// the statistics were on (`bpf_stats` "always").
fn parse_program_costs(status: &Json) -> Result<Vec<ProgramCost>> {
    let mode = status.get("bpf_stats").and_then(Json::as_str);
    ensure!(
        mode == Some("always"),
        "ethand reports bpf_stats {mode:?}, not \"always\": the kernel's BPF statistics are off \
         (see its log)"
    );
    let programs = status
        .get("programs")
        .and_then(Json::as_array)
        .context("`ethand status --json` has no programs[]")?;
    programs
        .iter()
        .map(|p| {
            let field = |key: &str| {
                p.get(key)
                    .with_context(|| format!("a program without {key:?}: {p:?}"))
            };
            let number = |key: &str| {
                field(key)?
                    .as_u64()
                    .with_context(|| format!("program field {key:?} is not a count: {p:?}"))
            };
            Ok(ProgramCost {
                name: field("name")?
                    .as_str()
                    .with_context(|| format!("program name is not a string: {p:?}"))?
                    .to_string(),
                run_count: number("run_count")?,
                run_time_ns: number("run_time_ns")?,
            })
        })
        .collect()
}

/// bpftrace running `script`. Ready when it has announced "Attaching N probes..." and holds N
/// perf-event (or BPF link) file descriptors, one per attached probe.
fn start_bpftrace(bin: &Path, dir: &Path, script: &str) -> Result<Tracer> {
    let path = dir.join("accounting.bt");
    fs::write(&path, script).context("writing the bpftrace script")?;
    let mut cmd = Command::new(bin);
    // ethand's largest per-key maps have 65536 entries; bpftrace's default is 4096.
    cmd.env("BPFTRACE_MAP_KEYS_MAX", "65536").arg(&path);
    let mut tracer = Tracer::spawn("bpftrace", cmd, dir.join("bpftrace.log"), libc::SIGINT)?;
    tracer.wait_ready(|t| {
        let log = t.log();
        let Some(line) = log.lines().find(|l| l.starts_with("Attaching ")) else {
            return Ok(None);
        };
        let probes: usize = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("unexpected bpftrace line {line:?}"))?;
        Ok((attach_fds(t.child.id()) >= probes).then(|| line.to_string()))
    })?;
    Ok(tracer)
}

/// `gpu.launches` of process `pid` in a tree snapshot.
fn launches_of(snap: &Json, pid: u32) -> Option<u64> {
    snap.get("processes")?
        .as_array()?
        .iter()
        .find(|p| p.get("pid").and_then(Json::as_u64) == Some(u64::from(pid)))?
        .get("gpu")?
        .get("launches")?
        .as_u64()
}

/// Runs workload `w` under `tracer` (None: nothing attached). The uprobe workload waits until
/// the tracer has attached to `cuda` in its process, and afterwards reads what the tracer
/// counted; the others run as [`workloads::measure`] runs them.
pub fn measure(
    w: Workload,
    iters: u64,
    io_dir: &Path,
    tracer: Option<&mut Tracer>,
    cuda: Option<&Path>,
) -> Result<Measurement> {
    if w != Workload::Uprobe {
        return workloads::measure(w, iters, io_dir);
    }
    let cuda = cuda.context("the uprobe workload needs the stand-in libcuda")?;
    let tracer = std::cell::RefCell::new(tracer);
    workloads::measure_handshake(
        w,
        iters,
        &["--lib".as_ref(), cuda.as_os_str()],
        |pid| match tracer.borrow_mut().as_deref_mut() {
            Some(t) => t.wait_library(pid, cuda),
            None => Ok(()),
        },
        |pid, m| {
            if let Some(t) = tracer.borrow_mut().as_deref_mut() {
                m.counted = t.counted_launches(pid, m.calls.unwrap_or(m.events))?;
            }
            Ok(())
        },
    )
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
    /// ethand's binary and API socket, when the tracer is `ethand run`.
    ethand: Option<(PathBuf, PathBuf)>,
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
            ethand: None,
        })
    }

    /// Polls `ready` (Some: the line that says the tracer attached) until it answers, the
    /// tracer exits or [`READY_TIMEOUT`] passes.
    fn wait_ready(&mut self, ready: impl Fn(&Tracer) -> Result<Option<String>>) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.ensure_running("before it attached")?;
            if let Some(line) = ready(self)? {
                self.ready_output = line;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not attach within {} s; its output:\n{}",
                    self.name,
                    READY_TIMEOUT.as_secs(),
                    self.log_tail()
                );
            }
            sleep(POLL);
        }
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

    /// Waits until the tracer has attached to `lib`, which process `pid` has loaded. ethand
    /// finds libraries by rescanning /proc/PID/maps (every `gpu.rescan_interval_ms`, at a
    /// collection) and attaches once per file: ready when `gpu_libraries` of `ethand status
    /// --json` lists the file (by inode) as attached. bpftrace attached by path at its start:
    /// ready at once.
    pub fn wait_library(&mut self, pid: u32, lib: &Path) -> Result<()> {
        let Some((bin, socket)) = self.ethand.clone() else {
            return Ok(());
        };
        let inode = std::os::unix::fs::MetadataExt::ino(
            &fs::metadata(lib).with_context(|| format!("stat {}", lib.display()))?,
        );
        let deadline = Instant::now() + LIBRARY_TIMEOUT;
        loop {
            self.ensure_running("while waiting for it to attach to the stand-in libcuda")?;
            let status = ethand_status_json(&bin, &socket)?;
            let entry = status
                .get("gpu_libraries")
                .and_then(Json::as_array)
                .and_then(|libs| {
                    libs.iter()
                        .find(|l| l.get("inode").and_then(Json::as_u64) == Some(inode))
                        .cloned()
                });
            let state = entry
                .as_ref()
                .and_then(|e| e.get("state").and_then(Json::as_str));
            if state == Some("attached") {
                return Ok(());
            }
            if Instant::now() > deadline || state == Some("failed") {
                bail!(
                    "ethand did not attach to {} (loaded by pid {pid}) within {} s; \
                     gpu_level {:?}, its entry in gpu_libraries: {}; its log:\n{}",
                    lib.display(),
                    LIBRARY_TIMEOUT.as_secs(),
                    status.get("gpu_level"),
                    entry.map_or_else(|| "none".to_string(), |e| e.to_string()),
                    self.log_tail()
                );
            }
            sleep(POLL);
        }
    }

    /// `ethand snapshot --json --pid PID ARGS` of this daemon (None when the tracer is not
    /// ethand).
    pub fn ethand_snapshot(&self, pid: u32, args: &[&str]) -> Result<Option<Json>> {
        let Some((bin, socket)) = &self.ethand else {
            return Ok(None);
        };
        snapshot_json(bin, socket, pid, args).map(Some)
    }

    /// The daemon's binary and API socket (None when the tracer is not ethand).
    pub fn ethand_api(&self) -> Option<(PathBuf, PathBuf)> {
        self.ethand.clone()
    }

    /// What ethand counted of the kernel launches of live process `pid` (`gpu.launches` of
    /// it in `ethand snapshot --pid PID --json`), polled until it reaches `expected` or the
    /// next snapshots stop changing it; None for bpftrace (its maps are not read).
    pub fn counted_launches(&mut self, pid: u32, expected: u64) -> Result<Option<u64>> {
        let Some((bin, socket)) = self.ethand.clone() else {
            return Ok(None);
        };
        // The daemon collects every daemon.interval_ms (1 s): the snapshot current when the
        // loop ended may predate it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let snap = snapshot_json(&bin, &socket, pid, &[])?;
            let last = launches_of(&snap, pid);
            if last == Some(expected) || Instant::now() > deadline {
                return Ok(Some(last.unwrap_or(0)));
            }
            sleep(Duration::from_millis(250));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_script_is_the_scheduler_part_with_its_clears() {
        let sched = sched_script().unwrap();
        let probes: Vec<&str> = sched
            .lines()
            .filter(|l| l.starts_with("tracepoint:") || l.starts_with("END"))
            .map(|l| l.split([' ', '/']).next().unwrap())
            .collect();
        assert_eq!(
            probes,
            [
                "tracepoint:sched:sched_wakeup",
                "tracepoint:sched:sched_switch",
                "tracepoint:sched:sched_process_exit",
                "END",
            ]
        );
        // Every line of it but the generated head and END is verbatim from accounting.bt.
        for line in sched
            .lines()
            .filter(|l| !l.starts_with("END") && !l.starts_with("//"))
        {
            assert!(BPFTRACE_SCRIPT.lines().any(|l| l == line), "{line:?}");
        }
        assert!(sched.ends_with(
            "END { clear(@wakeup_at); clear(@oncpu_since); clear(@oncpu_ns); \
             clear(@offcpu_since); clear(@offcpu_ns); clear(@switches); clear(@runq_ns); }\n"
        ));
        assert!(!sched.contains("@sys_") && !sched.contains("@blk_"));
    }

    #[test]
    fn uprobe_part_is_substituted_or_left_out() {
        let with = full_script(Some(Path::new("/tmp/b.1/libcuda.so.1"))).unwrap();
        assert!(with.contains("uprobe:/tmp/b.1/libcuda.so.1:cuLaunchKernel"));
        assert!(with.contains("clear(@launches)"));
        assert!(!with.contains(LIBCUDA_PLACEHOLDER));
        let without = full_script(None).unwrap();
        assert!(!without.contains("uprobe:"), "{without}");
        assert!(!without.contains("@launches"), "{without}");
        assert!(without.contains("clear(@sys_start)"));
        assert!(full_script(Some(Path::new("/tmp/a b/libcuda.so.1"))).is_err());
        // The scheduler subset knows nothing of it.
        assert!(!sched_script().unwrap().contains("uprobe"));
    }

    #[test]
    fn launches_from_snapshot_json() {
        let snap: Json = serde_json::from_str(
            r#"{"processes": [{"pid": 5, "gpu": null}, {"pid": 7, "gpu": {"launches": 42}}]}"#,
        )
        .unwrap();
        assert_eq!(launches_of(&snap, 7), Some(42));
        assert_eq!(launches_of(&snap, 5), None);
        assert_eq!(launches_of(&snap, 9), None);
    }

    #[test]
    fn sched_subset_checks_its_markers_and_clears() {
        let script = "a { @x = 1; }\n// [sched]\nb { @y[1] = @z[2]; }\n// [/sched]\n\
                      END {\n  clear(@x); clear(@y);\n  clear(@z);\n}\n";
        assert_eq!(
            sched_subset(script).unwrap(),
            "// Generated by `cargo xtask bench` from accounting.bt: its scheduler part only.\n\n\
             b { @y[1] = @z[2]; }\n\nEND { clear(@y); clear(@z); }\n"
        );
        assert!(sched_subset(&script.replace("clear(@z);", "")).is_err());
        assert!(sched_subset(&script.replace("// [/sched]", "")).is_err());
    }

    #[test]
    fn program_costs_from_status_json() {
        let json = r#"{
          "version": "0.1.0", "pid": 7, "probes": [{"name": "x", "state": "attached"}],
          "programs": [
            {"name": "sys_enter_btf", "run_count": 4, "run_time_ns": 210},
            {"name": "sched_switch_btf", "run_count": 0, "run_time_ns": 0}
          ],
          "bpf_stats": "always", "cpu_seconds": 0.25
        }"#;
        let parse = |json: &str| parse_program_costs(&serde_json::from_str::<Json>(json).unwrap());
        let costs = parse(json).unwrap();
        assert_eq!(costs.len(), 2);
        assert_eq!(costs[0].name, "sys_enter_btf");
        assert_eq!(costs[0].ns_per_run(), Some(52.5));
        assert_eq!(costs[1].ns_per_run(), None);
        assert!(parse(&json.replace("\"always\"", "\"sampled\"")).is_err());
        assert!(parse(&json.replace("\"run_count\": 4", "\"run_count\": -4")).is_err());
    }
}
