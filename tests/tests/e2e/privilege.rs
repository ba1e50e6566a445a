//! Least privilege (docs/security.md): the local API socket belongs to root and group
//! ethand (0660); /metrics listens on loopback by default and serves TLS with basic auth
//! from a Prometheus web-config file; after start-up the daemon keeps only the documented
//! capabilities, in every thread, and still measures exactly; nothing from a process's
//! environment outside the allow-list leaves the daemon.
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, RemoveOnDrop, SETTLE, ethand_bin, find_proc, free_port, measure, run_with_timeout,
    serial, temp_path, text,
};

use crate::{
    service::{GPU_TOML, LAUNCHES, PrivateGpu, cap_bit, nobody_launches, systemd_like, unit_caps},
    workload,
};

const NOBODY: u32 = 65534;
const SECURITY_MD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md");

/// Group `ethand` (created with groupadd when missing, removed again on drop) and its gid.
struct Group {
    gid: u32,
    created: bool,
}

impl Group {
    fn ethand() -> Self {
        let gid =
            |o: &Output| -> Option<u32> { text(&o.stdout).trim().split(':').nth(2)?.parse().ok() };
        let out = run_with_timeout(
            Command::new("getent").args(["group", "ethand"]),
            Duration::from_secs(10),
        );
        if let Some(g) = gid(&out).filter(|_| out.status.success()) {
            return Self {
                gid: g,
                created: false,
            };
        }
        let add = run_with_timeout(
            Command::new("groupadd").args(["--system", "ethand"]),
            Duration::from_secs(10),
        );
        assert!(
            add.status.success(),
            "groupadd ethand: {}",
            text(&add.stderr)
        );
        let out = run_with_timeout(
            Command::new("getent").args(["group", "ethand"]),
            Duration::from_secs(10),
        );
        Self {
            gid: gid(&out).expect("gid of the group just created"),
            created: true,
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.created {
            let _ = Command::new("groupdel").arg("ethand").status();
        }
    }
}

/// `ethand ARGS --socket S` as nobody, with `groups` as its supplementary groups.
fn ethand_as_nobody(d: &Daemon, groups: &[u32], args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"));
    if groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let g: Vec<String> = groups.iter().map(u32::to_string).collect();
        cmd.arg(format!("--groups={}", g.join(",")));
    }
    cmd.arg(ethand_bin())
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .env_remove("ETHAND_CONFIG");
    run_with_timeout(&mut cmd, Duration::from_secs(30))
}

/// The socket is root:ethand 0660; nobody outside the group is refused by the kernel
/// (EACCES), nobody inside it gets status and snapshots; without the group: root only 0600.
#[test]
fn api_socket_is_root_and_group_ethand_0660() {
    let _serial = serial();
    let group = Group::ethand();
    let d = Daemon::start("priv-socket", "");
    let md = fs::metadata(&d.socket).expect("stat the socket");
    let mode = md.mode() & 0o7777;
    eprintln!(
        "observed: socket {} uid {} gid {} mode {mode:o} (ethand gid {})",
        d.socket.display(),
        md.uid(),
        md.gid(),
        group.gid
    );
    assert_eq!((md.uid(), md.gid(), mode), (0, group.gid, 0o660));
    let st = d.status();
    eprintln!("observed: status socket_access {:?}", st.socket_access);
    assert!(
        st.socket_access.contains("group ethand"),
        "{}",
        st.socket_access
    );

    let refused = ethand_as_nobody(&d, &[], &["status"]);
    let err = text(&refused.stderr);
    eprintln!(
        "observed: nobody outside the group: {} {err:?}",
        refused.status
    );
    assert!(
        !refused.status.success(),
        "nobody outside group ethand was answered"
    );
    // Told apart from "no daemon" (no standalone fallback), with the group to join.
    assert!(
        err.contains("permission denied on")
            && err.contains("group ethand")
            && err.contains("usermod -aG ethand")
            && !err.contains("standalone"),
        "not a permission error naming the group: {err}"
    );
    assert_eq!(refused.status.code(), Some(1), "{err}");
    let snap = ethand_as_nobody(&d, &[], &["snapshot", "--pid", "1"]);
    let err = text(&snap.stderr);
    eprintln!(
        "observed: nobody's snapshot outside the group: {} {err:?}",
        snap.status
    );
    assert!(
        err.contains("permission denied on") && !err.contains("standalone"),
        "snapshot fell back or hid the reason: {err}"
    );

    let mut w = workload(&["cpu", "1"]);
    let ok = ethand_as_nobody(&d, &[group.gid], &["status"]);
    eprintln!(
        "observed: nobody in group ethand: ethand status {} ({} bytes)",
        ok.status,
        ok.stdout.len()
    );
    assert!(
        ok.status.success(),
        "status as a group member: {}",
        text(&ok.stderr)
    );
    assert!(text(&ok.stdout).contains("local API socket: root and group ethand"));
    thread::sleep(SETTLE);
    let snap = ethand_as_nobody(
        &d,
        &[group.gid],
        &["snapshot", "--pid", &w.pid.to_string(), "--json"],
    );
    assert!(
        snap.status.success(),
        "snapshot as a group member: {}",
        text(&snap.stderr)
    );
    let t: ethand_tests::TreeSnapshot = serde_json::from_slice(&snap.stdout).expect("TreeSnapshot");
    eprintln!(
        "observed: nobody in group ethand: snapshot of pid {} with {} processes",
        t.root_pid,
        t.processes.len()
    );
    assert_eq!(find_proc(&t, w.pid).pid, w.pid);
    w.go();
    drop(d);

    // A group that does not exist: root only, said in status and the log.
    let d = Daemon::start(
        "priv-socket-nogroup",
        "[daemon]\nsocket_group = \"ethand-no-such-group\"\n",
    );
    let md = fs::metadata(&d.socket).expect("stat the socket");
    let st = d.status();
    eprintln!(
        "observed: without the group: uid {} gid {} mode {:o}, status {:?}",
        md.uid(),
        md.gid(),
        md.mode() & 0o7777,
        st.socket_access
    );
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (0, 0, 0o600));
    assert!(
        st.socket_access.starts_with("root only"),
        "{}",
        st.socket_access
    );
    assert!(d.log_text().contains("does not exist"), "no warning logged");
    let refused = ethand_as_nobody(&d, &[group.gid], &["status"]);
    assert!(
        !refused.status.success(),
        "a group member was answered on a 0600 socket"
    );
}

/// A user outside group ethand asking the daemon (status, snapshot, level): told that the
/// socket refused them and which group to join, exit 1, never "no daemon" followed by the
/// capability error of a standalone measurement it cannot make.
#[test]
fn user_outside_the_group_is_told_the_group_not_a_capability_error() {
    let _serial = serial();
    let _group = Group::ethand();
    let d = Daemon::start("priv-outsider", "");
    let socket = d.socket.display().to_string();
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["snapshot", "--pid", "1"],
        vec!["level", "calls"],
    ] {
        let out = ethand_as_nobody(&d, &[], &args);
        let err = text(&out.stderr);
        eprintln!("observed: nobody: {args:?}: {} {err:?}", out.status);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("ethand: error: permission denied on {socket}: ")),
            "{args:?}: not a permission error on the socket: {err}"
        );
        assert!(
            err.contains("group ethand") && err.contains("or run as root"),
            "{args:?}: the group to join is not named: {err}"
        );
        for wrong in [
            "no ethand daemon",
            "no daemon",
            "standalone",
            "CAP_",
            "capabilit",
        ] {
            assert!(!err.contains(wrong), "{args:?}: says {wrong:?}: {err}");
        }
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}

/// The TCP sockets `pid` listens on, from /proc/net/tcp and tcp6: "addr:port" strings.
fn listening(pid: u32) -> Vec<String> {
    let mut inodes = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
    {
        if let Ok(l) = fs::read_link(e.path()) {
            if let Some(i) = l.to_str().and_then(|s| s.strip_prefix("socket:[")) {
                inodes.push(i.trim_end_matches(']').to_string());
            }
        }
    }
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st == 0A (LISTEN), inode
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let (addr, port) = f[1].split_once(':').expect("addr:port");
                let port = u16::from_str_radix(port, 16).expect("port");
                let ip = if addr.len() == 8 {
                    let v = u32::from_str_radix(addr, 16).expect("ipv4");
                    std::net::Ipv4Addr::from(v.swap_bytes()).to_string()
                } else {
                    format!("[{addr}]")
                };
                out.push(format!("{ip}:{port}"));
            }
        }
    }
    out
}

/// With nothing configured /metrics listens on 127.0.0.1:9477 only: the embedded default,
/// and a daemon started without a [prometheus] section.
#[test]
fn metrics_listen_on_loopback_by_default() {
    let _serial = serial();
    let shown = ethand_tests::ethand(&["config", "show"]);
    let listen = text(&shown.stdout)
        .lines()
        .find(|l| l.starts_with("listen = "))
        .map(str::to_string)
        .expect("prometheus.listen in config show");
    eprintln!("observed: default {listen}");
    assert_eq!(listen, "listen = \"127.0.0.1:9477\"");
    if std::net::TcpListener::bind(("0.0.0.0", 9477)).is_err() {
        eprintln!("SKIPPED the live half: port 9477 is taken on this machine");
        return;
    }
    let socket = temp_path("priv-default", "sock");
    let config = temp_path("priv-default", "toml");
    let log = temp_path("priv-default", "log");
    let _rm = (
        RemoveOnDrop(socket.clone()),
        RemoveOnDrop(config.clone()),
        RemoveOnDrop(log.clone()),
    );
    fs::write(&config, format!("[daemon]\nsocket = {socket:?}\n")).expect("config");
    let mut child = Command::new(ethand_bin())
        .args(["run", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log"))
        .spawn()
        .expect("ethand run");
    let t0 = Instant::now();
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(" ready ")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not ready: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "exited: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let l = listening(child.id());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    eprintln!("observed: the default daemon listens on {l:?}");
    assert_eq!(l, ["127.0.0.1:9477"]);
}

/// A self-signed certificate for localhost / 127.0.0.1 (openssl CLI): (cert, key).
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let out = run_with_timeout(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=localhost",
            ])
            .args([
                "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&crt),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "openssl req: {}", text(&out.stderr));
    (crt, key)
}

/// curl against /metrics: (HTTP status, headers, body), or the curl failure (exit code).
fn curl(url: &str, ca: &Path, auth: Option<&str>) -> Result<(u16, String, String), i32> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-D", "-", "--cacert"])
        .arg(ca)
        .arg(url);
    if let Some(a) = auth {
        cmd.args(["-u", a]);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(20));
    if !out.status.success() {
        return Err(out.status.code().unwrap_or(-1));
    }
    let all = text(&out.stdout);
    let (head, body) = all.split_once("\r\n\r\n").unwrap_or((&all, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, head.to_string(), body.to_string()))
}

struct RemoveDir(PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// /metrics over TLS with basic auth from a web-config file: the right credentials get the
/// real series (the daemon's own process among them), a wrong password or none 401 with
/// `WWW-Authenticate: Basic`, plain HTTP no metrics; a real Prometheus scrapes it with
/// tls_config and basic_auth. Bad files stop the start naming the file.
#[test]
fn metrics_over_tls_with_basic_auth() {
    let _serial = serial();
    let dir = temp_path("priv-tls", "d");
    fs::create_dir_all(&dir).expect("mkdir");
    let _rm = RemoveDir(dir.clone());
    let (crt, _key) = self_signed(&dir);
    let password = "correct horse battery staple";
    let hash = bcrypt::hash(password, 10).expect("bcrypt");
    let web = dir.join("web.yml");
    // Relative paths: to the web-config file's directory, as exporter-toolkit reads them.
    fs::write(
        &web,
        format!("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  prometheus: {hash}\n"),
    )
    .expect("web.yml");
    let d = Daemon::start(
        "priv-tls",
        // Named: a process gets a slot of its own only once 30 s old.
        &format!("[prometheus]\nweb_config_file = {web:?}\ncomms = [\"ethand\"]\n"),
    );
    let url = format!("https://127.0.0.1:{}/metrics", d.port);

    let (code, _, body) =
        curl(&url, &crt, Some(&format!("prometheus:{password}"))).expect("https scrape");
    let own = format!("pid=\"{}\"", d.pid());
    let own_series: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("ethand_process_cpu_seconds_total{") && l.contains(&own))
        .collect();
    eprintln!(
        "observed: https with the password: {code}, {} lines, the daemon's own cpu series {own_series:?}",
        body.lines().count()
    );
    assert_eq!(code, 200);
    assert_eq!(own_series.len(), 1, "the daemon's own process series");

    for auth in [Some("prometheus:wrong"), Some("nobody:wrong"), None] {
        let (code, head, body) = curl(&url, &crt, auth).expect("https request");
        let challenge = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("www-authenticate:"))
            .map(str::to_string);
        eprintln!("observed: credentials {auth:?}: {code} {challenge:?}");
        assert_eq!(code, 401, "{auth:?}");
        assert_eq!(
            challenge.as_deref().map(str::trim),
            Some("www-authenticate: Basic")
        );
        assert!(
            !body.contains("ethand_"),
            "metrics served without the password"
        );
    }

    let plain = curl(
        &format!("http://127.0.0.1:{}/metrics", d.port),
        &crt,
        Some(&format!("prometheus:{password}")),
    );
    eprintln!(
        "observed: plain http: {:?}",
        plain.as_ref().map(|(c, _, b)| (*c, b.len()))
    );
    assert!(
        plain
            .as_ref()
            .map_or(true, |(c, _, b)| *c != 200 && !b.contains("ethand_")),
        "plain http served metrics"
    );

    prometheus_scrapes_over_tls(&d, &crt, password, &dir);
    drop(d);

    // Bad files: the start fails, naming the file (and the key or certificate).
    let cases = [
        ("unknown-key.yml", "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  client_ca_file: ca.crt\n".to_string(), "client_ca_file"),
        ("missing-cert.yml", "tls_server_config:\n  cert_file: missing.crt\n  key_file: tls.key\n".to_string(), "missing.crt"),
        ("bad-hash.yml", "basic_auth_users:\n  prometheus: plaintext\n".to_string(), "basic_auth_users.prometheus"),
        ("key-mismatch.yml", "tls_server_config:\n  cert_file: other.crt\n  key_file: tls.key\n".to_string(), "other.crt"),
    ];
    let other = dir.join("other");
    fs::create_dir_all(&other).expect("mkdir");
    let (ocrt, _) = self_signed(&other);
    fs::copy(&ocrt, dir.join("other.crt")).expect("copy");
    for (name, yaml, names) in cases {
        let f = dir.join(name);
        fs::write(&f, yaml).expect("write");
        let config = dir.join(format!("{name}.toml"));
        fs::write(
            &config,
            format!(
                "[daemon]\nsocket = {:?}\n[prometheus]\nlisten = \"127.0.0.1:{}\"\nweb_config_file = {f:?}\n",
                dir.join("bad.sock"),
                free_port()
            ),
        )
        .expect("config");
        let out = run_with_timeout(
            Command::new(ethand_bin())
                .args(["run", "--config"])
                .arg(&config)
                .env("NO_COLOR", "1"),
            Duration::from_secs(30),
        );
        let err = text(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.starts_with("ethand: error:"))
            .unwrap_or("")
            .to_string();
        eprintln!("observed: {name}: {} {line}", out.status);
        // A configuration error: exit 2, like a bad key.
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            line.contains(&f.display().to_string()) && line.contains(names),
            "{name}: {line}"
        );
    }
}

/// GET on Prometheus' HTTP API (HTTP/1.0, no client crate): the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut r = Vec::new();
    s.read_to_end(&mut r).ok()?;
    let r = text(&r);
    (r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
        .then(|| r.split_once("\r\n\r\n").map(|(_, b)| b.to_string()))?
}

/// A real Prometheus scrapes the daemon with scheme https, tls_config (our CA) and
/// basic_auth: the target is up and the daemon's own series are stored.
fn prometheus_scrapes_over_tls(d: &Daemon, ca: &Path, password: &str, dir: &Path) {
    let bin = ethand_tests::prometheus_server::prometheus_bin();
    let port = free_port();
    let cfg = dir.join("prometheus.yml");
    fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: ethand\n    scheme: https\n    tls_config:\n      ca_file: {ca:?}\n      server_name: localhost\n    basic_auth:\n      username: prometheus\n      password: {password:?}\n    static_configs:\n      - targets: [\"127.0.0.1:{}\"]\n",
            d.port
        ),
    )
    .expect("prometheus.yml");
    let log = dir.join("prometheus.log");
    let mut child = Command::new(&bin)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let query = format!(
        "/api/v1/query?query=ethand_process_cpu_seconds_total%7Bpid%3D%22{}%22%7D",
        d.pid()
    );
    let t0 = Instant::now();
    let (up, own) = loop {
        let up = http_get(port, "/api/v1/query?query=up").unwrap_or_default();
        let own = http_get(port, &query).unwrap_or_default();
        if (up.contains("\"1\"]") && own.contains("\"pid\""))
            || t0.elapsed() > Duration::from_secs(30)
        {
            break (up, own);
        }
        thread::sleep(Duration::from_millis(500));
    };
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "observed: Prometheus over https+basic auth after {:?}: up {up}, own series {own}",
        t0.elapsed()
    );
    assert!(
        up.contains("\"job\":\"ethand\"") && up.contains("\"1\"]"),
        "target not up: {up}\n{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        own.contains(&format!("\"pid\":\"{}\"", d.pid())),
        "no own series: {own}"
    );
}

/// The capability names of a mask, as the unit writes them.
fn mask_of(names: &[String]) -> u64 {
    names.iter().map(|c| 1u64 << cap_bit(c)).sum()
}

/// The kept set as docs/security.md states it: the line "Kept after start-up: CAP_A CAP_B".
fn documented_kept() -> Vec<String> {
    let doc = fs::read_to_string(SECURITY_MD).expect("read docs/security.md");
    let line = doc
        .lines()
        .find_map(|l| l.strip_prefix("Kept after start-up (default configuration): "))
        .expect("docs/security.md states the kept capabilities");
    line.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .to_string()
        })
        .filter(|w| w.starts_with("CAP_"))
        .collect()
}

/// Every thread's capability sets: (tid, eff, prm, bnd, amb, inh).
fn thread_caps(pid: u32) -> Vec<(u32, u64, u64, u64, u64, u64)> {
    let mut out = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .flatten()
    {
        let tid: u32 = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse().ok())
            .expect("tid");
        let Ok(s) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let hex = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or_else(|| panic!("{k} of thread {tid}"))
        };
        out.push((
            tid,
            hex("CapEff:"),
            hex("CapPrm:"),
            hex("CapBnd:"),
            hex("CapAmb:"),
            hex("CapInh:"),
        ));
    }
    out
}

/// Run as the unit runs it: after start-up every thread holds exactly the documented kept
/// set (effective, permitted and bounding; nothing ambient or inheritable), and the daemon
/// still works: a nobody process's syscalls counted exactly, a GPU library of nobody's that
/// appears after the drop attached and its launches counted exactly, `ethand level` switched
/// both ways with the library re-attached.
#[test]
fn capabilities_dropped_after_start_up_and_still_measuring() {
    let _serial = serial();
    let caps = unit_caps();
    let kept = documented_kept();
    let want = mask_of(&kept);
    // Sampled BPF statistics, a short period: each window re-enables them (through the
    // helper that holds CAP_SYS_ADMIN).
    let d = Daemon::start_with(
        "priv-caps",
        &format!("{GPU_TOML}[daemon]\nbpf_stats_window_ms = 500\nbpf_stats_period_ms = 1500\n"),
        &systemd_like(&caps),
        &[],
    );
    let threads = thread_caps(d.pid());
    eprintln!("observed: unit caps {caps:?}, documented kept {kept:?} ({want:x})");
    for (tid, eff, prm, bnd, amb, inh) in &threads {
        eprintln!(
            "observed: thread {tid}: CapEff {eff:x} CapPrm {prm:x} CapBnd {bnd:x} CapAmb {amb:x} CapInh {inh:x}"
        );
    }
    assert!(threads.len() >= 3, "{} threads", threads.len());
    for (tid, eff, prm, bnd, amb, inh) in &threads {
        assert_eq!(
            (*eff, *prm, *bnd, *amb, *inh),
            (want, want, want, 0, 0),
            "thread {tid}"
        );
    }
    let st = d.status();
    assert_eq!(
        mask_of(&st.capabilities),
        want,
        "status {:?}",
        st.capabilities
    );
    assert!(d.log_text().contains("capabilities dropped"));
    let stats_before = st.bpf_stats_enabled_ms;

    // A nobody workload, started after the drop: syscalls exact.
    let mut w = nobody_workload(&["syscalls", "5000", "200"]);
    let m = measure(&d, &mut w);
    let getpid = m.syscall_delta(w.pid, libc::SYS_getpid);
    let openat = m.syscall_delta(w.pid, libc::SYS_openat);
    eprintln!("observed: after the drop, nobody's getpid {getpid:?}, openat {openat:?}");
    assert_eq!((getpid, openat), ((5000, 0), (200, 200)));
    w.finish();

    // A GPU library of nobody's, first mapped after the drop (a 0700 directory: needs
    // CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_PERFMON at run time).
    let gpu = PrivateGpu::new("priv-caps-gpu");
    let r = nobody_launches(&d, &gpu);
    eprintln!("observed: after the drop, nobody's launches (ethand, truth) {r:?}");
    assert_eq!(r, Ok((LAUNCHES, LAUNCHES)));
    for level in ["op", "system", "process"] {
        let out = d.cli(&["level", level]);
        eprintln!(
            "observed: ethand level {level}: {} {}",
            out.status,
            text(&out.stdout).trim()
        );
        assert!(out.status.success(), "level {level}: {}", text(&out.stderr));
    }
    let r = nobody_launches(&d, &gpu);
    eprintln!("observed: after level op -> system -> process, launches {r:?}");
    assert_eq!(r, Ok((LAUNCHES, LAUNCHES)));
    let st = d.status();
    eprintln!(
        "observed: BPF statistics {:?}, on for {} ms after the drop",
        st.bpf_stats,
        st.bpf_stats_enabled_ms - stats_before
    );
    assert_eq!(
        st.bpf_stats, "sampled",
        "BPF_ENABLE_STATS failed after the drop"
    );
    assert!(st.bpf_stats_enabled_ms > stats_before + 500);
    let after = thread_caps(d.pid());
    assert!(
        after.iter().all(|t| (t.1, t.2, t.3) == (want, want, want)),
        "a thread regained capabilities: {after:?}"
    );

    // The daemon runs as the unit's user; CAP_SYS_ADMIN is held by the statistics helper
    // alone, as that user, with nothing else (no capability it could pass on, no way to
    // gain one by exec).
    let uid = u64::from(ethand_tests::system_user("ethand").0);
    let daemon_uids = proc_field(d.pid(), "Uid:");
    eprintln!(
        "observed: daemon Uid {daemon_uids:?}, status user {:?}",
        st.user
    );
    assert_eq!(daemon_uids, [uid; 4], "the daemon's uids");
    assert!(st.user.starts_with("ethand (uid "), "{}", st.user);
    let all = children(d.pid());
    let helpers = helpers_named(d.pid(), "ethand-stats");
    assert_eq!(helpers.len(), 1, "one statistics helper: {all:?}");
    // The reader's supervisor: CAP_SETUID, CAP_SETGID and CAP_SYS_PTRACE alone (its
    // workers take a process owner's credentials and keep CAP_SYS_PTRACE), as that user.
    let readers = helpers_named(d.pid(), "ethand-reader");
    assert_eq!(readers.len(), 1, "one reader: {all:?}");
    assert_eq!(all.len(), 2, "no other child: {all:?}");
    let r = readers[0];
    let reader_caps = (1u64 << cap_bit("CAP_SETUID"))
        | (1u64 << cap_bit("CAP_SETGID"))
        | (1u64 << cap_bit("CAP_SYS_PTRACE"));
    let (eff, prm, bnd, amb) = (
        proc_hex(r, "CapEff:"),
        proc_hex(r, "CapPrm:"),
        proc_hex(r, "CapBnd:"),
        proc_hex(r, "CapAmb:"),
    );
    eprintln!(
        "observed: reader {r}: Uid {:?} CapEff {eff:x} CapPrm {prm:x} CapBnd {bnd:x} CapAmb {amb:x} NoNewPrivs {:?}",
        proc_field(r, "Uid:"),
        proc_field(r, "NoNewPrivs:")
    );
    assert_eq!(
        (eff, prm, bnd, amb),
        (reader_caps, reader_caps, reader_caps, 0)
    );
    assert_eq!(proc_field(r, "Uid:"), [uid; 4]);
    assert_eq!(proc_field(r, "NoNewPrivs:"), [1]);
    let h = helpers[0];
    let admin = 1u64 << cap_bit("CAP_SYS_ADMIN");
    let (eff, prm, bnd, amb, inh) = (
        proc_hex(h, "CapEff:"),
        proc_hex(h, "CapPrm:"),
        proc_hex(h, "CapBnd:"),
        proc_hex(h, "CapAmb:"),
        proc_hex(h, "CapInh:"),
    );
    eprintln!(
        "observed: helper {h}: Uid {:?} CapEff {eff:x} CapPrm {prm:x} CapBnd {bnd:x} CapAmb {amb:x} CapInh {inh:x} NoNewPrivs {:?}",
        proc_field(h, "Uid:"),
        proc_field(h, "NoNewPrivs:")
    );
    assert_eq!((eff, prm, bnd, amb, inh), (admin, admin, admin, 0, 0));
    assert_eq!(proc_field(h, "Uid:"), [uid; 4]);
    assert_eq!(proc_field(h, "NoNewPrivs:"), [1]);

    // With the statistics off no helper is started.
    drop(d);
    let d = Daemon::start_with(
        "priv-caps-nostats",
        &format!("{GPU_TOML}[daemon]\nbpf_stats = \"off\"\n"),
        &systemd_like(&caps),
        &[],
    );
    eprintln!("observed: bpf_stats off: {:?}", d.status().capabilities);
    assert!(
        helpers_named(d.pid(), "ethand-stats").is_empty(),
        "a statistics helper without statistics"
    );
    for (tid, eff, prm, bnd, _, _) in &thread_caps(d.pid()) {
        assert_eq!((*eff, *prm, *bnd), (want, want, want), "thread {tid}");
    }
}

/// `ethand-workload ARGS` as nobody (no supplementary groups): another user's process.
fn nobody_workload(args: &[&str]) -> ethand_tests::Workload {
    let ids = [format!("--reuid={NOBODY}"), format!("--regid={NOBODY}")];
    let mut a: Vec<&str> = vec![&ids[0], &ids[1], "--clear-groups"];
    a.push(env!("CARGO_BIN_EXE_ethand-workload"));
    a.extend_from_slice(args);
    ethand_tests::Workload::start("setpriv", &a)
}

/// The numbers of a /proc/PID/status line ("Uid:" -> its four uids).
fn proc_field(pid: u32, key: &str) -> Vec<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn proc_hex(pid: u32, key: &str) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let v = s
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key}"));
    u64::from_str_radix(v.trim(), 16).expect("hex")
}

/// The live child processes of `pid`.
/// The daemon's child processes named `comm` ("ethand-stats": the BPF statistics helper;
/// "ethand-reader": the reader's supervisor).
fn helpers_named(pid: u32, comm: &str) -> Vec<u32> {
    children(pid)
        .into_iter()
        .filter(|p| fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

fn children(pid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// A workload with two secrets and an allowed job id in its environment: only the job id
/// reaches /metrics, the snapshot JSON, the HTML report and the (debug-level) daemon log;
/// neither the secrets' values nor their names appear anywhere. (attribution.rs checks the
/// allow-listed identity in detail; this adds the HTML report, the names and a debug log.)
#[test]
fn environment_outside_the_allowlist_never_leaves_the_daemon() {
    let _serial = serial();
    let token = "tok-9f8e7d6c5b4a-ethand-privilege-e2e";
    let aws = "wJalrXUtnFEMI-K7MDENG-privilege-e2e-KEY";
    let job = "slurm-job-424242";
    let d = Daemon::start(
        "priv-env",
        "[daemon]\nlog = \"debug\"\n[prometheus]\ncomms = [\"ethand-workload\"]\n",
    );
    let mut w = ethand_tests::Workload::start(
        "env",
        &[
            &format!("SECRET_TOKEN={token}"),
            &format!("AWS_SECRET_ACCESS_KEY={aws}"),
            &format!("SLURM_JOB_ID={job}"),
            env!("CARGO_BIN_EXE_ethand-workload"),
            "cpu",
            "1",
        ],
    );
    w.go();
    thread::sleep(SETTLE * 2);
    let secret_in = |what: &str, s: &str| {
        for needle in [token, aws, "SECRET_TOKEN", "AWS_SECRET_ACCESS_KEY"] {
            assert!(!s.contains(needle), "{needle} is in {what}");
        }
    };
    let raw = d.cli(&["snapshot", "--pid", &w.pid.to_string(), "--json"]);
    assert!(raw.status.success(), "{}", text(&raw.stderr));
    let json = text(&raw.stdout);
    secret_in("the snapshot JSON", &json);
    let t: ethand_tests::TreeSnapshot = serde_json::from_str(&json).expect("TreeSnapshot");
    let wl = find_proc(&t, w.pid)
        .workload
        .clone()
        .expect("workload identity");
    eprintln!(
        "observed: snapshot workload job_id {:?}, env {:?}",
        wl.job_id, wl.env
    );
    assert_eq!(wl.job_id.as_deref(), Some(job));
    assert_eq!(wl.env.keys().collect::<Vec<_>>(), ["SLURM_JOB_ID"]);

    let body = d.metrics();
    secret_in("/metrics", &body);
    let series: Vec<&str> = body
        .lines()
        .filter(|l| {
            l.starts_with("ethand_process_cpu_seconds_total{")
                && l.contains(&format!("pid=\"{}\"", w.pid))
        })
        .collect();
    eprintln!("observed: /metrics {series:?}");
    assert!(
        series.len() == 1 && series[0].contains(&format!("job_id=\"{job}\"")),
        "{series:?}"
    );

    let html = temp_path("priv-env", "html");
    let _rm = RemoveOnDrop(html.clone());
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &w.pid.to_string(),
        "--html",
        html.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = fs::read_to_string(&html).expect("HTML report");
    eprintln!("observed: HTML report {} bytes", report.len());
    assert!(
        report.contains(&w.pid.to_string()),
        "the report is not about the workload"
    );
    secret_in("the HTML report", &report);
    secret_in("the terminal snapshot", &text(&out.stdout));
    w.finish();
    thread::sleep(SETTLE);
    let log = d.log_text();
    eprintln!("observed: debug log {} lines", log.lines().count());
    assert!(log.lines().count() > 5, "the debug log is empty");
    secret_in("the daemon log", &log);
}

/// Outside systemd, `daemon.user` makes a daemon started as root switch every thread to that
/// user after start-up (the statistics helper too), and it still measures: another user's
/// syscalls exactly, another user's GPU library attached after the switch.
#[test]
fn daemon_user_switches_every_thread_and_still_measures() {
    let _serial = serial();
    let uid = u64::from(ethand_tests::system_user("ethand").0);
    let want = mask_of(&documented_kept());
    let d = Daemon::start(
        "priv-user",
        &format!("{GPU_TOML}[daemon]\nuser = \"ethand\"\n"),
    );
    let st = d.status();
    eprintln!(
        "observed: status user {:?}, capabilities {:?}",
        st.user, st.capabilities
    );
    assert!(st.user.starts_with("ethand (uid "), "{}", st.user);
    assert!(
        d.log_text().contains("user=\"ethand (uid"),
        "the switch is not logged"
    );
    for tid in fs::read_dir(format!("/proc/{}/task", d.pid()))
        .expect("tasks")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let s = fs::read_to_string(format!("/proc/{}/task/{tid}/status", d.pid())).expect("status");
        let uids: Vec<u64> = s
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .expect("Uid")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        assert_eq!(uids, [uid; 4], "thread {tid}");
    }
    assert_eq!(mask_of(&st.capabilities), want);
    let helpers = helpers_named(d.pid(), "ethand-stats");
    assert_eq!(helpers.len(), 1, "{:?}", children(d.pid()));
    let readers = helpers_named(d.pid(), "ethand-reader");
    assert_eq!(readers.len(), 1, "{:?}", children(d.pid()));
    assert_eq!(
        proc_field(readers[0], "Uid:"),
        [uid; 4],
        "the reader's uids"
    );
    assert_eq!(
        proc_field(helpers[0], "Uid:"),
        [uid; 4],
        "the helper's uids"
    );
    assert_eq!(
        proc_hex(helpers[0], "CapEff:"),
        1u64 << cap_bit("CAP_SYS_ADMIN")
    );

    let mut w = nobody_workload(&["syscalls", "3000", "100"]);
    let m = measure(&d, &mut w);
    let counted = (
        m.syscall_delta(w.pid, libc::SYS_getpid),
        m.syscall_delta(w.pid, libc::SYS_openat),
    );
    eprintln!("observed: as user ethand, nobody's (getpid, openat) {counted:?}");
    assert_eq!(counted, ((3000, 0), (100, 100)));
    w.finish();
    let gpu = PrivateGpu::new("priv-user-gpu");
    let r = nobody_launches(&d, &gpu);
    eprintln!("observed: as user ethand, nobody's launches {r:?}");
    assert_eq!(r, Ok((LAUNCHES, LAUNCHES)));
}

/// The table "What the kept capabilities permit" of docs/security.md, row by row, against
/// what a process with exactly those privileges manages (`ethand-hostile cap-probe`): the
/// daemon (user ethand, kept set), the same set as uid 0 (why a dedicated user), the
/// statistics helper (CAP_SYS_ADMIN alone) and the reader's supervisor (CAP_SETUID,
/// CAP_SETGID, CAP_SYS_PTRACE).
#[test]
fn what_the_kept_capabilities_permit_is_what_security_md_says() {
    let _serial = serial();
    ethand_tests::system_user("ethand");
    let kept = documented_kept();
    // Another user's process and files.
    let victim = nobody_workload(&["cpu", "1"]);
    let others = temp_path("priv-others", "txt");
    let _rm1 = RemoveOnDrop(others.clone());
    fs::write(&others, "nobody's\n").expect("write");
    std::os::unix::fs::chown(&others, Some(NOBODY), Some(NOBODY)).expect("chown");
    fs::set_permissions(&others, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let root_file = temp_path("priv-rootfile", "txt");
    let _rm2 = RemoveOnDrop(root_file.clone());
    fs::write(&root_file, "root's\n").expect("write");
    fs::set_permissions(
        &root_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");

    let caps = |list: &[String]| -> String {
        list.iter()
            .map(|c| format!(",+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect()
    };
    let probe = |who: &[String], set: &str| -> BTreeMap<String, String> {
        let mut args: Vec<String> = who.to_vec();
        args.extend([
            format!("--bounding-set=-all{set}"),
            format!("--inh-caps=-all{set}"),
            format!("--ambient-caps=-all{set}"),
            "--no-new-privs".into(),
            env!("CARGO_BIN_EXE_ethand-hostile").into(),
            "cap-probe".into(),
            victim.pid.to_string(),
            others.display().to_string(),
            root_file.display().to_string(),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = ethand_tests::Workload::start("setpriv", &refs);
        p.go().0
    };
    let as_ethand: Vec<String> = ["--reuid=ethand", "--regid=ethand", "--init-groups"]
        .map(String::from)
        .to_vec();
    let as_root: Vec<String> = vec!["--securebits=+noroot,+noroot_locked".into()];
    let columns = [
        ("daemon", probe(&as_ethand, &caps(&kept))),
        ("uid 0", probe(&as_root, &caps(&kept))),
        (
            "helper",
            probe(&as_ethand, &caps(&["CAP_SYS_ADMIN".into()])),
        ),
        (
            "reader",
            probe(
                &as_ethand,
                &caps(&[
                    "CAP_SETUID".into(),
                    "CAP_SETGID".into(),
                    "CAP_SYS_PTRACE".into(),
                ]),
            ),
        ),
    ];
    for (who, seen) in &columns {
        eprintln!("observed: {who}: {seen:?}");
    }
    // The documented table: | what (`key`) | daemon | uid 0 | helper | reader |
    let doc = fs::read_to_string(SECURITY_MD).expect("read docs/security.md");
    let table: Vec<(String, Vec<String>)> = doc
        .split("### What the kept capabilities permit")
        .nth(1)
        .expect("docs/security.md has the table")
        // That section only: up to the next heading.
        .split("\n#")
        .next()
        .expect("the section")
        .lines()
        .filter(|l| l.starts_with("| ") && (l.contains("| allowed") || l.contains("| refused")))
        .map(|l| {
            let cells: Vec<String> = l.split('|').map(|c| c.trim().to_string()).collect();
            let key = cells[1].split('`').nth(1).expect("`key`").to_string();
            (key, cells[2..6].to_vec())
        })
        .collect();
    assert_eq!(table.len(), 9, "rows of the table: {table:?}");
    let as_doc = |v: &str| {
        if v == "ok" {
            "allowed".to_string()
        } else {
            format!("refused ({v})")
        }
    };
    for (key, documented) in &table {
        for ((who, seen), doc_cell) in columns.iter().zip(documented) {
            let v = seen
                .get(key)
                .unwrap_or_else(|| panic!("the probe reported no {key}: {seen:?}"));
            assert_eq!(&as_doc(v), doc_cell, "{key} for the {who}");
        }
    }
    drop(victim);
}
