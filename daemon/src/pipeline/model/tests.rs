use super::*;

fn th(oncpu: u64, vol: u64, h0: u32) -> ThreadStats {
    let mut t = ThreadStats {
        tgid: 10,
        proc_start_ns: 5,
        oncpu_ns: oncpu,
        voluntary_switches: vol,
        ..Default::default()
    };
    t.runq_wait_hist[3] = h0;
    t
}

#[test]
fn thread_counters_accumulate() {
    let mut a = ThreadAcc::default();
    a.update(&th(100, 1, 1), 0);
    a.update(&th(250, 3, 4), 0);
    let c = a.current();
    assert_eq!(c.oncpu_ns, 250);
    assert_eq!(c.voluntary_switches, 3);
    assert_eq!(c.runq_wait_hist[3], 4);
}

#[test]
fn histogram_bucket_wrap() {
    let mut a = ThreadAcc::default();
    a.update(&th(100, 1, u32::MAX - 1), 0);
    // The u32 bucket wrapped: 3 more events.
    a.update(&th(200, 2, 1), 0);
    assert_eq!(a.current().runq_wait_hist[3], u64::from(u32::MAX - 1) + 3);
}

#[test]
fn run_in_progress_counts_and_the_total_never_drops() {
    let mut a = ThreadAcc::default();
    a.update(&th(100, 1, 0), 0);
    // Running for 400 ns the entry does not hold yet.
    a.update(&th(100, 1, 0), 400);
    assert_eq!(a.current().oncpu_ns, 500);
    // Switched out: the kernel charged the run (to a tick's staleness of the /proc
    // reading, a little more or less than what was shown).
    a.update(&th(480, 2, 0), 0);
    assert_eq!(a.current().oncpu_ns, 500, "never lower than shown");
    a.update(&th(600, 3, 0), 0);
    assert_eq!(a.current().oncpu_ns, 600);
    // A new incarnation keeps what was shown.
    a.update(&th(0, 0, 0), 50);
    assert_eq!(a.current().oncpu_ns, 650);
}

#[test]
fn recreated_entry_keeps_earlier_totals() {
    let mut a = ThreadAcc::default();
    a.update(&th(1000, 10, 5), 0);
    // ethand deleted the entry; the thread's last switch-out recreated it from zero.
    a.update(&th(0, 1, 0), 0);
    let c = a.current();
    assert_eq!(c.oncpu_ns, 1000);
    assert_eq!(c.voluntary_switches, 11);
    assert_eq!(c.runq_wait_hist[3], 5);
}

#[test]
fn pid_reuse_never_merges() {
    let mut m = Model::new(1000, 60, 30, 100);
    let mut raw = RawRead::default();
    let mut a = th(500, 1, 0);
    a.proc_start_ns = 111;
    let mut b = th(700, 2, 0);
    b.proc_start_ns = 222; // same tgid 10, later start: a different process
    raw.threads = vec![(10, a), (11, b)];
    raw.syscalls = vec![
        (
            SyscallKey {
                tgid: 10,
                nr: 39,
                proc_start_ns: 111,
            },
            RawSys {
                count: 3,
                errors: 0,
                time_ns: 30,
            },
        ),
        (
            SyscallKey {
                tgid: 10,
                nr: 39,
                proc_start_ns: 222,
            },
            RawSys {
                count: 4,
                errors: 1,
                time_ns: 40,
            },
        ),
    ];
    m.ingest(&raw, 0);
    assert_eq!(m.procs.len(), 2);
    let pa = &m.procs[&ProcKey {
        tgid: 10,
        _pad0: 0,
        proc_start_ns: 111,
    }];
    let pb = &m.procs[&ProcKey {
        tgid: 10,
        _pad0: 0,
        proc_start_ns: 222,
    }];
    assert_eq!(pa.sched().oncpu_ns, 500);
    assert_eq!(pb.sched().oncpu_ns, 700);
    assert_eq!(pa.syscalls[&39].count, 3);
    assert_eq!(pb.syscalls[&39].count, 4);
}

#[test]
fn exited_thread_folds_into_process_and_is_reclaimed() {
    let mut m = Model::new(1000, 60, 30, 100);
    let key = ProcKey {
        tgid: 10,
        _pad0: 0,
        proc_start_ns: 5,
    };
    let mut t = th(900, 4, 2);
    m.ingest(
        &RawRead {
            threads: vec![(12, t)],
            ..Default::default()
        },
        0,
    );
    t.flags = thread_flags::EXITED;
    t.oncpu_ns = 950;
    let r1 = m.ingest(
        &RawRead {
            threads: vec![(12, t)],
            ..Default::default()
        },
        1000,
    );
    assert!(
        r1.threads.is_empty(),
        "kept one more round for the final switch-out"
    );
    let r2 = m.ingest(
        &RawRead {
            threads: vec![(12, t)],
            ..Default::default()
        },
        2000,
    );
    assert_eq!(r2.threads, vec![(12, key)]);
    let p = &m.procs[&key];
    assert!(p.threads.is_empty());
    assert_eq!(p.sched().oncpu_ns, 950);
    assert_eq!(p.sched().runq_wait_hist[3], 2);
}

#[test]
fn syscalls_flushed_after_release_add_to_the_final_counts() {
    // The test process stands in for the live process (start time 0: not checked), so
    // that reading its metadata does not find it gone.
    let mut m = Model::new(1000, 60, 30, 100);
    let me = std::process::id();
    let key = ProcKey {
        tgid: me,
        _pad0: 0,
        proc_start_ns: 0,
    };
    let read = |count, time_ns| RawRead {
        syscalls: vec![(
            SyscallKey {
                tgid: me,
                nr: 39,
                proc_start_ns: 0,
            },
            RawSys {
                count,
                errors: 0,
                time_ns,
            },
        )],
        ..Default::default()
    };
    m.ingest(&read(100, 1000), 0);
    m.on_exit(key, None);
    let r = m.ingest(&read(120, 1200), 1000);
    assert_eq!(r.procs, vec![key], "entries freed after the exit's read");
    // Another exiting thread's batch, flushed after that: a new entry holding only it.
    let r = m.ingest(&read(7, 70), 2000);
    assert_eq!(r.procs, vec![key], "the recreated entry is freed too");
    let s = m.procs[&key].syscalls[&39];
    assert_eq!((s.count, s.time_ns), (127, 1270));
    let r = m.ingest(&RawRead::default(), 3000);
    assert!(r.procs.is_empty());
    assert_eq!(m.procs[&key].syscalls[&39].count, 127);
    // The history has the calls of the exit's read and the late batch: windows see them.
    let w = m.window(&key, 10_000).expect("window");
    assert_eq!((w.duration_ms, w.syscalls), (3000, 27));
}

#[test]
fn max_processes_overflow_is_counted() {
    let mut m = Model::new(1000, 60, 30, 1);
    let raw = RawRead {
        net: vec![
            (
                ProcKey {
                    tgid: 1,
                    _pad0: 0,
                    proc_start_ns: 1,
                },
                RawNet::default(),
            ),
            (
                ProcKey {
                    tgid: 2,
                    _pad0: 0,
                    proc_start_ns: 2,
                },
                RawNet::default(),
            ),
        ],
        ..Default::default()
    };
    m.ingest(&raw, 0);
    assert_eq!(m.procs.len(), 1);
    assert_eq!(m.overflow, 1);
}

/// Under churn at most `max_exited` exited processes stay for their grace period: the
/// earliest exits leave first, their CPU stays in the cgroup totals.
#[test]
fn exited_processes_beyond_the_cap_leave_earliest_first() {
    let mut m = Model::new(1000, 60, 30, 10_000);
    m.max_exited = 3;
    // Pids above pid_max: never alive in /proc, so each exits at its first round.
    for (round, pid) in (4_999_000u32..4_999_010).enumerate() {
        let mut t = th(100, 1, 0);
        t.tgid = pid;
        t.proc_start_ns = u64::from(pid);
        m.ingest(
            &RawRead {
                threads: vec![(pid, t)],
                ..Default::default()
            },
            round as u64 * 1000,
        );
        assert!(m.procs.len() <= 3, "round {round}: {} kept", m.procs.len());
    }
    let mut kept: Vec<u32> = m.procs.keys().map(|k| k.tgid).collect();
    kept.sort();
    assert_eq!(kept, vec![4_999_007, 4_999_008, 4_999_009]);
    let cpu: u64 = m.cgroups().iter().map(|c| c.oncpu_ns).sum();
    assert_eq!(cpu, 10 * 100, "retired early, still counted");
}

/// A name's totals only grow: what a process did before exec stays with its old name,
/// and what it does after goes to the new one; an exit counts once.
#[test]
fn comm_totals_follow_renames_and_only_grow() {
    let mut m = Model::new(1000, 60, 30, 100);
    let (pid, start) = (4_999_100u32, 77u64);
    let key = ProcKey {
        tgid: pid,
        _pad0: 0,
        proc_start_ns: start,
    };
    let read = |oncpu: u64| {
        let mut t = th(oncpu, 1, 0);
        t.tgid = pid;
        t.proc_start_ns = start;
        RawRead {
            threads: vec![(pid, t)],
            ..Default::default()
        }
    };
    m.ingest(&read(100), 0);
    m.procs.get_mut(&key).expect("tracked").comm_fallback = "bash".into();
    m.ingest(&read(300), 1000);
    let by_name = |m: &Model| -> BTreeMap<String, (u64, u64)> {
        m.comms()
            .into_iter()
            .map(|c| (c.comm, (c.oncpu_ns, c.exited)))
            .collect()
    };
    // The first 100 ns were charged before it had a name.
    assert_eq!(by_name(&m).get("bash"), Some(&(200, 0)));
    m.procs.get_mut(&key).expect("tracked").comm_fallback = "python3".into();
    m.ingest(&read(1300), 2000);
    let names = by_name(&m);
    assert_eq!(names.get("bash"), Some(&(200, 0)), "{names:?}");
    assert_eq!(names.get("python3"), Some(&(1000, 0)), "{names:?}");
    // Gone from the model (exited; no room for exited ones): counted once as exited,
    // totals kept.
    m.max_exited = 0;
    for t in 3..6 {
        m.ingest(&RawRead::default(), t * 1000);
    }
    assert!(m.procs.is_empty());
    let names = by_name(&m);
    assert_eq!(names.get("python3"), Some(&(1000, 1)), "{names:?}");
    assert_eq!(names.get("bash"), Some(&(200, 0)));
}

/// Names beyond COMMS_MAX are summed under COMM_OTHER.
#[test]
fn comm_names_are_bounded() {
    let mut m = Model::new(1000, 60, 30, 10_000);
    let mut threads = Vec::new();
    for i in 0..(snap::COMMS_MAX as u32 + 10) {
        let pid = 4_990_000 + i;
        let mut t = th(10, 1, 0);
        t.tgid = pid;
        t.proc_start_ns = u64::from(pid);
        threads.push((pid, t));
    }
    m.ingest(&RawRead::default(), 0);
    for (pid, t) in &threads {
        let key = proc_key(*pid, t.proc_start_ns);
        let mut p = Proc::new(key);
        p.comm_fallback = format!("name{pid}");
        m.procs.insert(key, Box::new(p));
    }
    m.ingest(
        &RawRead {
            threads,
            ..Default::default()
        },
        1000,
    );
    let comms = m.comms();
    assert_eq!(comms.len(), snap::COMMS_MAX + 1);
    let other = comms
        .iter()
        .find(|c| c.comm == snap::COMM_OTHER)
        .expect("other");
    assert_eq!((other.processes, other.oncpu_ns), (10, 100));
}

#[test]
fn cgroup_totals_survive_reclaim() {
    // Grace of 1 s at a 1 s interval. The test process itself stands in for a live
    // process (start time 0: not checked) so that its /proc metadata can be read.
    let mut m = Model::new(1000, 60, 1, 100);
    let me = std::process::id();
    let key = ProcKey {
        tgid: me,
        _pad0: 0,
        proc_start_ns: 0,
    };
    let mut t = th(4000, 1, 0);
    t.tgid = me;
    t.proc_start_ns = 0;
    m.ingest(
        &RawRead {
            threads: vec![(me, t)],
            ..Default::default()
        },
        0,
    );
    let before: u64 = m.cgroups().iter().map(|c| c.oncpu_ns).sum();
    assert_eq!(before, 4000);
    m.on_exit(key, None);
    // Visible for the round that sees the exit, then for one interval of grace; its
    // kernel entries are freed at once (the read of that round holds its final values).
    let r = m.ingest(&RawRead::default(), 1000);
    assert_eq!(
        r.procs,
        vec![key],
        "kernel entries freed once the exit is ingested"
    );
    assert!(!m.procs[&key].alive);
    let r = m.ingest(&RawRead::default(), 2000);
    assert!(r.procs.is_empty(), "not freed twice");
    assert!(m.procs.is_empty());
    let after: Vec<_> = m.cgroups();
    assert_eq!(
        after.iter().map(|c| c.oncpu_ns).sum::<u64>(),
        4000,
        "the counter must not go down"
    );
    assert_eq!(after.iter().map(|c| c.processes).sum::<u64>(), 0);
}

#[test]
fn process_gone_before_first_look_is_reclaimed() {
    // A pid that cannot exist (above pid_max): its metadata can never be read.
    let mut m = Model::new(1000, 60, 1, 100);
    let key = ProcKey {
        tgid: 4_999_999,
        _pad0: 0,
        proc_start_ns: 77,
    };
    let mut t = th(10, 1, 0);
    t.tgid = key.tgid;
    t.proc_start_ns = key.proc_start_ns;
    let r = m.ingest(
        &RawRead {
            threads: vec![(4_999_999, t)],
            ..Default::default()
        },
        0,
    );
    assert!(!m.procs[&key].alive);
    assert_eq!(r.procs, vec![key], "its kernel entries are freed at once");
    m.ingest(&RawRead::default(), 1000);
    assert!(
        !m.procs.contains_key(&key),
        "dropped from the model after the grace period, not kept forever"
    );
}

#[test]
fn thinned_history_keeps_the_values_at_kept_rounds() {
    // A point every second for 100 s, the value changing every round; rounds alike.
    let (mut h, mut rounds) = (Thinned::default(), Thinned::default());
    for t in (0..=100_000u64).step_by(1000) {
        h.push(t, t * 3);
        rounds.push(t, ());
        h.thin(t, 60_000);
        rounds.thin(t, 60_000);
    }
    let times: Vec<u64> = rounds.points.iter().map(|(t, _)| *t).collect();
    // Full resolution for the last 30 s, one per 10 s bucket before, back to the
    // horizon (40 s) and the one point at or before it.
    assert_eq!(times.iter().filter(|&&t| t >= 70_000).count(), 31);
    assert_eq!(
        &times[..4],
        &[39_000, 49_000, 59_000, 69_000],
        "older points thinned to the last of each 10 s"
    );
    for &t in &times {
        assert_eq!(h.at(t), Some(&(t * 3)), "value at kept round {t}");
    }
    assert_eq!(h.at(38_999), None, "nothing before the horizon point");
}

#[test]
fn unchanged_totals_hold_their_value_between_points() {
    let mut h: Thinned<u64> = Thinned::default();
    h.push(1000, 5);
    h.push(9000, 7);
    assert_eq!(h.at(500), None);
    assert_eq!(h.at(1000), Some(&5));
    assert_eq!(h.at(8999), Some(&5));
    assert_eq!(h.at(20_000), Some(&7));
}

#[test]
fn tree_order_is_breadth_first_and_guards_pid_reuse() {
    let n = |pid, ppid, start_ns| TreeNode {
        pid,
        ppid,
        start_ns,
        alive: true,
    };
    let nodes = vec![
        n(30, 20, 300),
        n(10, 1, 100),
        n(20, 10, 200),
        n(21, 10, 210),
        // Claims parent 10 but started before it: a reused pid's old child.
        n(40, 10, 50),
        n(99, 1, 5),
    ];
    let order: Vec<u32> = tree_order_of(&nodes, 10)
        .into_iter()
        .map(|i| nodes[i].pid)
        .collect();
    assert_eq!(order, vec![10, 20, 21, 30]);
    assert!(tree_order_of(&nodes, 12345).is_empty());
}

#[test]
fn dev_encoding() {
    assert_eq!(dev_string(254 << 20), "254:0");
    assert_eq!(dev_string((8 << 20) | 17), "8:17");
}

#[test]
fn totals_add_and_subtract_field_by_field() {
    let a = Totals {
        oncpu_ns: 5,
        gpu_memory_live_bytes: 10,
        main_thread_oncpu_ns: 1,
        ..Default::default()
    };
    let mut b = a;
    b.add(&a);
    assert_eq!(
        (b.oncpu_ns, b.gpu_memory_live_bytes, b.main_thread_oncpu_ns),
        (10, 20, 2)
    );
    assert_eq!(b.since(&a), a);
    assert_eq!(
        a.since(&b),
        Totals::default(),
        "a total that went down changes by 0"
    );
}

/// A thread blocked since before the window counts the whole window as blocked, though the
/// kernel accounts its wait only when it ends; a running thread counts no open span; the
/// window starts at the round nearest to what was asked.
#[test]
fn a_wait_in_progress_counts_in_windows_only() {
    let mut m = Model::new(1000, 60, 30, 100);
    // A live process (this one; start time unknown, so never matched to /proc's), and no
    // /proc liveness check in these few rounds.
    m.exit_events = true;
    let me = std::process::id();
    let key = ProcKey {
        tgid: me,
        _pad0: 0,
        proc_start_ns: 0,
    };
    let mut t = th(100, 1, 0);
    (t.tgid, t.proc_start_ns) = (me, 0);
    t.flags = thread_flags::BLOCKED;
    t.switch_out_ns = 1;
    // Rounds with jitter: 0, 1003, 2006, ...
    for r in 0..=10u64 {
        m.ingest(
            &RawRead {
                threads: vec![(me, t)],
                ..Default::default()
            },
            r * 1003,
        );
    }
    let w = m.window(&key, 5000).expect("window");
    assert_eq!(w.duration_ms, 5015, "the round nearest 5 s before");
    assert_eq!(
        w.offcpu_blocked_ns,
        5015 * 1_000_000,
        "blocked all the window"
    );
    assert_eq!(
        m.procs[&key].sched().offcpu_blocked_ns,
        0,
        "counters hold what ended"
    );
    assert_eq!(m.window_note(&[key], 5000), None);
    // On a CPU now: the span has ended (the kernel adds it at the switch-out).
    m.ingest(
        &RawRead {
            threads: vec![(me, t)],
            running: [me].into_iter().collect(),
            ..Default::default()
        },
        11 * 1003,
    );
    assert_eq!(m.window(&key, 5000).expect("window").offcpu_blocked_ns, 0);
    // Preempted: waiting for a CPU since its switch-out, seen first at the last round.
    t.flags = 0;
    t.switch_out_ns = 2;
    m.ingest(
        &RawRead {
            threads: vec![(me, t)],
            ..Default::default()
        },
        12 * 1003,
    );
    let w = m.window(&key, 5000).expect("window");
    assert_eq!(
        w.offcpu_preempted_ns,
        1003 * 1_000_000,
        "since the round before"
    );
    assert_eq!(w.runq_wait_ns, 1003 * 1_000_000);
    // Longer than the history: says so.
    let note = m.window_note(&[key], 60_000).expect("short");
    assert!(note.contains("60.0 s asked"), "{note}");
}

/// The timeline's intervals each hold their part of a wait in progress.
#[test]
fn a_wait_in_progress_fills_the_timeline() {
    let mut m = Model::new(1000, 60, 30, 100);
    m.exit_events = true;
    let me = std::process::id();
    let key = ProcKey {
        tgid: me,
        _pad0: 0,
        proc_start_ns: 0,
    };
    let mut t = th(100, 1, 0);
    (t.tgid, t.proc_start_ns) = (me, 0);
    t.flags = thread_flags::BLOCKED;
    t.switch_out_ns = 1;
    for r in 0..=4u64 {
        m.ingest(
            &RawRead {
                threads: vec![(me, t)],
                ..Default::default()
            },
            r * 1000,
        );
    }
    let tl = m.timeline(&[key], 3000);
    assert_eq!(tl.len(), 3);
    assert!(
        tl.iter().all(|p| p.offcpu_blocked_ns == 1_000_000_000),
        "{tl:?}"
    );
}
