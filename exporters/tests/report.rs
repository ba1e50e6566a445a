//! The flat report formats of a synthetic snapshot (`ethand snapshot --csv`) and the
//! comparison of two synthetic snapshots (`ethand compare`): exact values, CSV quoting read
//! back with an RFC 4180 reader of our own, rates over windows of different lengths, findings
//! matched by id.
use std::collections::{BTreeMap, BTreeSet};

use ethand_exporters::report::{
    Comparison, compare, comparison_to_csv, metrics_rows, process_info_metric, render_comparison,
    to_csv,
};
use ethand_snapshot::diagnosis::{Finding, NotEvaluated};
use ethand_snapshot::gpu::{
    CollectiveStats, GpuCopyStats, GpuDerived, GpuMemoryStats, GpuProcessStats, GpuTimedCalls,
    LaunchSample, LaunchSampleProcess, ProcessDeviceUsage,
};
use ethand_snapshot::*;

const WEIRD_COMM: &str = "we,ird \"na\"me\nx\r";

/// RFC 4180 reader: records of fields; quoted fields may hold commas, doubled quotes, CR and
/// LF. Accepts CRLF or LF line ends. Panics on malformed input.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted_field = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if field.is_empty() && !quoted_field => {
                quoted_field = true;
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(c) => field.push(c),
                        None => panic!("unterminated quoted field"),
                    }
                }
                match chars.peek() {
                    None | Some(',') | Some('\n') | Some('\r') => {}
                    Some(c) => panic!("{c:?} after a closing quote"),
                }
            }
            '"' => panic!("quote inside an unquoted field {field:?}"),
            ',' => {
                record.push(std::mem::take(&mut field));
                quoted_field = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
                quoted_field = false;
            }
            c => field.push(c),
        }
    }
    assert!(
        field.is_empty() && record.is_empty(),
        "the last record lacks its line end"
    );
    records
}

fn finding(id: &str, title: &str, impact: f64) -> Finding {
    Finding {
        id: id.into(),
        title: title.into(),
        severity: ethand_snapshot::diagnosis::Severity::Warning,
        impact,
        ..Default::default()
    }
}

fn gpu_stats() -> GpuProcessStats {
    GpuProcessStats {
        launches: Some(5000),
        copies: vec![
            GpuCopyStats {
                direction: "host_to_device".into(),
                calls: 10,
                bytes: 1 << 30,
            },
            GpuCopyStats {
                direction: "device_to_host".into(),
                calls: 2,
                bytes: 4096,
            },
        ],
        sync: GpuTimedCalls {
            calls: 100,
            time_ns: 2_000_000_000,
            timed_calls: 100,
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
            calls: 7,
            bytes: 7 << 20,
            time_ns: 70_000,
            timed_calls: 7,
        }],
        ..Default::default()
    }
}

fn process(pid: u32, comm: &str, syscalls: u64, window: Option<WindowStats>) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        comm: comm.into(),
        alive: true,
        sched: SchedStats {
            oncpu_ns: 3_000_000_000,
            ..Default::default()
        },
        syscalls: SyscallStats {
            count: syscalls + 10,
            errors: 10,
            time_ns: 1_000_000,
            by_nr: vec![
                SyscallRow {
                    nr: 39,
                    name: "getpid".into(),
                    count: syscalls,
                    errors: 0,
                    time_ns: 500_000,
                },
                SyscallRow {
                    nr: 257,
                    name: "openat".into(),
                    count: 10,
                    errors: 10,
                    time_ns: 500_000,
                },
            ],
            latency: Vec::new(),
        },
        block: vec![BlockStats {
            device: "253:0".into(),
            device_name: "vda".into(),
            op: "read".into(),
            ops: 4,
            bytes: 16384,
            ..Default::default()
        }],
        net: NetStats {
            tcp_tx_bytes: 1000,
            ..Default::default()
        },
        window,
        ..Default::default()
    }
}

/// A tree with its totals summed the way the daemon sums them.
fn tree(source: &str, measured_ms: u64, processes: Vec<ProcessSnapshot>) -> TreeSnapshot {
    let mut total = TreeTotals::default();
    for p in &processes {
        total.processes += 1;
        total.sched.add(&p.sched);
        total.syscalls += p.syscalls.count;
        total.syscall_errors += p.syscalls.errors;
        total.syscall_time_ns += p.syscalls.time_ns;
        for b in &p.block {
            if b.op == "read" {
                total.block_read_bytes += b.bytes;
                total.block_read_ops += b.ops;
            }
        }
        total.net.add(&p.net);
        if let Some(g) = &p.gpu {
            total.gpu.get_or_insert_with(Default::default).add(g);
        }
    }
    TreeSnapshot {
        schema_version: SCHEMA_VERSION,
        source: match source {
            "standalone" => ethand_snapshot::SnapshotSource::Standalone,
            _ => ethand_snapshot::SnapshotSource::Daemon,
        },
        root_pid: processes.first().map_or(0, |p| p.pid),
        taken_at_unix_ms: 1_764_000_000_000,
        measured_ms,
        processes,
        total,
        ..Default::default()
    }
}

fn window(duration_ms: u64, syscalls: u64) -> WindowStats {
    WindowStats {
        duration_ms,
        syscalls,
        oncpu_ns: duration_ms * 500_000, // half a CPU
        ..Default::default()
    }
}

fn value(rows: &[ethand_exporters::report::MetricRow], scope: &str, metric: &str) -> f64 {
    rows.iter()
        .find(|r| r.scope == scope && r.metric == metric)
        .unwrap_or_else(|| panic!("no row {scope} {metric}"))
        .value
}

#[test]
fn csv_quotes_weird_process_names_and_parses_back() {
    let mut t = tree(
        "daemon",
        0,
        vec![
            process(100, "python3", 1000, Some(window(10_000, 100))),
            process(101, WEIRD_COMM, 5, None),
        ],
    );
    t.findings = vec![finding(
        "input_pipeline_stall",
        "Input, \"pipeline\" stall",
        0.5,
    )];
    let csv = to_csv(&t);
    let records = parse_csv(&csv);
    assert_eq!(records[0], ["scope", "metric", "value", "unit"]);
    for r in &records {
        assert_eq!(r.len(), 4, "every record has 4 fields: {r:?}");
    }
    // The weird name comes back intact, inside the info row's metric.
    let info = process_info_metric(WEIRD_COMM);
    let row = records
        .iter()
        .find(|r| r[1] == info)
        .unwrap_or_else(|| panic!("no info row {info:?} in\n{csv}"));
    assert_eq!(row[0], "pid:101");
    assert_eq!(row[2], "1");
    let parsed: String = serde_json::from_str(
        row[1]
            .strip_prefix("process.info{comm=")
            .and_then(|s| s.strip_suffix('}'))
            .expect("info metric shape"),
    )
    .expect("comm is a JSON string");
    assert_eq!(parsed, WEIRD_COMM);
    // Same rows as metrics_rows, in the same order, then the finding.
    let rows = metrics_rows(&t);
    assert_eq!(records.len(), 1 + rows.len() + 1);
    for (rec, row) in records[1..].iter().zip(&rows) {
        assert_eq!(rec[0], row.scope);
        assert_eq!(rec[1], row.metric);
        assert_eq!(rec[2].parse::<f64>().unwrap(), row.value);
        assert_eq!(rec[3], row.unit);
    }
    assert_eq!(
        records.last().unwrap(),
        &["finding", "input_pipeline_stall", "0.5", "impact"]
    );
    // Exact values.
    let get = |scope: &str, metric: &str| -> String {
        records
            .iter()
            .find(|r| r[0] == scope && r[1] == metric)
            .unwrap_or_else(|| panic!("no {scope} {metric}"))[2]
            .clone()
    };
    assert_eq!(get("total", "syscalls.getpid.count"), "1005");
    assert_eq!(get("pid:100", "syscalls.getpid.count"), "1000");
    assert_eq!(get("pid:101", "syscalls.openat.errors"), "10");
    assert_eq!(get("total", "syscalls.count"), "1025");
    assert_eq!(get("total", "block.vda.read.bytes"), "32768");
    assert_eq!(get("total", "net.tcp_tx_bytes"), "2000");
    assert_eq!(get("total", "window.syscalls"), "100");
    assert_eq!(get("total", "window.duration_ns"), "10000000000");
    assert_eq!(get("total", "derived.cpu.oncpu_ratio"), "0.5");
    assert!(
        !records
            .iter()
            .any(|r| r[0] == "pid:101" && r[1].starts_with("window."))
    );
}

#[test]
fn rows_cover_gpu_sections_and_are_deterministic() {
    let mut p = process(7, "train", 10, Some(window(2000, 10)));
    p.gpu = Some(gpu_stats());
    p.devices = vec![ProcessDeviceUsage {
        device: "gpu0".into(),
        uuid: "GPU-0".into(),
        memory_used_bytes: 1 << 30,
        utilization_ratio: Some(0.25),
        device_utilization_ratio: Some(0.5),
    }];
    if let Some(w) = p.window.as_mut() {
        w.gpu_launches = Some(400);
        w.gpu_sync_ns = 1_000_000_000;
    }
    let mut t = tree("daemon", 0, vec![p]);
    t.total.gpu_derived = Some(GpuDerived {
        window_ms: 2000,
        launches_per_second: Some(200.0),
        sync_blocked_ratio: 0.5,
        collective_ratio: 0.01,
        copy_bytes_per_second: vec![("host_to_device".into(), 1e9)],
        device_utilization_ratio: Some(0.5),
        device_idle_ratio: Some(0.5),
        ..Default::default()
    });
    t.devices.gpus = vec![ethand_snapshot::devices::GpuDevice {
        index: 0,
        utilization_ratio: Some(0.5),
        memory_used_bytes: Some(1 << 30),
        power_watts: Some(300.0),
        ..Default::default()
    }];
    let rows = metrics_rows(&t);
    for scope in ["total", "pid:7"] {
        assert_eq!(value(&rows, scope, "gpu.launches"), 5000.0);
        assert_eq!(
            value(&rows, scope, "gpu.copies.host_to_device.bytes"),
            (1u64 << 30) as f64
        );
        assert_eq!(value(&rows, scope, "gpu.copies.device_to_host.calls"), 2.0);
        assert_eq!(value(&rows, scope, "gpu.sync.time_ns"), 2e9);
        assert_eq!(
            value(&rows, scope, "gpu.memory.device.live_bytes"),
            (2u64 << 20) as f64
        );
        assert_eq!(
            value(&rows, scope, "gpu.collectives.nccl.all_reduce.bytes"),
            (7u64 << 20) as f64
        );
        assert_eq!(value(&rows, scope, "window.gpu_launches"), 400.0);
    }
    assert_eq!(value(&rows, "total", "derived.gpu.sync_blocked_ratio"), 0.5);
    assert_eq!(
        value(
            &rows,
            "total",
            "derived.gpu.copy_bytes_per_second.host_to_device"
        ),
        1e9
    );
    assert_eq!(value(&rows, "total", "derived.gpu.device_idle_ratio"), 0.5);
    assert_eq!(value(&rows, "pid:7", "device.gpu0.utilization_ratio"), 0.25);
    assert_eq!(value(&rows, "device:gpu0", "power_watts"), 300.0);
    let units: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.metric.as_str(), r.unit.as_str()))
        .collect();
    assert_eq!(units["gpu.sync.time_ns"], "ns");
    assert_eq!(units["gpu.launches"], "count");
    assert_eq!(units["gpu.memory.device.live_bytes"], "bytes");
    assert_eq!(units["derived.gpu.launches_per_second"], "per_second");
    assert_eq!(units["derived.gpu.sync_blocked_ratio"], "ratio");

    // Deterministic and unique per (scope, metric).
    assert_eq!(rows, metrics_rows(&t.clone()));
    let keys: BTreeSet<(&str, &str)> = rows
        .iter()
        .map(|r| (r.scope.as_str(), r.metric.as_str()))
        .collect();
    assert_eq!(keys.len(), rows.len(), "duplicate (scope, metric) rows");
}

fn compared<'a>(c: &'a Comparison, metric: &str) -> &'a ethand_exporters::report::ComparedRow {
    c.rows
        .iter()
        .find(|r| r.metric == metric)
        .unwrap_or_else(|| panic!("no compared row {metric}"))
}

#[test]
fn comparison_of_windows_rates_and_findings() {
    // Before: 1000 syscalls in a 10 s window (100/s); after: 1000 in 5 s (200/s), in
    // processes with other pids.
    let mut before = tree(
        "daemon",
        0,
        vec![process(100, "app", 50_000, Some(window(10_000, 1000)))],
    );
    let mut after = tree(
        "daemon",
        0,
        vec![
            process(200, "app", 80_000, Some(window(5000, 600))),
            process(201, "worker", 0, Some(window(5000, 400))),
        ],
    );
    before.findings = vec![
        finding("cpu_bound", "CPU bound", 0.6),
        finding("input_pipeline_stall", "Input pipeline stall", 0.4),
    ];
    after.findings = vec![
        finding("input_pipeline_stall", "Input pipeline stall", 0.2),
        finding("sync_heavy", "Synchronization heavy", 0.1),
    ];
    let c = compare(&before, &after);
    assert_eq!(c.schema_version, 1);
    assert_eq!(c.before.rate_basis, "window");
    assert_eq!(c.after.rate_basis, "window");
    assert_eq!(c.before.window_ms, 10_000);
    assert_eq!(c.after.window_ms, 5000);
    assert_eq!(c.after.processes, 2);
    assert!(c.rows.iter().all(|r| r.scope == "total"));
    assert!(!c.rows.iter().any(|r| r.metric.starts_with("process.")));

    let r = compared(&c, "rate.syscalls.count");
    assert_eq!(r.unit, "per_second");
    assert_eq!((r.before, r.after), (Some(100.0), Some(200.0)));
    assert_eq!(r.change, Some(100.0));
    assert_eq!(r.ratio, Some(2.0));
    let r = compared(&c, "syscalls.getpid.count");
    assert_eq!(
        (r.before, r.after, r.change),
        (Some(50_000.0), Some(80_000.0), Some(30_000.0))
    );
    let r = compared(&c, "rate.sched.oncpu_ns");
    // before: half a CPU; after: two processes at half a CPU each.
    assert_eq!((r.before, r.after), (Some(5e8), Some(1e9)));
    let r = compared(&c, "tree.processes");
    assert_eq!(r.change, Some(1.0));
    assert!(
        !c.rows.iter().any(|r| r.metric.starts_with("rate.gpu.")),
        "no GPU rates without GPU figures"
    );

    let ids = |v: &[Finding]| v.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&c.findings_resolved), ["cpu_bound"]);
    assert_eq!(ids(&c.findings_new), ["sync_heavy"]);
    assert_eq!(c.findings_remaining.len(), 1);
    assert_eq!(c.findings_remaining[0].0.impact, 0.4);
    assert_eq!(c.findings_remaining[0].1.impact, 0.2);

    // JSON round trip.
    let json = serde_json::to_string(&c).unwrap();
    let back: Comparison = serde_json::from_str(&json).unwrap();
    assert_eq!(back, c);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["findings_remaining"][0][1]["impact"], 0.2);

    // CSV.
    let csv = comparison_to_csv(&c);
    let records = parse_csv(&csv);
    assert_eq!(
        records[0],
        [
            "scope", "metric", "unit", "before", "after", "change", "ratio"
        ]
    );
    assert_eq!(records.len(), 1 + c.rows.len() + 3);
    let rec = records
        .iter()
        .find(|r| r[1] == "rate.syscalls.count")
        .unwrap();
    assert_eq!(rec[3..], ["100", "200", "100", "2"]);
    let rec = records.iter().find(|r| r[1] == "cpu_bound").unwrap();
    assert_eq!(
        rec[..],
        ["finding", "cpu_bound", "impact", "0.6", "", "", ""]
    );
    let rec = records.iter().find(|r| r[1] == "sync_heavy").unwrap();
    assert_eq!(rec[3..5], ["", "0.1"]);
    let rec = records
        .iter()
        .find(|r| r[1] == "input_pipeline_stall")
        .unwrap();
    assert_eq!(rec[3..5], ["0.4", "0.2"]);

    // Terminal.
    let text = render_comparison(&c, false);
    eprintln!("{text}");
    assert!(!text.contains('\x1b'), "no colors when color is false");
    assert!(text.contains("rate.syscalls.count"));
    assert!(text.contains("resolved: CPU bound (cpu_bound), impact 0.60 -> -"));
    assert!(text.contains("new:      Synchronization heavy (sync_heavy"));
    assert!(
        text.contains("still:    Input pipeline stall (input_pipeline_stall), impact 0.40 -> 0.20")
    );
    let shown = text
        .lines()
        .skip_while(|l| !l.starts_with("METRIC"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .count();
    assert!(shown > 0 && shown <= 25, "{shown} rows shown");
    assert!(render_comparison(&c, true).contains("\x1b["));
}

#[test]
fn standalone_snapshots_rate_over_their_measurement() {
    // No windows: totals / measured_ms. 1000 getpids in 2 s, then 1000 in 4 s.
    let mut p = process(1, "a", 1000, None);
    p.gpu = Some(gpu_stats());
    let before = tree("standalone", 2000, vec![p]);
    let after = tree("standalone", 4000, vec![process(2, "a", 1000, None)]);
    let c = compare(&before, &after);
    assert_eq!(c.before.rate_basis, "measured");
    assert_eq!(c.after.rate_basis, "measured");
    let r = compared(&c, "rate.syscalls.count");
    assert_eq!((r.before, r.after), (Some(505.0), Some(252.5)));
    assert_eq!(r.ratio, Some(0.5));
    // GPU figures only before: rates from 2500/s to 0, the totals from a number to absent.
    let r = compared(&c, "rate.gpu.launches");
    assert_eq!((r.before, r.after), (Some(2500.0), Some(0.0)));
    let r = compared(&c, "gpu.launches");
    assert_eq!((r.before, r.after, r.change), (Some(5000.0), None, None));
    let text = render_comparison(&c, false);
    assert!(text.contains("gone"), "{text}");
    assert!(text.contains("findings: none in either snapshot"));

    // A daemon snapshot without history and a standalone one: each on its own basis.
    let d = tree("daemon", 0, vec![process(3, "a", 10, None)]);
    let c = compare(&d, &after);
    assert_eq!(c.before.rate_basis, "none");
    assert_eq!(c.after.rate_basis, "measured");
    let r = compared(&c, "rate.syscalls.count");
    assert_eq!((r.before, r.after, r.change), (None, Some(252.5), None));
}

/// The launch metrics, which a tree at GPU level `calls` does not measure.
const LAUNCH_ROWS: [&str; 4] = [
    "gpu.launches",
    "gpu.graph_launches",
    "window.gpu_launches",
    "derived.gpu.launches_per_second",
];

/// A GPU tree whose figures were taken at GPU level `calls`: launches not counted.
fn tree_at_calls() -> TreeSnapshot {
    let mut w = window(5000, 10);
    w.gpu_launches = None;
    w.gpu_sync_ns = 1_000_000_000;
    w.gpu_sync_calls = 40;
    w.gpu_copy_h2d_calls = 6;
    w.gpu_copy_d2h_calls = 2;
    let mut p = process(7, "train", 10, Some(w));
    p.gpu = Some(GpuProcessStats {
        launches: None,
        graph_launches: None,
        ..gpu_stats()
    });
    let mut t = tree("daemon", 0, vec![p]);
    t.gpu_level = Some(GpuLevel::Calls);
    t.total.gpu_derived = Some(GpuDerived {
        window_ms: 5000,
        launches_per_second: None,
        sync_blocked_ratio: 0.2,
        syncs_per_second: 8.0,
        sm_activity_ratio: Some(0.75),
        dram_bandwidth_ratio: Some(0.25),
        ..Default::default()
    });
    t
}

/// Launches not counted have no row at all (never a 0); the launch sample, the sync rate, the
/// new window counts and the GPM ratios that were measured have theirs.
#[test]
fn csv_leaves_out_launches_not_counted_and_has_the_sample() {
    let mut t = tree_at_calls();
    let rows = metrics_rows(&t);
    for m in LAUNCH_ROWS {
        assert!(
            !rows.iter().any(|r| r.metric == m),
            "{m}: a row for launches not counted"
        );
    }
    assert!(!rows.iter().any(|r| r.metric.starts_with("launch_sample.")));
    assert_eq!(value(&rows, "total", "derived.gpu.syncs_per_second"), 8.0);
    assert_eq!(value(&rows, "total", "derived.gpu.sm_activity_ratio"), 0.75);
    assert_eq!(
        value(&rows, "total", "derived.gpu.dram_bandwidth_ratio"),
        0.25
    );
    for m in [
        "derived.gpu.sm_occupancy_ratio",
        "derived.gpu.tensor_activity_ratio",
    ] {
        assert!(!rows.iter().any(|r| r.metric == m), "{m}: not measured");
    }
    for scope in ["total", "pid:7"] {
        assert_eq!(value(&rows, scope, "window.gpu_sync_calls"), 40.0);
        assert_eq!(value(&rows, scope, "window.gpu_copy_h2d_calls"), 6.0);
        assert_eq!(value(&rows, scope, "window.gpu_copy_d2h_calls"), 2.0);
        // Other GPU figures are there.
        assert_eq!(value(&rows, scope, "gpu.sync.calls"), 100.0);
    }
    let csv = to_csv(&t);
    assert!(!csv.contains("launches"), "{csv}");

    t.launch_sample = Some(LaunchSample {
        method: "uprobes on cuLaunchKernel*".into(),
        started_unix_ms: 1_764_000_000_000,
        duration_ms: 2000,
        launches: Some(2468),
        launches_per_second: Some(1234.0),
        processes: vec![LaunchSampleProcess {
            pid: 7,
            launches: 2468,
        }],
        notes: Vec::new(),
    });
    let rows = metrics_rows(&t);
    assert_eq!(value(&rows, "total", "launch_sample.launches"), 2468.0);
    assert_eq!(
        value(&rows, "total", "launch_sample.launches_per_second"),
        1234.0
    );
    assert_eq!(value(&rows, "total", "launch_sample.duration_ns"), 2e9);
    assert_eq!(value(&rows, "pid:7", "launch_sample.launches"), 2468.0);
    let units: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.metric.as_str(), r.unit.as_str()))
        .collect();
    assert_eq!(units["launch_sample.launches_per_second"], "per_second");
    assert_eq!(units["launch_sample.duration_ns"], "ns");
    for m in LAUNCH_ROWS {
        assert!(!rows.iter().any(|r| r.metric == m), "{m}");
    }

    // A sample in which no process could be sampled: its duration, no counts.
    t.launch_sample = Some(LaunchSample {
        duration_ms: 2000,
        notes: vec!["no process maps libcuda".into()],
        ..Default::default()
    });
    let rows = metrics_rows(&t);
    assert_eq!(value(&rows, "total", "launch_sample.duration_ns"), 2e9);
    assert!(
        !rows
            .iter()
            .any(|r| r.metric.starts_with("launch_sample.launches"))
    );
}

/// Rules that could not run get a row each, after the findings: their impact is unknown, so
/// the value is empty (never 0).
#[test]
fn csv_has_a_row_per_rule_that_could_not_run() {
    let mut t = tree_at_calls();
    t.findings = vec![finding("sync_heavy", "Synchronization heavy", 0.3)];
    t.not_evaluated = vec![
        NotEvaluated {
            rule: "launch_bound".into(),
            title: "Kernel launch overhead".into(),
            missing: vec!["gpu.launches_per_second".into()],
            how: "ethand level process".into(),
        },
        NotEvaluated {
            rule: "low,sm \"activity\"".into(),
            title: "Low SM activity".into(),
            missing: vec!["gpu.sm_activity_ratio".into()],
            how: "a Hopper GPU".into(),
        },
    ];
    t.dropped_events = vec![DropCounter {
        reason: "ringbuf_full".into(),
        count: 3,
        loss: true,
    }];
    let records = parse_csv(&to_csv(&t));
    let n = records.len();
    assert_eq!(
        records[n - 4..],
        [
            ["finding", "sync_heavy", "0.3", "impact"],
            ["not_evaluated", "launch_bound", "", "impact"],
            ["not_evaluated", "low,sm \"activity\"", "", "impact"],
            ["dropped_events", "ringbuf_full", "3", "count"],
        ]
    );
}

/// A launch count on one side only (the other at GPU level `calls`) is "not measured", not a
/// change from 0 or an appearance: no change, not ranked, listed apart.
#[test]
fn comparison_shows_launches_not_measured_on_one_side() {
    let before = tree_at_calls();
    let mut w = window(5000, 10);
    w.gpu_launches = Some(4000);
    let mut p = process(8, "train", 10, Some(w));
    p.gpu = Some(gpu_stats());
    let mut after = tree("daemon", 0, vec![p]);
    after.gpu_level = Some(GpuLevel::Process);
    after.total.gpu_derived = Some(GpuDerived {
        window_ms: 5000,
        launches_per_second: Some(800.0),
        ..Default::default()
    });
    let c = compare(&before, &after);
    for m in [
        "gpu.launches",
        "window.gpu_launches",
        "derived.gpu.launches_per_second",
        "rate.gpu.launches",
    ] {
        let r = compared(&c, m);
        assert_eq!(r.not_measured.as_deref(), Some("before"), "{m}");
        assert_eq!((r.before, r.change, r.ratio), (None, None, None), "{m}");
        assert!(r.after.is_some(), "{m}");
    }
    assert_eq!(compared(&c, "rate.gpu.launches").after, Some(800.0));
    assert_eq!(compared(&c, "gpu.sync.calls").not_measured, None);
    let json = serde_json::to_value(&c).unwrap();
    let row = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == "gpu.launches")
        .unwrap();
    assert_eq!(row["not_measured"], "before");
    assert_eq!(row["before"], serde_json::Value::Null);
    let back: Comparison = serde_json::from_value(json).unwrap();
    assert_eq!(back, c);

    let text = render_comparison(&c, false);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("METRIC"))
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(
        !table.iter().any(|l| l.contains("launches")),
        "launches ranked as a change:\n{text}"
    );
    assert!(
        text.contains(
            "not compared, not measured in before (kernel launches are counted at GPU level process or op, or sampled by `ethand snapshot`): gpu.launches, window.gpu_launches, derived.gpu.launches_per_second, rate.gpu.launches"
        ),
        "{text}"
    );
    let csv = parse_csv(&comparison_to_csv(&c));
    let rec = csv.iter().find(|r| r[1] == "gpu.launches").unwrap();
    assert_eq!(rec[3..], ["", "5000", "", ""]);

    let page = ethand_exporters::html::render_comparison_html(&c);
    assert!(page.contains("<b>Not compared</b>, not measured in the before snapshot"));
    assert!(
        !page.contains("<tr><td>gpu.launches</td>"),
        "ranked as a change"
    );

    // Both at level calls: no launch row at all but the rate, unmeasured on both sides.
    let c = compare(&before, &tree_at_calls());
    assert!(!c.rows.iter().any(|r| r.metric == "gpu.launches"));
    let r = compared(&c, "rate.gpu.launches");
    assert_eq!((r.before, r.after), (None, None));
    assert_eq!(r.not_measured.as_deref(), Some("both"));
}
