//! `ethand run`: start-up (probes, listeners, privileges), the collection loop that fills
//! the shared state (`shared.rs`) once per interval, and the two servers that read it (the
//! local API and Prometheus' /metrics).
use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use ethand_exporters::prometheus::PrometheusOptions;
use ethand_snapshot::{self as snap, NodeSnapshot, SelfStatus, selection::ExportSelection};
use tracing::{info, warn};

use crate::{
    UsageError,
    config::{Config, Plan},
    pipeline::{
        collector::{Collector, program_costs},
        gpu::GpuProbes,
        loader::{self, Loaded},
        model::Model,
        procinfo::{self, unix_ms},
    },
    serve::{api, shared::Shared},
};

/// How long an orderly shutdown may take after SIGTERM before the daemon exits anyway: within
/// the unit's TimeoutStopSec (10 s).
pub const STOP_LIMIT: Duration = Duration::from_secs(8);

/// How long start-up waits for the symbols of the runtime libraries found at start.
pub const GPU_SETTLE: Duration = Duration::from_secs(10);

/// The probes, maps and model, loaded and ready to collect.
pub struct Engine {
    pub loaded: Loaded,
    pub collector: Collector,
    pub gpu: GpuProbes,
    /// The Python frames of GPU calls (registration and code objects).
    pub py: crate::pipeline::gpu::python::PyWalker,
    pub sampler: crate::pipeline::launch_sample::LaunchSampler,
    /// GPU activity recorded by libethand_cupti.so for snapshots.
    pub activity: crate::pipeline::gpu_activity::ActivitySampler,
    pub profiler: crate::pipeline::cpu_profile::CpuProfiler,
    pub devices: crate::pipeline::devices::DeviceSampler,
    pub shared: Arc<Shared>,
    pub started_at_unix_ms: u64,
    pub cfg: Config,
    /// Whether sys_exit is attached: then the model's mmap counts hint which processes the
    /// GPU library scan must look at.
    syscalls_attached: bool,
    maps_changed: std::collections::HashSet<u32>,
    /// For `ethand status`: who may use the socket, the capabilities kept after start-up.
    pub socket_access: String,
    pub capabilities: Vec<String>,
    /// The user the daemon runs as (`SelfStatus::user`).
    pub user: String,
}

impl Engine {
    pub fn start(cfg: &Config) -> anyhow::Result<Self> {
        // Before anything is loaded: a broken rules file stops the start (exit 2).
        let rules = crate::diagnose::load_rules(&cfg.diagnosis.rules_dir)?;
        // Everything below reads the plan, not the configuration's sections.
        let plan = Plan::resolve(cfg);
        let mut loaded = loader::load(&plan)?;
        let collector = Collector::new(
            &mut loaded.ebpf,
            &plan.maps,
            &plan.collect,
            loaded.oncpu_from_task,
        )
        .context("setting up map readers")?;
        // Before any capability is dropped: it keeps those its workers need.
        let reader = crate::pipeline::reader::ReaderHandle::start(&plan.reader);
        let gpu = GpuProbes::new(&mut loaded.ebpf, &plan.gpu, reader.clone());
        let profiler = crate::pipeline::cpu_profile::CpuProfiler::new(
            &mut loaded.ebpf,
            plan.cpu_profile,
            &loaded.profile_programs,
        );
        // Loading parsed the kernel's BTF (several MB) twice; give the freed heap back to the
        // OS instead of carrying it as resident memory for the daemon's lifetime.
        // SAFETY: malloc_trim only releases free memory of glibc's allocator.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0);
        }
        let progs = gpu.progs();
        let sampler =
            crate::pipeline::launch_sample::LaunchSampler::new(&mut loaded.ebpf, progs.multi());
        let activity = crate::pipeline::gpu_activity::ActivitySampler::new(
            &mut loaded.ebpf,
            plan.gpu.cupti_dir.as_deref(),
            plan.launch_sites,
            progs.multi(),
        );
        for (prog, _) in crate::pipeline::gpu_activity::PROGS {
            loaded
                .program_probe
                .insert(prog.into(), format!("uprobe_{prog}"));
        }
        for prog in [progs.entry, progs.ret, sampler.program()] {
            loaded
                .program_probe
                .insert(prog.into(), format!("uprobe_{prog}"));
        }
        // The snapshot's CPU profile: their cost shows while one is taken.
        if profiler.unavailable().is_none() {
            for (prog, probe) in [
                (crate::pipeline::cpu_profile::PROG_CPU, "cpu_profile"),
                (
                    crate::pipeline::cpu_profile::PROG_SWITCH,
                    "cpu_profile_offcpu",
                ),
            ] {
                loaded.program_probe.insert(prog.into(), probe.into());
            }
        }
        let d = &cfg.daemon;
        let mut model = Model::new(
            d.interval_ms,
            d.history_seconds,
            d.exit_grace_seconds,
            d.max_processes,
        );
        model.attribution = Some(crate::pipeline::attribution::Attributor::new(
            plan.attribution.clone(),
        ));
        model.launches_counted = plan.gpu.level.counts_launches();
        model.max_exited = d.max_exited_processes;
        model.cgroup_hold_ms = cfg.prometheus.cgroup_hold_seconds.saturating_mul(1000);
        model.max_cgroups = cfg.prometheus.max_cgroups as usize;
        model.exit_events = loaded.probes.iter().any(|p| {
            p.name == "sched_process_exit" && p.state == ethand_snapshot::ProbeState::Attached
        });
        // After attaching: a process born since is seen by its counters.
        let seeded = model.seed_live_processes(unix_ms());
        tracing::debug!(processes = seeded, "live processes entered from /proc");
        let py = crate::pipeline::gpu::python::PyWalker::new(
            &mut loaded.ebpf,
            plan.gpu.python_frames,
            reader.clone(),
            model.py_frames.clone(),
            crate::pipeline::gpu::python::Retention::NamedBySites,
        );
        let shared = Arc::new(Shared::new(model, plan, rules, reader));
        let _ = shared.gpu_inflight.set(collector.gpu_inflight());
        let syscalls_attached = loaded
            .probes
            .iter()
            .any(|p| p.name == "sys_exit" && p.state == ethand_snapshot::ProbeState::Attached);
        Ok(Self {
            syscalls_attached,
            maps_changed: Default::default(),
            socket_access: String::new(),
            capabilities: crate::privilege::names(crate::privilege::effective()),
            user: String::new(),
            loaded,
            collector,
            gpu,
            py,
            sampler,
            activity,
            profiler,
            devices: crate::pipeline::devices::DeviceSampler::start(
                &shared.plan.devices,
                hostname(),
            ),
            shared,
            started_at_unix_ms: unix_ms(),
            cfg: cfg.clone(),
        })
    }

    /// Applies the lifecycle events pending in the ring buffer. Called between collection
    /// rounds when the kernel side asks (the buffer a quarter full), so that a burst of exits
    /// does not overflow it while the round waits for its tick.
    pub fn drain_lifecycle(&mut self) {
        let mut model = self.shared.model.lock().expect("lock");
        self.collector.drain_lifecycle(&mut model);
    }

    /// Starts the launch samples snapshots asked for; answers those whose time is up (every
    /// one with `force`).
    pub fn sample_tick(&mut self, force: bool) {
        let new = std::mem::take(&mut *self.shared.sample_requests.lock().expect("lock"));
        self.sampler
            .tick(&mut self.loaded.ebpf, &self.gpu, new, force);
        let new = std::mem::take(&mut *self.shared.profile_requests.lock().expect("lock"));
        self.profiler.tick(&mut self.loaded.ebpf, new, force);
        let new = std::mem::take(&mut *self.shared.activity_requests.lock().expect("lock"));
        let streams = std::mem::take(&mut *self.shared.gpu_trace_requests.lock().expect("lock"));
        self.activity
            .tick(&mut self.loaded.ebpf, &self.gpu, (new, streams), force);
    }

    /// One collection round: lifecycle events, map read, model update, reclaim, snapshot.
    /// Reads the memory of the processes due a sample (`model/memory.rs`) with the model
    /// unlocked, then enters it.
    fn sample_memory(&mut self, due: crate::pipeline::model::memory::MemoryDue, now: u64) {
        use crate::pipeline::memory;
        let mut buf = Vec::with_capacity(4096);
        let readings: Vec<_> = due
            .keys
            .into_iter()
            .map(
                |(key, faults)| crate::pipeline::model::memory::MemoryReading {
                    key,
                    status: memory::sample(key.tgid, &mut buf),
                    faults: faults.then(|| memory::faults(key.tgid, &mut buf)).flatten(),
                },
            )
            .collect();
        if !readings.is_empty() {
            self.shared
                .model
                .lock()
                .expect("lock")
                .record_memory(readings, now);
        }
    }

    pub fn collect(&mut self) {
        let req = self.shared.level_request.lock().expect("lock").take();
        if let Some((level, reply)) = req {
            let r = self.gpu.set_level(&mut self.loaded.ebpf, level);
            let _ = reply.try_send(r.map_err(|e| e.to_string()));
        }
        // Attach to runtime libraries loaded since the last rescan before reading the maps.
        let hints = self.syscalls_attached.then_some(&mut self.maps_changed);
        self.gpu.tick(&mut self.loaded.ebpf, hints);
        self.sample_tick(false);
        let now = unix_ms();
        let memory_due;
        let py_callers: Vec<ethand_common::ProcKey>;
        let py_sites: Vec<ethand_common::GpuSiteKey>;
        let node = {
            let mut model = self.shared.model.lock().expect("lock");
            self.collector.drain_lifecycle(&mut model);
            let (ebpf, probe) = (&self.loaded.ebpf, &self.loaded.program_probe);
            self.collector.stats.tick(|| program_costs(ebpf, probe));
            model.launches_counted = self.gpu.level().counts_launches();
            let raw = self.collector.read();
            let reclaim = model.ingest(raw, now);
            // The Python walk's round after the model's (it takes no model state).
            py_callers = raw
                .gpu_calls
                .iter()
                .map(|(k, _)| ethand_common::ProcKey {
                    tgid: k.tgid,
                    _pad0: 0,
                    proc_start_ns: k.proc_start_ns,
                })
                .collect();
            py_sites = raw.gpu_sites.iter().map(|(k, _)| *k).collect();
            memory_due = model.take_memory_due();
            self.maps_changed.extend(model.drain_maps_changed());
            self.collector.reclaim(&reclaim);
            let devices = self.devices.latest();
            self.shared
                .device_history
                .lock()
                .expect("lock")
                .push(now, &devices);
            let (cpu_seconds, rss_bytes) = procinfo::self_usage();
            NodeSnapshot {
                schema_version: snap::SCHEMA_VERSION,
                hostname: hostname(),
                taken_at_unix_ms: now,
                interval_ms: self.cfg.daemon.interval_ms,
                processes: Vec::new(),
                cgroups: Vec::new(),
                comms: Vec::new(),
                block_devices: Vec::new(),
                devices: (*devices).clone(),
                ethand: SelfStatus {
                    version: env!("CARGO_PKG_VERSION").into(),
                    pid: std::process::id(),
                    started_at_unix_ms: self.started_at_unix_ms,
                    probes: self
                        .loaded
                        .probes
                        .iter()
                        .cloned()
                        .chain(self.gpu.probe_status())
                        .chain(crate::pipeline::devices::probe_status(&devices))
                        .collect(),
                    maps: self.collector.fills.clone(),
                    programs: self
                        .collector
                        .stats
                        .costs(program_costs(&self.loaded.ebpf, &self.loaded.program_probe)),
                    dropped: {
                        let d = self.collector.drops();
                        self.shared.record_drops(now, &d, model.overflow);
                        d
                    },
                    bpf_stats: self.collector.stats.mode_name().into(),
                    bpf_stats_enabled_ms: self.collector.stats.enabled_ms(),
                    cpu_seconds,
                    rss_bytes,
                    processes_overflow: model.overflow,
                    tracked_processes: model.procs.len() as u64,
                    gpu_level: Some(self.gpu.level()),
                    gpu_libraries: self.gpu.libraries(),
                    otlp: self.shared.otlp.get().map(|s| s.status()),
                    socket_access: self.socket_access.clone(),
                    capabilities: self.capabilities.clone(),
                    user: self.user.clone(),
                    servers: self
                        .shared
                        .servers
                        .get()
                        .map(|v| v.iter().map(|l| l.status()).collect())
                        .unwrap_or_default(),
                    last_round_unix_ms: unix_ms(),
                    last_round_age_ms: None,
                    reader: Some(self.shared.reader.status()),
                },
            }
        };
        *self.shared.node.write().expect("lock") = Arc::new(node);
        self.py.round(
            py_callers.into_iter(),
            py_sites.iter().map(|k| {
                let proc = ethand_common::ProcKey {
                    tgid: k.tgid,
                    _pad0: 0,
                    proc_start_ns: k.proc_start_ns,
                };
                (proc, k.py_stack)
            }),
        );
        self.sample_memory(memory_due, now);
        // Snapshots and scrapes allocate megabytes for a moment, on several threads: hand the
        // freed heap back now and then so that RSS reflects what the daemon holds.
        #[cfg(target_env = "gnu")]
        if self.shared.model.lock().expect("lock").round % 10 == 0 {
            // SAFETY: releases only free memory of glibc's allocator.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// Tells the service manager (NOTIFY_SOCKET) about a state change; a failure only loses the
/// notification, so it is logged and the daemon goes on.
fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        warn!(error = %e, "sd_notify failed");
    }
}

impl Engine {
    /// Detaches and unloads every program, all at once: each tracepoint detach waits for an
    /// RCU grace period (50-70 ms measured here), so one after the other they took ~1-2 s
    /// and delayed the exit on SIGTERM; in parallel the grace periods overlap.
    pub fn unload_programs(&mut self) {
        // Programs never loaded (record programs, probes that did not attach, uprobes of a
        // runtime no process loaded) have nothing to unload: aya would say "not loaded".
        let progs: Vec<&mut aya::programs::Program> = self
            .loaded
            .ebpf
            .programs_mut()
            .map(|(_, p)| p)
            .filter(|p| p.fd().is_ok())
            .collect();
        std::thread::scope(|s| {
            for p in progs {
                s.spawn(move || {
                    use aya::programs::Program as P;
                    let r = match p {
                        P::TracePoint(p) => p.unload(),
                        P::BtfTracePoint(p) => p.unload(),
                        P::UProbe(p) => p.unload(),
                        P::RawTracePoint(p) => p.unload(),
                        _ => Ok(()),
                    };
                    if let Err(e) = r {
                        warn!(error = %e, "unloading a program failed");
                    }
                });
            }
        });
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Builds the OTLP exporter (`[otlp]`) over the shared snapshot; blocking (call it outside
/// async code, e.g. in `block_in_place`).
fn start_otlp(
    cfg: &Config,
    shared: &Arc<Shared>,
) -> anyhow::Result<ethand_exporters::otlp::OtlpExporter> {
    use ethand_exporters::otlp::{OtlpExporter, OtlpOptions, OtlpProtocol};
    let o = &cfg.otlp;
    let opts = OtlpOptions {
        endpoint: o.endpoint.clone(),
        protocol: OtlpProtocol::parse(&o.protocol).context("otlp.protocol: validated")?,
        headers: o.headers.clone(),
        interval: Duration::from_millis(o.interval_ms),
        timeout: Duration::from_millis(o.timeout_ms),
        resource_attributes: o.resource_attributes.clone(),
        host_name: hostname(),
        node_name: std::env::var(&o.node_name_env)
            .ok()
            .filter(|s| !s.is_empty()),
        service_version: env!("CARGO_PKG_VERSION").into(),
        selection: ExportSelection::Preselected,
        max_points_per_metric: usize::try_from(o.max_points_per_metric).unwrap_or(usize::MAX),
    };
    let shared = shared.clone();
    OtlpExporter::start(opts, move || shared.export_node()).with_context(|| {
        format!(
            "cannot start the OTLP export (otlp.endpoint = {:?})",
            o.endpoint
        )
    })
}

async fn refuse_second_daemon(socket: &std::path::Path) -> anyhow::Result<()> {
    match api::other_daemon(socket, Duration::from_secs(3)).await {
        Some(other) => anyhow::bail!(
            "{other}: stop it first (systemctl stop ethand), or give this daemon its own daemon.socket (--socket)"
        ),
        None => Ok(()),
    }
}

pub async fn run(cfg: Config) -> anyhow::Result<()> {
    // Two daemons would both attach every probe (each event paid twice) and the later one
    // would take the socket over: refuse while another serves there.
    refuse_second_daemon(&cfg.daemon.socket).await?;
    // Bind the listeners first: a bad address is a config error, reported before BPF work.
    let metrics = if cfg.prometheus.enabled {
        let addr = cfg.listen_addr();
        Some(
            crate::serve::http::listen(addr)
                .with_context(|| format!("cannot listen on prometheus.listen = {addr}"))?,
        )
    } else {
        None
    };
    // TLS and basic auth of /metrics: a bad web-config file stops the start, naming the file.
    let web = if cfg.prometheus.enabled {
        crate::serve::web_config::WebConfig::load(&cfg.prometheus.web_config_file)
            .map_err(|e| UsageError(format!("prometheus.web_config_file: {e}")))?
    } else {
        crate::serve::web_config::WebConfig::default()
    };
    // Found before any BPF work: a user that does not exist is a configuration error.
    let run_as =
        crate::privilege::RunAs::lookup(&cfg.daemon.user).map_err(|e| UsageError(e.to_string()))?;
    let fd_limit = crate::serve::connlimit::raise_nofile_limit();
    let mut engine = Engine::start(&cfg)?;
    // Again: one started while this one loaded its probes.
    refuse_second_daemon(&cfg.daemon.socket).await?;
    let (api_listener, access) = api::bind(&cfg.daemon.socket, &cfg.daemon.socket_group)
        .with_context(|| format!("cannot create socket {}", cfg.daemon.socket.display()))?;
    engine.socket_access = access;
    let caps = ConnectionCaps::fit(&cfg, metrics.is_some(), fd_limit);
    let mut servers = vec![caps.api.clone()];
    if metrics.is_some() {
        servers.push(caps.metrics.clone());
    }
    let _ = engine.shared.servers.set(servers);
    // The first collection finds the runtime libraries already loaded; they are attached
    // before "ready" (their symbols are read by the reader, off the loop from now on).
    engine.collect();
    engine.gpu.settle(&mut engine.loaded.ebpf, GPU_SETTLE);
    let shared = engine.shared.clone();
    tokio::spawn(api::serve(api_listener, shared.clone(), caps.api.clone()));
    if let Some(listener) = metrics {
        serve_metrics(listener, &cfg, &shared, web, &caps)?;
    }
    // OTLP export: started once the first snapshot exists, so its first batch has data.
    let otlp = if cfg.otlp.enabled {
        let exporter = tokio::task::block_in_place(|| start_otlp(&cfg, &shared))?;
        let _ = shared.otlp.set(exporter.stats());
        info!(endpoint = %exporter.stats().status().endpoint, protocol = %cfg.otlp.protocol, interval_ms = cfg.otlp.interval_ms, "exporting OTLP metrics");
        Some(exporter)
    } else {
        None
    };
    start_stats_helper(&mut engine, run_as.as_ref());
    drop_privileges(run_as.as_ref(), &mut engine)?;
    let attached = engine
        .loaded
        .probes
        .iter()
        .filter(|p| p.state == snap::ProbeState::Attached)
        .count();
    // Out of the probes wanted: not those turned off or not needed on this kernel.
    let total = engine
        .loaded
        .probes
        .iter()
        .filter(|p| p.state != snap::ProbeState::Disabled)
        .count();
    // Before "ready": a SIGTERM right after it (systemctl stop) must still shut down cleanly.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    exit_after_stop_limit(cfg.daemon.socket.clone())?;
    info!(attached, total, socket = %cfg.daemon.socket.display(), "ready");
    // Type=notify: systemd considers ethand started only now that probes are attached, the
    // first snapshot exists and both servers listen. Outside systemd this does nothing.
    let status = format!("{attached}/{total} probes attached");
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    collect_until_stopped(&mut engine, &cfg, term).await;
    info!("shutting down");
    notify(&[sd_notify::NotifyState::Stopping]);
    if let Some(exporter) = otlp {
        stop_otlp(exporter, &cfg).await;
    }
    let _ = std::fs::remove_file(&cfg.daemon.socket);
    // Dropping the engine detaches every program and frees the maps.
    engine.unload_programs();
    drop(engine);
    Ok(())
}

/// The servers' connection limiters, their caps fitted to the open-file limit: connections
/// must never take the descriptors measuring needs.
struct ConnectionCaps {
    api: Arc<crate::serve::connlimit::ConnLimiter>,
    metrics: Arc<crate::serve::connlimit::ConnLimiter>,
    max_metrics: u64,
}

impl ConnectionCaps {
    fn fit(cfg: &Config, metrics_enabled: bool, fd_limit: u64) -> Self {
        let wanted_metrics = if metrics_enabled {
            cfg.prometheus.max_connections
        } else {
            0
        };
        let fds = crate::serve::connlimit::fds_open();
        let (max_metrics, max_api) = crate::serve::connlimit::fit_to_fd_limit(
            wanted_metrics,
            cfg.daemon.api_max_connections,
            fd_limit,
            fds,
        );
        if (max_metrics, max_api) != (wanted_metrics, cfg.daemon.api_max_connections) {
            warn!(
                fd_limit,
                fds_open = fds,
                metrics = max_metrics,
                api = max_api,
                "connection caps lowered to fit the open-file limit (raise LimitNOFILE / ulimit -n)"
            );
        }
        Self {
            api: crate::serve::connlimit::ConnLimiter::new(
                "api",
                max_api as usize,
                max_api as usize,
            ),
            metrics: crate::serve::connlimit::ConnLimiter::new(
                "metrics",
                max_metrics as usize,
                crate::serve::connlimit::per_peer_in_proportion(
                    cfg.prometheus.max_connections_per_peer,
                    wanted_metrics,
                    max_metrics,
                ) as usize,
            ),
            max_metrics,
        }
    }
}

/// Serves /metrics on `listener`: each scrape gets the round's rendered body.
fn serve_metrics(
    listener: tokio::net::TcpListener,
    cfg: &Config,
    shared: &Arc<Shared>,
    web: crate::serve::web_config::WebConfig,
    caps: &ConnectionCaps,
) -> anyhow::Result<()> {
    // The processes of the export snapshot are the held selection already.
    let opts = PrometheusOptions {
        selection: ExportSelection::Preselected,
        dcgm_aliases: cfg.devices.dcgm_aliases,
        device_workload_labels: cfg.devices.workload_labels,
    };
    let shared = shared.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = shared.metrics_body(&opts);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    info!(
        addr = %listener.local_addr()?,
        scheme = %web.describe(),
        max_connections = caps.max_metrics,
        max_connections_per_peer = cfg.prometheus.max_connections_per_peer.min(caps.max_metrics),
        "serving /metrics"
    );
    tokio::spawn(crate::serve::http::serve(
        listener,
        app,
        web,
        caps.metrics.clone(),
        Duration::from_millis(cfg.prometheus.timeout_ms),
    ));
    Ok(())
}

/// The sampled BPF statistics need CAP_SYS_ADMIN at each window: a helper that holds it
/// alone switches them, so that the daemon can drop it with the rest.
fn start_stats_helper(engine: &mut Engine, run_as: Option<&crate::privilege::RunAs>) {
    if engine.collector.stats.mode != crate::config::BpfStatsMode::Sampled {
        return;
    }
    match crate::privilege::stats_helper::StatsHelper::spawn(run_as) {
        Ok(h) => {
            info!(
                pid = h.pid(),
                "BPF statistics helper started (holds CAP_SYS_ADMIN alone)"
            );
            engine.collector.stats.use_helper(h);
        }
        Err(e) => engine
            .collector
            .stats
            .turn_off(&format!("cannot start the BPF statistics helper: {e}")),
    }
}

/// Start-up is over: keeps only the capabilities the running daemon needs, in every thread,
/// as daemon.user if one is set, and tells `ethand status` what it runs with.
fn drop_privileges(
    run_as: Option<&crate::privilege::RunAs>,
    engine: &mut Engine,
) -> anyhow::Result<()> {
    let keep = crate::privilege::runtime_caps(&engine.shared.plan);
    match tokio::task::block_in_place(|| crate::privilege::drop_to(keep, run_as)) {
        Ok(d) => {
            info!(
                kept = %crate::privilege::list(d.kept),
                dropped = %crate::privilege::list(d.dropped),
                bounding_set = d.bounding,
                threads = d.threads,
                user = d.user.as_deref().unwrap_or("unchanged"),
                "capabilities dropped"
            );
            if !d.bounding && d.dropped != 0 {
                warn!(
                    "no CAP_SETPCAP at start-up: the bounding set keeps the dropped capabilities"
                );
            }
        }
        // Asked to run as a user and could not: never go on as root instead.
        Err(e @ crate::privilege::PrivilegeError::User { .. }) => {
            return Err(UsageError(format!("daemon.user: {e}")).into());
        }
        Err(e) => warn!(error = %e, "dropping capabilities failed"),
    }
    engine.capabilities = crate::privilege::names(crate::privilege::effective());
    engine.user = crate::privilege::current_user();
    if engine.user.starts_with("root ") {
        warn!(
            "running as uid 0: it still owns every root-owned file; set daemon.user (docs/security.md)"
        );
    }
    let mut node = engine.shared.node.write().expect("lock");
    let mut head = (**node).clone();
    head.ethand.capabilities = engine.capabilities.clone();
    head.ethand.user = engine.user.clone();
    *node = Arc::new(head);
    Ok(())
}

/// Whatever the loop is doing, SIGTERM ends the daemon within STOP_LIMIT: if the orderly
/// shutdown has not finished by then, the process exits (the kernel detaches every program
/// with its descriptors).
fn exit_after_stop_limit(socket: std::path::PathBuf) -> anyhow::Result<()> {
    let mut term_watch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        term_watch.recv().await;
        let _ = std::thread::Builder::new()
            .name("ethand-stop".into())
            .spawn(move || {
                std::thread::sleep(STOP_LIMIT);
                warn!(
                    limit_s = STOP_LIMIT.as_secs(),
                    "shutdown did not finish in time: exiting now"
                );
                let _ = std::fs::remove_file(&socket);
                std::process::exit(0);
            });
    });
    Ok(())
}

/// The collection loop: a round every `daemon.interval_ms`, the lifecycle ring buffer
/// drained when the kernel wakes it, the systemd watchdog pinged from the loop itself (a
/// stuck collection, not just a dead process, gets the daemon restarted), until SIGTERM or
/// Ctrl-C.
async fn collect_until_stopped(
    engine: &mut Engine,
    cfg: &Config,
    mut term: tokio::signal::unix::Signal,
) {
    let watchdog = sd_notify::watchdog_enabled().map(|t| t / 2);
    let mut last_ping = std::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.daemon.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Readable when the kernel side wakes it (lifecycle.rs); without it the rounds still drain.
    let mut lifecycle = match engine.collector.lifecycle_fd().and_then(|fd| {
        // SAFETY: the AsyncFd owns this descriptor; it stays open, and the same, until the
        // AsyncFd is dropped.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)
    }) {
        Ok(fd) => Some(fd),
        Err(e) => {
            warn!(error = %e, "cannot wait on the lifecycle ring buffer: it is drained once per round only");
            None
        }
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Map reads are blocking syscalls, but short; block_in_place keeps the servers responsive.
                tokio::task::block_in_place(|| engine.collect());
                if watchdog.is_some_and(|every| last_ping.elapsed() >= every) {
                    notify(&[sd_notify::NotifyState::Watchdog]);
                    last_ping = std::time::Instant::now();
                }
            }
            ready = async {
                match &lifecycle {
                    Some(fd) => fd.readable().await,
                    None => std::future::pending().await,
                }
            } => match ready {
                Ok(mut guard) => {
                    engine.drain_lifecycle();
                    guard.clear_ready();
                }
                Err(e) => {
                    warn!(error = %e, "waiting on the lifecycle ring buffer failed: it is drained once per round only");
                    lifecycle = None;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
}

/// One last export (one attempt, at most otlp.timeout_ms), bounded here too.
async fn stop_otlp(exporter: ethand_exporters::otlp::OtlpExporter, cfg: &Config) {
    let limit = Duration::from_millis(cfg.otlp.timeout_ms) + Duration::from_secs(1);
    match tokio::time::timeout(
        limit,
        tokio::task::spawn_blocking(move || exporter.shutdown()),
    )
    .await
    {
        Ok(Ok(Ok(()))) => info!("OTLP export flushed and stopped"),
        Ok(Ok(Err(e))) => warn!(error = %e, "OTLP final export failed"),
        Ok(Err(e)) => warn!(error = %e, "OTLP shutdown task failed"),
        Err(_) => warn!(
            limit_ms = limit.as_millis() as u64,
            "OTLP shutdown timed out"
        ),
    }
}

/// A measurement of `pid`'s tree by this process alone (no daemon, or `--standalone`): the
/// probes attached for `duration`, samples over its end; None when no process of the tree
/// was seen.
pub async fn standalone_snapshot(
    cfg: &crate::config::Config,
    pid: u32,
    duration: std::time::Duration,
    samples: crate::serve::tree::Samples,
    mut progress: impl FnMut(std::time::Duration),
) -> anyhow::Result<Option<ethand_snapshot::TreeSnapshot>> {
    // A thread id stands for its process (its launch sample too).
    let pid = crate::pipeline::procinfo::tgid_of(pid).unwrap_or(pid);
    let mut engine = Engine::start(cfg)?;
    let step = std::time::Duration::from_millis(cfg.daemon.interval_ms.min(250));
    let t0 = std::time::Instant::now();
    engine.collect();
    engine.gpu.settle(&mut engine.loaded.ebpf, GPU_SETTLE);
    // The first round found the runtime libraries: count the tree's launches over the rest
    // of the measurement (at a level that does not count them anyway).
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    if samples.launches && engine.gpu.level() == crate::config::GpuLevel::Calls {
        engine.shared.sample_requests.lock().expect("lock").push(
            crate::pipeline::launch_sample::Request {
                pids: crate::pipeline::procinfo::descendants(pid),
                duration,
                reply: tx,
            },
        );
    }
    // The GPU activity of the tree over the end of the measurement (its windows are opened
    // at the next round, once the libraries found by the first are known).
    let (activity_tx, activity_rx) = std::sync::mpsc::sync_channel(1);
    if let Some(window) = engine.shared.plan.gpu_activity {
        engine.shared.activity_requests.lock().expect("lock").push(
            crate::pipeline::gpu_activity::Request {
                pids: crate::pipeline::procinfo::descendants(pid),
                duration: window.min(duration),
                reply: activity_tx,
            },
        );
    }
    // The tree's Python frames over the end of the measurement, on their own thread.
    let stacks = samples.stacks.then(|| {
        let shared = engine.shared.clone();
        let d = engine.shared.plan.stack_window().min(duration);
        let wait = duration.saturating_sub(d);
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            // The measurement lasts its duration anyway: always profile.
            shared.sample_stacks(pid, d, Some(true), false)
        })
    });
    while t0.elapsed() < duration {
        tokio::time::sleep(step.min(duration.saturating_sub(t0.elapsed()))).await;
        engine.collect();
        progress(t0.elapsed());
    }
    engine.sample_tick(true);
    let launch_sample = rx.try_recv().ok();
    let gpu_activity = activity_rx.try_recv().ok();
    let code = stacks.and_then(|h| h.join().ok()).unwrap_or_default();
    let probes = engine
        .loaded
        .probes
        .iter()
        .cloned()
        .chain(engine.gpu.probe_status())
        .collect();
    let ms = t0.elapsed().as_millis() as u64;
    Ok(crate::serve::tree::build_tree(
        &engine.shared,
        crate::serve::tree::TreeRequest {
            pid,
            window_ms: ms + 1000,
            source: ethand_snapshot::SnapshotSource::Standalone,
            measured_ms: ms,
            probes,
            launch_sample,
            gpu_activity,
            code,
        },
    ))
}
