//! The diagnosis engine end to end: for each rule that can be created on a small machine
//! without a GPU (the GPU runtime rules through the stand-in libcuda), one workload that must
//! fire it and one that must not, judged on `findings` of `ethand snapshot --pid P --json`;
//! the evidence is compared with the workload's own ground truth where it has one.
//!
//! Rates are over the snapshot window (`--window`, at most the daemon's history: each test
//! starts its own daemon), so each test asks for a window that the measured work fills.
//!
//! Not tested here: the rules that need NVML (input_pipeline_stall, gpu_underutilized,
//! gpu_throttling, gpu_errors), straggler_rank (several ranks), collective_bound (the stand-in
//! libnccl's collectives return at once: no collective time can be made) and
//! network_retransmits (loopback does not lose packets; netem is not in this kernel, see
//! `network_retransmits_skipped`).
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::diagnosis::Finding;
use ethand_tests::{
    Daemon, INTERVAL_MS, ProbeState, RemoveOnDrop, SETTLE, TreeSnapshot, find_proc, serial,
    standins::{self, Driver, GroundTruth, Lib, SYNC_ENV},
    text,
};

use crate::workload;

// ------------------------------------------------------------------ helpers

/// `ethand snapshot --pid PID --json --window WINDOW_S`.
fn snapshot(d: &Daemon, pid: u32, window_s: u64) -> TreeSnapshot {
    let w = window_s.to_string();
    let out = d.cli(&[
        "snapshot",
        "--pid",
        &pid.to_string(),
        "--json",
        "--window",
        &w,
    ]);
    assert!(
        out.status.success(),
        "ethand snapshot --pid {pid} --window {w} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ethand snapshot --json is not a TreeSnapshot: {e}\n{}",
            text(&out.stdout)
        )
    })
}

fn ids(t: &TreeSnapshot) -> Vec<&str> {
    t.findings.iter().map(|f| f.id.as_str()).collect()
}

fn finding<'a>(t: &'a TreeSnapshot, id: &str) -> Option<&'a Finding> {
    t.findings.iter().find(|f| f.id == id)
}

/// Prints the findings with their evidence (the figures of the test).
fn show(what: &str, t: &TreeSnapshot) {
    let window = t
        .processes
        .iter()
        .filter_map(|p| p.window.as_ref())
        .map(|w| w.duration_ms)
        .max();
    eprintln!(
        "observed: {what}: window {window:?} ms, findings {:?}",
        ids(t)
    );
    for f in &t.findings {
        let ev: Vec<String> = f
            .evidence
            .iter()
            .map(|e| format!("{}={:.4} {}", e.signal, e.value, e.unit))
            .collect();
        eprintln!(
            "observed:   {} ({}, impact {:.3}, speedup {:?}): {}",
            f.id,
            f.severity,
            f.impact,
            f.estimated_speedup,
            ev.join(", ")
        );
    }
}

/// The finding `id`, which must be there.
fn fired<'a>(t: &'a TreeSnapshot, id: &str) -> &'a Finding {
    finding(t, id).unwrap_or_else(|| panic!("rule {id} did not fire; findings: {:#?}", t.findings))
}

fn assert_not_fired(t: &TreeSnapshot, id: &str) {
    assert!(
        finding(t, id).is_none(),
        "rule {id} fired but must not: {:#?}",
        finding(t, id)
    );
}

/// The value of evidence `signal` of a finding, which must be there.
fn ev(f: &Finding, signal: &str) -> f64 {
    f.evidence
        .iter()
        .find(|e| e.signal == signal)
        .unwrap_or_else(|| panic!("{}: no evidence {signal}: {:?}", f.id, f.evidence))
        .value
}

fn assert_near(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= rel * want.abs(),
        "{what}: {got} is not within {:.0}% of {want}",
        rel * 100.0
    );
}

// ------------------------------------------------------------------ CPU

/// The workload under SCHED_FIFO (`chrt -f 1`, which execs it: same pid), so that it is
/// "alone on its CPU" even while other work (builds) loads the machine: fair-class tasks
/// cannot make it wait, only RT throttling (5% of each second) can.
fn workload_alone(args: &[&str]) -> ethand_tests::Workload {
    let mut all = vec!["-f", "1", env!("CARGO_BIN_EXE_ethand-workload")];
    all.extend_from_slice(args);
    ethand_tests::Workload::start("chrt", &all)
}

/// `chrt -r 1 taskset -c CPUS ethand-workload ARGS` (each execs the next: same pid):
/// pinned, and round-robin real-time so that the machine's other work (fair class) cannot
/// become a neighbour of the test's own; its threads and the test's busy loops (same class
/// and priority) share the CPU in turns. CPU 0 only: the daemon keeps the other.
fn pinned(cpus: &str, args: &[&str]) -> ethand_tests::Workload {
    let mut all = vec![
        "-r",
        "1",
        "taskset",
        "-c",
        cpus,
        env!("CARGO_BIN_EXE_ethand-workload"),
    ];
    all.extend_from_slice(args);
    ethand_tests::Workload::start("chrt", &all)
}

/// The kernel's figures of a process's threads: (on-CPU ns, run-queue wait ns), summed from
/// /proc/PID/task/*/schedstat.
fn schedstat(pid: u32) -> (u64, u64) {
    let mut sum = (0, 0);
    for t in fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .flatten()
    {
        let Ok(s) = fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        let mut f = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
        sum.0 += f.next().unwrap_or(0);
        sum.1 += f.next().unwrap_or(0);
    }
    sum
}

/// Busy loops outside the tree, pinned to CPUs: the neighbours. Killed on drop.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start(n: usize, cpus: &str) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    Command::new("chrt")
                        .args([
                            "-r",
                            "1",
                            "taskset",
                            "-c",
                            cpus,
                            "sh",
                            "-c",
                            "while :; do :; done",
                        ])
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|c| c.id()).collect()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One run of `units THREADS` pinned to `cpus`: busy for `secs`, a snapshot of its last 2 s,
/// then stopped. Its throughput (units per second) and the snapshot.
fn units_run(d: &Daemon, threads: u32, cpus: &str, secs: u64) -> (f64, TreeSnapshot) {
    let mut w = pinned(cpus, &["units", &threads.to_string()]);
    w.send_byte();
    thread::sleep(Duration::from_secs(secs));
    let t = snapshot(d, w.pid, 2);
    let done = w.stop();
    w.finish();
    let rate = done.u64("units") as f64 / (done.u64("wall_ns") as f64 / 1e9);
    (rate, t)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs of each side of a measured fix: one at a time, their median compared.
const PAIR_RUNS: usize = 3;

/// Two busy threads of one process pinned to one CPU: they wait for each other, not for a
/// neighbour. The self-inflicted finding (thread_oversubscription, no estimate) fires, not
/// cpu_contention; its run-queue ratio is the kernel's (schedstat of the threads over the
/// run) and the cores it may use are its affinity's one CPU.
#[test]
fn two_busy_threads_on_one_cpu_are_self_inflicted_contention() {
    let _serial = serial();
    let d = Daemon::start("diag-contention", "");
    let mut w = pinned("0", &["units", "2"]);
    let before = schedstat(w.pid);
    w.send_byte();
    thread::sleep(Duration::from_secs(3));
    let mid = schedstat(w.pid);
    let t = snapshot(&d, w.pid, 2);
    w.stop();
    show("two busy threads on one CPU", &t);
    let truth = (mid.1 - before.1) as f64 / (mid.0 - before.0) as f64;
    eprintln!("observed: kernel: runq / on-CPU of the threads over the run: {truth:.3}");
    assert!(
        truth > 0.5,
        "the workload made too little contention: {truth}"
    );
    let f = fired(&t, "thread_oversubscription");
    assert_near(
        "cpu.runq_wait_ratio vs the kernel's",
        ev(f, "cpu.runq_wait_ratio"),
        truth,
        0.15,
    );
    assert_eq!(ev(f, "cpu.allowed_cores"), 1.0, "its affinity: one CPU");
    assert!(
        ev(f, "cpu.demand_cores") > 1.5,
        "two threads want two cores"
    );
    assert_eq!(
        f.estimated_speedup, None,
        "no estimate for a self-inflicted case"
    );
    assert_not_fired(&t, "cpu_contention");
    w.finish();
}

/// The contention estimate against its measured fix: one busy thread sharing CPU 0 with 4
/// busy neighbours (outside its tree), then the same thread alone; the medians of
/// [`PAIR_RUNS`] runs each, one at a time. The finding names the neighbours, and its
/// estimate is within 30 % of the speed-up removing them gave.
#[test]
fn contention_estimate_matches_the_measured_fix_of_removing_neighbours() {
    let _serial = serial();
    let d = Daemon::start("diag-neighbours", "");
    let (mut crowded, mut alone, mut estimates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..PAIR_RUNS {
        let hogs = Hogs::start(4, "0");
        let (rate, t) = units_run(&d, 1, "0", 3);
        show("one thread sharing CPU 0 with 4 busy loops", &t);
        let f = fired(&t, "cpu_contention");
        assert_eq!(ev(f, "cpu.allowed_cores"), 1.0);
        let named: Vec<&String> = f
            .detail
            .iter()
            .filter(|l| l.starts_with("held the CPUs: pid "))
            .collect();
        for pid in hogs.pids() {
            assert!(
                named
                    .iter()
                    .any(|l| l.starts_with(&format!("held the CPUs: pid {pid} (sh) "))),
                "busy loop {pid} not named: {:#?}",
                f.detail
            );
        }
        estimates.push(f.estimated_speedup.expect("an estimate"));
        crowded.push(rate);
        drop(hogs);
    }
    for _ in 0..PAIR_RUNS {
        let (rate, t) = units_run(&d, 1, "0", 3);
        show("the same thread alone", &t);
        assert_not_fired(&t, "cpu_contention");
        alone.push(rate);
    }
    let measured = median(alone.clone()) / median(crowded.clone());
    let estimate = median(estimates.clone());
    eprintln!(
        "observed: units/s crowded {crowded:?}, alone {alone:?}: measured speed-up {measured:.2}; estimates {estimates:?}"
    );
    assert!(
        measured > 2.0,
        "the neighbours made too little contention: {measured}"
    );
    assert_near("the estimate vs the measured fix", estimate, measured, 0.3);
}

/// The self-inflicted counterpart, measured: 4 busy threads on one CPU, then 1 thread.
/// Throughput is the same (its threads fill its core either way): the finding gives no
/// estimate, and cpu_contention, whose estimate would promise a gain, stays quiet.
#[test]
fn oversubscription_fix_gains_nothing_and_no_gain_is_promised() {
    let _serial = serial();
    let d = Daemon::start("diag-oversub-pair", "");
    let (mut many, mut fit) = (Vec::new(), Vec::new());
    for _ in 0..PAIR_RUNS {
        let (rate, t) = units_run(&d, 4, "0", 3);
        show("4 busy threads on CPU 0", &t);
        let f = fired(&t, "thread_oversubscription");
        assert_eq!(f.estimated_speedup, None);
        assert_eq!(ev(f, "cpu.allowed_cores"), 1.0);
        assert_not_fired(&t, "cpu_contention");
        many.push(rate);
    }
    for _ in 0..PAIR_RUNS {
        let (rate, _) = units_run(&d, 1, "0", 3);
        fit.push(rate);
    }
    let measured = median(fit.clone()) / median(many.clone());
    eprintln!("observed: units/s with 4 threads {many:?}, with 1 {fit:?}: speed-up {measured:.2}");
    assert!(
        (0.77..1.3).contains(&measured),
        "cutting the threads changed throughput by {measured:.2}x: the no-estimate premise is wrong"
    );
}

/// One busy loop of 3 s CPU time, alone on a CPU (SCHED_FIFO, see [`workload_alone`]).
#[test]
fn cpu_contention_quiet_for_one_busy_loop() {
    let _serial = serial();
    let d = Daemon::start("diag-nocontention", "");
    let mut w = workload_alone(&["cpu", "3000"]);
    let done = w.go();
    thread::sleep(SETTLE);
    let t = snapshot(&d, w.pid, 10);
    show("one busy loop", &t);
    let p = find_proc(&t, w.pid);
    eprintln!(
        "observed: cpu_ns {} (workload), runq_wait_ns {} (ethand)",
        done.u64("cpu_ns"),
        p.sched.runq_wait_ns
    );
    assert_not_fired(&t, "cpu_contention");
    assert_not_fired(&t, "thread_oversubscription");
    w.finish();
}

/// Threads per CPU of `spin-threads`: 8 per CPU.
fn eight_per_cpu() -> String {
    let cpus = thread::available_parallelism().map_or(2, |n| n.get());
    (8 * cpus).to_string()
}

/// 8 spinning threads on one CPU for 3 s: thread_oversubscription fires, its thread count is
/// the workload's (all spinning threads busy; the main thread blocked on stdin is not).
#[test]
fn thread_oversubscription_fires_for_8_spinning_threads_per_cpu() {
    let _serial = serial();
    let d = Daemon::start("diag-oversub", "");
    // On CPU 0, round-robin (see `pinned`): no neighbour but its own threads.
    let n = "8".to_string();
    let mut w = pinned("0", &["spin-threads", &n, "1000", "0"]);
    w.send_byte();
    thread::sleep(Duration::from_secs(3));
    let t = snapshot(&d, w.pid, 2);
    show(&format!("{n} spinning threads"), &t);
    let done = w.stop();
    eprintln!("observed: workload {done:?}");
    let n: f64 = n.parse().expect("number");
    let f = fired(&t, "thread_oversubscription");
    let cpus = ev(f, "node.cpus");
    assert_eq!(ev(f, "cpu.threads"), n + 1.0, "threads: spinners + main");
    let main = find_proc(&t, w.pid)
        .threads
        .iter()
        .find(|th| th.tid == w.pid)
        .map(|th| th.sched.clone());
    eprintln!("observed: main thread (blocked on stdin): {main:?}");
    // The spinners; the main thread, blocked on stdin, should not count (see the report).
    let per_cpu = ev(f, "cpu.threads_per_cpu");
    assert!(
        per_cpu == n / cpus || per_cpu == (n + 1.0) / cpus,
        "busy threads per CPU: {per_cpu}, expected {}",
        n / cpus
    );
    assert!(ev(f, "cpu.involuntary_switch_ratio") > 0.3);
    // 8 threads on one CPU: each waits about 7 times as long as it runs.
    assert!(ev(f, "cpu.runq_wait_ratio") > 2.0);
    w.finish();
}

/// 8 threads per CPU that burn 1 ms and sleep 20 ms: none is busy, the rule stays quiet.
#[test]
fn thread_oversubscription_quiet_for_8_sleeping_threads_per_cpu() {
    let _serial = serial();
    let d = Daemon::start("diag-nooversub", "");
    let n = eight_per_cpu();
    let mut w = workload(&["spin-threads", &n, "1000", "20000"]);
    w.send_byte();
    thread::sleep(Duration::from_secs(3));
    let t = snapshot(&d, w.pid, 2);
    show(&format!("{n} mostly sleeping threads"), &t);
    w.stop();
    assert_not_fired(&t, "thread_oversubscription");
    w.finish();
}

/// A moderate loop (10 ms of CPU, 10 ms asleep) for 4 s, not made to wait by other work
/// (SCHED_FIFO, see [`workload_alone`]): nothing to report.
#[test]
fn healthy_process_has_no_findings() {
    let _serial = serial();
    let d = Daemon::start("diag-healthy", "");
    let mut w = workload_alone(&["spin-threads", "1", "10000", "10000"]);
    w.send_byte();
    thread::sleep(Duration::from_secs(4));
    let t = snapshot(&d, w.pid, 3);
    show("healthy half-busy loop", &t);
    w.stop();
    assert!(
        t.findings.is_empty(),
        "a healthy process has findings: {:#?}",
        t.findings
    );
    w.finish();
}

// ------------------------------------------------------------------ disk

/// Runs `readloop FILE 64 5000 HOW` on the disk behind /var/tmp (a block device, not tmpfs)
/// and snapshots its last 4 s (all inside the 5 s of reads: setup's writes are outside).
fn readloop(how: &str) -> (TreeSnapshot, u64, u64) {
    let dir = Path::new("/var/tmp");
    let file = dir.join(format!("ethand-test-diag-{how}-{}.dat", std::process::id()));
    let _cleanup = RemoveOnDrop(file.clone());
    let d = Daemon::start(&format!("diag-{how}"), "");
    let mut w = workload(&["readloop", file.to_str().expect("utf-8"), "64", "5000", how]);
    let done = w.go();
    let t = snapshot(&d, w.pid, 4);
    show(&format!("readloop {how}: {done:?}"), &t);
    w.finish();
    (t, done.u64("read"), done.u64("took_ns"))
}

/// O_DIRECT reads of a 64 MiB file for 5 s: the process is in pread() nearly all the time and
/// every byte comes from the disk. disk_io_bound fires; the read rate is the workload's.
#[test]
fn disk_io_bound_fires_for_direct_reads() {
    let _serial = serial();
    let (t, read, took) = readloop("direct");
    let f = fired(&t, "disk_io_bound");
    let rate = read as f64 / (took as f64 / 1e9);
    eprintln!("observed: workload read {read} bytes in {took} ns: {rate:.0} B/s");
    assert!(ev(f, "io.wait_ratio") > 0.5);
    // One request in flight at a time, each a pread the process waits for: the disk serves
    // the process most of its life.
    assert!(ev(f, "io.disk_busy_ratio") > 0.5);
    // The window (4 s, whole intervals) lies inside the 5 s of reads at a steady rate.
    assert_near(
        "io.block_read_bytes_per_second vs the workload's rate",
        ev(f, "io.block_read_bytes_per_second"),
        rate,
        0.25,
    );
    assert!(ev(f, "io.block_write_bytes_per_second") < 1048576.0);
    assert!(ev(f, "io.block_service_seconds_per_op") > 0.0);
}

/// The same file read for 5 s from the page cache (read once in setup): no disk reads, so no
/// disk_io_bound, even though the process spends as much time in read(). (Once in CI, right
/// after a fresh build, the process read 4 MiB from the disk in the window, just over the rule's
/// 1 MiB/s: most likely pages of its file evicted under the build's page cache pressure. The
/// disk's busy share keeps the rule quiet for that.)
#[test]
fn disk_io_bound_quiet_for_page_cache_reads() {
    let _serial = serial();
    let (t, read, took) = readloop("cached");
    eprintln!("observed: workload read {read} bytes in {took} ns from the page cache");
    assert_not_fired(&t, "disk_io_bound");
}

// ------------------------------------------------------------------ GPU (stand-in libcuda)

/// Rescan every 300 ms: a library loaded by a process is attached within about that.
const GPU_TOML: &str = "[gpu]\nlevel = \"process\"\nrescan_interval_ms = 300\n";

/// Waits until `ethand status` lists the library file attached.
fn wait_attached(d: &Daemon, path: &Path) {
    let canon: PathBuf = fs::canonicalize(path).expect("canonicalize");
    let ino = fs::metadata(&canon).expect("stat").ino();
    let t0 = Instant::now();
    loop {
        let st = d.status();
        if st.gpu_libraries.iter().any(|l| {
            l.inode == ino && Path::new(&l.path) == canon && l.state == ProbeState::Attached
        }) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "{} not attached: {:#?}",
            path.display(),
            st.gpu_libraries
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `ops` (repeated `times`) in gpu_driver with the stand-in libcuda once it is attached,
/// with syncs sleeping `sync_us`. Returns the driver idle at the end of its plan (alive), the
/// snapshot of its last `window_s` seconds taken `settle` after the plan ended, and how long
/// the plan took.
fn gpu_plan(
    d: &Daemon,
    sync_us: u64,
    ops: &str,
    times: usize,
    settle: Duration,
    window_s: u64,
) -> (Driver, TreeSnapshot, Duration) {
    let s = standins::shared();
    let mut plan = vec!["wait_stdin"];
    plan.extend(std::iter::repeat_n(ops, times));
    plan.push("wait_stdin");
    let mut cmd: Command = s.command(&[Lib::Cuda], &plan);
    cmd.env(SYNC_ENV, sync_us.to_string());
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    wait_attached(d, &s.cuda);
    let t0 = Instant::now();
    drv.resume();
    drv.wait_for("waiting");
    let took = t0.elapsed();
    thread::sleep(settle);
    let t = snapshot(d, drv.pid, window_s);
    show(
        &format!("gpu_driver: [{ops}] x {times} (sync {sync_us} us) took {took:?}"),
        &t,
    );
    (drv, t, took)
}

fn finish(drv: Driver) -> GroundTruth {
    drv.finish()
}

/// The snapshot as if NVML had read the tree's GPU `util` busy (the stand-in machine has no
/// GPU), diagnosed again with `ethand diagnose FILE --json`.
fn with_device_busy(t: &TreeSnapshot, util: f64) -> TreeSnapshot {
    let mut t = t.clone();
    let d = t.total.gpu_derived.as_mut().expect("gpu_derived");
    d.device_utilization_ratio = Some(util);
    d.device_idle_ratio = Some(1.0 - util);
    let file = ethand_tests::temp_path("diagnose-input", "json");
    let _rm = RemoveOnDrop(file.clone());
    fs::write(&file, serde_json::to_vec(&t).expect("JSON")).expect("write");
    let out = ethand_tests::ethand(&["diagnose", file.to_str().expect("utf-8"), "--json"]);
    assert!(
        out.status.success(),
        "ethand diagnose: {}",
        text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    t.findings = serde_json::from_value(v["findings"].clone()).expect("findings");
    t.not_evaluated = serde_json::from_value(v["not_evaluated"].clone()).expect("not_evaluated");
    show(&format!("the same, GPU {:.0} % busy", 100.0 * util), &t);
    t
}

/// 10 launches then a stream sync of 5 ms, 1000 times (5 s): the host is blocked in syncs
/// nearly all the time. Without a reading of the GPU's activity (no NVML here) the rule says
/// it cannot decide; with the GPU read as mostly idle it fires with the driver's exact sync
/// count per launch.
#[test]
fn excessive_sync_fires_for_a_sync_after_every_10_launches() {
    let _serial = serial();
    let d = Daemon::start("diag-sync", GPU_TOML);
    let (drv, t, took) = gpu_plan(&d, 5000, "launches 10 sync stream 1", 1000, SETTLE, 4);
    let truth = finish(drv);
    let syncs = truth.total("cuStreamSynchronize");
    let launches = truth.total("cuLaunchKernel").calls;
    assert_not_fired(&t, "excessive_sync");
    let ne = t
        .not_evaluated
        .iter()
        .find(|n| n.rule == "excessive_sync")
        .unwrap_or_else(|| panic!("excessive_sync not listed: {:#?}", t.not_evaluated));
    assert_eq!(ne.missing, vec!["gpu.sm_busy_ratio".to_string()]);
    assert!(ne.how.contains("NVML"), "{}", ne.how);
    let t = with_device_busy(&t, 0.1);
    let f = fired(&t, "excessive_sync");
    eprintln!(
        "observed: excessive_sync impact {} speedup {:?}",
        f.impact, f.estimated_speedup
    );
    // The window's edges may split one burst of 10 launches: within 1 % of the plan's.
    assert_near(
        "gpu.syncs_per_launch vs the driver's",
        ev(f, "gpu.syncs_per_launch"),
        syncs.calls as f64 / launches as f64,
        0.01,
    );
    // The 4 s window holds 3.2 s of the plan's end and SETTLE idle: the share of the plan's
    // time in syncs (ground truth: at least calls x sleep), scaled by that.
    let in_syncs = syncs.min_time_ns as f64 / took.as_nanos() as f64;
    let ratio = ev(f, "gpu.sync_blocked_ratio");
    eprintln!(
        "observed: truth {} syncs ({} ns asleep) / {launches} launches; plan {took:?}: {in_syncs:.3} of it in syncs",
        syncs.calls, syncs.min_time_ns
    );
    let plan_share = (4.0 - SETTLE.as_secs_f64()) / 4.0;
    assert!(
        ratio >= 0.8 * in_syncs * plan_share && ratio <= 1.05,
        "gpu.sync_blocked_ratio {ratio}: expected about {:.3}",
        in_syncs * plan_share
    );
}

/// 100 launches, one 1 ms sync and 20 ms of host work, 250 times: rare and short syncs, quiet
/// even with the GPU read as idle.
#[test]
fn excessive_sync_quiet_for_rare_short_syncs() {
    let _serial = serial();
    let d = Daemon::start("diag-nosync", GPU_TOML);
    let (drv, t, _) = gpu_plan(
        &d,
        1000,
        "launches 100 sync stream 1 sleep 20",
        250,
        SETTLE,
        4,
    );
    let truth = finish(drv);
    eprintln!(
        "observed: truth {} syncs / {} launches",
        truth.total("cuStreamSynchronize").calls,
        truth.total("cuLaunchKernel").calls
    );
    assert_not_fired(&with_device_busy(&t, 0.1), "excessive_sync");
}

/// 5,000 synchronous 4 KiB host-to-device copies (the path of pageable memory in CuPy and the
/// driver API): small_pageable_copies fires with the exact count and size, no GPU reading
/// needed.
#[test]
fn small_pageable_copies_fires_for_5000_small_sync_copies() {
    let _serial = serial();
    let d = Daemon::start("diag-copies", GPU_TOML);
    let (drv, t, _) = gpu_plan(&d, 1000, "htod 4K x 5000", 1, SETTLE, 2);
    let truth = finish(drv);
    let c = truth.total("cuMemcpyHtoD_v2");
    let f = fired(&t, "small_pageable_copies");
    let window_s = t
        .processes
        .iter()
        .filter_map(|p| p.window.as_ref())
        .map(|w| w.duration_ms)
        .max()
        .expect("window") as f64
        / 1000.0;
    assert_near(
        "copies in the window",
        ev(f, "gpu.h2d_copies_per_second") * window_s,
        c.calls as f64,
        1e-9,
    );
    assert_eq!(c.calls, 5000);
    assert_eq!(
        ev(f, "gpu.h2d_copy_avg_bytes"),
        c.bytes as f64 / c.calls as f64
    );
    assert_eq!(ev(f, "gpu.h2d_copy_avg_bytes"), 4096.0);
    assert_eq!(ev(f, "gpu.sync_h2d_copy_share"), 1.0);
}

/// 50 asynchronous 64 MiB copies: large and asynchronous, nothing to report.
#[test]
fn small_pageable_copies_quiet_for_large_async_copies() {
    let _serial = serial();
    let d = Daemon::start("diag-nocopies", GPU_TOML);
    let (drv, t, _) = gpu_plan(&d, 1000, "htod_async 64M x 50", 1, SETTLE, 10);
    let truth = finish(drv);
    eprintln!("observed: truth {:?}", truth.total("cuMemcpyHtoDAsync_v2"));
    assert_not_fired(&t, "small_pageable_copies");
}

/// 20 MiB allocated every 100 ms and never freed, for 6 s: gpu_memory_growth fires; live
/// bytes are the driver's, the growth rate is 200 MiB/s.
#[test]
fn gpu_memory_growth_fires_for_allocations_never_freed() {
    let _serial = serial();
    let d = Daemon::start("diag-growth", GPU_TOML);
    let (drv, t, took) = gpu_plan(
        &d,
        1000,
        "alloc 20M sleep 100",
        60,
        Duration::from_millis(2 * INTERVAL_MS),
        4,
    );
    let truth = finish(drv);
    let f = fired(&t, "gpu_memory_growth");
    let live = truth.live("device") as f64;
    assert_eq!(live, 60.0 * 20.0 * 1048576.0);
    assert_eq!(ev(f, "gpu.memory_live_bytes"), live);
    assert_eq!(ev(f, "gpu.memory_allocs"), 60.0);
    // 20 MiB per 100 ms of plan (plus the time of the calls): at most 200 MiB/s, and the
    // window (4 s, the last 0.4 s idle) holds at least 3 s of it.
    let rate = live / took.as_secs_f64();
    let growth = ev(f, "gpu.memory_growth_bytes_per_second");
    eprintln!("observed: plan {took:?}: {rate:.0} B/s of growth");
    assert!(
        growth >= 0.6 * rate && growth <= 1.1 * 200.0 * 1048576.0,
        "gpu.memory_growth_bytes_per_second {growth}: expected about {rate:.0}"
    );
}

/// The same allocations, each freed 50 ms later: live memory never grows.
#[test]
fn gpu_memory_growth_quiet_when_every_allocation_is_freed() {
    let _serial = serial();
    let d = Daemon::start("diag-nogrowth", GPU_TOML);
    let (drv, t, _) = gpu_plan(
        &d,
        1000,
        "alloc 20M sleep 50 free all sleep 50",
        60,
        Duration::from_millis(2 * INTERVAL_MS),
        4,
    );
    let truth = finish(drv);
    assert_eq!(truth.live("device"), 0);
    assert_not_fired(&t, "gpu_memory_growth");
}

/// 4 MiB blocks allocated and freed back to the driver 4 at a time, 100 times in about 1.5 s
/// (a caching allocator emptied every step): allocator_churn fires, and the window counts
/// every cuMemFree_v2 the driver made, no more.
#[test]
fn allocator_churn_counts_every_free_back_to_the_driver() {
    let _serial = serial();
    let d = Daemon::start("diag-churn", GPU_TOML);
    let (drv, t, took) = gpu_plan(
        &d,
        1000,
        "alloc 4M x 4 free all sleep 10",
        100,
        Duration::from_millis(2 * INTERVAL_MS),
        4,
    );
    let truth = finish(drv);
    let frees = truth.total("cuMemFree_v2").calls;
    assert_eq!(frees, 400);
    assert_eq!(truth.live("device"), 0);
    let w = t
        .processes
        .iter()
        .find(|p| p.pid == t.root_pid)
        .and_then(|p| p.window.as_ref())
        .expect("window");
    eprintln!(
        "observed: plan {took:?}, window {} ms: {:?} frees",
        w.duration_ms, w.gpu_blocking_frees
    );
    assert_eq!(w.gpu_blocking_frees, Some(frees));
    let f = fired(&t, "allocator_churn");
    assert_near(
        "frees in the window",
        ev(f, "gpu.blocking_frees_per_second") * w.duration_ms as f64 / 1000.0,
        frees as f64,
        1e-9,
    );
    // Live memory swings by the step's blocks: no leak is reported.
    assert_not_fired(&t, "gpu_memory_growth");
}

// ------------------------------------------------------------------ skipped

/// 400 all-reduces of 1 Mi float32 whose host call takes 5 ms (the stand-in's
/// ETHAND_STANDIN_COLL_US): most of the window inside collectives.
fn nccl_plan(
    d: &Daemon,
    coll_us: u64,
    ops: &str,
    times: usize,
    window_s: u64,
) -> (Driver, TreeSnapshot) {
    let s = standins::shared();
    let mut plan = vec!["wait_stdin", "comm_init_rank_config 0 2"];
    plan.extend(std::iter::repeat_n(ops, times));
    plan.push("wait_stdin");
    let mut cmd: Command = s.command(&[Lib::Nccl], &plan);
    cmd.env("ETHAND_STANDIN_COLL_US", coll_us.to_string());
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    wait_attached(d, &s.nccl);
    drv.resume();
    drv.wait_for("waiting");
    thread::sleep(Duration::from_millis(700));
    let t = snapshot(d, drv.pid, window_s);
    show(
        &format!("gpu_driver: [{ops}] x {times} (collective {coll_us} us)"),
        &t,
    );
    (drv, t)
}

#[test]
fn collective_bound_fires_when_collectives_take_the_time() {
    let _serial = serial();
    let d = Daemon::start("diag-coll", GPU_TOML);
    let (drv, t) = nccl_plan(&d, 5000, "allreduce 1M float32", 500, 3);
    let truth = finish(drv);
    let f = fired(&t, "collective_bound");
    let calls = truth.total("ncclAllReduce").calls;
    assert_eq!(ev(f, "gpu.collective_calls"), calls as f64);
    assert_eq!(
        ev(f, "gpu.collective_bytes"),
        (calls * (1 << 20) * 4) as f64
    );
    assert!(ev(f, "gpu.collective_ratio") > 0.3, "{f:?}");
}

#[test]
fn collective_bound_quiet_for_quick_collectives() {
    let _serial = serial();
    let d = Daemon::start("diag-nocoll", GPU_TOML);
    let (drv, t) = nccl_plan(&d, 0, "allreduce 1M float32 sleep 5", 500, 3);
    finish(drv);
    assert!(!ids(&t).contains(&"collective_bound"), "{:?}", ids(&t));
}

/// `ethand compare` of a real fix leads with its outcome: one busy thread sharing CPU 0 with
/// 4 busy loops (before), then alone (after). The first table is the outcomes, cores used
/// first, its ratio the throughput ratio the workload itself measured (within 30 %); and a
/// ratio it shows is the one the snapshot's finding quoted (one computation).
#[test]
fn compare_of_a_real_fix_leads_with_the_outcome() {
    let _serial = serial();
    let d = Daemon::start("diag-compare", "");
    let hogs = Hogs::start(4, "0");
    let (slow, before) = units_run(&d, 1, "0", 3);
    drop(hogs);
    let (fast, after) = units_run(&d, 1, "0", 3);
    let (b, a) = (
        ethand_tests::temp_path("compare-before", "json"),
        ethand_tests::temp_path("compare-after", "json"),
    );
    let _rm = (RemoveOnDrop(b.clone()), RemoveOnDrop(a.clone()));
    fs::write(&b, serde_json::to_vec(&before).expect("JSON")).expect("write");
    fs::write(&a, serde_json::to_vec(&after).expect("JSON")).expect("write");
    let (bs, as_) = (b.to_str().expect("utf-8"), a.to_str().expect("utf-8"));
    let out = ethand_tests::ethand(&["compare", bs, as_, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let first = &c["outcomes"][0];
    let measured = fast / slow;
    eprintln!("observed: units/s {slow:.0} -> {fast:.0} ({measured:.2}x); first outcome {first}");
    assert_eq!(first["metric"], "cpu.cores_used");
    assert_near(
        "cores used after / before vs the measured throughput",
        first["ratio"].as_f64().expect("ratio"),
        measured,
        0.3,
    );
    let runq = c["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .find(|r| r["metric"] == "cpu.runq_wait_ratio")
        .expect("run-queue row");
    let quoted = ev(fired(&before, "cpu_contention"), "cpu.runq_wait_ratio");
    assert_eq!(
        runq["before"].as_f64(),
        Some(quoted),
        "the snapshot's figure, not another computation"
    );
    let txt = text(&ethand_tests::ethand(&["compare", bs, as_]).stdout);
    let at = |what: &str| {
        txt.find(what)
            .unwrap_or_else(|| panic!("no {what:?} in:\n{txt}"))
    };
    assert!(at("Outcomes") < at("Most changed"), "{txt}");
    assert!(at("OUTCOME") < at("cpu.cores_used"), "{txt}");
}
