//! OTLP metrics export of the latest [`NodeSnapshot`] (gRPC or HTTP/protobuf), docs/otlp.md.
//!
//! Every metric is an asynchronous (observable) instrument of the OpenTelemetry SDK whose
//! callback reads the newest snapshot; a [`PeriodicReader`] collects them every interval with
//! cumulative temporality and hands the batch to [`RetryingExporter`], which wraps the OTLP
//! exporter of `opentelemetry-otlp`:
//! - a failed request is retried with exponential backoff (100 ms doubling, at most 5 s) as
//!   long as the next attempt still fits in 90 % of the export interval;
//! - a batch whose retries ran out is dropped and counted; counters are cumulative, so the next
//!   batch that gets through carries the totals again: a drop loses resolution, not totals;
//! - the reader exports synchronously on its own thread, so at most one batch exists at a time
//!   and nothing queues up while the endpoint is down: memory stays bounded.
//!
//! Names follow OpenTelemetry's semantic conventions where they have one (`process.cpu.time`,
//! `hw.gpu.utilization`, `hw.gpu.memory.usage`, ...) and `ethand.*` otherwise, with UCUM units.
//! [`METRICS`] is the metric catalog (`crate::catalog`, shared with /metrics) seen as OTLP
//! metrics: the instruments are built from it and docs/otlp.md's table is generated from it
//! ([`markdown_table`]); a test checks that every Prometheus family is mapped or deliberately
//! left out ([`NOT_EXPORTED`]).
//!
//! Per-process points exist for the same processes as Prometheus' per-process series
//! ([`ExportSelection`]: top N by CPU, GPU/NPU users, configured pids/comms/cgroups).
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{
    MetricExporter, Protocol, RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{
    Instrument, PeriodicReader, SdkMeterProvider, Stream, Temporality,
};

use ethand_snapshot::selection::ExportSelection;
use ethand_snapshot::{NodeSnapshot, OtlpStatus};

mod metrics;
#[cfg(test)]
use ethand_snapshot::ProcessSnapshot;
use metrics::register;
pub use metrics::{
    Kind, METRICS, MetricSpec, Metrics, NOT_EXPORTED, Num, Points, V, View, markdown_table,
};

/// First retry delay; it doubles per retry up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }

    /// The endpoint used when none is configured.
    pub fn default_endpoint(self) -> &'static str {
        match self {
            Self::Grpc => "http://localhost:4317",
            Self::HttpProtobuf => "http://localhost:4318/v1/metrics",
        }
    }
}

/// What the daemon's `[otlp]` section resolves to.
#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// Empty: [`OtlpProtocol::default_endpoint`].
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub headers: BTreeMap<String, String>,
    pub interval: Duration,
    pub timeout: Duration,
    /// Override the built-in resource attributes.
    pub resource_attributes: BTreeMap<String, String>,
    /// `host.name`.
    pub host_name: String,
    /// `k8s.node.name`, when known.
    pub node_name: Option<String>,
    /// `service.version`.
    pub service_version: String,
    /// Which processes get per-process points (as for /metrics).
    pub selection: ExportSelection,
    /// Most points (attribute sets) one metric carries per batch; the SDK folds the rest into
    /// one `otel.metric.overflow = true` point, and [`OtlpStats`] counts them.
    pub max_points_per_metric: usize,
}

impl OtlpOptions {
    pub fn endpoint(&self) -> &str {
        if self.endpoint.is_empty() {
            self.protocol.default_endpoint()
        } else {
            &self.endpoint
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("building the OTLP exporter for {endpoint}: {message}")]
    Build { endpoint: String, message: String },
    #[error("shutting the OTLP exporter down: {0}")]
    Shutdown(String),
}

/// Export counters, shared by the exporter (writes) and the daemon (reads into `ethand status`).
#[derive(Debug, Default)]
pub struct OtlpStats {
    endpoint: String,
    protocol: &'static str,
    exports_ok: AtomicU64,
    exports_failed: AtomicU64,
    dropped_batches: AtomicU64,
    last_success_unix_ms: AtomicU64,
    last_export_duration_us: AtomicU64,
    last_error: Mutex<String>,
    /// The last batch was dropped: logged once per outage.
    failing: AtomicBool,
    /// Points folded into a metric's overflow point (over `max_points_per_metric`).
    overflow_points: AtomicU64,
    /// Overflow was logged (once per daemon).
    overflow_logged: AtomicBool,
}

impl OtlpStats {
    pub fn status(&self) -> OtlpStatus {
        OtlpStatus {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol.to_owned(),
            exports_ok: self.exports_ok.load(Ordering::Relaxed),
            exports_failed: self.exports_failed.load(Ordering::Relaxed),
            dropped_batches: self.dropped_batches.load(Ordering::Relaxed),
            last_success_unix_ms: self.last_success_unix_ms.load(Ordering::Relaxed),
            last_error: self.last_error.lock().expect("lock").clone(),
            last_export_duration_us: self.last_export_duration_us.load(Ordering::Relaxed),
            overflow_points: self.overflow_points.load(Ordering::Relaxed),
        }
    }

    /// One metric's callback observed `points` attribute sets against a limit of `limit`:
    /// those beyond it land in the overflow point; counted, and logged the first time.
    fn note_points(&self, metric: &str, points: usize, limit: usize) {
        let over = points.saturating_sub(limit);
        if over == 0 {
            return;
        }
        self.overflow_points
            .fetch_add(over as u64, Ordering::Relaxed);
        if !self.overflow_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                metric,
                points,
                limit,
                "OTLP metric over otlp.max_points_per_metric: the rest are summed in one \
                 otel.metric.overflow point (ethand_otlp_overflow_points_total); select fewer \
                 processes or raise the limit"
            );
        }
    }
}

/// The running export: meter provider, periodic reader thread and the instruments.
pub struct OtlpExporter {
    provider: SdkMeterProvider,
    stats: Arc<OtlpStats>,
    final_flush: Arc<AtomicBool>,
    _instruments: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Builds the exporter and starts the reader thread; the first export happens one interval
    /// from now. `latest` returns the newest snapshot (cheap: an `Arc` clone). Call it from a
    /// plain thread or a Tokio `spawn_blocking` task: the exporter keeps its own small runtime.
    pub fn start(
        opts: OtlpOptions,
        latest: impl Fn() -> Arc<NodeSnapshot> + Send + Sync + 'static,
    ) -> Result<Self, OtlpError> {
        let stats = Arc::new(OtlpStats {
            endpoint: opts.endpoint().to_owned(),
            protocol: opts.protocol.as_str(),
            ..Default::default()
        });
        let source = Arc::new(Source {
            latest: Box::new(latest),
            selection: opts.selection.clone(),
            stats: stats.clone(),
            cache: Mutex::new(None),
        });
        let final_flush = Arc::new(AtomicBool::new(false));
        let exporter =
            RetryingExporter::new(&opts, stats.clone(), source.clone(), final_flush.clone())?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(opts.interval)
            .build();
        // The SDK's default of 2,000 points per metric is below what the selection may hold
        // (a few hundred processes with 9 syscall points each): without this, processes beyond
        // it vanished into the overflow point, depending on the order of the callback.
        let per_selection = opts.max_points_per_metric;
        let provider = SdkMeterProvider::builder()
            .with_resource(resource(&opts))
            .with_reader(reader)
            .with_view(move |i: &Instrument| {
                let m = METRICS.iter().find(|m| m.name == i.name())?;
                Stream::builder()
                    .with_cardinality_limit(m.points_limit(per_selection))
                    .build()
                    .ok()
            })
            .build();
        let meter = provider.meter("ethand");
        let instruments = METRICS
            .iter()
            .map(|m| {
                let source = source.clone();
                let stats = stats.clone();
                let limit = m.points_limit(per_selection);
                register(&meter, m, move || {
                    let view = source.view();
                    let points = m.points(&view);
                    let keyed = points.iter().filter(|(a, _)| !a.is_empty()).count();
                    stats.note_points(m.name, keyed, limit);
                    points
                })
            })
            .collect();
        Ok(Self {
            provider,
            stats,
            final_flush,
            _instruments: instruments,
        })
    }

    pub fn stats(&self) -> Arc<OtlpStats> {
        self.stats.clone()
    }

    /// Exports once more (one attempt, at most the export timeout: no retries) and stops the
    /// reader thread. Blocks: call it from a plain thread or `spawn_blocking`.
    pub fn shutdown(self) -> Result<(), OtlpError> {
        self.final_flush.store(true, Ordering::Relaxed);
        self.provider
            .shutdown()
            .map_err(|e| OtlpError::Shutdown(e.to_string()))
    }
}

/// service.name, service.version, host.name, k8s.node.name, then the configured attributes.
fn resource(opts: &OtlpOptions) -> Resource {
    let mut attrs: BTreeMap<String, String> = BTreeMap::new();
    attrs.insert("service.name".into(), "ethand".into());
    attrs.insert("service.version".into(), opts.service_version.clone());
    if !opts.host_name.is_empty() {
        attrs.insert("host.name".into(), opts.host_name.clone());
    }
    if let Some(node) = opts.node_name.as_ref().filter(|n| !n.is_empty()) {
        attrs.insert("k8s.node.name".into(), node.clone());
    }
    for (k, v) in &opts.resource_attributes {
        attrs.insert(k.clone(), v.clone());
    }
    Resource::builder_empty()
        .with_attributes(attrs.into_iter().map(|(k, v)| KeyValue::new(k, v)))
        .build()
}

/// The newest snapshot and what every callback of one collection derives from it once.
struct Source {
    latest: Box<dyn Fn() -> Arc<NodeSnapshot> + Send + Sync>,
    selection: ExportSelection,
    stats: Arc<OtlpStats>,
    /// The view of the snapshot being collected; cleared after each export so that no old
    /// snapshot is kept alive between collections.
    cache: Mutex<Option<Arc<View>>>,
}

impl Source {
    fn view(&self) -> Arc<View> {
        let snap = (self.latest)();
        let mut cache = self.cache.lock().expect("lock");
        if let Some(v) = cache.as_ref()
            && Arc::ptr_eq(&v.snap, &snap)
        {
            return v.clone();
        }
        let v = Arc::new(View::new(snap, &self.selection, self.stats.status()));
        *cache = Some(v.clone());
        v
    }

    fn clear(&self) {
        *self.cache.lock().expect("lock") = None;
    }
}

// ---------------------------------------------------------------------------------------------
// Export with retries.

/// The OTLP exporter of `opentelemetry-otlp` (its own retries off), retried here with
/// exponential backoff within the export interval, on a runtime of its own.
pub struct RetryingExporter {
    inner: MetricExporter,
    /// A current-thread runtime: every export drives it from the reader thread, so the daemon's
    /// runtime (and its shutdown) never matters to the export.
    rt: Option<tokio::runtime::Runtime>,
    stats: Arc<OtlpStats>,
    source: Arc<Source>,
    final_flush: Arc<AtomicBool>,
    /// Retries stop when the next attempt would end after this much time from the first.
    budget: Duration,
    timeout: Duration,
}

impl std::fmt::Debug for RetryingExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryingExporter")
            .field("budget", &self.budget)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RetryingExporter {
    fn new(
        opts: &OtlpOptions,
        stats: Arc<OtlpStats>,
        source: Arc<Source>,
        final_flush: Arc<AtomicBool>,
    ) -> Result<Self, OtlpError> {
        let endpoint = opts.endpoint().to_owned();
        let err = |message: String| OtlpError::Build {
            endpoint: endpoint.clone(),
            message,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(e.to_string()))?;
        // tonic's channel spawns its worker on the runtime that is current when it is built.
        let _enter = rt.enter();
        let inner = match opts.protocol {
            OtlpProtocol::Grpc => {
                let mut headers = http::HeaderMap::new();
                for (k, v) in &opts.headers {
                    let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|e| err(format!("header {k}: {e}")))?;
                    let value = http::HeaderValue::from_str(v)
                        .map_err(|e| err(format!("header {k}: {e}")))?;
                    headers.insert(name, value);
                }
                MetricExporter::builder()
                    .with_temporality(Temporality::Cumulative)
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout(opts.timeout)
                    .with_metadata(
                        opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(
                            headers,
                        ),
                    )
                    .with_retry_policy(RetryPolicy::disabled())
                    .build()
            }
            OtlpProtocol::HttpProtobuf => MetricExporter::builder()
                .with_temporality(Temporality::Cumulative)
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint.clone())
                .with_timeout(opts.timeout)
                .with_headers(opts.headers.clone().into_iter().collect::<HashMap<_, _>>())
                .with_retry_policy(RetryPolicy::disabled())
                .build(),
        }
        .map_err(|e| err(e.to_string()))?;
        drop(_enter);
        Ok(Self {
            inner,
            rt: Some(rt),
            stats,
            source,
            final_flush,
            budget: opts.interval.mul_f64(0.9),
            timeout: opts.timeout,
        })
    }

    fn export_blocking(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        // The callbacks have run: the view of this collection is no longer needed.
        self.source.clear();
        let rt = self.rt.as_ref().expect("runtime lives until drop");
        let final_flush = self.final_flush.load(Ordering::Relaxed);
        let start = Instant::now();
        let mut delay = INITIAL_BACKOFF;
        loop {
            let left = if final_flush {
                self.timeout
            } else {
                self.budget.saturating_sub(start.elapsed())
            };
            let attempt = self.timeout.min(left).max(Duration::from_millis(1));
            let attempt_start = Instant::now();
            let result = rt.block_on(async {
                match tokio::time::timeout(attempt, self.inner.export(metrics)).await {
                    Ok(r) => r,
                    Err(_) => Err(OTelSdkError::Timeout(attempt)),
                }
            });
            match result {
                Ok(()) => {
                    let took = attempt_start.elapsed().as_micros().max(1);
                    self.stats
                        .last_export_duration_us
                        .store(took as u64, Ordering::Relaxed);
                    self.stats.exports_ok.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .last_success_unix_ms
                        .store(unix_ms(), Ordering::Relaxed);
                    if self.stats.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            endpoint = %self.stats.endpoint,
                            dropped_batches = self.stats.dropped_batches.load(Ordering::Relaxed),
                            "OTLP export recovered"
                        );
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.stats.exports_failed.fetch_add(1, Ordering::Relaxed);
                    *self.stats.last_error.lock().expect("lock") = e.to_string();
                    // Another attempt only if it can start after the backoff and still have a
                    // tenth of the timeout (at least 50 ms) to run.
                    let min_attempt = (self.timeout / 10).max(Duration::from_millis(50));
                    let left = self.budget.saturating_sub(start.elapsed());
                    if final_flush || left < delay + min_attempt {
                        self.stats.dropped_batches.fetch_add(1, Ordering::Relaxed);
                        if !self.stats.failing.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                endpoint = %self.stats.endpoint,
                                error = %e,
                                "OTLP export failing: dropping batches until the endpoint \
                                 answers (ethand_otlp_dropped_batches_total)"
                            );
                        }
                        return Err(e);
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

impl PushMetricExporter for RetryingExporter {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        // The periodic reader calls this on its own thread and blocks on the future anyway.
        std::future::ready(self.export_blocking(metrics))
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

impl Drop for RetryingExporter {
    fn drop(&mut self) {
        // Safe from any context, async included (dropping a runtime inside one panics).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
