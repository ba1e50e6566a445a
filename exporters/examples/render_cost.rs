//! Time to render /metrics for a synthetic node: PROCS processes (default 61, about 10,000
//! series, the size of `cargo xtask bench`'s serving target), each with a realistic spread of
//! syscalls, latency histograms, block and network counters. For profiling the exporter alone
//! (no daemon, no HTTP): `cargo run --release -p ethand-exporters --example render_cost [PROCS]`.
use std::time::Instant;

use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::{
    BlockStats, HIST_BUCKETS, NodeSnapshot, ProcessSnapshot, SyscallClassHist, SyscallRow,
};

fn process(i: u32) -> ProcessSnapshot {
    let hist = |seed: u64| -> Vec<u64> {
        (0..HIST_BUCKETS as u64)
            .map(|b| (seed * 7 + b * 13) % 97)
            .collect()
    };
    let mut p = ProcessSnapshot {
        pid: 10_000 + i,
        comm: format!("worker-{i}"),
        cgroup: "/system.slice/bench.service".into(),
        alive: true,
        ..Default::default()
    };
    p.sched.oncpu_ns = 1_234_567_891 * u64::from(i + 1);
    p.sched.runq_wait_hist = hist(u64::from(i));
    p.sched.runq_wait_ns = 987_654_321;
    p.syscalls.by_nr = (0..12u32)
        .map(|nr| SyscallRow {
            nr,
            name: format!("sys_{nr}"),
            count: u64::from(1000 * nr + i),
            errors: u64::from(nr % 3),
            time_ns: u64::from(nr + 1) * 1_000_003,
        })
        .collect();
    p.syscalls.latency = ["io", "sleep", "other"]
        .iter()
        .enumerate()
        .map(|(k, c)| SyscallClassHist {
            class: (*c).into(),
            count: 1,
            buckets: hist(u64::from(i) + k as u64),
        })
        .collect();
    p.block = ["read", "write"]
        .iter()
        .map(|op| BlockStats {
            device: "259:0".into(),
            device_name: "nvme0n1".into(),
            op: (*op).into(),
            ops: 42,
            bytes: 4096 * 42,
            ..Default::default()
        })
        .collect();
    p.net.tcp_tx_bytes = 123_456;
    p
}

fn main() {
    let procs: u32 = std::env::args()
        .nth(1)
        .map_or(61, |s| s.parse().expect("PROCS is a number"));
    let snap = NodeSnapshot {
        processes: (0..procs).map(process).collect(),
        ..Default::default()
    };
    let opts = PrometheusOptions {
        selection: ethand_snapshot::selection::ExportSelection::top(procs as usize),
        ..Default::default()
    };
    let body = render(&snap, &opts);
    let series = body.lines().filter(|l| !l.starts_with('#')).count();
    let mut ms = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let body = render(&snap, &opts);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(body);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{procs} processes, {series} series, {} bytes: render median {:.2} ms, p95 {:.2} ms",
        body.len(),
        ms[ms.len() / 2],
        ms[ms.len() * 95 / 100]
    );
}
