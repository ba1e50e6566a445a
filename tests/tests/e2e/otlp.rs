//! OTLP metrics export: a real daemon pushes to an OTLP receiver built into the test (tonic for
//! gRPC, a minimal HTTP/1.1 server decoding `ExportMetricsServiceRequest` with prost for
//! HTTP/protobuf), and the data point of a workload with an exact syscall count must equal it.
//! Also: the endpoint down (failures and drops counted, memory flat), then up (exports resume
//! and carry the totals of the time it was down).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ethand_tests::{Daemon, SETTLE, free_port, serial, syscall};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    metrics_service_server::{MetricsService, MetricsServiceServer},
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, metric, number_data_point};
use prost::Message as _;

use crate::workload;

/// OTLP export interval of these tests (the daemon collects every 200 ms).
const OTLP_INTERVAL_MS: u64 = 500;
const WAIT: Duration = Duration::from_secs(20);

/// Every request a receiver got, in arrival order.
#[derive(Clone, Default)]
pub(crate) struct Store(pub(crate) Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

impl Store {
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Waits until `n` more requests than `seen` have arrived.
    pub(crate) fn wait_for(&self, seen: usize, n: usize) {
        let t0 = Instant::now();
        while self.len() < seen + n {
            assert!(
                t0.elapsed() < WAIT,
                "OTLP receiver: {} requests after {WAIT:?}, expected {}",
                self.len(),
                seen + n
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of `metric` at the point whose attributes include `want`, in the newest
    /// request that has one.
    pub(crate) fn value(&self, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
        let reqs = self.0.lock().unwrap();
        reqs.iter().rev().find_map(|r| point(r, metric, want))
    }

    /// The resource attributes of the newest request.
    fn resource(&self) -> Vec<(String, String)> {
        let reqs = self.0.lock().unwrap();
        let r = reqs.last().expect("a request");
        let res = r.resource_metrics[0].resource.as_ref().expect("resource");
        res.attributes
            .iter()
            .map(|kv| (kv.key.clone(), text(kv)))
            .collect()
    }
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn number(p: &NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        Some(number_data_point::Value::AsDouble(d)) => d,
        None => f64::NAN,
    }
}

pub(crate) fn point(
    r: &ExportMetricsServiceRequest,
    metric: &str,
    want: &[(&str, &str)],
) -> Option<f64> {
    let matches = |attrs: &[KeyValue]| {
        want.iter()
            .all(|(k, v)| attrs.iter().any(|kv| kv.key == *k && text(kv) == *v))
    };
    for rm in &r.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in sm.metrics.iter().filter(|m| m.name == metric) {
                let points = match &m.data {
                    Some(metric::Data::Sum(s)) => &s.data_points,
                    Some(metric::Data::Gauge(g)) => &g.data_points,
                    _ => continue,
                };
                if let Some(p) = points.iter().find(|p| matches(&p.attributes)) {
                    return Some(number(p));
                }
            }
        }
    }
    None
}

#[tonic::async_trait]
impl MetricsService for Store {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// A gRPC OTLP receiver on 127.0.0.1:`port`, stopped on drop.
pub(crate) struct GrpcReceiver {
    pub(crate) store: Store,
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl GrpcReceiver {
    pub(crate) fn start(port: u16) -> Self {
        let store = Store::default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let server = tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(store.clone()))
            .serve_with_shutdown(addr, async {
                let _ = stopped.await;
            });
        rt.spawn(async move {
            if let Err(e) = server.await {
                panic!("OTLP gRPC receiver on {addr}: {e}");
            }
        });
        let t0 = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(t0.elapsed() < WAIT, "gRPC receiver not listening on {addr}");
            thread::sleep(Duration::from_millis(20));
        }
        Self {
            store,
            rt: Some(rt),
            stop: Some(stop),
        }
    }
}

impl Drop for GrpcReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// An HTTP/protobuf OTLP receiver: HTTP/1.1 with keep-alive, `POST /v1/metrics`, the body an
/// `ExportMetricsServiceRequest`. Lives until the test process ends.
fn http_receiver() -> (Store, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let store = Store::default();
    let s = store.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let s = s.clone();
            thread::spawn(move || serve_http(conn, &s));
        }
    });
    (store, port)
}

fn serve_http(conn: TcpStream, store: &Store) {
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut request_line = String::new();
        if r.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        let mut content_type = String::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse().unwrap(),
                "content-type" => content_type = v.trim().to_owned(),
                _ => {}
            }
        }
        let mut body = vec![0u8; length];
        r.read_exact(&mut body).unwrap();
        assert!(
            request_line.starts_with("POST /v1/metrics "),
            "HTTP receiver: unexpected request {request_line:?}"
        );
        assert_eq!(
            content_type, "application/x-protobuf",
            "HTTP/protobuf content type"
        );
        let req = ExportMetricsServiceRequest::decode(body.as_slice())
            .expect("body is an ExportMetricsServiceRequest");
        store.0.lock().unwrap().push(req);
        let reply = ExportMetricsServiceResponse {
            partial_success: None,
        }
        .encode_to_vec();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        );
        if out
            .write_all(head.as_bytes())
            .and_then(|()| out.write_all(&reply))
            .is_err()
        {
            return;
        }
    }
}

fn otlp_toml(endpoint: &str, protocol: &str, timeout_ms: u64) -> String {
    format!(
        "[otlp]\nenabled = true\nendpoint = \"{endpoint}\"\nprotocol = \"{protocol}\"\n\
         interval_ms = {OTLP_INTERVAL_MS}\ntimeout_ms = {timeout_ms}\n\
         [otlp.resource_attributes]\n\"deployment.environment\" = \"e2e\"\n\
         [prometheus]\ncomms = [\"ethand-workload\"]\n"
    )
}

/// Waits for two fresh exports and returns the getpid count of `pid` in the newest one.
fn exported_getpids(store: &Store, pid: u32) -> f64 {
    store.wait_for(store.len(), 2);
    let pid = pid.to_string();
    store
        .value(
            "ethand.process.syscalls",
            &[("process.pid", &pid), ("ethand.syscall", "getpid")],
        )
        .unwrap_or(0.0)
}

/// 10000 getpid() by the workload: the exported `ethand.process.syscalls{ethand.syscall=
/// "getpid"}` grows by exactly 10000, over gRPC and over HTTP/protobuf; the resource and the
/// process attributes are there.
#[test]
fn otlp_exports_exact_syscall_counts_over_grpc_and_http() {
    let _serial = serial();
    for protocol in ["grpc", "http/protobuf"] {
        let (store, endpoint, _grpc) = if protocol == "grpc" {
            let port = free_port();
            let r = GrpcReceiver::start(port);
            (r.store.clone(), format!("http://127.0.0.1:{port}"), Some(r))
        } else {
            let (store, port) = http_receiver();
            (store, format!("http://127.0.0.1:{port}/v1/metrics"), None)
        };
        let d = Daemon::start_with(
            "otlp",
            &otlp_toml(&endpoint, protocol, 400),
            &[],
            &[("NODE_NAME", "e2e-node".to_string())],
        );
        let getpids = 10_000u64;
        let mut w = workload(&["syscalls", &getpids.to_string(), "0"]);
        thread::sleep(SETTLE);
        let before = exported_getpids(&store, w.pid);
        let t0 = Instant::now();
        let done = w.go();
        assert_eq!(done.u64("openat_failed"), 0);
        thread::sleep(SETTLE);
        let after = exported_getpids(&store, w.pid);
        let since_go = t0.elapsed();
        let pid = w.pid.to_string();
        let exe = store.value(
            "process.cpu.time",
            &[
                ("process.pid", &pid),
                ("process.executable.name", "ethand-workload"),
            ],
        );
        let res = store.resource();
        let st = d.status();
        let otlp = st.otlp.clone().expect("status has otlp");
        eprintln!(
            "{protocol}: getpid exported before {before}, after {after} (delta {}), {} requests, \
             status {otlp:?}, daemon RSS {} KiB, {:?} from go to the second export after done",
            after - before,
            store.len(),
            st.rss_bytes / 1024,
            since_go
        );
        assert_eq!(
            after - before,
            getpids as f64,
            "{protocol}: exported getpid delta must equal the workload's {getpids} calls"
        );
        // The daemon's own figure agrees with what arrived.
        let snap = d.snapshot(w.pid);
        let own = syscall(ethand_tests::find_proc(&snap, w.pid), libc::SYS_getpid).0;
        assert_eq!(own as f64, after, "{protocol}: OTLP vs ethand snapshot");
        assert!(
            exe.is_some_and(|v| v > 0.0),
            "{protocol}: process.cpu.time with process.executable.name"
        );
        for (k, v) in [
            ("service.name", "ethand"),
            ("k8s.node.name", "e2e-node"),
            ("deployment.environment", "e2e"),
        ] {
            assert!(
                res.iter().any(|(rk, rv)| rk == k && rv == v),
                "{protocol}: resource lacks {k}={v}: {res:?}"
            );
        }
        assert!(
            res.iter().any(|(k, v)| k == "host.name" && !v.is_empty()),
            "{res:?}"
        );
        assert!(otlp.exports_ok >= 4, "{protocol}: {otlp:?}");
        assert_eq!(otlp.protocol, protocol);
        assert_eq!(
            otlp.dropped_batches, 0,
            "{protocol}: receiver was up: {otlp:?}"
        );
        let metrics = d.metrics();
        assert!(
            metrics.contains("ethand_otlp_exports_total{result=\"ok\"}"),
            "{protocol}: /metrics lacks ethand_otlp_exports_total"
        );
        w.finish();
    }
}

/// The receiver is absent for 6 s: failed requests and dropped batches are counted (status
/// and /metrics), the daemon's memory stays flat; the workload's 10000 getpid() happen during
/// the outage. Then the receiver starts: exports resume within a few intervals and the first
/// batch carries the full count (cumulative: a dropped batch loses resolution, not totals).
#[test]
fn otlp_endpoint_down_counts_drops_then_recovers() {
    let _serial = serial();
    let port = free_port();
    let d = Daemon::start(
        "otlp-down",
        &otlp_toml(&format!("http://127.0.0.1:{port}"), "grpc", 200),
    );
    let getpids = 10_000u64;
    let mut w = workload(&["syscalls", &getpids.to_string(), "0"]);
    thread::sleep(Duration::from_secs(2));
    let rss_early = d.status().rss_bytes;
    w.go();
    thread::sleep(Duration::from_secs(4));
    let st = d.status();
    let down = st.otlp.clone().expect("status has otlp");
    let metrics = d.metrics();
    let dropped_metric: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ethand_otlp_dropped_batches_total "))
        .expect("/metrics has ethand_otlp_dropped_batches_total")
        .trim()
        .parse()
        .unwrap();
    eprintln!(
        "down: {down:?}; /metrics dropped = {dropped_metric}; RSS {} KiB -> {} KiB",
        rss_early / 1024,
        st.rss_bytes / 1024
    );
    assert_eq!(down.exports_ok, 0, "nothing listens on {port}: {down:?}");
    // 6 s at 500 ms: about 12 batches, each retried before it is dropped.
    assert!(down.dropped_batches >= 6, "{down:?}");
    assert!(
        down.exports_failed > down.dropped_batches,
        "retries: {down:?}"
    );
    assert!(!down.last_error.is_empty());
    assert!(dropped_metric >= 6.0 && dropped_metric <= down.dropped_batches as f64 + 3.0);
    assert!(st.rss_bytes < 50 << 20, "RSS {} MiB", st.rss_bytes >> 20);
    assert!(
        st.rss_bytes < rss_early + (4 << 20),
        "RSS grew while the endpoint was down: {} KiB -> {} KiB",
        rss_early / 1024,
        st.rss_bytes / 1024
    );

    let r = GrpcReceiver::start(port);
    let t0 = Instant::now();
    r.store.wait_for(0, 1);
    let recovered_in = t0.elapsed();
    r.store.wait_for(r.store.len(), 1);
    let pid = w.pid.to_string();
    let got = r
        .store
        .value(
            "ethand.process.syscalls",
            &[("process.pid", &pid), ("ethand.syscall", "getpid")],
        )
        .expect("getpid point after recovery");
    let dropped_reported = r
        .store
        .value("ethand.otlp.dropped_batches", &[])
        .expect("ethand.otlp.dropped_batches exported");
    // The status is rebuilt at each collection (200 ms): wait for it to show the recovery.
    let t1 = Instant::now();
    let up = loop {
        let up = d.status().otlp.expect("status has otlp");
        if up.exports_ok >= 2 || t1.elapsed() > Duration::from_secs(3) {
            break up;
        }
        thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "recovered: first export {recovered_in:?} after the receiver started; getpid {got}; \
         exported dropped_batches {dropped_reported}; status {up:?}"
    );
    assert!(
        recovered_in < Duration::from_millis(4 * OTLP_INTERVAL_MS),
        "{recovered_in:?}"
    );
    assert!(up.exports_ok >= 2, "{up:?}");
    assert!(
        dropped_reported >= down.dropped_batches as f64,
        "exported drops {dropped_reported} < {down:?}"
    );
    let snap = d.snapshot(w.pid);
    let own = syscall(ethand_tests::find_proc(&snap, w.pid), libc::SYS_getpid).0;
    assert!(
        own >= getpids,
        "ethand saw {own} getpid, workload made {getpids}"
    );
    assert_eq!(
        got, own as f64,
        "first batches after the outage carry the total"
    );
    w.finish();
}

/// The keyed points and the overflow point (`otel.metric.overflow = true`) of `metric` in `r`.
fn keyed_and_overflow(
    r: &ExportMetricsServiceRequest,
    metric: &str,
) -> (Vec<Vec<(String, String)>>, bool) {
    let mut keyed = Vec::new();
    let mut overflow = false;
    for m in r
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .filter(|m| m.name == metric)
    {
        let points = match &m.data {
            Some(metric::Data::Sum(s)) => &s.data_points,
            Some(metric::Data::Gauge(g)) => &g.data_points,
            _ => continue,
        };
        for p in points {
            let attrs: Vec<(String, String)> = p
                .attributes
                .iter()
                .map(|kv| (kv.key.clone(), text(kv)))
                .collect();
            if attrs
                .iter()
                .any(|(k, v)| k == "otel.metric.overflow" && v == "true")
            {
                overflow = true;
            } else {
                keyed.push(attrs);
            }
        }
    }
    (keyed, overflow)
}

/// 30 processes named in `prometheus.comms`, each with 8 syscalls plus `other` (270 points of
/// `ethand.process.syscalls` at least). At the default `otlp.max_points_per_metric` every one of
/// them arrives with its 9 points and nothing overflows (the SDK's own default, 2,000
/// points, dropped processes of a few hundred silently); at a limit of 100 a batch carries
/// exactly 100 keyed points plus the overflow point, and the overflow is counted (status, and
/// `ethand.otlp.overflow_points` in a later batch).
#[test]
fn otlp_points_over_the_limit_are_counted_not_lost_silently() {
    let _serial = serial();
    const PROCS: usize = 30;
    for limit in [None, Some(100usize)] {
        let port = free_port();
        let r = GrpcReceiver::start(port);
        let extra = limit.map_or(String::new(), |l| format!("max_points_per_metric = {l}\n"));
        let toml = otlp_toml(&format!("http://127.0.0.1:{port}"), "grpc", 400).replacen(
            "[otlp.resource_attributes]",
            &format!("{extra}[otlp.resource_attributes]"),
            1,
        );
        let d = Daemon::start("otlp-limit", &toml);
        let mut ws: Vec<_> = (0..PROCS)
            .map(|_| workload(&["syscalls", "100", "0"]))
            .collect();
        for w in &mut ws {
            w.go();
        }
        thread::sleep(SETTLE);
        r.store.wait_for(r.store.len(), 3);
        let reqs = r.store.0.lock().unwrap().clone();
        let last = reqs.last().expect("a batch");
        let (keyed, overflow) = keyed_and_overflow(last, "ethand.process.syscalls");
        let st = d.status().otlp.expect("status has otlp");
        // Points per workload: its 8 syscalls with the most time plus `other`.
        let per_pid: Vec<usize> = ws
            .iter()
            .map(|w| {
                let pid = w.pid.to_string();
                keyed
                    .iter()
                    .filter(|a| a.iter().any(|(k, v)| k == "process.pid" && *v == pid))
                    .count()
            })
            .collect();
        let whole = per_pid.iter().filter(|&&n| n == 9).count();
        let counted = point(last, "ethand.otlp.overflow_points", &[]);
        eprintln!(
            "observed: limit {limit:?}: {} keyed points of ethand.process.syscalls, overflow \
             point {overflow}, points per workload {per_pid:?}, \
             status overflow_points {}, ethand.otlp.overflow_points in the last batch {counted:?}",
            keyed.len(),
            st.overflow_points
        );
        match limit {
            None => {
                assert_eq!(
                    whole, PROCS,
                    "every named process arrives with its 9 points"
                );
                assert!(!overflow, "nothing overflows at the default");
                assert_eq!(st.overflow_points, 0);
                assert!(keyed.len() >= PROCS * 9, "{} points", keyed.len());
            }
            Some(l) => {
                assert_eq!(keyed.len(), l, "exactly the limit keyed");
                assert!(overflow, "the rest summed in the overflow point");
                assert!(st.overflow_points >= (PROCS * 9 - l) as u64, "{st:?}");
                assert!(
                    counted.is_some_and(|c| c >= (PROCS * 9 - l) as f64),
                    "{counted:?}"
                );
            }
        }
        for w in ws {
            w.finish();
        }
    }
}
