use super::*;
use ethand_snapshot::{DropCounter, GpuLevel, SelfStatus};

fn fixture(name: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-h200")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("JSON")
}

/// Real snapshots of an H200 (tests/fixtures/gpu-h200) on the terminal: the GPU section,
/// no raw control or hidden character, and the loss warning when there were losses.
#[test]
fn real_h200_snapshots_on_the_terminal() {
    let v = fixture("gpu-check-snapshots.json");
    for (label, pair) in v.as_object().expect("object") {
        let mut t: TreeSnapshot = serde_json::from_value(pair["after"].clone()).expect("tree");
        let out = snapshot(&t);
        assert!(
            out.contains(&format!("process tree of {}", t.root_pid)),
            "{label}"
        );
        assert!(
            !out.chars().any(|c| c != '\n' && text::needs_escape(c)),
            "{label}: raw control or hidden characters"
        );
        assert!(
            !out.contains("WARNING"),
            "{label}: a warning without losses"
        );
        t.dropped_events = vec![DropCounter {
            reason: "threads_full".into(),
            count: 12,
            loss: true,
        }];
        let warned = snapshot(&t);
        assert!(
            warned.contains("WARNING: 12 events were lost node-wide")
                && warned.contains("threads_full 12"),
            "{label}: {warned}"
        );
    }
    let s: SelfStatus =
        serde_json::from_value(fixture("status-after-workloads.json")).expect("status");
    let out = status(&s);
    assert!(out.contains("CAP_PERFMON"), "{out}");
    assert!(out.contains("runs as: ethand (uid "), "{out}");
    assert!(out.contains("/metrics connections: "), "{out}");
}

#[test]
fn a_cut_command_line_says_so() {
    let v = fixture("gpu-check-snapshots.json");
    let mut t: TreeSnapshot = serde_json::from_value(v["cupy"]["after"].clone()).expect("tree");
    t.processes[0].cmdline = vec!["python3".into(), "x".repeat(4000)];
    t.processes[0].cmdline_truncated = true;
    assert!(snapshot(&t).contains(" [truncated at 4 KiB]\n"));
}

/// A GPU tree whose figures were taken at level `calls`: launches not counted.
fn tree_at_calls() -> TreeSnapshot {
    use ethand_snapshot::gpu::{GpuDerived, GpuProcessStats, GpuTimedCalls};
    let g = GpuProcessStats {
        launches: None,
        sync: GpuTimedCalls {
            calls: 40,
            time_ns: 1_000_000_000,
            timed_calls: 40,
        },
        ..Default::default()
    };
    TreeSnapshot {
        source: ethand_snapshot::SnapshotSource::Daemon,
        root_pid: 10,
        processes: vec![ProcessSnapshot {
            pid: 10,
            comm: "train".into(),
            alive: true,
            gpu: Some(g.clone()),
            ..Default::default()
        }],
        total: ethand_snapshot::TreeTotals {
            processes: 1,
            gpu: Some(g),
            gpu_derived: Some(GpuDerived {
                window_ms: 5000,
                syncs_per_second: 8.0,
                sync_blocked_ratio: 0.2,
                ..Default::default()
            }),
            ..Default::default()
        },
        gpu_level: Some(GpuLevel::Calls),
        ..Default::default()
    }
}

fn not_evaluated() -> Vec<ethand_snapshot::diagnosis::NotEvaluated> {
    vec![
        ethand_snapshot::diagnosis::NotEvaluated {
            rule: "launch_bound".into(),
            title: "Kernel launch overhead".into(),
            missing: vec!["gpu.launches_per_second".into()],
            how: "count launches: `ethand level process`".into(),
        },
        ethand_snapshot::diagnosis::NotEvaluated {
            rule: "gpm\u{1b}[31m".into(),
            title: "Low SM \u{202e}activity".into(),
            missing: vec![
                "gpu.sm_activity_ratio".into(),
                "gpu.dram_bandwidth_ratio".into(),
            ],
            how: "a GPU with GPM (Hopper or newer)".into(),
        },
    ]
}

/// Launches are "not counted at level calls" only when not counted (never a 0); the
/// launch sample, the sync rate and the GPM ratios that were measured are printed.
#[test]
fn launches_not_counted_and_the_launch_sample() {
    use ethand_snapshot::gpu::{LaunchSample, LaunchSampleProcess};
    let mut t = tree_at_calls();
    let out = snapshot(&t);
    assert!(
        out.contains("launches and device-to-device async copies not counted at level calls"),
        "{out}"
    );
    assert!(!out.contains("launches 0"), "{out}");
    assert!(!out.contains("launches/s"), "{out}");
    assert!(out.contains("8.0 syncs/s"), "{out}");
    assert!(!out.contains("GPM"), "no GPM ratio measured: {out}");
    assert!(!out.contains("launch sample"), "{out}");

    t.launch_sample = Some(LaunchSample {
        method: "uprobes on cuLaunchKernel*\u{1b}[2J".into(),
        duration_ms: 2000,
        launches: Some(2468),
        launches_per_second: Some(1234.0),
        processes: vec![LaunchSampleProcess {
            pid: 10,
            launches: 2468,
        }],
        notes: vec!["pid 11: no runtime library mapped".into()],
        ..Default::default()
    });
    if let Some(d) = t.total.gpu_derived.as_mut() {
        d.sm_activity_ratio = Some(0.75);
        d.dram_bandwidth_ratio = Some(0.125);
    }
    let out = snapshot(&t);
    assert!(
        out.contains(
            "  launch sample: 1234 launches/s, counted on demand over 2.0s for this snapshot\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("    how: uprobes on cuLaunchKernel*\\u{1b}[2J\n"),
        "{out}"
    );
    assert!(out.contains("    pid 10: 2468 launches\n"), "{out}");
    assert!(
        out.contains("    pid 11: no runtime library mapped\n"),
        "{out}"
    );
    assert!(
        out.contains("  GPU (GPM, window mean): SM activity 75%, DRAM bandwidth 12%\n"),
        "{out}"
    );
    assert!(!out.contains('\u{1b}'), "raw escape: {out}");

    // Counted (level process): a 0 is a 0.
    let mut t = tree_at_calls();
    t.gpu_level = Some(GpuLevel::Process);
    for g in [&mut t.processes[0].gpu, &mut t.total.gpu] {
        let g = g.as_mut().unwrap();
        g.launches = Some(0);
        g.graph_launches = Some(0);
    }
    t.total.gpu_derived.as_mut().unwrap().launches_per_second = Some(0.0);
    let out = snapshot(&t);
    assert!(
        out.contains("  launches 0 (graph launches 0), api errors 0"),
        "{out}"
    );
    assert!(out.contains("last 5s: 0 launches/s, 8.0 syncs/s"), "{out}");
    assert!(!out.contains("not counted"), "{out}");
}

/// Rules that could not run: never "no bottleneck found", and each is listed with what it
/// lacks and how to get it, escaped.
#[test]
fn rules_that_could_not_run_are_not_a_clean_bill() {
    let mut t = tree_at_calls();
    assert!(snapshot(&t).contains("DIAGNOSIS: no bottleneck found by the rules\n"));
    t.not_evaluated = not_evaluated();
    for out in [snapshot(&t), diagnosis(&t)] {
        assert!(!out.contains("no bottleneck found"), "{out}");
        assert!(
            out.contains(
                "DIAGNOSIS: no finding among the rules that could run; 2 could not (below)\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "Could not run: launch_bound (Kernel launch overhead): missing gpu.launches_per_second; count launches: `ethand level process`\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "Could not run: gpm\\u{1b}[31m (Low SM \\u{202e}activity): missing gpu.sm_activity_ratio, gpu.dram_bandwidth_ratio; a GPU with GPM (Hopper or newer)\n"
            ),
            "{out}"
        );
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{202e}'),
            "raw control or hidden characters: {out}"
        );
    }

    // With findings: the findings, then the rules that could not run.
    t.findings = vec![ethand_snapshot::diagnosis::Finding {
        id: "sync_heavy".into(),
        title: "Synchronization heavy".into(),
        severity: ethand_snapshot::diagnosis::Severity::Warning,
        explanation: "The host waits.".into(),
        ..Default::default()
    }];
    t.not_evaluated.truncate(1);
    let out = diagnosis(&t);
    assert!(
        out.starts_with("DIAGNOSIS (1 finding, highest impact first)\n"),
        "{out}"
    );
    let f = out
        .find("1. [warning] Synchronization heavy")
        .expect("finding");
    let n = out
        .find("NOT EVALUATED (1 rule could not run: a signal was not measured)\nCould not run: launch_bound")
        .expect("not evaluated section");
    assert!(f < n, "{out}");
}

/// The workload line names pod, container (short id), job and rank of world size.
#[test]
fn the_workload_line() {
    let mut w = WorkloadIdentity {
        container_runtime: Some("containerd".into()),
        container_id: Some("0123456789abcdef0123".into()),
        container: Some("pytorch".into()),
        pod: Some("trainer-0".into()),
        namespace: Some("ml".into()),
        job_id: Some("job-42".into()),
        rank: Some(3),
        env: [("WORLD_SIZE".to_string(), "8".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(
        workload(&w),
        "pod ml/trainer-0 container pytorch (containerd 0123456789ab) job job-42 rank 3/8"
    );
    w.rank_source = Some("nccl".into());
    w.env.clear();
    assert!(workload(&w).ends_with(" rank 3 (rank from NCCL)"));
    assert_eq!(workload(&WorkloadIdentity::default()), "unknown");
}

/// A shell loop's short-lived children: one line per command in NOW and in LIFETIME, with
/// their sums; the root and the live children keep their own lines.
#[test]
fn exited_children_collapse_per_command() {
    use ethand_snapshot::{SchedStats, WindowStats};
    let window = |oncpu_ns| {
        Some(WindowStats {
            duration_ms: 5000,
            oncpu_ns,
            ..Default::default()
        })
    };
    let proc = |pid, comm: &str, alive, oncpu_ns| ProcessSnapshot {
        pid,
        comm: comm.into(),
        alive,
        sched: SchedStats {
            oncpu_ns,
            ..Default::default()
        },
        window: window(oncpu_ns),
        ..Default::default()
    };
    let mut processes = vec![proc(10, "sh", true, 0), proc(11, "worker", true, 0)];
    processes.extend((0..38).map(|i| proc(100 + i, "bash", false, 2_000_000)));
    processes.extend((0..5).map(|i| proc(200 + i, "readlink", false, 2_000_000)));
    processes.push(proc(300, "sed", false, 0));
    let t = TreeSnapshot {
        source: ethand_snapshot::SnapshotSource::Daemon,
        root_pid: 10,
        processes,
        ..Default::default()
    };
    let out = snapshot(&t);
    // 44 exited x 2 ms (but sed's 0) = 86 ms over 5 s.
    assert!(
        out.contains("  exited: 38 x bash, 5 x readlink, sed (pid 300): 0.02 cores\n"),
        "{out}"
    );
    assert!(
        out.contains("  exited: 38 x bash, 5 x readlink, sed (pid 300): cpu 0.086s, syscalls 0\n"),
        "{out}"
    );
    assert!(!out.contains("100     bash"), "{out}");
    assert_eq!(out.matches("11      worker").count(), 2, "{out}");
}

/// The kernel view of a real recording (tests/fixtures/gpu-activity, a PyTorch loop on an
/// H200): its kernels by type, each with its type, no raw control character.
#[test]
fn real_gpu_activity_on_the_terminal() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-activity/h200-torch-injected.json");
    let mut t: TreeSnapshot =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("tree");
    // The recording predates the types: give its kernels theirs, as the daemon now does.
    let a = t.gpu_activity.as_mut().expect("gpu_activity");
    for k in a.processes[0].kernels.iter_mut() {
        k.class = ethand_snapshot::kernels::KernelClass::of(k.name.as_deref().unwrap_or(""));
    }
    let out = snapshot(&t);
    assert!(out.contains("GPU ACTIVITY"), "{out}");
    assert!(
        out.contains("[gemm] _ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm")
            && out.contains("[gemm] nvjet_sm90_tst")
            && out.contains("[elementwise]")
            && out.contains("[memory]"),
        "{out}"
    );
    assert!(
        out.contains("GB/s") || out.contains("GiB/s"),
        "copy bandwidth: {out}"
    );
    assert!(!out.chars().any(|c| c != '\n' && text::needs_escape(c)));
}

/// Launch call sites: each with its place, source, kernels and GPU time; the kernels not
/// joined said apart; names that are the process's escaped.
#[test]
fn launch_sites_on_the_terminal() {
    use ethand_snapshot::{
        kernels::{KernelStat, LaunchSite, LaunchSites},
        stacks::{Frame, FrameKind},
    };
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/gpu-activity/h200-torch-injected.json");
    let mut t: TreeSnapshot =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("tree");
    let a = t.gpu_activity.as_mut().expect("gpu_activity");
    a.processes[0].launch_sites = Some(LaunchSites {
        launches: 9000,
        kernels: 8010,
        kernels_joined: 8000,
        kernels_without_queued_time: 10,
        sites: vec![LaunchSite {
            frames: vec![Frame {
                kind: FrameKind::Python,
                function: Some("step\x1b[2J".into()),
                file: Some("train.py".into()),
                line: Some(41),
                ..Frame::default()
            }],
            source: Some("y = model(x)".into()),
            kernels: 8000,
            gpu_ns: 35_000_000,
            top: vec![KernelStat {
                name: Some("ampere_sgemm_128x64_nn".into()),
                count: 8000,
                gpu_ns: 35_000_000,
                ..KernelStat::default()
            }],
        }],
        ..LaunchSites::default()
    });
    let out = snapshot(&t);
    assert!(
        out.contains("launched from (8,000 of 8,010 kernels joined to their launch call (10 without a queued time (CUDA graphs)))"),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.contains("train.py:41"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("35.0 ms") && line.contains("8000x") && line.contains("`y = model(x)`"),
        "{line}"
    );
    assert!(line.contains("[ampere_sgemm_128x64_nn x8000]"), "{line}");
    assert!(!out.chars().any(|c| c != '\n' && text::needs_escape(c)));
}
