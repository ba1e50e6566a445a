//! Reads the kernel maps into a [`RawRead`], drains lifecycle events, deletes what the model
//! reclaimed, and measures ethand's own cost. The only code that touches BPF maps.
use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
};
use ethand_common::{
    BlkKey, BlkStats, CpuCtx, GPU_STACK_UNATTRIBUTED, GpuAlloc, GpuAllocKey, GpuCallKey,
    GpuCallStats, GpuInflight, GpuInflightKey, GpuProcState, GpuSiteKey, GpuSiteStats, Hist,
    LifecycleEvent, NetStats, ProcKey, SyscallHistKey, SyscallKey, SyscallStats, ThreadStats,
    counter, lifecycle_kind, thread_flags,
};
use ethand_snapshot::{DropCounter, MapFill, ProgramCost};
use tracing::warn;

use crate::{
    config::{BpfStatsMode, CollectPlan, MapSizes},
    pipeline::{
        bpf_batch::{delete_keys, read_all},
        model::{Model, RawRead, Reclaim},
        syscalls_table,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("BPF map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("BPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
}

pub struct Collector {
    threads: BpfHashMap<MapData, u32, ThreadStats>,
    syscalls: BpfHashMap<MapData, SyscallKey, SyscallStats>,
    syscall_hist: BpfHashMap<MapData, SyscallHistKey, Hist>,
    blk_stats: BpfHashMap<MapData, BlkKey, BlkStats>,
    net_stats: BpfHashMap<MapData, ProcKey, NetStats>,
    counters: PerCpuArray<MapData, u64>,
    cpu_ctx: PerCpuArray<MapData, CpuCtx>,
    /// Thread entries hold the kernel's on-CPU total at their last switch-out, so the run in
    /// progress can be read (see [`read_running`]).
    exec_baseline: bool,
    gpu_calls: BpfHashMap<MapData, GpuCallKey, GpuCallStats>,
    gpu_proc: BpfHashMap<MapData, ProcKey, GpuProcState>,
    /// Distinct syscall numbers per process (its limit in the kernel); freed with it.
    syscall_keys: BpfHashMap<MapData, ProcKey, u64>,
    gpu_allocs: BpfHashMap<MapData, GpuAllocKey, GpuAlloc>,
    gpu_sites: BpfHashMap<MapData, GpuSiteKey, GpuSiteStats>,
    gpu_stacks: StackTraceMap<MapData>,
    /// Stack ids no call site referred to at the last sweep: deleted at the next one if
    /// still unreferenced (a stack is stored just before its site is counted).
    unreferenced_stacks: HashSet<u32>,
    rounds: u64,
    lifecycle: RingBuf<MapData>,
    gpu_inflight: std::sync::Arc<GpuInflightReader>,
    capacity: HashMap<&'static str, u64>,
    pub fills: Vec<MapFill>,
    pub stats: BpfStats,
    /// False once the kernel refused a batch lookup.
    batch_ok: bool,
    /// The last read, kept: reclaim deletes from its keys without walking the maps again,
    /// and its vectors are refilled next round instead of allocated anew.
    raw: RawRead,
}

type FoldSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// A map key that names its process (tgid and start time).
trait OfProcess: Copy {
    fn process(&self) -> (u32, u64);
}

macro_rules! of_process {
    ($($t:ty),*) => {$(
        impl OfProcess for $t {
            fn process(&self) -> (u32, u64) {
                (self.tgid, self.proc_start_ns)
            }
        }
    )*};
}
of_process!(
    SyscallKey,
    SyscallHistKey,
    BlkKey,
    GpuCallKey,
    GpuSiteKey,
    ProcKey
);

/// Rounds between sweeps of the stacks no call site refers to.
const STACK_SWEEP_ROUNDS: u64 = 30;

/// The keys of `read` that belong to a process in `procs`.
fn of<K: OfProcess, V>(read: &[(K, V)], procs: &FoldSet<(u32, u64)>) -> Vec<K> {
    read.iter()
        .map(|(k, _)| *k)
        .filter(|k| procs.contains(&k.process()))
        .collect()
}

/// Turns the kernel's BPF run-time statistics on and off (daemon.bpf_stats): they cost about
/// 100 ns per program run while on. Directly (start-up, standalone commands) or, once the
/// daemon has dropped CAP_SYS_ADMIN, through the helper that kept it (`stats_helper.rs`).
pub struct BpfStats {
    pub mode: BpfStatsMode,
    window: Duration,
    period: Duration,
    /// Holding the fd keeps the statistics on (when switched directly).
    fd: Option<OwnedFd>,
    helper: Option<crate::privilege::stats_helper::StatsHelper>,
    since: Option<Instant>,
    started: Instant,
    enabled_before: Duration,
    /// Per program, its run count and time when our statistics window in progress opened,
    /// and the sums over our closed windows: the kernel's figures grow whenever anyone has
    /// the statistics on (another ethand, `bpftool prog profile`, the sysctl), and only
    /// what ran while ours were on matches `enabled_ms`.
    window_base: HashMap<String, (u64, u64)>,
    counted: HashMap<String, (u64, u64)>,
}

impl BpfStats {
    fn new(plan: &CollectPlan) -> Self {
        let mut s = Self {
            mode: plan.bpf_stats,
            window: plan.bpf_stats_window,
            period: plan.bpf_stats_period,
            fd: None,
            helper: None,
            since: None,
            started: Instant::now(),
            enabled_before: Duration::ZERO,
            window_base: HashMap::new(),
            counted: HashMap::new(),
        };
        s.tick(Vec::new);
        s
    }

    /// From now on the statistics are switched by `helper`.
    pub fn use_helper(&mut self, helper: crate::privilege::stats_helper::StatsHelper) {
        if self.fd.take().is_some() {
            if let Some(t) = self.since.take() {
                self.enabled_before += t.elapsed();
            }
        }
        self.helper = Some(helper);
    }

    /// The statistics cannot be switched (no helper could be started): none are reported.
    pub fn turn_off(&mut self, why: &str) {
        warn!(
            why,
            "BPF run-time statistics unavailable: per-program costs are not measured"
        );
        self.mode = BpfStatsMode::Off;
    }

    fn on(&self) -> bool {
        self.since.is_some()
    }

    fn switch(&mut self, on: bool) -> std::io::Result<()> {
        match &mut self.helper {
            Some(h) => h.set(on),
            None if on => {
                self.fd =
                    Some(aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| e.io_error)?);
                Ok(())
            }
            None => {
                self.fd = None;
                Ok(())
            }
        }
    }

    /// Called every interval: switches the statistics per the mode. `costs` reads the
    /// programs' kernel figures (at each switch, to count our windows exactly).
    pub fn tick(&mut self, costs: impl FnOnce() -> Vec<ProgramCost>) {
        let want = match self.mode {
            BpfStatsMode::Always => true,
            BpfStatsMode::Off => false,
            // The window closes each period, so that a short-lived daemon (or a benchmark
            // started with it) does not pay for statistics it never reports.
            BpfStatsMode::Sampled => {
                let p = self.period.as_millis().max(1);
                (self.started.elapsed().as_millis() % p) >= p - self.window.as_millis()
            }
        };
        if want && !self.on() {
            match self.switch(true) {
                Ok(()) => {
                    self.since = Some(Instant::now());
                    self.window_base = by_name(costs());
                }
                Err(e) => self.turn_off(&e.to_string()),
            }
        } else if !want && self.on() {
            let now = by_name(costs());
            if let Err(e) = self.switch(false) {
                warn!(error = %e, "turning the BPF run-time statistics off failed");
            }
            if let Some(t) = self.since.take() {
                self.enabled_before += t.elapsed();
            }
            for (name, (runs, ns)) in now {
                let (r0, n0) = self.window_base.get(&name).copied().unwrap_or((0, 0));
                let c = self.counted.entry(name).or_default();
                c.0 += runs.saturating_sub(r0);
                c.1 += ns.saturating_sub(n0);
            }
            self.window_base.clear();
        }
    }

    /// What the programs cost during our statistics windows (`now`: their kernel figures
    /// now): the closed windows' sums plus the growth since the open one began.
    pub fn costs(&self, now: Vec<ProgramCost>) -> Vec<ProgramCost> {
        now.into_iter()
            .map(|p| {
                let (mut runs, mut ns) = self.counted.get(&p.name).copied().unwrap_or((0, 0));
                if self.on() {
                    let (r0, n0) = self.window_base.get(&p.name).copied().unwrap_or((0, 0));
                    runs += p.run_count.saturating_sub(r0);
                    ns += p.run_time_ns.saturating_sub(n0);
                }
                ProgramCost {
                    name: p.name,
                    run_count: runs,
                    run_time_ns: ns,
                }
            })
            .collect()
    }

    pub fn enabled_ms(&self) -> u64 {
        (self.enabled_before + self.since.map_or(Duration::ZERO, |t| t.elapsed())).as_millis()
            as u64
    }

    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            BpfStatsMode::Sampled => "sampled",
            BpfStatsMode::Always => "always",
            BpfStatsMode::Off => "off",
        }
    }
}

fn by_name(costs: Vec<ProgramCost>) -> HashMap<String, (u64, u64)> {
    costs
        .into_iter()
        .map(|p| (p.name, (p.run_count, p.run_time_ns)))
        .collect()
}

/// `GPU_INFLIGHT`: the timed runtime calls (syncs, collectives, allocations at level
/// `calls`; every probed call at `op`) entered and not yet returned, by thread. Read many
/// times a second while a stack sample runs, from the sampler's thread.
pub struct GpuInflightReader {
    #[allow(clippy::type_complexity)]
    map: std::sync::Mutex<(
        BpfHashMap<MapData, GpuInflightKey, GpuInflight>,
        bool,
        Vec<(GpuInflightKey, GpuInflight)>,
    )>,
}

impl GpuInflightReader {
    /// Thread id to the op it is inside and when it entered (the latest entered, should a
    /// thread show two: an entry whose return was lost stays until the LRU map drops it).
    pub fn by_thread(&self) -> HashMap<u32, (u16, u64)> {
        let mut g = self.map.lock().expect("lock");
        let (map, batch_ok, buf) = &mut *g;
        read_all(map, batch_ok, buf);
        let mut latest: HashMap<u32, (u64, u16)> = HashMap::new();
        for (k, v) in buf.iter() {
            let e = latest.entry(k.tid).or_insert((v.start_ns, k.op as u16));
            if v.start_ns > e.0 {
                *e = (v.start_ns, k.op as u16);
            }
        }
        latest
            .into_iter()
            .map(|(t, (start, op))| (t, (op, start)))
            .collect()
    }
}

fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, CollectError> {
    let m = ebpf.take_map(name).ok_or(CollectError::MissingMap(name))?;
    T::try_from(m).map_err(|source| CollectError::Map { name, source })
}

impl Collector {
    pub fn new(
        ebpf: &mut Ebpf,
        maps: &MapSizes,
        collect: &CollectPlan,
        exec_baseline: bool,
    ) -> Result<Self, CollectError> {
        // Syscall number -> latency class, for the in-kernel histograms.
        let mut classes: Array<MapData, u32> = take(ebpf, "SYSCALL_CLASS")?;
        for (nr, class) in syscalls_table::classes() {
            if let Err(e) = classes.set(nr, &u32::from(class), 0) {
                warn!(nr, error = %e, "cannot set syscall class");
            }
        }
        let m = &maps.configured;
        Ok(Self {
            threads: take(ebpf, "THREADS")?,
            syscalls: take(ebpf, "SYSCALLS")?,
            syscall_hist: take(ebpf, "SYSCALL_HIST")?,
            blk_stats: take(ebpf, "BLK_STATS")?,
            net_stats: take(ebpf, "NET_STATS")?,
            counters: take(ebpf, "COUNTERS")?,
            cpu_ctx: take(ebpf, "CPU_CTX")?,
            exec_baseline,
            gpu_calls: take(ebpf, "GPU_CALLS")?,
            gpu_proc: take(ebpf, "GPU_PROC")?,
            syscall_keys: take(ebpf, "SYSCALL_KEYS")?,
            gpu_allocs: take(ebpf, "GPU_ALLOCS")?,
            gpu_sites: take(ebpf, "GPU_SITES")?,
            gpu_stacks: take(ebpf, "GPU_STACKS")?,
            unreferenced_stacks: HashSet::new(),
            rounds: 0,
            lifecycle: take(ebpf, "LIFECYCLE")?,
            gpu_inflight: std::sync::Arc::new(GpuInflightReader {
                map: std::sync::Mutex::new((take(ebpf, "GPU_INFLIGHT")?, true, Vec::new())),
            }),
            capacity: HashMap::from([
                ("threads", u64::from(m.threads)),
                ("syscalls", u64::from(m.syscalls)),
                ("syscall_hist", u64::from(m.syscall_hist)),
                ("blk_stats", u64::from(m.blk_stats)),
                ("net_stats", u64::from(m.net_stats)),
                ("gpu_calls", 16384),
                ("gpu_proc", 4096),
                ("gpu_sites", u64::from(m.gpu_sites)),
                ("gpu_stacks", u64::from(m.gpu_stacks)),
            ]),
            fills: Vec::new(),
            stats: BpfStats::new(collect),
            batch_ok: true,
            raw: RawRead::default(),
        })
    }

    /// Which threads are inside a timed GPU/NPU runtime call now, for the stack sampler.
    pub fn gpu_inflight(&self) -> std::sync::Arc<GpuInflightReader> {
        self.gpu_inflight.clone()
    }

    /// A second descriptor of the lifecycle ring buffer, to wait on: it becomes readable when
    /// the kernel side asks for an early drain (a quarter full).
    pub fn lifecycle_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd as _;
        self.lifecycle.as_fd().try_clone_to_owned()
    }

    /// Applies pending lifecycle events to the model.
    pub fn drain_lifecycle(&mut self, model: &mut Model) {
        while let Some(item) = self.lifecycle.next() {
            if item.len() < size_of::<LifecycleEvent>() {
                continue;
            }
            // SAFETY: the kernel wrote a LifecycleEvent (repr(C), integer-only) here.
            let e: LifecycleEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let key = ProcKey {
                tgid: e.tgid,
                _pad0: 0,
                proc_start_ns: e.proc_start_ns,
            };
            match e.kind {
                lifecycle_kind::EXEC => model.on_exec(key),
                lifecycle_kind::EXIT => model.on_exit(key, Some(kernel_identity(&e))),
                _ => {}
            }
        }
    }

    /// Reads the maps into the collector's own [`RawRead`], whose vectors are kept between
    /// rounds (see [`read_all`]).
    pub fn read(&mut self) -> &RawRead {
        let raw = &mut self.raw;
        let ok = &mut self.batch_ok;
        read_all(&self.threads, ok, &mut raw.threads);
        read_all(&self.syscalls, ok, &mut raw.syscalls);
        read_all(&self.syscall_hist, ok, &mut raw.syscall_hist);
        read_all(&self.blk_stats, ok, &mut raw.blk);
        read_all(&self.net_stats, ok, &mut raw.net);
        read_all(&self.gpu_calls, ok, &mut raw.gpu_calls);
        read_all(&self.gpu_proc, ok, &mut raw.gpu_procs);
        read_all(&self.gpu_sites, ok, &mut raw.gpu_sites);
        read_stacks(&self.gpu_stacks, raw);
        self.rounds += 1;
        if self.rounds.is_multiple_of(STACK_SWEEP_ROUNDS) {
            sweep_stacks(&mut self.gpu_stacks, &mut self.unreferenced_stacks, raw);
        }
        // A batch read comes in hash-bucket order, every process's entries scattered. In
        // process order, ingest finds a process's model state still in cache for its next
        // entry: at 1,000 processes it was memory-bound, a few cache misses per entry.
        raw.threads
            .sort_unstable_by_key(|(tid, t)| (t.tgid, t.proc_start_ns, *tid));
        raw.running_oncpu.clear();
        raw.running.clear();
        read_running(&self.cpu_ctx, raw, self.exec_baseline);
        raw.syscalls
            .sort_unstable_by_key(|(k, _)| (k.tgid, k.proc_start_ns, k.nr));
        raw.syscall_hist
            .sort_unstable_by_key(|(k, _)| (k.tgid, k.proc_start_ns, k.class));
        let fill = |name: &'static str, n: usize, cap: &HashMap<&'static str, u64>| MapFill {
            name: name.into(),
            entries: n as u64,
            capacity: cap[name],
        };
        self.fills = vec![
            fill("threads", raw.threads.len(), &self.capacity),
            fill("syscalls", raw.syscalls.len(), &self.capacity),
            fill("syscall_hist", raw.syscall_hist.len(), &self.capacity),
            fill("blk_stats", raw.blk.len(), &self.capacity),
            fill("net_stats", raw.net.len(), &self.capacity),
            fill("gpu_calls", raw.gpu_calls.len(), &self.capacity),
            fill("gpu_proc", raw.gpu_procs.len(), &self.capacity),
            fill("gpu_sites", raw.gpu_sites.len(), &self.capacity),
            fill("gpu_stacks", raw.gpu_stacks.len(), &self.capacity),
        ];
        raw
    }

    /// Deletes reclaimed entries from the kernel maps.
    pub fn reclaim(&mut self, r: &Reclaim) {
        let ok = &mut self.batch_ok;
        // Each thread key comes from this round's read of the map, where its value named the
        // process reclaimed; a tid reused since then (the pid space wrapping around within
        // milliseconds) is not a case worth a lookup per thread.
        let tids: Vec<u32> = r.threads.iter().map(|(tid, _)| *tid).collect();
        delete_keys(&mut self.threads, &tids, ok);
        if r.procs.is_empty() {
            return;
        }
        let reclaimed: FoldSet<(u32, u64)> =
            r.procs.iter().map(|p| (p.tgid, p.proc_start_ns)).collect();
        // Only keys this round's read found: no syscall for entries that do not exist.
        let k = &self.raw;
        delete_keys(&mut self.syscalls, &of(&k.syscalls, &reclaimed), ok);
        delete_keys(&mut self.syscall_keys, &r.procs, ok);
        delete_keys(&mut self.syscall_hist, &of(&k.syscall_hist, &reclaimed), ok);
        delete_keys(&mut self.blk_stats, &of(&k.blk, &reclaimed), ok);
        delete_keys(&mut self.net_stats, &of(&k.net, &reclaimed), ok);
        delete_keys(&mut self.gpu_proc, &of(&k.gpu_procs, &reclaimed), ok);
        delete_keys(&mut self.gpu_calls, &of(&k.gpu_calls, &reclaimed), ok);
        // Their stacks go at a later sweep, once no site refers to them.
        delete_keys(&mut self.gpu_sites, &of(&k.gpu_sites, &reclaimed), ok);
        // Allocations carry only the tgid: drop those of reclaimed tgids unless a live
        // process has taken the tgid over meanwhile.
        let keys: Vec<GpuAllocKey> = self
            .gpu_allocs
            .keys()
            .filter_map(Result::ok)
            .filter(|k| reclaimed.iter().any(|(t, _)| *t == k.tgid))
            .filter(|k| !std::path::Path::new(&format!("/proc/{}", k.tgid)).exists())
            .collect();
        delete_keys(&mut self.gpu_allocs, &keys, ok);
    }

    pub fn drops(&self) -> Vec<DropCounter> {
        (0..counter::COUNT)
            .map(|i| DropCounter {
                reason: counter::NAMES[i as usize].into(),
                count: self
                    .counters
                    .get(&i, 0)
                    .map(|v| v.iter().sum())
                    .unwrap_or(0),
                loss: counter::IS_LOSS[i as usize],
            })
            .collect()
    }
}

/// The on-CPU time of each run in progress that its thread's entry does not hold yet: the
/// kernel's total now (/proc schedstat, current to the last tick) less its total at the
/// thread's last switch-out (0 for a thread not yet switched out since it was created). One
/// /proc read per CPU that is running a thread. Only where entries hold that baseline
/// (`exec_baseline`); elsewhere a run counts at its switch-out. The threads on a CPU go to
/// `raw.running` in any case (their off-CPU span has ended: see `ThreadAcc::off_cpu_since_ms`).
fn read_running(cpu_ctx: &PerCpuArray<MapData, CpuCtx>, raw: &mut RawRead, exec_baseline: bool) {
    let Ok(per_cpu) = cpu_ctx.get(&0, 0) else {
        return;
    };
    raw.running.extend(
        per_cpu
            .iter()
            .map(|c| c.running_tid)
            .filter(|tid| *tid != 0),
    );
    if raw.running.is_empty() || !exec_baseline {
        return;
    }
    for (tid, t) in &raw.threads {
        if t.flags & thread_flags::EXITED != 0 || !raw.running.contains(tid) {
            continue;
        }
        if let Some(now) = crate::pipeline::procinfo::thread_exec_runtime_ns(t.tgid, *tid)
            && now > t.exec_runtime_ns
        {
            raw.running_oncpu.insert(*tid, now - t.exec_runtime_ns);
        }
    }
}

/// Reads the stacks of call sites new since the last read (a stack's frames never change
/// while its id lives).
fn read_stacks(map: &StackTraceMap<MapData>, raw: &mut RawRead) {
    raw.gpu_stacks_changed = false;
    for (k, _) in &raw.gpu_sites {
        let id = k.stack_id;
        if id == GPU_STACK_UNATTRIBUTED || raw.gpu_stacks.contains_key(&id) {
            continue;
        }
        if let Ok(st) = map.get(&id, 0) {
            let ips: Vec<u64> = st.frames().iter().map(|f| f.ip).collect();
            raw.gpu_stacks.insert(id, ips.into());
            raw.gpu_stacks_changed = true;
        }
    }
}

/// Deletes the stacks that no call site has referred to for two sweeps (the sites of
/// reclaimed processes are deleted, so their stacks end here; a stack whose site could not be
/// counted, too).
fn sweep_stacks(
    map: &mut StackTraceMap<MapData>,
    unreferenced: &mut HashSet<u32>,
    raw: &mut RawRead,
) {
    let used: FoldSet<u32> = raw.gpu_sites.iter().map(|(k, _)| k.stack_id).collect();
    let ids: Vec<u32> = map.stack_ids().filter_map(Result::ok).collect();
    let mut now = HashSet::new();
    for id in ids {
        if used.contains(&id) {
            continue;
        }
        if unreferenced.contains(&id) {
            let _ = map.remove(&id);
            if raw.gpu_stacks.remove(&id).is_some() {
                raw.gpu_stacks_changed = true;
            }
        } else {
            now.insert(id);
        }
    }
    *unreferenced = now;
}

/// Run count and time of each attached program (kernel BPF stats).
pub fn program_costs(
    ebpf: &Ebpf,
    program_probe: &std::collections::BTreeMap<String, String>,
) -> Vec<ProgramCost> {
    ebpf.programs()
        .filter(|(name, _)| program_probe.contains_key(*name))
        .filter_map(|(name, p)| {
            let info = p.info().ok()?;
            Some(ProgramCost {
                name: name.to_string(),
                run_count: info.run_count(),
                run_time_ns: info.run_time().as_nanos() as u64,
            })
        })
        .collect()
}

/// What an exit event recorded of its process (see lifecycle.rs).
fn kernel_identity(e: &LifecycleEvent) -> crate::pipeline::model::KernelIdentity {
    let len = e.comm.iter().position(|b| *b == 0).unwrap_or(e.comm.len());
    crate::pipeline::model::KernelIdentity {
        ppid: e.parent_tgid,
        parent_start_ns: e.parent_start_ns,
        uid: e.uid,
        cgroup_id: e.cgroup_id,
        comm: String::from_utf8_lossy(&e.comm[..len]).into_owned(),
    }
}
