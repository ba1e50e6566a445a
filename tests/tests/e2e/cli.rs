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
    assert_eq!(t.source, "standalone");
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
