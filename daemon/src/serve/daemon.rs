//! `ethand run`: the collection loop, the shared snapshot, and the two servers that read it
//! (the local API and Prometheus' /metrics).
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use anyhow::Context as _;
use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::{
    self as snap, NodeSnapshot, SelfStatus, TreeSnapshot, TreeTotals,
    selection::{ExportSelection, Selection, SelectionPolicy},
};
use tracing::{info, warn};

use crate::{
    UsageError,
    config::{Config, GpuLevel},
    pipeline::collector::{Collector, program_costs},
    pipeline::gpu::GpuProbes,
    pipeline::loader::{self, Loaded},
    pipeline::model::{self, Model},
    pipeline::procinfo::{self, unix_ms},
    serve::api::{self, Request, Response},
};

/// The "recent" window of every process in the node snapshot (/metrics top N, OTLP).
const SNAPSHOT_WINDOW_MS: u64 = 10_000;

/// State shared between the collection loop and the servers.
pub struct Shared {
    pub model: Mutex<Model>,
    /// A level change asked for through the API, applied by the collection loop.
    pub level_request: Mutex<
        Option<(
            GpuLevel,
            std::sync::mpsc::SyncSender<Result<String, String>>,
        )>,
    >,
    /// The latest round's node-wide parts (status, devices); its process, cgroup and block
    /// lists are empty: [`Shared::node`] fills them from the model when someone asks.
    pub node: RwLock<Arc<NodeSnapshot>>,
    /// The full snapshot last built, for the round of `node` it was built from.
    /// Weak: the snapshot lives only as long as a reader holds it, not between scrapes.
    built: Mutex<(u64, std::sync::Weak<NodeSnapshot>)>,
    /// The exporters' snapshot of the round (see [`Shared::export_node`]).
    exported: Mutex<Option<(u64, Arc<NodeSnapshot>)>>,
    /// Which processes get series (`[prometheus]` top_n, pids, comms, cgroups, hold), and
    /// the slot holders between rounds: /metrics and OTLP export the same processes.
    selection: Mutex<(SelectionPolicy, Selection)>,
    pub devnames: HashMap<u32, String>,
    /// Diagnosis rules (built-in plus the rules directory).
    pub rules: Vec<crate::diagnose::Rule>,
    /// OTLP export counters, set once the export has started (`[otlp] enabled`).
    pub otlp: std::sync::OnceLock<Arc<ethand_exporters::otlp::OtlpStats>>,
    /// The /metrics body of a round, rendered once and shared by every scrape of that round.
    rendered: Mutex<Option<(u64, axum::body::Bytes)>>,
    /// The node dump (`{"ok":...}` line) of a round, shared by the API replies that hold it.
    node_line: Mutex<(u64, std::sync::Weak<Vec<u8>>)>,
    /// The servers' connection limiters (/metrics, the local API), for `ethand status`.
    pub servers: std::sync::OnceLock<Vec<Arc<crate::serve::connlimit::ConnLimiter>>>,
    /// When node-wide losses happened, for the snapshots they may have cut.
    drops: Mutex<crate::pipeline::drop_history::DropHistory>,
    /// Per collection round, each GPU's readings (utilization, GPM ratios): the window means
    /// of the diagnosis, rather than the one reading of the moment.
    pub device_history: Mutex<crate::pipeline::devices::DeviceHistory>,
    /// Launch samples asked for by snapshots, started by the collection loop.
    pub sample_requests: Mutex<Vec<crate::pipeline::launch_sample::Request>>,
    /// `diagnosis.launch_sample_ms`.
    pub launch_sample: std::time::Duration,
}

impl Shared {
    /// The full snapshot of the latest round, built at most once per round and only when
    /// asked for: a scrape every 15 s does not pay for a snapshot of every process every
    /// second (at 1,000+ processes that was most of the daemon's CPU time).
    pub fn node(&self) -> Arc<NodeSnapshot> {
        let head = self.node.read().expect("lock").clone();
        let mut built = self.built.lock().expect("lock");
        if built.0 == head.taken_at_unix_ms {
            if let Some(node) = built.1.upgrade() {
                return node;
            }
        }
        let node = self.build_node(&head, |model| {
            model
                .procs
                .values()
                .map(|p| model.process_snapshot(p, SNAPSHOT_WINDOW_MS, &self.devnames))
                .collect()
        });
        *built = (head.taken_at_unix_ms, Arc::downgrade(&node));
        node
    }

    /// The snapshot /metrics and OTLP read: every node-wide part, but full process snapshots
    /// only of the processes the exporters select (top N, named, GPU users; the selection of
    /// the result is the same set). At 4,000 tracked processes building all of them for each
    /// scrape was 90 % of its time; kept for the round, it is small.
    pub fn export_node(&self) -> Arc<NodeSnapshot> {
        let head = self.node.read().expect("lock").clone();
        let mut cached = self.exported.lock().expect("lock");
        if let Some((t, node)) = cached.as_ref() {
            if *t == head.taken_at_unix_ms {
                return node.clone();
            }
        }
        let node = self.build_node(&head, |model| {
            let procs: Vec<&model::Proc> = model.procs.values().map(|p| &**p).collect();
            let views: Vec<snap::ProcessSnapshot> = procs
                .iter()
                .map(|p| model.selection_view(p, SNAPSHOT_WINDOW_MS))
                .collect();
            let mut guard = self.selection.lock().expect("lock");
            let (policy, selection) = &mut *guard;
            selection
                .pick(&views, policy, head.taken_at_unix_ms)
                .into_iter()
                .map(|i| model.process_snapshot(procs[i], SNAPSHOT_WINDOW_MS, &self.devnames))
                .collect()
        });
        *cached = Some((head.taken_at_unix_ms, node.clone()));
        node
    }

    /// The round's node-wide parts (`head`) plus the processes `processes` picks, the cgroup
    /// and block-device sums, and the device join, from one look at the model.
    fn build_node(
        &self,
        head: &NodeSnapshot,
        processes: impl FnOnce(&Model) -> Vec<snap::ProcessSnapshot>,
    ) -> Arc<NodeSnapshot> {
        let model = self.model.lock().expect("lock");
        let mut processes = processes(&model);
        let cgroups = model.cgroups();
        let comms = model.comms();
        let block_devices = model.block_devices(&self.devnames);
        drop(model);
        crate::pipeline::devices::join(&mut processes, &head.devices);
        Arc::new(NodeSnapshot {
            processes,
            cgroups,
            comms,
            block_devices,
            ..head.clone()
        })
    }

    /// The /metrics body of the latest round: rendered by the first scrape of the round (the
    /// others wait for it) and shared by all of them.
    pub fn metrics_body(&self, opts: &PrometheusOptions) -> axum::body::Bytes {
        let round = self.node.read().expect("lock").taken_at_unix_ms;
        let mut cached = self.rendered.lock().expect("lock");
        if let Some((t, body)) = cached.as_ref() {
            if *t == round {
                return body.clone();
            }
        }
        let node = self.export_node();
        let body = axum::body::Bytes::from(render(&node, opts));
        *cached = Some((node.taken_at_unix_ms, body.clone()));
        body
    }

    /// The API's answer to `ethand status`: one `{"ok":...}` line.
    pub fn status_line(&self) -> Vec<u8> {
        let node = self.node.read().expect("lock").clone();
        api::ok_line(&node.ethand)
    }

    /// The API's answer to a node dump or a snapshot: one reply line. Built under
    /// `api.rs`'s bound on concurrent builds.
    pub fn answer(&self, req: Request) -> Arc<Vec<u8>> {
        match req {
            Request::Node => {
                let round = self.node.read().expect("lock").taken_at_unix_ms;
                let mut cached = self.node_line.lock().expect("lock");
                if cached.0 == round {
                    if let Some(line) = cached.1.upgrade() {
                        return line;
                    }
                }
                let node = self.node();
                let line = Arc::new(api::ok_line(&*node));
                *cached = (node.taken_at_unix_ms, Arc::downgrade(&line));
                line
            }
            Request::Snapshot {
                pid,
                window_s,
                launch_sample,
            } => {
                let pid = crate::pipeline::procinfo::tgid_of(pid).unwrap_or(pid);
                let (probes, level) = {
                    let node = self.node.read().expect("lock");
                    (node.ethand.probes.clone(), node.ethand.gpu_level.clone())
                };
                // Only for a tree the model knows (else the answer is "not found" at once).
                let sample = (launch_sample.unwrap_or(true)
                    && level == "calls"
                    && !self.model.lock().expect("lock").tree_keys(pid).is_empty())
                .then(|| self.sample_launches(pid, self.launch_sample))
                .flatten();
                Arc::new(
                    match self.tree(
                        pid,
                        window_s.clamp(1, u64::MAX / 1000) * 1000,
                        "daemon",
                        0,
                        probes,
                        sample,
                    ) {
                        Some(t) => api::ok_line(&t),
                        None => api::response_line(&Response::NotFound(format!(
                            "no process with pid {pid} is known to ethand (not running, or exited longer ago than daemon.exit_grace_seconds)"
                        ))),
                    },
                )
            }
            Request::Status => Arc::new(self.status_line()),
            Request::SetLevel { .. } => {
                Arc::new(api::error_line("set_level is answered by the API task"))
            }
        }
    }

    /// Counts the kernel launches of `pid`'s tree for `duration` (see launch_sample.rs):
    /// the collection loop attaches and detaches; this waits for its answer.
    pub fn sample_launches(
        &self,
        pid: u32,
        duration: std::time::Duration,
    ) -> Option<ethand_snapshot::gpu::LaunchSample> {
        if duration.is_zero() {
            return None;
        }
        // Only processes that map a GPU/NPU runtime library: a CPU-only tree waits for nothing.
        let pids: Vec<u32> = crate::pipeline::procinfo::descendants(pid)
            .into_iter()
            .take(4 * crate::pipeline::launch_sample::MAX_PIDS)
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/maps"))
                    .is_ok_and(|m| !ethand_userspace_probes::parse_maps(*p, &m).is_empty())
            })
            .collect();
        if pids.is_empty() {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.sample_requests
            .lock()
            .expect("lock")
            .push(crate::pipeline::launch_sample::Request {
                pids,
                duration,
                reply: tx,
            });
        // Started and ended at collection rounds: up to two intervals more than asked.
        rx.recv_timeout(duration + std::time::Duration::from_secs(5))
            .ok()
    }

    pub fn tree(
        &self,
        pid: u32,
        window_ms: u64,
        source: &str,
        measured_ms: u64,
        probes: Vec<snap::ProbeStatus>,
        launch_sample: Option<ethand_snapshot::gpu::LaunchSample>,
    ) -> Option<TreeSnapshot> {
        // A thread id stands for its process.
        let pid = crate::pipeline::procinfo::tgid_of(pid).unwrap_or(pid);
        let model = self.model.lock().expect("lock");
        let mut keys = model.tree_keys(pid);
        // A root that did nothing the probes saw (a launcher asleep in wait() through a whole
        // standalone measurement) is not in the model: its tree is its live descendants that
        // are, under a root built from /proc with the zero activity it had.
        let mut unseen_root = None;
        if keys.is_empty() {
            let live = crate::pipeline::procinfo::descendants(pid);
            if live.len() > 1 {
                let mut seen: Vec<ethand_common::ProcKey> = Vec::new();
                for c in &live[1..] {
                    for k in model.tree_keys(*c) {
                        if !seen.contains(&k) {
                            seen.push(k);
                        }
                    }
                }
                if !seen.is_empty() {
                    keys = seen;
                    unseen_root = crate::pipeline::procinfo::read(pid);
                }
            }
        }
        if keys.is_empty() {
            return None;
        }
        let mut processes: Vec<snap::ProcessSnapshot> = keys
            .iter()
            .filter_map(|k| model.procs.get(k))
            .map(|p| model.process_snapshot(p, window_ms, &self.devnames))
            .collect();
        let timeline = model.timeline(&keys, window_ms);
        let entered: HashMap<u32, (crate::pipeline::inflight::Entered, u64)> = keys
            .iter()
            .filter_map(|k| model.procs.get(k))
            .filter(|p| p.alive)
            .map(|p| (p.key.tgid, (model.entered_syscalls(p), model.known_ms(p))))
            .collect();
        if let Some(meta) = unseen_root {
            processes.insert(0, model.unseen_process_snapshot(pid, meta, measured_ms));
        }
        drop(model);
        let mono_now_ns = crate::pipeline::procinfo::clocks_ns().0;
        let mut budget = crate::pipeline::inflight::TREE_THREADS_MAX;
        for p in processes.iter_mut().filter(|p| p.alive) {
            (p.swap_bytes, p.major_faults) = crate::pipeline::procinfo::memory(p.pid);
            let (e, known_ms) = entered
                .get(&p.pid)
                .cloned()
                .unwrap_or((Default::default(), measured_ms));
            crate::pipeline::inflight::fill(p, &e, mono_now_ns, known_ms, &mut budget);
        }
        let now = unix_ms();
        let observed_ms = processes.iter().map(|p| p.observed_ms).max().unwrap_or(0);
        let dropped_events = self
            .drops
            .lock()
            .expect("lock")
            .since(now.saturating_sub(observed_ms));
        let node = self.node.read().expect("lock").clone();
        crate::pipeline::devices::join(&mut processes, &node.devices);
        let mut tree = TreeSnapshot {
            schema_version: snap::SCHEMA_VERSION,
            source: source.into(),
            root_pid: pid,
            taken_at_unix_ms: now,
            measured_ms,
            total: totals(&processes, &self.device_history.lock().expect("lock"), now),
            processes,
            probes,
            findings: Vec::new(),
            gpu_level: Some(node.ethand.gpu_level.clone()).filter(|l| !l.is_empty()),
            timeline,
            devices: node.devices.clone(),
            dropped_events,
            launch_sample,
            not_evaluated: Vec::new(),
            node_cpus: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u32),
        };
        crate::diagnose::apply(&mut tree, &self.rules);
        Some(tree)
    }
}

fn totals(
    ps: &[snap::ProcessSnapshot],
    history: &crate::pipeline::devices::DeviceHistory,
    now_ms: u64,
) -> TreeTotals {
    let mut t = TreeTotals {
        sched: snap::SchedStats {
            runq_wait_hist: vec![0; snap::HIST_BUCKETS],
            ..Default::default()
        },
        ..Default::default()
    };
    for p in ps {
        t.processes += 1;
        t.threads += p.threads.iter().filter(|th| th.alive).count() as u64;
        t.sched.add(&p.sched);
        t.syscalls += p.syscalls.count;
        t.syscall_errors += p.syscalls.errors;
        t.syscall_time_ns += p.syscalls.time_ns;
        for b in &p.block {
            match b.op.as_str() {
                "read" => {
                    t.block_read_bytes += b.bytes;
                    t.block_read_ops += b.ops;
                }
                "write" => {
                    t.block_write_bytes += b.bytes;
                    t.block_write_ops += b.ops;
                }
                _ => {}
            }
        }
        t.net.add(&p.net);
        if let Some(g) = &p.gpu {
            t.gpu.get_or_insert_with(Default::default).add(g);
        }
    }
    t.gpu_derived = gpu_derived(ps, history, now_ms);
    t
}

/// Diagnosis signals from the processes' windows and the device collector's utilization.
fn gpu_derived(
    ps: &[snap::ProcessSnapshot],
    history: &crate::pipeline::devices::DeviceHistory,
    now_ms: u64,
) -> Option<ethand_snapshot::gpu::GpuDerived> {
    if ps.iter().all(|p| p.gpu.is_none()) {
        return None;
    }
    let window_ms = ps
        .iter()
        .filter_map(|p| p.window.as_ref())
        .map(|w| w.duration_ms)
        .max()?;
    if window_ms == 0 {
        return None;
    }
    let secs = window_ms as f64 / 1000.0;
    let sum = |f: fn(&snap::WindowStats) -> u64| -> u64 {
        ps.iter().filter_map(|p| p.window.as_ref()).map(f).sum()
    };
    let wall_ns = window_ms as f64 * 1e6;
    // Device readings: window means over the devices the tree's processes use (all GPUs
    // when the driver names none for them: a container's pids are not the host's).
    let used: Vec<String> = ps
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.device.clone()))
        .collect();
    let means = history.means(&used, now_ms.saturating_sub(window_ms));
    let launches: Option<u64> = ps
        .iter()
        .filter_map(|p| p.window.as_ref())
        .map(|w| w.gpu_launches)
        .reduce(ethand_snapshot::gpu::add_counted)
        .flatten();
    Some(ethand_snapshot::gpu::GpuDerived {
        window_ms,
        launches_per_second: launches.map(|n| n as f64 / secs),
        syncs_per_second: sum(|w| w.gpu_sync_calls) as f64 / secs,
        sm_activity_ratio: means.sm_activity_ratio,
        sm_occupancy_ratio: means.sm_occupancy_ratio,
        tensor_activity_ratio: means.tensor_activity_ratio,
        dram_bandwidth_ratio: means.dram_bandwidth_ratio,
        sync_blocked_ratio: sum(|w| w.gpu_sync_ns) as f64 / wall_ns,
        collective_ratio: sum(|w| w.collective_ns) as f64 / wall_ns,
        copy_bytes_per_second: vec![
            (
                "host_to_device".into(),
                sum(|w| w.gpu_copy_h2d_bytes) as f64 / secs,
            ),
            (
                "device_to_host".into(),
                sum(|w| w.gpu_copy_d2h_bytes) as f64 / secs,
            ),
            (
                "other".into(),
                sum(|w| w.gpu_copy_other_bytes) as f64 / secs,
            ),
        ],
        device_utilization_ratio: means.utilization_ratio,
        device_idle_ratio: means.utilization_ratio.map(|u| (1.0 - u).max(0.0)),
    })
}

/// The probes, maps and model, loaded and ready to collect.
pub struct Engine {
    pub loaded: Loaded,
    pub collector: Collector,
    pub gpu: GpuProbes,
    pub sampler: crate::pipeline::launch_sample::LaunchSampler,
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
        let mut loaded = loader::load(cfg)?;
        let collector = Collector::new(&mut loaded.ebpf, cfg, loaded.oncpu_from_task)
            .context("setting up map readers")?;
        let gpu = GpuProbes::new(&mut loaded.ebpf, cfg);
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
        for prog in [progs.entry, progs.ret, sampler.program()] {
            loaded
                .program_probe
                .insert(prog.into(), format!("uprobe_{prog}"));
        }
        let d = &cfg.daemon;
        let mut model = Model::new(
            d.interval_ms,
            d.history_seconds,
            d.exit_grace_seconds,
            d.max_processes,
        );
        model.attribution = Some(crate::pipeline::attribution::Attributor::new(
            cfg.attribution.clone(),
        ));
        model.launches_counted = cfg.gpu.level.counts_launches();
        model.max_exited = d.max_exited_processes;
        model.exit_events = loaded.probes.iter().any(|p| {
            p.name == "sched_process_exit" && p.state == ethand_snapshot::ProbeState::Attached
        });
        // After attaching: a process born since is seen by its counters.
        let seeded = model.seed_live_processes(unix_ms());
        tracing::debug!(processes = seeded, "live processes entered from /proc");
        let shared = Arc::new(Shared {
            model: Mutex::new(model),
            level_request: Mutex::new(None),
            node: RwLock::new(Arc::new(NodeSnapshot::default())),
            built: Mutex::new((u64::MAX, std::sync::Weak::new())),
            exported: Mutex::new(None),
            selection: Mutex::new((selection_policy(&cfg.prometheus), Selection::new())),
            devnames: model::block_device_names(),
            rules: crate::diagnose::load_rules(&cfg.diagnosis.rules_dir),
            otlp: std::sync::OnceLock::new(),
            rendered: Mutex::new(None),
            node_line: Mutex::new((u64::MAX, std::sync::Weak::new())),
            servers: std::sync::OnceLock::new(),
            drops: Mutex::default(),
            sample_requests: Mutex::default(),
            device_history: Mutex::new(crate::pipeline::devices::DeviceHistory::new(
                (d.history_seconds * 1000 / d.interval_ms.max(1)).max(2) as usize,
            )),
            launch_sample: std::time::Duration::from_millis(cfg.diagnosis.launch_sample_ms),
        });
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
            sampler,
            devices: crate::pipeline::devices::DeviceSampler::start(cfg, hostname()),
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
    }

    /// One collection round: lifecycle events, map read, model update, reclaim, snapshot.
    pub fn collect(&mut self) {
        let req = self.shared.level_request.lock().expect("lock").take();
        if let Some((level, reply)) = req {
            let r = self.gpu.set_level(&mut self.loaded.ebpf, level);
            let _ = reply.try_send(r);
        }
        // Attach to runtime libraries loaded since the last rescan before reading the maps.
        let hints = self.syscalls_attached.then_some(&mut self.maps_changed);
        self.gpu.tick(&mut self.loaded.ebpf, hints);
        self.sample_tick(false);
        let now = unix_ms();
        let node = {
            let mut model = self.shared.model.lock().expect("lock");
            self.collector.drain_lifecycle(&mut model);
            self.collector.stats.tick();
            model.launches_counted = self.gpu.level().counts_launches();
            let raw = self.collector.read();
            let reclaim = model.ingest(raw, now);
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
                    programs: program_costs(&self.loaded.ebpf, &self.loaded.program_probe),
                    dropped: {
                        let d = self.collector.drops();
                        self.shared
                            .drops
                            .lock()
                            .expect("lock")
                            .record(now, &d, model.overflow);
                        d
                    },
                    bpf_stats: self.collector.stats.mode_name().into(),
                    bpf_stats_enabled_ms: self.collector.stats.enabled_ms(),
                    cpu_seconds,
                    rss_bytes,
                    processes_overflow: model.overflow,
                    tracked_processes: model.procs.len() as u64,
                    gpu_level: self.gpu.level().as_str().into(),
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
                },
            }
        };
        *self.shared.node.write().expect("lock") = Arc::new(node);
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

/// The process selection `[prometheus]` asks for.
fn selection_policy(p: &crate::config::PrometheusConfig) -> SelectionPolicy {
    SelectionPolicy {
        top_n: p.top_n,
        pids: p.pids.clone(),
        comms: p.comms.clone(),
        cgroups: p.cgroups.clone(),
        hold_ms: p.selection_hold_seconds.saturating_mul(1000),
        min_age_ms: p.selection_min_age_seconds.saturating_mul(1000),
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
    let run_as = crate::privilege::RunAs::lookup(&cfg.daemon.user).map_err(UsageError)?;
    let fd_limit = crate::serve::connlimit::raise_nofile_limit();
    let mut engine = Engine::start(&cfg)?;
    // Again: one started while this one loaded its probes.
    refuse_second_daemon(&cfg.daemon.socket).await?;
    let (api_listener, access) = api::bind(&cfg.daemon.socket, &cfg.daemon.socket_group)
        .with_context(|| format!("cannot create socket {}", cfg.daemon.socket.display()))?;
    engine.socket_access = access;
    // Connections must never take the descriptors measuring needs: the caps fit the limit.
    let wanted_metrics = if metrics.is_some() {
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
    let api_limiter =
        crate::serve::connlimit::ConnLimiter::new("api", max_api as usize, max_api as usize);
    let metrics_limiter = crate::serve::connlimit::ConnLimiter::new(
        "metrics",
        max_metrics as usize,
        cfg.prometheus.max_connections_per_peer as usize,
    );
    let mut servers = vec![api_limiter.clone()];
    if metrics.is_some() {
        servers.push(metrics_limiter.clone());
    }
    let _ = engine.shared.servers.set(servers);
    // The first collection attaches to the runtime libraries already loaded.
    engine.collect();
    let shared = engine.shared.clone();
    tokio::spawn(api::serve(api_listener, shared.clone(), api_limiter));
    if let Some(listener) = metrics {
        // The processes of the export snapshot are the held selection already.
        let opts = PrometheusOptions {
            selection: ExportSelection::Preselected,
            dcgm_aliases: cfg.devices.dcgm_aliases,
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
            max_connections = max_metrics,
            max_connections_per_peer = cfg.prometheus.max_connections_per_peer.min(max_metrics),
            "serving /metrics"
        );
        tokio::spawn(crate::serve::http::serve(
            listener,
            app,
            web,
            metrics_limiter,
            Duration::from_millis(cfg.prometheus.timeout_ms),
        ));
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
    // The sampled BPF statistics need CAP_SYS_ADMIN at each window: a helper that holds it
    // alone switches them, so that the daemon can drop it with the rest.
    if engine.collector.stats.mode == crate::config::BpfStatsMode::Sampled {
        match crate::privilege::stats_helper::StatsHelper::spawn(run_as.as_ref()) {
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
    // Start-up is over: keep only the capabilities the running daemon needs, in every thread,
    // as daemon.user if one is set.
    let keep = crate::privilege::runtime_caps(&cfg);
    match tokio::task::block_in_place(|| crate::privilege::drop_to(keep, run_as.as_ref())) {
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
    {
        let mut node = shared.node.write().expect("lock");
        let mut head = (**node).clone();
        head.ethand.capabilities = engine.capabilities.clone();
        head.ethand.user = engine.user.clone();
        *node = Arc::new(head);
    }
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
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    info!(attached, total, socket = %cfg.daemon.socket.display(), "ready");
    // Type=notify: systemd considers ethand started only now that probes are attached, the
    // first snapshot exists and both servers listen. Outside systemd this does nothing.
    let status = format!("{attached}/{total} probes attached");
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    // WatchdogSec: pinged from the collection loop itself, so a stuck collection (not just a
    // dead process) gets the daemon restarted.
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
    info!("shutting down");
    notify(&[sd_notify::NotifyState::Stopping]);
    if let Some(exporter) = otlp {
        // One last export (one attempt, at most otlp.timeout_ms), bounded here too.
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
    let _ = std::fs::remove_file(&cfg.daemon.socket);
    // Dropping the engine detaches every program and frees the maps.
    engine.unload_programs();
    drop(engine);
    Ok(())
}
