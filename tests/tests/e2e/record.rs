//! `ethand record`: the Chrome JSON trace of a process tree against workloads of known
//! ground truth: exactly N slow nanosleeps (and fast getpids below the threshold), scheduler
//! slices that never overlap on one thread, exact GPU call counts through the stand-ins, no
//! drops, and per-thread timestamps in order.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    ethand_bin, serial,
    standins::{self, Driver, Lib, SYNC_ENV},
    temp_path,
};
use serde_json::Value;

use crate::workload;

/// `ethand record` running in the background; its stderr is watched for the line that says
/// the programs are attached.
struct Recorder {
    child: Child,
    stderr: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Recorder {
    fn start(pid: u32, duration: &str, out: &std::path::Path, threshold_us: u64) -> Self {
        let mut child = Command::new(ethand_bin())
            .args([
                "record",
                "--pid",
                &pid.to_string(),
                "--duration",
                duration,
                "-o",
                out.to_str().expect("utf-8 path"),
                "--syscall-threshold-us",
                &threshold_us.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ethand record");
        let err = child.stderr.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut r = Self {
            child,
            stderr: rx,
            log: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match r.stderr.recv_timeout(left) {
                Ok(l) => {
                    let ready = l.contains("ethand: recording");
                    r.log.push(l);
                    if ready {
                        return r;
                    }
                }
                Err(e) => panic!(
                    "ethand record did not start recording ({e}); exit {:?}; stderr:\n{}",
                    r.child.try_wait(),
                    r.log.join("\n")
                ),
            }
        }
    }

    /// Waits for the end; returns stdout. Panics on failure.
    fn finish(mut self) -> String {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "ethand record still running"
            );
            thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.log.push(l);
        }
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            use std::io::Read as _;
            let _ = o.read_to_string(&mut out);
        }
        assert!(
            status.success(),
            "ethand record failed ({status}); stderr:\n{}",
            self.log.join("\n")
        );
        out
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn load(path: &std::path::Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let _ = fs::remove_file(path);
    serde_json::from_str(&text).expect("the trace is JSON")
}

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents array")
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Complete events of one (pid, tid) track are in start order, and (for sched tracks) never
/// overlap. Returns the number of tracks checked.
fn check_tracks(trace: &Value, pid: u64, sched_base: u64) -> usize {
    let mut tracks: BTreeMap<u64, Vec<(f64, f64, String)>> = BTreeMap::new();
    for e in events(trace) {
        if e["ph"] == "X" && u(e, "pid") == pid {
            tracks.entry(u(e, "tid")).or_default().push((
                f(e, "ts"),
                f(e, "dur"),
                e["name"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for (tid, evs) in &tracks {
        for w in evs.windows(2) {
            assert!(
                w[1].0 >= w[0].0,
                "track {tid}: timestamps not monotonic: {:?} then {:?}",
                w[0],
                w[1]
            );
            if *tid >= sched_base {
                // 1 ns of slack for the float rounding of fractional microseconds.
                assert!(
                    w[0].0 + w[0].1 <= w[1].0 + 0.001,
                    "sched track {tid}: slices overlap: {:?} then {:?}",
                    w[0],
                    w[1]
                );
            }
        }
    }
    tracks.len()
}

/// 20 nanosleeps of 2 ms and 5000 getpids, recorded with a 1 ms threshold: exactly the 20
/// nanosleeps (each >= 2 ms), no getpid, sched slices on the workload's thread that do not
/// overlap, ordered tracks, names, and no drops.
#[test]
fn record_slow_syscalls_and_sched() {
    let _serial = serial();
    let (n, sleep_us, fast, threshold_us) = (20u64, 2000u64, 5000u64, 1000u64);
    let mut w = workload(&[
        "slow-syscalls",
        &n.to_string(),
        &sleep_us.to_string(),
        &fast.to_string(),
    ]);
    let out = temp_path("record", "json");
    let rec = Recorder::start(w.pid, "3s", &out, threshold_us);
    let t0 = Instant::now();
    let done = w.go();
    assert_eq!(done.u64("nanosleep"), n);
    eprintln!("observed: workload done after {:?}", t0.elapsed());
    let stdout = rec.finish();
    let pid = w.pid as u64;
    w.finish();
    eprintln!("observed: ethand record: {}", stdout.trim());
    assert!(
        stdout.contains("recorded ") && stdout.contains(" dropped)"),
        "{stdout}"
    );
    assert!(
        !std::path::Path::new(&format!("{}.tmp", out.display())).exists(),
        "FILE.tmp left"
    );
    let trace = load(&out);
    assert_eq!(trace["displayTimeUnit"], "ns");
    let meta = &trace["metadata"];
    assert_eq!(u(meta, "dropped"), 0, "drops: {meta}");
    assert_eq!(u(meta, "syscall_threshold_us"), threshold_us);
    let sched_base = u(meta, "sched_tid_base");
    let evs = events(&trace);

    let sleeps: Vec<&Value> = evs
        .iter()
        .filter(|e| e["cat"] == "syscall" && u(e, "pid") == pid && e["name"] == "nanosleep")
        .collect();
    let durs: Vec<f64> = sleeps.iter().map(|e| f(e, "dur")).collect();
    eprintln!(
        "observed: {} nanosleep events, durations (us) {durs:?}",
        sleeps.len()
    );
    assert_eq!(sleeps.len() as u64, n, "nanosleep events");
    for e in &sleeps {
        assert_eq!(e["ph"], "X");
        assert_eq!(u(e, "tid"), pid, "single-threaded workload: tid = pid");
        assert!(
            f(e, "dur") >= sleep_us as f64,
            "nanosleep shorter than {sleep_us} us: {e}"
        );
        assert_eq!(e["args"]["ret"], 0);
        assert_eq!(u(&e["args"], "nr"), libc::SYS_nanosleep as u64);
    }
    let syscalls: Vec<&Value> = evs.iter().filter(|e| e["cat"] == "syscall").collect();
    for e in &syscalls {
        assert!(
            f(e, "dur") >= threshold_us as f64,
            "syscall under the threshold: {e}"
        );
    }
    assert!(
        !syscalls.iter().any(|e| e["name"] == "getpid"),
        "a fast getpid was recorded"
    );

    let sched: Vec<&Value> = evs
        .iter()
        .filter(|e| e["cat"] == "sched" && u(e, "pid") == pid)
        .collect();
    let running = sched.iter().filter(|e| e["name"] == "running").count();
    let blocked = sched.iter().filter(|e| e["name"] == "blocked").count();
    eprintln!(
        "observed: {} sched slices for the workload ({running} running, {blocked} blocked), {} events in all",
        sched.len(),
        u(meta, "events")
    );
    assert!(running as u64 >= n, "running slices: {running}");
    assert!(
        blocked as u64 >= n,
        "blocked slices (each nanosleep blocks): {blocked}"
    );
    for e in &sched {
        assert_eq!(u(e, "tid"), sched_base + pid, "sched track of the thread");
        assert_eq!(u(&e["args"], "tid"), pid);
    }
    let tracks = check_tracks(&trace, pid, sched_base);
    assert!(tracks >= 2, "thread and sched tracks: {tracks}");
    assert!(
        evs.iter().any(|e| e["ph"] == "M"
            && e["name"] == "process_name"
            && u(e, "pid") == pid
            && e["args"]["name"] == "ethand-workload"),
        "process_name of the workload"
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name" && u(e, "tid") == pid),
        "thread_name of the workload"
    );
    assert!(
        !evs.iter().any(|e| e["ph"] == "i"),
        "no drop marker without drops"
    );
}

/// 100 launches, 3 host-to-device copies of 4 KiB and 5 stream syncs (3 ms each) through the
/// stand-in libcuda: exactly those GPU events, copies with their bytes, syncs at least as
/// long as the stand-in sleeps.
#[test]
fn record_gpu_calls() {
    let _serial = serial();
    let s = standins::shared();
    let sync_us = 3000u64;
    let mut drv = Driver::spawn(
        s.command(
            &[Lib::Cuda],
            &[
                "wait_stdin",
                "launches 100",
                "htod 4K x 3",
                "sync stream 5",
                "wait_stdin",
            ],
        )
        .env(SYNC_ENV, sync_us.to_string()),
    );
    drv.wait_for("waiting");
    let out = temp_path("record-gpu", "json");
    let rec = Recorder::start(drv.pid, "3s", &out, 1000);
    drv.resume();
    drv.wait_for("waiting");
    let stdout = rec.finish();
    let pid = drv.pid as u64;
    let truth = drv.finish();
    eprintln!("observed: ethand record: {}", stdout.trim());
    let trace = load(&out);
    let meta = &trace["metadata"];
    assert_eq!(u(meta, "dropped"), 0, "drops: {meta}");
    let libs = meta["gpu_libraries"].as_array().expect("gpu_libraries");
    assert_eq!(libs.len(), 1, "one library file attached: {libs:?}");
    let gpu: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["cat"] == "gpu" && u(e, "pid") == pid)
        .collect();
    let by_cat =
        |c: &str| -> Vec<&&Value> { gpu.iter().filter(|e| e["args"]["category"] == c).collect() };
    let launches = by_cat("launch");
    let syncs = by_cat("sync");
    let sync_durs: Vec<f64> = syncs.iter().map(|e| f(e, "dur")).collect();
    eprintln!(
        "observed: {} GPU events: {} launches, {} syncs (durations us {sync_durs:?}); truth launches {}",
        gpu.len(),
        launches.len(),
        syncs.len(),
        truth.total("cuLaunchKernel").calls
    );
    assert_eq!(launches.len(), 100, "launch events");
    assert_eq!(syncs.len(), 5, "sync events");
    let copies = by_cat("copy");
    assert_eq!(copies.len(), 3, "copy events: {copies:?}");
    for e in &copies {
        assert_eq!(u(&e["args"], "bytes"), 4096, "copy bytes: {e}");
    }
    assert_eq!(gpu.len(), 108, "no other GPU events: {gpu:?}");
    for e in &syncs {
        assert!(
            f(e, "dur") >= sync_us as f64,
            "sync shorter than the stand-in's sleep: {e}"
        );
        assert_eq!(e["ph"], "X");
        assert_eq!(e["args"]["library"], "libcuda");
    }
    check_tracks(&trace, pid, u(meta, "sched_tid_base"));
}

/// An unwritable output fails clearly (exit 1) before recording, leaving no file behind.
#[test]
fn record_unwritable_output_fails() {
    let _serial = serial();
    let out = ethand_tests::ethand(&[
        "record",
        "--pid",
        &std::process::id().to_string(),
        "--duration",
        "1s",
        "-o",
        "/nonexistent-dir/trace.json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("/nonexistent-dir/trace.json"), "stderr: {err}");
}
