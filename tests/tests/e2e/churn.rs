//! Churn and load: 10,000 short-lived processes per second for a minute next to a long-lived
//! process whose syscalls are known exactly; pid reuse; 100 concurrent scrapes and API
//! requests. The daemon runs with its default limits (max_processes, grace, map sizes).
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{
    Daemon, SETTLE, SelfStatus, Workload, ethand, find_proc, http_get, metric, peak_rss_bytes,
    rss_bytes, serial, syscall, text,
};

/// The load workload of this crate (ethand-load).
fn load(args: &[&str]) -> Workload {
    Workload::start(env!("CARGO_BIN_EXE_ethand-load"), args)
}

/// Short-lived processes per second the churn must reach (averaged over the run).
const CHURN_RATE: u64 = 10_000;
const CHURN_SECONDS: u64 = 60;
/// The daemon's collection interval under churn: the default.
const CHURN_INTERVAL_MS: u64 = 1000;
/// The daemon's memory limit under churn.
const RSS_LIMIT: u64 = 50 << 20;

/// One sample of the daemon's state, taken every second while the churn runs.
#[derive(Clone, Debug)]
struct Sample {
    t: Duration,
    rss: u64,
    maps: BTreeMap<String, (u64, u64)>,
    lost: u64,
    overflow: u64,
    tracked: u64,
}

/// `ethand status --json` of the daemon at `socket` (pid `pid`) and its RSS.
fn sample(socket: &str, pid: u32, t0: Instant) -> Sample {
    let out = ethand(&["status", "--json", "--socket", socket]);
    assert!(out.status.success(), "ethand status: {}", text(&out.stderr));
    let st: SelfStatus = serde_json::from_slice(&out.stdout).expect("status JSON");
    Sample {
        t: t0.elapsed(),
        // Read directly rather than from the status: it must not lag a round.
        rss: rss_bytes(pid),
        maps: st
            .maps
            .iter()
            .map(|m| (m.name.clone(), (m.entries, m.capacity)))
            .collect(),
        lost: st.dropped.iter().filter(|x| x.loss).map(|x| x.count).sum(),
        overflow: st.processes_overflow,
        tracked: st.tracked_processes,
    }
}

/// 10,000 processes per second (fork children that exit at once, from two forkers) for a
/// minute, while a long-lived process makes exactly N getpid() spread over the minute and
/// pauses five times. At each pause, and at the end, ethand's getpid count of it equals what
/// it made so far; the daemon's RSS, sampled every second, stays under 50 MB and does not
/// grow in the last 30 s; the kernel maps never fill and are back to their idle occupancy
/// once the churn stops; every loss is counted in `ethand status` and /metrics alike.
#[test]
fn churn_10k_processes_per_second_for_a_minute() {
    let _serial = serial();
    // The default interval too: a round then ingests a whole second of births, the most
    // memory the daemon holds at once.
    let d = Daemon::start(
        "churn",
        &format!("[daemon]\ninterval_ms = {CHURN_INTERVAL_MS}\n"),
    );
    let settle = Duration::from_millis(4 * CHURN_INTERVAL_MS);
    thread::sleep(settle);
    let sock = d.socket.to_str().expect("utf-8 path").to_string();
    let t0 = Instant::now();
    let idle = sample(&sock, d.pid(), t0);
    let n: u64 = 1_000_000;
    // 40 s of calls plus five pauses of `settle`: all of it inside the churn.
    let mut calls = load(&["getpid-spread", &n.to_string(), "40", "5"]);
    let mut churn = load(&[
        "churn",
        // Paced 2 % above the target: the pacer's start-up and last partial second must not
        // leave the average a hair under it.
        &(CHURN_RATE * 102 / 100).to_string(),
        &CHURN_SECONDS.to_string(),
        // Four forkers: on a small shared machine they get their share of the CPUs.
        "4",
        "vfork",
    ]);
    thread::sleep(settle);
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let sampler = {
        let (samples, stop) = (Arc::clone(&samples), Arc::clone(&stop));
        let (sock, pid) = (sock.clone(), d.pid());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = sample(&sock, pid, t0);
                samples.lock().unwrap().push(s);
                let next = Duration::from_secs(t0.elapsed().as_secs() + 1);
                thread::sleep(next.saturating_sub(t0.elapsed()));
            }
        })
    };
    churn.send_byte();
    calls.send_byte();
    let mut checks = Vec::new();
    for _ in 0..5 {
        let made = calls.expect("at").u64("made");
        thread::sleep(settle);
        let seen = syscall(
            find_proc(&d.snapshot(calls.pid), calls.pid),
            libc::SYS_getpid,
        )
        .0;
        eprintln!(
            "  {:>5.1}s: getpid made {made}, ethand {seen}",
            t0.elapsed().as_secs_f64()
        );
        checks.push((made, seen));
        calls.send_byte();
    }
    let done = calls.expect("done");
    let churned = churn.expect("done");
    thread::sleep(settle);
    let seen = syscall(
        find_proc(&d.snapshot(calls.pid), calls.pid),
        libc::SYS_getpid,
    )
    .0;
    checks.push((done.u64("getpid"), seen));
    // The maps once the churn is over (exits ingested, entries freed).
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let after = sample(&sock, d.pid(), t0);
    let body = d.metrics();
    let st = d.status();

    let spawned = churned.u64("spawned");
    let secs = churned.u64("forker_ns") as f64 / 1e9;
    let rate = spawned as f64 / secs;
    let samples = samples.lock().unwrap().clone();
    let rss_max = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let map_max = |name: &str| {
        samples
            .iter()
            .map(|s| s.maps.get(name).map_or(0, |m| m.0))
            .max()
            .unwrap_or(0)
    };
    let cap = |name: &str| idle.maps.get(name).map_or(0, |m| m.1);
    eprintln!(
        "observed: {spawned} processes in {secs:.1} s = {rate:.0}/s ({} fork failures)",
        churned.u64("failed")
    );
    // Every fifth second only: CI shows a bounded part of a failing test's output, and the
    // assertion message must stay in it.
    for s in samples.iter().step_by(5) {
        eprintln!(
            "  {:>5.1}s rss {:>6} KiB tracked {:>5} overflow {:>6} lost {:>7} threads {:>6} syscalls {:>6}",
            s.t.as_secs_f64(),
            s.rss / 1024,
            s.tracked,
            s.overflow,
            s.lost,
            s.maps.get("threads").map_or(0, |m| m.0),
            s.maps.get("syscalls").map_or(0, |m| m.0)
        );
    }
    eprintln!(
        "observed: RSS max {} KiB; map entries max: threads {} of {}, syscalls {} of {}; \
         idle threads {} syscalls {}, after churn threads {} syscalls {}; getpid checks \
         (made, seen) {checks:?}; lost events {}, overflow {}",
        rss_max / 1024,
        map_max("threads"),
        cap("threads"),
        map_max("syscalls"),
        cap("syscalls"),
        idle.maps["threads"].0,
        idle.maps["syscalls"].0,
        after.maps["threads"].0,
        after.maps["syscalls"].0,
        after.lost,
        after.overflow
    );

    eprintln!(
        "observed: drops by reason at the end: {:?}",
        st.dropped
            .iter()
            .filter(|x| x.count > 0)
            .map(|x| (x.reason.as_str(), x.count, x.loss))
            .collect::<Vec<_>>()
    );
    for (made, seen) in &checks {
        assert_eq!(
            seen, made,
            "getpid count of the long-lived process under churn: ethand {seen}, made {made}"
        );
    }
    assert_eq!(
        checks.last().unwrap().0,
        n,
        "the workload made all its calls"
    );
    assert!(
        rate >= CHURN_RATE as f64,
        "the churn reached {rate:.0} processes/s, not {CHURN_RATE}/s: this machine cannot \
         create processes that fast next to the daemon"
    );
    assert!(
        secs >= CHURN_SECONDS as f64,
        "churn ran {secs:.1} s, not {CHURN_SECONDS} s"
    );
    assert!(
        rss_max < RSS_LIMIT,
        "daemon RSS reached {} KiB under churn (limit {} KiB)",
        rss_max / 1024,
        RSS_LIMIT / 1024
    );
    // The peak between the samples too (a reply, a round's read of the maps).
    let hwm = peak_rss_bytes(d.pid());
    eprintln!("observed: VmHWM {} KiB", hwm / 1024);
    assert!(
        hwm < RSS_LIMIT,
        "daemon VmHWM reached {} KiB under churn (limit {} KiB)",
        hwm / 1024,
        RSS_LIMIT / 1024
    );
    // No growth in the last 30 s. RSS swings by several MB with the exited processes held and
    // the heap handed back every few rounds, so a trend fitted through single samples is
    // mostly that swing; the two halves of those 30 s are compared instead, by their peaks
    // (the most held at once) and their medians: a leak raises both.
    let half = |from: u64, to: u64| -> Vec<u64> {
        let mut v: Vec<u64> = samples
            .iter()
            .filter(|s| s.t >= Duration::from_secs(from) && s.t < Duration::from_secs(to))
            .map(|s| s.rss)
            .collect();
        v.sort_unstable();
        v
    };
    let (early, late) = (half(30, 45), half(45, CHURN_SECONDS));
    assert!(
        early.len() >= 10 && late.len() >= 10,
        "too few RSS samples in the last 30 s: {} and {}",
        early.len(),
        late.len()
    );
    let peak = |v: &[u64]| v[v.len() - 1] as i64 / 1024;
    let median = |v: &[u64]| v[v.len() / 2] as i64 / 1024;
    eprintln!(
        "observed: RSS in 30-45 s / 45-60 s: peak {} / {} KiB, median {} / {} KiB",
        peak(&early),
        peak(&late),
        median(&early),
        median(&late)
    );
    // A leak raises both the peak and the median. The median alone moves with the phase of
    // the 5-7 MB sawtooth (exited processes held, heap handed back every ten rounds): CI saw
    // it go 42.3 -> 46.7 MB with the peaks flat (47.08 / 47.10 MB).
    let (pa, pb) = (peak(&early), peak(&late));
    let (ma, mb) = (median(&early), median(&late));
    assert!(
        pb - pa < 2048 || mb - ma < 2048,
        "daemon RSS grew in the last 30 s of the churn: peak {pa} -> {pb} KiB and median \
         {ma} -> {mb} KiB from 30-45 s to 45-60 s"
    );
    for name in ["threads", "syscalls", "syscall_hist"] {
        let (max, capacity) = (map_max(name), cap(name));
        assert!(
            max < capacity * 9 / 10,
            "map {name} reached {max} of {capacity} entries: exited processes are not reclaimed"
        );
        let (idle_n, after_n) = (idle.maps[name].0, after.maps[name].0);
        assert!(
            after_n <= idle_n + 1000,
            "map {name}: {after_n} entries after the churn, {idle_n} before: not reclaimed"
        );
    }
    // Losses are counted, and /metrics says what status says.
    let overflow_metric = metric(&body, "ethand_processes_overflow_total").unwrap_or(-1.0);
    assert!(
        (overflow_metric - st.processes_overflow as f64).abs() <= (spawned / 100) as f64,
        "overflow: /metrics {overflow_metric}, status {}",
        st.processes_overflow
    );
    for dc in &st.dropped {
        let series = format!(
            "ethand_bpf_dropped_events_total{{reason=\"{}\",loss=\"{}\"}}",
            dc.reason, dc.loss
        );
        let m = metric(&body, &series).unwrap_or_else(|| panic!("/metrics has no {series}"));
        assert!(
            m <= dc.count as f64 && dc.count as f64 - m <= (spawned / 10) as f64,
            "{series}: /metrics {m}, status {}",
            dc.count
        );
    }
    assert!(
        st.processes_overflow <= spawned,
        "overflow {} counts more processes than were created ({spawned}): not distinct",
        st.processes_overflow
    );
    calls.finish();
    churn.finish();
}

/// The values of `family` samples of pid `pid` whose labels include `label` (e.g.
/// `syscall="getpid"`), one per series.
fn pid_series(body: &str, family: &str, pid: u32, label: &str) -> Vec<(String, f64)> {
    let pid_label = format!("pid=\"{pid}\"");
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| l.contains(&pid_label) && l.contains(label))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').expect("sample line");
            (series.to_string(), v.parse().expect("sample value"))
        })
        .collect()
}

/// 10,000 process exits per second while the daemon reads its maps only every 5 s: 50,000
/// exit events a round, more than the lifecycle ring buffer holds (21,000). The kernel side
/// wakes the daemon to drain early, so none is lost (`lifecycle_ringbuf_full` stays 0; the
/// build before that change lost 230,708 here).
#[test]
fn exit_events_are_not_lost_between_slow_rounds() {
    let _serial = serial();
    let d = Daemon::start("churn-slow", "[daemon]\ninterval_ms = 5000\n");
    let mut churn = load(&[
        "churn",
        &(CHURN_RATE * 102 / 100).to_string(),
        "12",
        "4",
        "vfork",
    ]);
    churn.send_byte();
    let done = churn.expect("done");
    let spawned = done.u64("spawned");
    // One more round, so that every event has been drained and counted.
    thread::sleep(Duration::from_millis(6000));
    let st = d.status();
    let lost = |reason: &str| {
        st.dropped
            .iter()
            .find(|x| x.reason == reason)
            .map_or(0, |x| x.count)
    };
    eprintln!(
        "observed: {spawned} processes in {:.1} s; lifecycle_ringbuf_full {}",
        done.u64("forker_ns") as f64 / 1e9,
        lost("lifecycle_ringbuf_full")
    );
    assert!(
        spawned >= 100_000,
        "the churn made only {spawned} processes: too few to overflow a 5 s round"
    );
    assert_eq!(
        lost("lifecycle_ringbuf_full"),
        0,
        "exit events lost between rounds"
    );
    churn.finish();
}

/// Process A (pid P) makes exactly a getpid() and exits; process B is created with the same
/// pid P (clone3 set_tid) right after A was reaped and makes b. ethand shows two processes with
/// pid P, different start times, exactly a and b, never a + b: in the snapshot and in /metrics.
#[test]
fn pid_reuse_never_merges_two_processes() {
    let _serial = serial();
    let d = Daemon::start("pid-reuse", "[prometheus]\ncomms = [\"reuse-child\"]\n");
    let (a, b) = (3_000u64, 5_000u64);
    let mut w = load(&["pid-reuse", &a.to_string(), &b.to_string()]);
    let done = w.go();
    let (pid_a, pid_b) = (done.u64("pid_a") as u32, done.u64("pid_b") as u32);
    assert_eq!(pid_a, pid_b, "the workload could not reuse the pid");
    assert_ne!(
        done.u64("a_start_ticks"),
        done.u64("b_start_ticks"),
        "A and B have the same start time: the reuse is not observable"
    );
    thread::sleep(SETTLE);
    let t = d.snapshot(w.pid);
    let mut twins: Vec<_> = t.processes.iter().filter(|p| p.pid == pid_a).collect();
    twins.sort_by_key(|p| p.start_time_ns);
    let counts: Vec<u64> = twins
        .iter()
        .map(|p| syscall(p, libc::SYS_getpid).0)
        .collect();
    let body = d.metrics();
    let series = pid_series(
        &body,
        "ethand_process_syscalls_total",
        pid_a,
        "syscall=\"getpid\"",
    );
    eprintln!(
        "observed: pid {pid_a} reused; snapshot: {:?}; /metrics: {series:?}",
        twins
            .iter()
            .map(|p| (
                p.start_time_ns,
                p.alive,
                p.comm.as_str(),
                syscall(p, libc::SYS_getpid).0
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        twins.len(),
        2,
        "the snapshot of {} must show A and B, both pid {pid_a}",
        w.pid
    );
    assert_ne!(twins[0].start_time_ns, twins[1].start_time_ns);
    assert_eq!(counts, [a, b], "getpid of A then B (by start time)");
    assert!(!twins[0].alive && twins[1].alive, "A exited, B alive");
    let mut values: Vec<f64> = series.iter().map(|(_, v)| *v).collect();
    values.sort_by(f64::total_cmp);
    assert_eq!(
        values,
        [a as f64, b as f64],
        "/metrics getpid series of pid {pid_a}: two series, a and b (never a + b): {series:?}"
    );
    w.finish();
}

/// One request line to the local API socket; the response line.
fn api(socket: &std::path::Path, request: &str) -> Result<String, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    Ok(line)
}

/// Checks one /metrics body: every sample line is `series value` with a number, the body
/// ends with a newline, and the target's getpid series is there.
fn check_metrics(body: &str, pid: u32) -> Result<(), String> {
    if !body.ends_with('\n') {
        return Err(format!(
            "body does not end with a newline ({} bytes)",
            body.len()
        ));
    }
    for l in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (_, v) = l
            .rsplit_once(' ')
            .ok_or_else(|| format!("bad line {l:?}"))?;
        v.parse::<f64>()
            .map_err(|_| format!("bad value in {l:?}"))?;
    }
    if pid_series(
        body,
        "ethand_process_syscalls_total",
        pid,
        "syscall=\"getpid\"",
    )
    .len()
        != 1
    {
        return Err(format!("no getpid series of pid {pid}"));
    }
    if !body.contains("\nethand_tracked_processes ") {
        return Err("no ethand_tracked_processes".into());
    }
    Ok(())
}

/// 100 threads at once, three times over: /metrics GETs (half of them), snapshot requests and
/// status requests over the local API socket (a quarter each). Every one succeeds with
/// complete, parseable output that holds the target process.
#[test]
fn hundred_concurrent_scrapes_and_api_requests_all_succeed() {
    let _serial = serial();
    // 50 scrapers of one user at once: allowed that many here (the default, 8 per peer, is
    // tested against a flood in hostile.rs).
    let d = Daemon::start(
        "concurrent",
        "[prometheus]\ncomms = [\"ethand-workload\"]\nmax_connections_per_peer = 64\n",
    );
    let mut w = crate::workload(&["syscalls", "1000", "0"]);
    w.go();
    thread::sleep(SETTLE);
    let (port, pid, socket) = (d.port, w.pid, d.socket.clone());
    let mut latencies: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let mut failures = Vec::new();
    for round in 0..3 {
        let barrier = Arc::new(std::sync::Barrier::new(100));
        let handles: Vec<_> = (0..100)
            .map(|i| {
                let (barrier, socket) = (Arc::clone(&barrier), socket.clone());
                thread::spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    let (kind, r) = match i % 4 {
                        0 | 2 => (
                            "metrics",
                            match http_get(port, "/metrics") {
                                Ok((status, body)) if status.contains(" 200") => {
                                    check_metrics(&body, pid)
                                }
                                Ok((status, _)) => Err(status),
                                Err(e) => Err(e.to_string()),
                            },
                        ),
                        1 => (
                            "snapshot",
                            api(
                                &socket,
                                &format!("{{\"cmd\":\"snapshot\",\"pid\":{pid},\"window_s\":10}}"),
                            )
                            .and_then(|l| {
                                let v: serde_json::Value =
                                    serde_json::from_str(&l).map_err(|e| format!("JSON: {e}"))?;
                                let t: ethand_tests::TreeSnapshot =
                                    serde_json::from_value(v["ok"].clone())
                                        .map_err(|e| format!("not a snapshot: {e}: {l}"))?;
                                if t.root_pid == pid && t.processes.iter().any(|p| p.pid == pid) {
                                    Ok(())
                                } else {
                                    Err(format!("target {pid} missing"))
                                }
                            }),
                        ),
                        _ => (
                            "status",
                            api(&socket, "{\"cmd\":\"status\"}").and_then(|l| {
                                let v: serde_json::Value =
                                    serde_json::from_str(&l).map_err(|e| format!("JSON: {e}"))?;
                                let s: SelfStatus = serde_json::from_value(v["ok"].clone())
                                    .map_err(|e| format!("not a status: {e}: {l}"))?;
                                if s.probes.is_empty() {
                                    Err("status without probes".into())
                                } else {
                                    Ok(())
                                }
                            }),
                        ),
                    };
                    (kind, t0.elapsed(), r)
                })
            })
            .collect();
        for h in handles {
            let (kind, took, r) = h.join().expect("request thread");
            latencies.entry(kind).or_default().push(took);
            if let Err(e) = r {
                failures.push(format!("round {round} {kind}: {e}"));
            }
        }
    }
    for (kind, l) in &mut latencies {
        l.sort();
        eprintln!(
            "observed: {kind}: {} requests, latency p50 {:?}, max {:?}",
            l.len(),
            l[l.len() / 2],
            l[l.len() - 1]
        );
    }
    assert!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
    assert_eq!(
        latencies.values().map(Vec::len).sum::<usize>(),
        300,
        "every request answered"
    );
    w.finish();
}
