//! Scheduler accounting: context switches, on-CPU time, run-queue wait.
use std::thread;

use ethand_tests::{
    Daemon, KernelSchedstat, ProbeState, SETTLE, find_proc, kernel_schedstat,
    kernel_schedstat_main, kernel_switches, measure, probe, serial,
};

use crate::workload;

/// Pipe ping-pong between two SCHED_BATCH threads pinned to one CPU: every round trip blocks
/// each thread once, so the switches grow by 2 per round trip, nearly all voluntary
/// (SCHED_BATCH keeps the woken thread from preempting the writer, which would turn half of
/// them into involuntary ones). ethand's figures must equal the kernel's own per-thread
/// counters (/proc/PID/task/*/status) exactly, and both threads must be listed.
pub fn assert_ping_pong(d: &Daemon, rounds: u64) {
    assert_ping_pong_waits_from(d, rounds, 90);
}

/// [`assert_ping_pong`], with ethand's run-queue wait at least `wait_lo_pct` % of the kernel's.
fn assert_ping_pong_waits_from(d: &Daemon, rounds: u64, wait_lo_pct: u64) {
    let mut w = workload(&["pingpong", &rounds.to_string()]);
    thread::sleep(SETTLE);
    let k0 = kernel_switches(w.pid);
    let ks0 = kernel_schedstat(w.pid);
    let before = d.snapshot(w.pid);
    w.go();
    thread::sleep(SETTLE);
    let k1 = kernel_switches(w.pid);
    let ks1 = kernel_schedstat(w.pid);
    let after = d.snapshot(w.pid);

    let (b, a) = (&before.total.sched, &after.total.sched);
    let vol = a.voluntary_switches - b.voluntary_switches;
    let invol = a.involuntary_switches - b.involuntary_switches;
    let blocked = a.offcpu_blocked_ns - b.offcpu_blocked_ns;
    let runq_wait = a.runq_wait_ns - b.runq_wait_ns;
    let kernel_wait: u64 = ks1.values().map(|k| k.run_delay_ns).sum::<u64>()
        - ks0.values().map(|k| k.run_delay_ns).sum::<u64>();
    // Per thread: the kernel's run_delay and runs after a wait against ethand's run-queue
    // wait and its count of waits (the histogram's total), so that a difference says which
    // thread and whether a wait was missed or mismeasured.
    let ethand_threads = |s: &ethand_snapshot::TreeSnapshot| {
        find_proc(s, w.pid)
            .threads
            .iter()
            .map(|t| {
                (
                    t.tid,
                    (
                        t.sched.runq_wait_ns,
                        t.sched.runq_wait_hist.iter().sum::<u64>(),
                    ),
                )
            })
            .collect::<std::collections::BTreeMap<u32, (u64, u64)>>()
    };
    let (e0, e1) = (ethand_threads(&before), ethand_threads(&after));
    let mut waits_counted = 0;
    let mut kernel_runs = 0;
    for (tid, k) in &ks1 {
        let k0 = ks0.get(tid).copied().unwrap_or_default();
        let (ew0, en0) = e0.get(tid).copied().unwrap_or_default();
        let (ew1, en1) = e1.get(tid).copied().unwrap_or_default();
        waits_counted += en1 - en0;
        kernel_runs += k.runs - k0.runs;
        eprintln!(
            "thread {tid}: kernel run_delay {} ns over {} runs; ethand run-queue wait {} ns over {} waits",
            k.run_delay_ns - k0.run_delay_ns,
            k.runs - k0.runs,
            ew1 - ew0,
            en1 - en0
        );
    }
    let kernel = (k1.0 - k0.0, k1.1 - k0.1);
    let mut tids: Vec<u32> = find_proc(&after, w.pid)
        .threads
        .iter()
        .filter(|t| t.alive)
        .map(|t| t.tid)
        .collect();
    tids.sort();
    let mut kernel_tids: Vec<u32> = std::fs::read_dir(format!("/proc/{}/task", w.pid))
        .expect("task dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    kernel_tids.sort();
    eprintln!(
        "observed: {rounds} round trips: ethand voluntary {vol}, involuntary {invol}, off-cpu blocked {blocked} ns; \
         kernel voluntary {}, involuntary {}; threads {tids:?} (kernel {kernel_tids:?}), total.threads {}; \
         run-queue wait {runq_wait} ns over {waits_counted} waits (kernel run_delay {kernel_wait} ns over {kernel_runs} runs)",
        kernel.0, kernel.1, after.total.threads
    );

    assert_eq!(
        (vol, invol),
        kernel,
        "ethand's (voluntary, involuntary) switches must equal the kernel's counters"
    );
    // Each round trip is two hand-offs, each a switch; a tick preemption of the writer before
    // it blocks turns that round's voluntary switch into an involuntary one.
    let (lo, hi) = (2 * rounds, 2 * rounds + 200);
    assert!(
        (lo..=hi).contains(&(vol + invol)),
        "switches: expected {lo}..={hi} for {rounds} round trips, got {vol} + {invol}"
    );
    assert!(
        vol + invol.min(200) >= lo,
        "voluntary switches: expected >= {lo} - involuntary ({invol}), got {vol}"
    );
    assert!(blocked > 0, "offcpu_blocked_ns did not grow");
    // Both threads share CPU 0, so every hand-off leaves the woken thread runnable until the
    // waker blocks: wake-to-run waits the kernel's run_delay counts. With the kernel's
    // charges ethand reads that run_delay at each switch-out: equal to the nanosecond. Timed
    // from wakeups instead (the fallback), the two are equal too, on the same run-queue
    // clock, except where a switch to a ping-pong thread came from a task whose tracepoints
    // this sandbox's kernel never reports (its agent's threads: switch_in_unseen): such a
    // wait is estimated from the kernel's on-CPU charge where there is one (which leaves out
    // steal and IRQ time), else lost. So within 1 % + 20 us above, at least wait_lo_pct below.
    let over = kernel_wait / 100 + 20_000;
    assert!(
        runq_wait <= kernel_wait + over,
        "run-queue wait {runq_wait} ns above the kernel's run_delay {kernel_wait} ns by more than {over} ns"
    );
    assert!(
        runq_wait >= kernel_wait / 100 * wait_lo_pct,
        "run-queue wait {runq_wait} ns below {wait_lo_pct} % of the kernel's run_delay {kernel_wait} ns"
    );
    assert!(
        waits_counted <= kernel_runs,
        "{waits_counted} run-queue waits counted, more than the kernel's {kernel_runs} runs after a wait"
    );
    assert_eq!(tids, kernel_tids, "live threads of {}", w.pid);
    assert_eq!(after.total.threads, 2, "total.threads");
    w.finish();
}

#[test]
fn context_switches_of_a_pipe_ping_pong() {
    let _serial = serial();
    let d = Daemon::start("switches", "");
    assert_ping_pong(&d, 2000);
}

/// A busy loop of 1 s CPU time: oncpu_ns grows by the workload's own measure (within 5%) and
/// by the kernel's sum_exec_runtime (/proc/PID/schedstat, within 2%).
#[test]
fn oncpu_time_matches_the_workloads_own_cpu_time() {
    let _serial = serial();
    let d = Daemon::start("oncpu", "");
    assert_oncpu(&d, 1000, (-0.02, 0.02));
}

/// Runs a busy loop of `ms` of CPU time; ethand's on-CPU delta must be within 5% of the
/// workload's own measure (CLOCK_THREAD_CPUTIME_ID) and within `vs_kernel` (relative: low,
/// high) of the kernel's sum_exec_runtime delta.
fn assert_oncpu(d: &Daemon, ms: u64, vs_kernel: (f64, f64)) {
    let mut w = workload(&["cpu", &ms.to_string()]);
    thread::sleep(SETTLE);
    let k0 = kernel_schedstat_main(w.pid).oncpu_ns;
    let before = d.snapshot(w.pid);
    let done = w.go();
    thread::sleep(SETTLE);
    let k1 = kernel_schedstat_main(w.pid).oncpu_ns;
    // The workload is blocked now: k1 is final. Give the daemon a few more collections
    // (its loop can lag behind on a loaded CI machine) before reading its figure.
    thread::sleep(SETTLE);
    let after = d.snapshot(w.pid);

    let own = done.u64("cpu_ns");
    let oncpu = find_proc(&after, w.pid).sched.oncpu_ns - find_proc(&before, w.pid).sched.oncpu_ns;
    let kernel = k1 - k0;
    let rel = |x: u64| (x as f64 - own as f64) / own as f64;
    eprintln!(
        "observed: workload CPU {own} ns; ethand oncpu delta {oncpu} ns ({:+.2}%); kernel schedstat delta {kernel} ns ({:+.2}%)",
        100.0 * rel(oncpu),
        100.0 * rel(kernel)
    );
    assert!(own >= ms * 1_000_000, "workload burnt only {own} ns");
    assert!(
        rel(oncpu).abs() <= 0.05,
        "oncpu_ns delta {oncpu} is not within 5% of the workload's CPU time {own}"
    );
    let vs = (oncpu as f64 - kernel as f64) / kernel as f64;
    assert!(
        (vs_kernel.0..=vs_kernel.1).contains(&vs),
        "oncpu_ns delta {oncpu} is {:+.2}% off the kernel's sum_exec_runtime delta {kernel}: allowed {:+.0}% to {:+.0}%",
        100.0 * vs,
        100.0 * vs_kernel.0,
        100.0 * vs_kernel.1
    );
    w.finish();
}

/// A busy loop is switched out rarely (never while it has a CPU to itself): the run in
/// progress counts at each collection, not only at its switch-out. Where the kernel's run
/// count (/proc/PID/schedstat) shows the loop was not switched out for 1.5 collection
/// intervals after a reading, a collection read the run in progress, and ethand's total must
/// reach that reading (less 10 ms: /proc
/// is current to the last tick). Without the run in progress it would stop at the loop's
/// last switch-out, before the reading. Every total must stay below the kernel's later one.
#[test]
fn a_run_in_progress_counts_before_its_switch_out() {
    let _serial = serial();
    let d = Daemon::start("running", "");
    let b = crate::ancestry::bash("while :; do :; done");
    let pid = b.0.id();
    thread::sleep(std::time::Duration::from_secs(1));
    let mut uninterrupted = 0;
    for _ in 0..60 {
        let KernelSchedstat {
            oncpu_ns: k0,
            runs: runs0,
            ..
        } = kernel_schedstat_main(pid);
        thread::sleep(std::time::Duration::from_millis(
            ethand_tests::INTERVAL_MS * 3 / 2,
        ));
        let KernelSchedstat {
            oncpu_ns: k_mid,
            runs: runs_mid,
            ..
        } = kernel_schedstat_main(pid);
        let t = d.snapshot(pid);
        let k1 = kernel_schedstat_main(pid).oncpu_ns;
        let oncpu = find_proc(&t, pid).sched.oncpu_ns;
        assert!(
            oncpu <= k1,
            "ethand {oncpu} ns is past the kernel's {k1} ns"
        );
        if runs_mid != runs0 {
            continue;
        }
        uninterrupted += 1;
        eprintln!(
            "observed: one run from kernel reading {k0} ns to {k_mid} ns; ethand {oncpu} ns ({:+.1} ms)",
            (oncpu as f64 - k0 as f64) / 1e6
        );
        assert!(
            oncpu + 10_000_000 >= k0,
            "ethand's {oncpu} ns is {:.1} ms short of the kernel's {k0} ns, read earlier in the same run",
            (k0 - oncpu) as f64 / 1e6
        );
        if uninterrupted == 3 {
            return;
        }
    }
    assert!(
        uninterrupted >= 1,
        "the loop was switched out within every 300 ms span: nothing to compare"
    );
}

/// A thread made after `go` sleeps 20 x 10 ms: every span it spent off CPU, but its last,
/// lies in the wall time it measured itself, so its off-CPU (blocked + preempted) plus on-CPU
/// time must add up to that wall time, its blocked time must cover the sleep asked for, and
/// its on-CPU time must equal its own CPU clock.
#[test]
fn offcpu_time_of_a_sleeping_thread() {
    let _serial = serial();
    let d = Daemon::start("offcpu", "");
    assert_sleeper(&d, (0, 200_000));
}

/// Runs `sleeper 20 10` and checks the sleeping thread's figures against its own clocks.
/// `oncpu_slack_ns`: how far ethand's on-CPU time may be below and above the thread's CPU
/// clock (read just before it blocked for the last time, so a few µs below ethand's).
///
/// Where the switch-in does the accounting (the fallback), a switch-in the kernel never
/// reports (`switch_in_unseen`: this sandbox's agent threads) loses the off-CPU span it ends
/// and the run it begins: each such event the daemon counted meanwhile (daemon-wide, so an
/// upper bound for this thread) allows one sleep and 1 ms of CPU less. With the kernel's
/// charges the counter stays 0 and the bounds are exact.
fn assert_sleeper(d: &Daemon, oncpu_slack_ns: (u64, u64)) {
    let (n, ms) = (20u64, 10u64);
    let unseen = || {
        crate::metrics::sample(
            &d.metrics(),
            "ethand_bpf_dropped_events_total",
            &[("reason", "switch_in_unseen")],
        ) as u64
    };
    let unseen0 = unseen();
    let mut w = workload(&["sleeper", &n.to_string(), &ms.to_string()]);
    let m = measure(d, &mut w);
    let unseen = unseen() - unseen0;
    let (lost_off, lost_on) = (unseen * (ms + 1) * 1_000_000, unseen * 1_000_000);
    let tid = m.done.u64("tid") as u32;
    let wall = m.done.u64("wall_ns");
    let cpu = m.done.u64("cpu_ns");
    let asked = m.done.u64("asked_ns");
    let t = find_proc(&m.after, w.pid)
        .threads
        .iter()
        .find(|t| t.tid == tid)
        .unwrap_or_else(|| panic!("sleeping thread {tid} not in the snapshot"));
    let s = &t.sched;
    let accounted = s.offcpu_blocked_ns + s.offcpu_preempted_ns + s.oncpu_ns;
    eprintln!(
        "observed: thread {tid}: wall {wall} ns, cpu {cpu} ns, asked sleep {asked} ns; ethand blocked {} ns, \
         preempted {} ns, on-CPU {} ns: sum {accounted} ns ({:+} ns against the wall time); switches {} + {}; \
         switch_in_unseen {unseen} (daemon-wide)",
        s.offcpu_blocked_ns,
        s.offcpu_preempted_ns,
        s.oncpu_ns,
        accounted as i64 - wall as i64,
        s.voluntary_switches,
        s.involuntary_switches
    );
    // Each sleep is off CPU from the switch-out after its timer was armed to the run after
    // it fired: at least the time asked, less the few µs between arming and switching out.
    assert!(
        s.offcpu_blocked_ns + n * 100_000 + lost_off >= asked,
        "blocked {} ns does not cover the {asked} ns of sleep asked for",
        s.offcpu_blocked_ns
    );
    // The sum spans the thread's creation to its last switch-out: the wall time plus the
    // µs before its first instruction and after its last clock read; less the IRQ and steal
    // time of its runs, which the kernel does not charge to it (runs of µs here).
    let tol = 2_000_000 + wall / 100;
    assert!(
        accounted <= wall + tol && accounted + tol + lost_off + lost_on >= wall,
        "off-CPU + on-CPU {accounted} ns is not within {tol} ns of the thread's wall time {wall} ns"
    );
    assert!(
        s.voluntary_switches >= n,
        "{} voluntary switches for {n} sleeps",
        s.voluntary_switches
    );
    let (below, above) = oncpu_slack_ns;
    assert!(
        s.oncpu_ns + below + lost_on >= cpu && s.oncpu_ns <= cpu + above,
        "on-CPU {} ns against the thread's CPU clock {cpu} ns: allowed {below} ns below, {above} ns above",
        s.oncpu_ns
    );
    w.finish();
}

/// `probes.kernel_charges = false` forces the path of kernels whose BTF lacks
/// `se.sum_exec_runtime` and `sched_info`: sched_wakeup attached, on-CPU time timed from
/// switch to switch and run-queue waits from wakeup to switch-in, on the BTF and the classic
/// programs alike, each checked against the kernel's own counters. On-CPU time here is timed
/// on the run queue's clock, which counts the host's steal and IRQ time that the kernel does
/// not charge to the task, and a run whose switch-in the kernel never reports (this sandbox's
/// agent threads, `switch_in_unseen`) is lost: hence wider bounds than with the kernel's
/// charges.
#[test]
fn sched_timed_from_events_without_kernel_charges() {
    let _serial = serial();
    for (label, btf) in [("nocharges-btf", true), ("nocharges-classic", false)] {
        let d = Daemon::start(
            label,
            &format!("[probes]\nkernel_charges = false\nprefer_btf = {btf}\n"),
        );
        let status = d.status();
        let p = probe(&status.probes, "sched_wakeup");
        let at = if btf {
            "tp_btf/sched_wakeup"
        } else {
            "tracepoint/sched/sched_wakeup"
        };
        eprintln!(
            "observed: {label}: sched_wakeup {:?} at {:?}",
            p.state, p.attach_point
        );
        assert_eq!(
            (p.state, p.attach_point.as_str()),
            (ProbeState::Attached, at),
            "{label}: sched_wakeup must be attached when waits are timed from wakeups: {p:?}"
        );
        assert_ping_pong_waits_from(&d, 1000, 50);
        assert_oncpu(&d, 300, (-0.10, 0.05));
        // Timed on the run-queue clock from switch to switch: steal and IRQ time included.
        assert_sleeper(&d, (0, 1_000_000));
    }
}

/// Two children pinned to one CPU, each burning 0.5 s of CPU: each waits for the CPU about as
/// long as it runs. ethand's run-queue wait must be large, in the histogram, and match the
/// kernel's run_delay (/proc/PID/schedstat read by each child when done).
#[test]
fn runq_wait_of_two_busy_children_on_one_cpu() {
    let _serial = serial();
    let d = Daemon::start("runq", "");
    let mut w = workload(&["runq", "500"]);
    let m = measure(&d, &mut w);
    for i in 0..2 {
        let pid = m.done.u64(&format!("child{i}")) as u32;
        let kernel_wait = m.done.u64(&format!("child{i}_runq_ns"));
        let kernel_cpu = m.done.u64(&format!("child{i}_oncpu_ns"));
        let s = &find_proc(&m.after, pid).sched;
        let hist: u64 = s.runq_wait_hist.iter().sum();
        eprintln!(
            "observed: child {pid}: ethand runq_wait {} ns (kernel {kernel_wait}), oncpu {} ns (kernel {kernel_cpu}), \
             runq waits in histogram {hist}, involuntary switches {}",
            s.runq_wait_ns, s.oncpu_ns, s.involuntary_switches
        );
        assert!(
            s.runq_wait_ns > 100_000_000,
            "child {pid}: runq_wait_ns {} <= 100 ms",
            s.runq_wait_ns
        );
        assert!(hist > 0, "child {pid}: empty runq_wait_hist");
        assert!(
            s.involuntary_switches > 0,
            "child {pid}: no involuntary switches"
        );
        let tol = kernel_wait / 10 + 5_000_000;
        assert!(
            s.runq_wait_ns.abs_diff(kernel_wait) <= tol,
            "child {pid}: runq_wait_ns {} vs kernel run_delay {kernel_wait}: off by more than {tol} ns",
            s.runq_wait_ns
        );
    }
    w.finish();
}
