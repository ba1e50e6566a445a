//! `ethand record`: the Chrome JSON trace of a process tree against workloads of known
//! ground truth: exactly N slow nanosleeps (and fast getpids below the threshold), scheduler
//! slices that never overlap on one thread, exact GPU call counts through the stand-ins, no
//! drops, per-thread timestamps in order; the exact bytes of O_DIRECT block requests; a
//! million events in bounded memory (the trace is
//! streamed to disk while recording); a full disk fails clearly and leaves no file; CPU
//! samples of a program with a known 70/30 split between two functions; Python samples of a
//! script with known shares of its time in three lines.
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
    RemoveOnDrop, disk_of, ethand_bin, serial,
    standins::{self, COLL_ENV, Driver, Lib, SYNC_ENV},
    temp_path, text,
};
use serde_json::Value;

use crate::workload;

/// `ethand record` running in the background; its stderr is watched for the line that says
/// the programs are attached.
pub(crate) struct Recorder {
    child: Child,
    stderr: mpsc::Receiver<String>,
    log: Vec<String>,
    /// Waited for with wait4 (the Child knows nothing of it).
    reaped: bool,
}

impl Recorder {
    fn start(pid: u32, duration: &str, out: &std::path::Path, threshold_us: u64) -> Self {
        Self::start_with(pid, duration, out, threshold_us, &[])
    }

    pub(crate) fn start_with(
        pid: u32,
        duration: &str,
        out: &std::path::Path,
        threshold_us: u64,
        extra: &[&str],
    ) -> Self {
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
            .args(extra)
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
            reaped: false,
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

    /// Waits for a line of its stderr holding `text`; returns it.
    fn wait_for(&mut self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.log.iter().find(|l| l.contains(text)) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) => self.log.push(l),
                Err(e) => panic!(
                    "ethand record never said {text:?} ({e}); stderr:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Its peak resident set size so far (VmHWM, kB).
    fn hwm_kb(&self) -> u64 {
        vm_hwm_kb(self.child.id()).expect("recorder's VmHWM in /proc")
    }

    /// Stops it with SIGINT and waits for it to write the trace: (exit status, stdout,
    /// stderr, peak RSS in kB over its whole life). The peak is its VmHWM, read every 5 ms
    /// until it exits, not wait4's ru_maxrss: a child spawned with vfork semantics (Rust's
    /// posix_spawn) starts from this test process's memory, so its ru_maxrss is at least
    /// this process's own peak, whatever the recorder used.
    pub(crate) fn interrupt(self) -> (i32, String, String, u64) {
        self.signal(libc::SIGINT)
    }

    /// As [`Recorder::interrupt`], with any signal (SIGTERM: systemd, kill, a scheduler).
    fn signal(mut self, sig: libc::c_int) -> (i32, String, String, u64) {
        let pid = self.child.id() as libc::pid_t;
        let mut peak_kb = vm_hwm_kb(self.child.id()).unwrap_or(0);
        // SAFETY: our own child, not yet waited for.
        unsafe { libc::kill(pid, sig) };
        let t0 = Instant::now();
        let status = loop {
            // Gone once it has exited (a zombie has no memory).
            if let Some(kb) = vm_hwm_kb(self.child.id()) {
                peak_kb = peak_kb.max(kb);
            }
            let mut status = 0;
            // SAFETY: our own child, not yet waited for.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
            if r > 0 {
                self.reaped = true;
                break status;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "ethand record still writing 120 s after SIGINT"
            );
            thread::sleep(Duration::from_millis(5));
        };
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.log.push(l);
        }
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            use std::io::Read as _;
            let _ = o.read_to_string(&mut out);
        }
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        };
        (code, out, self.log.join("\n"), peak_kb)
    }

    /// Waits for the end; returns stdout. Panics on failure.
    pub(crate) fn finish(mut self) -> String {
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
        if !self.reaped && self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn load(path: &std::path::Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let _ = fs::remove_file(path);
    serde_json::from_str(&text).expect("the trace is JSON")
}

pub(crate) fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents array")
}

pub(crate) fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

pub(crate) fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Scheduler tracks: slices in start order in the file (the kernel emits them as they end,
/// one after the other) and never overlapping. Thread tracks (syscalls, GPU/NPU calls):
/// properly nested once sorted by start (events are written as they end, so a runtime call
/// comes after the syscalls it made). Returns the number of tracks checked.
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
    for (tid, evs) in &mut tracks {
        if *tid >= sched_base {
            for w in evs.windows(2) {
                assert!(
                    w[1].0 >= w[0].0,
                    "sched track {tid}: timestamps not monotonic: {:?} then {:?}",
                    w[0],
                    w[1]
                );
                // 1 ns of slack for the float rounding of fractional microseconds.
                assert!(
                    w[0].0 + w[0].1 <= w[1].0 + 0.001,
                    "sched track {tid}: slices overlap: {:?} then {:?}",
                    w[0],
                    w[1]
                );
            }
        } else {
            evs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
            // Ends of the enclosing calls.
            let mut open: Vec<f64> = Vec::new();
            for e in evs.iter() {
                while open.last().is_some_and(|end| *end <= e.0 + 0.001) {
                    open.pop();
                }
                if let Some(end) = open.last() {
                    assert!(
                        e.0 + e.1 <= end + 0.001,
                        "track {tid}: {e:?} overlaps its enclosing call (ends at {end})"
                    );
                }
                open.push(e.0 + e.1);
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

/// 8 MiB written and read back with O_DIRECT (1 MiB per syscall, into a file written before
/// recording starts): the workload's recorded block requests carry exactly 8 MiB of writes
/// and 8 MiB of reads, every one on the file's disk, each begun and ended once.
#[test]
fn record_block_requests_carry_the_exact_bytes() {
    let _serial = serial();
    let dir = std::path::Path::new("/var/tmp");
    let dev = disk_of(dir);
    let file = dir.join(format!(
        "ethand-test-record-blockio-{}.dat",
        std::process::id()
    ));
    let _cleanup = RemoveOnDrop(file.clone());
    let mib = 8u64;
    let total = mib << 20;
    let mut w = workload(&["blockio", file.to_str().expect("utf-8"), &mib.to_string()]);
    let out = temp_path("record-block", "json");
    // Ended once the workload is done, not after a fixed time: on a busy disk its 16 MiB of
    // O_DIRECT IO has taken longer than a short recording (5 of 8 writes recorded, in CI).
    let rec = Recorder::start(w.pid, "600s", &out, 1_000_000);
    let done = w.go();
    assert_eq!(
        (done.u64("written"), done.u64("read")),
        (total, total),
        "workload's own IO"
    );
    // The last drains (every 20 ms).
    thread::sleep(Duration::from_millis(300));
    let (code, stdout, stderr, _) = rec.interrupt();
    assert_eq!(code, 0, "ethand record failed; stderr:\n{stderr}");
    let pid = w.pid as u64;
    w.finish();
    eprintln!("observed: ethand record: {}", stdout.trim());
    let trace = load(&out);
    let meta = &trace["metadata"];
    assert_eq!(u(meta, "dropped"), 0, "drops: {meta}");
    assert_eq!(
        u(meta, "dropped_inflight_table_full"),
        0,
        "in-flight table full: {meta}"
    );
    assert_eq!(meta["warnings"], serde_json::json!([]), "warnings: {meta}");
    let evs = events(&trace);
    let begins: Vec<&Value> = evs
        .iter()
        .filter(|e| e["cat"] == "block" && e["ph"] == "b" && u(e, "pid") == pid)
        .collect();
    let ends = evs
        .iter()
        .filter(|e| e["cat"] == "block" && e["ph"] == "e" && u(e, "pid") == pid)
        .count();
    let bytes = |name: &str| -> (usize, u64) {
        let of: Vec<&&Value> = begins.iter().filter(|e| e["name"] == name).collect();
        (of.len(), of.iter().map(|e| u(&e["args"], "bytes")).sum())
    };
    let (wn, wb) = bytes("block write");
    let (rn, rb) = bytes("block read");
    let set = |k: &str| -> std::collections::BTreeSet<String> {
        begins.iter().map(|e| e["args"][k].to_string()).collect()
    };
    eprintln!(
        "observed: {} block requests of the workload on {:?} (rwbs {:?}): {wn} writes ({wb} bytes), {rn} reads ({rb} bytes), {ends} ends",
        begins.len(),
        set("dev"),
        set("rwbs")
    );
    assert_eq!(wb, total, "recorded write bytes");
    assert_eq!(rb, total, "recorded read bytes");
    assert!(
        wn as u64 >= mib && rn as u64 >= mib,
        "at least one request per MiB"
    );
    assert_eq!(ends, begins.len(), "every block slice ends");
    for e in &begins {
        assert_eq!(e["args"]["dev"], dev.as_str(), "device of {e}");
        assert!(f(&e["args"], "dur_us") >= 0.0, "{e}");
    }
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

/// `recorded N events (D dropped) to FILE`.
fn recorded_line(stdout: &str) -> (u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("recorded "))
        .unwrap_or_else(|| panic!("no `recorded` line: {stdout}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    (
        w[1].parse().expect("N events"),
        w[3].trim_start_matches('(').parse().expect("D dropped"),
    )
}

/// VmHWM (kB) of process `pid`; None once it has exited.
fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One million getpids, every syscall recorded (threshold 0): the recorder's peak RSS
/// stays under 100 MB (it was ~3.5 KB per event, 3.5 GB, when it kept every event until the
/// end), the trace holds exactly the getpids that were not counted as dropped, and it is
/// valid JSON (checked line by line: one trace event per line; a whole-document parse would
/// take gigabytes here).
#[test]
fn record_a_million_events_in_bounded_memory() {
    let _serial = serial();
    let n = 1_000_000u64;
    let mut w = workload(&["slow-syscalls", "0", "0", &n.to_string()]);
    let out = temp_path("record-bounded", "json");
    let rec = Recorder::start(w.pid, "600s", &out, 0);
    let t0 = Instant::now();
    let done = w.go();
    assert_eq!(done.u64("getpid"), n);
    let took = t0.elapsed();
    // The last drains (every 20 ms).
    thread::sleep(Duration::from_millis(300));
    let hwm_kb = rec.hwm_kb();
    let pid = w.pid as u64;
    let (code, stdout, stderr, peak_kb) = rec.interrupt();
    w.finish();
    assert_eq!(code, 0, "ethand record failed; stderr:\n{stderr}");
    let (events, dropped) = recorded_line(&stdout);
    eprintln!(
        "observed: {n} getpids in {took:?}; ethand record: {}; VmHWM before SIGINT {} MiB, \
         until exit {} MiB (this test process's own VmHWM, which wait4's ru_maxrss of the \
         recorder would include: {} MiB)",
        stdout.trim(),
        hwm_kb / 1024,
        peak_kb / 1024,
        vm_hwm_kb(std::process::id()).unwrap_or(0) / 1024
    );
    assert!(
        peak_kb < 100 * 1024,
        "peak RSS {peak_kb} kB (VmHWM) for {events} events: not bounded"
    );

    let text = fs::read_to_string(&out).unwrap_or_else(|e| panic!("read {}: {e}", out.display()));
    let _ = fs::remove_file(&out);
    assert!(
        !std::path::Path::new(&format!("{}.tmp", out.display())).exists(),
        "FILE.tmp left"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"{\"traceEvents\":["), "opening");
    let last = lines.last().expect("lines");
    let tail: Value = serde_json::from_str(&format!("{{\"traceEvents\":[{last}"))
        .unwrap_or_else(|e| panic!("closing line {last}: {e}"));
    let meta = &tail["metadata"];
    assert_eq!(u(meta, "events"), events, "metadata.events");
    assert_eq!(u(meta, "dropped"), dropped, "metadata.dropped");
    let mut getpids = 0u64;
    let mut total = 0u64;
    for (i, l) in lines[1..lines.len() - 1].iter().enumerate() {
        let is_last = i == lines.len() - 3;
        let body = if is_last {
            l
        } else {
            l.strip_suffix(',')
                .unwrap_or_else(|| panic!("line {}: no comma: {l}", i + 2))
        };
        let e: Value =
            serde_json::from_str(body).unwrap_or_else(|err| panic!("line {}: {err}: {l}", i + 2));
        // A recorded event is one complete event, one async begin or one CPU sample.
        if e["ph"] == "X" || e["ph"] == "b" || e["cat"] == "cpu_sample" {
            total += 1;
        }
        if e["cat"] == "syscall" && u(&e, "pid") == pid && e["name"] == "getpid" {
            assert_eq!(u(&e["args"], "nr"), libc::SYS_getpid as u64);
            getpids += 1;
        }
    }
    eprintln!("observed: {getpids} getpid events, {total} events in the trace");
    assert_eq!(total, events, "events in the trace vs the recorded line");
    assert!(getpids <= n, "{getpids} getpid events for {n} calls");
    assert!(
        n - getpids <= dropped,
        "{} getpids missing but {dropped} counted as dropped",
        n - getpids
    );
    if dropped == 0 {
        assert_eq!(getpids, n, "no drops: every getpid");
    }
}

/// A disk that fills up while recording: exit 1, the error names the file and how many
/// events were written, and neither FILE nor FILE.tmp is left.
#[test]
fn record_full_disk_fails_clearly() {
    let _serial = serial();
    let dir = temp_path("record-full", "d");
    fs::create_dir_all(&dir).expect("mkdir");
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "ethand-test",
            dir.to_str().expect("utf-8"),
        ])
        .status()
        .expect("mount");
    assert!(st.success(), "mount tmpfs on {}", dir.display());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = fs::remove_dir(&self.0);
        }
    }
    let _unmount = Unmount(dir.clone());
    let out = dir.join("trace.json");
    let mut w = workload(&["slow-syscalls", "0", "0", "200000"]);
    let rec = Recorder::start(w.pid, "600s", &out, 0);
    w.go();
    thread::sleep(Duration::from_millis(300));
    let (code, stdout, stderr, _) = rec.interrupt();
    w.finish();
    eprintln!("observed: exit {code}; stdout {stdout:?}; stderr:\n{stderr}");
    assert_eq!(code, 1, "exit status; stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("{}/.trace.json.", dir.display())),
        "names the file: {stderr}"
    );
    assert!(
        stderr.contains("No space left on device"),
        "says why: {stderr}"
    );
    assert!(stderr.contains("events written"), "says how many: {stderr}");
    assert!(!out.exists(), "FILE left");
    let left: Vec<_> = fs::read_dir(&dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "partial files left: {left:?}");
}

/// SIGTERM (systemd, kill, a batch scheduler ending a job) stops the recording like Ctrl-C
/// and keeps a complete trace; it used to leave an empty file and no trace.
#[test]
fn record_keeps_its_trace_on_sigterm() {
    let _serial = serial();
    let out = temp_path("record-term", "json");
    let _rm = RemoveOnDrop(out.clone());
    let mut w = workload(&["slow-syscalls", "50", "2000", "0"]);
    let rec = Recorder::start(w.pid, "600s", &out, 100);
    w.go();
    thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let (code, stdout, stderr, _) = rec.signal(libc::SIGTERM);
    let took = t0.elapsed();
    w.finish();
    eprintln!("observed: SIGTERM: exit {code} in {took:?}; stdout {stdout:?}");
    assert_eq!(code, 0, "stderr:\n{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let trace = load(&out);
    let meta = &trace["metadata"];
    assert_eq!(meta["ended"], "interrupted", "{meta}");
    assert!(!events(&trace).is_empty(), "an empty trace");
}

/// A recording ends once every process of its tree has exited, whatever --duration says.
#[test]
fn record_ends_when_its_tree_has_exited() {
    let _serial = serial();
    let out = temp_path("record-exit", "json");
    let _rm = RemoveOnDrop(out.clone());
    let w = workload(&["cpu", "100"]);
    let rec = Recorder::start(w.pid, "1h", &out, 100);
    let t0 = Instant::now();
    // Killed: its only process is gone.
    drop(w);
    let stdout = rec.finish();
    let took = t0.elapsed();
    eprintln!("observed: tree exited, recording ended after {took:?}: {stdout:?}");
    assert!(took < Duration::from_secs(5), "recorded on for {took:?}");
    assert_eq!(load(&out)["metadata"]["ended"], "tree_exited");
}

/// Durations beyond an hour (up to u64::MAX seconds, which used to panic) are refused at
/// once, exit 2, naming the limit.
#[test]
fn record_refuses_absurd_durations() {
    let _serial = serial();
    let pid = std::process::id().to_string();
    for d in ["18446744073709551615", "2h", "3601s", "1e300", "-5", "0"] {
        let t0 = Instant::now();
        let arg = format!("--duration={d}");
        let out = ethand_tests::ethand(&["record", "--pid", &pid, &arg, "-o", "/tmp/x"]);
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("observed: --duration {d}: {} {err:?}", out.status);
        assert_eq!(out.status.code(), Some(2), "--duration {d}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(err.contains("--duration"), "{err}");
    }
}

/// CPU samples: instants on the main thread's track, about rate x duration of them, named by
/// the innermost frame with the whole stack; the program's 70/30 split between `spin_a` and
/// `spin_b` within a few points (cpu_profile.rs has the program).
#[test]
fn record_cpu_samples_follow_the_program() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-record-samples-{}", std::process::id()));
    let (bin, _) = crate::cpu_profile::build(&dir);
    let child = crate::cpu_profile::start(&bin);
    let pid = child.0.id();
    let out = temp_path("record-samples", "json");
    let _rm = RemoveOnDrop(out.clone());
    let rec = Recorder::start(pid, "4s", &out, 100);
    rec.finish();
    drop(child);
    let trace = load(&out);
    let samples: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["cat"] == "cpu_sample" && u(e, "tid") == u64::from(pid))
        .collect();
    let meta = &trace["metadata"];
    eprintln!(
        "observed: {} main-thread samples; metadata {}",
        samples.len(),
        meta
    );
    assert_eq!(meta["cpu_sample_hz"], 99);
    assert_eq!(meta["cpu_samples_dropped"], 0);
    assert_eq!(meta["cpu_samples_stack_lost"], 0);
    let expect = 99.0 * f(meta, "duration_s");
    let n = samples.len() as f64;
    assert!(
        (n - expect).abs() <= 0.15 * expect,
        "{n} samples, expected ~{expect:.0}"
    );
    let named = |name: &str| samples.iter().filter(|e| e["name"] == name).count() as f64 / n;
    let (a, b) = (named("spin_a"), named("spin_b"));
    assert!((a - 0.70).abs() <= 0.08, "spin_a {a:.3}");
    assert!((b - 0.30).abs() <= 0.08, "spin_b {b:.3}");
    // A sample on spin_a's first two instructions or its `ret` (its frame not yet made or
    // already gone) skips `main`: the frame-pointer walk's known hole, a few instructions in
    // each 0.5 ms call. Such a stack must go straight to main's caller in libc; a few of them
    // are allowed, a walk that loses main often is not.
    let (mut spin_a, mut without_main) = (0, Vec::new());
    for e in &samples {
        assert_eq!(e["ph"], "i");
        assert_eq!(e["s"], "t");
        let stack: Vec<&str> = e["args"]["stack"]
            .as_array()
            .expect("args.stack")
            .iter()
            .map(|v| v.as_str().expect("a frame label"))
            .collect();
        assert_eq!(Some(&e["name"].as_str().unwrap()), stack.first());
        if e["name"] == "spin_a" {
            spin_a += 1;
            if !stack.contains(&"main") {
                assert!(
                    stack.get(1).is_some_and(|f| f.starts_with("libc.so.6")),
                    "{stack:?}"
                );
                without_main.push(stack);
            }
        }
    }
    eprintln!("observed: {spin_a} spin_a samples, without main: {without_main:?}");
    assert!(
        without_main.len() * 50 <= spin_a,
        "{} of {spin_a} spin_a stacks lost main",
        without_main.len()
    );
}

/// Python samples: the script of the stack-sample test (e2e/stacks.rs) spends 25 % of its main
/// thread's time in a sync (the stand-in sleeps), 25 % spinning under `spin_a` and 50 % under
/// `spin_b`. The recording's Python instants must say so, name the lines, and mark the sync
/// idle; a process that is not Python gets none.
#[test]
fn record_python_samples_name_the_lines() {
    use crate::stacks::{SCRIPT, line_of};
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-record-python-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("sync_sites.py");
    fs::write(&script, SCRIPT).expect("script");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(standins::shared().path(Lib::Cuda))
        .env(SYNC_ENV, "10000")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let pid = child.id();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("ready line");
    assert_eq!(ready.trim(), "ready");
    let _kill = ethand_tests::KillOnDrop(child);
    let out = temp_path("record-python", "json");
    let _rm = RemoveOnDrop(out.clone());
    let rec = Recorder::start_with(pid, "4s", &out, 100_000, &["--python-sample-hz", "97"]);
    rec.finish();
    let trace = load(&out);
    let meta = &trace["metadata"];
    let samples: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["cat"] == "python_sample" && u(e, "tid") == u64::from(pid))
        .collect();
    let n = samples.len() as f64;
    eprintln!("observed: {n} main-thread Python samples; metadata {meta}");
    assert_eq!(meta["python_sample_hz"], 97);
    assert_eq!(meta["python_samples_dropped"], 0);
    assert_eq!(meta["python_processes"], serde_json::json!([pid]));
    // One read per tick of the only Python process; a torn read loses its sample.
    let reads = f(meta, "python_reads");
    let expect = 97.0 * f(meta, "duration_s");
    assert!(
        (reads - expect).abs() <= 0.2 * expect,
        "{reads} reads, expected ~{expect:.0}"
    );
    assert!(n >= 0.8 * reads, "{n} samples of {reads} reads");
    let file = script.file_name().unwrap().to_str().unwrap();
    let line = |marker: &str| format!("{file}:{} in", line_of(marker));
    let share =
        |pred: &dyn Fn(&Value) -> bool| samples.iter().filter(|e| pred(e)).count() as f64 / n;
    let stack = |e: &Value| -> Vec<String> {
        e["args"]["stack"]
            .as_array()
            .expect("args.stack")
            .iter()
            .map(|v| v.as_str().expect("a frame label").to_string())
            .collect()
    };
    let through = |marker: &str| {
        let l = line(marker);
        share(&|e| stack(e).iter().any(|f| f.starts_with(&l)))
    };
    let sync = share(&|e| {
        e["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(&line("SYNC_LINE")))
    });
    let (a, b) = (through("A_LINE"), through("B_LINE"));
    eprintln!("shares: sync {sync:.3} spin_a {a:.3} spin_b {b:.3}");
    assert!((sync - 0.25).abs() < 0.08, "sync share {sync}");
    assert!((a - 0.25).abs() < 0.08, "spin_a share {a}");
    assert!((b - 0.50).abs() < 0.08, "spin_b share {b}");
    for e in &samples {
        assert_eq!(e["ph"], "i");
        assert_eq!(e["s"], "t");
        let st = stack(e);
        assert_eq!(Some(&e["name"].as_str().unwrap().to_string()), st.first());
        assert!(
            st.last().is_some_and(|f| f.ends_with("in <module>()")),
            "{st:?}"
        );
    }
    // The sync sleeps (idle); the spin loops run.
    let idle_in_sync = samples
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&line("SYNC_LINE")))
        })
        .filter(|e| e["args"]["active"] == false)
        .count() as f64;
    assert!(
        idle_in_sync >= 0.8 * sync * n,
        "{idle_in_sync} of {} sync samples idle",
        sync * n
    );

    // A program that is not Python: no Python sample, and the metadata says none was read.
    let (bin, _) = crate::cpu_profile::build(&dir);
    let child = crate::cpu_profile::start(&bin);
    let out = temp_path("record-python-none", "json");
    let _rm = RemoveOnDrop(out.clone());
    let rec = Recorder::start(child.0.id(), "1s", &out, 100_000);
    rec.finish();
    drop(child);
    let trace = load(&out);
    assert!(events(&trace).iter().all(|e| e["cat"] != "python_sample"));
    assert_eq!(trace["metadata"]["python_processes"], serde_json::json!([]));
    assert_eq!(trace["metadata"]["python_samples"], 0);
    fs::remove_dir_all(&dir).ok();
}

/// A shell runs 40 short children of a known binary (each burns ~60 ms of CPU in
/// `burn_here`, then exits): their CPU samples must be symbolized although the children are
/// gone long before the recording ends (≥ 90 % of them with a function name).
#[test]
fn record_symbolizes_short_lived_children() {
    use std::io::Write as _;
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-record-children-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("mkdir");
    let src = dir.join("burn.c");
    fs::write(
        &src,
        "#include <time.h>\nvolatile unsigned long sink;\n\
         __attribute__((noinline)) void burn_here(void) {\n\
           struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);\n\
           double end = t.tv_sec + t.tv_nsec * 1e-9 + 0.06, now;\n\
           do { for (int i = 0; i < 20000; i++) sink++; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);\n\
                now = t.tv_sec + t.tv_nsec * 1e-9; } while (now < end);\n\
         }\nint main(void) { burn_here(); return 0; }\n",
    )
    .expect("write the source");
    let bin = dir.join("burn");
    let o = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc: {}", text(&o.stderr));
    let script = format!("read x; for i in $(seq 40); do {}; done", bin.display());
    let mut sh = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh");
    let pid = sh.id();
    let out = temp_path("record-children", "json");
    let _rm = RemoveOnDrop(out.clone());
    let rec = Recorder::start(pid, "60s", &out, 100_000);
    sh.stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("start the loop");
    // Reaped first (a zombie still has its /proc entry); the recording then ends as the
    // tree has exited.
    let _ = sh.wait();
    rec.finish();
    let trace = load(&out);
    let children: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["cat"] == "cpu_sample" && u(e, "pid") != u64::from(pid))
        .collect();
    let named = children
        .iter()
        .filter(|e| {
            let n = e["name"].as_str().unwrap_or("?");
            !n.starts_with('?') && n != "(no stack)"
        })
        .count();
    let burn = children.iter().filter(|e| e["name"] == "burn_here").count();
    let pids: std::collections::BTreeSet<u64> = children.iter().map(|e| u(e, "pid")).collect();
    eprintln!(
        "observed: {} samples of {} children, {named} with a function name, {burn} in burn_here",
        children.len(),
        pids.len()
    );
    // 40 x 60 ms at 99 Hz: ~240 samples; well over half the children sampled.
    assert!(children.len() >= 100, "{} child samples", children.len());
    assert!(pids.len() >= 20, "{} children sampled", pids.len());
    assert!(
        named as f64 >= 0.9 * children.len() as f64,
        "{named} of {} child samples symbolized",
        children.len()
    );
    fs::remove_dir_all(&dir).ok();
}

/// The default output, Perfetto's protobuf, next to JSON from the same recording (`-o` twice):
/// 100 launches, 3 copies of 4 KiB and 5 syncs through the stand-in libcuda, and 20 slow
/// nanosleeps of a second process are in the decoded Perfetto trace exactly (Perfetto's own
/// definitions, import rules checked: tracks and interned names resolve, every sequence in
/// timestamp order, every slice closed), on the thread's track, with the same times as in
/// the JSON, and the file is a small fraction of the JSON's.
#[test]
fn record_perfetto_holds_exactly_the_calls_and_the_json_s_events() {
    let _serial = serial();
    let s = standins::shared();
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
        .env(SYNC_ENV, "3000"),
    );
    drv.wait_for("waiting");
    let pf = temp_path("record-pf", "pftrace");
    let js = temp_path("record-pf", "json");
    let _rm = (RemoveOnDrop(pf.clone()), RemoveOnDrop(js.clone()));
    let rec = Recorder::start_with(drv.pid, "3s", &pf, 1000, &["-o", js.to_str().unwrap()]);
    drv.resume();
    drv.wait_for("waiting");
    let stdout = rec.finish();
    let pid = drv.pid as i32;
    drv.finish();
    eprintln!("observed: ethand record: {}", stdout.trim());
    let bytes = fs::read(&pf).expect("the Perfetto trace");
    let d = ethand_perfetto::decode::decode(&bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
    let gpu: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.category == "gpu" && d.thread_of(e.track).is_some_and(|(p, _)| p == pid))
        .collect();
    let cat = |c: &str| {
        gpu.iter()
            .filter(|e| {
                e.args.iter().any(|(k, v)| {
                    k == "category" && *v == ethand_perfetto::decode::Value::Str(c.into())
                })
            })
            .count()
    };
    let jb = fs::metadata(&js).unwrap().len();
    let json = load(&js);
    let json_gpu = events(&json)
        .iter()
        .filter(|e| e["cat"] == "gpu" && e["pid"].as_i64() == Some(pid.into()))
        .count();
    eprintln!(
        "observed: Perfetto {} bytes ({} packets, {} chunks, {} sequences), JSON {jb} bytes; GPU \
         slices {} (launch {}, copy {}, sync {}), JSON {json_gpu}",
        bytes.len(),
        d.packets,
        d.compressed_chunks,
        d.sequences,
        gpu.len(),
        cat("launch"),
        cat("copy"),
        cat("sync")
    );
    assert_eq!((cat("launch"), cat("copy"), cat("sync")), (100, 3, 5));
    assert_eq!(gpu.len(), 108, "no other GPU events");
    assert_eq!(json_gpu, 108, "the JSON of the same recording");
    for e in gpu
        .iter()
        .filter(|e| e.args.iter().any(|(k, _)| k == "bytes"))
    {
        assert!(
            e.args
                .contains(&("bytes".into(), ethand_perfetto::decode::Value::Uint(4096)))
        );
    }
    // Same start and end as the JSON, to the ns, for every GPU call.
    let t0 = json["metadata"]["start_monotonic_ns"].as_u64().unwrap();
    let mut from_json: Vec<(u64, u64)> = events(&json)
        .iter()
        .filter(|e| e["cat"] == "gpu" && e["pid"].as_i64() == Some(pid.into()))
        .map(|e| {
            let s = (t0 as f64 + f(e, "ts") * 1000.0).round() as u64;
            (s, s + (f(e, "dur") * 1000.0).round() as u64)
        })
        .collect();
    let mut from_pf: Vec<(u64, u64)> = gpu
        .iter()
        .map(|e| (e.start_ns, e.end_ns.expect("a slice")))
        .collect();
    from_json.sort();
    from_pf.sort();
    assert_eq!(from_pf, from_json);
    // Every JSON event is in the Perfetto trace (counted per category).
    let count_pf = |c: &str| d.events.iter().filter(|e| e.category == c).count();
    let count_js = |c: &str| {
        events(&json)
            .iter()
            .filter(|e| e["cat"] == c && e["ph"] != "e")
            .count()
    };
    for c in ["sched", "syscall", "gpu", "cpu_sample"] {
        assert_eq!(count_pf(c), count_js(c), "{c} events");
    }
    assert!(
        bytes.len() as u64 * 4 < jb,
        "Perfetto {} vs JSON {jb} bytes",
        bytes.len()
    );
}

/// `--max-size` ends a recording once the output reaches it, and the trace is complete.
#[test]
fn record_max_size_ends_the_recording_with_a_whole_trace() {
    let _serial = serial();
    let mut w = workload(&["syscalls", "3000000", "0"]);
    let pf = temp_path("record-max", "pftrace");
    let _rm = RemoveOnDrop(pf.clone());
    let rec = Recorder::start_with(w.pid, "60s", &pf, 0, &["--max-size", "256k"]);
    let t0 = Instant::now();
    let _ = w.go();
    let stdout = rec.finish();
    let took = t0.elapsed();
    w.finish();
    let len = fs::metadata(&pf).unwrap().len();
    eprintln!("observed: {} in {took:?}, {len} bytes", stdout.trim());
    assert!(
        took < Duration::from_secs(30),
        "it did not stop at the size: {took:?}"
    );
    assert!(len >= 256 << 10, "{len} bytes");
    let d = ethand_perfetto::decode::decode(&fs::read(&pf).unwrap()).expect("a whole trace");
    let summary = d
        .events
        .iter()
        .find(|e| e.name == "ethand record")
        .expect("the summary");
    assert!(
        summary.args.contains(&(
            "ended".into(),
            ethand_perfetto::decode::Value::Str("max_size".into())
        )),
        "{:?}",
        summary.args
    );
}

/// A million getpid() recorded to the default output, Perfetto: the recorder's memory stays
/// bounded (the reorder window holds at most 200,000 events), every getpid is a slice of the
/// decoded trace or counted as dropped, and the summary's count is the trace's.
#[test]
fn record_a_million_events_to_perfetto_in_bounded_memory() {
    let _serial = serial();
    let n = 1_000_000u64;
    let mut w = workload(&["slow-syscalls", "0", "0", &n.to_string()]);
    let out = temp_path("record-bounded", "pftrace");
    let _rm = RemoveOnDrop(out.clone());
    let rec = Recorder::start(w.pid, "600s", &out, 0);
    let done = w.go();
    assert_eq!(done.u64("getpid"), n);
    thread::sleep(Duration::from_millis(300));
    let (code, stdout, stderr, peak_kb) = rec.interrupt();
    let pid = w.pid as i32;
    w.finish();
    assert_eq!(code, 0, "ethand record failed; stderr:\n{stderr}");
    let (events, dropped) = recorded_line(&stdout);
    let bytes = fs::read(&out).expect("the trace");
    let d = ethand_perfetto::decode::decode(&bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
    let getpids = d
        .events
        .iter()
        .filter(|e| {
            e.category == "syscall"
                && e.name == "getpid"
                && d.thread_of(e.track).is_some_and(|(p, _)| p == pid)
        })
        .count() as u64;
    let total = d.events.iter().filter(|e| e.category != "ethand").count() as u64;
    eprintln!(
        "observed: {}; {} bytes ({:.2} B/event), {} sequences; peak RSS {} MiB; {getpids} getpid \
         slices, {total} events in the trace",
        stdout.trim(),
        bytes.len(),
        bytes.len() as f64 / events.max(1) as f64,
        d.sequences,
        peak_kb / 1024
    );
    assert!(
        peak_kb < 100 * 1024,
        "peak RSS {peak_kb} kB for {events} events"
    );
    assert_eq!(total, events, "events in the trace vs the recorded line");
    assert!(
        getpids <= n && n - getpids <= dropped,
        "{getpids} of {n}, {dropped} dropped"
    );
    if dropped == 0 {
        assert_eq!(getpids, n, "no drops: every getpid");
    }
}

/// `--ring 2s`: a recording left on keeps only its last two seconds. The stand-in libcuda
/// makes 1,000 launches, waits 3 s, then 37 launches and 5 syncs; stopped 0.3 s later, the
/// trace holds exactly the 37 launches and 5 syncs (none of the 1,000), decodes under
/// Perfetto's rules (the read the stand-in was blocked in across the ring's start is begun
/// again at its true start), and the summary accounts for every event: those in the trace
/// plus those the ring dropped, less the slices begun again, are the recorded count. The
/// segments' directory is gone after.
#[test]
fn record_ring_keeps_exactly_the_last_seconds() {
    let _serial = serial();
    let s = standins::shared();
    let mut drv = Driver::spawn(
        s.command(
            &[Lib::Cuda],
            &[
                "wait_stdin",
                "launches 1000",
                "wait_stdin",
                "launches 37",
                "sync stream 5",
                "wait_stdin",
            ],
        )
        .env(SYNC_ENV, "3000"),
    );
    drv.wait_for("waiting");
    let pf = temp_path("record-ring", "pftrace");
    let _rm = RemoveOnDrop(pf.clone());
    let rec = Recorder::start_with(drv.pid, "60s", &pf, 1000, &["--ring", "2s"]);
    drv.resume();
    drv.wait_for("waiting");
    thread::sleep(Duration::from_secs(3));
    drv.resume();
    drv.wait_for("waiting");
    thread::sleep(Duration::from_millis(300));
    let (code, stdout, stderr, _) = rec.interrupt();
    let pid = drv.pid as i32;
    drv.finish();
    assert_eq!(code, 0, "ethand record failed; stderr:\n{stderr}");
    eprintln!("observed: {}", stdout.trim());
    let (events, dropped) = recorded_line(&stdout);
    assert_eq!(dropped, 0);
    let bytes = fs::read(&pf).expect("the trace");
    let d = ethand_perfetto::decode::decode(&bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
    let of_pid =
        |e: &&ethand_perfetto::decode::Event| d.thread_of(e.track).is_some_and(|(p, _)| p == pid);
    let cat = |c: &str| {
        d.events
            .iter()
            .filter(of_pid)
            .filter(|e| {
                e.category == "gpu"
                    && e.args.iter().any(|(k, v)| {
                        k == "category" && *v == ethand_perfetto::decode::Value::Str(c.into())
                    })
            })
            .count()
    };
    assert_eq!(
        (cat("launch"), cat("sync")),
        (37, 5),
        "only the last phase's calls"
    );
    let summary = d
        .events
        .iter()
        .find(|e| e.name == "ethand record")
        .expect("the summary");
    let arg = |k: &str| {
        summary
            .args
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| match v {
                ethand_perfetto::decode::Value::Uint(u) => *u,
                other => panic!("{k}: {other:?}"),
            })
    };
    let ring_dropped = arg("ring_events_dropped").expect("ring_events_dropped");
    let again = arg("ring_slices_begun_again").expect("ring_slices_begun_again");
    let from = arg("ring_kept_from_monotonic_ns").expect("ring_kept_from_monotonic_ns");
    let in_trace = d.events.iter().filter(|e| e.category != "ethand").count() as u64;
    eprintln!(
        "observed: {in_trace} events in the trace, {ring_dropped} dropped by the ring, {again} \
         slices begun again, {} segments dropped, {} bytes",
        arg("ring_segments_dropped").unwrap_or(0),
        bytes.len()
    );
    assert!(
        ring_dropped >= 1000,
        "the first phase's launches: {ring_dropped}"
    );
    assert_eq!(
        in_trace + ring_dropped - again,
        events,
        "every event accounted for"
    );
    assert!(again >= 1, "the blocked read spans the ring's start");
    for e in d.events.iter().filter(|e| e.category != "ethand") {
        assert!(
            e.start_ns >= from || e.end_ns.is_some_and(|x| x >= from),
            "before the kept range and not open in it: {e:?}"
        );
    }
    // No segment or directory left beside the trace.
    let prefix = format!(".{}.", pf.file_name().unwrap().to_str().unwrap());
    let left: Vec<_> = fs::read_dir(pf.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `--ring` keeps Perfetto segments: a JSON output is refused before anything is recorded.
#[test]
fn record_ring_refuses_json() {
    let _serial = serial();
    let pid = std::process::id().to_string();
    let out = ethand_tests::ethand(&["record", "--pid", &pid, "--ring", "5s", "-o", "/tmp/x.json"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--ring") && err.contains(".pftrace"), "{err}");
}

/// Issue 41: each recorded GPU call carries the Python frames of its calling thread, walked
/// in the kernel at the call. The program of the pyframes test (3,000 syncs from `f()`, 1,000
/// from `g()`, one 61 frames deep, then 50 on native threads) is recorded to both formats:
/// exactly 3,000 and 1,000 calls carry `f`'s and `g`'s lines, in each, and the native
/// threads' 50 carry none.
#[test]
fn record_gpu_calls_carry_their_python_frames() {
    use crate::pyframes::{Prompted, SCRIPT, line_of};
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-record-pyframes-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("lines.py");
    fs::write(&script, SCRIPT).expect("script");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg(standins::shared().path(Lib::Cuda))
        .arg("50");
    let mut py = Prompted::start(cmd);
    let pid = py.pid();
    let js = temp_path("record-pyframes", "json");
    let pf = temp_path("record-pyframes", "pftrace");
    let _rm = (RemoveOnDrop(js.clone()), RemoveOnDrop(pf.clone()));
    let mut rec = Recorder::start_with(pid, "60s", &js, 1_000_000, &["-o", pf.to_str().unwrap()]);
    let said = rec.wait_for(
        "Python frames of its GPU calls are",
        Duration::from_secs(30),
    );
    assert!(said.contains("are walked (CPython 3."), "{said}");
    py.go();
    // The last stacks' code objects are read at the drains that follow (every 20 ms).
    thread::sleep(Duration::from_millis(500));
    py.exit();
    let stdout = rec.finish();
    eprintln!("observed: ethand record: {}", stdout.trim());
    let label =
        |marker: &str, function: &str| format!("lines.py:{} in {function}()", line_of(marker));
    let (f_line, g_line, deep_line) = (
        label("F_LINE", "f"),
        label("G_LINE", "g"),
        label("DEEP_LINE", "deeper"),
    );
    // JSON: the frames as an array.
    let trace = load(&js);
    let syncs: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| {
            e["cat"] == "gpu" && e["name"] == "cuStreamSynchronize" && u(e, "pid") == u64::from(pid)
        })
        .collect();
    let python = |e: &Value| -> Vec<String> {
        e["args"]["python"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().expect("a label").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let innermost = |l: &str| {
        syncs
            .iter()
            .filter(|e| python(e).first().map(String::as_str) == Some(l))
            .count()
    };
    let native = syncs
        .iter()
        .filter(|e| u(e, "tid") != u64::from(pid))
        .collect::<Vec<_>>();
    let meta = &trace["metadata"];
    eprintln!(
        "observed: JSON syncs {} (f {}, g {}, deep {}, native threads {}); walks {}; with frames {}, partly read {}",
        syncs.len(),
        innermost(&f_line),
        innermost(&g_line),
        innermost(&deep_line),
        native.len(),
        meta["python_walks"],
        meta["gpu_calls_with_python_frames"],
        meta["gpu_calls_with_python_frames_partly_read"]
    );
    assert_eq!(
        (
            innermost(&f_line),
            innermost(&g_line),
            innermost(&deep_line)
        ),
        (3000, 1000, 1)
    );
    let deep = syncs
        .iter()
        .find(|e| python(e).first() == Some(&deep_line))
        .expect("the deep call");
    assert_eq!(python(deep).len(), 32, "the walk keeps 32 frames");
    let f_call = syncs
        .iter()
        .find(|e| python(e).first() == Some(&f_line))
        .expect("f's call");
    assert_eq!(
        python(f_call).last().map(String::as_str),
        Some(label("FOR_F", "<module>").as_str())
    );
    assert_eq!(native.len(), 50, "calls on native threads");
    assert!(
        native.iter().all(|e| python(e).is_empty()),
        "native threads have no Python frames"
    );
    assert_eq!(meta["gpu_calls_with_python_frames_partly_read"], 0);
    assert!(
        meta["python_walks"][pid.to_string()]
            .as_str()
            .is_some_and(|w| w.contains("walked"))
    );
    // Perfetto: the frames as one string, innermost first, the same counts.
    let bytes = fs::read(&pf).expect("the Perfetto trace");
    let d = ethand_perfetto::decode::decode(&bytes).unwrap_or_else(|e| panic!("import rules: {e}"));
    let first_frame = |e: &ethand_perfetto::decode::Event| {
        e.args.iter().find_map(|(k, v)| match v {
            ethand_perfetto::decode::Value::Str(s) if k == "python" => {
                s.lines().next().map(str::to_string)
            }
            _ => None,
        })
    };
    let pf_syncs: Vec<_> = d
        .events
        .iter()
        .filter(|e| {
            e.category == "gpu"
                && e.name == "cuStreamSynchronize"
                && d.thread_of(e.track).is_some_and(|(p, _)| p == pid as i32)
        })
        .collect();
    let pf_count = |l: &str| {
        pf_syncs
            .iter()
            .filter(|e| first_frame(e).as_deref() == Some(l))
            .count()
    };
    assert_eq!(
        (pf_count(&f_line), pf_count(&g_line), pf_count(&deep_line)),
        (3000, 1000, 1)
    );
    assert_eq!(
        pf_syncs.len(),
        syncs.len(),
        "the same calls in both outputs"
    );
    fs::remove_dir_all(&dir).ok();
}

/// A GPU call longer than the recording's clean-ups of Python stacks (every 1.2 s) keeps its
/// frames: the stack is stored at the call's entry and the event comes at its return, 2.5 s
/// later (the stand-in `ncclAllReduce` blocks for `ETHAND_STANDIN_COLL_US`).
#[test]
fn record_a_long_gpu_call_keeps_its_python_frames() {
    const SCRIPT: &str = "import ctypes, sys\n\
nccl = ctypes.CDLL(sys.argv[1])\n\
def slow():\n    nccl.ncclAllReduce(None, None, 1, 7, 0, None, None)  # SLOW_LINE\n\
print('ready', flush=True)\n\
sys.stdin.readline()\n\
slow()\n\
print('done', flush=True)\n\
sys.stdin.readline()\n";
    use crate::pyframes::Prompted;
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("ethand-record-slow-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("slow.py");
    fs::write(&script, SCRIPT).expect("script");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .arg(standins::shared().path(Lib::Nccl))
        .env(COLL_ENV, "2500000");
    let mut py = Prompted::start(cmd);
    let pid = py.pid();
    let js = temp_path("record-slow", "json");
    let _rm = RemoveOnDrop(js.clone());
    let mut rec = Recorder::start(pid, "60s", &js, 1_000_000);
    let said = rec.wait_for(
        "Python frames of its GPU calls are",
        Duration::from_secs(30),
    );
    assert!(said.contains("are walked (CPython 3."), "{said}");
    py.go();
    py.exit();
    rec.finish();
    let slow_line = SCRIPT
        .lines()
        .position(|l| l.contains("SLOW_LINE"))
        .expect("marker")
        + 1;
    let trace = load(&js);
    let calls: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| {
            e["cat"] == "gpu" && e["name"] == "ncclAllReduce" && u(e, "pid") == u64::from(pid)
        })
        .collect();
    eprintln!("observed: {calls:?}");
    assert_eq!(calls.len(), 1, "one collective");
    let c = calls[0];
    assert!(f(c, "dur") >= 2_500_000.0, "it blocked 2.5 s: {c}");
    assert_eq!(
        c["args"]["python"][0].as_str(),
        Some(format!("slow.py:{slow_line} in slow()").as_str()),
        "{c}"
    );
    fs::remove_dir_all(&dir).ok();
}
