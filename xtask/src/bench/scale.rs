//! Suite `scale`: the daemon on a busy node. A load of [`LoadSpec::FULL`] (1,000 long-lived
//! processes, every 10th with 4 threads, each doing a little work every second, plus 100
//! process births per second) runs while `ethand run` (defaults, 1 s interval) is sampled from
//! /proc: its CPU share of one core and its resident memory, against an idle node.
//!
//! Also home of what the `serving` suite reuses: the [`Load`] generator (forked from this
//! process, killed as a process group when dropped) and the [`Daemon`] guard (an `ethand run`
//! with a private socket and /metrics port, stopped when dropped).

use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value as Json;

use super::SuiteCtx;
use super::report::Section;

/// Targets of issue 6 item 3.
const CPU_TARGET: f64 = 0.01;
const RSS_TARGET_MB: f64 = 50.0;

mod load;
pub use load::*;

/// `ethand run` with a private socket and /metrics port and a 1 s interval; stopped (SIGTERM,
/// then SIGKILL after 30 s) when dropped.
pub struct Daemon {
    child: Child,
    bin: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
    pub config: String,
    log: PathBuf,
}

impl Daemon {
    /// `daemon_extra` and `prometheus_extra`: more lines of those tables; `sections`: more
    /// tables. Ready when `ethand status` answers.
    pub fn start(
        bin: &Path,
        dir: &Path,
        name: &str,
        daemon_extra: &str,
        prometheus_extra: &str,
        sections: &str,
    ) -> Result<Daemon> {
        let socket = dir.join(format!("{name}.sock"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port")?
            .port();
        let config = format!(
            "[daemon]\nsocket = \"{}\"\ninterval_ms = 1000\n{daemon_extra}\n\
             [prometheus]\nlisten = \"127.0.0.1:{port}\"\n{prometheus_extra}\n{sections}",
            socket.display()
        );
        let config_path = dir.join(format!("{name}.toml"));
        fs::write(&config_path, &config).context("writing ethand's config")?;
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut d = Daemon {
            child,
            bin: bin.to_path_buf(),
            socket,
            port,
            config,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            d.ensure_running("before it was ready")?;
            let ok = Command::new(bin)
                .arg("status")
                .arg("--socket")
                .arg(&d.socket)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(d);
            }
            ensure!(
                Instant::now() < deadline,
                "ethand did not answer `ethand status` within 60 s; its log:\n{}",
                d.log_tail()
            );
            sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }

    pub fn ensure_running(&mut self, when: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "ethand exited ({status}) {when}; its log:\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    pub fn status_json(&self) -> Result<Json> {
        let out = Command::new(&self.bin)
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .stdin(Stdio::null())
            .output()
            .context("running ethand status --json")?;
        ensure!(
            out.status.success(),
            "`ethand status --json` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        serde_json::from_slice(&out.stdout).context("parsing `ethand status --json`")
    }

    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            sleep(Duration::from_millis(100));
        }
        eprintln!("warning: ethand did not exit within 30 s of SIGTERM: killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of a process: utime + stime of /proc/PID/stat (all threads, dead ones included;
/// clock ticks) and the sum of its live threads' schedstat run times (ns, precise).
#[derive(Clone, Copy, Debug)]
struct CpuTime {
    ticks: u64,
    sched_ns: u64,
}

fn clock_ticks() -> f64 {
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

fn cpu_time(pid: u32) -> Result<CpuTime> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("odd /proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: field 3 (state) is fields[0]; utime is field 14, stime 15.
    let num = |i: usize| -> Result<u64> {
        fields
            .get(i - 3)
            .and_then(|f| f.parse().ok())
            .context("odd /proc/PID/stat")
    };
    let ticks = num(14)? + num(15)?;
    let mut sched_ns = 0;
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(t.path().join("schedstat")) {
                sched_ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Ok(CpuTime { ticks, sched_ns })
}

/// A `Vm*:` line of /proc/PID/status, in MB (10^6 bytes).
/// CPU seconds (user + system) `pid` has used.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    Ok(cpu_time(pid)?.ticks as f64 / clock_ticks())
}

fn vm_mb(pid: u32, key: &str) -> Result<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    parse_vm_kb(&status, key)
        .map(|kb| kb as f64 * 1024.0 / 1e6)
        .with_context(|| format!("/proc/{pid}/status has no {key}"))
}

fn parse_vm_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The daemon over one steady window.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub wall_s: f64,
    /// By utime+stime (tick resolution).
    pub cpu_share: f64,
    /// By the threads' schedstat run time (ns resolution).
    pub cpu_share_sched: f64,
    pub rss_max_mb: f64,
    pub rss_last_mb: f64,
    pub rss_first_mb: f64,
    pub hwm_mb: f64,
    pub tracked_processes: u64,
    pub threads_entries: u64,
    pub overflow: u64,
    /// Loss counters that grew over the window: (reason, growth).
    pub lost: Vec<(String, u64)>,
    /// Every drop counter at the end: (reason, count, loss).
    pub dropped_total: Vec<(String, u64, bool)>,
    /// Map fill at the end: (name, entries, capacity).
    pub maps: Vec<(String, u64, u64)>,
}

fn drops(status: &Json) -> Vec<(String, u64, bool)> {
    status
        .get("dropped")
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .map(|d| {
                    (
                        d.get("reason")
                            .and_then(Json::as_str)
                            .unwrap_or("?")
                            .to_string(),
                        d.get("count").and_then(Json::as_u64).unwrap_or(0),
                        d.get("loss").and_then(Json::as_bool).unwrap_or(true),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Samples the daemon each second for `window`; `during` runs once at the start (e.g. to start
/// perf) and its result is handed back.
pub fn measure<T>(
    daemon: &mut Daemon,
    window: Duration,
    load: Option<&Load>,
    during: impl FnOnce() -> T,
) -> Result<(Usage, T)> {
    let pid = daemon.pid();
    let before = daemon.status_json()?;
    let extra = during();
    let t0 = Instant::now();
    let c0 = cpu_time(pid)?;
    let mut rss = vec![vm_mb(pid, "VmRSS")?];
    let mut next = t0;
    for _ in 0..window.as_secs().max(1) {
        next += Duration::from_secs(1);
        let now = Instant::now();
        if next > now {
            sleep(next - now);
        }
        daemon.ensure_running("during the measured window")?;
        if let Some(l) = load {
            l.ensure_running()?;
        }
        rss.push(vm_mb(pid, "VmRSS")?);
    }
    let c1 = cpu_time(pid)?;
    let wall = t0.elapsed().as_secs_f64();
    let after = daemon.status_json()?;
    let n = |k: &str| after.get(k).and_then(Json::as_u64).unwrap_or(0);
    let maps: Vec<(String, u64, u64)> = after
        .get("maps")
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m.get("name")
                            .and_then(Json::as_str)
                            .unwrap_or("?")
                            .to_string(),
                        m.get("entries").and_then(Json::as_u64).unwrap_or(0),
                        m.get("capacity").and_then(Json::as_u64).unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let (d0, d1) = (drops(&before), drops(&after));
    let lost = d1
        .iter()
        .filter(|(_, _, loss)| *loss)
        .filter_map(|(reason, count, _)| {
            let was = d0
                .iter()
                .find(|(r, _, _)| r == reason)
                .map_or(0, |(_, c, _)| *c);
            (*count > was).then(|| (reason.clone(), count - was))
        })
        .collect();
    let usage = Usage {
        wall_s: wall,
        cpu_share: (c1.ticks - c0.ticks) as f64 / clock_ticks() / wall,
        cpu_share_sched: c1.sched_ns.saturating_sub(c0.sched_ns) as f64 / 1e9 / wall,
        rss_max_mb: rss.iter().copied().fold(0.0, f64::max),
        rss_last_mb: *rss.last().unwrap_or(&0.0),
        rss_first_mb: rss[0],
        hwm_mb: vm_mb(pid, "VmHWM")?,
        tracked_processes: n("tracked_processes"),
        threads_entries: maps
            .iter()
            .find(|m| m.0 == "threads" || m.0 == "THREADS")
            .map_or(0, |m| m.1),
        overflow: n("processes_overflow"),
        lost,
        dropped_total: d1,
        maps,
    };
    Ok((usage, extra))
}

/// Durations of the suite: (warm-up, window).
fn durations(quick: bool) -> (Duration, Duration) {
    if quick {
        (Duration::from_secs(5), Duration::from_secs(10))
    } else {
        // The warm-up outlasts daemon.exit_grace_seconds (30), so that exited births are
        // reclaimed as fast as they come during the window.
        (Duration::from_secs(40), Duration::from_secs(60))
    }
}

/// `perf record` of the daemon during the window; the report is made after.
pub(super) struct PerfRun {
    child: Child,
    data: PathBuf,
}

pub(super) fn start_perf(pid: u32, dir: &Path, name: &str) -> Result<PerfRun> {
    let data = dir.join(format!("{name}-perf.data"));
    let log = File::create(dir.join(format!("{name}-perf.log")))?;
    let child = Command::new("perf")
        .args(["record", "-F", "1999", "--call-graph", "dwarf,16384", "-o"])
        .arg(&data)
        .arg("-p")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting perf record (install linux-perf, or leave out --perf)")?;
    Ok(PerfRun { child, data })
}

/// Stops perf (SIGINT), writes its reports to `keep` and returns the top of the flat one.
pub(super) fn finish_perf(mut run: PerfRun, keep: &Path) -> Result<String> {
    unsafe { libc::kill(run.child.id() as libc::pid_t, libc::SIGINT) };
    let status = run.child.wait()?;
    ensure!(
        status.success() || status.code() == Some(130) || status.signal() == Some(libc::SIGINT),
        "perf record failed ({status}); see its log in the bench's tmp directory"
    );
    let report = |args: &[&str]| -> Result<String> {
        let out = Command::new("perf")
            .arg("report")
            .arg("-i")
            .arg(&run.data)
            .arg("--stdio")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running perf report")?;
        ensure!(
            out.status.success(),
            "perf report failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let flat = report(&[
        "--no-children",
        "--sort",
        "dso,sym",
        "-g",
        "none",
        "--percent-limit",
        "0.3",
    ])?;
    let graph = report(&[
        "--no-children",
        "--sort",
        "sym",
        "-g",
        "caller,0.5,callee,function,percent",
        "--percent-limit",
        "2",
    ])?;
    let inclusive = report(&[
        "--children",
        "--sort",
        "dso,sym",
        "-g",
        "none",
        "--percent-limit",
        "1",
    ])?;
    fs::write(
        keep,
        format!(
            "{flat}\n\n# Inclusive (children) time per symbol\n\n{inclusive}\n\n\
             # Call graphs (callers of each hot symbol)\n\n{graph}"
        ),
    )
    .with_context(|| format!("writing {}", keep.display()))?;
    let _ = fs::copy(&run.data, keep.with_extension("data"));
    let top: Vec<String> = flat
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .take(20)
        .map(|l| shorten(l.trim_end(), 160))
        .collect();
    Ok(top.join("\n"))
}

pub fn run(ctx: &SuiteCtx, perf: bool) -> Result<Section> {
    let bin = ctx.ethand.context("ethand not run")?;
    let (warmup, window) = durations(ctx.quick);
    let spec = LoadSpec::FULL;

    eprintln!(
        "[bench] scale: idle node, ethand warm-up {} s, window {} s",
        warmup.as_secs(),
        window.as_secs()
    );
    let idle = {
        let mut d = Daemon::start(bin, ctx.tmp, "scale-idle", "", "", "")?;
        sleep(warmup);
        measure(&mut d, window, None, || ())?.0
    };
    eprintln!("[bench] scale: idle: {}", usage_line(&idle));

    eprintln!("[bench] scale: starting the load: {}", spec.describe());
    let load = Load::start(spec)?;
    let mut d = Daemon::start(bin, ctx.tmp, "scale", "", "", "")?;
    let config = d.config.clone();
    sleep(warmup);
    let (b0, f0) = load.births();
    let t0 = Instant::now();
    let perf_keep = std::env::temp_dir().join("ethand-bench-scale-perf.txt");
    let pid = d.pid();
    let (busy, perf_run) = measure(&mut d, window, Some(&load), || {
        perf.then(|| start_perf(pid, ctx.tmp, "scale"))
    })?;
    let (b1, f1) = load.births();
    let birth_rate = (b1 - b0) as f64 / t0.elapsed().as_secs_f64();
    drop(d);
    drop(load);
    eprintln!(
        "[bench] scale: loaded: {} ({birth_rate:.0} births/s, {} failed forks)",
        usage_line(&busy),
        f1 - f0
    );
    let perf_top = match perf_run {
        None => None,
        Some(run) => {
            let top = run.and_then(|r| finish_perf(r, &perf_keep));
            Some(match top {
                Ok(top) => {
                    eprintln!(
                        "[bench] scale: perf profile of the daemon (full report: {}):\n{top}",
                        perf_keep.display()
                    );
                    Ok(top)
                }
                Err(e) => {
                    eprintln!("[bench] scale: perf failed: {e:#}");
                    Err(format!("{e:#}"))
                }
            })
        }
    };
    let run = Run {
        spec,
        idle,
        busy,
        birth_rate,
        config,
        warmup,
        window,
        perf_top,
        perf_keep,
    };
    Ok(run.section())
}

/// `line` cut to `max` characters (long generic symbol names), with "..." when cut.
fn shorten(line: &str, max: usize) -> String {
    if line.chars().count() <= max {
        return line.to_string();
    }
    let cut: String = line.chars().take(max - 3).collect();
    format!("{cut}...")
}

/// The section of a suite that failed: the error, so that the other suites' results are kept.
pub fn failed(suite: &str, e: anyhow::Error) -> Section {
    eprintln!("[bench] suite {suite} failed: {e:#}");
    Section {
        title: format!("Suite `{suite}`: failed"),
        markdown: format!("The suite failed:\n\n```\n{e:#}\n```\n"),
        text: format!("failed: {e:#}\n"),
        record: None,
    }
}

fn usage_line(u: &Usage) -> String {
    format!(
        "CPU {:.2} % of one core (schedstat {:.2} %), RSS max {:.1} MB, last {:.1} MB, HWM {:.1} MB, \
         {} processes tracked, {} thread entries, lost {:?}",
        u.cpu_share * 100.0,
        u.cpu_share_sched * 100.0,
        u.rss_max_mb,
        u.rss_last_mb,
        u.hwm_mb,
        u.tracked_processes,
        u.threads_entries,
        u.lost
    )
}

/// Everything the section reports.
struct Run {
    spec: LoadSpec,
    idle: Usage,
    busy: Usage,
    birth_rate: f64,
    config: String,
    warmup: Duration,
    window: Duration,
    perf_top: Option<std::result::Result<String, String>>,
    perf_keep: PathBuf,
}

/// "PASS (margin ...)" or "FAIL (over by ...)" for `value <= target`.
pub fn verdict(value: f64, target: f64, unit: &str) -> String {
    if value <= target {
        format!(
            "PASS (margin {:.2}{unit}, {:.0} % of the target)",
            target - value,
            value / target * 100.0
        )
    } else {
        format!(
            "FAIL (over by {:.2}{unit}, {:.1}x the target)",
            value - target,
            value / target
        )
    }
}

impl Run {
    fn targets(&self) -> Vec<String> {
        let b = &self.busy;
        let lost: u64 = b.lost.iter().map(|l| l.1).sum();
        vec![
            format!(
                "ethand CPU at scale <= {:.0} % of one core: {:.2} % -> {}",
                CPU_TARGET * 100.0,
                b.cpu_share * 100.0,
                verdict(b.cpu_share * 100.0, CPU_TARGET * 100.0, " pp")
            ),
            format!(
                "ethand RSS at scale (largest VmRSS sample) <= {RSS_TARGET_MB:.0} MB: {:.1} MB -> {}",
                b.rss_max_mb,
                verdict(b.rss_max_mb, RSS_TARGET_MB, " MB")
            ),
            format!(
                "nothing dropped at scale (loss counters over the window; processes overflow): \
                 {lost} events lost{}, {} processes overflowed -> {}",
                if b.lost.is_empty() {
                    String::new()
                } else {
                    format!(" ({:?})", b.lost)
                },
                b.overflow,
                if lost == 0 && b.overflow == 0 {
                    "PASS"
                } else {
                    "FAIL"
                }
            ),
        ]
    }

    fn section(&self) -> Section {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "The daemon itself on a busy node: its CPU time (user + system, all its threads; \
             `/proc/PID/stat`) over a steady window as a share of one core, and its resident \
             memory (`VmRSS` sampled every second; `VmHWM`). The in-kernel cost of the probes, \
             paid by the traced processes, is the per-event table's subject, not this one.\n"
        );
        let _ = writeln!(md, "- Load: {}.", self.spec.describe());
        let _ = writeln!(
            md,
            "- Measured births: {:.1}/s over the window.",
            self.birth_rate
        );
        let _ = writeln!(
            md,
            "- ethand: `ethand run --config CFG`, CFG = its defaults plus the lines below \
             (a private socket and /metrics port; `interval_ms = 1000` is the default, written \
             out). Load first, then the daemon; {} s warm-up, then a {} s window. The *no load* row \
             is the same daemon with no load, measured first.",
            self.warmup.as_secs(),
            self.window.as_secs()
        );
        let _ = writeln!(md, "\n```toml\n{}```\n", self.config);
        let _ = writeln!(
            md,
            "| node | window (s) | CPU, % of one core (utime+stime) | CPU, % (schedstat) | \
             RSS max (MB) | RSS first / last (MB) | VmHWM (MB) | processes tracked | \
             `threads` map entries | events lost |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        let load = format!(
            "{} processes ({} threads) + {:.0} births/s",
            self.spec.processes,
            self.spec.threads(),
            self.birth_rate
        );
        for (name, u) in [
            ("no load (the machine's own processes)", &self.idle),
            (load.as_str(), &self.busy),
        ] {
            let lost: u64 = u.lost.iter().map(|l| l.1).sum();
            let _ = writeln!(
                md,
                "| {name} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} / {:.1} | {:.1} | {} | {} | {lost} |",
                u.wall_s,
                u.cpu_share * 100.0,
                u.cpu_share_sched * 100.0,
                u.rss_max_mb,
                u.rss_first_mb,
                u.rss_last_mb,
                u.hwm_mb,
                u.tracked_processes,
                u.threads_entries,
            );
        }
        let _ = writeln!(md, "\n### Targets\n");
        let targets = self.targets();
        for t in &targets {
            let _ = writeln!(md, "- {t}");
        }
        let _ = writeln!(md, "\nMap fill at the end of the loaded window:\n");
        let _ = writeln!(md, "| map | entries | capacity | fill |");
        let _ = writeln!(md, "|---|---|---|---|");
        for (name, entries, cap) in &self.busy.maps {
            let fill = if *cap > 0 {
                format!("{:.1} %", *entries as f64 / *cap as f64 * 100.0)
            } else {
                "-".into()
            };
            let _ = writeln!(md, "| {name} | {entries} | {cap} | {fill} |");
        }
        let nonzero: Vec<String> = self
            .busy
            .dropped_total
            .iter()
            .filter(|d| d.1 > 0)
            .map(|(r, c, loss)| format!("{r} = {c}{}", if *loss { "" } else { " (no loss)" }))
            .collect();
        let _ = writeln!(
            md,
            "\nDrop counters since the daemon started (warm-up included): {}.",
            if nonzero.is_empty() {
                "all zero".to_string()
            } else {
                nonzero.join(", ")
            }
        );
        let _ = writeln!(
            md,
            "\nThe daemon does not expose the duration of its per-interval work; profile it \
             with `cargo xtask bench --suites scale --perf` (perf record of the daemon during \
             the window; top symbols below when run so)."
        );
        match &self.perf_top {
            None => {}
            Some(Ok(top)) => {
                let _ = writeln!(
                    md,
                    "\nTop of `perf report --no-children --sort dso,sym` of the daemon over the \
                     loaded window (`perf record -F 1999 --call-graph dwarf -p PID`; full report \
                     with call graphs in {} when the bench ran):\n\n```\n{top}\n```",
                    self.perf_keep.display()
                );
            }
            Some(Err(e)) => {
                let _ = writeln!(md, "\nperf profile failed: {e}");
            }
        }
        let mut text = format!(
            "idle: {}\nloaded: {}\n",
            usage_line(&self.idle),
            usage_line(&self.busy)
        );
        for t in &targets {
            let _ = writeln!(text, "  {t}");
        }
        Section {
            title: format!(
                "Daemon at scale: {} processes and {} births per second",
                self.spec.processes, self.spec.births_per_s
            ),
            markdown: md,
            text,
            record: None,
        }
    }
}

#[cfg(test)]
mod tests;
