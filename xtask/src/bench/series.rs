//! Suite `series`: what a fleet's Prometheus keeps of one node, and the daemon's memory peak
//! under churn.
//!
//! - **Series**: the scale load ([`LoadSpec::FULL`]: 1,000 processes, 100 births/s) runs
//!   while a real Prometheus scrapes `ethand run` at its defaults every 15 s for 10 minutes
//!   (2 with `--quick`). Reported: Prometheus' head series, the distinct pids that had series,
//!   and per pid the share of the scrapes from its first one to the end of its life that
//!   carried it (flapping shows as a share under 1).
//! - **Churn**: 1,000 processes and [`CHURN_BIRTHS_PER_S`] births per second for 60 s (20
//!   with `--quick`) while /metrics is scraped every 5 s and the load's leader (the parent of
//!   the whole tree) is snapshotted every 10 s: the daemon's `VmHWM` against the 50 MB target.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value as Json;

use super::SuiteCtx;
use super::report::Section;
use super::scale::{Daemon, Load, LoadSpec, verdict};
use super::serving::http_get;

/// Targets of issue 24.
const HEAD_SERIES_TARGET: f64 = 5000.0;
const HWM_TARGET_MB: f64 = 50.0;
const SCRAPE_INTERVAL_S: u64 = 15;
pub const CHURN_BIRTHS_PER_S: u32 = 2000;

/// A Prometheus server with a private TSDB, scraping one target; killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, target_port: u16) -> Result<Prometheus> {
        let bin = super::find_executable(Path::new("prometheus")).context(
            "prometheus not found: `bash scripts/setup.sh --tests` installs it (Debian's package)",
        )?;
        let port = free_port()?;
        let dir = dir.join("prometheus");
        fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: 10s\n\
                 scrape_configs:\n  - job_name: ethand\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )?;
        let log = fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let mut p = Prometheus { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(port, "/-/ready").is_err() {
            if let Some(status) = p.child.try_wait()? {
                bail!("prometheus exited ({status}); its log:\n{}", p.log_tail());
            }
            ensure!(
                Instant::now() < deadline,
                "prometheus not ready within 60 s"
            );
            sleep(Duration::from_millis(200));
        }
        Ok(p)
    }

    fn log_tail(&mut self) -> String {
        let text = fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `/api/v1/query` at `time` (Unix seconds): the result array.
    fn query(&self, expr: &str, time: f64) -> Result<Vec<Json>> {
        let path = format!("/api/v1/query?query={}&time={time:.3}", url_encode(expr));
        let body = http_get(self.port, &path)?;
        let v: Json = serde_json::from_slice(&body).context("prometheus' answer")?;
        ensure!(
            v["status"] == "success",
            "prometheus query {expr}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// A gauge of Prometheus' own /metrics.
    fn own_metric(&self, name: &str) -> Result<f64> {
        let body = http_get(self.port, "/metrics")?;
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .with_context(|| format!("{name} not in prometheus' /metrics"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn vm_mb(pid: u32, key: &str) -> Result<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .with_context(|| format!("{key} not in /proc/{pid}/status"))
}

/// What Prometheus kept.
struct SeriesResult {
    minutes: u64,
    scrapes: usize,
    head_series: f64,
    /// Series of the ethand job at the end (Prometheus' `scrape_series_added` aside).
    last_scrape_series: f64,
    process_series_last: f64,
    pids: usize,
    /// Per pid: (scrapes that carried it, scrapes from its first to the end of its life).
    presence: Vec<(u32, usize, usize)>,
    rss_max_mb: f64,
    hwm_mb: f64,
    daemon_cpu_share: f64,
}

fn run_series(ctx: &SuiteCtx, bin: &Path, load: &Load) -> Result<SeriesResult> {
    let minutes = if ctx.quick { 2 } else { 10 };
    let mut d = Daemon::start(bin, ctx.tmp, "series", "", "", "")?;
    let prom = Prometheus::start(ctx.tmp, d.port)?;
    let pid = d.pid();
    let t0 = unix_now();
    let cpu0 = super::scale::cpu_seconds(pid)?;
    let mut rss_max: f64 = 0.0;
    let end = Instant::now() + Duration::from_secs(minutes * 60);
    while Instant::now() < end {
        sleep(Duration::from_secs(5));
        d.ensure_running("while Prometheus scraped it")?;
        load.ensure_running()?;
        rss_max = rss_max.max(vm_mb(pid, "VmRSS")?);
    }
    // One more scrape after the end, so that the last one is in.
    sleep(Duration::from_secs(SCRAPE_INTERVAL_S + 1));
    let wall = unix_now() - t0;
    let cpu_share = (super::scale::cpu_seconds(pid)? - cpu0) / wall;
    let t1 = unix_now();
    let range = format!("[{}s]", (t1 - t0).ceil() as u64 + 5);
    // Raw samples: every scrape's timestamp, and each process series' timestamps.
    let up = prom.query(&format!("up{{job=\"ethand\"}}{range}"), t1)?;
    let scrape_times: Vec<f64> = up
        .first()
        .and_then(|s| s["values"].as_array())
        .map(|v| v.iter().filter_map(|p| p[0].as_f64()).collect())
        .unwrap_or_default();
    ensure!(
        scrape_times.len() >= 2,
        "prometheus scraped {} times",
        scrape_times.len()
    );
    let cpu_series = prom.query(&format!("ethand_process_cpu_seconds_total{range}"), t1)?;
    let mut by_pid: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for s in &cpu_series {
        let Some(p) = s["metric"]["pid"].as_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let times = by_pid.entry(p).or_default();
        for v in s["values"].as_array().into_iter().flatten() {
            if let Some(t) = v[0].as_f64() {
                times.insert((t * 1000.0) as u64);
            }
        }
    }
    let alive = |p: u32| Path::new(&format!("/proc/{p}")).exists();
    let presence = by_pid
        .iter()
        .map(|(&p, times)| {
            let first = *times.first().expect("non-empty") as f64 / 1000.0;
            // Alive at the end: its life runs to the last scrape; else to its last presence.
            let last = if alive(p) {
                f64::MAX
            } else {
                *times.last().expect("non-empty") as f64 / 1000.0
            };
            let life = scrape_times
                .iter()
                .filter(|&&t| t >= first - 0.001 && t <= last + 0.001)
                .count();
            (p, times.len(), life)
        })
        .collect();
    let scalar = |v: Vec<Json>| -> f64 {
        v.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0.0)
    };
    let last_scrape_series = scalar(prom.query("scrape_samples_scraped{job=\"ethand\"}", t1)?);
    let process_series_last = scalar(prom.query("count({__name__=~\"ethand_process_.*\"})", t1)?);
    let head_series = prom.own_metric("prometheus_tsdb_head_series")?;
    let hwm = vm_mb(pid, "VmHWM")?;
    drop(prom);
    drop(d);
    Ok(SeriesResult {
        minutes,
        scrapes: scrape_times.len(),
        head_series,
        last_scrape_series,
        process_series_last,
        pids: by_pid.len(),
        presence,
        rss_max_mb: rss_max,
        hwm_mb: hwm,
        daemon_cpu_share: cpu_share,
    })
}

/// The daemon under heavy churn.
struct ChurnResult {
    spec: LoadSpec,
    seconds: u64,
    birth_rate: f64,
    hwm_mb: f64,
    rss_max_mb: f64,
    rss_last_mb: f64,
    tracked_max: u64,
    overflow: u64,
    scrapes: usize,
    snapshots: usize,
}

fn run_churn(ctx: &SuiteCtx, bin: &Path) -> Result<ChurnResult> {
    let spec = LoadSpec {
        births_per_s: CHURN_BIRTHS_PER_S,
        ..LoadSpec::FULL
    };
    let seconds = if ctx.quick { 20 } else { 60 };
    eprintln!("[bench] series: churn: {}", spec.describe());
    let load = Load::start(spec)?;
    let mut d = Daemon::start(bin, ctx.tmp, "series-churn", "", "", "")?;
    let pid = d.pid();
    let (b0, _) = load.births();
    let t0 = Instant::now();
    let (mut rss_max, mut tracked_max, mut scrapes, mut snapshots) = (0.0f64, 0u64, 0, 0);
    // The leader of the load: its tree is every load process and the births.
    let leader = load.leader();
    for s in 0..seconds {
        sleep(Duration::from_secs(1));
        d.ensure_running("during the churn")?;
        load.ensure_running()?;
        rss_max = rss_max.max(vm_mb(pid, "VmRSS")?);
        if s % 5 == 0 {
            http_get(d.port, "/metrics")?;
            scrapes += 1;
            let st = d.status_json()?;
            tracked_max = tracked_max.max(st["tracked_processes"].as_u64().unwrap_or(0));
        }
        if s % 10 == 5 {
            let out = Command::new(d.bin())
                .args([
                    "snapshot",
                    "--json",
                    "--pid",
                    &leader.to_string(),
                    "--socket",
                ])
                .arg(&d.socket)
                .stdin(Stdio::null())
                .output()?;
            ensure!(
                out.status.success(),
                "ethand snapshot of the load's tree: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            snapshots += 1;
        }
    }
    let (b1, _) = load.births();
    let birth_rate = (b1 - b0) as f64 / t0.elapsed().as_secs_f64();
    let st = d.status_json()?;
    let result = ChurnResult {
        spec,
        seconds,
        birth_rate,
        hwm_mb: vm_mb(pid, "VmHWM")?,
        rss_max_mb: rss_max,
        rss_last_mb: vm_mb(pid, "VmRSS")?,
        tracked_max,
        overflow: st["processes_overflow"].as_u64().unwrap_or(0),
        scrapes,
        snapshots,
    };
    drop(d);
    drop(load);
    Ok(result)
}

pub fn run(ctx: &SuiteCtx) -> Result<Section> {
    let bin = ctx.ethand.context("ethand not run")?;
    // Both loads fork this process: before any thread of the suite exists.
    let churn = run_churn(ctx, bin)?;
    eprintln!(
        "[bench] series: churn: {:.0} births/s, VmHWM {:.1} MB, RSS max {:.1} MB",
        churn.birth_rate, churn.hwm_mb, churn.rss_max_mb
    );
    let spec = LoadSpec::FULL;
    eprintln!("[bench] series: starting the load: {}", spec.describe());
    let load = Load::start(spec)?;
    let series = run_series(ctx, bin, &load)?;
    drop(load);
    let section = section(&series, &churn);
    eprint!("[bench] series:\n{}", section.text);
    Ok(section)
}

fn section(s: &SeriesResult, c: &ChurnResult) -> Section {
    let under_half = s
        .presence
        .iter()
        .filter(|(_, n, life)| 2 * n < *life)
        .count();
    let min_share = s
        .presence
        .iter()
        .map(|(_, n, life)| *n as f64 / (*life).max(1) as f64)
        .fold(1.0, f64::min);
    let short = s.presence.iter().filter(|(_, n, _)| *n <= 2).count();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "A real Prometheus (Debian's package) scraped `ethand run` at its defaults every \
         {SCRAPE_INTERVAL_S} s for {} minutes while the scale load ran ({}).\n",
        s.minutes,
        LoadSpec::FULL.describe()
    );
    let _ = writeln!(md, "| figure | value | target |");
    let _ = writeln!(md, "|---|---:|---|");
    let _ = writeln!(
        md,
        "| Prometheus head series (`prometheus_tsdb_head_series`) | {:.0} | {} |",
        s.head_series,
        verdict(s.head_series, HEAD_SERIES_TARGET, "")
    );
    let _ = writeln!(
        md,
        "| series in the last scrape, of them per process | {:.0}, {:.0} | |",
        s.last_scrape_series, s.process_series_last
    );
    let _ = writeln!(
        md,
        "| scrapes; distinct pids with series | {}; {} | |",
        s.scrapes, s.pids
    );
    let _ = writeln!(
        md,
        "| pids in under half of the scrapes of their life (from their first) | {under_half} | 0 |"
    );
    let _ = writeln!(
        md,
        "| lowest share of its life's scrapes a pid was in; pids in at most 2 scrapes | {min_share:.2}; {short} | |"
    );
    let _ = writeln!(
        md,
        "| daemon CPU (share of one core), RSS max, VmHWM | {:.4}, {:.1} MB, {:.1} MB | |",
        s.daemon_cpu_share, s.rss_max_mb, s.hwm_mb
    );
    let _ = writeln!(
        md,
        "\nChurn: {} for {} s ({:.0} births/s reached); /metrics scraped every 5 s ({} scrapes), \
         `ethand snapshot --json` of the load's whole tree every 10 s ({} snapshots), RSS \
         sampled every second.\n",
        c.spec.describe(),
        c.seconds,
        c.birth_rate,
        c.scrapes,
        c.snapshots
    );
    let _ = writeln!(md, "| figure | value | target |");
    let _ = writeln!(md, "|---|---:|---|");
    let _ = writeln!(
        md,
        "| VmHWM (peak resident memory) | {:.1} MB | {} |",
        c.hwm_mb,
        verdict(c.hwm_mb, HWM_TARGET_MB, " MB")
    );
    let _ = writeln!(
        md,
        "| RSS max (1 s samples), RSS at the end | {:.1} MB, {:.1} MB | |",
        c.rss_max_mb, c.rss_last_mb
    );
    let _ = writeln!(
        md,
        "| processes tracked (max), model overflows | {}, {} | |",
        c.tracked_max, c.overflow
    );
    let text = format!(
        "head series {:.0} (target {HEAD_SERIES_TARGET}), {} pids with series, {under_half} in \
         under half of their scrapes; churn {:.0} births/s: VmHWM {:.1} MB (target {HWM_TARGET_MB})\n",
        s.head_series, s.pids, c.birth_rate, c.hwm_mb
    );
    Section {
        title: "Series kept and memory under churn (suite `series`)".into(),
        markdown: md,
        text,
        record: None,
    }
}
