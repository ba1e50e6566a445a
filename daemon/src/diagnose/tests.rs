//! Every built-in rule against a synthetic tree that must fire it and one that must not.
//! (End-to-end tests with real workloads are in tests/tests/e2e/diagnose.rs.)
use ethand_exporters::{
    devices::{DevicesSnapshot, GpuDevice},
    gpu::{CommRank, GpuDerived, GpuMemoryStats, GpuProcessStats, GpuSymbolStats, GpuTimedCalls},
    snapshot::{
        BlockStats, NetStats, ProcessSnapshot, SchedStats, SyscallRow, ThreadSnapshot,
        TreeSnapshot, WindowStats,
    },
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
    let mut total = ethand_exporters::snapshot::TreeTotals::default();
    for p in &processes {
        total.sched.add(&p.sched);
        total.net.add(&p.net);
        if let Some(g) = &p.gpu {
            total.gpu.get_or_insert_with(Default::default).add(g);
        }
    }
    TreeSnapshot {
        source: "daemon".into(),
        root_pid: processes[0].pid,
        processes,
        total,
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
        launches: n,
        ..Default::default()
    }
}

#[test]
fn healthy_tree_has_no_findings() {
    assert!(ids(&healthy()).is_empty(), "{:?}", ids(&healthy()));
    // A healthy GPU process: busy GPU, little sync.
    let t = with_gpu(
        healthy(),
        launches(100_000),
        WindowStats {
            gpu_launches: 100_000,
            gpu_sync_ns: S / 10,
            ..Default::default()
        },
        Some(0.95),
    );
    assert!(ids(&t).is_empty(), "{:?}", ids(&t));
}

#[test]
fn input_pipeline_stall() {
    let mut t = with_gpu(
        healthy(),
        launches(1000),
        WindowStats {
            gpu_launches: 1000,
            ..Default::default()
        },
        Some(0.3),
    );
    // Main thread busy 90 % of its time on the CPU (decoding batches).
    t.processes[0].threads = vec![thread(100, 9 * S, S, 0)];
    let f = diagnose(&t, &rules());
    assert_eq!(f[0].id, "input_pipeline_stall", "{f:?}");
    let speedup = f[0].estimated_speedup.unwrap();
    assert!((speedup - 1.0 / 0.3).abs() < 1e-9, "{speedup}");
    // Same idle GPU, but the host is idle too (waiting on nothing we can see): not this rule.
    let mut t2 = t.clone();
    t2.processes[0].threads = vec![thread(100, S, 9 * S, 0)];
    assert!(!ids(&t2).contains(&"input_pipeline_stall".to_string()));
    // A busy GPU does not fire it.
    let mut t3 = t.clone();
    t3.total.gpu_derived.as_mut().unwrap().device_idle_ratio = Some(0.05);
    assert!(!ids(&t3).contains(&"input_pipeline_stall".to_string()));
}

#[test]
fn gpu_underutilized() {
    let mut t = with_gpu(
        healthy(),
        launches(1000),
        WindowStats {
            gpu_launches: 1000,
            ..Default::default()
        },
        Some(0.3),
    );
    t.processes[0].threads = vec![thread(100, S, 9 * S, 0)];
    assert!(
        ids(&t).contains(&"gpu_underutilized".to_string()),
        "{:?}",
        ids(&t)
    );
    let mut t2 = t.clone();
    t2.total
        .gpu_derived
        .as_mut()
        .unwrap()
        .device_utilization_ratio = Some(0.9);
    assert!(!ids(&t2).contains(&"gpu_underutilized".to_string()));
}

#[test]
fn excessive_sync() {
    let g = GpuProcessStats {
        launches: 1000,
        sync: GpuTimedCalls {
            calls: 1000,
            time_ns: 5 * S,
            timed_calls: 1000,
        },
        ..Default::default()
    };
    let t = with_gpu(
        healthy(),
        g.clone(),
        WindowStats {
            gpu_launches: 1000,
            gpu_sync_ns: 5 * S,
            ..Default::default()
        },
        None,
    );
    assert_eq!(ids(&t), vec!["excessive_sync"]);
    // Few syncs, little time blocked: no.
    let t2 = with_gpu(
        healthy(),
        GpuProcessStats {
            sync: GpuTimedCalls {
                calls: 1,
                time_ns: S / 100,
                timed_calls: 1,
            },
            ..g
        },
        WindowStats {
            gpu_launches: 1000,
            gpu_sync_ns: S / 100,
            ..Default::default()
        },
        None,
    );
    assert!(ids(&t2).is_empty());
}

fn copy_symbol(name: &str, calls: u64, bytes: u64) -> GpuSymbolStats {
    GpuSymbolStats {
        library: "libcuda".into(),
        symbol: name.into(),
        category: "copy".into(),
        calls,
        bytes,
        ..Default::default()
    }
}

/// The `.item()`-per-step loop as measured on an H200: tiny kernels, a sync every 3 launches,
/// GPU idle 70 %, the Python thread 100 % busy, little time inside the syncs themselves. That is
/// excessive synchronization, not an input pipeline.
#[test]
fn item_per_step_is_sync_not_input_pipeline() {
    let g = GpuProcessStats {
        launches: 3_000_000,
        sync: GpuTimedCalls {
            calls: 1_000_000,
            time_ns: S,
            timed_calls: 1_000_000,
        },
        ..Default::default()
    };
    let mut t = with_gpu(
        healthy(),
        g,
        WindowStats {
            gpu_launches: 528_000,
            gpu_sync_ns: 12 * S / 10,
            ..Default::default()
        },
        Some(0.3),
    );
    t.processes[0].threads = vec![thread(100, 10 * S, 0, 0)];
    assert_eq!(
        ids(&t),
        vec!["excessive_sync"],
        "{:?}",
        diagnose(&t, &rules())
    );
}

/// The DataLoader loop as measured on an H200: one sync per step (the pageable batch copy),
/// ~100 syncs/s, GPU idle 99 %, the main thread 92 % busy decoding. Input pipeline, not sync.
#[test]
fn dataloader_with_a_sync_per_step_is_input_pipeline() {
    let g = GpuProcessStats {
        launches: 19_000,
        sync: GpuTimedCalls {
            calls: 1_007,
            time_ns: S / 50,
            timed_calls: 1_007,
        },
        ..Default::default()
    };
    let mut t = with_gpu(
        healthy(),
        g,
        WindowStats {
            gpu_launches: 19_057,
            gpu_sync_ns: S / 50,
            ..Default::default()
        },
        Some(0.01),
    );
    t.processes[0].threads = vec![thread(100, 92 * S / 10, 8 * S / 10, 0)];
    assert_eq!(
        ids(&t),
        vec!["input_pipeline_stall"],
        "{:?}",
        diagnose(&t, &rules())
    );
}

#[test]
fn small_pageable_copies() {
    let g = GpuProcessStats {
        symbols: vec![copy_symbol("cuMemcpyHtoD_v2", 5000, 5000 * 4096)],
        ..Default::default()
    };
    let t = with_gpu(healthy(), g, WindowStats::default(), None);
    assert_eq!(ids(&t), vec!["small_pageable_copies"]);
    // The same bytes in large async copies from pinned memory: fine.
    let g2 = GpuProcessStats {
        symbols: vec![copy_symbol("cuMemcpyHtoDAsync_v2", 5000, 5000 << 20)],
        ..Default::default()
    };
    assert!(ids(&with_gpu(healthy(), g2, WindowStats::default(), None)).is_empty());
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
    t.processes[0].window.as_mut().unwrap().runq_wait_ns = S / 100;
    assert!(ids(&t).is_empty());
}

#[test]
fn thread_oversubscription() {
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    let mut t = healthy();
    // 4 threads per CPU, each running an eighth of the time and preempted the rest.
    t.processes[0].threads = (0..4 * cpus)
        .map(|i| thread(100 + i, S, 0, 7 * S))
        .collect();
    t.total.sched.voluntary_switches = 100;
    t.total.sched.involuntary_switches = 10_000;
    t.processes[0].window.as_mut().unwrap().runq_wait_ns = 7 * S;
    assert!(
        ids(&t).contains(&"thread_oversubscription".to_string()),
        "{:?}",
        ids(&t)
    );
    // Many threads, but asleep: not oversubscribed.
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
            launches: 1000,
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
fn findings_are_ranked_by_impact() {
    let mut t = with_gpu(
        healthy(),
        launches(1000),
        WindowStats {
            gpu_launches: 1000,
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
    std::fs::write(
        dir.join("20-broken.toml"),
        "[[rule]]\nid = \"x\"\ntitle = \"t\"\nwhen = \"a >\"\n",
    )
    .unwrap();
    let rules = load_rules(&dir);
    assert!(!rules.iter().any(|r| r.id == "cpu_contention"));
    let mut t = healthy();
    t.processes[0].window.as_mut().unwrap().runq_wait_ns = 4 * S;
    let f: Vec<String> = diagnose(&t, &rules).into_iter().map(|f| f.id).collect();
    assert_eq!(f, vec!["busy_main_thread"]);
    let _ = std::fs::remove_dir_all(&dir);
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
    // This test process: real /proc figures, no swapping here.
    let me = ProcessSnapshot {
        pid: std::process::id(),
        alive: true,
        start_time_unix_s: 1,
        ..Default::default()
    };
    let mut t = tree(vec![me]);
    t.taken_at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let s = signals(&t);
    assert_eq!(s["mem.swap_bytes"], 0.0);
    assert!(s["mem.major_faults_per_second"] < 100.0);
}
