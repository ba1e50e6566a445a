//! Series an SRE can keep: a process keeps its per-process series from selection until it
//! exits or stays idle for the hold time (no flapping among equally busy processes), young
//! processes get none, and what short-lived processes did is in their name's totals.
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use ethand_tests::{Daemon, RemoveOnDrop, SETTLE, metric, serial, temp_path};

use crate::ancestry::{KillOnDrop, bash, children_cpu_s, wait_for_file};

/// A copy of dash under `name`, so that its processes have that comm.
fn named_shell(name: &str) -> (PathBuf, RemoveOnDrop) {
    let dir = temp_path("series-bin", "d");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let bin = dir.join(name);
    std::fs::copy("/bin/dash", &bin).expect("copy /bin/dash");
    (bin, RemoveOnDrop(dir))
}

fn spinner(bin: &PathBuf) -> KillOnDrop {
    KillOnDrop(
        Command::new(bin)
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spinner"),
    )
}

/// Pids with an `ethand_process_cpu_seconds_total` series of comm `comm`.
fn pids_with_series(body: &str, comm: &str) -> BTreeSet<u32> {
    let tag = format!("comm=\"{comm}\"");
    body.lines()
        .filter(|l| l.starts_with("ethand_process_cpu_seconds_total{") && l.contains(&tag))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect()
}

/// Six equally busy processes and three slots: once the slots are theirs, the same three
/// keep them at every scrape (a plain top 3 of six equal processes changes at each round).
/// A holder that exits frees its slot at once; one that stops using CPU keeps its series for
/// the hold time, then loses them.
#[test]
fn selected_processes_keep_their_series() {
    let _serial = serial();
    let (bin, _rm) = named_shell("ethand-spin");
    let d = Daemon::start(
        "series-hold",
        "[daemon]\nexit_grace_seconds = 1\n[prometheus]\ntop_n = 3\n\
         selection_min_age_seconds = 1\nselection_hold_seconds = 4\n",
    );
    let mut spinners: Vec<KillOnDrop> = (0..6).map(|_| spinner(&bin)).collect();
    // Background processes may hold the slots first: after the hold, spinners using far
    // more CPU displace them.
    let t0 = Instant::now();
    let mut held = BTreeSet::new();
    while t0.elapsed() < Duration::from_secs(20) {
        held = pids_with_series(&d.metrics(), "ethand-spin");
        if held.len() == 3 {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "observed: spinners with series after {:?}: {held:?}",
        t0.elapsed()
    );
    assert_eq!(held.len(), 3, "three slots, six equally busy spinners");
    // 10 s of scrapes (50 rounds of 200 ms): always the same three.
    let mut changes = 0;
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(500));
        let now = pids_with_series(&d.metrics(), "ethand-spin");
        if now != held {
            changes += 1;
            eprintln!("observed: selection changed to {now:?}");
        }
    }
    assert_eq!(
        changes, 0,
        "the selection of equally busy processes flapped"
    );

    // A holder exits: its slot goes to another spinner within a few rounds (grace 1 s).
    let gone = *held.iter().next().expect("one");
    let i = spinners
        .iter()
        .position(|s| s.0.id() == gone)
        .expect("a spinner");
    drop(spinners.remove(i));
    let t1 = Instant::now();
    let mut after = BTreeSet::new();
    while t1.elapsed() < Duration::from_secs(6) {
        after = pids_with_series(&d.metrics(), "ethand-spin");
        if !after.contains(&gone) && after.len() == 3 {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "observed: after pid {gone} exited, {after:?} within {:?}",
        t1.elapsed()
    );
    assert!(!after.contains(&gone), "an exited holder keeps its slot");
    assert_eq!(after.len(), 3, "the freed slot goes to a waiting spinner");

    // A holder stops (SIGSTOP: no CPU). Its series stay while its 10 s window still shows
    // CPU and for the 4 s hold (or until a waiting spinner with twice its window's CPU
    // displaces it), then go.
    let stopped = *after.iter().next().expect("one");
    // SAFETY: signalling a child of this test.
    unsafe { libc::kill(stopped as i32, libc::SIGSTOP) };
    let t2 = Instant::now();
    let mut last_seen = Duration::ZERO;
    while t2.elapsed() < Duration::from_secs(20) {
        if pids_with_series(&d.metrics(), "ethand-spin").contains(&stopped) {
            last_seen = t2.elapsed();
        }
        thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: as above.
    unsafe { libc::kill(stopped as i32, libc::SIGCONT) };
    eprintln!("observed: stopped pid {stopped} had series until {last_seen:?} after SIGSTOP");
    assert!(
        last_seen >= Duration::from_secs(3),
        "an idle holder lost its series {last_seen:?} after it stopped"
    );
    assert!(
        last_seen <= Duration::from_secs(17),
        "an idle holder kept its series {last_seen:?}: past its window and the 4 s hold"
    );
}

/// 30 short-lived children of a known name, ~80 ms of CPU each: none gets series of its own
/// (younger than selection_min_age_seconds), and their name's totals hold their CPU (bash's
/// `times` of its reaped children) and their count.
#[test]
fn short_lived_processes_count_under_their_name() {
    let _serial = serial();
    let (bin, _rm) = named_shell("ethand-brief");
    let d = Daemon::start("series-brief", "[daemon]\nexit_grace_seconds = 1\n");
    let out = temp_path("series-times", "txt");
    // No other children: the arithmetic loop is a bash builtin.
    let script = format!(
        "for ((n = 0; n < 30; n++)); do {} -c 'i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done'; done; \
         times > {1}.tmp; mv {1}.tmp {1}; sleep 60",
        bin.display(),
        out.display()
    );
    let _b = bash(&script);
    let mut own_series = BTreeSet::new();
    let t0 = Instant::now();
    while !out.exists() && t0.elapsed() < Duration::from_secs(60) {
        own_series.extend(pids_with_series(&d.metrics(), "ethand-brief"));
        thread::sleep(Duration::from_millis(300));
    }
    let times = wait_for_file(&out, Duration::from_secs(60));
    let _ = std::fs::remove_file(&out);
    let truth = children_cpu_s(&times);
    // Exited and out of the model after the 1 s grace.
    thread::sleep(Duration::from_secs(2) + SETTLE);
    let body = d.metrics();
    let cpu = metric(
        &body,
        "ethand_comm_cpu_seconds_total{comm=\"ethand-brief\"}",
    );
    let exited = metric(
        &body,
        "ethand_comm_exited_processes_total{comm=\"ethand-brief\"}",
    );
    eprintln!(
        "observed: ethand-brief cpu {cpu:?} s, exited {exited:?}; bash `times` children \
         {truth:.3} s; pids with own series {own_series:?}"
    );
    assert!(own_series.is_empty(), "short-lived processes got series");
    assert!(
        truth > 0.2,
        "the children burned {truth} s: too little to compare"
    );
    let cpu = cpu.expect("ethand_comm_cpu_seconds_total of ethand-brief");
    assert!(
        (cpu - truth).abs() <= 0.03 * truth + 0.02,
        "ethand-brief CPU: ethand {cpu:.3} s vs bash `times` {truth:.3} s"
    );
    assert_eq!(exited, Some(30.0), "exited ethand-brief processes");
}
