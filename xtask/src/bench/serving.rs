//! Suite `serving`: what it costs to read ethand's data out on a busy node. Under the `scale`
//! load (1,000 processes, all selected for per-process series), times GET /metrics from a
//! client, the OTLP/HTTP export (to a receiver here that answers every request with an empty
//! ExportMetricsServiceResponse), and `ethand snapshot --pid` end to end.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, sleep};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value as Json;

use super::SuiteCtx;
use super::report::Section;
use super::scale::{Daemon, LOAD_COMM, Load, LoadSpec, finish_perf, start_perf, verdict};

const METRICS_TARGET_MS: f64 = 20.0;
const SNAPSHOT_TARGET_MS: f64 = 100.0;
const SERIES_WANTED: usize = 10_000;
/// `[otlp] interval_ms` of the bench (the default is 10 s): more exports in the window.
const OTLP_INTERVAL_MS: u64 = 2000;

struct Counts {
    warmup: Duration,
    scrapes: usize,
    snapshots: usize,
    exports: usize,
    /// With every load process selected (a scrape takes seconds).
    scrapes_all: usize,
    exports_all: usize,
}

impl Counts {
    fn new(quick: bool) -> Counts {
        if quick {
            Counts {
                warmup: Duration::from_secs(8),
                scrapes: 20,
                snapshots: 10,
                exports: 3,
                scrapes_all: 3,
                exports_all: 2,
            }
        } else {
            Counts {
                warmup: Duration::from_secs(20),
                scrapes: 50,
                snapshots: 20,
                exports: 10,
                scrapes_all: 10,
                exports_all: 5,
            }
        }
    }
}

/// Median, 95th percentile and largest of `xs`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub median: f64,
    pub p95: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        // Nearest rank.
        let rank = ((0.95 * n as f64).ceil() as usize).clamp(1, n);
        Spread {
            n,
            median,
            p95: v[rank - 1],
            max: v[n - 1],
        }
    }
}

/// One request the OTLP receiver took.
#[derive(Clone, Copy, Debug)]
struct Received {
    bytes: usize,
    /// From the request's first byte to the end of its body.
    receive: Duration,
}

/// A minimal OTLP/HTTP receiver: every POST is read whole (Content-Length or chunked) and
/// answered `200 OK` with an empty protobuf body, a valid empty ExportMetricsServiceResponse.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    fn start() -> Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the OTLP receiver")?;
        let port = listener.local_addr()?.port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let g = g.clone();
                thread::spawn(move || {
                    let _ = serve_otlp(conn, &g);
                });
            }
        });
        Ok(Receiver {
            port,
            got,
            stop,
            thread: Some(thread),
        })
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An HTTP/1.1 message read off a stream: its head and its body.
struct Message {
    head: String,
    body: Vec<u8>,
    started: Instant,
}

/// Reads one message (head, then a Content-Length or chunked body, or until EOF when it has
/// neither and `body_to_eof`). `buf` keeps bytes read past it (keep-alive). None at EOF before
/// a message starts.
fn read_message(
    s: &mut impl Read,
    buf: &mut Vec<u8>,
    body_to_eof: bool,
) -> Result<Option<Message>> {
    let mut chunk = [0u8; 64 << 10];
    let mut started = (!buf.is_empty()).then(Instant::now);
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            ensure!(buf.is_empty(), "connection closed inside a message head");
            return Ok(None);
        }
        started.get_or_insert_with(Instant::now);
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let mut fill = |buf: &mut Vec<u8>, want: usize| -> Result<()> {
        while buf.len() < want {
            let n = s.read(&mut chunk)?;
            ensure!(n > 0, "connection closed inside a message body");
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    };
    let body = if let Some(len) = header("content-length") {
        let len: usize = len.parse().context("bad Content-Length")?;
        fill(buf, len)?;
        // Copied whole, not collected byte by byte: xtask runs unoptimized, where collecting a
        // 1 MB body from an iterator took 14 ms, and was timed as part of the scrape.
        let body = buf[..len].to_vec();
        buf.drain(..len);
        body
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(buf, b"\r\n") {
                    break i;
                }
                let have = buf.len();
                fill(buf, have + 1)?;
            };
            let size = String::from_utf8_lossy(&buf[..line_end]);
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .context("bad chunk size")?;
            buf.drain(..line_end + 2);
            fill(buf, size + 2)?;
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        body
    } else if body_to_eof {
        s.read_to_end(buf)?;
        std::mem::take(buf)
    } else {
        Vec::new()
    };
    Ok(Some(Message {
        head,
        body,
        started: started.unwrap_or_else(Instant::now),
    }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn serve_otlp(mut conn: TcpStream, got: &Mutex<Vec<Received>>) -> Result<()> {
    let mut buf = Vec::new();
    while let Some(m) = read_message(&mut conn, &mut buf, false)? {
        let receive = m.started.elapsed();
        if m.head.starts_with("POST") {
            got.lock().expect("lock").push(Received {
                bytes: m.body.len(),
                receive,
            });
            conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n\
                  Content-Length: 0\r\n\r\n",
            )?;
        } else {
            conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
        }
    }
    Ok(())
}

/// One GET /metrics: (wall time from connect to the last byte, body).
fn scrape(port: u16) -> Result<(Duration, Vec<u8>)> {
    let t = Instant::now();
    let body = http_get(port, "/metrics")?;
    Ok((t.elapsed(), body))
}

/// One GET of `path` on 127.0.0.1:`port`; fails unless the answer is 200.
pub(super) fn http_get(port: u16, path: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let m = read_message(&mut s, &mut buf, true)?.with_context(|| format!("{path}: no answer"))?;
    let _ = s.shutdown(Shutdown::Both);
    ensure!(
        m.head.starts_with("HTTP/1.1 200") || m.head.starts_with("HTTP/1.0 200"),
        "{path} answered {:?}",
        m.head.lines().next()
    );
    Ok(m.body)
}

/// Series (sample lines: neither comments nor blank) of an exposition, and how many of them are
/// per process (`ethand_process_*`).
fn count_series(text: &str) -> (usize, usize) {
    let samples = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let mut all = 0;
    let mut per_process = 0;
    for l in samples {
        all += 1;
        if l.starts_with("ethand_process_") {
            per_process += 1;
        }
    }
    (all, per_process)
}

/// Wall times (ms) of `runs` runs of `ethand ARGS` (`--socket` of the daemon appended when
/// `socket`), and the output size.
fn time_cli(d: &Daemon, args: &[&str], socket: bool, runs: usize) -> Result<(Spread, usize)> {
    let mut ms = Vec::new();
    let mut bytes = 0;
    for _ in 0..runs {
        let mut cmd = Command::new(d.bin());
        cmd.args(args);
        if socket {
            cmd.arg("--socket").arg(&d.socket);
        }
        let t = Instant::now();
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .context("running ethand")?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(
            out.status.success(),
            "`ethand {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        bytes = out.stdout.len();
    }
    Ok((Spread::of(&ms), bytes))
}

/// Two CLI commands' wall times (ms) and output bytes.
type CliTimes = ((Spread, usize), (Spread, usize));

/// One daemon configuration measured.
struct Phase {
    config: String,
    /// Load processes given per-process series.
    selected: usize,
    series: usize,
    process_series: usize,
    scrape_ms: Spread,
    scrape_bytes: Spread,
    /// None when the binary does not report it.
    otlp_exporter_ms: Option<Spread>,
    otlp_receive_ms: Spread,
    otlp_bytes: Spread,
    otlp_failed: u64,
    /// (plain, --json): times and output bytes.
    snapshot: Option<CliTimes>,
    /// For comparison with the snapshot: `ethand --version` (the CLI's start alone) and
    /// `ethand status` (a small request to the daemon).
    cli_baseline: Option<CliTimes>,
    /// `--perf`: the top of the daemon's profile over the scrapes, or why not.
    perf_top: Option<std::result::Result<String, String>>,
}

/// Distinct `pid` labels of the per-process CPU series.
fn selected_pids(text: &str) -> usize {
    let mut pids: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ethand_process_cpu_seconds_total{"))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids.len()
}

/// What the GETs of /metrics of one phase gave: wall times (ms), body sizes, the last body,
/// and (`--perf`) the top of the daemon's profile over them, or why not.
struct Scrapes {
    ms: Vec<f64>,
    bytes: Vec<f64>,
    last: String,
    perf_top: Option<std::result::Result<String, String>>,
}

/// The OTLP exports of one phase: the index of the first one in the receiver's list, the
/// exporter's own figure of each (ms), whether the binary reports that figure, and the
/// failed exports it counted.
struct Exports {
    first: usize,
    durations: Vec<f64>,
    exposed: bool,
    failed: u64,
}

#[allow(clippy::too_many_arguments)]
fn measure_phase(
    ctx: &SuiteCtx,
    load: &Load,
    receiver: &Receiver,
    name: &str,
    prometheus_extra: &str,
    (scrapes, snapshots, exports): (usize, usize, usize),
    warmup: Duration,
    perf: Option<&Path>,
) -> Result<Phase> {
    let mut d = start_daemon(ctx, receiver, name, prometheus_extra, warmup)?;
    load.ensure_running()?;

    let scraped = scrape_metrics(ctx, &d, name, scrapes, perf)?;
    let (series, process_series) = count_series(&scraped.last);
    let selected = selected_pids(&scraped.last);

    let (snapshot, cli_baseline) = time_snapshots(&d, load, name, snapshots)?;

    let exported = wait_for_exports(&mut d, receiver, name, exports)?;
    let got = receiver.received();
    let got = &got[exported.first..];
    Ok(Phase {
        config: d.config.clone(),
        selected,
        series,
        process_series,
        scrape_ms: Spread::of(&scraped.ms),
        scrape_bytes: Spread::of(&scraped.bytes),
        otlp_exporter_ms: exported.exposed.then(|| Spread::of(&exported.durations)),
        otlp_receive_ms: Spread::of(
            &got.iter()
                .map(|r| r.receive.as_secs_f64() * 1e3)
                .collect::<Vec<_>>(),
        ),
        otlp_bytes: Spread::of(&got.iter().map(|r| r.bytes as f64).collect::<Vec<_>>()),
        otlp_failed: exported.failed,
        snapshot,
        cli_baseline,
        perf_top: scraped.perf_top,
    })
}

/// The daemon of one phase (its defaults, `prometheus_extra`, OTLP to `receiver`), running
/// after its warm-up.
fn start_daemon(
    ctx: &SuiteCtx,
    receiver: &Receiver,
    name: &str,
    prometheus_extra: &str,
    warmup: Duration,
) -> Result<Daemon> {
    let bin = ctx.ethand.context("ethand not run")?;
    let mut d = Daemon::start(
        bin,
        ctx.tmp,
        name,
        "",
        prometheus_extra,
        &format!(
            r#"[otlp]
enabled = true
protocol = "http/protobuf"
endpoint = "http://127.0.0.1:{}/v1/metrics"
interval_ms = {OTLP_INTERVAL_MS}
timeout_ms = {OTLP_INTERVAL_MS}
"#,
            receiver.port
        ),
    )?;
    sleep(warmup);
    d.ensure_running("during the warm-up")?;
    Ok(d)
}

/// `scrapes` GETs of /metrics, each in a new collection round; with `perf`, the daemon
/// profiled over them (the full report kept there).
fn scrape_metrics(
    ctx: &SuiteCtx,
    d: &Daemon,
    name: &str,
    scrapes: usize,
    perf: Option<&Path>,
) -> Result<Scrapes> {
    eprintln!("[bench] serving ({name}): {scrapes} GETs of /metrics");
    let perf_run = perf.map(|_| start_perf(d.pid(), ctx.tmp, name));
    let mut scrape_ms = Vec::new();
    let mut scrape_bytes = Vec::new();
    let mut last = String::new();
    for _ in 0..scrapes {
        let (took, body) = scrape(d.port)?;
        scrape_ms.push(took.as_secs_f64() * 1e3);
        scrape_bytes.push(body.len() as f64);
        last = String::from_utf8_lossy(&body).into_owned();
        // The body is rendered once per collection round (1 s here) and shared by the scrapes
        // of that round: each GET in a new round pays the render, as Prometheus' every 15 s do.
        sleep(Duration::from_millis(1100));
    }
    let perf_top = match (perf_run, perf) {
        (Some(run), Some(keep)) => Some(
            run.and_then(|r| finish_perf(r, keep))
                .inspect(|top| {
                    eprintln!(
                        "[bench] serving ({name}): perf profile of the daemon over the scrapes \
                         (full report: {}):\n{top}",
                        keep.display()
                    )
                })
                .map_err(|e| format!("{e:#}")),
        ),
        _ => None,
    };
    Ok(Scrapes {
        ms: scrape_ms,
        bytes: scrape_bytes,
        last,
        perf_top,
    })
}

/// `ethand snapshot --pid` of a load process, plain and `--json`, and for comparison
/// `ethand --version` and `ethand status`, `snapshots` runs each (none when 0).
fn time_snapshots(
    d: &Daemon,
    load: &Load,
    name: &str,
    snapshots: usize,
) -> Result<(Option<CliTimes>, Option<CliTimes>)> {
    let (snapshot, cli_baseline) = if snapshots > 0 {
        let pid = load.pid(0).to_string();
        eprintln!("[bench] serving ({name}): ethand snapshot --pid {pid}, {snapshots} runs each");
        let plain = time_cli(d, &["snapshot", "--pid", &pid], true, snapshots)?;
        let json = time_cli(d, &["snapshot", "--pid", &pid, "--json"], true, snapshots)?;
        let version = time_cli(d, &["--version"], false, snapshots)?;
        let status = time_cli(d, &["status"], true, snapshots)?;
        (Some((plain, json)), Some((version, status)))
    } else {
        (None, None)
    };
    Ok((snapshot, cli_baseline))
}

/// Waits for `exports` more OTLP exports at the receiver, reading the exporter's own figure
/// of each from `ethand status --json`.
fn wait_for_exports(
    d: &mut Daemon,
    receiver: &Receiver,
    name: &str,
    exports: usize,
) -> Result<Exports> {
    // OTLP: the receiver's view, and the exporter's own measurement after each export.
    eprintln!("[bench] serving ({name}): waiting for {exports} more OTLP exports");
    let first = receiver.received().len();
    let mut durations = Vec::new();
    let mut last_ok = None;
    let mut exposed = true;
    let deadline = Instant::now()
        + Duration::from_millis(OTLP_INTERVAL_MS * (exports as u64 + 3))
        + Duration::from_secs(10);
    let mut otlp_failed;
    loop {
        d.ensure_running("while exporting OTLP")?;
        let status = d.status_json()?;
        let otlp = status.get("otlp").cloned().unwrap_or(Json::Null);
        let ok = otlp.get("exports_ok").and_then(Json::as_u64);
        otlp_failed = otlp
            .get("exports_failed")
            .and_then(Json::as_u64)
            .unwrap_or(0);
        match otlp.get("last_export_duration_us").and_then(Json::as_u64) {
            None => exposed = false,
            Some(us) if ok != last_ok && last_ok.is_some() && us > 0 => {
                durations.push(us as f64 / 1e3);
            }
            Some(_) => {}
        }
        last_ok = ok;
        let n = receiver.received().len() - first;
        // Enough requests, and the exporter's figure of the last one read back.
        if n >= exports && (!exposed || durations.len() >= exports) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {n} OTLP exports arrived in time; ethand's log:\n{}",
            d.log_tail()
        );
        sleep(Duration::from_millis(200));
    }
    Ok(Exports {
        first,
        durations,
        exposed,
        failed: otlp_failed,
    })
}

struct Results {
    spec: LoadSpec,
    /// Every load process selected.
    all: Phase,
    /// About SERIES_WANTED series.
    target: Phase,
    pid: u32,
    counts: Counts,
}

pub fn run(ctx: &SuiteCtx, perf: bool) -> Result<Section> {
    let counts = Counts::new(ctx.quick);
    let spec = LoadSpec::FULL;
    eprintln!("[bench] serving: starting the load: {}", spec.describe());
    // The load forks this process: before any thread of this suite exists.
    let load = Load::start(spec)?;
    let receiver = Receiver::start()?;
    let perf_keep = std::env::temp_dir().join("ethand-bench-serving-perf.txt");

    // First every load process selected, which tells how many series one process has; then
    // as many as make SERIES_WANTED series.
    let all = measure_phase(
        ctx,
        &load,
        &receiver,
        "serving-all",
        &format!("comms = [\"{LOAD_COMM}\"]\n"),
        (counts.scrapes_all, 0, counts.exports_all),
        counts.warmup,
        None,
    )?;
    let per_process = all.process_series as f64 / all.selected.max(1) as f64;
    let others = all.series.saturating_sub(all.process_series) as f64;
    let k = (((SERIES_WANTED as f64 - others) / per_process.max(1.0)).ceil() as usize + 2)
        .clamp(1, spec.processes);
    let pids: Vec<String> = (0..k).map(|i| load.pid(i).to_string()).collect();
    eprintln!(
        "[bench] serving: {:.0} series per process, {others:.0} others: selecting {k} load \
         processes for about {SERIES_WANTED} series",
        per_process
    );
    let target = measure_phase(
        ctx,
        &load,
        &receiver,
        "serving",
        &format!("top_n = 0\npids = [{}]\n", pids.join(", ")),
        (counts.scrapes, counts.snapshots, counts.exports),
        counts.warmup,
        perf.then_some(perf_keep.as_path()),
    )?;
    let results = Results {
        spec,
        all,
        target,
        pid: load.pid(0),
        counts,
    };
    drop(load);
    drop(receiver);
    let section = results.section();
    eprint!("[bench] serving:\n{}", section.text);
    Ok(section)
}

fn ms(s: &Spread) -> String {
    format!("{:.2} / {:.2} / {:.2}", s.median, s.p95, s.max)
}

/// A config for the report: the pid list shortened.
fn short_config(config: &str) -> String {
    config
        .lines()
        .map(|l| match l.strip_prefix("pids = [") {
            Some(rest) if rest.len() > 40 => {
                let n = rest.split(',').count();
                let first: Vec<&str> = rest.split(", ").take(3).collect();
                format!(
                    "pids = [{}, ...]  # {n} pids of load processes",
                    first.join(", ")
                )
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Results {
    fn snapshot(&self) -> CliTimes {
        self.target.snapshot.unwrap_or_default()
    }

    fn targets(&self) -> Vec<String> {
        let t = &self.target;
        let (plain, json) = self.snapshot();
        vec![
            format!(
                "/metrics has at least {SERIES_WANTED} series (the precondition): {} -> {}",
                t.series,
                if t.series >= SERIES_WANTED {
                    "PASS"
                } else {
                    "FAIL"
                }
            ),
            format!(
                "GET /metrics with {} series <= {METRICS_TARGET_MS:.0} ms (median of {}; p95 \
                 {:.2} ms): {:.2} ms -> {}",
                t.series,
                t.scrape_ms.n,
                t.scrape_ms.p95,
                t.scrape_ms.median,
                verdict(t.scrape_ms.median, METRICS_TARGET_MS, " ms")
            ),
            format!(
                "`ethand snapshot --pid` <= {SNAPSHOT_TARGET_MS:.0} ms (median of {}; p95 \
                 {:.2} ms): {:.2} ms -> {}",
                plain.0.n,
                plain.0.p95,
                plain.0.median,
                verdict(plain.0.median, SNAPSHOT_TARGET_MS, " ms")
            ),
            format!(
                "`ethand snapshot --pid --json` <= {SNAPSHOT_TARGET_MS:.0} ms (median of {}; \
                 p95 {:.2} ms): {:.2} ms -> {}",
                json.0.n,
                json.0.p95,
                json.0.median,
                verdict(json.0.median, SNAPSHOT_TARGET_MS, " ms")
            ),
        ]
    }

    fn section(&self) -> Section {
        let (t, a) = (&self.target, &self.all);
        let mut md = String::new();
        self.write_setup(&mut md);
        for (title, p) in [
            (format!("~{SERIES_WANTED} series"), t),
            ("every load process".to_string(), a),
        ] {
            write_phase(&mut md, &title, p);
        }
        let _ = writeln!(md, "### Targets\n");
        let targets = self.targets();
        for l in &targets {
            let _ = writeln!(md, "- {l}");
        }
        let text = self.text(&targets);
        Section {
            title: "Serving: /metrics, OTLP and `ethand snapshot` under 1,000 processes"
                .to_string(),
            markdown: md,
            text,
            record: None,
        }
    }

    /// The section's first paragraphs: the load, the two configurations, what is timed.
    fn write_setup(&self, md: &mut String) {
        let (t, a) = (&self.target, &self.all);
        let _ = writeln!(
            md,
            "Reading the data out of a busy node. Load: {}.\n\n\
             Two daemon configurations in turn, each `ethand run` with its defaults plus the \
             lines below (a 1 s interval, the default), OTLP/HTTP export every {} s (default \
             10 s) to a receiver in the bench that reads each request whole and answers \
             `200 OK` with an empty protobuf body:\n\n\
             - **~{SERIES_WANTED} series** (the target's size): `[prometheus]` gives \
             per-process series to {} load processes by pid and `top_n = 0` (by default only \
             the top 20 processes by CPU get them; everything else is summed per cgroup); the \
             number of processes comes from the series per process measured in the other \
             configuration.\n\
             - **every load process**: `comms = [\"{LOAD_COMM}\"]` selects all {} of them: \
             what selecting everything on a node like this costs.\n\n\
             The configuration with every process runs first. In each: {} s warm-up, then one after the other: GETs of /metrics (a new \
             connection each, 1.1 s apart so that each meets a new collection round and renders \
             the body, which the round's later scrapes would share; client-side wall time from \
             connect to the last byte), `ethand snapshot --pid {}` and `--json` (wall time of the CLI, process \
             start included; the pid is a 4-thread load process; in the ~{SERIES_WANTED} series \
             configuration only; then, for comparison, `ethand --version`, the CLI's start alone, \
             and `ethand status`, a small request), \
             and OTLP exports. The exporter's time \
             (`ethand_otlp_last_export_duration_seconds`, read after each export) covers one \
             request: encoding, sending, the answer; the collection of the observable \
             instruments before it is not included. The receiver's time is from the request's \
             first byte to the end of its body.\n",
            self.spec.describe(),
            OTLP_INTERVAL_MS / 1000,
            t.selected,
            a.selected,
            self.counts.warmup.as_secs(),
            self.pid,
        );
    }

    /// The terminal summary: each configuration's figures, then the targets.
    fn text(&self, targets: &[String]) -> String {
        let (t, a) = (&self.target, &self.all);
        let mut text = String::new();
        for (name, p) in [("~10k series", t), ("all selected", a)] {
            let _ = writeln!(
                text,
                "{name}: /metrics {} series ({} processes), {} ms (median/p95/max), {:.0} bytes; \
                 OTLP {} exports of {:.0} bytes, receive {} ms, exporter {}",
                p.series,
                p.selected,
                ms(&p.scrape_ms),
                p.scrape_bytes.median,
                p.otlp_receive_ms.n,
                p.otlp_bytes.median,
                ms(&p.otlp_receive_ms),
                p.otlp_exporter_ms
                    .as_ref()
                    .map_or("not reported".to_string(), |s| format!("{} ms", ms(s))),
            );
            if let Some((plain, json)) = &p.snapshot {
                let _ = writeln!(
                    text,
                    "  snapshot: {} ms; --json: {} ms",
                    ms(&plain.0),
                    ms(&json.0)
                );
            }
            if let Some((version, status)) = &p.cli_baseline {
                let _ = writeln!(
                    text,
                    "  for comparison: ethand --version {} ms; ethand status {} ms",
                    ms(&version.0),
                    ms(&status.0)
                );
            }
        }
        for l in targets {
            let _ = writeln!(text, "  {l}");
        }
        text
    }
}

/// One configuration's part: its series, its config, the table of timings, failed exports and
/// the daemon's profile.
fn write_phase(md: &mut String, title: &str, p: &Phase) {
    let _ = writeln!(
        md,
        "### {title}: {} series ({} of them per process, `ethand_process_*`; {} \
         processes selected)\n",
        p.series, p.process_series, p.selected
    );
    let _ = writeln!(md, "```toml\n{}\n```\n", short_config(&p.config));
    let _ = writeln!(
        md,
        "| what | n | median / p95 / max (ms) | size |\n|---|---|---|---|"
    );
    let _ = writeln!(
        md,
        "| GET /metrics | {} | {} | {:.0} bytes (median) |",
        p.scrape_ms.n,
        ms(&p.scrape_ms),
        p.scrape_bytes.median
    );
    match &p.otlp_exporter_ms {
        Some(s) => {
            let _ = writeln!(
                md,
                "| OTLP export request, by the exporter | {} | {} | - |",
                s.n,
                ms(s)
            );
        }
        None => {
            let _ = writeln!(
                md,
                "| OTLP export request, by the exporter | - | not reported by this \
                 ethand binary (`otlp.last_export_duration_us` of `ethand status \
                 --json`) | - |"
            );
        }
    }
    let _ = writeln!(
        md,
        "| OTLP export, by the receiver | {} | {} | {:.0} bytes (median; max {:.0}) |",
        p.otlp_receive_ms.n,
        ms(&p.otlp_receive_ms),
        p.otlp_bytes.median,
        p.otlp_bytes.max
    );
    if let Some((plain, json)) = &p.snapshot {
        for (name, (s, bytes)) in [
            ("`ethand snapshot --pid PID`", plain),
            ("`ethand snapshot --pid PID --json`", json),
        ] {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {bytes} bytes of output |",
                s.n,
                ms(s)
            );
        }
    }
    if let Some((version, status)) = &p.cli_baseline {
        for (name, (s, bytes)) in [
            (
                "`ethand --version` (for comparison: the CLI's start alone)",
                version,
            ),
            ("`ethand status` (for comparison: a small request)", status),
        ] {
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {bytes} bytes of output |",
                s.n,
                ms(s)
            );
        }
    }
    let _ = writeln!(md, "\nFailed OTLP requests: {}.\n", p.otlp_failed);
    match &p.perf_top {
        None => {}
        Some(Ok(top)) => {
            let _ = writeln!(
                md,
                "Top of the daemon's profile over the GETs of /metrics (`--perf`: \
                 `perf record -F 1999 --call-graph dwarf -p PID`, `perf report \
                 --no-children --sort dso,sym`):\n\n```\n{top}\n```\n"
            );
        }
        Some(Err(e)) => {
            let _ = writeln!(md, "perf profile failed: {e}\n");
        }
    }
}

#[cfg(test)]
mod tests;
