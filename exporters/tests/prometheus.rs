//! The Prometheus exposition of a synthetic snapshot: exact values, process selection, cgroup
//! totals, histogram shape, and `promtool check metrics` on the whole output.
//!
//! The snapshot's `cgroups` and `block_devices` are literals, as the daemon would hand them
//! over (totals over all processes, departed ones included); they deliberately differ from
//! sums over `processes`, so a test passes only when the exporter renders what they say.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::process::{Command, Stdio};

use ethand_exporters::prometheus::{EXPOSED_BUCKETS, PrometheusOptions, metric_catalog, render};
use ethand_snapshot::devices::{
    CollectorState, CollectorStatus, DeviceProcess, DevicesSnapshot, GpuDevice, NpuDevice,
    NvLinkStats,
};
use ethand_snapshot::selection::{ExportSelection, SelectionPolicy};
use ethand_snapshot::*;

const WEIRD_COMM: &str = "we\"ird\\na\nme";

fn process(
    pid: u32,
    comm: &str,
    cgroup: &str,
    oncpu_ns: u64,
    window_oncpu_ns: Option<u64>,
) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        comm: comm.to_owned(),
        cgroup: cgroup.to_owned(),
        alive: true,
        sched: SchedStats {
            oncpu_ns,
            ..Default::default()
        },
        window: window_oncpu_ns.map(|oncpu_ns| WindowStats {
            oncpu_ns,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn hist(entries: &[(usize, u64)]) -> Vec<u64> {
    let mut h = vec![0; HIST_BUCKETS];
    for &(i, n) in entries {
        h[i] = n;
    }
    h
}

fn block(
    op: &str,
    ops: u64,
    bytes: u64,
    queue: &[(usize, u64)],
    service: &[(usize, u64)],
) -> BlockStats {
    BlockStats {
        device: "253:0".to_owned(),
        device_name: "vda".to_owned(),
        op: op.to_owned(),
        ops,
        bytes,
        queue_ns: 1_000 * ops,
        service_ns: 50_000 * ops,
        queue_hist: hist(queue),
        service_hist: hist(service),
    }
}

fn snapshot() -> NodeSnapshot {
    let mut web = process(
        100,
        "web",
        "/system.slice/web.service",
        1_500_000_000,
        Some(5_000_000_000),
    );
    web.sched.offcpu_blocked_ns = 2_000_000_000;
    web.sched.offcpu_preempted_ns = 250_000_000;
    web.sched.runq_wait_ns = 3_000;
    web.sched.runq_wait_hist = hist(&[(0, 2), (5, 3), (31, 1)]);
    web.sched.voluntary_switches = 10;
    web.sched.involuntary_switches = 4;
    web.threads = (0..4)
        .map(|i| ThreadSnapshot {
            tid: 100 + i,
            comm: "web".to_owned(),
            alive: i != 3,
            ..Default::default()
        })
        .collect();
    // Ten syscalls, time 10_000 ns for s0 down to 1_000 ns for s9.
    web.syscalls.by_nr = (0..10u64)
        .map(|i| SyscallRow {
            nr: i as u32,
            name: format!("s{i}"),
            count: 100 + i,
            errors: i,
            time_ns: 10_000 - 1_000 * i,
        })
        .collect();
    web.syscalls.count = web.syscalls.by_nr.iter().map(|r| r.count).sum::<u64>() + 5;
    web.syscalls.errors = web.syscalls.by_nr.iter().map(|r| r.errors).sum();
    web.syscalls.time_ns = web.syscalls.by_nr.iter().map(|r| r.time_ns).sum();
    web.syscalls.latency = vec![SyscallClassHist {
        class: "futex".to_owned(),
        count: 4,
        buckets: hist(&[(10, 4)]),
    }];
    web.block = vec![block("read", 3, 12_288, &[(9, 3)], &[(15, 2), (16, 1)])];
    web.net = NetStats {
        tcp_tx_bytes: 1_000,
        tcp_rx_bytes: 2_000,
        udp_tx_bytes: 30,
        udp_rx_bytes: 40,
        tcp_retransmits: 2,
        tcp_active_opens: 5,
        tcp_closes: 4,
        tcp_resets_sent: 1,
        tcp_resets_received: 3,
    };

    let mut weird = process(200, WEIRD_COMM, "/user.slice", 100, Some(0));
    weird.block = vec![block("write", 2, 8_192, &[(9, 2)], &[(15, 2)])];
    let mut shell = process(300, "sh", "/user.slice", 1_000_000_000, Some(1_000_000_000));
    shell.sched.offcpu_blocked_ns = 500_000_000;
    shell.syscalls.count = 7;
    shell.block = vec![block("write", 1, 4_096, &[(9, 1)], &[(14, 1)])];
    shell.net.tcp_tx_bytes = 10;
    let mut sleeper = process(301, "sleep", "/user.slice", 2_000_000_000, None);
    sleeper.syscalls.count = 3;
    sleeper.block = vec![block("write", 1, 512, &[(8, 1)], &[(14, 1)])];
    sleeper.net.tcp_tx_bytes = 5;
    let kworker = process(400, "kworker", "", 250_000_000, Some(1));
    let db = process(500, "db", "/system.slice/db.service", 700_000_000, Some(0));
    // An exited process whose pid was reused within the exit grace period.
    let db_exited = ProcessSnapshot {
        alive: false,
        ..process(500, "db", "/system.slice/db.service", 50_000_000, None)
    };
    let mut app = process(600, "app", "/kubepods/podabc/ctr", 1, Some(1));
    // A device that is not in `block_devices`: per-process series only, no node histogram.
    app.block = vec![BlockStats {
        device: "8:16".to_owned(),
        device_name: "sdb".to_owned(),
        ..block("read", 7, 28_672, &[(9, 7)], &[(16, 7)])
    }];

    NodeSnapshot {
        schema_version: SCHEMA_VERSION,
        hostname: "node1".to_owned(),
        processes: vec![web, weird, shell, sleeper, kworker, db, db_exited, app],
        cgroups: cgroups(),
        comms: vec![
            CommSnapshot {
                comm: "cc1".to_owned(),
                processes: 2,
                exited: 148,
                oncpu_ns: 2_840_000_000,
                runq_wait_ns: 120_000_000,
                syscalls: 90_000,
            },
            CommSnapshot {
                comm: WEIRD_COMM.to_owned(),
                processes: 1,
                exited: 0,
                oncpu_ns: 1_000,
                runq_wait_ns: 0,
                syscalls: 1,
            },
        ],
        block_devices: block_devices(),
        ethand: SelfStatus {
            version: "0.1.0".to_owned(),
            probes: vec![
                ProbeStatus {
                    name: "sched_switch".to_owned(),
                    attach_point: "tp_btf/sched_switch".to_owned(),
                    state: ProbeState::Attached,
                    detail: String::new(),
                },
                ProbeStatus {
                    name: "tcp_send_reset".to_owned(),
                    attach_point: "tracepoint/tcp/tcp_send_reset".to_owned(),
                    state: ProbeState::Unsupported,
                    detail: "no such tracepoint".to_owned(),
                },
            ],
            maps: vec![MapFill {
                name: "threads".to_owned(),
                entries: 120,
                capacity: 32_768,
            }],
            programs: vec![ProgramCost {
                name: "sched_switch".to_owned(),
                run_count: 9,
                run_time_ns: 4_500,
            }],
            dropped: vec![
                DropCounter {
                    reason: "threads_full".to_owned(),
                    count: 2,
                    loss: true,
                },
                DropCounter {
                    reason: "exit_before_seen".to_owned(),
                    count: 6,
                    loss: false,
                },
            ],
            cpu_seconds: 1.25,
            rss_bytes: 40 << 20,
            processes_overflow: 0,
            tracked_processes: 8,
            servers: vec![ethand_snapshot::ServerConnections {
                server: "metrics".to_owned(),
                open: 3,
                max: 64,
                max_per_peer: 8,
                refused_limit: 0,
                refused_peer_limit: 120,
                timed_out: 7,
                accept_errors: 0,
            }],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What the daemon would report per cgroup: every process ever seen there, departed ones
/// included. `processes` counts only the processes in `NodeSnapshot.processes`.
fn cgroups() -> Vec<CgroupSnapshot> {
    vec![
        // web (100) plus a departed process: 1.5 s + 0.25 s of CPU.
        CgroupSnapshot {
            cgroup: "/system.slice/web.service".to_owned(),
            processes: 1,
            oncpu_ns: 1_750_000_000,
            offcpu_blocked_ns: 2_000_000_000,
            offcpu_preempted_ns: 250_000_000,
            runq_wait_ns: 3_000,
            syscalls: 1_050,
            syscall_time_ns: 55_000,
            block_read_bytes: 12_288,
            block_write_bytes: 0,
            net: NetStats {
                tcp_tx_bytes: 1_000,
                tcp_rx_bytes: 2_000,
                udp_tx_bytes: 30,
                udp_rx_bytes: 40,
                ..Default::default()
            },
            workload: None,
        },
        // 200, 300 and 301 (3_000_000_100 ns of CPU, 8_192 + 4_096 + 512 bytes written,
        // 10 syscalls, 15 TCP bytes sent) plus what departed processes left behind.
        CgroupSnapshot {
            cgroup: "/user.slice".to_owned(),
            processes: 3,
            oncpu_ns: 4_000_000_000,
            offcpu_blocked_ns: 750_000_000,
            offcpu_preempted_ns: 125_000_000,
            runq_wait_ns: 2_000,
            syscalls: 22,
            syscall_time_ns: 8_000,
            block_read_bytes: 4_096,
            block_write_bytes: 16_000,
            net: NetStats {
                tcp_tx_bytes: 20,
                tcp_rx_bytes: 64,
                ..Default::default()
            },
            workload: None,
        },
        // kworker (400), whose cgroup could not be read.
        CgroupSnapshot {
            cgroup: "unknown".to_owned(),
            processes: 1,
            oncpu_ns: 250_000_000,
            ..Default::default()
        },
        // db (500) and the exited db with the same pid, plus older departed processes.
        CgroupSnapshot {
            cgroup: "/system.slice/db.service".to_owned(),
            processes: 2,
            oncpu_ns: 1_000_000_000,
            syscalls: 9,
            ..Default::default()
        },
        // app (600); its sdb reads are not in the cgroup totals either.
        CgroupSnapshot {
            cgroup: "/kubepods/podabc/ctr".to_owned(),
            processes: 1,
            oncpu_ns: 1,
            ..Default::default()
        },
        // Every process of this cgroup is gone: no process counted, totals kept.
        CgroupSnapshot {
            cgroup: "/system.slice/gone.service".to_owned(),
            processes: 0,
            oncpu_ns: 500_000_000,
            syscalls: 40,
            block_write_bytes: 1_024,
            ..Default::default()
        },
    ]
}

/// What the daemon would report per device and op, all processes, departed ones included.
fn block_devices() -> Vec<BlockStats> {
    vec![
        // web's 3 reads plus 1 from a departed process.
        BlockStats {
            queue_ns: 4_500,
            service_ns: 210_000,
            ..block("read", 4, 16_384, &[(9, 4)], &[(15, 3), (16, 1)])
        },
        // 200, 300 and 301 wrote 4 requests; a departed process wrote 2 more.
        BlockStats {
            queue_ns: 6_000,
            service_ns: 250_000,
            ..block("write", 6, 16_000, &[(8, 2), (9, 4)], &[(14, 3), (15, 3)])
        },
        // A device no process in the snapshot used.
        BlockStats {
            device: "259:0".to_owned(),
            device_name: "nvme0n1".to_owned(),
            queue_ns: 700,
            service_ns: 90_000,
            ..block("flush", 1, 0, &[(9, 1)], &[(16, 1)])
        },
    ]
}

fn options() -> PrometheusOptions {
    PrometheusOptions {
        selection: ExportSelection::Once(SelectionPolicy {
            top_n: 1,
            pids: vec![200],
            comms: vec!["db".to_owned()],
            cgroups: vec!["podabc".to_owned()],
            ..Default::default()
        }),
        dcgm_aliases: false,
        device_workload_labels: false,
    }
}

/// A node with one fully reporting GPU, one that reports nearly nothing, and an NPU.
fn devices() -> DevicesSnapshot {
    DevicesSnapshot {
        hostname: "node1".to_owned(),
        collectors: vec![
            CollectorStatus {
                name: "nvml".to_owned(),
                state: CollectorState::Available,
                detail: String::new(),
            },
            CollectorStatus {
                name: "dcmi".to_owned(),
                state: CollectorState::Available,
                detail: String::new(),
            },
        ],
        gpus: vec![
            GpuDevice {
                index: 0,
                uuid: "GPU-5f1e".to_owned(),
                name: "NVIDIA H200".to_owned(),
                pci_bus_id: "00000000:18:00.0".to_owned(),
                minor_number: Some(0),
                driver_version: "580.65.06".to_owned(),
                utilization_ratio: Some(0.93),
                memory_utilization_ratio: Some(0.41),
                memory_used_bytes: Some(70 << 30),
                memory_free_bytes: Some(70 << 30),
                memory_total_bytes: Some(141 << 30),
                power_watts: Some(650.125),
                energy_millijoules: Some(1_000_000_000),
                temperature_celsius: Some(71),
                sm_clock_hertz: Some(1_980_000_000),
                memory_clock_hertz: Some(3_201_000_000),
                pcie_tx_bytes_per_second: Some(5 << 20),
                pcie_rx_bytes_per_second: Some(1 << 30),
                nvlinks: (0..2)
                    .map(|link| NvLinkStats {
                        link,
                        tx_bytes: Some(1 << 40),
                        rx_bytes: Some(1 << 41),
                        replay_errors: Some(0),
                        recovery_errors: Some(0),
                        crc_flit_errors: Some(3),
                        crc_data_errors: Some(0),
                    })
                    .collect(),
                ecc_corrected_errors: Some(2),
                ecc_uncorrected_errors: Some(0),
                throttle_reasons: Some(vec!["sw_thermal_slowdown".to_owned()]),
                xid_errors: Some(1),
                last_xid: Some(31),
                gpm_supported: Some(true),
                sm_activity_ratio: Some(0.9),
                sm_occupancy_ratio: Some(0.45),
                tensor_activity_ratio: Some(0.6),
                fp64_activity_ratio: Some(0.0),
                fp32_activity_ratio: Some(0.25),
                fp16_activity_ratio: Some(0.125),
                dram_bandwidth_ratio: Some(0.35),
                graphics_activity_ratio: Some(0.95),
                pcie_tx_average_bytes_per_second: Some(3.5e9),
                pcie_rx_average_bytes_per_second: Some(1.25e9),
                memory_reserved_bytes: Some(1 << 30),
                memory_temperature_celsius: Some(80),
                power_limit_watts: Some(700.0),
                encoder_utilization_ratio: Some(0.0),
                decoder_utilization_ratio: Some(0.125),
                pcie_link_generation: Some(5),
                pcie_link_generation_max: Some(5),
                pcie_link_width: Some(8),
                pcie_link_width_max: Some(16),
                pcie_replays: Some(12),
                remapped_rows_correctable: Some(1),
                remapped_rows_uncorrectable: Some(2),
                row_remap_pending: Some(true),
                row_remap_failed: Some(false),
                nvlink_bytes_per_second: Some(2_048_000_000.0),
                xid_errors_by_code: [(31, 1)].into_iter().collect(),
                ..Default::default()
            },
            GpuDevice {
                index: 1,
                uuid: "GPU-77ab".to_owned(),
                name: "Tesla T4".to_owned(),
                pci_bus_id: "00000000:3b:00.0".to_owned(),
                utilization_ratio: Some(0.0),
                // Turing: no GPM, so no SM activity, occupancy, tensor or DRAM series.
                gpm_supported: Some(false),
                // Before Ampere: page retirement rather than row remapping.
                retired_pages_single_bit: Some(3),
                retired_pages_double_bit: Some(1),
                retired_pages_pending: Some(false),
                ..Default::default()
            },
        ],
        npus: vec![NpuDevice {
            index: 0,
            card_id: 1,
            device_id: 0,
            uuid: "00001001-00000002-00000003-00000004-00000005".to_owned(),
            name: "Ascend910B3".to_owned(),
            pci_bus_id: "0000:c1:00.0".to_owned(),
            driver_version: "24.1.rc2".to_owned(),
            aicore_utilization_ratio: Some(0.66),
            hbm_used_bytes: Some(20 << 30),
            hbm_total_bytes: Some(64 << 30),
            hbm_bandwidth_utilization_ratio: Some(0.3),
            hbm_temperature_celsius: Some(44),
            power_watts: Some(180.5),
            temperature_celsius: Some(50),
            health: Some(0),
        }],
        processes: vec![
            DeviceProcess {
                pid: 100,
                device: "gpu0".to_owned(),
                uuid: "GPU-5f1e".to_owned(),
                memory_used_bytes: Some(60 << 30),
                utilization_ratio: Some(0.9),
            },
            DeviceProcess {
                pid: 600,
                device: "npu0".to_owned(),
                uuid: "00001001-00000002-00000003-00000004-00000005".to_owned(),
                memory_used_bytes: Some(18 << 30),
                utilization_ratio: None,
            },
        ],
        ..Default::default()
    }
}

/// The synthetic snapshot with devices and a process that calls GPU runtimes.
fn device_snapshot() -> NodeSnapshot {
    let mut s = NodeSnapshot {
        devices: devices(),
        ..snapshot()
    };
    s.processes.push(gpu_process());
    s.processes.push(workload_process());
    s
}

/// A process in a Kubernetes pod with job and rank (attribution): a GPU section (no calls,
/// launches counted: GPU level `process`) puts it in the per-process selection whatever the
/// top-N says.
fn workload_process() -> ProcessSnapshot {
    ProcessSnapshot {
        pid: 800,
        comm: "trainer".to_owned(),
        cgroup: "/kubepods/burstable/pod1/ctr".to_owned(),
        alive: true,
        major_faults: Some(12),
        memory: Some(ethand_snapshot::memory::ProcessMemory {
            rss_bytes: Some(7 << 20),
            anon_bytes: Some(4 << 20),
            file_bytes: Some(2 << 20),
            shmem_bytes: Some(1 << 20),
            swap_bytes: Some(4096),
            minor_faults: Some(3000),
            major_faults: Some(12),
            // VmHWM not read: no series is missing for it (it has none).
            ..Default::default()
        }),
        gpu: Some(ethand_snapshot::gpu::GpuProcessStats {
            launches: Some(0),
            ..Default::default()
        }),
        workload: Some(WorkloadIdentity {
            container_runtime: Some("containerd".to_owned()),
            container_id: Some("ab".repeat(32)),
            container: Some("pytorch".to_owned()),
            pod: Some("trainer-0".to_owned()),
            namespace: Some("ml".to_owned()),
            pod_uid: Some("3f9c2a1e-7b4d-4c8e-9a10-5d2e6f7a8b9c".to_owned()),
            qos_class: Some("burstable".to_owned()),
            job_id: Some("job-42".to_owned()),
            rank: Some(3),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A training process: launches, copies, memory, syncs, an all-reduce, rank 1 of 2. It has
/// no CPU time: GPU processes get per-process series whatever the top-N selection says.
fn gpu_process() -> ProcessSnapshot {
    use ethand_snapshot::gpu::*;
    let mut p = process(700, "python", "/kubepods/podgpu/ctr", 0, Some(0));
    p.gpu_xid_events = vec![ProcessXid {
        device: "gpu0".into(),
        uuid: "GPU-5f1e".into(),
        xid: 31,
        count: 1,
        last_unix_ns: 1,
    }];
    p.gpu = Some(GpuProcessStats {
        launches: Some(1000),
        graph_launches: Some(3),
        copies: vec![
            GpuCopyStats {
                direction: "host_to_device".into(),
                calls: 10,
                bytes: 40_960,
            },
            GpuCopyStats {
                direction: "device_to_host".into(),
                calls: 2,
                bytes: 8_192,
            },
        ],
        sync: GpuTimedCalls {
            calls: 5,
            time_ns: 2_500_000_000,
            timed_calls: 5,
        },
        memory: vec![GpuMemoryStats {
            kind: "device".into(),
            allocs: 3,
            alloc_bytes: 3 << 20,
            frees: 1,
            freed_bytes: 1 << 20,
            live_bytes: 2 << 20,
            peak_bytes: 3 << 20,
        }],
        collectives: vec![CollectiveStats {
            library: "nccl".into(),
            operation: "all_reduce".into(),
            calls: 120,
            bytes: 120 << 22,
            time_ns: 150_000_000,
            timed_calls: 120,
        }],
        comm_inits: 1,
        comm: Some(CommRank {
            library: "nccl".into(),
            rank: Some(1),
            nranks: 2,
        }),
        errors: 1,
        symbols: vec![GpuSymbolStats {
            library: "libcuda".into(),
            symbol: "cuLaunchKernel".into(),
            category: "launch".into(),
            calls: 1000,
            ..Default::default()
        }],
        ..Default::default()
    });
    p
}

#[test]
fn gpu_process_series() {
    let text = render(&device_snapshot(), &options());
    for line in [
        "ethand_process_gpu_launches_total{pid=\"700\",comm=\"python\",kind=\"kernel\"} 1000",
        "ethand_process_gpu_launches_total{pid=\"700\",comm=\"python\",kind=\"graph\"} 3",
        "ethand_process_gpu_memcpy_bytes_total{pid=\"700\",comm=\"python\",direction=\"host_to_device\"} 40960",
        "ethand_process_gpu_sync_seconds_total{pid=\"700\",comm=\"python\"} 2.5",
        "ethand_process_gpu_memory_allocated_bytes{pid=\"700\",comm=\"python\",memory=\"device\"} 2097152",
        "ethand_process_gpu_memory_peak_bytes{pid=\"700\",comm=\"python\",memory=\"device\"} 3145728",
        "ethand_process_collective_calls_total{pid=\"700\",comm=\"python\",library=\"nccl\",operation=\"all_reduce\",rank=\"1\"} 120",
        "ethand_process_collective_seconds_total{pid=\"700\",comm=\"python\",library=\"nccl\",operation=\"all_reduce\",rank=\"1\"} 0.15",
        "ethand_process_collective_rank_info{pid=\"700\",comm=\"python\",library=\"nccl\",rank=\"1\",nranks=\"2\"} 1",
        "ethand_process_gpu_api_calls_total{pid=\"700\",comm=\"python\",library=\"libcuda\",symbol=\"cuLaunchKernel\"} 1000",
        "ethand_process_gpu_api_errors_total{pid=\"700\",comm=\"python\",library=\"libcuda\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing: {line}");
    }
}

/// GPM ratios (Hopper and newer) exactly where measured, in ethand's names and, with the
/// aliases, dcgm-exporter's profiling fields (ratios there too); the T4 has none of them.
#[test]
fn gpm_series_only_where_measured() {
    let all = PrometheusOptions {
        dcgm_aliases: true,
        ..options()
    };
    let text = render(&device_snapshot(), &all);
    let dcgm = r#"gpu="0",UUID="GPU-5f1e",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H200",Hostname="node1",DCGM_FI_DRIVER_VERSION="580.65.06""#;
    for line in [
        r#"ethand_gpu_sm_activity_ratio{gpu="gpu0",uuid="GPU-5f1e"} 0.9"#.to_owned(),
        r#"ethand_gpu_sm_occupancy_ratio{gpu="gpu0",uuid="GPU-5f1e"} 0.45"#.to_owned(),
        r#"ethand_gpu_tensor_activity_ratio{gpu="gpu0",uuid="GPU-5f1e"} 0.6"#.to_owned(),
        r#"ethand_gpu_dram_bandwidth_ratio{gpu="gpu0",uuid="GPU-5f1e"} 0.35"#.to_owned(),
        format!("DCGM_FI_PROF_SM_ACTIVE{{{dcgm}}} 0.9"),
        format!("DCGM_FI_PROF_SM_OCCUPANCY{{{dcgm}}} 0.45"),
        format!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{dcgm}}} 0.6"),
        format!("DCGM_FI_PROF_DRAM_ACTIVE{{{dcgm}}} 0.35"),
    ] {
        assert!(text.lines().any(|l| l == line), "missing: {line}");
    }
    let gpm = [
        "ethand_gpu_sm_activity_ratio{",
        "ethand_gpu_sm_occupancy_ratio{",
        "ethand_gpu_tensor_activity_ratio{",
        "ethand_gpu_dram_bandwidth_ratio{",
        "DCGM_FI_PROF_",
    ];
    for l in text.lines().filter(|l| l.contains("GPU-77ab")) {
        assert!(
            !gpm.iter().any(|n| l.starts_with(n)),
            "unmeasured, yet a series: {l}"
        );
    }
}

/// Launches are a series only where they were counted: none at all for a process at GPU level
/// `calls` (not a 0), a 0 for one at `process` that launched nothing.
#[test]
fn gpu_launches_only_where_counted() {
    use ethand_snapshot::gpu::GpuProcessStats;
    let mut snap = device_snapshot();
    let mut at_calls = process(901, "calls", "/", 0, Some(0));
    at_calls.gpu = Some(GpuProcessStats {
        sync: ethand_snapshot::gpu::GpuTimedCalls {
            calls: 7,
            ..Default::default()
        },
        ..Default::default()
    });
    let mut at_process = process(902, "counted", "/", 0, Some(0));
    at_process.gpu = Some(GpuProcessStats {
        launches: Some(0),
        graph_launches: Some(0),
        ..Default::default()
    });
    snap.processes.push(at_calls);
    snap.processes.push(at_process);
    let text = render(&snap, &options());
    let s = samples(&text);
    let launches = "ethand_process_gpu_launches_total";
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with(launches) && l.contains("pid=\"901\"")),
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            "ethand_process_gpu_sync_calls_total{pid=\"901\",comm=\"calls\"}"
        ),
        7.0
    );
    assert_eq!(
        value(
            &s,
            &format!("{launches}{{pid=\"902\",comm=\"counted\",kind=\"kernel\"}}")
        ),
        0.0
    );
    assert!(!s.contains_key(&format!(
        "{launches}{{pid=\"902\",comm=\"counted\",kind=\"graph\"}}"
    )));

    // When no process counted launches, the family has no series, so no HELP or TYPE either.
    let mut snap = snapshot();
    snap.processes.retain(|p| p.gpu.is_none());
    let mut at_calls = process(901, "calls", "/", 0, Some(0));
    at_calls.gpu = Some(GpuProcessStats::default());
    snap.processes.push(at_calls);
    let text = render(&snap, &options());
    assert!(!text.contains(launches), "{text}");
    assert!(text.contains("ethand_process_gpu_sync_calls_total{pid=\"901\""));
    let (status, report) = promtool(&text);
    assert!(
        status.success() && report.trim().is_empty(),
        "{status}\n{report}"
    );
}

/// Every sample line as series -> value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|e| panic!("bad value in {l:?}: {e}"));
            (series.to_owned(), value)
        })
        .collect()
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no series {series}"))
}

fn pids_of(samples: &HashMap<String, f64>, family: &str) -> BTreeSet<String> {
    samples
        .keys()
        .filter_map(|s| s.strip_prefix(family)?.strip_prefix("{pid=\""))
        .map(|s| s.split('"').next().unwrap().to_owned())
        .collect()
}

#[test]
fn exact_values() {
    let s = samples(&render(&snapshot(), &options()));
    let p = r#"pid="100",comm="web""#;
    assert_eq!(
        value(&s, &format!("ethand_process_cpu_seconds_total{{{p}}}")),
        1.5
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_offcpu_seconds_total{{{p},reason="blocked"}}"#)
        ),
        2.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_offcpu_seconds_total{{{p},reason="preempted"}}"#)
        ),
        0.25
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_context_switches_total{{{p},kind="involuntary"}}"#)
        ),
        4.0
    );
    assert_eq!(value(&s, &format!("ethand_process_threads{{{p}}}")), 3.0);
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_block_io_bytes_total{{{p},device="vda",op="read"}}"#)
        ),
        12_288.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_block_io_operations_total{{{p},device="vda",op="read"}}"#)
        ),
        3.0
    );
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_process_network_bytes_total{{{p},protocol="udp",direction="receive"}}"#
            )
        ),
        40.0
    );
    assert_eq!(
        value(
            &s,
            &format!("ethand_process_tcp_connections_opened_total{{{p}}}")
        ),
        5.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_process_tcp_resets_total{{{p},direction="received"}}"#)
        ),
        3.0
    );
    // pid reuse: the exited and the new process share a series, summed.
    assert_eq!(
        value(
            &s,
            r#"ethand_process_cpu_seconds_total{pid="500",comm="db"}"#
        ),
        0.75
    );

    assert_eq!(value(&s, r#"ethand_build_info{version="0.1.0"}"#), 1.0);
    assert_eq!(
        value(
            &s,
            r#"ethand_probe_state{probe="sched_switch",state="attached"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_probe_state{probe="sched_switch",state="failed"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_probe_state{probe="tcp_send_reset",state="unsupported"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_bpf_program_run_seconds_total{program="sched_switch"}"#
        ),
        4.5e-6
    );
    assert_eq!(
        value(&s, r#"ethand_bpf_map_capacity_entries{map="threads"}"#),
        32_768.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_bpf_dropped_events_total{reason="threads_full",loss="true"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_bpf_dropped_events_total{reason="exit_before_seen",loss="false"}"#
        ),
        6.0
    );
    assert_eq!(value(&s, "ethand_self_cpu_seconds_total"), 1.25);
    assert_eq!(
        value(&s, "ethand_self_resident_memory_bytes"),
        (40 << 20) as f64
    );
    assert_eq!(value(&s, "ethand_tracked_processes"), 8.0);
    assert_eq!(value(&s, "ethand_processes_overflow_total"), 0.0);
}

#[test]
fn label_values_are_escaped() {
    let text = render(&snapshot(), &options());
    let line = r#"ethand_process_cpu_seconds_total{pid="200",comm="we\"ird\\na\nme"} 1e-7"#;
    assert!(
        text.lines().any(|l| l == line),
        "no line {line} in:\n{text}"
    );
}

#[test]
fn selection_top_n_and_explicit() {
    let snap = snapshot();
    let s = samples(&render(&snap, &options()));
    // 100: top 1 by window CPU; 200: by pid; 500: by comm; 600: by cgroup substring.
    let expected: BTreeSet<String> = ["100", "200", "500", "600"].map(String::from).into();
    assert_eq!(pids_of(&s, "ethand_process_cpu_seconds_total"), expected);

    // Top 2: 301 has no window, so its cumulative 2 s outranks 300's 1 s window.
    let top2 = PrometheusOptions {
        selection: ExportSelection::top(2),
        ..Default::default()
    };
    let s = samples(&render(&snap, &top2));
    let expected: BTreeSet<String> = ["100", "301"].map(String::from).into();
    assert_eq!(pids_of(&s, "ethand_process_cpu_seconds_total"), expected);

    // Processes without CPU time are not "top" even when there is room.
    let all = PrometheusOptions {
        selection: ExportSelection::top(100),
        ..Default::default()
    };
    let s = samples(&render(&snap, &all));
    let expected: BTreeSet<String> = ["100", "300", "301", "400", "500", "600"]
        .map(String::from)
        .into();
    assert_eq!(pids_of(&s, "ethand_process_cpu_seconds_total"), expected);

    // No options: nothing per process; the cgroup series are still all there, as the
    // snapshot's cgroup totals say.
    let text = render(&snap, &PrometheusOptions::default());
    assert!(!text.contains("ethand_process_"), "{text}");
    let s = samples(&text);
    for c in &snap.cgroups {
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_cgroup_processes{{cgroup="{}"}}"#, c.cgroup)
            ),
            c.processes as f64,
            "{}",
            c.cgroup
        );
    }
    assert_eq!(
        value(&s, r#"ethand_cgroup_processes{cgroup="/user.slice"}"#),
        3.0
    );
}

/// The `ethand_cgroup_*` samples of a rendering.
fn cgroup_samples(s: &HashMap<String, f64>) -> BTreeMap<String, f64> {
    s.iter()
        .filter(|(k, _)| k.starts_with("ethand_cgroup_"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Per-name totals (short-lived processes without series of their own), escaped names.
#[test]
fn comm_series_come_from_comm_totals() {
    let s = samples(&render(&snapshot(), &options()));
    let c = r#"comm="cc1""#;
    assert_eq!(
        value(&s, &format!("ethand_comm_cpu_seconds_total{{{c}}}")),
        2.84
    );
    assert_eq!(
        value(&s, &format!("ethand_comm_runq_wait_seconds_total{{{c}}}")),
        0.12
    );
    assert_eq!(
        value(&s, &format!("ethand_comm_syscalls_total{{{c}}}")),
        90_000.0
    );
    assert_eq!(value(&s, &format!("ethand_comm_processes{{{c}}}")), 2.0);
    assert_eq!(
        value(&s, &format!("ethand_comm_exited_processes_total{{{c}}}")),
        148.0
    );
    assert_eq!(
        value(&s, r#"ethand_comm_processes{comm="we\"ird\\na\nme"}"#),
        1.0
    );
}

#[test]
fn cgroup_series_come_from_cgroup_totals() {
    let snap = snapshot();
    let s = samples(&render(&snap, &options()));
    // /user.slice: the CgroupSnapshot literal, which includes 200 (selected, so it has its
    // own series too) and departed processes.
    let c = r#"cgroup="/user.slice""#;
    assert_eq!(
        value(&s, &format!("ethand_cgroup_cpu_seconds_total{{{c}}}")),
        4.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_cgroup_offcpu_seconds_total{{{c},reason="blocked"}}"#)
        ),
        0.75
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_cgroup_offcpu_seconds_total{{{c},reason="preempted"}}"#)
        ),
        0.125
    );
    assert_eq!(
        value(&s, &format!("ethand_cgroup_runq_wait_seconds_total{{{c}}}")),
        2e-6
    );
    assert_eq!(
        value(&s, &format!("ethand_cgroup_syscalls_total{{{c}}}")),
        22.0
    );
    assert_eq!(
        value(&s, &format!("ethand_cgroup_syscall_seconds_total{{{c}}}")),
        8e-6
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_cgroup_block_io_bytes_total{{{c},op="read"}}"#)
        ),
        4_096.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_cgroup_block_io_bytes_total{{{c},op="write"}}"#)
        ),
        16_000.0
    );
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_cgroup_network_bytes_total{{{c},protocol="tcp",direction="transmit"}}"#
            )
        ),
        20.0
    );
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_cgroup_network_bytes_total{{{c},protocol="tcp",direction="receive"}}"#
            )
        ),
        64.0
    );
    assert_eq!(
        value(
            &s,
            &format!(
                r#"ethand_cgroup_network_bytes_total{{{c},protocol="udp",direction="receive"}}"#
            )
        ),
        0.0
    );
    assert_eq!(value(&s, &format!("ethand_cgroup_processes{{{c}}}")), 3.0);

    // Not a sum over `processes`: those hold 3_000_000_100 ns of CPU and 12_800 bytes
    // written in /user.slice.
    let user: Vec<_> = snap
        .processes
        .iter()
        .filter(|p| p.cgroup == "/user.slice")
        .collect();
    assert_eq!(user.len(), 3);
    assert_eq!(
        user.iter().map(|p| p.sched.oncpu_ns).sum::<u64>(),
        3_000_000_100
    );
    assert_eq!(
        user.iter()
            .flat_map(|p| &p.block)
            .map(|b| b.bytes)
            .sum::<u64>(),
        12_800
    );

    // Every CgroupSnapshot is rendered as given, "unknown" and /system.slice/* included,
    // and a cgroup whose processes are all gone keeps its totals with 0 processes.
    for cg in &snap.cgroups {
        let c = format!(r#"cgroup="{}""#, cg.cgroup);
        let secs = |ns: u64| ns as f64 / 1e9;
        assert_eq!(
            value(&s, &format!("ethand_cgroup_cpu_seconds_total{{{c}}}")),
            secs(cg.oncpu_ns),
            "{c}"
        );
        assert_eq!(
            value(&s, &format!("ethand_cgroup_syscalls_total{{{c}}}")),
            cg.syscalls as f64,
            "{c}"
        );
        assert_eq!(
            value(&s, &format!("ethand_cgroup_processes{{{c}}}")),
            cg.processes as f64,
            "{c}"
        );
        // Block bytes: a read and a write series for every cgroup, zero or not.
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_cgroup_block_io_bytes_total{{{c},op="read"}}"#)
            ),
            cg.block_read_bytes as f64,
            "{c}"
        );
        assert_eq!(
            value(
                &s,
                &format!(r#"ethand_cgroup_block_io_bytes_total{{{c},op="write"}}"#)
            ),
            cg.block_write_bytes as f64,
            "{c}"
        );
    }
    assert_eq!(
        value(&s, r#"ethand_cgroup_cpu_seconds_total{cgroup="unknown"}"#),
        0.25
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_cgroup_cpu_seconds_total{cgroup="/system.slice/web.service"}"#
        ),
        1.75
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_cgroup_processes{cgroup="/system.slice/db.service"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &s,
            r#"ethand_cgroup_processes{cgroup="/system.slice/gone.service"}"#
        ),
        0.0
    );
    // Only the snapshot's cgroups: no series for the raw "" cgroup of kworker.
    let rendered: BTreeSet<String> = s
        .keys()
        .filter(|k| k.starts_with("ethand_cgroup_processes{"))
        .map(|k| k.split('"').nth(1).unwrap().to_owned())
        .collect();
    let listed: BTreeSet<String> = snap.cgroups.iter().map(|c| c.cgroup.clone()).collect();
    assert_eq!(rendered, listed);

    // Per-process series do not move the cgroup series: the same with every process
    // selected, with none, and with the usual selection.
    let usual = cgroup_samples(&s);
    assert_eq!(usual.len(), 13 * snap.cgroups.len());
    for opts in [
        PrometheusOptions::default(),
        PrometheusOptions {
            selection: ExportSelection::Once(SelectionPolicy {
                top_n: 100,
                pids: vec![200],
                ..Default::default()
            }),
            ..Default::default()
        },
    ] {
        let other = cgroup_samples(&samples(&render(&snap, &opts)));
        assert_eq!(other, usual, "{opts:?}");
    }
}

#[test]
fn syscalls_top_8_and_other() {
    let s = samples(&render(&snapshot(), &options()));
    let p = r#"pid="100",comm="web""#;
    for i in 0..8 {
        let l = format!(r#"{{{p},syscall="s{i}"}}"#);
        assert_eq!(
            value(&s, &format!("ethand_process_syscalls_total{l}")),
            (100 + i) as f64
        );
        assert_eq!(
            value(&s, &format!("ethand_process_syscall_seconds_total{l}")),
            (10_000 - 1_000 * i) as f64 / 1e9
        );
    }
    assert!(!s.contains_key(&format!(
        r#"ethand_process_syscalls_total{{{p},syscall="s8"}}"#
    )));
    // s8 and s9 plus the 5 calls no row accounts for.
    let other = format!(r#"{{{p},syscall="other"}}"#);
    assert_eq!(
        value(&s, &format!("ethand_process_syscalls_total{other}")),
        (108 + 109 + 5) as f64
    );
    assert_eq!(
        value(&s, &format!("ethand_process_syscall_errors_total{other}")),
        17.0
    );
    assert_eq!(
        value(&s, &format!("ethand_process_syscall_seconds_total{other}")),
        3e-6
    );
}

#[test]
fn histograms() {
    let text = render(&snapshot(), &options());
    let s = samples(&text);
    let p = r#"pid="100",comm="web""#;
    let runq = |le: &str| {
        value(
            &s,
            &format!(r#"ethand_process_runq_wait_seconds_bucket{{{p},le="{le}"}}"#),
        )
    };
    // 14 buckets from 2^10 ns: the kernel's buckets below 1.024 µs are all in the first.
    assert_eq!(runq("1.024e-06"), 5.0);
    assert_eq!(runq("4.096e-06"), 5.0);
    assert!(!text.contains("le=\"2e-09\""));
    assert!(!text.contains("le=\"6.4e-08\""));
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with(&format!("ethand_process_runq_wait_seconds_bucket{{{p},")))
            .count(),
        13
    );
    // The last kernel bucket is open-ended: it is only in +Inf.
    assert_eq!(runq("2.147483648"), 5.0);
    assert_eq!(runq("+Inf"), 6.0);
    assert!(!text.contains("le=\"4.294967296\""));
    assert_eq!(
        value(
            &s,
            &format!("ethand_process_runq_wait_seconds_count{{{p}}}")
        ),
        6.0
    );
    assert_eq!(
        value(&s, &format!("ethand_process_runq_wait_seconds_sum{{{p}}}")),
        3e-6
    );

    // Syscall class: sum estimated as 4 * 2^10.5 ns (1448 ns each, truncated).
    let futex = format!(r#"{{{p},class="futex"}}"#);
    assert_eq!(
        value(
            &s,
            &format!("ethand_process_syscall_latency_seconds_count{futex}")
        ),
        4.0
    );
    assert_eq!(
        value(
            &s,
            &format!("ethand_process_syscall_latency_seconds_sum{futex}")
        ),
        5_792e-9
    );

    // Node block latency is the snapshot's block_devices, not a merge of the processes'
    // entries (200, 300 and 301 hold 4 vda writes; the node saw 6).
    let w = r#"device="vda",op="write""#;
    assert_eq!(
        value(&s, &format!("ethand_block_io_queue_seconds_count{{{w}}}")),
        6.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_block_io_queue_seconds_bucket{{{w},le="1.024e-06"}}"#)
        ),
        6.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_block_io_queue_seconds_bucket{{{w},le="1.024e-06"}}"#)
        ),
        6.0
    );
    assert_eq!(
        value(&s, &format!("ethand_block_io_queue_seconds_sum{{{w}}}")),
        6e-6
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_block_io_service_seconds_bucket{{{w},le="1.6384e-05"}}"#)
        ),
        0.0
    );
    assert_eq!(
        value(
            &s,
            &format!(r#"ethand_block_io_service_seconds_bucket{{{w},le="6.5536e-05"}}"#)
        ),
        6.0
    );
    assert_eq!(
        value(&s, &format!("ethand_block_io_service_seconds_count{{{w}}}")),
        6.0
    );
    assert_eq!(
        value(&s, &format!("ethand_block_io_service_seconds_sum{{{w}}}")),
        250_000e-9
    );
    let r = r#"device="vda",op="read""#;
    assert_eq!(
        value(&s, &format!("ethand_block_io_service_seconds_count{{{r}}}")),
        4.0
    );
    assert_eq!(
        value(&s, &format!("ethand_block_io_service_seconds_sum{{{r}}}")),
        210_000e-9
    );
    // A device only block_devices knows of.
    let f = r#"device="nvme0n1",op="flush""#;
    assert_eq!(
        value(&s, &format!("ethand_block_io_queue_seconds_count{{{f}}}")),
        1.0
    );
    assert_eq!(
        value(&s, &format!("ethand_block_io_service_seconds_sum{{{f}}}")),
        90_000e-9
    );
    // sdb is only in app's (600, selected) block entries: per-process series, but no node
    // histogram.
    assert_eq!(
        value(
            &s,
            r#"ethand_process_block_io_operations_total{pid="600",comm="app",device="sdb",op="read"}"#
        ),
        7.0
    );
    assert!(
        !s.keys()
            .any(|k| k.starts_with("ethand_block_io_") && k.contains("sdb")),
        "{text}"
    );
    // Exactly one node series per block_devices entry.
    let node_block: BTreeSet<&str> = s
        .keys()
        .filter_map(|k| k.strip_prefix("ethand_block_io_queue_seconds_count{"))
        .collect();
    assert_eq!(
        node_block,
        BTreeSet::from([
            r#"device="nvme0n1",op="flush"}"#,
            r#"device="vda",op="read"}"#,
            r#"device="vda",op="write"}"#,
        ])
    );

    // Every histogram: 13 non-decreasing buckets, the last one +Inf and equal to _count.
    let mut groups: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for (series, v) in &s {
        let Some((name, labels)) = series.split_once("_bucket{") else {
            continue;
        };
        let (labels, le) = labels.rsplit_once("le=").unwrap();
        let labels = labels.trim_end_matches(',');
        let count = if labels.is_empty() {
            format!("{name}_count")
        } else {
            format!("{name}_count{{{labels}}}")
        };
        groups
            .entry(count)
            .or_default()
            .push((le.trim_end_matches('}').trim_matches('"').to_owned(), *v));
    }
    assert!(groups.len() > 5);
    for (count, buckets) in &mut groups {
        let le = |b: &(String, f64)| b.0.parse::<f64>().unwrap();
        buckets.sort_by(|a, b| le(a).total_cmp(&le(b)));
        assert_eq!(buckets.len(), EXPOSED_BUCKETS, "{count}");
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{count}: {buckets:?}"
        );
        assert_eq!(
            buckets.last().unwrap(),
            &("+Inf".to_owned(), value(&s, count)),
            "{count}"
        );
    }
}

/// Major faults where /proc was read (the trainer); no series, never a 0, where it was not.
#[test]
fn major_faults_only_where_read() {
    let text = render(&device_snapshot(), &options());
    let faults: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ethand_process_major_page_faults_total{"))
        .collect();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(
        faults[0].contains("pid=\"800\"") && faults[0].ends_with("} 12"),
        "{}",
        faults[0]
    );
}

/// Resident memory by kind, swap and faults for the selected process that has them; none for
/// processes whose memory was not read.
#[test]
fn process_memory_series_where_read() {
    let text = render(&device_snapshot(), &options());
    let series = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| {
                let (labels, v) = l.rsplit_once(' ').unwrap();
                let kind = labels
                    .split("kind=\"")
                    .nth(1)
                    .map_or("", |k| k.split('"').next().unwrap());
                assert!(labels.contains("pid=\"800\""), "{l}");
                format!("{kind}={v}")
            })
            .collect()
    };
    assert_eq!(
        series("ethand_process_memory_rss_bytes{"),
        ["anon=4194304", "file=2097152", "shmem=1048576"]
    );
    assert_eq!(series("ethand_process_memory_swap_bytes{"), ["=4096"]);
    assert_eq!(
        series("ethand_process_page_faults_total{"),
        ["major=12", "minor=3000"]
    );
}

#[test]
fn catalog_lists_every_family() {
    let catalog = metric_catalog();
    let names: BTreeSet<_> = catalog.iter().map(|c| c.0).collect();
    assert_eq!(names.len(), catalog.len(), "duplicate names");
    for (name, kind, help) in &catalog {
        // DCGM_FI_*: dcgm-exporter's names, an optional alias output (its types: counters
        // without `_total`).
        assert!(
            name.starts_with("ethand_") || name.starts_with("DCGM_FI_"),
            "{name}"
        );
        if name.starts_with("ethand_") {
            assert_eq!(name.ends_with("_total"), *kind == "counter", "{name}");
        }
        assert!(help.ends_with('.') && help.contains(' '), "{name}: {help}");
    }
    let all = PrometheusOptions {
        dcgm_aliases: true,
        ..options()
    };
    let text = render(&device_snapshot(), &all);
    let rendered: BTreeSet<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (n, t) = l.split_once(' ').unwrap();
            (n.to_owned(), t.to_owned())
        })
        .collect();
    let listed: BTreeSet<(String, String)> = catalog
        .iter()
        .map(|(n, t, _)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(rendered, listed);
    for (name, _, help) in &catalog {
        assert!(text.contains(&format!("# HELP {name} {help}\n")), "{name}");
    }
}

/// `promtool check metrics` on `text`: its exit status and what it printed.
fn promtool(text: &str) -> (std::process::ExitStatus, String) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!(
                "promtool not found: run scripts/setup.sh --tests (installs Debian's prometheus)"
            )
        }
        Err(e) => panic!("running promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, report)
}

#[test]
fn promtool_check_metrics() {
    for (what, snap) in [("base", snapshot()), ("devices", device_snapshot())] {
        let (status, report) = promtool(&render(&snap, &options()));
        assert!(
            status.success(),
            "promtool check metrics ({what}): {status}\n{report}"
        );
        assert!(
            report.trim().is_empty(),
            "promtool check metrics ({what}) reported:\n{report}"
        );
    }
}

/// With the DCGM aliases, the only complaints allowed are about dcgm-exporter's own names,
/// which the aliases keep on purpose: its camelCase label (`modelName`), its counters
/// without a `_total` suffix and `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`'s "counter" in the name. The exposition is valid and every other lint passes.
#[test]
fn promtool_check_metrics_dcgm_aliases() {
    let all = PrometheusOptions {
        dcgm_aliases: true,
        ..options()
    };
    let text = render(&device_snapshot(), &all);
    assert!(text.contains("DCGM_FI_DEV_GPU_UTIL{"), "{text}");
    let (status, report) = promtool(&text);
    // 0: clean; 3: lint problems only (a parse error is 1).
    assert!(
        matches!(status.code(), Some(0 | 3)),
        "promtool check metrics: {status}\n{report}"
    );
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        let (family, problem) = line.split_once(' ').unwrap_or((line, ""));
        assert!(
            family.starts_with("DCGM_FI_")
                && (problem == "label names should be written in 'snake_case' not 'camelCase'"
                    || problem == "counter metrics should have \"_total\" suffix"
                    || problem == "metric name should not include type 'counter'"),
            "promtool check metrics reported:\n{report}"
        );
    }
}

// ------------------------------------------------------------------ docs/metrics.md

/// Every label ethand puts on a series, and what bounds its values. The catalog test fails
/// when a family carries a label missing here, so the bounds cannot go stale.
const LABEL_BOUNDS: &[(&str, &str)] = &[
    (
        "pid",
        "`prometheus.top_n` held slots (default 20) plus the configured `pids`, `comms`, `cgroups` and GPU/NPU users",
    ),
    (
        "comm",
        "one per `pid` series; per-name series: at most 128 names plus `[other names]`",
    ),
    (
        "cgroup",
        "cgroup v2 paths on the node (one per container, slice or service)",
    ),
    ("syscall", "8 per process (the most time) plus `other`"),
    ("class", "7 blocking syscall classes"),
    ("device", "block devices, or GPU/NPU devices on the node"),
    (
        "op",
        "block: `read`, `write`, `flush`, `discard`, `other`; collectives: 8 operations",
    ),
    ("direction", "2 (network) or 6 (GPU copies)"),
    ("state", "2 (`blocked`, `preempted`) or 4 probe states"),
    (
        "kind",
        "up to 4 (GPU memory kinds, launch kinds, context switch kinds)",
    ),
    ("probe", "one per probe (about 30)"),
    ("program", "one per BPF program (about 40)"),
    ("map", "one per BPF map (about 30)"),
    (
        "reason",
        "one per drop counter (about 10); 2 connection refusals (`limit`, `peer_limit`)",
    ),
    ("server", "2 (`metrics`, `api`)"),
    ("loss", "2"),
    ("version", "1"),
    ("library", "GPU/NPU runtime libraries attached (a few)"),
    ("runtime", "4 (`cuda`, `nccl`, `ascendcl`, `hccl`)"),
    (
        "rank",
        "one per process (its rank: RANK-like variable, else NCCL/HCCL; on collective series the communicator's)",
    ),
    (
        "namespace",
        "one per process or cgroup (its pod's namespace); on GPU series (`devices.workload_labels`) one per GPU, its owner's",
    ),
    (
        "pod",
        "one per process or cgroup (its pod); on GPU series one per GPU (its owner's, `devices.workload_labels`)",
    ),
    (
        "container",
        "one per process or cgroup (its container); on GPU series one per GPU (its owner's)",
    ),
    (
        "job_id",
        "one per process (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...); on GPU series one per GPU (its owner's)",
    ),
    ("container_id", "one per process (workload info)"),
    ("container_runtime", "3 (`containerd`, `cri-o`, `docker`)"),
    ("pod_uid", "one per process (workload info)"),
    ("qos_class", "3 (`guaranteed`, `burstable`, `besteffort`)"),
    ("nranks", "one per process"),
    ("gpu", "GPUs on the node"),
    ("npu", "NPUs on the node"),
    ("uuid", "one per GPU"),
    ("UUID", "one per GPU (DCGM alias)"),
    ("pci_bus_id", "one per GPU"),
    ("modelName", "one per GPU (DCGM alias)"),
    ("model", "one per device"),
    ("Hostname", "1 (DCGM alias)"),
    ("DCGM_FI_DRIVER_VERSION", "1 (DCGM alias)"),
    (
        "err_code",
        "XID codes seen, one at a time per GPU (DCGM alias: the last one)",
    ),
    (
        "err_msg",
        "one per `err_code`: a fixed table of about 20 XID meanings, else `Unknown Error` (DCGM alias)",
    ),
    (
        "cause",
        "2: remapped rows `correctable`, `uncorrectable`; retired pages `single_bit`, `double_bit`",
    ),
    ("hostname", "1"),
    ("link", "NVLink links per GPU (up to 18)"),
    ("reason_name", "throttle reasons (about 10)"),
    (
        "xid",
        "XID codes seen (a few; codes above 1023 as `other`, so at most 1,025)",
    ),
    ("type", "ECC: 2 (`corrected`, `uncorrected`)"),
    ("clock", "clock domains (3)"),
    ("driver", "1"),
    ("result", "2 (`ok`, `failed`)"),
    ("card", "one per NPU (DCMI card id)"),
    ("chip", "one per NPU (DCMI chip id)"),
    ("collector", "2 (`nvml`, `dcmi`)"),
    (
        "memory",
        "4 GPU memory kinds (`device`, `managed`, `host_pinned`, `host_registered`)",
    ),
    ("name", "one per device (model name)"),
    ("operation", "8 collective operations"),
    ("protocol", "2 (`tcp`, `udp`)"),
    (
        "symbol",
        "probed catalog symbols a process called (at most 92)",
    ),
];

/// The labels of each family in a rendering that has every family (`le` left out).
fn labels_by_family(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' ').map(|(n, _)| n))
        .collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if line.trim().is_empty() {
            continue;
        }
        let (series, labels) = match line.split_once('{') {
            Some((series, labels)) => (series, labels),
            None => (line.split_whitespace().next().unwrap_or(""), ""),
        };
        let family = families
            .iter()
            .find(|f| {
                series == **f
                    || ["_bucket", "_sum", "_count", "_total"]
                        .iter()
                        .any(|suffix| series == format!("{f}{suffix}"))
            })
            .unwrap_or_else(|| panic!("series {series} of no family"));
        let set = out.entry(family.to_string()).or_default();
        // name="value" pairs; values are escaped, so split on `",` boundaries.
        let body = labels.rsplit_once('}').map_or(labels, |(b, _)| b);
        for pair in body.split("\",") {
            if let Some((name, _)) = pair.split_once("=\"")
                && name != "le"
            {
                set.insert(name.trim_start_matches(',').to_string());
            }
        }
    }
    out
}

fn unit_of(name: &str) -> &'static str {
    let base = name.strip_suffix("_total").unwrap_or(name);
    for (suffix, unit) in [
        ("_seconds", "seconds"),
        ("_bytes", "bytes"),
        ("_ratio", "ratio (0-1)"),
        ("_celsius", "celsius"),
        ("_watts", "watts"),
        ("_joules", "joules"),
        ("_hertz", "hertz"),
        ("_entries", "entries"),
        ("_info", "info (1)"),
    ] {
        if base.ends_with(suffix) {
            return unit;
        }
    }
    if name.starts_with("DCGM_FI_") {
        return "as dcgm-exporter";
    }
    "count"
}

/// Help text split into meaning and source: the source is the last parenthesised part.
fn meaning_and_source(help: &str) -> (String, String) {
    let body = help.trim_end_matches('.');
    if body.ends_with(')')
        && let Some(open) = body.rfind(" (")
    {
        let source = &body[open + 2..body.len() - 1];
        return (format!("{}.", &body[..open]), source.to_string());
    }
    (help.to_string(), String::new())
}

fn render_doc() -> String {
    let all = PrometheusOptions {
        dcgm_aliases: true,
        ..options()
    };
    let labels = labels_by_family(&render(&device_snapshot(), &all));
    let mut s = String::from(
        "# Metrics\n\nGenerated from `ethand_exporters::prometheus::metric_catalog()` and a rendering of\n\
         every family by `UPDATE_DOCS=1 cargo test -p ethand-exporters --test prometheus metrics_doc`;\n\
         CI fails when this file and the code disagree.\n\n\
         Per-process series (`pid`, `comm`) exist for up to `prometheus.top_n` (default 20) of\n\
         the busiest processes plus the pids, comms and cgroups configured in `[prometheus]` and\n\
         every GPU/NPU user. A process takes a slot only once it is\n\
         `prometheus.selection_min_age_seconds` old (30) and keeps it until it exits or has used\n\
         no CPU for `prometheus.selection_hold_seconds` (300), so its series have no holes; a\n\
         newcomer takes a held slot only with twice the holder's CPU, after the hold. Every\n\
         process, with or without its own series, is also counted in its cgroup's\n\
         `ethand_cgroup_*` series, which keep the totals of exited processes and so only grow.\n\
         Histograms expose 13 buckets: every second power of two of nanoseconds from 2^10 ns\n\
         (1.024 µs) to 2^30 ns (1.07 s), then 2^31 ns (2.15 s) and +Inf, in seconds; each bound\n\
         is one of the kernel's log2 bucket bounds, so the counts are exact.\n\n\
         ## Series budget\n\n\
         A selected process has about 50 series (CPU, off-CPU, switches, 8 syscalls plus\n\
         `other` with counts, errors and time, two histograms of 16 lines each, I/O, TCP,\n\
         threads); a GPU user about 40 more. At the defaults a node exposes about 20 x 50 =\n\
         1,000 per-process series, plus about 10 per cgroup and the node's block, BPF and\n\
         device series. `cargo xtask bench --suites series` measures it with a real Prometheus\n\
         scraping for 10 minutes under 1,000 processes and 100 births/s (docs/performance.md).\n\n\
         ## Label cardinality\n\n| label | values bounded by |\n|---|---|\n",
    );
    let used: BTreeSet<&String> = labels.values().flatten().collect();
    for (label, bound) in LABEL_BOUNDS {
        if used.contains(&label.to_string()) {
            s.push_str(&format!("| `{label}` | {bound} |\n"));
        }
    }
    s.push_str(
        "\n## Families\n\n| name | type | unit | labels | meaning | source |\n|---|---|---|---|---|---|\n",
    );
    for (name, kind, help) in metric_catalog() {
        let (meaning, source) = meaning_and_source(help);
        let ls: Vec<String> = labels
            .get(name)
            .map(|l| l.iter().map(|x| format!("`{x}`")).collect())
            .unwrap_or_default();
        s.push_str(&format!(
            "| `{name}` | {kind} | {} | {} | {} | {} |\n",
            unit_of(name),
            ls.join(", "),
            meaning.replace('|', "\\|"),
            source.replace('|', "\\|")
        ));
    }
    s
}

#[test]
fn metrics_doc_is_current() {
    let all = PrometheusOptions {
        dcgm_aliases: true,
        ..options()
    };
    let labels = labels_by_family(&render(&device_snapshot(), &all));
    for name in metric_catalog().iter().map(|c| c.0) {
        assert!(
            labels.contains_key(name),
            "{name} has no series in the full rendering"
        );
    }
    let bounded: BTreeSet<&str> = LABEL_BOUNDS.iter().map(|b| b.0).collect();
    assert_eq!(
        bounded.len(),
        LABEL_BOUNDS.len(),
        "a label listed twice in LABEL_BOUNDS"
    );
    let unbounded: BTreeSet<String> = labels
        .iter()
        .flat_map(|(family, ls)| {
            ls.iter()
                .filter(|l| !bounded.contains(l.as_str()))
                .map(move |l| format!("{l} (of {family})"))
        })
        .collect();
    assert!(
        unbounded.is_empty(),
        "labels without a documented bound (add them to LABEL_BOUNDS): {unbounded:?}"
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let want = render_doc();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md is stale: run UPDATE_DOCS=1 cargo test -p ethand-exporters --test prometheus metrics_doc"
    );
}

// ------------------------------------------------ dcgm-exporter's defaults and dashboard

/// dcgm-exporter's labels on every GPU series (`Hostname`: the name of released versions;
/// its HEAD writes `hostname`).
const DCGM_LABELS: &[&str] = &[
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
];

/// Default fields ethand does not give, and why (docs/gpu-metrics-mapping.md says the same).
const DCGM_NOT_GIVEN: &[(&str, &str)] = &[(
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "only meaningful inside a vGPU guest VM; ethand does not read vGPU licensing",
)];

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// (field, type) of every enabled line of dcgm-exporter's default-counters.csv.
fn dcgm_default_fields() -> Vec<(String, String)> {
    fixture("dcgm-default-counters.csv")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut cols = l.split(',').map(str::trim);
            let name = cols.next().unwrap().to_owned();
            let kind = cols.next().unwrap_or_else(|| panic!("{l}")).to_owned();
            (name, kind)
        })
        .collect()
}

/// The label names of one sample line.
fn line_labels(line: &str) -> BTreeSet<String> {
    let body = line
        .split_once('{')
        .and_then(|(_, b)| b.rsplit_once('}'))
        .map_or("", |(b, _)| b);
    body.split("\",")
        .filter_map(|p| p.split_once("=\"").map(|(n, _)| n.to_owned()))
        .collect()
}

/// The H200 of `device_snapshot` owned by the pod of `workload_process` (pid 800).
fn owned_gpu_snapshot() -> NodeSnapshot {
    let mut snap = device_snapshot();
    snap.devices.processes[0].pid = 800;
    snap
}

#[test]
fn dcgm_default_counters_are_all_aliased() {
    let fields = dcgm_default_fields();
    // 26 enabled lines at d5e5f51, the driver-version label among them.
    assert_eq!(fields.len(), 26, "{fields:?}");
    for workload in [false, true] {
        let opts = PrometheusOptions {
            dcgm_aliases: true,
            device_workload_labels: workload,
            ..options()
        };
        let text = render(&owned_gpu_snapshot(), &opts);
        let mut wanted: Vec<&str> = DCGM_LABELS.to_vec();
        if workload {
            wanted.extend(["namespace", "pod", "container"]);
        }
        for (name, kind) in &fields {
            if DCGM_NOT_GIVEN.iter().any(|(n, _)| n == name) {
                assert!(!text.contains(&format!("\n{name}{{")), "{name}");
                continue;
            }
            if kind == "label" {
                // A label on every series rather than a family.
                assert!(!text.contains(&format!("# TYPE {name} ")), "{name}");
                let h200 = text
                    .lines()
                    .filter(|l| l.starts_with("DCGM_FI_") && l.contains("GPU-5f1e"));
                for l in h200 {
                    assert!(l.contains(&format!("{name}=\"580.65.06\"")), "{l}");
                }
                continue;
            }
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name}: not a {kind} in the alias output"
            );
            let h200: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("GPU-5f1e"))
                .collect();
            assert_eq!(h200.len(), 1, "{name}: {h200:?}");
            let have = line_labels(h200[0]);
            for label in &wanted {
                assert!(have.contains(*label), "{name} lacks {label}: {}", h200[0]);
            }
        }
    }
}

/// Every metric and label dcgm-exporter's own dashboard queries exists in alias mode
/// (`instance` is Prometheus' target label).
#[test]
fn dcgm_dashboard_queries_work() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&fixture("dcgm-exporter-dashboard.json")).unwrap();
    let mut queries = Vec::new();
    let mut legends = Vec::new();
    fn walk<'a>(v: &'a serde_json::Value, q: &mut Vec<&'a str>, l: &mut Vec<&'a str>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x.as_str()) {
                        ("expr" | "query" | "definition", Some(s)) => q.push(s),
                        ("legendFormat", Some(s)) => l.push(s),
                        _ => walk(x, q, l),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, q, l)),
            _ => {}
        }
    }
    walk(&dashboard, &mut queries, &mut legends);
    let mut metrics = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for q in &queries {
        let mut rest = *q;
        while let Some(at) = rest.find("DCGM_FI_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            metrics.insert(tail[..end].to_owned());
            let after = &tail[end..];
            if let Some(body) = after.strip_prefix('{') {
                let body = &body[..body.find('}').unwrap()];
                for m in body.split(',') {
                    let name = m.split(['=', '!']).next().unwrap().trim();
                    labels.insert(name.to_owned());
                }
            } else if let Some(arg) = after.strip_prefix(", ").or(after.strip_prefix(',')) {
                // label_values(METRIC, LABEL)
                labels.insert(arg.split(')').next().unwrap().trim().to_owned());
            }
            rest = after;
        }
    }
    for l in &legends {
        for part in l.split("{{").skip(1) {
            labels.insert(part.split("}}").next().unwrap().trim().to_owned());
        }
    }
    labels.remove("instance");
    assert!(
        metrics.len() >= 6 && labels.contains("gpu"),
        "{metrics:?} {labels:?}"
    );
    let text = render(
        &device_snapshot(),
        &PrometheusOptions {
            dcgm_aliases: true,
            ..options()
        },
    );
    for m in &metrics {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{m}{{")))
            .collect();
        assert!(!lines.is_empty(), "the dashboard's {m} is not exported");
        for l in &lines {
            let have = line_labels(l);
            for label in &labels {
                assert!(have.contains(label), "{m} lacks {label}: {l}");
            }
        }
    }
}
