//! A hostile local user against the root daemon (docs/security.md, "Attacks and bounds"):
//! connections held idle and replies never read beyond the descriptor limit, command lines
//! of megabytes, floods of API requests, symlinks planted where ethand writes. Each test
//! bounds its attack in count and time, aims at loopback only, and asserts what must hold
//! under it: /metrics answers a real Prometheus within its scrape timeout, the daemon's
//! memory stays under its share of the unit's MemoryMax, nothing is written through a symlink. The figures
//! each test observed are printed (`observed:`), also when an assertion fails.
use std::{
    fs,
    io::{Read, Write},
    os::unix::{fs::PermissionsExt, net::UnixStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::ServerConnections;
use ethand_tests::{
    Daemon, RemoveOnDrop, SETTLE, TreeSnapshot, Workload, ethand_bin, find_proc,
    prometheus_server::PrometheusServer, rss_bytes, run_with_timeout, serial, temp_path, text,
};

use crate::workload;

const HOSTILE: &str = env!("CARGO_BIN_EXE_ethand-hostile");
const NOBODY: u32 = 65534;
/// A second local user (any uid works with setpriv; no account needed).
const OTHER_UID: u32 = 60123;
/// The daemon's own share of the unit's MemoryMax (systemd/ethand.service: 512M, the rest for
/// the reader's workers).
const MEMORY_MAX: u64 = 256 << 20;

/// `ethand-hostile ARGS` as `uid`, allowed 8,192 descriptors.
fn hostile_as(uid: u32, args: &[&str]) -> Workload {
    let mut a: Vec<String> = vec![
        "--nofile=8192:8192".into(),
        "setpriv".into(),
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
        HOSTILE.into(),
    ];
    a.extend(args.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    Workload::start("prlimit", &refs)
}

/// `ethand ARGS --socket S` given at most `limit`: (how long it took, success), or that it
/// was still running then (killed).
fn bounded_cli(d: &Daemon, args: &[&str], limit: Duration) -> Result<(Duration, bool), String> {
    let t0 = Instant::now();
    let mut child = Command::new(ethand_bin())
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok((t0.elapsed(), st.success()));
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {limit:?}"));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// CPU seconds the process has used (utime + stime).
fn cpu_seconds(pid: u32) -> f64 {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let f: Vec<&str> = s[s.rfind(')').expect(")") + 1..]
        .split_whitespace()
        .collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn vm_hwm_bytes(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

fn fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// GET /metrics as Prometheus would, with its default 10 s scrape timeout: (took, bytes).
fn scrape(port: u16) -> Result<(Duration, usize), String> {
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(
        &([127, 0, 0, 1], port).into(),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let head = String::from_utf8_lossy(&resp[..resp.len().min(40)]).into_owned();
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("answered {head:?}"));
    }
    Ok((t0.elapsed(), resp.len()))
}

/// The one value of an instant PromQL query, as a number.
fn prom_value(p: &PrometheusServer, expr: &str) -> Option<f64> {
    let v = p.query(expr);
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Samples a process's resident memory and descriptors every 100 ms until stopped: the peaks.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<(u64, usize)>>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = thread::spawn(move || {
            let (mut rss, mut fd) = (0, 0);
            while !s.load(Ordering::Relaxed) {
                rss = rss.max(rss_bytes(pid));
                fd = fd.max(fds(pid));
                thread::sleep(Duration::from_millis(100));
            }
            (rss, fd)
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn peaks(mut self) -> (u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().expect("once").join().expect("sampler")
    }
}

/// Two local users each hold as many /metrics connections as they can (1,000 idle, 800
/// sending a request and never reading the reply, far beyond the daemon's descriptor limit,
/// 400 here), for 20 s. Meanwhile a real Prometheus scrapes every second with a 1 s timeout
/// and every scrape succeeds; the daemon's memory, descriptors, CPU and log stay bounded; the
/// connection caps shrank to fit the descriptor limit; afterwards it is back to idle.
#[test]
fn metrics_keeps_answering_prometheus_while_local_users_hold_connections() {
    let _serial = serial();
    const ATTACK_S: u64 = 20;
    let mut d = Daemon::start_with(
        "hostile-conns",
        "",
        &["prlimit".into(), "--nofile=400:400".into(), "--".into()],
        &[],
    );
    let pid = d.pid();
    let prom = PrometheusServer::start("hostile", &[format!("127.0.0.1:{}", d.port)], &[]);
    thread::sleep(Duration::from_secs(3));
    let (fds0, rss0, cpu0, log0) = (
        fds(pid),
        rss_bytes(pid),
        cpu_seconds(pid),
        d.log_text().len(),
    );
    let caps = d.status().servers;
    eprintln!(
        "observed: before: fds {fds0}, RSS {} MB, caps {caps:?}",
        rss0 >> 20
    );

    let port = d.port.to_string();
    let args = ["conn-flood", port.as_str(), "1000", "800", "20"];
    let mut attackers = [hostile_as(NOBODY, &args), hostile_as(OTHER_UID, &args)];
    let sampler = Sampler::start(pid);
    let t0 = Instant::now();
    for a in &mut attackers {
        a.send_byte();
    }
    let (mut scrapes, mut worst, mut failures) = (0, Duration::ZERO, Vec::new());
    let mut status_during = None;
    while t0.elapsed() < Duration::from_secs(ATTACK_S) {
        // The operator's `ethand status` in the middle of the attack (it used to hang while
        // the daemon's descriptors were exhausted, its API accept loop spinning).
        if status_during.is_none() && t0.elapsed() > Duration::from_secs(ATTACK_S / 2) {
            status_during = Some(bounded_cli(&d, &["status"], Duration::from_secs(15)));
        }
        match scrape(d.port) {
            Ok((took, _)) => {
                scrapes += 1;
                worst = worst.max(took);
            }
            Err(e) => failures.push(e),
        }
        thread::sleep(Duration::from_millis(500));
    }
    let reports: Vec<_> = attackers.iter_mut().map(|a| a.expect("done")).collect();
    let attack_s = t0.elapsed().as_secs_f64();
    let (rss_peak, fds_peak) = sampler.peaks();
    let cpu = cpu_seconds(pid) - cpu0;
    let log_growth = d.log_text().len() - log0;
    // Asked with a timeout of its own: a daemon that no longer answers is reported, not
    // waited for.
    let t_status = Instant::now();
    let st = run_with_timeout(
        Command::new(ethand_bin())
            .args(["status", "--json", "--socket"])
            .arg(&d.socket),
        Duration::from_secs(60),
    );
    let status_took = t_status.elapsed();
    let m = serde_json::from_slice::<serde_json::Value>(&st.stdout)
        .ok()
        .and_then(|v| serde_json::from_value::<Vec<ServerConnections>>(v["servers"].clone()).ok())
        .and_then(|v| v.into_iter().find(|s| s.server == "metrics"));
    let window = format!("{}s", ATTACK_S - 2);
    let up_min = prom_value(
        &prom,
        &format!("min_over_time(up{{job=\"ethand\"}}[{window}])"),
    );
    let up_n = prom_value(
        &prom,
        &format!("count_over_time(up{{job=\"ethand\"}}[{window}])"),
    );
    let dur_max = prom_value(
        &prom,
        &format!("max_over_time(scrape_duration_seconds{{job=\"ethand\"}}[{window}])"),
    );
    eprintln!(
        "observed: attackers {:?}",
        reports.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    eprintln!(
        "observed: during {attack_s:.1} s: own scrapes {scrapes} ok, {} failed {failures:?}, slowest {worst:?}; \
         Prometheus up min {up_min:?} over {up_n:?} scrapes, slowest {dur_max:?} s; \
         daemon RSS peak {} MB (before {} MB), fds peak {fds_peak} of 400 (before {fds0}), \
         CPU {cpu:.2} s ({:.1} % of a core), log +{log_growth} bytes; `ethand status` during the attack {status_during:?}, after it {} in {status_took:?}; server {m:?}",
        failures.len(),
        rss_peak >> 20,
        rss0 >> 20,
        100.0 * cpu / attack_s,
        st.status
    );
    assert!(failures.is_empty(), "scrapes failed: {failures:?}");
    let metrics_caps = caps.iter().find(|s| s.server == "metrics");
    assert!(
        metrics_caps.is_some_and(|c| c.max < 64 && c.max_per_peer * 4 <= c.max),
        "the caps (the per-peer one in proportion) did not shrink to a 400-descriptor limit: {metrics_caps:?}"
    );
    assert!(st.status.success(), "ethand status failed after the attack");
    assert!(
        matches!(&status_during, Some(Ok((t, true))) if *t < Duration::from_secs(2)),
        "ethand status during the attack: {status_during:?}"
    );
    assert!(worst < Duration::from_secs(2), "a scrape took {worst:?}");
    assert_eq!(up_min, Some(1.0), "Prometheus saw the target down");
    assert!(
        up_n.unwrap_or(0.0) >= (ATTACK_S - 4) as f64,
        "Prometheus scrapes: {up_n:?}"
    );
    assert!(rss_peak < MEMORY_MAX, "RSS {rss_peak} over MemoryMax");
    assert!(
        rss_peak < rss0 + (32 << 20),
        "RSS grew {} MB",
        (rss_peak - rss0) >> 20
    );
    assert!(fds_peak < 400, "descriptors reached the limit");
    assert!(
        cpu < 0.25 * attack_s,
        "{cpu:.2} CPU seconds in {attack_s:.1} s"
    );
    assert!(log_growth < 64 * 1024, "the log grew {log_growth} bytes");
    assert!(
        m.as_ref()
            .is_some_and(|m| m.refused_peer_limit > 1000 && m.timed_out > 0),
        "the attack was not refused and timed out as expected: {m:?}"
    );
    drop(attackers);
    // Back to idle once the attack is over (timeouts 10 s).
    let t1 = Instant::now();
    while fds(pid) > fds0 + 4 && t1.elapsed() < Duration::from_secs(15) {
        thread::sleep(Duration::from_millis(200));
    }
    let after = fds(pid);
    eprintln!("observed: fds {after} after the attack (before {fds0})");
    assert!(
        after <= fds0 + 4,
        "descriptors left open: {after} (before {fds0})"
    );
    assert!(
        d.terminate(Duration::from_secs(5))
            .is_some_and(|(_, s)| s.success())
    );
}

/// 150 processes of another user with 1.8 MB of command line each: the daemon keeps 4 KiB of
/// each (marked truncated), its memory grows by little, a snapshot of their parent stays small
/// and fast, and /metrics keeps answering meanwhile.
#[test]
fn command_lines_of_megabytes_cost_their_cap_not_their_size() {
    let _serial = serial();
    const N: u64 = 150;
    let d = Daemon::start("hostile-argv", "");
    thread::sleep(SETTLE);
    let rss0 = rss_bytes(d.pid());
    let mut w = hostile_as(NOBODY, &["argv-sleepers", &N.to_string(), "1800000"]);
    let arg_bytes = w.ready.u64("arg_bytes");
    // Read at first sight: a few rounds.
    thread::sleep(SETTLE * 3);
    let rss1 = rss_bytes(d.pid());
    let scraping = {
        let port = d.port;
        thread::spawn(move || scrape(port))
    };
    let t0 = Instant::now();
    let out = d.cli(&["snapshot", "--pid", &w.pid.to_string(), "--json"]);
    let took = t0.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json_bytes = out.stdout.len();
    let t: TreeSnapshot = serde_json::from_slice(&out.stdout).expect("TreeSnapshot");
    let scraped = scraping.join().expect("scrape thread");
    let children: Vec<_> = t.processes.iter().filter(|p| p.pid != w.pid).collect();
    let longest = children
        .iter()
        .map(|p| p.cmdline.join(" ").len())
        .max()
        .unwrap_or(0);
    let terminal = d.cli(&["snapshot", "--pid", &children[0].pid.to_string()]);
    eprintln!(
        "observed: {} children of {arg_bytes} argument bytes each: RSS {} -> {} MB; snapshot {json_bytes} bytes in {took:?}; \
         longest kept command line {longest} bytes; all truncated {}; /metrics during it {scraped:?}",
        children.len(),
        rss0 >> 20,
        rss1 >> 20,
        children.iter().all(|p| p.cmdline_truncated)
    );
    assert_eq!(children.len() as u64, N);
    assert!(children.iter().all(|p| p.cmdline_truncated));
    assert!(longest <= 4096, "a command line of {longest} bytes kept");
    assert!(rss1 < rss0 + (16 << 20), "RSS {rss0} -> {rss1}");
    assert!(json_bytes < 4 << 20, "snapshot of {json_bytes} bytes");
    assert!(took < Duration::from_secs(2), "snapshot took {took:?}");
    assert!(scraped.is_ok_and(|(t, _)| t < Duration::from_secs(2)));
    assert!(
        text(&terminal.stdout).contains("[truncated at 4 KiB]"),
        "the terminal does not say the command line was cut"
    );
    w.go();
}

/// `n` clients ask for `request` at once, each waiting `read_after` before it reads: how
/// many got an answer line, how many were told busy, and the slowest answer.
fn api_flood(
    sock: &Path,
    n: usize,
    request: &str,
    read_after: Duration,
) -> (usize, usize, Duration) {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (sock, req) = (sock.to_path_buf(), request.to_string());
            thread::spawn(move || -> Result<(bool, Duration), String> {
                let t0 = Instant::now();
                let mut s = UnixStream::connect(&sock).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(60)))
                    .map_err(|e| e.to_string())?;
                let _ = s.write_all(format!("{req}\n").as_bytes());
                thread::sleep(read_after);
                let mut reply = Vec::new();
                s.read_to_end(&mut reply).map_err(|e| e.to_string())?;
                if !reply.ends_with(b"\n") {
                    return Err(format!("a cut reply of {} bytes", reply.len()));
                }
                Ok((reply.starts_with(b"{\"ok\""), t0.elapsed()))
            })
        })
        .collect();
    let (mut ok, mut busy, mut worst) = (0, 0, Duration::ZERO);
    for h in handles {
        match h.join().expect("client") {
            Ok((true, t)) => {
                ok += 1;
                worst = worst.max(t);
            }
            Ok((false, t)) => {
                busy += 1;
                worst = worst.max(t);
            }
            Err(e) => panic!("an API client got no answer: {e}"),
        }
    }
    (ok, busy, worst)
}

/// 200 clients at once ask for the whole node, then 200 for a snapshot, half of them slow to
/// read: every one gets a whole answer (or "busy") within the timeouts, the daemon's peak
/// memory stays far under MemoryMax, and /metrics answers meanwhile.
#[test]
fn concurrent_api_floods_stay_bounded() {
    let _serial = serial();
    let d = Daemon::start("hostile-api", "");
    let mut w = workload(&["spin-threads", "8", "200", "800"]);
    w.send_byte();
    // 150 more processes with 1 KB command lines: a node dump of megabytes.
    let mut crowd = hostile_as(NOBODY, &["argv-sleepers", "150", "1000"]);
    thread::sleep(SETTLE * 3);
    let hwm0 = vm_hwm_bytes(d.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (port, stop) = (d.port, stop.clone());
        thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let (t, _) = scrape(port).expect("/metrics during the API flood");
                worst = worst.max(t);
                thread::sleep(Duration::from_millis(200));
            }
            worst
        })
    };
    let node = api_flood(&d.socket, 200, r#"{"cmd":"node"}"#, Duration::ZERO);
    let node_slow = api_flood(&d.socket, 200, r#"{"cmd":"node"}"#, Duration::from_secs(2));
    let snap_req = format!(r#"{{"cmd":"snapshot","pid":{},"window_s":10}}"#, w.pid);
    let snap = api_flood(&d.socket, 200, &snap_req, Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let scrape_worst = scraper.join().expect("scraper");
    let hwm = vm_hwm_bytes(d.pid());
    let node_size = {
        let mut s = UnixStream::connect(&d.socket).expect("connect");
        s.write_all(b"{\"cmd\":\"node\"}\n").expect("send");
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).expect("read");
        reply.len()
    };
    eprintln!(
        "observed: node (ok, busy, slowest) {node:?}, node slow readers {node_slow:?}, snapshots {snap:?}; \
         VmHWM {} -> {} MB; slowest scrape meanwhile {scrape_worst:?} (a node dump is {node_size} bytes)",
        hwm0 >> 20,
        hwm >> 20
    );
    for (what, (ok, busy, worst)) in [("node", node), ("slow node", node_slow), ("snapshot", snap)]
    {
        assert_eq!(ok + busy, 200, "{what}");
        assert!(ok > 0, "{what}: none answered");
        assert!(worst < Duration::from_secs(30), "{what}: {worst:?}");
    }
    assert!(hwm < MEMORY_MAX, "VmHWM {hwm}");
    assert!(
        hwm < hwm0 + (64 << 20),
        "VmHWM grew {} MB",
        (hwm - hwm0) >> 20
    );
    assert!(scrape_worst < Duration::from_secs(2), "{scrape_worst:?}");
    w.send_byte();
    crowd.go();
}

/// Sets fs.protected_symlinks (the kernel's guard for root following a user's symlink in a
/// sticky directory) for the test and restores it.
struct ProtectedSymlinks(String);

impl ProtectedSymlinks {
    fn set(v: &str) -> Self {
        let p = "/proc/sys/fs/protected_symlinks";
        let old = fs::read_to_string(p).expect("read protected_symlinks");
        fs::write(p, v).expect("write protected_symlinks");
        Self(old)
    }
}

impl Drop for ProtectedSymlinks {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/fs/protected_symlinks", self.0.trim());
    }
}

/// A user plants symlinks (to root-owned files) at the paths root then asks ethand to write:
/// `snapshot --html`, `record -o` (and the FILE.tmp name it used to write first), `compare
/// --html`. With the kernel's guard off, each output replaces the link; no root-owned file
/// changes; nothing is left behind.
#[test]
fn outputs_replace_planted_symlinks_and_never_follow_them() {
    let _serial = serial();
    let _guard = ProtectedSymlinks::set("0");
    let dir = temp_path("hostile-out", "d");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("mkdir");
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).expect("chmod");
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmDir(dir.clone());
    let victims: Vec<PathBuf> = (0..4)
        .map(|i| temp_path(&format!("victim{i}"), "txt"))
        .collect();
    let _rm_victims: Vec<RemoveOnDrop> = victims.iter().cloned().map(RemoveOnDrop).collect();
    for v in &victims {
        fs::write(v, "root's precious file\n").expect("write victim");
    }
    // Planted by the user (nobody), as in a world-writable directory.
    let plant = |name: &str, victim: &Path| {
        let out = Command::new("setpriv")
            .args([
                &format!("--reuid={NOBODY}"),
                &format!("--regid={NOBODY}"),
                "--clear-groups",
                "ln",
                "-s",
            ])
            .arg(victim)
            .arg(dir.join(name))
            .output()
            .expect("ln -s");
        assert!(out.status.success(), "{}", text(&out.stderr));
        dir.join(name)
    };
    let html = plant("report.html", &victims[0]);
    let trace = plant("trace.json", &victims[1]);
    plant("trace.json.tmp", &victims[2]);
    let cmp = plant("cmp.html", &victims[3]);

    let d = Daemon::start("hostile-out", "");
    let mut w = workload(&["cpu", "200"]);
    w.go();
    thread::sleep(SETTLE);
    let pid = w.pid.to_string();
    let s = d.cli(&[
        "snapshot",
        "--pid",
        &pid,
        "--html",
        html.to_str().expect("utf-8"),
    ]);
    assert!(s.status.success(), "{}", text(&s.stderr));
    let r = d.cli(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "1s",
        "-o",
        trace.to_str().expect("utf-8"),
    ]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let json = temp_path("hostile-snap", "json");
    let _rm_json = RemoveOnDrop(json.clone());
    let j = d.cli(&["snapshot", "--pid", &pid, "--json"]);
    fs::write(&json, &j.stdout).expect("write json");
    let j = json.to_str().expect("utf-8");
    let c = d.cli(&["compare", j, j, "--html", cmp.to_str().expect("utf-8")]);
    assert!(c.status.success(), "{}", text(&c.stderr));

    let mut listing: Vec<String> = fs::read_dir(&dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    listing.sort();
    eprintln!("observed: directory after the writes: {listing:?}");
    for v in &victims {
        assert_eq!(
            fs::read_to_string(v).expect("victim"),
            "root's precious file\n",
            "{} was written through a symlink",
            v.display()
        );
    }
    for f in [&html, &trace, &cmp] {
        let md = fs::symlink_metadata(f).expect("output");
        assert!(
            md.file_type().is_file(),
            "{} is not a regular file",
            f.display()
        );
    }
    assert!(fs::read_to_string(&html).expect("html").contains("<html"));
    let t: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&trace).expect("trace")).expect("trace JSON");
    assert!(t["traceEvents"].is_array());
    // Only the outputs and the planted FILE.tmp link remain: no temporary files.
    assert_eq!(
        listing,
        ["cmp.html", "report.html", "trace.json", "trace.json.tmp"]
    );
}

/// A full map loses events of whichever process made them: a snapshot taken meanwhile says
/// so (node-wide counts), in JSON and on the terminal.
#[test]
fn a_snapshot_says_when_node_wide_drops_may_have_cut_it() {
    let _serial = serial();
    let d = Daemon::start("hostile-drops", "[maps]\nthreads = 64\n");
    let mut w = workload(&["spin-threads", "200", "100", "1000"]);
    w.send_byte();
    thread::sleep(SETTLE * 2);
    let t = d.snapshot(w.pid);
    let out = d.cli(&["snapshot", "--pid", &w.pid.to_string()]);
    let terminal = text(&out.stdout);
    eprintln!("observed: dropped_events {:?}", t.dropped_events);
    let threads_full = t
        .dropped_events
        .iter()
        .find(|x| x.reason == "threads_full")
        .map_or(0, |x| x.count);
    assert!(threads_full > 0, "{:?}", t.dropped_events);
    assert!(
        terminal.contains("WARNING:") && terminal.contains("threads_full"),
        "{terminal}"
    );
    w.send_byte();
    // A daemon with room reports none.
    drop(d);
    let d = Daemon::start("hostile-nodrops", "");
    let mut w2 = workload(&["cpu", "50"]);
    w2.go();
    thread::sleep(SETTLE);
    let t = d.snapshot(w2.pid);
    assert!(t.dropped_events.is_empty(), "{:?}", t.dropped_events);
    let _ = find_proc(&t, w2.pid);
}
