//! The state the collection loop and the servers share: the model, the latest round's
//! node-wide parts, and the snapshots built from them on demand (at most once per round),
//! with the tree snapshot and its totals. The servers (`api.rs`, /metrics) read it; the
//! collection loop (`daemon.rs`) writes it; it imports neither.
use crate::pipeline::xid::XidLedger;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
};

use ethand_exporters::prometheus::{PrometheusOptions, render};
use ethand_snapshot::{
    self as snap, NodeSnapshot,
    selection::{Selection, SelectionPolicy},
};

use crate::{
    config::{GpuLevel, Plan},
    pipeline::model::{self, Model},
};

/// The "recent" window of every process in the node snapshot (/metrics top N, OTLP).
const SNAPSHOT_WINDOW_MS: u64 = 10_000;

/// State shared between the collection loop and the servers.
pub struct Shared {
    pub model: Mutex<Model>,
    /// Who may switch levels and how often (`daemon.level_switch*`), and when the last switch
    /// was made.
    pub level_policy: (crate::config::LevelSwitch, std::time::Duration),
    pub last_level_switch: Mutex<Option<std::time::Instant>>,
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
    pub(super) drops: Mutex<crate::pipeline::drop_history::DropHistory>,
    /// Per collection round, each GPU's readings (utilization, GPM ratios): the window means
    /// of the diagnosis, rather than the one reading of the moment.
    pub device_history: Mutex<crate::pipeline::devices::DeviceHistory>,
    /// Launch samples asked for by snapshots, started by the collection loop.
    pub sample_requests: Mutex<Vec<crate::pipeline::launch_sample::Request>>,
    /// GPU activity windows asked for by snapshots, opened by the collection loop.
    pub activity_requests: Mutex<Vec<crate::pipeline::gpu_activity::Request>>,
    /// GPU traces streamed to `ethand record` (API `gpu_trace`), opened by the collection loop.
    pub gpu_trace_requests: Mutex<Vec<crate::pipeline::gpu_activity::StreamRequest>>,
    /// What snapshots sample on demand (launches, stacks, the CPU profile).
    pub plan: crate::config::Plan,
    /// The collection round (`daemon.interval_ms`): a process started a moment ago is known
    /// from the next round on.
    pub round_interval: std::time::Duration,
    /// Which threads are inside a timed runtime call, for stack samples (set at start-up).
    pub gpu_inflight: std::sync::OnceLock<Arc<crate::pipeline::collector::GpuInflightReader>>,
    /// CPU profiles asked for by snapshots, started by the collection loop.
    pub profile_requests: Mutex<Vec<crate::pipeline::cpu_profile::Request>>,
    /// Kernel symbols for the profiles' kernel frames, opened at start-up.
    pub kallsyms: crate::pipeline::symbols::Kallsyms,
    /// The sandboxed reader: every symbol, source line and Python frame of a process.
    pub reader: crate::pipeline::reader::ReaderHandle,
}

/// Where a tree's threads were over a snapshot's sample window: their Python frames, and
/// their native profile (on and off the CPU).
#[derive(Default)]
pub struct CodeSample {
    pub stacks: Option<ethand_snapshot::stacks::StackSample>,
    pub profile: Option<ethand_snapshot::stacks::CpuProfile>,
}

impl Shared {
    /// The state of a daemon whose model is `model`, as `plan` sets it up (process
    /// selection, level switches, device history, launch and stack samples).
    pub fn new(
        model: Model,
        plan: Plan,
        rules: Vec<crate::diagnose::Rule>,
        reader: crate::pipeline::reader::ReaderHandle,
    ) -> Self {
        let serve = &plan.serve;
        Self {
            model: Mutex::new(model),
            level_request: Mutex::new(None),
            level_policy: (serve.level_switch, serve.level_switch_every),
            last_level_switch: Mutex::new(None),
            node: RwLock::new(Arc::new(NodeSnapshot::default())),
            built: Mutex::new((u64::MAX, std::sync::Weak::new())),
            exported: Mutex::new(None),
            selection: Mutex::new((serve.selection.clone(), Selection::new())),
            devnames: model::block_device_names(),
            rules,
            otlp: std::sync::OnceLock::new(),
            rendered: Mutex::new(None),
            node_line: Mutex::new((u64::MAX, std::sync::Weak::new())),
            servers: std::sync::OnceLock::new(),
            drops: Mutex::default(),
            sample_requests: Mutex::default(),
            activity_requests: Mutex::default(),
            gpu_trace_requests: Mutex::default(),
            device_history: Mutex::new(crate::pipeline::devices::DeviceHistory::new(
                serve.device_history_rounds,
            )),
            round_interval: plan.collect.interval,
            gpu_inflight: std::sync::OnceLock::new(),
            profile_requests: Mutex::default(),
            kallsyms: crate::pipeline::symbols::Kallsyms::open(),
            reader,
            plan,
        }
    }

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
            let mut views: Vec<snap::ProcessSnapshot> = procs
                .iter()
                .map(|p| model.selection_view(p, SNAPSHOT_WINDOW_MS))
                .collect();
            // Processes the driver lists on a device are GPU users even where no runtime
            // call was probed (level system, a static runtime): the selection keeps them.
            crate::pipeline::devices::join(&mut views, &head.devices, &XidLedger::default());
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
        crate::pipeline::devices::join(
            &mut processes,
            &head.devices,
            &self.device_history.lock().expect("lock").xids,
        );
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

    /// The node dump of the latest round as one reply line (`line` writes it): built by the
    /// first request of the round and shared by the replies that hold it.
    pub fn node_reply(&self, line: impl FnOnce(&NodeSnapshot) -> Vec<u8>) -> Arc<Vec<u8>> {
        let round = self.node.read().expect("lock").taken_at_unix_ms;
        let mut cached = self.node_line.lock().expect("lock");
        if cached.0 == round {
            if let Some(line) = cached.1.upgrade() {
                return line;
            }
        }
        let node = self.node();
        let line = Arc::new(line(&node));
        *cached = (node.taken_at_unix_ms, Arc::downgrade(&line));
        line
    }

    /// Records the round's node-wide losses (`DropHistory::record`).
    pub fn record_drops(&self, now_ms: u64, drops: &[snap::DropCounter], overflow: u64) {
        self.drops
            .lock()
            .expect("lock")
            .record(now_ms, drops, overflow);
    }

    /// Counts the kernel launches of `pid`'s tree for `duration` (see launch_sample.rs):
    /// the collection loop attaches and detaches; this waits for its answer.
    pub fn sample_launches(
        &self,
        pid: u32,
        duration: std::time::Duration,
    ) -> Option<ethand_snapshot::gpu::LaunchSample> {
        // Started and ended at collection rounds: up to two intervals more than asked.
        ask_collector(&self.sample_requests, pid, duration, 5, |pids, reply| {
            crate::pipeline::launch_sample::Request {
                pids,
                duration,
                reply,
            }
        })
    }

    /// Records the GPU activity of `pid`'s tree for `duration` (see gpu_activity/): the
    /// collection loop opens and closes the windows; this waits for its answer.
    pub fn sample_gpu_activity(
        &self,
        pid: u32,
        duration: std::time::Duration,
    ) -> Option<crate::pipeline::gpu_activity::Recorded> {
        // Opened at the next round, answered at a round after the windows' ends.
        ask_collector(&self.activity_requests, pid, duration, 8, |pids, reply| {
            crate::pipeline::gpu_activity::Request {
                pids,
                duration,
                reply,
            }
        })
    }

    /// Samples the Python frames of `pid`'s tree for `duration` (see stack_sample.rs) and,
    /// over the same window, profiles its threads natively (cpu_profile.rs: the collection
    /// loop attaches and detaches; this waits for its answer and symbolizes). `profile`:
    /// whether to profile; None: when the snapshot waits for samples anyway (a Python process
    /// in the tree, or `launching`: a launch sample of the tree's GPU processes), so that a
    /// snapshot with nothing else to sample stays immediate.
    pub fn sample_stacks(
        &self,
        pid: u32,
        duration: std::time::Duration,
        profile: Option<bool>,
        launching: bool,
    ) -> CodeSample {
        if duration.is_zero() {
            return CodeSample::default();
        }
        let pids = crate::pipeline::procinfo::descendants(pid);
        let wanted = profile.unwrap_or_else(|| {
            pids.iter()
                .any(|p| ethand_reader::python::looks_like_python(*p))
                || (launching && !gpu_pids(pid).is_empty())
        });
        let profile = (self.plan.cpu_profile.is_ok() && wanted).then(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            self.profile_requests.lock().expect("lock").push(
                crate::pipeline::cpu_profile::Request {
                    root: pid,
                    pids: pids.clone(),
                    duration,
                    reply: tx,
                },
            );
            rx
        });
        let stacks = crate::pipeline::stack_sample::sample(
            &self.reader,
            &pids,
            duration,
            self.plan.stack_sample.map_or(1, |s| s.hz),
            self.gpu_inflight.get().map(|r| &**r),
        );
        // Started and ended at collection rounds: up to two intervals more than asked.
        let profile = profile
            .and_then(|rx| {
                rx.recv_timeout(duration + std::time::Duration::from_secs(5))
                    .ok()
            })
            .and_then(|raw| crate::pipeline::cpu_profile::build(raw, &self.kallsyms, &self.reader));
        CodeSample { stacks, profile }
    }
}

/// Queues a request for the collection loop (which owns the probes) about the GPU processes
/// of `pid`'s tree and waits for its answer, up to `duration` and `slack_s` more. None when
/// `duration` is zero or no process of the tree maps a GPU/NPU runtime library (a CPU-only
/// tree waits for nothing).
fn ask_collector<Q, A>(
    queue: &Mutex<Vec<Q>>,
    pid: u32,
    duration: std::time::Duration,
    slack_s: u64,
    request: impl FnOnce(Vec<u32>, std::sync::mpsc::SyncSender<A>) -> Q,
) -> Option<A> {
    if duration.is_zero() {
        return None;
    }
    let pids = gpu_pids(pid);
    if pids.is_empty() {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    queue.lock().expect("lock").push(request(pids, tx));
    rx.recv_timeout(duration + std::time::Duration::from_secs(slack_s))
        .ok()
}

/// The processes of `pid`'s tree that map a GPU/NPU runtime library (at most four times the
/// launch sample's limit are looked at).
fn gpu_pids(pid: u32) -> Vec<u32> {
    crate::pipeline::procinfo::descendants(pid)
        .into_iter()
        .take(4 * crate::pipeline::launch_sample::MAX_PIDS)
        .filter(|p| ethand_userspace_probes::discover(*p).is_ok_and(|libs| !libs.is_empty()))
        .collect()
}
