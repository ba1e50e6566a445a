//! Every built-in rule against a synthetic tree that must fire it and one that must not.
//! (End-to-end tests with real workloads are in tests/tests/e2e/diagnose.rs.)
use ethand_snapshot::{
    BlockStats, GpuLevel, InFlightSyscall, NetStats, ProcessSnapshot, SchedStats, SyscallRow,
    ThreadNow, ThreadSnapshot, TreeSnapshot, WindowStats,
    devices::{DevicesSnapshot, GpuDevice},
    gpu::{CommRank, GpuDerived, GpuMemoryStats, GpuProcessStats, GpuSymbolStats, GpuTimedCalls},
};

use super::*;

const S: u64 = 1_000_000_000;

fn rules() -> Vec<Rule> {
    parse_rules(BUILTIN_RULES, "built-in")
        .unwrap()
        .into_iter()
        .filter_map(|(_, r)| r)
        .collect()
}

fn ids(t: &TreeSnapshot) -> Vec<String> {
    diagnose(t, &rules()).into_iter().map(|f| f.id).collect()
}

fn thread(tid: u32, on: u64, blocked: u64, preempted: u64) -> ThreadSnapshot {
    ThreadSnapshot {
        tid,
        comm: "t".into(),
        alive: true,
        sched: SchedStats {
            oncpu_ns: on,
            offcpu_blocked_ns: blocked,
            offcpu_preempted_ns: preempted,
            ..Default::default()
        },
        now: None,
    }
}

/// A healthy single-threaded process over a 10 s window: 50 % busy, no waiting.
fn healthy() -> TreeSnapshot {
    let p = ProcessSnapshot {
        pid: 100,
        comm: "train".into(),
        alive: true,
        threads: vec![thread(100, 5 * S, 5 * S, 0)],
        sched: SchedStats {
            oncpu_ns: 5 * S,
            voluntary_switches: 1000,
            involuntary_switches: 10,
            ..Default::default()
        },
        window: Some(WindowStats {
            duration_ms: 10_000,
            oncpu_ns: 5 * S,
            ..Default::default()
        }),
        ..Default::default()
    };
    tree(vec![p])
}

fn tree(processes: Vec<ProcessSnapshot>) -> TreeSnapshot {
    let mut total = ethand_snapshot::TreeTotals::default();
    for p in &processes {
        total.sched.add(&p.sched);
        total.net.add(&p.net);
        if let Some(g) = &p.gpu {
            total.gpu.get_or_insert_with(Default::default).add(g);
        }
    }
    TreeSnapshot {
        source: ethand_snapshot::SnapshotSource::Daemon,
        root_pid: processes[0].pid,
        processes,
        total,
        node_cpus: Some(4),
        ..Default::default()
    }
}

fn with_gpu(
    mut t: TreeSnapshot,
    g: GpuProcessStats,
    w: WindowStats,
    util: Option<f64>,
) -> TreeSnapshot {
    t.processes[0].gpu = Some(g.clone());
    t.processes[0].window = Some(WindowStats {
        duration_ms: 10_000,
        ..w
    });
    t.total.gpu = Some(g);
    t.total.gpu_derived = Some(GpuDerived {
        window_ms: 10_000,
        device_utilization_ratio: util,
        device_idle_ratio: util.map(|u| 1.0 - u),
        ..Default::default()
    });
    t
}

fn launches(n: u64) -> GpuProcessStats {
    GpuProcessStats {
        launches: Some(n),
        ..Default::default()
    }
}

/// A GPU process over a 10 s window at the default level (`calls`): its main thread busy
/// `main` of the time, `syncs` and `h2d` copies per second, the GPU's SMs busy `sm` (GPM),
/// and launches per second from the snapshot's on-demand sample (None: no sample).
fn calls_level(
    main: f64,
    syncs: u64,
    h2d: u64,
    sm: f64,
    launches_per_s: Option<f64>,
) -> TreeSnapshot {
    let g = GpuProcessStats {
        sync: GpuTimedCalls {
            calls: syncs * 10,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut t = with_gpu(
        healthy(),
        g,
        WindowStats {
            oncpu_ns: (main * 10.0 * S as f64) as u64,
            main_thread_oncpu_ns: Some((main * 10.0 * S as f64) as u64),
            gpu_sync_calls: syncs * 10,
            gpu_copy_h2d_calls: h2d * 10,
            gpu_copy_h2d_bytes: h2d * 10 * 16384,
            ..Default::default()
        },
        Some(0.9),
    );
    t.gpu_level = Some(GpuLevel::Calls);
    let d = t.total.gpu_derived.as_mut().unwrap();
    // A GPU with GPM (Hopper): its pipes too, bf16 work on the tensor cores.
    d.sm_activity_ratio = Some(sm);
    d.tensor_activity_ratio = Some(sm / 2.0);
    d.fp32_activity_ratio = Some(sm / 10.0);
    t.launch_sample = launches_per_s.map(|r| ethand_snapshot::gpu::LaunchSample {
        duration_ms: 2000,
        launches: Some((r * 2.0) as u64),
        launches_per_second: Some(r),
        processes: vec![ethand_snapshot::gpu::LaunchSampleProcess {
            pid: 100,
            launches: (r * 2.0) as u64,
        }],
        ..Default::default()
    });
    t
}

fn top(t: &TreeSnapshot) -> Option<String> {
    diagnose(t, &rules())
        .into_iter()
        .find(|f| f.severity != ethand_snapshot::diagnosis::Severity::Info)
        .map(|f| f.id)
}

#[test]
fn healthy_tree_has_no_findings() {
    assert!(ids(&healthy()).is_empty(), "{:?}", ids(&healthy()));
    // A healthy GPU process: SMs busy, a sync every few steps, a moderate launch rate.
    let t = calls_level(0.5, 5, 0, 0.85, Some(3000.0));
    let (f, ne) = evaluate(&t, &rules());
    assert!(f.is_empty(), "{f:?}");
    assert!(ne.is_empty(), "{ne:?}");
}

/// At `calls` without a launch sample the launch-based rules cannot run: the snapshot says
/// which and why instead of "nothing found"; a CPU-only tree is not "not evaluated".
#[test]
fn rules_without_their_signals_are_listed_not_silent() {
    let t = calls_level(0.95, 5, 0, 0.05, None);
    let (f, ne) = evaluate(&t, &rules());
    let missing: Vec<&str> = ne.iter().map(|n| n.rule.as_str()).collect();
    for id in ["input_pipeline_stall", "launch_bound", "gpu_underutilized"] {
        assert!(missing.contains(&id), "{id} not listed: {ne:?}");
    }
    let lb = ne.iter().find(|n| n.rule == "launch_bound").unwrap();
    assert_eq!(lb.missing, vec!["gpu.launches_per_second"]);
    assert!(lb.how.contains("level process"), "{}", lb.how);
    assert!(!f.iter().any(|x| x.id == "input_pipeline_stall"), "{f:?}");
    // No GPM and no NVML: every rule on GPU activity says so.
    let mut blind = calls_level(0.95, 5, 0, 0.05, Some(1000.0));
    let d = blind.total.gpu_derived.as_mut().unwrap();
    d.sm_activity_ratio = None;
    d.tensor_activity_ratio = None;
    d.fp32_activity_ratio = None;
    d.device_utilization_ratio = None;
    d.device_idle_ratio = None;
    let (_, ne) = evaluate(&blind, &rules());
    let sync = ne
        .iter()
        .find(|n| n.rule == "excessive_sync")
        .expect("listed");
    assert!(sync.how.contains("NVML"), "{}", sync.how);
    // A process that never touches a GPU: GPU rules do not apply, nothing is listed.
    let (_, ne) = evaluate(&healthy(), &rules());
    assert!(ne.is_empty(), "{ne:?}");
}

/// Preprocessing in the training process: main thread busy, SMs idle, a modest launch rate.
#[test]
fn input_pipeline_stall() {
    let t = calls_level(0.9, 30, 30, 0.02, Some(1500.0));
    assert_eq!(
        top(&t).as_deref(),
        Some("input_pipeline_stall"),
        "{:?}",
        diagnose(&t, &rules())
    );
    let f = diagnose(&t, &rules());
    assert!(f[0].advice[0].contains("num_workers"), "{:?}", f[0].advice);
    // A busy GPU does not fire it.
    let busy = calls_level(0.9, 30, 30, 0.9, Some(1500.0));
    assert!(!ids(&busy).contains(&"input_pipeline_stall".to_string()));
    // An idle main thread (waiting on nothing we can see) does not either.
    let idle = calls_level(0.1, 30, 30, 0.02, Some(1500.0));
    assert!(!ids(&idle).contains(&"input_pipeline_stall".to_string()));
}

/// DataLoader workers busy, the main thread waiting for their batches, the GPU idle.
#[test]
fn input_workers_stall() {
    let mut t = calls_level(0.1, 10, 10, 0.02, Some(300.0));
    for i in 0..4u32 {
        t.processes.push(ProcessSnapshot {
            pid: 200 + i,
            ppid: 100,
            alive: true,
            window: Some(WindowStats {
                duration_ms: 10_000,
                oncpu_ns: 9 * S,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    assert_eq!(
        top(&t).as_deref(),
        Some("input_workers_stall"),
        "{:?}",
        diagnose(&t, &rules())
    );
    let f = diagnose(&t, &rules());
    assert!(
        !f.iter()
            .any(|x| x.id == "gpu_underutilized" || x.id == "input_pipeline_stall"),
        "{f:?}"
    );
    let ev: Vec<&str> = f[0].evidence.iter().map(|e| e.signal.as_str()).collect();
    assert!(ev.contains(&"cpu.workers"), "{ev:?}");
}

/// Hundreds of tiny kernels per step, rare syncs: launch-bound, with CUDA-graph advice; not an
/// input stall although the main thread is busy and the GPU idle.
#[test]
fn launch_bound() {
    let t = calls_level(0.99, 2, 0, 0.04, Some(90_000.0));
    assert_eq!(
        top(&t).as_deref(),
        Some("launch_bound"),
        "{:?}",
        diagnose(&t, &rules())
    );
    let f = diagnose(&t, &rules());
    assert!(
        f[0].advice.iter().any(|a| a.contains("reduce-overhead")),
        "{:?}",
        f[0].advice
    );
    assert!(!f.iter().any(|x| x.id == "input_pipeline_stall"), "{f:?}");
}

/// `.item()` after every tiny step: a sync every few launches. Excessive sync, not launch-bound
/// nor an input stall, even though launches run at tens of thousands per second.
#[test]
fn sync_storm_is_excessive_sync() {
    let t = calls_level(1.0, 14_000, 0, 0.05, Some(42_000.0));
    assert_eq!(
        top(&t).as_deref(),
        Some("excessive_sync"),
        "{:?}",
        diagnose(&t, &rules())
    );
    let f = diagnose(&t, &rules());
    assert!(
        !f.iter()
            .any(|x| x.id == "launch_bound" || x.id == "input_pipeline_stall"),
        "{f:?}"
    );
    assert!(f[0].advice[0].contains(".item()"), "{:?}", f[0].advice);
    // Syncs counted at `calls` decide it without any launch count.
    let no_sample = calls_level(1.0, 14_000, 0, 0.05, None);
    assert_eq!(top(&no_sample).as_deref(), Some("excessive_sync"));
    // A GPU kept busy makes waiting for it harmless.
    let busy = calls_level(1.0, 14_000, 0, 0.95, Some(42_000.0));
    assert!(!ids(&busy).contains(&"excessive_sync".to_string()));
}

/// PyTorch's pageable copies: each small cuMemcpyHtoDAsync followed by a stream sync.
#[test]
fn small_pageable_copies() {
    let t = calls_level(0.9, 6000, 6000, 0.03, Some(9000.0));
    assert_eq!(
        top(&t).as_deref(),
        Some("small_pageable_copies"),
        "{:?}",
        diagnose(&t, &rules())
    );
    let f = diagnose(&t, &rules());
    assert!(
        f[0].advice.iter().any(|a| a.contains("pin_memory")),
        "{:?}",
        f[0].advice
    );
    assert!(
        !f.iter()
            .any(|x| x.id == "excessive_sync" || x.id == "input_pipeline_stall"),
        "{f:?}"
    );
    // The same copies from pinned memory, not waited for: not this rule.
    let pinned = calls_level(0.5, 10, 6000, 0.5, Some(9000.0));
    assert!(!ids(&pinned).contains(&"small_pageable_copies".to_string()));
    // CuPy's synchronous copies (cuMemcpyHtoD_v2) count as waited for.
    let mut cupy = calls_level(0.9, 0, 6000, 0.03, Some(9000.0));
    let g = GpuProcessStats {
        symbols: vec![copy_symbol("cuMemcpyHtoD_v2", 60_000, 60_000 * 16384)],
        ..Default::default()
    };
    cupy.total.gpu = Some(g);
    assert_eq!(top(&cupy).as_deref(), Some("small_pageable_copies"));
}

fn copy_symbol(name: &str, calls: u64, bytes: u64) -> GpuSymbolStats {
    GpuSymbolStats {
        library: "libcuda".into(),
        symbol: name.into(),
        category: "copy".into(),
        direction: "host_to_device".into(),
        calls,
        bytes,
        ..Default::default()
    }
}

#[test]
fn gpu_memory_growth() {
    let g = GpuProcessStats {
        memory: vec![GpuMemoryStats {
            kind: "device".into(),
            allocs: 500,
            live_bytes: 2 << 30,
            ..Default::default()
        }],
        ..Default::default()
    };
    let t = with_gpu(
        healthy(),
        g.clone(),
        WindowStats {
            gpu_memory_growth_bytes: 500 << 20,
            ..Default::default()
        },
        None,
    );
    assert_eq!(ids(&t), vec!["gpu_memory_growth"]);
    let t2 = with_gpu(
        healthy(),
        g,
        WindowStats {
            gpu_memory_growth_bytes: 0,
            ..Default::default()
        },
        None,
    );
    assert!(ids(&t2).is_empty());
}

#[test]
fn cpu_contention() {
    let mut t = healthy();
    let w = t.processes[0].window.as_mut().unwrap();
    w.runq_wait_ns = 4 * S;
    assert!(
        ids(&t).contains(&"cpu_contention".to_string()),
        "{:?}",
        ids(&t)
    );
    // Half a core used, 0.9 wanted, 4 allowed: 1.8x with the CPUs to itself.
    let f = diagnose(&t, &rules())
        .into_iter()
        .find(|f| f.id == "cpu_contention");
    let est = f.and_then(|f| f.estimated_speedup).expect("an estimate");
    assert!((est - 1.8).abs() < 1e-9, "{est}");
    // Its affinity allows one CPU and it wants 0.9: still neighbours.
    t.processes[0].cpus_allowed = Some(1);
    assert!(ids(&t).contains(&"cpu_contention".to_string()));
    t.processes[0].window.as_mut().unwrap().runq_wait_ns = S / 100;
    assert!(ids(&t).is_empty());
}

#[test]
fn thread_oversubscription() {
    let cpus = 4u32; // node_cpus of `tree()`
    let mut t = healthy();
    // 4 threads per CPU, each running an eighth of the time and preempted the rest.
    t.processes[0].threads = (0..4 * cpus)
        .map(|i| thread(100 + i, S, 0, 7 * S))
        .collect();
    t.total.sched.voluntary_switches = 100;
    t.total.sched.involuntary_switches = 10_000;
    // Over the 10 s window its threads fill the 4 CPUs and want 16: self-inflicted.
    let w = t.processes[0].window.as_mut().unwrap();
    (w.oncpu_ns, w.runq_wait_ns) = (40 * S, 120 * S);
    let found = diagnose(&t, &rules());
    assert!(
        !ids(&t).contains(&"cpu_contention".to_string()),
        "{found:?}"
    );
    let f = found.iter().find(|f| f.id == "thread_oversubscription");
    assert_eq!(f.map(|f| f.estimated_speedup), Some(None), "{found:?}");
    assert!(
        ids(&t).contains(&"thread_oversubscription".to_string()),
        "{:?}",
        ids(&t)
    );
    // Many threads, but asleep: not oversubscribed.
    let w = t.processes[0].window.as_mut().unwrap();
    (w.oncpu_ns, w.runq_wait_ns) = (16 * S / 10, 0);
    t.processes[0].threads = (0..4 * cpus)
        .map(|i| thread(100 + i, S / 10, 8 * S, 0))
        .collect();
    assert!(!ids(&t).contains(&"thread_oversubscription".to_string()));
}

#[test]
fn disk_io_bound() {
    let mut t = healthy();
    let p = &mut t.processes[0];
    p.threads = vec![thread(100, S, 9 * S, 0)];
    p.syscalls.by_nr = vec![SyscallRow {
        nr: 17,
        name: "pread64".into(),
        count: 1000,
        errors: 0,
        time_ns: 8 * S,
    }];
    p.block = vec![BlockStats {
        op: "read".into(),
        ops: 1000,
        bytes: 1 << 30,
        service_ns: 6 * S,
        ..Default::default()
    }];
    p.window.as_mut().unwrap().block_read_bytes = 1 << 30;
    assert_eq!(ids(&t), vec!["disk_io_bound"]);
    // Reads from the page cache with a few from the disk (evicted pages): 4 MiB in the
    // window, but the disk busy 1 % of the time: no.
    t.processes[0].block[0].service_ns = S / 10;
    t.processes[0].window.as_mut().unwrap().block_read_bytes = 4 << 20;
    assert!(ids(&t).is_empty(), "{:?}", ids(&t));
    t.processes[0].block[0].service_ns = 6 * S;
    // Same time in read(), but from the page cache (no disk traffic): no.
    t.processes[0].window.as_mut().unwrap().block_read_bytes = 0;
    assert!(ids(&t).is_empty());
}

#[test]
fn network_retransmits() {
    let mut t = healthy();
    t.total.net = NetStats {
        tcp_retransmits: 50,
        tcp_tx_bytes: 10 << 20,
        ..Default::default()
    };
    assert_eq!(ids(&t), vec!["network_retransmits"]);
    t.total.net = NetStats {
        tcp_retransmits: 50,
        tcp_tx_bytes: 10 << 30,
        ..Default::default()
    };
    assert!(ids(&t).is_empty());
}

#[test]
fn collective_bound() {
    let t = with_gpu(
        healthy(),
        launches(10),
        WindowStats {
            collective_ns: 5 * S,
            ..Default::default()
        },
        None,
    );
    assert_eq!(ids(&t), vec!["collective_bound"]);
    let t2 = with_gpu(
        healthy(),
        launches(10),
        WindowStats {
            collective_ns: S / 2,
            ..Default::default()
        },
        None,
    );
    assert!(ids(&t2).is_empty());
}

#[test]
fn straggler_rank() {
    let rank = |pid: u32, r: u32, wait_s: u64| ProcessSnapshot {
        pid,
        comm: "python".into(),
        alive: true,
        gpu: Some(GpuProcessStats {
            launches: Some(1000),
            comm: Some(CommRank {
                library: "nccl".into(),
                rank: Some(r),
                nranks: 2,
            }),
            ..Default::default()
        }),
        window: Some(WindowStats {
            duration_ms: 10_000,
            gpu_sync_ns: wait_s * S,
            ..Default::default()
        }),
        ..Default::default()
    };
    let launcher = ProcessSnapshot {
        pid: 10,
        comm: "torchrun".into(),
        alive: true,
        ..Default::default()
    };
    let t = tree(vec![launcher.clone(), rank(11, 0, 6), rank(12, 1, 0)]);
    let f = diagnose(&t, &rules());
    // The fast rank's long syncs are explained by the straggler: not reported on their own.
    assert_eq!(
        f.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        vec!["straggler_rank"],
        "{f:?}"
    );
    let s = f
        .iter()
        .find(|f| f.id == "straggler_rank")
        .expect("straggler");
    let who = s
        .evidence
        .iter()
        .find(|e| e.signal == "ranks.straggler_rank")
        .unwrap();
    assert_eq!(who.value, 1.0, "rank 1 waits least: it is the slow one");
    let t2 = tree(vec![launcher, rank(11, 0, 1), rank(12, 1, 1)]);
    assert!(!ids(&t2).contains(&"straggler_rank".to_string()));
}

fn gpu_device(reasons: Vec<&str>, ecc: u64, xid: u64) -> DevicesSnapshot {
    DevicesSnapshot {
        gpus: vec![GpuDevice {
            index: 0,
            throttle_reasons: Some(reasons.into_iter().map(String::from).collect()),
            ecc_uncorrected_errors: Some(ecc),
            xid_errors: Some(xid),
            temperature_celsius: Some(90),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn gpu_throttling_and_errors() {
    let mut t = healthy();
    t.devices = gpu_device(vec!["hw_thermal_slowdown"], 0, 0);
    assert_eq!(ids(&t), vec!["gpu_throttling"]);
    t.devices = gpu_device(vec!["gpu_idle"], 0, 0);
    assert!(ids(&t).is_empty());
    // A fully loaded GPU at its software power cap is normal (seen on the H200 under matmuls).
    t.devices = gpu_device(vec!["sw_power_cap"], 0, 0);
    assert!(ids(&t).is_empty());
    t.devices = gpu_device(vec![], 2, 0);
    assert_eq!(ids(&t), vec!["gpu_errors"]);
    t.devices = gpu_device(vec![], 0, 1);
    assert_eq!(ids(&t), vec!["gpu_errors"]);
}

#[test]
fn xids_are_listed_with_their_code_meaning_and_process() {
    use ethand_snapshot::gpu::{ProcessDeviceUsage, ProcessXid};
    let mut t = healthy();
    t.devices = gpu_device(vec![], 0, 3);
    t.devices.gpus[0].xid_errors_by_code = [(79, 1), (13, 2)].into();
    t.processes[0].devices = vec![ProcessDeviceUsage {
        device: "gpu0".into(),
        ..Default::default()
    }];
    // Not on the GPU when they happened: the device's codes are listed.
    let f = diagnose(&t, &rules());
    let d = &f
        .iter()
        .find(|f| f.id == "gpu_errors")
        .expect("fires")
        .detail;
    assert_eq!(
        d,
        &vec![
            "gpu0 XID 13 (Graphics engine exception (illegal instruction or memory access in a kernel)): 2 times since ethand started watching".to_string(),
            "gpu0 XID 79 (GPU has fallen off the bus): 1 time since ethand started watching".to_string(),
        ]
    );
    let s = signals(&t);
    assert_eq!(s.get("gpu.xid_events"), Some(&0.0));
    // Attributed to the tree's process: those are listed, with the process.
    t.processes[0].gpu_xid_events = vec![ProcessXid {
        device: "gpu0".into(),
        uuid: "GPU-0".into(),
        xid: 79,
        count: 1,
        last_unix_ns: 1_764_806_400_000_000_000,
    }];
    assert_eq!(signals(&t).get("gpu.xid_events"), Some(&1.0));
    let f = diagnose(&t, &rules());
    let d = &f
        .iter()
        .find(|f| f.id == "gpu_errors")
        .expect("fires")
        .detail;
    let pid = t.processes[0].pid;
    let comm = &t.processes[0].comm;
    assert_eq!(
        d,
        &vec![format!(
            "gpu0 XID 79 (GPU has fallen off the bus): 1 time while pid {pid} ({comm}) held a context on it, last at 2025-12-04 00:00:00 UTC"
        )]
    );
    // XID events not delivered by the GPU: unmeasured, absent.
    t.devices.gpus[0].xid_errors = None;
    assert_eq!(signals(&t).get("gpu.xid_events"), None);
}

#[test]
fn row_remap_failure_and_downtrained_link_signals() {
    let mut t = healthy();
    t.devices = gpu_device(vec![], 0, 0);
    let s = signals(&t);
    assert_eq!(s.get("gpu.row_remap_failed"), None, "not reported: absent");
    assert_eq!(s.get("gpu.pcie_link_downtrained"), None);
    let g = &mut t.devices.gpus[0];
    g.row_remap_failed = Some(false);
    g.pcie_link_width = Some(16);
    g.pcie_link_width_max = Some(16);
    let s = signals(&t);
    assert_eq!(s.get("gpu.row_remap_failed"), Some(&0.0));
    assert_eq!(s.get("gpu.pcie_link_downtrained"), Some(&0.0));
    assert!(ids(&t).is_empty());
    let g = &mut t.devices.gpus[0];
    g.row_remap_failed = Some(true);
    g.pcie_link_width = Some(8);
    let s = signals(&t);
    assert_eq!(s.get("gpu.pcie_link_downtrained"), Some(&1.0));
    let f = diagnose(&t, &rules());
    let d = &f
        .iter()
        .find(|f| f.id == "gpu_errors")
        .expect("fires")
        .detail;
    assert!(d[0].contains("row remapping failed"), "{d:?}");
}

#[test]
fn findings_are_ranked_by_impact() {
    let mut t = with_gpu(
        healthy(),
        launches(1000),
        WindowStats {
            gpu_launches: Some(1000),
            collective_ns: 4 * S,
            ..Default::default()
        },
        Some(0.2),
    );
    t.processes[0].threads = vec![thread(100, 9 * S, S, 0)];
    let f = diagnose(&t, &rules());
    assert!(f.len() >= 2, "{f:?}");
    assert!(f.windows(2).all(|w| w[0].impact >= w[1].impact));
    assert_eq!(f[0].id, "input_pipeline_stall");
}

#[test]
fn user_rules_override_and_disable() {
    let dir = std::env::temp_dir().join(format!("ethand-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("10-site.toml"),
        r#"
[[rule]]
id = "cpu_contention"
enabled = false

[[rule]]
id = "busy_main_thread"
title = "Main thread busy"
severity = "info"
when = "cpu.main_thread_busy_ratio > 0.4"
evidence = ["cpu.main_thread_busy_ratio"]
advice = ["profile it"]
impact = "cpu.main_thread_busy_ratio"
"#,
    )
    .unwrap();
    let rules = load_rules(&dir).unwrap();
    assert!(!rules.iter().any(|r| r.id == "cpu_contention"));
    let mut t = healthy();
    t.processes[0].window.as_mut().unwrap().runq_wait_ns = 4 * S;
    let f: Vec<String> = diagnose(&t, &rules).into_iter().map(|f| f.id).collect();
    assert_eq!(f, vec!["busy_main_thread"]);
    // A broken file next to it stops the load: its operator's rules are not dropped quietly.
    std::fs::write(
        dir.join("20-broken.toml"),
        "[[rule]]\nid = \"x\"\ntitle = \"t\"\nwhen = \"a >\"\n",
    )
    .unwrap();
    let e = load_rules(&dir).unwrap_err().to_string();
    assert!(
        e.contains("20-broken.toml") && e.contains("\"x\"") && e.contains("when"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // No rules directory at all: the built-in rules.
    assert_eq!(
        load_rules(&dir).unwrap().len(),
        parse_rules(BUILTIN_RULES, "b")
            .unwrap()
            .iter()
            .filter(|r| r.1.is_some())
            .count()
    );
}

/// A rule naming a signal the catalog does not have is refused in every field that names
/// signals, with the file, the rule, the field and the nearest name; it would be silently
/// false (or never evaluated) otherwise.
#[test]
fn rules_naming_unknown_signals_are_refused() {
    let base = |field: &str, value: &str| {
        let mut r = String::from("[[rule]]\nid = \"typo\"\ntitle = \"t\"\n");
        if field != "when" {
            r.push_str("when = \"gpu.sm_busy_ratio < 0.5\"\n");
        }
        r.push_str(&format!("{field} = {value}\n"));
        r
    };
    for (field, value) in [
        ("when", "\"gpu.sm_busy < 0.5\""),
        ("when", "\"!(max(cpu.cores_used, gpu.sm_busy) > 1)\""),
        ("speedup", "\"1 / gpu.sm_busy\""),
        ("impact", "\"1 - gpu.sm_busy\""),
        ("evidence", "[\"cpu.cores_used\", \"gpu.sm_busy\"]"),
        ("needs", "[\"gpu.sm_busy\"]"),
    ] {
        let e = parse_rules(&base(field, value), "/etc/ethand/rules.d/site.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/ethand/rules.d/site.toml: rule \"typo\": ")
                && e.contains(&format!("{field}: unknown signal \"gpu.sm_busy\""))
                && e.contains("did you mean gpu.sm_busy_ratio?"),
            "{field}: {e}"
        );
    }
    // Nothing near: no suggestion.
    let e = parse_rules(&base("when", "\"zzz > 1\""), "f")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown signal \"zzz\"") && !e.contains("did you mean"),
        "{e}"
    );
    // The same rule with the right name loads.
    assert!(parse_rules(&base("when", "\"gpu.sm_busy_ratio < 0.5\""), "f").is_ok());
}

/// The catalog: one entry per name; names carry their unit (`_ratio`/`_share`, `_per_second`,
/// `_bytes`, `seconds`, `_celsius`, `_watts`, else a count), as the metric conventions ask;
/// every signal a built-in rule reads is in it; docs/diagnosis.md's table is generated from it.
#[test]
fn signal_catalog_is_whole_and_documented() {
    let names: Vec<&str> = signals::all().map(|s| s.name).collect();
    let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a signal declared twice");
    for s in signals::all() {
        let n = s.name;
        let by_name = if ["_ratio", "_share", "_spread", "_min", "_max"]
            .iter()
            .any(|x| n.ends_with(x))
        {
            "ratio"
        } else if n.ends_with("_bytes_per_second") {
            "bytes_per_second"
        } else if n.ends_with("_per_second") {
            "per_second"
        } else if n.ends_with("_bytes") {
            "bytes"
        } else if n.contains("seconds") {
            "seconds"
        } else if n.ends_with("_celsius") {
            "celsius"
        } else if n.ends_with("_watts") {
            "watts"
        } else {
            "count"
        };
        assert_eq!(s.unit.as_str(), by_name, "{n}: its name says another unit");
        assert!(!s.doc.is_empty() && !s.doc.contains('|'), "{n}: doc");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/diagnosis.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        "<!-- signals: generated from daemon/src/diagnose/signals/ -->\n",
        "<!-- end of signals -->",
    );
    let (i, j) = (
        doc.find(begin)
            .expect("docs/diagnosis.md has the signals markers")
            + begin.len(),
        doc.find(end).expect("docs/diagnosis.md has the end marker"),
    );
    let want = signals::render_doc_table();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &doc[..i], &doc[j..])).unwrap();
    } else {
        assert!(
            doc[i..j] == want,
            "docs/diagnosis.md's signal table is stale: run UPDATE_DOCS=1 cargo test -p ethand --lib signal_catalog"
        );
    }
}

/// Every signal the catalog computes on a rich tree is one it declares, and a tree without a
/// window, GPU or devices has none of the signals that need them (absent, never 0).
#[test]
fn unmeasured_signals_are_absent() {
    let mut t = healthy();
    t.processes[0].window = None;
    t.measured_ms = 0;
    let s = signals(&t);
    for n in [
        "window_seconds",
        "cpu.cores_used",
        "cpu.runq_wait_ratio",
        "io.block_bytes_per_second",
        "gpu.sync_calls",
        "gpu.launches_per_second",
        "gpu.sm_busy_ratio",
        "gpu.throttled",
        "ranks.count",
        "mem.swap_bytes",
    ] {
        assert!(
            !s.contains_key(n),
            "{n} present without what it measures: {s:?}"
        );
    }
    assert!(s.keys().all(|k| signals::find(k).is_some()));
    assert_eq!(s["tree.uses_accelerator"], 0.0);
}

#[test]
fn broken_rules_name_file_rule_and_field() {
    let e = parse_rules(
        "[[rule]]\nid = \"x\"\ntitle = \"t\"\nwhen = \"a >\"\n",
        "site.toml",
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("site.toml") && msg.contains("\"x\"") && msg.contains("when"),
        "{msg}"
    );
    let e = parse_rules(
        "[[rule]]\nid = \"x\"\ntitle = \"t\"\nwhen = \"a > 1\"\nseverity = \"huge\"\n",
        "f",
    )
    .unwrap_err();
    assert!(e.to_string().contains("severity"), "{e}");
}

/// The CPU count is the snapshot's own host's: a file read elsewhere keeps it, and an older
/// file without it has no per-CPU signals rather than this machine's.
#[test]
fn cpu_count_comes_from_the_snapshot() {
    let mut t = healthy();
    t.node_cpus = Some(128);
    assert_eq!(signals(&t)["node.cpus"], 128.0);
    t.node_cpus = None;
    let s = signals(&t);
    assert!(!s.contains_key("node.cpus") && !s.contains_key("cpu.threads_per_cpu"));
}

#[test]
fn memory_pressure_condition() {
    let rule = rules()
        .into_iter()
        .find(|r| r.id == "memory_pressure")
        .unwrap();
    let sig = |swap: f64, faults: f64| {
        BTreeMap::from([
            ("mem.swap_bytes".to_string(), swap),
            ("mem.major_faults_per_second".to_string(), faults),
        ])
    };
    assert!(rule.when.truth(&sig(512.0 * 1048576.0, 0.0)));
    assert!(rule.when.truth(&sig(0.0, 500.0)));
    assert!(!rule.when.truth(&sig(0.0, 1.0)));
    // The figures come from the snapshot (read when it was taken), not from /proc now: a
    // saved file diagnoses the same later, whatever runs under that pid today.
    let me = ProcessSnapshot {
        pid: std::process::id(),
        alive: true,
        start_time_unix_s: 1_000,
        swap_bytes: Some(200 << 20),
        major_faults: Some(5_000),
        ..Default::default()
    };
    let mut t = tree(vec![me]);
    t.taken_at_unix_ms = 1_010_000;
    let s = signals(&t);
    assert_eq!(s["mem.swap_bytes"], (200 << 20) as f64);
    assert_eq!(s["mem.major_faults_per_second"], 500.0);
    assert!(ids(&t).contains(&"memory_pressure".to_string()));
    // Not read (an older file, an exited process): unknown, not 0.
    t.processes[0].swap_bytes = None;
    t.processes[0].major_faults = None;
    let s = signals(&t);
    assert!(!s.contains_key("mem.swap_bytes") && !s.contains_key("mem.major_faults_per_second"));
}

fn now(state: &str, syscall: Option<(&str, Option<u64>, Option<&str>)>) -> ThreadNow {
    ThreadNow {
        state: state.into(),
        syscall: syscall.map(|(name, elapsed, file)| InFlightSyscall {
            nr: 0,
            name: name.into(),
            elapsed_ns: elapsed,
            file: file.map(str::to_string),
            fd: file.map(|_| 0),
            ..Default::default()
        }),
    }
}

#[test]
fn stalled_needs_every_live_thread_blocked_long() {
    let mut t = healthy();
    t.processes[0].window.as_mut().unwrap().oncpu_ns = 0;
    t.processes[0].threads[0].now = Some(now(
        "sleeping",
        Some(("read", Some(15 * S + S / 5), Some("pipe:[77]"))),
    ));
    let f = diagnose(&t, &rules());
    let stalled = f.iter().find(|f| f.id == "stalled").expect("fires");
    assert_eq!(
        stalled.detail,
        ["pid 100 (train) thread 100 (t): sleeping in read() on pipe:[77] for 15.2 s"]
    );
    // A second thread that runs: not stalled.
    let mut busy = t.clone();
    let mut th = thread(101, S, 0, 0);
    th.now = Some(now("running", None));
    busy.processes[0].threads.push(th);
    assert!(!ids(&busy).contains(&"stalled".to_string()));
    // Blocked, but briefly.
    let mut brief = t.clone();
    brief.processes[0].threads[0].now = Some(now("sleeping", Some(("read", Some(S), None))));
    assert!(!ids(&brief).contains(&"stalled".to_string()));
    // Asleep since before ethand knew it: at least that long counts.
    let mut old = t.clone();
    let sc = old.processes[0].threads[0]
        .now
        .as_mut()
        .unwrap()
        .syscall
        .as_mut()
        .unwrap();
    sc.elapsed_ns = None;
    sc.elapsed_at_least_ns = Some(60 * S);
    let f = diagnose(&old, &rules());
    let d = &f.iter().find(|f| f.id == "stalled").expect("fires").detail;
    assert!(d[0].contains("for at least 60.0 s"), "{d:?}");
    // No thread state (an older file): no signal, no finding.
    assert!(!ids(&healthy()).contains(&"stalled".to_string()));
}

#[test]
fn single_thread_cpu_bound() {
    let mut t = healthy();
    let w = t.processes[0].window.as_mut().unwrap();
    w.oncpu_ns = 97 * S / 10;
    w.main_thread_oncpu_ns = Some(97 * S / 10);
    assert!(ids(&t).contains(&"single_thread_cpu_bound".to_string()));
    // Its other threads busy too: not held to one core.
    let mut multi = t.clone();
    multi.processes[0].window.as_mut().unwrap().oncpu_ns = 30 * S;
    assert!(!ids(&multi).contains(&"single_thread_cpu_bound".to_string()));
    // Half busy: no.
    let mut half = t.clone();
    half.processes[0]
        .window
        .as_mut()
        .unwrap()
        .main_thread_oncpu_ns = Some(5 * S);
    assert!(!ids(&half).contains(&"single_thread_cpu_bound".to_string()));
    // A GPU tree is judged by the GPU rules.
    let gpu = with_gpu(
        t.clone(),
        launches(1000),
        t.processes[0].window.clone().unwrap(),
        Some(0.9),
    );
    assert!(!ids(&gpu).contains(&"single_thread_cpu_bound".to_string()));
}

/// A GPU finding names its busiest call site, an input stall the main thread's busiest lines,
/// from the snapshot's stack sample; without a sample, no such line.
#[test]
fn findings_say_where_in_the_code() {
    use ethand_snapshot::stacks::{
        CallSite, CallSites, Frame, FrameKind, SiteBasis, StackSample, ThreadProfile,
    };
    let py = |f: &str, l: u32| Frame {
        kind: FrameKind::Python,
        function: Some(f.into()),
        file: Some("/w/train.py".into()),
        line: Some(l),
        ..Frame::default()
    };
    let site = |f: &str, l: u32, n: u64| CallSite {
        frames: vec![py(f, l)],
        count: n,
        time_ns: None,
        source: None,
    };
    let sample = StackSample {
        call_sites: vec![CallSites {
            pid: 1,
            call: "cuStreamSynchronize".into(),
            category: "sync".into(),
            basis: SiteBasis::Samples,
            total: 100,
            sites: vec![site("step", 41, 99)],
            other: 1,
            unattributed: None,
        }],
        threads: vec![ThreadProfile {
            pid: 1,
            tid: 1,
            name: "MainThread".into(),
            main_thread: true,
            samples: 200,
            active_samples: 150,
            in_runtime_call_samples: 10,
            top_lines: vec![site("decode", 186, 120), site("step", 41, 40)],
            ..ThreadProfile::default()
        }],
        ..StackSample::default()
    };
    let mut storm = calls_level(1.0, 14_000, 0, 0.05, Some(42_000.0));
    let f = diagnose(&storm, &rules());
    assert!(
        !f[0].detail.iter().any(|d| d.starts_with("where")),
        "{:?}",
        f[0].detail
    );
    storm.stack_sample = Some(sample.clone());
    let f = diagnose(&storm, &rules());
    assert_eq!(f[0].id, "excessive_sync");
    assert_eq!(
        f[0].detail,
        vec![
            "where in the code: cuStreamSynchronize: 99.0 % of 100 samples inside it from train.py:41 in step() (pid 1; 2 sites in all)"
        ]
    );
    let mut stall = calls_level(0.9, 30, 30, 0.02, Some(1500.0));
    stall.stack_sample = Some(sample);
    let f = diagnose(&stall, &rules());
    assert_eq!(f[0].id, "input_pipeline_stall");
    assert_eq!(
        f[0].detail,
        vec![
            "where the time goes: main thread of pid 1 (MainThread): 60.0 % at train.py:186 in decode(), 20.0 % at train.py:41 in step() (75.0 % on a CPU, 5.0 % inside runtime calls, of 200 samples)"
        ]
    );
}

/// Waits that are writes and fsyncs, with the disk writing: write advice, not read advice.
#[test]
fn disk_write_bound() {
    let mut t = healthy();
    let p = &mut t.processes[0];
    p.threads = vec![thread(100, S, 9 * S, 0)];
    p.syscalls.by_nr = vec![
        SyscallRow {
            nr: 74,
            name: "fsync".into(),
            count: 1000,
            errors: 0,
            time_ns: 7 * S,
        },
        SyscallRow {
            nr: 1,
            name: "write".into(),
            count: 1000,
            errors: 0,
            time_ns: S / 2,
        },
    ];
    p.block = vec![BlockStats {
        op: "write".into(),
        ops: 3000,
        bytes: 100 << 20,
        service_ns: 6 * S,
        ..Default::default()
    }];
    p.window.as_mut().unwrap().block_write_bytes = 100 << 20;
    assert_eq!(ids(&t), vec!["disk_write_bound"]);
    // The window's own split wins over the life's: mostly reads now.
    let w = t.processes[0].window.as_mut().unwrap();
    (w.io_read_syscall_ns, w.io_write_syscall_ns) = (Some(6 * S), Some(S));
    assert_eq!(ids(&t), vec!["disk_io_bound"]);
    // Writes in the syscalls but the disk reads: read advice.
    let w = t.processes[0].window.as_mut().unwrap();
    (w.io_read_syscall_ns, w.io_write_syscall_ns) = (Some(S), Some(6 * S));
    (w.block_read_bytes, w.block_write_bytes) = (100 << 20, 1 << 20);
    assert_eq!(ids(&t), vec!["disk_io_bound"]);
}

/// A GPU process busy on its SMs (GPM) with the given FP32 and tensor pipe activity.
fn pipes(fp32: Option<f64>, tensor: Option<f64>) -> TreeSnapshot {
    let mut t = with_gpu(
        healthy(),
        GpuProcessStats::default(),
        WindowStats::default(),
        Some(1.0),
    );
    let d = t.total.gpu_derived.as_mut().unwrap();
    d.sm_activity_ratio = Some(0.95);
    d.fp32_activity_ratio = fp32;
    d.tensor_activity_ratio = tensor;
    t
}

#[test]
fn fp32_without_tensor_cores() {
    // SIMT sgemm: FP32 pipes busy, tensor cores idle.
    let t = pipes(Some(0.6), Some(0.0));
    assert_eq!(ids(&t), vec!["fp32_without_tensor_cores"]);
    // bf16 under autocast (healthy_resnet on the H200: tensor 0.13) and TF32.
    assert!(ids(&pipes(Some(0.3), Some(0.13))).is_empty());
    assert!(ids(&pipes(Some(0.05), Some(0.7))).is_empty());
    // Memory-bound FP32 element-wise work: the FP32 pipes barely busy.
    assert!(ids(&pipes(Some(0.08), Some(0.0))).is_empty());
    // An idle GPU is not computing in any precision.
    let mut idle = pipes(Some(0.6), Some(0.0));
    idle.total.gpu_derived.as_mut().unwrap().sm_activity_ratio = Some(0.2);
    assert!(!ids(&idle).contains(&"fp32_without_tensor_cores".to_string()));
    // Without the FP32 counter (no GPM, an older file) the rule cannot decide: it says so.
    let blind = pipes(None, Some(0.0));
    assert!(ids(&blind).is_empty());
    let (_, not_evaluated) = evaluate(&blind, &rules());
    assert!(
        not_evaluated
            .iter()
            .any(|n| n.rule == "fp32_without_tensor_cores"),
        "{not_evaluated:?}"
    );
}

fn freeing(frees: Option<u64>) -> TreeSnapshot {
    with_gpu(
        healthy(),
        GpuProcessStats {
            memory: vec![GpuMemoryStats {
                kind: "device".into(),
                allocs: 5000,
                frees: 4990,
                ..Default::default()
            }],
            ..Default::default()
        },
        WindowStats {
            gpu_blocking_frees: frees,
            ..Default::default()
        },
        None,
    )
}

#[test]
fn allocator_churn() {
    // 10 s window: 2,000 frees back to the driver is 200/s.
    let t = freeing(Some(2000));
    assert_eq!(ids(&t), vec!["allocator_churn"]);
    assert_eq!(
        signals(&t).get("gpu.blocking_frees_per_second"),
        Some(&200.0)
    );
    // A teardown's or an occasional empty_cache's frees: 30 in 10 s.
    assert!(ids(&freeing(Some(30))).is_empty());
    // An older file without the count: absent, never 0.
    let old = freeing(None);
    assert!(ids(&old).is_empty());
    assert_eq!(signals(&old).get("gpu.blocking_frees_per_second"), None);
}

fn memory(used_gib: u64, total_gib: u64) -> TreeSnapshot {
    let mut t = healthy();
    t.devices = DevicesSnapshot {
        gpus: vec![GpuDevice {
            index: 0,
            memory_used_bytes: Some(used_gib << 30),
            memory_free_bytes: Some((total_gib - used_gib) << 30),
            memory_total_bytes: Some(total_gib << 30),
            ..Default::default()
        }],
        ..Default::default()
    };
    t
}

#[test]
fn gpu_memory_near_full() {
    let t = memory(78, 80);
    assert_eq!(ids(&t), vec!["gpu_memory_near_full"]);
    let s = signals(&t);
    assert_eq!(s.get("gpu.memory_used_ratio"), Some(&(78.0 / 80.0)));
    assert_eq!(
        s.get("gpu.memory_free_bytes"),
        Some(&(2.0 * (1u64 << 30) as f64))
    );
    // JAX's default preallocation (75 %), vLLM's (90 %).
    assert!(ids(&memory(60, 80)).is_empty());
    assert!(ids(&memory(72, 80)).is_empty());
    // A GPU that reports no memory: absent.
    let mut blind = memory(78, 80);
    blind.devices.gpus[0].memory_total_bytes = None;
    assert_eq!(signals(&blind).get("gpu.memory_used_ratio"), None);
    assert!(ids(&blind).is_empty());
}

/// A GPU process whose kernels were recorded over a 2 s window (CUPTI): `kernels` of
/// `kernel_ns` each, run serially, the idle rest split into host wait and launch latency as
/// given, optionally collectives of `comm_ns` of which `overlapped_ns` beside computation.
fn recorded(
    kernels: u64,
    kernel_ns: u64,
    host_wait_ns: u64,
    kernel_wait_ns: u64,
    comm: Option<(u64, u64)>,
) -> TreeSnapshot {
    use ethand_snapshot::kernels::{
        ActivityState, CommOverlap, DeviceActivity, GpuActivity, GpuActivityProcess, IdleSplit,
    };
    let window_ns = 2 * S;
    let busy = kernels * kernel_ns;
    let mut t = with_gpu(
        healthy(),
        GpuProcessStats::default(),
        WindowStats::default(),
        None,
    );
    t.gpu_activity = Some(GpuActivity {
        processes: vec![GpuActivityProcess {
            pid: 100,
            state: ActivityState::Recorded,
            window_ns: Some(window_ns),
            records: kernels,
            devices: vec![DeviceActivity {
                device: 0,
                kernels,
                kernel_ns: busy,
                busy_ns: busy,
                busy_fraction: Some(busy as f64 / window_ns as f64),
                idle: Some(IdleSplit {
                    host_wait_ns,
                    kernel_wait_ns,
                    unattributed_ns: window_ns - busy - host_wait_ns - kernel_wait_ns,
                    gaps: kernels.saturating_sub(1),
                    ..Default::default()
                }),
                communication: comm.map(|(c, o)| CommOverlap {
                    communication_ns: c,
                    overlapped_ns: o,
                }),
            }],
            ..Default::default()
        }],
        ..Default::default()
    });
    t
}

/// The kernel-record signals are the recorded figures over the window, and absent where
/// nothing was recorded or the records are incomplete (never 0).
#[test]
fn kernel_record_signals() {
    let t = recorded(
        40_000,
        5_000,
        S,
        200_000_000,
        Some((100_000_000, 25_000_000)),
    );
    let s = signals(&t);
    let near = |n: &str, want: f64| {
        let v = s[n];
        assert!((v - want).abs() < 1e-9, "{n} = {v}, want {want}");
    };
    near("gpu.kernel_busy_ratio", 0.1);
    near("gpu.host_wait_idle_ratio", 0.5);
    near("gpu.kernel_wait_idle_ratio", 0.1);
    near("gpu.kernels_per_second", 20_000.0);
    near("gpu.kernel_mean_seconds", 5e-6);
    near("gpu.communication_exposed_ratio", 0.0375);
    near("gpu.communication_overlap_ratio", 0.25);
    assert_eq!(s.get("gpu.fp32_simt_gemm_ratio"), Some(&0.0));
    // No collective ran: nothing overlapped or not; none exposed.
    let s = signals(&recorded(100, 1_000_000, 0, 0, None));
    assert_eq!(s.get("gpu.communication_overlap_ratio"), None);
    assert_eq!(s.get("gpu.communication_exposed_ratio"), Some(&0.0));
    // Not recorded, or cut short by another tool: absent.
    for t in [healthy(), {
        let mut t = recorded(40_000, 5_000, S, 0, None);
        t.gpu_activity.as_mut().unwrap().processes[0].incomplete = Some("cut short".into());
        t
    }] {
        let s = signals(&t);
        for n in [
            "gpu.kernel_busy_ratio",
            "gpu.host_wait_idle_ratio",
            "gpu.kernels_per_second",
            "gpu.kernel_mean_seconds",
            "gpu.fp32_simt_gemm_ratio",
        ] {
            assert_eq!(s.get(n), None, "{n}");
        }
    }
}

/// Tiny kernels with the GPU waiting for the host between them: short_kernels, from the
/// records alone (no GPM here, and NVML's utilization would call the GPU busy). Kernels of a
/// millisecond with the same gaps are a host-bound job with no known cause instead; a GPU
/// kept busy is neither.
#[test]
fn short_kernels_and_gpu_waits_for_host() {
    assert_eq!(
        ids(&recorded(40_000, 5_000, S, 200_000_000, None)),
        vec!["short_kernels"]
    );
    assert_eq!(
        ids(&recorded(900, 1_000_000, S, 0, None)),
        vec!["gpu_waits_for_host"]
    );
    assert!(ids(&recorded(1_900, 1_000_000, 50_000_000, 0, None)).is_empty());
    // Tiny kernels queued well ahead (a CUDA graph): the GPU never waits for the host.
    assert!(ids(&recorded(300_000, 5_000, 0, 100_000_000, None)).is_empty());
    // A known cause on the host explains the wait: only it is shown.
    let mut t = recorded(900, 1_000_000, S, 0, None);
    t.processes[0].window.as_mut().unwrap().gpu_blocking_frees = Some(5_000);
    assert_eq!(ids(&t), vec!["allocator_churn"]);
}

#[test]
fn collectives_not_overlapped() {
    // 40 % of the window in collectives with nothing beside them.
    let t = recorded(1_000, 1_000_000, 0, 0, Some((900_000_000, 100_000_000)));
    assert_eq!(ids(&t), vec!["collectives_not_overlapped"]);
    // Overlapped with the backward pass: healthy.
    assert!(
        ids(&recorded(
            1_000,
            1_000_000,
            0,
            0,
            Some((900_000_000, 800_000_000))
        ))
        .is_empty()
    );
}

/// fp32 GEMMs on the CUDA cores told by name where the kernels were recorded: on a GPU
/// without GPM the rule decides from them, and the TF32 kernel of the same matmul is fine.
#[test]
fn fp32_gemms_by_name_without_gpm() {
    use ethand_snapshot::kernels::{KernelClass, KernelStat};
    let with = |name: &str| {
        let mut t = recorded(1_000, 1_500_000, 0, 0, None);
        let p = &mut t.gpu_activity.as_mut().unwrap().processes[0];
        p.kernels = vec![KernelStat {
            name: Some(name.into()),
            class: KernelClass::of(name),
            count: 1_000,
            gpu_ns: 1_500_000_000,
            max_ns: 1_500_000,
            ..Default::default()
        }];
        t
    };
    let t = with("_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE");
    assert_eq!(signals(&t).get("gpu.fp32_simt_gemm_ratio"), Some(&0.75));
    assert_eq!(ids(&t), vec!["fp32_without_tensor_cores"]);
    let (_, not_evaluated) = evaluate(&t, &rules());
    assert!(
        !not_evaluated
            .iter()
            .any(|n| n.rule == "fp32_without_tensor_cores")
    );
    assert!(ids(&with("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas")).is_empty());
}
