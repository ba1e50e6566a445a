//! The CLI's answers to bad input, missing privileges and a missing daemon.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, TreeSnapshot, ethand, ethand_bin, free_port, run_with_timeout, serial, temp_path, text,
};

use crate::workload;

/// A config file whose first lines keep a daemon that wrongly accepted it off the real socket;
/// `body` starts at line 4.
fn config_file(name: &str, body: &str) -> PathBuf {
    let path = temp_path(name, "toml");
    let sock = temp_path(name, "sock");
    let head = format!("[daemon]\nsocket = {sock:?}\ninterval_ms = 200\n");
    fs::write(&path, format!("{head}{body}")).expect("write config");
    path
}

/// `ethand run --config F` must refuse F: exit 2, one error line "ethand: error: F:LINE: ..."
/// that contains every string of `names`.
fn assert_config_error(name: &str, body: &str, line: usize, names: &[&str]) {
    let path = config_file(name, body);
    let mut cmd = Command::new(ethand_bin());
    cmd.arg("run").arg("--config").arg(&path);
    if !body.contains("listen") {
        // Keeps a daemon that wrongly accepted the file off the default port.
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", free_port()));
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(10));
    let _ = fs::remove_file(&path);
    let err = text(&out.stderr);
    eprintln!("observed: {name}: {} {err:?}", out.status);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name}: exit status; stderr: {err}"
    );
    assert_eq!(
        err.lines().count(),
        1,
        "{name}: expected one error line, got {err:?}"
    );
    let prefix = format!("ethand: error: {}:{line}: ", path.display());
    assert!(
        err.starts_with(&prefix),
        "{name}: expected an error starting with {prefix:?}, got {err:?}"
    );
    for n in names {
        assert!(
            err.contains(n),
            "{name}: the error does not name {n:?}: {err:?}"
        );
    }
}

#[test]
fn config_unknown_key() {
    let _serial = serial();
    assert_config_error("unknown-key", "bogus_key = 1\n", 4, &["bogus_key"]);
}

/// The key also exists in an earlier table: the line must be the offending one.
#[test]
fn config_unknown_key_line_is_in_its_own_table() {
    let _serial = serial();
    let body = "[prometheus]\nenabled = true\n\n[probes]\nenabled = true\n";
    assert_config_error("unknown-key-table", body, 8, &["enabled"]);
}

#[test]
fn config_wrong_type() {
    let _serial = serial();
    assert_config_error(
        "wrong-type",
        "[prometheus]\n\ntop_n = \"ten\"\n",
        6,
        &["top_n"],
    );
}

/// `syscalls` is a bool in [probes] and a number in [maps]: the wrong one is in [maps].
#[test]
fn config_wrong_type_line_is_in_its_own_table() {
    let _serial = serial();
    assert_config_error(
        "wrong-type-table",
        "[probes]\nsyscalls = true\n\n[maps]\nsyscalls = \"big\"\n",
        8,
        &["syscalls"],
    );
}

#[test]
fn config_bad_listen_address() {
    let _serial = serial();
    assert_config_error(
        "bad-listen",
        "[prometheus]\nlisten = \"nonsense\"\n",
        5,
        &["prometheus.listen"],
    );
}

#[test]
fn snapshot_of_an_unknown_pid_with_a_daemon() {
    let _serial = serial();
    let d = Daemon::start("unknown-pid", "");
    let out = d.cli(&["snapshot", "--pid", "4000000", "--json"]);
    let err = text(&out.stderr);
    eprintln!("observed: {} {err:?}", out.status);
    assert_eq!(out.status.code(), Some(3), "exit status; stderr: {err}");
    assert!(
        err.contains("no process with pid 4000000"),
        "unclear message: {err:?}"
    );
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
}

#[test]
fn snapshot_of_an_unknown_pid_without_a_daemon() {
    let _serial = serial();
    let sock = temp_path("no-daemon", "sock");
    let out = ethand(&[
        "snapshot",
        "--pid",
        "4000000",
        "--json",
        "--socket",
        sock.to_str().expect("utf-8"),
    ]);
    let err = text(&out.stderr);
    eprintln!("observed: {} {err:?}", out.status);
    assert_eq!(out.status.code(), Some(3), "exit status; stderr: {err}");
    assert!(
        err.contains("no process with pid 4000000"),
        "unclear message: {err:?}"
    );
}

/// As nobody without capabilities: a prompt failure with one error line naming CAP_BPF.
#[test]
fn run_without_cap_bpf_fails_with_one_clear_error() {
    let _serial = serial();
    let port = free_port();
    let sock = temp_path("nocap", "sock");
    let path = temp_path("nocap", "toml");
    fs::write(
        &path,
        format!("[daemon]\nsocket = {sock:?}\n\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .expect("write config");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    let t0 = Instant::now();
    let out = run_with_timeout(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ])
            .arg(ethand_bin())
            .args(["run", "--config"])
            .arg(&path)
            .env("NO_COLOR", "1"),
        Duration::from_secs(10),
    );
    let _ = fs::remove_file(&path);
    let err = text(&out.stderr);
    eprintln!(
        "observed: {} after {:?}; stderr:\n{err}",
        out.status,
        t0.elapsed()
    );
    assert!(!out.status.success(), "ethand run as nobody succeeded");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ethand: error:"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one `ethand: error:` line, got {errors:?}"
    );
    assert!(
        errors[0].contains("CAP_BPF"),
        "the error does not mention CAP_BPF: {}",
        errors[0]
    );
    assert!(!err.contains("panicked"), "ethand panicked: {err}");
}

/// No daemon: `ethand snapshot` attaches its own probes for --duration seconds.
#[test]
fn standalone_snapshot_measures_for_the_duration() {
    let _serial = serial();
    let sock = temp_path("nothing", "sock");
    let mut w = workload(&["getpid-loop"]);
    w.send_byte();
    let out = ethand(&[
        "snapshot",
        "--pid",
        &w.pid.to_string(),
        "--duration",
        "2",
        "--json",
        "--socket",
        sock.to_str().expect("utf-8"),
    ]);
    let done = w.stop();
    let err = text(&out.stderr);
    assert!(
        out.status.success(),
        "ethand snapshot (standalone) failed: {} {err}",
        out.status
    );
    let t: TreeSnapshot = serde_json::from_slice(&out.stdout).expect("a TreeSnapshot");
    let p = ethand_tests::find_proc(&t, w.pid);
    let (count, errors) = ethand_tests::syscall(p, libc::SYS_getpid);
    let made = done.u64("getpid");
    eprintln!(
        "observed: source {:?}, measured_ms {}, getpid count {count} (errors {errors}) of {made} made",
        t.source, t.measured_ms
    );
    assert_eq!(t.source, ethand_snapshot::SnapshotSource::Standalone);
    assert!(
        t.measured_ms >= 2000,
        "measured_ms {} < 2000",
        t.measured_ms
    );
    assert!(
        count > 0 && count <= made,
        "getpid count {count}: expected 1..={made}"
    );
    assert_eq!(errors, 0, "getpid errors");
    w.finish();
}

/// Values that used to be accepted, silence the log, or fail late with no key named: each is
/// refused at once, exit 2, naming its key and line.
#[test]
fn config_values_out_of_range_name_their_key() {
    let _serial = serial();
    for (name, body, line, key) in [
        ("log-inf", "log = \"inf\"\n", 4, "daemon.log"),
        (
            "max-procs",
            "max_processes = 0\n",
            4,
            "daemon.max_processes",
        ),
        ("maps-zero", "[maps]\nthreads = 0\n", 5, "maps.threads"),
        (
            "overflow",
            "[prometheus]\ntop_n = 99999999999999999999\n",
            5,
            "prometheus.top_n",
        ),
        (
            "unknown-table",
            "[deamon]\ninterval_ms = 100\n",
            4,
            "deamon",
        ),
    ] {
        assert_config_error(name, body, line, &[key]);
    }
}

/// Errors only `ethand run` can find (the socket path, the web-config file, the user): exit
/// 2, the key named, before any probe is loaded.
#[test]
fn run_time_configuration_errors_exit_2() {
    let _serial = serial();
    let long = format!("/tmp/{}.sock", "s".repeat(120));
    for (name, toml, key) in [
        (
            "long-socket",
            format!("[daemon]\nsocket = {long:?}\n"),
            "daemon.socket",
        ),
        (
            "empty-socket",
            "[daemon]\nsocket = \"\"\n".into(),
            "daemon.socket",
        ),
        (
            "no-web-config",
            format!(
                "[daemon]\nsocket = {:?}\n[prometheus]\nweb_config_file = \"/nonexistent/web.yml\"\n",
                temp_path("nowebcfg", "sock")
            ),
            "prometheus.web_config_file",
        ),
        (
            "no-user",
            format!(
                "[daemon]\nsocket = {:?}\nuser = \"ethand-no-such-user\"\n",
                temp_path("nouser", "sock")
            ),
            "daemon.user",
        ),
    ] {
        let path = temp_path(name, "toml");
        fs::write(&path, toml).expect("write config");
        let t0 = Instant::now();
        let out = run_with_timeout(
            Command::new(ethand_bin())
                .args([
                    "run",
                    "--listen",
                    &format!("127.0.0.1:{}", free_port()),
                    "--config",
                ])
                .arg(&path)
                .env("NO_COLOR", "1"),
            Duration::from_secs(20),
        );
        let _ = fs::remove_file(&path);
        let err = text(&out.stderr);
        eprintln!(
            "observed: {name}: {} after {:?}: {err:?}",
            out.status,
            t0.elapsed()
        );
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(key), "{name}: {err}");
        assert!(
            !err.contains("attached probe"),
            "{name}: probes loaded first"
        );
    }
    for bad in ["", &long] {
        let out = ethand(&["status", "--socket", bad]);
        eprintln!(
            "observed: --socket of {} bytes: {} {}",
            bad.len(),
            out.status,
            text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    }
}

/// A socket that takes the connection and never answers (a hung or impostor daemon): the
/// client gives up after --timeout, says so, exit 1, and does not fall back to measuring on
/// its own; one that answers something else is named not an ethand daemon.
#[test]
fn client_tells_a_silent_or_foreign_socket_from_no_daemon() {
    let _serial = serial();
    let sock = temp_path("silent", "sock");
    let _ = fs::remove_file(&sock);
    let _rm = ethand_tests::RemoveOnDrop(sock.clone());
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let s = sock.to_str().expect("utf-8");
    for args in [
        vec!["status"],
        vec!["snapshot", "--pid", "1"],
        vec!["level", "process"],
    ] {
        let mut all = args.clone();
        all.extend(["--socket", s, "--timeout", "2"]);
        let t0 = Instant::now();
        let out = ethand(&all);
        let took = t0.elapsed();
        let err = text(&out.stderr);
        eprintln!(
            "observed: {args:?} against a silent socket: {} after {took:?}: {err:?}",
            out.status
        );
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("did not answer within"), "{err}");
        assert!(!err.contains("standalone"), "fell back: {err}");
        // `level` waits at least the 10 s a level change may take.
        assert!(took < Duration::from_secs(15), "{took:?}");
    }
    // An impostor that answers HTTP (a socket of its own: the one above holds the silent
    // test's connections in its backlog).
    drop(listener);
    let sock = temp_path("impostor", "sock");
    let _ = fs::remove_file(&sock);
    let _rm2 = ethand_tests::RemoveOnDrop(sock.clone());
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let s = sock.to_str().expect("utf-8");
    let answer = thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        let (mut c, _) = listener.accept().expect("accept");
        let mut b = [0u8; 256];
        let _ = c.read(&mut b);
        let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let out = ethand(&["snapshot", "--pid", "1", "--socket", s]);
    answer.join().expect("impostor");
    let err = text(&out.stderr);
    eprintln!("observed: impostor: {} {err:?}", out.status);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not an ethand daemon"), "{err}");
    assert!(!err.contains("standalone"), "{err}");
}

/// A second `ethand run` on the socket where a daemon answers (the same config, another
/// /metrics port): refused before it loads a probe, exit 1, naming the socket and the first
/// daemon's pid; the first keeps its socket and answers. A socket left by a dead daemon
/// (nobody listens) is no obstacle.
#[test]
fn second_daemon_on_the_same_socket_is_refused() {
    let _serial = serial();
    let d = Daemon::start("second-daemon", "");
    let t0 = Instant::now();
    let out = run_with_timeout(
        Command::new(ethand_bin())
            .args([
                "run",
                "--listen",
                &format!("127.0.0.1:{}", free_port()),
                "--config",
            ])
            .arg(&d.config)
            .env_remove("ETHAND_CONFIG")
            .env("NO_COLOR", "1"),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    eprintln!(
        "observed: second daemon: {} after {:?}: {err:?}",
        out.status,
        t0.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    let want = format!(
        "another ethand daemon (pid {}) answers on {}",
        d.pid(),
        d.socket.display()
    );
    assert!(err.contains(&want), "expected {want:?} in {err:?}");
    assert!(
        !err.contains("attached probe"),
        "probes loaded first: {err}"
    );
    assert!(d.socket.exists(), "the first daemon's socket was removed");
    let st = d.status();
    assert_eq!(st.pid, d.pid(), "another daemon answers on the socket");
    drop(d);

    // A socket file nobody listens on, as a killed daemon leaves it.
    let stale = temp_path("stale-socket", "sock");
    let _ = fs::remove_file(&stale);
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    assert!(stale.exists(), "stale socket file");
    let d = Daemon::start("stale-socket", "");
    assert_eq!(d.socket, stale);
    assert_eq!(d.status().pid, d.pid());
}

/// `ethand ARGS` with stdout a pipe whose reader takes `read` bytes and closes it (at once
/// for 0: then every write fails with EPIPE): the exit status and stderr.
fn with_early_closed_stdout(args: &[&str], read: usize) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    let what = format!("ethand {}", args.join(" "));
    let (mut r, w) = std::io::pipe().expect("pipe");
    let mut child = Command::new(ethand_bin())
        .args(args)
        .env_remove("ETHAND_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(w)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut stderr = child.stderr.take().expect("piped");
    let err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        text(&v)
    });
    let mut head = vec![0u8; read];
    r.read_exact(&mut head)
        .unwrap_or_else(|e| panic!("{what}: no {read} bytes on stdout: {e}"));
    drop(r);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{what} still running 60 s after its reader went away");
        }
        thread::sleep(Duration::from_millis(20));
    };
    (status, err.join().expect("stderr reader"))
}

/// `ethand ... | head`: a reader that goes away ends the output like a finished one, exit
/// 0, for every command that prints; never a panic or an abort (SIGABRT, 134).
#[test]
fn closed_stdout_is_a_quiet_exit() {
    use std::os::unix::process::ExitStatusExt as _;
    let _serial = serial();
    let d = Daemon::start("closed-stdout", "");
    let sock = d.socket.to_str().expect("utf-8").to_string();
    let snap = d.cli(&["snapshot", "--pid", "1", "--json"]);
    assert!(snap.status.success(), "{}", text(&snap.stderr));
    let file = temp_path("closed-stdout-snapshot", "json");
    let _rm = ethand_tests::RemoveOnDrop(file.clone());
    fs::write(&file, &snap.stdout).expect("write the snapshot");
    let f = file.to_str().expect("utf-8");
    let me = std::process::id().to_string();
    let nowhere = temp_path("closed-stdout-nowhere", "sock");
    let nowhere = nowhere.to_str().expect("utf-8");
    let commands: Vec<Vec<&str>> = vec![
        vec!["completions", "zsh"],
        vec!["completions", "bash"],
        vec!["man"],
        vec!["config", "default"],
        vec!["config", "show"],
        vec!["status", "--socket", &sock],
        vec!["status", "--json", "--socket", &sock],
        vec!["snapshot", "--pid", "1", "--socket", &sock],
        vec!["snapshot", "--pid", "1", "--json", "--socket", &sock],
        vec!["snapshot", "--pid", "1", "--csv", "--socket", &sock],
        vec!["level", "calls", "--socket", &sock],
        vec!["diagnose", f],
        vec!["diagnose", f, "--json"],
        vec!["compare", f, f],
        vec!["compare", f, f, "--json"],
        vec!["compare", f, f, "--csv"],
        vec![
            "snapshot",
            "--pid",
            &me,
            "--json",
            "--duration",
            "1",
            "--socket",
            nowhere,
        ],
    ];
    let mut bad = Vec::new();
    for args in &commands {
        for read in [0, 3] {
            let (status, err) = with_early_closed_stdout(args, read);
            eprintln!(
                "observed: {args:?}, reader gone after {read} bytes: {status}, stderr {err:?}"
            );
            let quiet = !err.contains("panicked") && !err.contains("error");
            if status.code() != Some(0) || status.signal().is_some() || !quiet {
                bad.push(format!("{args:?} after {read} bytes: {status}: {err}"));
            }
        }
    }
    assert!(bad.is_empty(), "not a quiet exit:\n{}", bad.join("\n"));
}

/// `ethand ARGS` with NO_COLOR and RUST_LOG unset, stdout and stderr pipes.
fn ethand_plain(args: &[&str]) -> std::process::Output {
    run_with_timeout(
        Command::new(ethand_bin())
            .args(args)
            .env_remove("ETHAND_CONFIG")
            .env_remove("NO_COLOR")
            .env_remove("RUST_LOG"),
        Duration::from_secs(60),
    )
}

/// A standalone snapshot with stderr into a pipe: its own line, no log lines (warnings and
/// worse only; `-v` brings info back) and no terminal escapes. On a terminal (script(1)):
/// one progress line, rewritten in place and cleared before the answer.
#[test]
fn standalone_snapshot_is_quiet() {
    let _serial = serial();
    let sock = temp_path("quiet", "sock");
    let s = sock.to_str().expect("utf-8");
    let mut w = workload(&["getpid-loop"]);
    w.send_byte();
    let pid = w.pid.to_string();
    let args = [
        "snapshot",
        "--pid",
        &pid,
        "--duration",
        "2",
        "--json",
        "--socket",
        s,
    ];
    let out = ethand_plain(&args);
    let err = text(&out.stderr);
    eprintln!(
        "observed: standalone snapshot into a pipe: {} stderr {err:?}",
        out.status
    );
    assert!(out.status.success(), "{err}");
    serde_json::from_slice::<TreeSnapshot>(&out.stdout).expect("a TreeSnapshot");
    assert!(err.contains("standalone measurement"), "{err}");
    assert!(!err.contains("INFO"), "info log lines: {err}");
    assert!(
        !err.contains('\x1b'),
        "terminal escapes into a pipe: {err:?}"
    );
    assert!(
        !err.contains("measuring pid"),
        "progress into a pipe: {err:?}"
    );

    let mut verbose = args.to_vec();
    verbose.push("-v");
    let out = ethand_plain(&verbose);
    let err = text(&out.stderr);
    let infos = err.lines().filter(|l| l.contains(" INFO ")).count();
    eprintln!("observed: with -v: {} and {infos} info lines", out.status);
    assert!(out.status.success(), "{err}");
    assert!(infos > 0, "-v logs no info lines: {err}");
    assert!(
        !err.contains('\x1b'),
        "terminal escapes into a pipe: {err:?}"
    );

    // On a terminal: script(1) runs the command on a pseudo-terminal, its output on stdout.
    let line = format!("{} {}", ethand_bin().display(), args.join(" "));
    let out = match Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("ETHAND_CONFIG")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped the terminal part: no script(1): {e}");
            w.stop();
            return;
        }
    };
    w.stop();
    let tty = text(&out.stdout);
    eprintln!(
        "observed: on a terminal: {} {:?}",
        out.status,
        &tty[..tty.len().min(400)]
    );
    assert!(out.status.success(), "{tty}");
    // Rewritten in place (each update starts by erasing the line), cleared before the JSON.
    let (before, _) = tty.split_once('{').expect("the JSON on the terminal");
    let shown = format!("\r\x1b[Kmeasuring pid {pid}: 1/2 s\r\x1b[K");
    assert!(before.contains(&shown), "expected {shown:?} in {before:?}");
    assert!(before.ends_with("/2 s\r\x1b[K"), "not cleared: {before:?}");
    assert!(
        !tty.contains("INFO"),
        "info log lines on the terminal: {tty}"
    );
    w.finish();
}

/// The daemon's log into a pipe (as into the journal): no terminal escapes, with NO_COLOR
/// unset. A SIGTERM right after "ready" is a clean stop (exit 0, socket removed).
#[test]
fn daemon_log_into_a_pipe_has_no_colours() {
    use std::io::{BufRead as _, BufReader};
    let _serial = serial();
    let port = free_port();
    let path = config_file(
        "log-pipe",
        &format!("[prometheus]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let sock = temp_path("log-pipe", "sock");
    let mut child = Command::new(ethand_bin())
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("ETHAND_CONFIG")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ethand run");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("piped");
    let reader = thread::spawn(move || {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { return };
            let _ = tx.send(text(&line));
        }
    });
    let mut log = Vec::new();
    let t0 = Instant::now();
    while !log.iter().any(|l: &String| l.contains(" ready ")) {
        match rx.recv_timeout(Duration::from_secs(30).saturating_sub(t0.elapsed())) {
            Ok(l) => log.push(l),
            Err(e) => {
                let _ = child.kill();
                panic!("no \"ready\" line ({e}); log:\n{}", log.join("\n"));
            }
        }
    }
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().expect("wait");
    reader.join().expect("reader");
    log.extend(rx.try_iter());
    let _ = fs::remove_file(&path);
    let socket_left = sock.exists();
    let _ = fs::remove_file(&sock);
    let all = log.join("\n");
    let escapes = all.matches('\x1b').count();
    eprintln!(
        "observed: {} log lines, {escapes} escapes, {st}, socket left: {socket_left}",
        log.len()
    );
    assert_eq!(escapes, 0, "terminal escapes in the log: {all:?}");
    assert!(all.contains(" INFO "), "no info lines: {all}");
    assert!(
        st.success() && !socket_left,
        "SIGTERM after ready: {st}; log:\n{all}"
    );
}

/// A rules file naming a signal the catalog does not have stops `ethand run` (before any BPF
/// work, no socket) and `ethand diagnose` with exit 2 and one line naming the file, the rule,
/// the field and the nearest signal; the same rule spelled right loads and fires on a real
/// snapshot (the H200 `sync_storm` fixture: SM busy 6 %).
#[test]
fn rules_naming_unknown_signals_stop_run_and_diagnose() {
    let _serial = serial();
    let dir = temp_path("rules-typo", "d");
    fs::create_dir_all(&dir).expect("rules dir");
    let rule = |when: &str| {
        format!(
            "[[rule]]\nid = \"site_idle_gpu\"\ntitle = \"GPU idle\"\nwhen = {when:?}\nevidence = [\"gpu.sm_busy_ratio\"]\n"
        )
    };
    let site = dir.join("site.toml");
    fs::write(&site, rule("gpu.sm_busy < 0.5")).expect("write rule");
    let cfg = config_file(
        "rules-typo",
        &format!("[diagnosis]\nrules_dir = {:?}\n", dir.display().to_string()),
    );
    let sock = temp_path("rules-typo", "sock");
    let want = format!(
        "ethand: error: {}: rule \"site_idle_gpu\": when: unknown signal \"gpu.sm_busy\" (did you mean gpu.sm_busy_ratio?",
        site.display()
    );
    let t0 = Instant::now();
    let run = run_with_timeout(
        Command::new(ethand_bin())
            .arg("run")
            .arg("--config")
            .arg(&cfg)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", free_port())),
        Duration::from_secs(10),
    );
    let took = t0.elapsed();
    let err = text(&run.stderr);
    eprintln!("observed: run: {} in {took:?}: {err:?}", run.status);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.starts_with(&want) && err.lines().count() == 1, "{err}");
    assert!(
        !sock.exists(),
        "a socket was bound before the rules were checked"
    );
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gpu-scenarios/sync_storm/daemon-worker.json");
    let diagnose = |json: bool| {
        let mut c = Command::new(ethand_bin());
        c.arg("diagnose").arg(&fixture).arg("--config").arg(&cfg);
        if json {
            c.arg("--json");
        }
        run_with_timeout(&mut c, Duration::from_secs(10))
    };
    let out = diagnose(false);
    let err = text(&out.stderr);
    eprintln!("observed: diagnose: {}: {err:?}", out.status);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with(&want), "{err}");
    fs::write(&site, rule("gpu.sm_busy_ratio < 0.5")).expect("write rule");
    let out = diagnose(true);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let ids: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    eprintln!("observed: diagnose with the rule spelled right: {ids:?}");
    assert!(
        ids.contains(&"site_idle_gpu") && ids.contains(&"excessive_sync"),
        "{ids:?}"
    );
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_file(&cfg);
}

/// `status`'s program costs count only while ethand's own BPF statistics were on (what
/// "counted during" says): the kernel's figures also grow while anyone else has them on
/// (another ethand, `bpftool prog profile`, the sysctl, on here). With ethand's sampled
/// window not yet open, the programs ran (a workload switched and called) but none of it
/// was counted by ethand.
#[test]
fn program_costs_count_only_during_ethands_own_statistics() {
    const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = fs::write(SYSCTL, self.0.trim());
        }
    }
    let _serial = serial();
    let _restore = Restore(fs::read_to_string(SYSCTL).expect("read the sysctl"));
    fs::write(SYSCTL, "1").expect("turn the kernel's BPF statistics on");
    // The default sampled statistics: on for 2 s at the end of each 60 s.
    let d = Daemon::start("status-own-stats", "");
    for _ in 0..20 {
        let _ = Command::new("true").status();
    }
    thread::sleep(Duration::from_millis(600));
    let s = d.status();
    let txt = text(&d.cli(&["status"]).stdout);
    let runs: u64 = s.programs.iter().map(|p| p.run_count).sum();
    eprintln!(
        "observed: bpf_stats {} on {} ms, runs counted {runs}",
        s.bpf_stats, s.bpf_stats_enabled_ms
    );
    assert_eq!(s.bpf_stats, "sampled");
    assert_eq!(s.bpf_stats_enabled_ms, 0, "the first window opens at 58 s");
    assert!(!s.programs.is_empty(), "programs listed");
    assert_eq!(runs, 0, "runs counted while ethand's statistics were off");
    assert!(txt.contains("counted during 0.0s"), "{txt}");
}
