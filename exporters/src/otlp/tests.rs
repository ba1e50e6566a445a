use super::*;
use crate::prometheus::PrometheusOptions;
use ethand_snapshot::gpu::{CollectiveStats, CommRank, GpuProcessStats};
use ethand_snapshot::selection::SelectionPolicy;
use ethand_snapshot::{SchedStats, SyscallRow, SyscallStats, WindowStats, WorkloadIdentity};

fn proc(pid: u32, comm: &str, cpu_ns: u64) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        comm: comm.into(),
        cgroup: format!("/kubepods/pod{pid}"),
        alive: true,
        sched: SchedStats {
            oncpu_ns: cpu_ns,
            offcpu_blocked_ns: 7,
            runq_wait_hist: vec![1, 2, 3],
            ..Default::default()
        },
        window: Some(WindowStats {
            oncpu_ns: cpu_ns,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn snapshot() -> NodeSnapshot {
    let mut busy = proc(10, "busy", 3_000_000_000);
    busy.syscalls = SyscallStats {
        count: 1000,
        errors: 3,
        time_ns: 5_000,
        by_nr: (0..12)
            .map(|nr| SyscallRow {
                nr,
                name: format!("sc{nr}"),
                count: 10 + u64::from(nr),
                errors: u64::from(nr % 2),
                time_ns: 100 * u64::from(nr),
            })
            .collect(),
        latency: vec![],
    };
    busy.workload = Some(WorkloadIdentity {
        pod: Some("trainer-0".into()),
        namespace: Some("ml".into()),
        container_id: Some("abc123".into()),
        rank: Some(3),
        ..Default::default()
    });
    let idle = proc(11, "idle", 0);
    let mut gpu = proc(12, "trainer", 5);
    gpu.gpu = Some(GpuProcessStats {
        launches: Some(42),
        collectives: vec![CollectiveStats {
            library: "nccl".into(),
            operation: "all_reduce".into(),
            calls: 4,
            bytes: 4096,
            time_ns: 2_000_000_000,
            timed_calls: 4,
        }],
        comm: Some(CommRank {
            library: "nccl".into(),
            rank: Some(1),
            nranks: 8,
        }),
        ..Default::default()
    });
    let named = proc(13, "sidecar", 1);
    let mut others: Vec<ProcessSnapshot> = (100..130).map(|p| proc(p, "w", u64::from(p))).collect();
    let mut processes = vec![busy, idle, gpu, named];
    processes.append(&mut others);
    NodeSnapshot {
        hostname: "node1".into(),
        processes,
        ..Default::default()
    }
}

fn policy() -> SelectionPolicy {
    SelectionPolicy {
        top_n: 5,
        comms: vec!["sidecar".into()],
        ..Default::default()
    }
}

fn options() -> PrometheusOptions {
    PrometheusOptions {
        selection: ExportSelection::Once(policy()),
        dcgm_aliases: false,
        device_workload_labels: false,
    }
}

fn view(snap: NodeSnapshot) -> View {
    View::new(Arc::new(snap), &options().selection, OtlpStatus::default())
}

fn spec(name: &str) -> &'static MetricSpec {
    METRICS
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{name} not declared"))
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The value of `name` for the point whose attributes contain every `want` pair.
fn value(v: &View, name: &str, want: &[(&str, &str)]) -> Option<V> {
    let points = spec(name).points(v);
    let found: Vec<V> = points
        .iter()
        .filter(|(a, _)| want.iter().all(|(k, w)| attr(a, k).as_deref() == Some(*w)))
        .map(|(_, v)| v)
        .collect();
    assert!(found.len() <= 1, "{name} {want:?}: {} points", found.len());
    found.first().copied()
}

/// pids with a `name{pid=...}` series in the Prometheus text.
fn prometheus_pids(text: &str, family: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[test]
fn selects_the_processes_prometheus_selects() {
    let snap = snapshot();
    let text = crate::prometheus::render(&snap, &options());
    let want = prometheus_pids(&text, "ethand_process_cpu_seconds_total");
    let v = view(snap);
    let mut got: Vec<u32> = v.each_proc().map(|(p, _)| p.pid).collect();
    got.sort_unstable();
    assert_eq!(got, want, "OTLP selection differs from /metrics");
    // busy (top CPU), trainer (GPU), sidecar (named comm) in; idle (no CPU) out.
    for pid in [10, 12, 13] {
        assert!(got.contains(&pid), "pid {pid} missing from {got:?}");
    }
    assert!(!got.contains(&11), "idle process selected: {got:?}");
}

#[test]
fn syscall_series_match_prometheus() {
    let snap = snapshot();
    let text = crate::prometheus::render(&snap, &options());
    let v = view(snap);
    let points = spec("ethand.process.syscalls").points(&v);
    let mut n = 0;
    for (a, val) in points.iter() {
        if attr(a, "process.pid").as_deref() != Some("10") {
            continue;
        }
        n += 1;
        let sc = attr(a, "ethand.syscall").unwrap();
        let (prefix, label) = (
            "ethand_process_syscalls_total{pid=\"10\",comm=\"busy\"",
            format!("syscall=\"{sc}\""),
        );
        let prom: u64 = text
            .lines()
            .find(|l| l.starts_with(prefix) && l.contains(&label))
            .unwrap_or_else(|| panic!("no {prefix}..{label} in /metrics"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(val, V::U(prom), "syscall {sc}");
    }
    assert_eq!(
        n,
        crate::prometheus::TOP_SYSCALLS + 1,
        "top syscalls plus other"
    );
}

#[test]
fn values_and_attributes_equal_the_snapshot() {
    let v = view(snapshot());
    let busy = [("process.pid", "10")];
    assert_eq!(value(&v, "process.cpu.time", &busy), Some(V::F(3.0)));
    assert_eq!(
        value(
            &v,
            "ethand.process.offcpu.time",
            &[("process.pid", "10"), ("ethand.offcpu.reason", "blocked")]
        ),
        Some(V::F(7e-9))
    );
    assert_eq!(value(&v, "ethand.process.runq.waits", &busy), Some(V::U(6)));
    assert_eq!(
        value(
            &v,
            "process.cpu.time",
            &[
                ("process.pid", "10"),
                ("k8s.pod.name", "trainer-0"),
                ("k8s.namespace.name", "ml"),
                ("container.id", "abc123"),
                ("ethand.rank", "3"),
                ("process.executable.name", "busy")
            ]
        ),
        Some(V::F(3.0)),
        "workload identity attributes"
    );
    assert_eq!(
        value(&v, "ethand.process.gpu.launches", &[("process.pid", "12")]),
        Some(V::U(42))
    );
    let coll = [
        ("process.pid", "12"),
        ("ethand.collective.operation", "all_reduce"),
        ("ethand.collective.rank", "1"),
    ];
    assert_eq!(
        value(&v, "ethand.process.collective.io", &coll),
        Some(V::U(4096))
    );
    assert_eq!(
        value(&v, "ethand.process.collective.time", &coll),
        Some(V::F(2.0))
    );
    assert_eq!(
        value(
            &v,
            "ethand.process.collective.ranks",
            &[("process.pid", "12")]
        ),
        Some(V::U(8))
    );
    // Not selected: no points.
    assert_eq!(
        value(&v, "process.cpu.time", &[("process.pid", "11")]),
        None
    );
}

/// Launches not counted (GPU level `calls`) give no point at all, not a 0; a 0 that was
/// counted (level `process`) is a point.
#[test]
fn gpu_launches_are_points_only_where_counted() {
    let mut snap = snapshot();
    let mut at_calls = proc(14, "calls", 1);
    at_calls.gpu = Some(GpuProcessStats {
        graph_launches: None,
        ..Default::default()
    });
    let mut at_process = proc(15, "counted", 1);
    at_process.gpu = Some(GpuProcessStats {
        launches: Some(0),
        graph_launches: Some(0),
        ..Default::default()
    });
    snap.processes.push(at_calls);
    snap.processes.push(at_process);
    let mut p = policy();
    p.pids = vec![14, 15];
    let v = View::new(
        Arc::new(snap),
        &ExportSelection::Once(p),
        OtlpStatus::default(),
    );
    let name = "ethand.process.gpu.launches";
    assert_eq!(value(&v, name, &[("process.pid", "14")]), None);
    assert_eq!(
        value(
            &v,
            name,
            &[("process.pid", "15"), ("ethand.gpu.launch.kind", "kernel")]
        ),
        Some(V::U(0))
    );
    // A graph launch count of 0 is left out, as before.
    assert_eq!(
        value(
            &v,
            name,
            &[("process.pid", "15"), ("ethand.gpu.launch.kind", "graph")]
        ),
        None
    );
    // Process 14 keeps its other GPU points.
    assert_eq!(
        value(
            &v,
            "ethand.process.gpu.sync.calls",
            &[("process.pid", "14")]
        ),
        Some(V::U(0))
    );
}

#[test]
fn pid_reuse_is_summed_not_duplicated() {
    let mut snap = snapshot();
    let mut again = proc(10, "busy", 1_000_000_000);
    again.alive = false;
    again.workload = snap.processes[0].workload.clone();
    snap.processes.push(again);
    let v = view(snap);
    assert_eq!(
        value(&v, "process.cpu.time", &[("process.pid", "10")]),
        Some(V::F(4.0))
    );
}

/// The GPM ratios (Hopper and newer) are hw.* points of the GPUs that measured them, and
/// absent (not 0) elsewhere.
#[test]
fn gpm_ratios_are_points_only_where_measured() {
    use ethand_snapshot::devices::GpuDevice;
    let mut snap = snapshot();
    snap.devices.gpus = vec![
        GpuDevice {
            index: 0,
            uuid: "GPU-h200".into(),
            gpm_supported: Some(true),
            sm_activity_ratio: Some(0.75),
            sm_occupancy_ratio: Some(0.25),
            tensor_activity_ratio: Some(0.5),
            dram_bandwidth_ratio: Some(0.125),
            ..Default::default()
        },
        GpuDevice {
            index: 1,
            uuid: "GPU-t4".into(),
            gpm_supported: Some(false),
            utilization_ratio: Some(0.5),
            ..Default::default()
        },
    ];
    let v = view(snap);
    for (name, want) in [
        ("ethand.gpu.sm.activity", 0.75),
        ("ethand.gpu.sm.occupancy", 0.25),
        ("ethand.gpu.tensor.activity", 0.5),
        ("ethand.gpu.memory.bandwidth.utilization", 0.125),
    ] {
        let m = spec(name);
        assert_eq!((m.unit, m.kind), ("1", Kind::Gauge), "{name}");
        assert_eq!(
            value(&v, name, &[("hw.id", "GPU-h200"), ("hw.type", "gpu")]),
            Some(V::F(want)),
            "{name}"
        );
        assert_eq!(value(&v, name, &[("hw.id", "GPU-t4")]), None, "{name}");
        assert_eq!(m.points(&v).iter().count(), 1, "{name}");
    }
    // The GPU without GPM keeps its other points.
    assert_eq!(
        value(&v, "hw.gpu.utilization", &[("hw.id", "GPU-t4")]),
        Some(V::F(0.5))
    );
}

#[test]
fn declarations_are_valid_and_unique() {
    let mut names = std::collections::HashSet::new();
    for m in METRICS {
        assert!(names.insert(m.name), "{} declared twice", m.name);
        assert!(
            m.name.starts_with("ethand.")
                || m.name.starts_with("hw.")
                || m.name.starts_with("process."),
            "{}",
            m.name
        );
        assert!(
            m.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._".contains(c)),
            "{}",
            m.name
        );
        assert!(
            !m.unit.is_empty() && !m.description.is_empty(),
            "{}",
            m.name
        );
        if m.kind == Kind::Counter && m.num == Num::Float {
            assert!(
                ["s", "J"].contains(&m.unit),
                "{}: float counter in {}",
                m.name,
                m.unit
            );
        }
    }
}

/// Every family /metrics can emit has an OTLP counterpart or a reason not to.
#[test]
fn every_prometheus_family_is_mapped() {
    let mapped: Vec<&str> = METRICS
        .iter()
        .flat_map(|m| m.prometheus.split(", "))
        .map(|p| p.split(' ').next().unwrap())
        .collect();
    for m in &mapped {
        assert!(
            crate::prometheus::metric_catalog()
                .iter()
                .any(|(n, _, _)| n == m),
            "{m} is not a Prometheus family"
        );
    }
    for (name, _, _) in crate::prometheus::metric_catalog() {
        let skipped = NOT_EXPORTED.iter().any(|(n, _)| {
            *n == name || (n.ends_with('*') && name.starts_with(n.trim_end_matches('*')))
        });
        assert!(
            mapped.contains(&name) || skipped,
            "Prometheus family {name} has no OTLP metric: add it to otlp::METRICS or otlp::NOT_EXPORTED"
        );
    }
}

/// docs/otlp.md holds the generated table; UPDATE_DOCS=1 rewrites it.
#[test]
fn docs_table_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/otlp.md");
    let doc = std::fs::read_to_string(path).expect("docs/otlp.md");
    let (begin, end) = ("<!-- otlp-table begin -->\n", "<!-- otlp-table end -->");
    let start = doc.find(begin).expect("begin marker") + begin.len();
    let stop = doc.find(end).expect("end marker");
    let table = markdown_table();
    if doc[start..stop] != table {
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let new = format!("{}{}{}", &doc[..start], table, &doc[stop..]);
            std::fs::write(path, new).expect("write docs/otlp.md");
        } else {
            panic!("docs/otlp.md's table is stale: run with UPDATE_DOCS=1");
        }
    }
}

#[test]
fn resource_has_identity_and_overrides() {
    let mut extra = BTreeMap::new();
    extra.insert("deployment.environment".to_owned(), "prod".to_owned());
    extra.insert("host.name".to_owned(), "override".to_owned());
    let r = resource(&OtlpOptions {
        endpoint: String::new(),
        protocol: OtlpProtocol::Grpc,
        headers: BTreeMap::new(),
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        resource_attributes: extra,
        host_name: "node1".into(),
        node_name: Some("k8s-node-7".into()),
        service_version: "9.9.9".into(),
        selection: options().selection,
        max_points_per_metric: 20_000,
    });
    let get = |k: &'static str| {
        r.get(&opentelemetry::Key::from_static_str(k))
            .map(|v| v.to_string())
    };
    assert_eq!(get("service.name").as_deref(), Some("ethand"));
    assert_eq!(get("service.version").as_deref(), Some("9.9.9"));
    assert_eq!(get("k8s.node.name").as_deref(), Some("k8s-node-7"));
    assert_eq!(get("host.name").as_deref(), Some("override"));
    assert_eq!(get("deployment.environment").as_deref(), Some("prod"));
}

/// Nothing listens: every attempt fails, retries back off within 90 % of the interval, and
/// the batch is dropped once, counted.
#[test]
fn unreachable_endpoint_retries_within_the_interval_then_drops() {
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let endpoint = match protocol {
            OtlpProtocol::Grpc => format!("http://127.0.0.1:{port}"),
            OtlpProtocol::HttpProtobuf => format!("http://127.0.0.1:{port}/v1/metrics"),
        };
        let opts = OtlpOptions {
            endpoint,
            protocol,
            headers: BTreeMap::new(),
            interval: Duration::from_millis(2000),
            timeout: Duration::from_millis(300),
            resource_attributes: BTreeMap::new(),
            host_name: String::new(),
            node_name: None,
            service_version: "0".into(),
            selection: options().selection,
            max_points_per_metric: 20_000,
        };
        let stats = Arc::new(OtlpStats::default());
        let source = Arc::new(Source {
            latest: Box::new(|| Arc::new(NodeSnapshot::default())),
            selection: options().selection,
            stats: stats.clone(),
            cache: Mutex::new(None),
        });
        let e = RetryingExporter::new(
            &opts,
            stats.clone(),
            source,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        let t = Instant::now();
        let r = e.export_blocking(&ResourceMetrics::default());
        let took = t.elapsed();
        let s = stats.status();
        eprintln!("{protocol:?}: {s:?} in {took:?}");
        assert!(
            r.is_err(),
            "{protocol:?}: export to a closed port succeeded"
        );
        assert_eq!(s.exports_ok, 0);
        assert_eq!(s.dropped_batches, 1, "{protocol:?}");
        // 100+200+400+800 ms of backoff fit in 1.8 s: at least 4 attempts, at most 5.
        assert!(
            (4..=5).contains(&s.exports_failed),
            "{protocol:?}: {} attempts",
            s.exports_failed
        );
        assert!(
            took <= Duration::from_millis(1800 + 100),
            "{protocol:?}: took {took:?}"
        );
        assert!(!s.last_error.is_empty());
    }
}
