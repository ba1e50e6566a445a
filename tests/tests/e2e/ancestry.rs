//! The node as the kernel sees it: processes that live between two collection rounds keep
//! their tree and cgroup (parent and cgroup recorded in kernel context), every live process is
//! known (idle ones, launchers, pid 1), a thread id stands for its process, and a window
//! never reaches before a process's birth.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, SETTLE, find_proc, serial, temp_path, text};

/// Waits for `path` to exist (a script writes it when its work is done).
pub(crate) fn wait_for_file(path: &Path, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && !s.is_empty()
        {
            return s;
        }
        assert!(
            t0.elapsed() < limit,
            "{} not written in {limit:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// bash's `times`: "0m0.004s 0m0.008s\n0m0.712s 0m0.101s"; the children's user + system
/// seconds (second line).
pub(crate) fn children_cpu_s(times: &str) -> f64 {
    let line = times.lines().nth(1).expect("two lines of `times`");
    line.split_whitespace()
        .map(|f| {
            let (m, s) = f.trim_end_matches('s').split_once('m').expect("NmN.NNNs");
            m.parse::<f64>().expect("minutes") * 60.0 + s.parse::<f64>().expect("seconds")
        })
        .sum()
}

/// A script in its own process group, killed with all its children when dropped.
pub(crate) struct KillOnDrop(pub(crate) Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this test created.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

pub(crate) fn bash(script: &str) -> KillOnDrop {
    use std::os::unix::process::CommandExt as _;
    KillOnDrop(
        Command::new("bash")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("bash"),
    )
}

/// A script runs 40 sequential children of ~20 ms CPU each (each lives between two rounds
/// at most): the tree holds every one of them, exited, and their CPU equals what bash's
/// `times` says its reaped children used.
#[test]
fn short_lived_children_keep_their_tree() {
    let _serial = serial();
    let d = Daemon::start("ancestry-fork", "");
    let out = temp_path("ancestry-times", "txt");
    let script = format!(
        "for i in $(seq 40); do sh -c 'i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done'; done; \
         times > {0}.tmp; mv {0}.tmp {0}; sleep 60",
        out.display()
    );
    let b = bash(&script);
    let pid = b.0.id();
    let times = wait_for_file(&out, Duration::from_secs(60));
    let _ = std::fs::remove_file(&out);
    thread::sleep(SETTLE);
    let truth = children_cpu_s(&times);
    let t = d.snapshot(pid);
    assert_eq!(t.processes[0].pid, pid, "the script is the root");
    let exited: Vec<_> = t.processes.iter().filter(|p| !p.alive).collect();
    let cpu_s: f64 = exited.iter().map(|p| p.sched.oncpu_ns as f64 / 1e9).sum();
    let burners = exited.iter().filter(|p| p.comm == "sh").count();
    eprintln!(
        "observed: {} processes in the tree, {} exited ({burners} sh), their cpu {cpu_s:.3} s; \
         bash `times` children {truth:.3} s",
        t.processes.len(),
        exited.len()
    );
    assert!(
        burners >= 40,
        "{burners} of the 40 short-lived children are in the tree"
    );
    assert!(
        truth > 0.2,
        "the children burned {truth} s: the load is too small to compare"
    );
    assert!(
        (cpu_s - truth).abs() <= 0.03 * truth + 0.02,
        "children's CPU: ethand {cpu_s:.3} s vs bash `times` {truth:.3} s"
    );
    // Every exited child's parent is in the tree (the script, or $(seq)'s subshell).
    for p in &exited {
        assert!(
            t.processes.iter().any(|q| q.pid == p.ppid),
            "pid {} ({}) has parent {} outside its tree",
            p.pid,
            p.comm,
            p.ppid
        );
    }
}

/// The value of `ethand_cgroup_cpu_seconds_total{cgroup="CG"}` (0 when absent).
fn cgroup_cpu_s(body: &str, cgroup: &str) -> f64 {
    let prefix = format!("ethand_cgroup_cpu_seconds_total{{cgroup=\"{cgroup}\"");
    body.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The cgroup v2 hierarchy: /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts
/// (such as the CI machine).
fn cgroup2_root() -> PathBuf {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists())
        .expect("a cgroup v2 hierarchy")
}

struct Cgroup(PathBuf);
impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        // Empty once its processes are gone; rmdir may race their reaping.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A parallel compile (xargs -P4 gcc -O2 -c, four rounds: ~130 processes, most living well
/// under a second) in its own cgroup: `ethand_cgroup_cpu_seconds_total` of that cgroup grows
/// by what the kernel's cpu.stat says it used, and nothing it did goes to cgroup="unknown".
#[test]
fn parallel_compile_cpu_reaches_its_cgroup() {
    let _serial = serial();
    let d = Daemon::start("ancestry-cgroup", "");
    let src = temp_path("ancestry-src", "d");
    std::fs::create_dir_all(&src).expect("src dir");
    for i in 0..8 {
        // Enough optimisation work for cc1 to run ~50-100 ms.
        let mut c = String::new();
        for f in 0..40 {
            c.push_str(&format!(
                "int f{f}(int *a, int n) {{ int s = {i}; for (int j = 0; j < n; j++) \
                 {{ s += a[j] * {f} + (s >> 3); if (s & 1) s ^= a[(j + {f}) % n]; }} return s; }}\n"
            ));
        }
        std::fs::write(src.join(format!("u{i}.c")), c).expect("write source");
    }
    let cg = Cgroup(cgroup2_root().join(format!("ethand-e2e-compile-{}", std::process::id())));
    std::fs::create_dir_all(&cg.0).expect("create a cgroup (cgroup v2, root)");
    let cg_name = format!("/ethand-e2e-compile-{}", std::process::id());
    let done = temp_path("ancestry-compiled", "txt");
    let before = d.metrics();
    let unknown_before = cgroup_cpu_s(&before, "unknown");
    let script = format!(
        "echo $$ > {cg}/cgroup.procs && exec bash -c 'for r in 1 2 3 4; do ls {src}/*.c | \
         xargs -P4 -n1 gcc -O2 -c -o /dev/null || exit 1; done; echo ok > {done}'",
        cg = cg.0.display(),
        src = src.display(),
        done = done.display()
    );
    let mut b = bash(&script);
    wait_for_file(&done, Duration::from_secs(120));
    let _ = b.0.wait();
    let _ = std::fs::remove_file(&done);
    let _ = std::fs::remove_dir_all(&src);
    thread::sleep(SETTLE);
    let usage_s = std::fs::read_to_string(cg.0.join("cpu.stat"))
        .expect("cpu.stat")
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("usage_usec")
        / 1e6;
    let after = d.metrics();
    let ethand_s = cgroup_cpu_s(&after, &cg_name);
    let unknown_s = cgroup_cpu_s(&after, "unknown") - unknown_before;
    eprintln!(
        "observed: cgroup {cg_name}: ethand {ethand_s:.3} s, cpu.stat {usage_s:.3} s; \
         cgroup=\"unknown\" grew {unknown_s:.3} s"
    );
    assert!(
        usage_s > 0.5,
        "the compile used {usage_s} s: too small to compare"
    );
    assert!(
        (ethand_s - usage_s).abs() <= 0.03 * usage_s + 0.02,
        "cgroup CPU: ethand {ethand_s:.3} s vs cpu.stat {usage_s:.3} s"
    );
    assert!(
        unknown_s <= 0.01 * usage_s,
        "{unknown_s:.3} s of CPU went to cgroup=\"unknown\" during the compile"
    );
}

/// Processes that did nothing the probes saw are known all the same: one asleep since before
/// the daemon started, pid 1, a launcher waiting on its child (daemon and standalone); a
/// thread id gives its process's tree.
#[test]
fn idle_processes_launchers_and_threads_are_known() {
    let _serial = serial();
    let sleeper = bash("exec sleep 120");
    let spid = sleeper.0.id();
    thread::sleep(Duration::from_millis(300));
    let d = Daemon::start("ancestry-idle", "");
    thread::sleep(SETTLE);
    let t = d.snapshot(spid);
    let p = find_proc(&t, spid);
    eprintln!(
        "observed: idle sleeper {} comm {:?} alive {}",
        p.pid, p.comm, p.alive
    );
    assert_eq!(p.comm, "sleep");
    assert!(p.alive);
    assert_eq!(
        p.sched.oncpu_ns, 0,
        "asleep since before the daemon started"
    );
    // Asleep since before ethand knew it: its wait is at least that long, not timed.
    let sc = p
        .threads
        .iter()
        .find(|th| th.tid == spid)
        .and_then(|th| th.now.as_ref()?.syscall.clone())
        .expect("the sleeper's syscall");
    eprintln!("observed: sleeper in {sc:?}");
    assert_eq!(sc.name, "clock_nanosleep");
    assert!(sc.elapsed_ns.is_none() && sc.elapsed_at_least_ns.is_some());

    let init = d.snapshot(1);
    assert_eq!(init.processes[0].pid, 1, "pid 1 is known");

    // A launcher (bash waiting on a busy child) started before the daemon: its tree.
    let launcher = bash("sh -c 'while :; do :; done'; true");
    let lpid = launcher.0.id();
    thread::sleep(Duration::from_millis(500));
    let d2 = {
        drop(d);
        Daemon::start("ancestry-launcher", "")
    };
    thread::sleep(SETTLE);
    let t = d2.snapshot(lpid);
    eprintln!(
        "observed: launcher tree {:?}",
        t.processes
            .iter()
            .map(|p| (p.pid, p.comm.clone(), p.sched.oncpu_ns))
            .collect::<Vec<_>>()
    );
    assert_eq!(t.processes[0].pid, lpid, "the launcher is the root");
    assert!(
        t.processes
            .iter()
            .any(|p| p.ppid == lpid && p.sched.oncpu_ns > 0),
        "its busy child is in its tree"
    );

    // A thread id: the tree of its process. The daemon's own threads will do.
    let dpid = d2.pid();
    let tid = std::fs::read_dir(format!("/proc/{dpid}/task"))
        .expect("tasks")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|t| *t != dpid)
        .expect("a second thread of the daemon");
    let out = d2.cli(&["snapshot", "--pid", &tid.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "snapshot of tid {tid}: {}",
        text(&out.stderr)
    );
    let t: ethand_snapshot::TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(t.root_pid, dpid, "tid {tid} resolves to its process");
    assert_eq!(t.processes[0].pid, dpid);

    // A process started a moment ago, before the daemon's next round: its snapshot, not
    // "no process known".
    for _ in 0..3 {
        let young = bash("exec sleep 30");
        let ypid = young.0.id();
        let out = d2.cli(&["snapshot", "--pid", &ypid.to_string(), "--json"]);
        assert!(
            out.status.success(),
            "snapshot of pid {ypid} right after its start: {}",
            text(&out.stderr)
        );
        let t: ethand_snapshot::TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(t.root_pid, ypid);
    }
    drop(d2);

    // Standalone: the launcher, asleep in wait() through the whole measurement.
    let out = ethand_tests::ethand(&[
        "snapshot",
        "--pid",
        &lpid.to_string(),
        "--standalone",
        "--duration",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "standalone snapshot of a launcher: {} {}",
        out.status,
        text(&out.stderr)
    );
    let t: ethand_snapshot::TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(t.processes[0].pid, lpid);
    assert!(
        t.processes
            .iter()
            .any(|p| p.ppid == lpid && p.sched.oncpu_ns > 0)
    );
}

/// A process younger than the window: its window starts at its birth, so its rate is its
/// own (one busy core), not diluted by the time before it was born.
#[test]
fn window_never_reaches_before_birth() {
    let _serial = serial();
    let d = Daemon::start("ancestry-window", "");
    // Let the daemon's history grow well past the process's age.
    thread::sleep(Duration::from_secs(6));
    let b = bash("while :; do :; done");
    let pid = b.0.id();
    let born = Instant::now();
    thread::sleep(Duration::from_secs(3));
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &pid.to_string(),
        "--window",
        "300",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t: ethand_snapshot::TreeSnapshot = serde_json::from_slice(&out.stdout).expect("json");
    let age_ms = born.elapsed().as_millis() as u64;
    let w = t.processes[0].window.clone().expect("window");
    let cores = w.oncpu_ns as f64 / 1e6 / w.duration_ms as f64;
    // A busy loop runs or waits for a CPU all its life (the machine may be busy).
    let wanting = (w.oncpu_ns + w.runq_wait_ns) as f64 / 1e6 / w.duration_ms as f64;
    eprintln!(
        "observed: age {age_ms} ms, window {} ms, cores {cores:.2}, on CPU or waiting for one {wanting:.2}",
        w.duration_ms
    );
    assert!(
        w.duration_ms <= age_ms + 200,
        "a window of {} ms for a process {age_ms} ms old",
        w.duration_ms
    );
    assert!(
        wanting > 0.9,
        "a busy loop ran or waited for a CPU {wanting:.2} of its window"
    );
}

/// After exec the main thread has the new program's name.
#[test]
fn thread_names_follow_exec() {
    let _serial = serial();
    let d = Daemon::start("ancestry-exec", "");
    let b = bash("sleep 1; exec sh -c 'while :; do :; done'");
    let pid = b.0.id();
    // Seen as bash first, then exec'd.
    thread::sleep(Duration::from_millis(500));
    let _ = d.snapshot(pid);
    thread::sleep(Duration::from_millis(1500) + SETTLE);
    let t = d.snapshot(pid);
    let p = find_proc(&t, pid);
    let main = p
        .threads
        .iter()
        .find(|th| th.tid == pid)
        .expect("main thread");
    eprintln!("observed: comm {:?}, main thread {:?}", p.comm, main.comm);
    assert_eq!(p.comm, "sh");
    assert_eq!(main.comm, "sh", "the main thread's name after exec");
}
