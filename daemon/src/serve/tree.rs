//! Building a process tree's snapshot: one path for the daemon's API and the standalone
//! measurement (`ethand snapshot --standalone`, or no daemon). The model gives the tree's
//! processes (`model/view.rs`); this adds what the moment holds (threads' syscalls in
//! flight, memory), symbolizes call sites once the model lock is released, joins the
//! devices, totals the tree and runs the diagnosis.
use std::collections::HashMap;

use ethand_snapshot::{self as snap, GpuLevel, TreeSnapshot, TreeTotals};

use super::shared::{CodeSample, Shared};
use crate::pipeline::procinfo::unix_ms;

/// What a tree snapshot is built from, besides the shared state.
pub struct TreeRequest {
    /// The tree's root (a thread id stands for its process).
    pub pid: u32,
    /// The window of the processes' rates.
    pub window_ms: u64,
    pub source: snap::SnapshotSource,
    /// How long a standalone measurement ran (0 for the daemon).
    pub measured_ms: u64,
    /// The probes' status when the snapshot was taken.
    pub probes: Vec<snap::ProbeStatus>,
    pub launch_sample: Option<ethand_snapshot::gpu::LaunchSample>,
    pub gpu_activity: Option<crate::pipeline::gpu_activity::Recorded>,
    pub code: CodeSample,
}

/// What a snapshot samples on demand, besides the model's counts.
#[derive(Clone, Copy, Debug)]
pub struct Samples {
    /// A launch sample of the tree's GPU processes at a level that does not count launches.
    pub launches: bool,
    /// The tree's Python frames (and, with `profile`, its native CPU profile).
    pub stacks: bool,
    /// The native CPU profile: Some(true) always, Some(false) never, None when the snapshot
    /// waits for samples anyway (see [`Shared::sample_stacks`]).
    pub profile: Option<bool>,
}

/// The daemon's answer to a snapshot request: `pid`'s tree over the last `window_s` seconds,
/// with its samples taken now (both at once: the snapshot waits for the longer only); None
/// when the model knows no process of the tree.
pub fn daemon_snapshot(
    shared: &Shared,
    pid: u32,
    window_s: u64,
    samples: Samples,
) -> Option<TreeSnapshot> {
    let pid = crate::pipeline::procinfo::tgid_of(pid).unwrap_or(pid);
    let (probes, level) = {
        let node = shared.node.read().expect("lock");
        (node.ethand.probes.clone(), node.ethand.gpu_level)
    };
    // Only for a tree the model knows (else the answer is "not found"). A running process the
    // model does not know yet started after the last round: it is known after the next one,
    // so wait up to two rounds for it.
    let knows = || !shared.model.lock().expect("lock").tree_keys(pid).is_empty();
    let mut known = knows();
    if !known && std::path::Path::new(&format!("/proc/{pid}")).exists() {
        let until = std::time::Instant::now() + 2 * shared.round_interval;
        while !known && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
            known = knows();
        }
    }
    let launching = samples.launches && level == Some(GpuLevel::Calls) && known;
    let (launch_sample, gpu_activity, code) = std::thread::scope(|s| {
        let stacks = (samples.stacks && known).then(|| {
            s.spawn(|| {
                shared.sample_stacks(pid, shared.plan.stack_window(), samples.profile, launching)
            })
        });
        let activity = (known && shared.plan.gpu_activity.is_some()).then(|| {
            s.spawn(|| {
                shared.sample_gpu_activity(pid, shared.plan.gpu_activity.unwrap_or_default())
            })
        });
        let sample = launching
            .then(|| shared.sample_launches(pid, shared.plan.launch_sample.unwrap_or_default()))
            .flatten();
        (
            sample,
            activity.and_then(|h| h.join().ok()).flatten(),
            stacks.and_then(|h| h.join().ok()).unwrap_or_default(),
        )
    });
    build_tree(
        shared,
        TreeRequest {
            pid,
            window_ms: window_s.clamp(1, u64::MAX / 1000) * 1000,
            source: snap::SnapshotSource::Daemon,
            measured_ms: 0,
            probes,
            launch_sample,
            gpu_activity,
            code,
        },
    )
}

/// The snapshot of `req.pid`'s tree, diagnosed; None when the model knows no process of it.
pub fn build_tree(shared: &Shared, req: TreeRequest) -> Option<TreeSnapshot> {
    let TreeRequest {
        pid,
        window_ms,
        source,
        measured_ms,
        probes,
        launch_sample,
        gpu_activity,
        code,
    } = req;
    let (mut gpu_activity, launch_sites) = match gpu_activity {
        Some(r) => (Some(r.activity), r.launch_sites),
        None => (None, Vec::new()),
    };
    // A thread id stands for its process.
    let pid = crate::pipeline::procinfo::tgid_of(pid).unwrap_or(pid);
    crate::pipeline::gpu_activity::check_against_launches(&mut gpu_activity, &launch_sample);
    let model = shared.model.lock().expect("lock");
    let (keys, unseen_root) = tree_keys(&model, pid);
    if keys.is_empty() {
        return None;
    }
    let mut processes: Vec<snap::ProcessSnapshot> = keys
        .iter()
        .filter_map(|k| model.procs.get(k))
        .map(|p| model.process_snapshot(p, window_ms, &shared.devnames))
        .collect();
    // Call sites are symbolized once the model is released (the reader may take up to
    // its deadline).
    let site_inputs: Vec<crate::pipeline::gpu::sites::SiteInputs> = keys
        .iter()
        .filter_map(|k| model.procs.get(k))
        .filter_map(|p| model.site_inputs(p))
        .collect();
    let site_cache = model.site_cache.clone();
    let launch_keys = launch_keys(&model, &keys, &launch_sites);
    let py_frames = model.py_frames.clone();
    let timeline = model.timeline(&keys, window_ms);
    let (mut neighbours, neighbours_cores) = model.neighbours(&keys, window_ms);
    let memory_peak = model.memory_peak(&keys, window_ms);
    let window_note = (source == snap::SnapshotSource::Daemon)
        .then(|| model.window_note(&keys, window_ms))
        .flatten();
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
    read_cpu_limits(&mut processes, &mut neighbours);
    for p in processes.iter_mut().filter(|p| p.alive) {
        read_memory(p);
        p.proc_write_bytes = crate::pipeline::proc_io::write_bytes(p.pid);
        let (e, known_ms) = entered
            .get(&p.pid)
            .cloned()
            .unwrap_or((Default::default(), measured_ms));
        crate::pipeline::inflight::fill(p, &e, mono_now_ns, known_ms, &mut budget);
    }
    crate::pipeline::inflight::name_peers(&mut processes);
    crate::pipeline::gpu_activity::resolve_launch_sites(
        &mut gpu_activity,
        launch_sites,
        &launch_keys,
        &py_frames,
        &shared.reader,
    );
    crate::pipeline::gpu_activity::demangle_kernels(&mut gpu_activity, &shared.reader);
    // After what the threads are doing now was read: symbolizing may take a while.
    fill_call_sites(
        &mut processes,
        &site_inputs,
        &site_cache,
        &py_frames,
        &shared.reader,
    );
    let now = unix_ms();
    let observed_ms = processes.iter().map(|p| p.observed_ms).max().unwrap_or(0);
    let dropped_events = shared
        .drops
        .lock()
        .expect("lock")
        .since(now.saturating_sub(observed_ms));
    let node = shared.node.read().expect("lock").clone();
    crate::pipeline::devices::join(
        &mut processes,
        &node.devices,
        &shared.device_history.lock().expect("lock").xids,
    );
    let live_pids: Vec<u32> = processes
        .iter()
        .filter(|p| p.alive)
        .map(|p| p.pid)
        .collect();
    let memory_cgroups = crate::pipeline::memory::tree_cgroups(&live_pids);
    let mut tree = TreeSnapshot {
        schema_version: snap::SCHEMA_VERSION,
        source,
        root_pid: pid,
        taken_at_unix_ms: now,
        measured_ms,
        total: totals(
            &processes,
            &shared.device_history.lock().expect("lock"),
            now,
        ),
        processes,
        probes,
        findings: Vec::new(),
        gpu_level: node.ethand.gpu_level,
        timeline,
        devices: node.devices.clone(),
        dropped_events,
        launch_sample,
        gpu_activity,
        stack_sample: code.stacks,
        cpu_profile: code.profile,
        not_evaluated: Vec::new(),
        node_cpus: std::thread::available_parallelism()
            .ok()
            .map(|n| n.get() as u32),
        neighbours,
        neighbours_cores: (window_ms > 0).then_some(neighbours_cores),
        memory_cgroups,
        node_memory: crate::pipeline::memory::node_memory(),
        window_note,
    };
    // The samples' peak, or the tree's resident set now if that is higher (read since).
    tree.total.memory_peak_rss_bytes =
        memory_peak.map(|peak| peak.max(tree.memory_totals().map_or(0, |m| m.rss_bytes)));
    crate::diagnose::apply(&mut tree, &shared.rules);
    Some(tree)
}

/// A live process's memory read now (the model's sample may be a round old), with the
/// model's window.
fn read_memory(p: &mut snap::ProcessSnapshot) {
    let window = p.memory.take().and_then(|m| m.window);
    p.memory = crate::pipeline::memory::read_process(p.pid).map(|mut m| {
        m.window = window;
        m
    });
    (p.swap_bytes, p.major_faults) = p
        .memory
        .as_ref()
        .map_or((None, None), |m| (m.swap_bytes, m.major_faults));
}

/// The cores each process may use, and its neighbours' (self-inflicted contention or
/// neighbours: the cpu_contention rule tells them apart with these).
fn read_cpu_limits(processes: &mut [snap::ProcessSnapshot], neighbours: &mut [snap::CpuNeighbour]) {
    use crate::pipeline::cpu_limits;
    let mounts = cpu_limits::CpuMounts::read();
    let mut quotas = HashMap::new();
    for p in processes.iter_mut().filter(|p| p.alive) {
        let l = cpu_limits::read(p.pid, &mounts, &mut quotas);
        (p.cpus_allowed, p.cpu_quota_cores) = (l.affinity_cpus, l.quota_cores);
    }
    for n in neighbours {
        n.cpus_allowed = cpu_limits::read(n.pid, &mounts, &mut quotas).affinity_cpus;
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
        if let Some(b) = p.proc_write_bytes {
            *t.proc_write_bytes.get_or_insert(0) += b;
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
        fp32_activity_ratio: means.fp32_activity_ratio,
        fp64_activity_ratio: means.fp64_activity_ratio,
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

/// The processes with launch sites as the call sites key them (start time, /proc's ticks).
fn launch_keys(
    model: &crate::pipeline::model::Model,
    keys: &[ethand_common::ProcKey],
    sites: &[crate::pipeline::gpu_activity::RawLaunchSites],
) -> HashMap<u32, (ethand_common::ProcKey, Option<u64>)> {
    keys.iter()
        .filter_map(|k| model.procs.get(k))
        .filter(|p| sites.iter().any(|l| l.pid == p.key.tgid))
        .map(|p| {
            let ticks = p.meta.as_ref().map(|m| m.start_ticks).filter(|t| *t > 0);
            (p.key.tgid, (p.key, ticks))
        })
        .collect()
}

/// The model's keys of `pid`'s tree. A root that did nothing the probes saw (a launcher
/// asleep in wait() through a whole standalone measurement) is not in the model: its tree is
/// then its live descendants that are, under a root read from /proc (returned with them).
fn tree_keys(
    model: &crate::pipeline::model::Model,
    pid: u32,
) -> (
    Vec<ethand_common::ProcKey>,
    Option<crate::pipeline::procinfo::ProcMeta>,
) {
    let keys = model.tree_keys(pid);
    if !keys.is_empty() {
        return (keys, None);
    }
    let live = crate::pipeline::procinfo::descendants(pid);
    let mut seen: Vec<ethand_common::ProcKey> = Vec::new();
    for c in live.iter().skip(1) {
        for k in model.tree_keys(*c) {
            if !seen.contains(&k) {
                seen.push(k);
            }
        }
    }
    if seen.is_empty() {
        return (seen, None);
    }
    (seen, crate::pipeline::procinfo::read(pid))
}

/// Each process's GPU call sites (symbolized, with the Python frames the kernel walked) and
/// whether its Python frames are walked.
fn fill_call_sites(
    processes: &mut [snap::ProcessSnapshot],
    site_inputs: &[crate::pipeline::gpu::sites::SiteInputs],
    site_cache: &std::sync::Mutex<crate::pipeline::gpu::sites::SiteCache>,
    py_frames: &std::sync::Mutex<crate::pipeline::gpu::python::PyFrames>,
    reader: &crate::pipeline::reader::ReaderHandle,
) {
    for inputs in site_inputs {
        let sites = crate::pipeline::gpu::sites::call_sites(site_cache, py_frames, reader, inputs);
        if let Some(g) = processes
            .iter_mut()
            .find(|p| p.pid == inputs.key.tgid && p.start_time_ns == inputs.key.proc_start_ns)
            .and_then(|p| p.gpu.as_mut())
        {
            g.call_sites = sites;
        }
    }
    let py = py_frames
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for p in processes.iter_mut() {
        let key = ethand_common::ProcKey {
            tgid: p.pid,
            _pad0: 0,
            proc_start_ns: p.start_time_ns,
        };
        if let Some(g) = p.gpu.as_mut() {
            g.python_walk = py.walk(&key);
        }
    }
}
