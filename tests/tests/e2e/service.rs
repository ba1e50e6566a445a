//! systemd/ethand.service, checked and lived: `systemd-analyze verify`, and the daemon run
//! the way systemd runs the unit (exactly its capabilities, as ambient capabilities of a
//! uid 0 that gains nothing else by being root, no_new_privs; Type=notify readiness and the
//! watchdog) measuring a GPU workload of another user exactly. Then each capability is taken
//! away in turn to show what it is for.
use std::{
    collections::BTreeMap,
    fs,
    os::unix::{fs::PermissionsExt, net::UnixDatagram, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{ProbeState, SelfStatus};
use ethand_tests::{
    Daemon, RemoveOnDrop, ethand_bin, find_proc, run_with_timeout, serial,
    standins::{self, Driver, Lib},
    temp_path, text,
};

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/ethand.service");
const NOBODY: u32 = 65534;
pub(crate) const GPU_TOML: &str = "[gpu]\nlevel = \"process\"\nrescan_interval_ms = 300\n";
pub(crate) const LAUNCHES: u64 = 250;

/// The unit's [Service] keys (a key given twice keeps both values, space-joined).
fn service_keys() -> BTreeMap<String, String> {
    let unit = fs::read_to_string(UNIT).expect("read systemd/ethand.service");
    let mut in_service = false;
    let mut keys = BTreeMap::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not key=value in the unit: {line}"));
        keys.entry(k.trim().to_string())
            .and_modify(|e: &mut String| {
                e.push(' ');
                e.push_str(v.trim())
            })
            .or_insert_with(|| v.trim().to_string());
    }
    keys
}

/// CapabilityBoundingSet, which must equal AmbientCapabilities.
pub(crate) fn unit_caps() -> Vec<String> {
    let k = service_keys();
    let set = |key: &str| -> Vec<String> {
        let mut v: Vec<String> = k
            .get(key)
            .unwrap_or_else(|| panic!("the unit has no {key}"))
            .split_whitespace()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    let bounding = set("CapabilityBoundingSet");
    assert_eq!(
        bounding,
        set("AmbientCapabilities"),
        "bounding and ambient sets differ"
    );
    bounding
}

pub(crate) fn cap_bit(name: &str) -> u32 {
    match name {
        "CAP_CHOWN" => 0,
        "CAP_DAC_READ_SEARCH" => 2,
        "CAP_SETGID" => 6,
        "CAP_SETUID" => 7,
        "CAP_SETPCAP" => 8,
        "CAP_SYS_PTRACE" => 19,
        "CAP_SYS_ADMIN" => 21,
        "CAP_SYSLOG" => 34,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => panic!("add {other} to cap_bit"),
    }
}

/// setpriv arguments giving ethand what systemd gives the unit's main process: its User=
/// and Group= (created here as the package would, when missing), `caps` as bounding,
/// inheritable and ambient sets, the unit's SecureBits (noroot: uid 0 gets no capability for
/// being root), NoNewPrivileges.
pub(crate) fn systemd_like(caps: &[String]) -> Vec<String> {
    let keys = service_keys();
    let list: String = caps
        .iter()
        .map(|c| format!(",+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let mut a = vec!["setpriv".to_string()];
    if let Some(user) = keys.get("User") {
        let group = keys.get("Group").unwrap_or(user);
        ethand_tests::system_user(user);
        a.extend([
            format!("--reuid={user}"),
            format!("--regid={group}"),
            "--init-groups".into(),
        ]);
    }
    a.extend([
        format!("--bounding-set=-all{list}"),
        format!("--inh-caps=-all{list}"),
        format!("--ambient-caps=-all{list}"),
    ]);
    if let Some(bits) = keys.get("SecureBits") {
        let b: Vec<String> = bits
            .split_whitespace()
            .map(|b| format!("+{}", b.replace('-', "_")))
            .collect();
        a.push(format!("--securebits={}", b.join(",")));
    }
    if keys.get("NoNewPrivileges").map(String::as_str) == Some("yes") {
        a.push("--no-new-privs".into());
    }
    a
}

pub(crate) fn without(caps: &[String], drop: &[&str]) -> Vec<String> {
    caps.iter()
        .filter(|c| !drop.contains(&c.as_str()))
        .cloned()
        .collect()
}

/// Capability sets of a process: (effective, permitted, bounding, ambient, no_new_privs).
pub(crate) fn proc_caps(pid: u32) -> (u64, u64, u64, u64, bool) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |k: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in /proc/{pid}/status"))
            .trim()
            .to_string()
    };
    let hex = |k: &str| u64::from_str_radix(&field(k), 16).expect("hex capability mask");
    (
        hex("CapEff:"),
        hex("CapPrm:"),
        hex("CapBnd:"),
        hex("CapAmb:"),
        field("NoNewPrivs:") == "1",
    )
}

/// The libcuda stand-in and the driver, copied into a directory only `nobody` may enter
/// (0700): finding that process's library needs CAP_SYS_PTRACE (its /proc/PID/maps), opening
/// the library CAP_DAC_READ_SEARCH.
pub(crate) struct PrivateGpu {
    dir: PathBuf,
    lib: PathBuf,
    driver: PathBuf,
}

impl PrivateGpu {
    pub(crate) fn new(name: &str) -> Self {
        let s = standins::shared();
        let dir = temp_path(name, "dir");
        fs::create_dir_all(&dir).expect("mkdir");
        let p = Self {
            lib: dir.join("libcuda.so.1"),
            driver: dir.join("gpu_driver"),
            dir,
        };
        fs::copy(s.path(Lib::Cuda), &p.lib).expect("copy libcuda stand-in");
        fs::copy(&s.driver, &p.driver).expect("copy driver");
        for f in [&p.lib, &p.driver, &p.dir] {
            std::os::unix::fs::chown(f, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        fs::set_permissions(&p.dir, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
        p
    }

    /// The driver as nobody: waits, makes LAUNCHES launches, waits again.
    fn spawn(&self) -> Driver {
        let mut cmd = Command::new(&self.driver);
        cmd.arg("--cuda")
            .arg(&self.lib)
            .args([
                "--",
                "wait_stdin",
                "launches",
                &LAUNCHES.to_string(),
                "wait_stdin",
            ])
            .uid(NOBODY)
            .gid(NOBODY);
        Driver::spawn(&mut cmd)
    }
}

impl Drop for PrivateGpu {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Polls status until `lib` is listed (any state) or attached, for `limit`.
fn library_state(
    d: &Daemon,
    lib: &Path,
    limit: Duration,
) -> (Option<(ProbeState, String)>, SelfStatus) {
    let canon = fs::canonicalize(lib).expect("canonicalize");
    let t0 = Instant::now();
    loop {
        let st = d.status();
        let found = st
            .gpu_libraries
            .iter()
            .find(|l| Path::new(&l.path) == canon)
            .map(|l| (l.state, l.detail.clone()));
        if found
            .as_ref()
            .is_some_and(|(s, _)| *s == ProbeState::Attached)
            || t0.elapsed() > limit
        {
            return (found, st);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs nobody's GPU workload under daemon `d`: Some(launches ethand counted, true count)
/// when its library got attached, else None with the library's state.
pub(crate) fn nobody_launches(
    d: &Daemon,
    gpu: &PrivateGpu,
) -> Result<(u64, u64), Option<(ProbeState, String)>> {
    let mut drv = gpu.spawn();
    drv.wait_for("waiting");
    let (state, _) = library_state(d, &gpu.lib, Duration::from_secs(4));
    if state.as_ref().map(|s| s.0) != Some(ProbeState::Attached) {
        return Err(state);
    }
    drv.resume();
    drv.wait_for("waiting");
    // Idle now: four collection intervals (200 ms) and the count is final.
    thread::sleep(Duration::from_millis(1200));
    let pid = drv.pid;
    let seen = find_proc(&d.snapshot(pid), pid)
        .gpu
        .as_ref()
        .and_then(|g| g.launches)
        .unwrap_or(0);
    drv.resume();
    let truth = drv.finish();
    Ok((seen, truth.symbol(&gpu.lib, "cuLaunchKernel").calls))
}

/// `systemd-analyze verify` on the unit (ExecStart pointed at the built binary, since the
/// package's /usr/bin/ethand is not installed here): no error, no warning.
#[test]
fn unit_verifies() {
    let dir = temp_path("unit", "d");
    fs::create_dir_all(&dir).expect("mkdir");
    let _rm = RemoveDirOnDrop(dir.clone());
    let unit = fs::read_to_string(UNIT).expect("read unit").replace(
        "ExecStart=/usr/bin/ethand ",
        &format!("ExecStart={} ", ethand_bin().display()),
    );
    let path = dir.join("ethand.service");
    fs::write(&path, unit).expect("write unit");
    let out = run_with_timeout(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path),
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    eprintln!("observed: systemd-analyze verify: {} {err:?}", out.status);
    assert!(out.status.success(), "systemd-analyze verify failed: {err}");
    assert!(
        err.trim().is_empty(),
        "systemd-analyze verify warned: {err}"
    );
    let keys = service_keys();
    assert_eq!(keys.get("Type").map(String::as_str), Some("notify"));
    assert!(keys.contains_key("WatchdogSec"), "no WatchdogSec");
}

struct RemoveDirOnDrop(PathBuf);
impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The daemon as systemd runs it: READY=1 once every probe is attached, the exact
/// capability sets, a watchdog ping every WatchdogSec/2, a nobody-owned GPU process measured
/// exactly, STOPPING=1 and a clean exit within a second of SIGTERM.
#[test]
fn runs_with_exactly_the_units_capabilities_notify_and_watchdog() {
    let _serial = serial();
    let caps = unit_caps();
    let sock = temp_path("notify", "sock");
    let _rm = RemoveOnDrop(sock.clone());
    let notify = UnixDatagram::bind(&sock).expect("bind NOTIFY_SOCKET");
    // The unit's user must be able to send to it, as to systemd's own.
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o666)).expect("chmod");
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let watchdog_usec = 1_000_000u64;
    let mut d = Daemon::start_with(
        "unit",
        GPU_TOML,
        &systemd_like(&caps),
        &[
            ("NOTIFY_SOCKET", sock.display().to_string()),
            ("WATCHDOG_USEC", watchdog_usec.to_string()),
        ],
    );
    let mut buf = [0u8; 4096];
    let recv = |buf: &mut [u8]| -> String {
        let n = notify.recv(buf).expect("a notification within 10 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = recv(&mut buf);
    eprintln!("observed: first notification {ready:?}");
    assert!(
        ready.lines().any(|l| l == "READY=1"),
        "no READY=1 in {ready:?}"
    );
    let status = ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .expect("STATUS= with READY=1");
    let (attached, total) = status
        .split_once(" probes attached")
        .and_then(|(n, _)| n.split_once('/'))
        .map(|(a, t)| {
            (
                a.parse::<usize>().expect("n"),
                t.parse::<usize>().expect("m"),
            )
        })
        .unwrap_or_else(|| panic!("STATUS is not N/M probes attached: {status:?}"));
    assert!(total >= 15 && attached == total, "READY with {status:?}");

    // After start-up ethand keeps a subset of the unit's set (which one: privilege.rs).
    let unit: u64 = caps.iter().map(|c| 1u64 << cap_bit(c)).sum();
    let want: u64 = d
        .status()
        .capabilities
        .iter()
        .map(|c| 1u64 << cap_bit(c))
        .sum();
    let (eff, prm, bnd, amb, nnp) = proc_caps(d.pid());
    eprintln!(
        "observed: CapEff {eff:x} CapPrm {prm:x} CapBnd {bnd:x} CapAmb {amb:x} NoNewPrivs {nnp} (unit {unit:x})"
    );
    assert!(
        want != 0 && want & !unit == 0,
        "kept {want:x} not within the unit's {unit:x}"
    );
    assert_eq!(
        (eff, prm, bnd, amb),
        (want, want, want, 0),
        "capability sets"
    );
    assert!(nnp, "no_new_privs not set");

    let gpu = PrivateGpu::new("unit-gpu");
    let (seen, truth) = nobody_launches(&d, &gpu)
        .unwrap_or_else(|s| panic!("nobody's libcuda not attached: {s:?}"));
    eprintln!("observed: nobody's launches ethand {seen}, truth {truth}");
    assert_eq!((seen, truth), (LAUNCHES, LAUNCHES));

    // Watchdog pings: those queued so far dropped, then at least two in 2.5 s (one per
    // WATCHDOG_USEC / 2 expected, at the end of a collection).
    notify.set_nonblocking(true).expect("nonblocking");
    while notify.recv(&mut buf).is_ok() {}
    notify.set_nonblocking(false).expect("blocking");
    let t0 = Instant::now();
    let mut pings = 0;
    notify
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    while t0.elapsed() < Duration::from_millis(2500) {
        if let Ok(n) = notify.recv(&mut buf) {
            pings += String::from_utf8_lossy(&buf[..n])
                .lines()
                .filter(|l| *l == "WATCHDOG=1")
                .count();
        }
    }
    eprintln!("observed: {pings} WATCHDOG=1 in 2.5 s (WATCHDOG_USEC {watchdog_usec})");
    assert!((2..=6).contains(&pings), "{pings} watchdog pings in 2.5 s");

    let (took, exit) = d
        .terminate(Duration::from_secs(5))
        .expect("ethand still running 5 s after SIGTERM");
    notify
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    let mut stopping = false;
    while let Ok(n) = notify.recv(&mut buf) {
        stopping |= String::from_utf8_lossy(&buf[..n])
            .lines()
            .any(|l| l == "STOPPING=1");
    }
    eprintln!("observed: exit {exit} {took:?} after SIGTERM, STOPPING=1 {stopping}");
    assert!(exit.success(), "exit status {exit}");
    assert!(took < Duration::from_secs(1), "stopping took {took:?}");
    assert!(stopping, "no STOPPING=1");
}

/// What each capability of the unit is for: without CAP_SYS_ADMIN only the BPF run-time
/// statistics go (reported); without CAP_SYS_PTRACE another user's GPU library is never
/// found; without CAP_DAC_READ_SEARCH it is found but cannot be opened (reported); without
/// CAP_BPF (and CAP_SYS_ADMIN, which implies it) ethand stops with one clear error; without
/// CAP_PERFMON (and CAP_SYS_ADMIN) no probe attaches, each says so.
#[test]
fn each_capability_of_the_unit_is_needed() {
    let _serial = serial();
    let caps = unit_caps();
    let gpu = PrivateGpu::new("caps-gpu");
    let stats_toml = format!("{GPU_TOML}[daemon]\nbpf_stats = \"always\"\n");

    // CAP_SYS_ADMIN: BPF statistics only.
    {
        let d = Daemon::start_with(
            "no-admin",
            &stats_toml,
            &systemd_like(&without(&caps, &["CAP_SYS_ADMIN"])),
            &[],
        );
        let st = d.status();
        let not_attached: Vec<&str> = st
            .probes
            .iter()
            .filter(|p| !p.name.starts_with("uprobe_") && !p.name.starts_with("collector_"))
            .filter(|p| p.state != ProbeState::Attached && p.name != "sched_wakeup")
            .map(|p| p.name.as_str())
            .collect();
        ethand_tests::assert_wakeup_not_needed(&st.probes);
        let launches = nobody_launches(&d, &gpu);
        eprintln!(
            "observed: without CAP_SYS_ADMIN: bpf_stats {:?}, probes not attached {not_attached:?}, launches {launches:?}",
            st.bpf_stats
        );
        assert!(
            not_attached.is_empty(),
            "probes not attached: {not_attached:?}"
        );
        assert_eq!(launches, Ok((LAUNCHES, LAUNCHES)));
        assert_eq!(st.bpf_stats, "off", "BPF statistics without CAP_SYS_ADMIN");
        assert!(
            d.log_text().contains("BPF run-time statistics unavailable"),
            "the loss is not logged"
        );
        // And with it, they are on.
    }
    {
        let d = Daemon::start_with("admin", &stats_toml, &systemd_like(&caps), &[]);
        let st = d.status();
        eprintln!("observed: with CAP_SYS_ADMIN: bpf_stats {:?}", st.bpf_stats);
        assert_eq!(st.bpf_stats, "always");
    }

    // CAP_SYS_PTRACE: nobody's process is another user's: its files through
    // /proc/PID/root stay closed, the library cannot be opened (reported).
    {
        let d = Daemon::start_with(
            "no-ptrace",
            GPU_TOML,
            &systemd_like(&without(&caps, &["CAP_SYS_PTRACE"])),
            &[],
        );
        let r = nobody_launches(&d, &gpu);
        eprintln!("observed: without CAP_SYS_PTRACE: {r:?}");
        match r {
            Err(Some((state, reason))) => {
                assert_eq!(state, ProbeState::Failed, "{reason}");
                assert!(
                    reason.contains("/root") && reason.contains("Permission denied"),
                    "reason: {reason}"
                );
            }
            other => panic!("expected a failed library without CAP_SYS_PTRACE: {other:?}"),
        }
    }

    // CAP_DAC_READ_SEARCH: the library is found (maps) but cannot be opened.
    {
        let d = Daemon::start_with(
            "no-dac",
            GPU_TOML,
            &systemd_like(&without(&caps, &["CAP_DAC_READ_SEARCH"])),
            &[],
        );
        let r = nobody_launches(&d, &gpu);
        eprintln!("observed: without CAP_DAC_READ_SEARCH: {r:?}");
        match r {
            Err(Some((state, reason))) => {
                assert_eq!(state, ProbeState::Failed, "{reason}");
                assert!(
                    reason.to_lowercase().contains("permission"),
                    "reason: {reason}"
                );
            }
            other => panic!("expected a failed library without CAP_DAC_READ_SEARCH: {other:?}"),
        }
    }

    // CAP_PERFMON (and CAP_SYS_ADMIN): the daemon runs, but no probe attaches and each
    // says why.
    {
        let d = Daemon::start_with(
            "no-perfmon",
            GPU_TOML,
            &systemd_like(&without(&caps, &["CAP_SYS_ADMIN", "CAP_PERFMON"])),
            &[],
        );
        let st = d.status();
        ethand_tests::assert_wakeup_not_needed(&st.probes);
        let kernel: Vec<_> = st
            .probes
            .iter()
            .filter(|p| !p.name.starts_with("uprobe_") && !p.name.starts_with("collector_"))
            .filter(|p| p.name != "sched_wakeup")
            .collect();
        for p in &kernel {
            eprintln!(
                "observed: without CAP_PERFMON: {} {:?} {}",
                p.name, p.state, p.detail
            );
        }
        assert!(kernel.len() >= 14, "{} kernel probes", kernel.len());
        assert!(
            kernel
                .iter()
                .all(|p| p.state == ProbeState::Failed && p.detail.contains("CAP_PERFMON")),
            "a probe attached or failed silently without CAP_PERFMON"
        );
    }

    // CAP_SYSLOG: the kernel frames of a snapshot's CPU profile are named (kallsyms shows
    // addresses at open); without it they are unnamed and the profile says so.
    for with in [true, false] {
        let wrap = if with {
            systemd_like(&caps)
        } else {
            systemd_like(&without(&caps, &["CAP_SYSLOG"]))
        };
        let d = Daemon::start_with(
            if with { "syslog" } else { "no-syslog" },
            "[diagnosis]\nstack_sample_ms = 1500\n",
            &wrap,
            &[],
        );
        // A shell that waits for a short sleep, again and again: waits with kernel stacks.
        let w = ethand_tests::KillOnDrop(
            std::process::Command::new("sh")
                .args(["-c", "while :; do sleep 0.05; done"])
                .spawn()
                .expect("sh"),
        );
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let t = crate::cpu_profile::profiled(&d, w.0.id());
        let p = t.cpu_profile.expect("a CPU profile");
        let named = p
            .threads
            .iter()
            .flat_map(|th| &th.wait_sites)
            .flat_map(|s| &s.frames)
            .any(|f| f.kind == ethand_snapshot::stacks::FrameKind::Kernel && f.function.is_some());
        eprintln!(
            "observed: CAP_SYSLOG {with}: kernel frames named {named}, notes {:?}",
            p.notes
        );
        if with {
            assert!(named, "kernel frames unnamed with CAP_SYSLOG: {p:?}");
        } else if kallsyms_needs_syslog() {
            assert!(!named, "kernel frames named without CAP_SYSLOG");
            assert!(
                p.notes.iter().any(|n| n.contains("kernel frames unnamed")),
                "{:?}",
                p.notes
            );
        }
    }

    // CAP_SETUID and CAP_SETGID: the reader's workers take the credentials of the process
    // they read; then the source line of nobody's Python script (which nobody may read) is
    // shown. Without them a worker reads as the daemon's user and shows no source line.
    let script_dir = temp_path("setuid-src", "d");
    fs::create_dir_all(&script_dir).expect("mkdir");
    let _rm_script = RemoveDirOnDrop(script_dir.clone());
    fs::set_permissions(&script_dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = script_dir.join("spin_owner.py");
    fs::write(
        &script,
        "import time\ndef spin_line():\n    while True: x = sum(range(1000))  # SPIN_MARK\nprint('ready', flush=True)\nspin_line()\n",
    )
    .expect("script");
    let out = Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}")])
        .arg(&script_dir)
        .output()
        .expect("chown");
    assert!(out.status.success());
    // Only nobody may read it: the daemon's own user may not.
    fs::set_permissions(&script, fs::Permissions::from_mode(0o600)).expect("chmod");
    for with in [true, false] {
        let wrap = if with {
            systemd_like(&caps)
        } else {
            systemd_like(&without(&caps, &["CAP_SETUID", "CAP_SETGID"]))
        };
        let d = Daemon::start_with(
            if with { "setuid" } else { "no-setuid" },
            "[diagnosis]\nstack_sample_ms = 1000\n",
            &wrap,
            &[],
        );
        let mut py = Command::new("setpriv")
            .args([
                &format!("--reuid={NOBODY}"),
                &format!("--regid={NOBODY}"),
                "--clear-groups",
                "--",
                "/usr/bin/python3",
            ])
            .arg(&script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        {
            use std::io::BufRead;
            let mut l = String::new();
            std::io::BufReader::new(py.stdout.as_mut().expect("stdout"))
                .read_line(&mut l)
                .expect("ready");
        }
        let t = d.snapshot(py.id());
        let _ = py.kill();
        let _ = py.wait();
        let shown = t
            .stack_sample
            .as_ref()
            .into_iter()
            .flat_map(|s| &s.threads)
            .flat_map(|th| &th.top_lines)
            .any(|l| l.source.as_deref().is_some_and(|s| s.contains("SPIN_MARK")));
        let reader = d.status().reader.expect("reader status");
        eprintln!(
            "observed: CAP_SETUID/CAP_SETGID {with}: source line shown {shown}; reader {reader:?}"
        );
        assert!(reader.pid.is_some(), "{reader:?}");
        assert_eq!(
            shown, with,
            "the owner's source line is read exactly when the reader can take its credentials"
        );
    }

    // CAP_BPF (and CAP_SYS_ADMIN): nothing can be loaded; one clear error, exit 1.
    let path = temp_path("no-bpf", "toml");
    let _rm = RemoveOnDrop(path.clone());
    let sock = temp_path("no-bpf", "sock");
    fs::write(
        &path,
        format!(
            "[daemon]\nsocket = {sock:?}\n[prometheus]\nlisten = \"127.0.0.1:{}\"\n",
            ethand_tests::free_port()
        ),
    )
    .expect("write config");
    let wrap = systemd_like(&without(&caps, &["CAP_SYS_ADMIN", "CAP_BPF"]));
    let out = run_with_timeout(
        Command::new(&wrap[0])
            .args(&wrap[1..])
            .arg(ethand_bin())
            .args(["run", "--config"])
            .arg(&path)
            .env("NO_COLOR", "1"),
        Duration::from_secs(15),
    );
    let err = text(&out.stderr);
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ethand: error:"))
        .collect();
    eprintln!("observed: without CAP_BPF: {} {errors:?}", out.status);
    assert_eq!(out.status.code(), Some(1), "exit status: {err}");
    assert_eq!(errors.len(), 1, "one error line expected: {err}");
    assert!(errors[0].contains("CAP_BPF"), "{}", errors[0]);
}

/// Whether reading kernel addresses from /proc/kallsyms takes CAP_SYSLOG here (kptr_restrict
/// above 0, or perf_event_paranoid above 1).
fn kallsyms_needs_syslog() -> bool {
    let read = |p: &str| {
        fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(2)
    };
    read("/proc/sys/kernel/kptr_restrict") > 0 || read("/proc/sys/kernel/perf_event_paranoid") > 1
}
