//! A writer bound by its fsyncs, against its own ground truth: `ethand-workload fsyncwrite`
//! makes pairs of a 256 KiB pwrite and an fsync on a file of the disk behind /var/tmp (a
//! block device, not tmpfs) and says how many it made. The finding must be the write-bound
//! one (write advice, not read advice), the fsync count exact, both "written" figures shown
//! with the process's own at least pairs x size, and the CPU profile's waits every wait: at
//! least one per fsync made in the profile, their time the scheduler's blocked time.
use std::{
    path::Path,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, RemoveOnDrop, TreeSnapshot, serial, text};

const KIB: u64 = 256;
/// The profile (and the snapshot's window) lasts this long, well inside the writes.
const PROFILE_MS: u64 = 3000;
const WRITES_MS: u64 = 9000;

fn json(out: std::process::Output) -> TreeSnapshot {
    assert!(out.status.success(), "snapshot: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a snapshot")
}

#[test]
fn fsync_writer_gets_write_advice_and_every_wait_counted() {
    let _serial = serial();
    let file = Path::new("/var/tmp").join(format!("ethand-test-fsync-{}.dat", std::process::id()));
    let _cleanup = RemoveOnDrop(file.clone());
    let d = Daemon::start(
        "disk-write",
        &format!("[diagnosis]\nstack_sample_ms = {PROFILE_MS}\noffcpu_min_us = 1000\n"),
    );
    // Under SCHED_FIFO (chrt execs it: same pid), so that other work on the machine cannot
    // turn its waits into run-queue waits (cpu_contention instead of the disk).
    let mut w = ethand_tests::Workload::start(
        "chrt",
        &[
            "-f",
            "1",
            env!("CARGO_BIN_EXE_ethand-workload"),
            "fsyncwrite",
            file.to_str().expect("utf-8"),
            &KIB.to_string(),
            &WRITES_MS.to_string(),
        ],
    );
    let pid = w.pid.to_string();
    w.send_byte();
    // A few seconds of writes before the window, so that it lies inside them.
    thread::sleep(Duration::from_millis(3500));
    let window_s = (PROFILE_MS / 1000).to_string();
    let during = json(d.cli(&[
        "snapshot",
        "--pid",
        &pid,
        "--json",
        "--cpu-profile",
        "--window",
        &window_s,
    ]));
    let done = w.expect("done");
    let (pairs, took_ns) = (done.u64("pairs"), done.u64("took_ns"));
    eprintln!("observed: {pairs} write+fsync pairs in {took_ns} ns");
    assert!(pairs > 0);

    // The finding: writes, not reads.
    let ids: Vec<&str> = during.findings.iter().map(|f| f.id.as_str()).collect();
    eprintln!("observed: findings {ids:?}");
    for p in &during.processes {
        let rw: Vec<String> = p
            .syscalls
            .by_nr
            .iter()
            .filter(|r| ["fsync", "pwrite64"].contains(&r.name.as_str()))
            .map(|r| format!("{} {} in {} ns", r.name, r.count, r.time_ns))
            .collect();
        let service: u64 = p.block.iter().map(|b| b.service_ns).sum();
        eprintln!(
            "observed: pid {} {rw:?}, block service {service} ns, sched {:?}, window {:?}",
            p.pid, p.sched, p.window
        );
    }
    let f = during
        .findings
        .iter()
        .find(|f| f.id == "disk_write_bound")
        .unwrap_or_else(|| panic!("no disk_write_bound: {:#?}", during.findings));
    assert!(!ids.contains(&"disk_io_bound"), "read advice too: {ids:?}");
    assert!(
        f.advice.iter().any(|a| a.contains("fsync")),
        "{:?}",
        f.advice
    );
    assert!(
        !f.advice.iter().any(|a| a.contains("WebDataset")),
        "{:?}",
        f.advice
    );

    // Every wait of the writer in the profile, against the scheduler's blocked time over the
    // same span (the window ends when the profile does; both count a wait from the switch-out
    // to the switch-in).
    let p = during.cpu_profile.as_ref().expect("a CPU profile");
    let proc = during
        .processes
        .iter()
        .find(|x| x.pid == w.pid)
        .expect("the writer");
    let th = p
        .threads
        .iter()
        .find(|t| t.pid == w.pid && t.main_thread)
        .unwrap_or_else(|| panic!("no main thread in {p:#?}"));
    let win = proc.window.as_ref().expect("a window");
    let sched_share = win.offcpu_blocked_ns as f64 / (win.duration_ms as f64 * 1e6);
    let profile_share = th.wait_ns as f64 / (p.duration_ms as f64 * 1e6);
    eprintln!(
        "observed: profile {} waits, {} ns over {} ms (long: {:?}); scheduler blocked {} ns over {} ms",
        th.waits, th.wait_ns, p.duration_ms, th.long_waits, win.offcpu_blocked_ns, win.duration_ms
    );
    // The windows are the same span to a collection interval (1 s of 3): 15 points.
    assert!(
        (profile_share - sched_share).abs() <= 0.15,
        "profile blocked {profile_share:.3} of its window, scheduler {sched_share:.3}"
    );
    assert!(sched_share > 0.3, "the writer waits: {sched_share:.3}");
    // At least one wait per fsync made in the profile (at the workload's steady rate; 20 %
    // for the rate's unevenness over 3 s).
    let fsyncs_in_profile = pairs as f64 * p.duration_ms as f64 * 1e6 / took_ns as f64;
    assert!(
        th.waits as f64 >= 0.8 * fsyncs_in_profile,
        "{} waits for ~{fsyncs_in_profile:.0} fsyncs",
        th.waits
    );
    assert!(th.long_waits.expect("long waits counted apart") <= th.waits);

    // After the writes: the exact fsync count (once a collection round has read the last
    // ones: wait for it, a few rounds at most), and both "written" figures.
    let fsyncs = |t: &TreeSnapshot| {
        t.processes
            .iter()
            .find(|x| x.pid == w.pid)
            .and_then(|p| p.syscalls.by_nr.iter().find(|r| r.name == "fsync"))
            .map_or(0, |r| r.count)
    };
    let t0 = Instant::now();
    let after = loop {
        let t = json(d.cli(&["snapshot", "--pid", &pid, "--json"]));
        if fsyncs(&t) >= pairs || t0.elapsed() > Duration::from_secs(5) {
            break t;
        }
        thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(fsyncs(&after), pairs, "fsync count");
    let proc = after
        .processes
        .iter()
        .find(|x| x.pid == w.pid)
        .expect("the writer");
    let own = proc.proc_write_bytes.expect("write_bytes of /proc/PID/io");
    assert!(
        own >= pairs * KIB * 1024,
        "write_bytes {own} < {pairs} x {KIB} KiB"
    );
    assert_eq!(after.total.proc_write_bytes, Some(own));
    assert!(after.total.block_write_bytes > 0);
    eprintln!(
        "observed: block-layer written {} B, write_bytes {own} B",
        after.total.block_write_bytes
    );
    let o = d.cli(&["snapshot", "--pid", &pid, "--cpu-profile"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.contains("written = block-layer bytes"), "{out}");
    assert!(out.contains("own write_bytes (/proc/PID/io"), "{out}");
    // The writer is idle now, blocked in read(stdin) since before the profile began: a wait
    // that neither starts nor ends in the window has no switch to be caught at, so only the
    // profile's header can be checked here (the waits themselves are checked above).
    assert!(out.contains("every wait summed"), "{out}");
    w.finish();
}
