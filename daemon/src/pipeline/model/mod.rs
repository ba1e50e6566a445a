//! The daemon's state: one entry per process (keyed by pid + start time), fed with the raw
//! kernel map contents every interval. Kernel counters are cumulative per thread / process;
//! this module turns them into process totals that survive thread exits and map reclaiming,
//! and keeps a short history ring for "what happened in the last N seconds".
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use ethand_common::{
    BlkKey, BlkStats as RawBlk, GpuCallKey, GpuCallStats, GpuProcState, HIST_BUCKETS, Hist,
    NetStats as RawNet, ProcKey, SyscallHistKey, SyscallKey, SyscallStats as RawSys, ThreadStats,
    blk_op, syscall_class, thread_flags,
};
use ethand_snapshot as snap;

use crate::{pipeline::procinfo, pipeline::syscalls_table};

/// mmap(2): a process that maps a library calls it (dlopen), so its count moving is the
/// hint to look at the process's mappings again.
const MMAP_NR: u32 = libc::SYS_mmap as u32;

/// A process's cumulative totals at one point of its history (the fields of
/// snap::WindowStats): windows and timelines are differences of two of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub offcpu_preempted_ns: u64,
    pub runq_wait_ns: u64,
    pub syscalls: u64,
    pub syscall_time_ns: u64,
    pub block_read_bytes: u64,
    pub block_write_bytes: u64,
    pub net_tx_bytes: u64,
    pub net_rx_bytes: u64,
    pub gpu_launches: u64,
    pub gpu_sync_ns: u64,
    pub gpu_copy_h2d_bytes: u64,
    pub gpu_copy_d2h_bytes: u64,
    pub gpu_copy_other_bytes: u64,
    pub collective_calls: u64,
    pub collective_ns: u64,
    /// Absolute (not a counter): its window change is the growth of live GPU memory.
    pub gpu_memory_live_bytes: u64,
    pub gpu_sync_calls: u64,
    pub gpu_copy_h2d_calls: u64,
    pub gpu_copy_d2h_calls: u64,
    /// The main thread's on-CPU time: is the thread that drives the GPU busy now?
    pub main_thread_oncpu_ns: u64,
}

impl Totals {
    /// Field by field `f(self, other)`: the one place that lists every field.
    fn zip_with(&self, o: &Self, f: impl Fn(u64, u64) -> u64) -> Self {
        Self {
            oncpu_ns: f(self.oncpu_ns, o.oncpu_ns),
            offcpu_blocked_ns: f(self.offcpu_blocked_ns, o.offcpu_blocked_ns),
            offcpu_preempted_ns: f(self.offcpu_preempted_ns, o.offcpu_preempted_ns),
            runq_wait_ns: f(self.runq_wait_ns, o.runq_wait_ns),
            syscalls: f(self.syscalls, o.syscalls),
            syscall_time_ns: f(self.syscall_time_ns, o.syscall_time_ns),
            block_read_bytes: f(self.block_read_bytes, o.block_read_bytes),
            block_write_bytes: f(self.block_write_bytes, o.block_write_bytes),
            net_tx_bytes: f(self.net_tx_bytes, o.net_tx_bytes),
            net_rx_bytes: f(self.net_rx_bytes, o.net_rx_bytes),
            gpu_launches: f(self.gpu_launches, o.gpu_launches),
            gpu_sync_ns: f(self.gpu_sync_ns, o.gpu_sync_ns),
            gpu_copy_h2d_bytes: f(self.gpu_copy_h2d_bytes, o.gpu_copy_h2d_bytes),
            gpu_copy_d2h_bytes: f(self.gpu_copy_d2h_bytes, o.gpu_copy_d2h_bytes),
            gpu_copy_other_bytes: f(self.gpu_copy_other_bytes, o.gpu_copy_other_bytes),
            collective_calls: f(self.collective_calls, o.collective_calls),
            collective_ns: f(self.collective_ns, o.collective_ns),
            gpu_memory_live_bytes: f(self.gpu_memory_live_bytes, o.gpu_memory_live_bytes),
            gpu_sync_calls: f(self.gpu_sync_calls, o.gpu_sync_calls),
            gpu_copy_h2d_calls: f(self.gpu_copy_h2d_calls, o.gpu_copy_h2d_calls),
            gpu_copy_d2h_calls: f(self.gpu_copy_d2h_calls, o.gpu_copy_d2h_calls),
            main_thread_oncpu_ns: f(self.main_thread_oncpu_ns, o.main_thread_oncpu_ns),
        }
    }

    /// Adds `o`, field by field (the sum over a tree's processes).
    pub fn add(&mut self, o: &Self) {
        *self = self.zip_with(o, |a, b| a + b);
    }

    /// The change since `earlier`, field by field (0 where a total went down).
    pub fn since(&self, earlier: &Self) -> Self {
        self.zip_with(earlier, u64::saturating_sub)
    }
}

/// What a process has added to its name's totals (`Model::comms`) so far.
#[derive(Clone, Copy, Debug, Default)]
struct CommCharged {
    oncpu_ns: u64,
    runq_wait_ns: u64,
    syscalls: u64,
}

/// Everything read from the kernel maps in one pass.
#[derive(Default)]
pub struct RawRead {
    pub threads: Vec<(u32, ThreadStats)>,
    pub syscalls: Vec<(SyscallKey, RawSys)>,
    pub syscall_hist: Vec<(SyscallHistKey, Hist)>,
    pub blk: Vec<(BlkKey, RawBlk)>,
    pub net: Vec<(ProcKey, RawNet)>,
    pub gpu_calls: Vec<(GpuCallKey, GpuCallStats)>,
    pub gpu_procs: Vec<(ProcKey, GpuProcState)>,
    /// On-CPU time of runs in progress that `threads` does not hold yet (tid -> ns): the
    /// kernel charges a run at its switch-out, and a thread alone on its CPU may not be
    /// switched out for seconds.
    pub running_oncpu: HashMap<u32, u64>,
}

/// Scheduler totals of a thread or of a process's dead threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedAcc {
    pub oncpu_ns: u64,
    pub offcpu_blocked_ns: u64,
    pub offcpu_preempted_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub runq_wait_hist: [u64; HIST_BUCKETS],
}

impl SchedAcc {
    fn add(&mut self, o: &SchedAcc) {
        self.oncpu_ns += o.oncpu_ns;
        self.offcpu_blocked_ns += o.offcpu_blocked_ns;
        self.offcpu_preempted_ns += o.offcpu_preempted_ns;
        self.runq_wait_ns += o.runq_wait_ns;
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
        for (a, b) in self.runq_wait_hist.iter_mut().zip(o.runq_wait_hist) {
            *a += b;
        }
    }

    fn to_snapshot(&self) -> snap::SchedStats {
        snap::SchedStats {
            oncpu_ns: self.oncpu_ns,
            offcpu_blocked_ns: self.offcpu_blocked_ns,
            offcpu_preempted_ns: self.offcpu_preempted_ns,
            runq_wait_ns: self.runq_wait_ns,
            voluntary_switches: self.voluntary_switches,
            involuntary_switches: self.involuntary_switches,
            runq_wait_hist: self.runq_wait_hist.to_vec(),
        }
    }
}

/// One kernel thread entry as seen over time. The kernel entry can be deleted and recreated
/// (ethand reclaims exited threads; a thread's last switch-out may recreate it), and its
/// histogram buckets are u32 that wrap: both are absorbed here.
#[derive(Clone, Debug, Default)]
pub struct ThreadAcc {
    /// Totals of earlier incarnations of this entry.
    base: SchedAcc,
    /// The last raw entry.
    last: ThreadStats,
    /// Histogram accumulated from wrapping deltas of `last.runq_wait_hist`.
    hist: [u64; HIST_BUCKETS],
    /// On-CPU time of this incarnation shown so far: `last.oncpu_ns` plus the run in
    /// progress at the last read, never lower than at an earlier read (a counter).
    oncpu_shown_ns: u64,
    pub exited: bool,
    /// Consecutive reads that found the entry marked exited.
    exited_reads: u32,
}

impl ThreadAcc {
    /// Feeds the latest raw entry and the on-CPU time of the thread's run in progress that
    /// the entry does not hold yet.
    pub fn update(&mut self, raw: &ThreadStats, running_ns: u64) {
        let l = &self.last;
        let restarted = raw.oncpu_ns < l.oncpu_ns
            || raw.voluntary_switches < l.voluntary_switches
            || raw.involuntary_switches < l.involuntary_switches
            || raw.offcpu_blocked_ns < l.offcpu_blocked_ns
            || raw.offcpu_preempted_ns < l.offcpu_preempted_ns
            || raw.runq_wait_ns < l.runq_wait_ns;
        if restarted {
            let prev = self.current();
            self.base = prev;
            self.hist = [0; HIST_BUCKETS];
            self.oncpu_shown_ns = 0;
            self.last = ThreadStats {
                runq_wait_hist: [0; HIST_BUCKETS],
                ..ThreadStats::default()
            };
        }
        for i in 0..HIST_BUCKETS {
            self.hist[i] +=
                u64::from(raw.runq_wait_hist[i].wrapping_sub(self.last.runq_wait_hist[i]));
        }
        self.last = *raw;
        self.oncpu_shown_ns = self
            .oncpu_shown_ns
            .max(raw.oncpu_ns.saturating_add(running_ns));
        self.exited = raw.flags & thread_flags::EXITED != 0;
        self.exited_reads = if self.exited {
            self.exited_reads + 1
        } else {
            0
        };
    }

    /// Totals of this thread: earlier incarnations plus the current entry.
    pub fn current(&self) -> SchedAcc {
        let mut t = SchedAcc {
            oncpu_ns: self.oncpu_shown_ns.max(self.last.oncpu_ns),
            offcpu_blocked_ns: self.last.offcpu_blocked_ns,
            offcpu_preempted_ns: self.last.offcpu_preempted_ns,
            runq_wait_ns: self.last.runq_wait_ns,
            voluntary_switches: self.last.voluntary_switches,
            involuntary_switches: self.last.involuntary_switches,
            runq_wait_hist: self.hist,
        };
        t.add(&self.base);
        t
    }
}

pub struct Proc {
    pub key: ProcKey,
    /// Boxed: most short-lived processes never get one (gone before /proc was read).
    pub meta: Option<Box<procinfo::ProcMeta>>,
    pub comm_fallback: String,
    pub alive: bool,
    /// Collection round at which the process was found exited.
    pub exited_round: Option<u64>,
    /// Wall clock (ms) of the ingest that first saw the process: its counters start there.
    pub first_seen_unix_ms: u64,
    /// Boxed: a BTreeMap leaf holds 11 values, so an unboxed ~600-byte ThreadAcc made every
    /// process cost ~7 KB even with one thread (thousands of exited ones are kept for the grace).
    pub threads: BTreeMap<u32, Box<ThreadAcc>>,
    pub thread_comms: HashMap<u32, String>,
    pub dead: SchedAcc,
    pub syscalls: BTreeMap<u32, RawSys>,
    /// Boxed for the same reason as `threads`.
    pub syscall_hist: BTreeMap<u32, Box<[u64; HIST_BUCKETS]>>,
    pub blk: BTreeMap<(u32, u32), RawBlk>,
    pub net: RawNet,
    /// Per (op id, copy direction): cumulative kernel counters.
    pub gpu_calls: BTreeMap<(u16, u16), GpuCallStats>,
    pub gpu_state: Option<GpuProcState>,
    /// Metadata must be (re)read: first sight or exec.
    pub meta_stale: bool,
    /// Totals over time, for the snapshot windows and timelines.
    history: History,
    /// Its kernel map entries were deleted (after its exit was ingested): the model holds
    /// the final values.
    kernel_released: bool,
    /// A map entry of it was read this round: its totals may have moved (a history point
    /// is due). Idle and released processes are not summed again.
    read_this_round: bool,
    /// CPU, run-queue wait and syscalls already added to its name's totals (`Model::comms`):
    /// each round adds what came since, so a name's totals only grow, even when exec renames
    /// the process.
    comm_charged: CommCharged,
}

impl Proc {
    fn new(key: ProcKey) -> Self {
        Self {
            key,
            meta: None,
            comm_fallback: String::new(),
            alive: true,
            exited_round: None,
            first_seen_unix_ms: 0,
            threads: BTreeMap::new(),
            thread_comms: HashMap::new(),
            dead: SchedAcc::default(),
            syscalls: BTreeMap::new(),
            syscall_hist: BTreeMap::new(),
            blk: BTreeMap::new(),
            net: RawNet::default(),
            gpu_calls: BTreeMap::new(),
            gpu_state: None,
            history: History::default(),
            kernel_released: false,
            read_this_round: false,
            meta_stale: true,
            comm_charged: CommCharged::default(),
        }
    }

    /// Once its final counters are in (exited, kernel entries released), spare capacity
    /// goes, so that thousands kept for the grace period cost little. (Its exited threads
    /// fold into `dead` as usual, after their second exited read.)
    fn compact(&mut self) {
        if self.threads.is_empty() {
            self.threads = BTreeMap::new();
        }
        self.thread_comms.shrink_to_fit();
        self.history.points.shrink_to_fit();
    }

    pub fn sched(&self) -> SchedAcc {
        let mut t = self.dead;
        for th in self.threads.values() {
            t.add(&th.current());
        }
        t
    }

    /// The totals kept in the history ring.
    fn totals(&self) -> Totals {
        let s = self.sched();
        let n = &self.net;
        let mut t = Totals {
            oncpu_ns: s.oncpu_ns,
            offcpu_blocked_ns: s.offcpu_blocked_ns,
            offcpu_preempted_ns: s.offcpu_preempted_ns,
            runq_wait_ns: s.runq_wait_ns,
            net_tx_bytes: n.tcp_tx_bytes + n.udp_tx_bytes,
            net_rx_bytes: n.tcp_rx_bytes + n.udp_rx_bytes,
            // Absolute (not a counter): its window change is the growth of live GPU memory.
            gpu_memory_live_bytes: self
                .gpu_state
                .map(|st| st.live_bytes.iter().fold(0u64, |a, b| a.wrapping_add(*b)))
                .unwrap_or(0),
            // The main thread's on-CPU time: is the thread that drives the GPU busy now?
            main_thread_oncpu_ns: self
                .threads
                .get(&self.key.tgid)
                .map_or(0, |t| t.current().oncpu_ns),
            ..Totals::default()
        };
        for v in self.syscalls.values() {
            t.syscalls += v.count;
            t.syscall_time_ns += v.time_ns;
        }
        for ((_, op), v) in &self.blk {
            match *op {
                blk_op::READ => t.block_read_bytes += v.bytes,
                blk_op::WRITE => t.block_write_bytes += v.bytes,
                _ => {}
            }
        }
        for ((op, dir), c) in &self.gpu_calls {
            use ethand_userspace_probes::catalog::{CATALOG, Category};
            let Some(spec) = CATALOG.get(*op as usize) else {
                continue;
            };
            match spec.category {
                Category::Launch => t.gpu_launches += c.calls,
                Category::Sync => {
                    t.gpu_sync_ns += c.time_ns;
                    t.gpu_sync_calls += c.calls;
                }
                Category::Copy => match *dir as u8 {
                    ethand_common::gpu_dir::HOST_TO_DEVICE => {
                        t.gpu_copy_h2d_bytes += c.bytes;
                        t.gpu_copy_h2d_calls += c.calls;
                    }
                    ethand_common::gpu_dir::DEVICE_TO_HOST => {
                        t.gpu_copy_d2h_bytes += c.bytes;
                        t.gpu_copy_d2h_calls += c.calls;
                    }
                    _ => t.gpu_copy_other_bytes += c.bytes,
                },
                Category::Collective => {
                    t.collective_calls += c.calls;
                    t.collective_ns += c.time_ns;
                }
                _ => {}
            }
        }
        t
    }
}

/// What the collector must delete from the kernel maps after an ingest.
#[derive(Default, Debug)]
pub struct Reclaim {
    /// Thread entries to delete, with the process they must still belong to (a tid can be
    /// reused by another process by the time the collector deletes).
    pub threads: Vec<(u32, ProcKey)>,
    pub procs: Vec<ProcKey>,
}

/// Full resolution of the history for this long (ms); older points are thinned to the last
/// one of each COARSE_MS, so that a busy process costs ~60 points, not one per interval.
const FINE_MS: u64 = 30_000;
const COARSE_MS: u64 = 10_000;

/// Points in time (wall-clock ms, ascending) with a value each, thinned with age: every point
/// of the last FINE_MS, the last point of each COARSE_MS bucket before that, and nothing
/// older than the horizon except the one point that gives the value at the horizon.
#[derive(Default)]
struct Thinned<T> {
    points: VecDeque<(u64, T)>,
}

impl<T> Thinned<T> {
    fn push(&mut self, t: u64, v: T) {
        self.points.push_back((t, v));
    }

    fn last(&self) -> Option<&(u64, T)> {
        self.points.back()
    }

    /// The value at time `t`: the latest point at or before it.
    fn at(&self, t: u64) -> Option<&T> {
        let n = self.points.partition_point(|(pt, _)| *pt <= t);
        n.checked_sub(1).map(|i| &self.points[i].1)
    }

    fn thin(&mut self, now_ms: u64, history_ms: u64) {
        let horizon = now_ms.saturating_sub(history_ms);
        while self.points.len() >= 2 && self.points[1].0 <= horizon {
            self.points.pop_front();
        }
        let fine_from = now_ms.saturating_sub(FINE_MS);
        let bucket = |t: u64| t / COARSE_MS;
        let old = self.points.partition_point(|(t, _)| *t < fine_from);
        if old < 2 {
            return;
        }
        // Keep an old point if the next one is in another bucket (or is not old).
        let mut keep: Vec<bool> = (0..old)
            .map(|i| i + 1 >= old || bucket(self.points[i].0) != bucket(self.points[i + 1].0))
            .collect();
        keep.resize(self.points.len(), true);
        let mut k = keep.into_iter();
        self.points.retain(|_| k.next().unwrap_or(true));
    }
}

/// One process's totals: a point only when they changed (the value holds until the next).
type History = Thinned<Totals>;

pub struct Model {
    /// Boxed: a `Proc` is over a kilobyte and the table keeps an eighth of its slots free, so
    /// 10,000 processes (max_processes) inline cost ~20 MB; boxed, the table is ~400 KB.
    pub procs: HashMap<ProcKey, Box<Proc>, foldhash::fast::RandomState>,
    /// Processes whose mappings may have changed since the last drain (new, exec'd, or their
    /// mmap count moved): the only ones the GPU library scan needs to look at.
    pub maps_changed: HashSet<ProcKey>,
    /// The exit tracepoint is attached: exits arrive as events.
    pub exit_events: bool,
    /// Kernel launches are probed at the current GPU level (`process`, `op`): otherwise
    /// their counts are left out of every snapshot rather than shown as 0.
    pub launches_counted: bool,
    /// The times of the collection rounds, thinned like every process's history, so that
    /// windows start at a round every process has a value for.
    rounds: Thinned<()>,
    history_ms: u64,
    pub round: u64,
    grace_rounds: u64,
    max_processes: usize,
    /// Most exited processes kept for their grace period (`daemon.max_exited_processes`):
    /// under heavy churn the earliest exits leave first, so that memory follows the live
    /// processes rather than the birth rate.
    pub max_exited: usize,
    /// Exited processes with final counters in the model, as of the last ingest.
    released: usize,
    /// Distinct processes not tracked because the model was full.
    pub overflow: u64,
    /// Those processes, with whether their exit was seen: their kernel map entries are freed
    /// all the same (else the maps fill up with them).
    untracked: HashMap<ProcKey, bool>,
    /// Threads of untracked processes found exited by the last read: deleted when found
    /// exited again (by then their final switch-out, which may recreate the entry, is past).
    untracked_exited_threads: HashSet<u32>,
    /// CLOCK_BOOTTIME - CLOCK_MONOTONIC, to match kernel start times with /proc's.
    boot_minus_mono_ns: u64,
    clk_tck: u64,
    btime_unix_s: u64,
    /// Totals of reclaimed processes, so that per-cgroup and per-device series only grow.
    departed_cgroups: HashMap<String, snap::CgroupSnapshot>,
    departed_blk: BTreeMap<(u32, u32), RawBlk>,
    /// Per process name: what its processes did, charged round by round (`processes` left
    /// 0); at most COMMS_MAX names plus COMM_OTHER.
    comm_totals: HashMap<String, snap::CommSnapshot>,
    /// Wall clock of the ingest in progress (for first-seen times).
    now_unix_ms: u64,
    /// Container / pod / job / rank of processes (None: no attribution, as in unit tests).
    pub attribution: Option<crate::pipeline::attribution::Attributor>,
    /// cgroup ids of exit events to paths.
    cgroup_paths: procinfo::CgroupPaths,
    /// Processes entered from the /proc scan at start ([`Model::seed_live_processes`]), by
    /// tgid: keyed by a start time from /proc's clock ticks until the kernel's exact one
    /// appears with their first counters, when the entry moves to that key.
    seeded: HashMap<u32, ProcKey>,
    /// New keys this round whose tgid is a seeded process's.
    seed_hits: Vec<ProcKey>,
    /// Wall clock minus CLOCK_MONOTONIC (ms) at the last ingest: births in wall time.
    unix_minus_mono_ms: i64,
}

/// What the kernel recorded of a process at its exit (lifecycle.rs): all that is known of
/// one that exited before its /proc entry was read.
#[derive(Clone, Debug, Default)]
pub struct KernelIdentity {
    pub ppid: u32,
    pub parent_start_ns: u64,
    pub uid: u32,
    pub cgroup_id: u64,
    pub comm: String,
}

impl Model {
    pub fn new(
        interval_ms: u64,
        history_seconds: u64,
        exit_grace_seconds: u64,
        max_processes: usize,
    ) -> Self {
        let (mono, boot) = procinfo::clocks_ns();
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        Self {
            procs: HashMap::default(),
            maps_changed: HashSet::new(),
            exit_events: false,
            launches_counted: false,
            rounds: Thinned::default(),
            history_ms: (history_seconds * 1000).max(2 * interval_ms),
            round: 0,
            grace_rounds: ((exit_grace_seconds * 1000) / interval_ms.max(1)).max(1),
            max_processes,
            max_exited: usize::MAX,
            released: 0,
            overflow: 0,
            untracked: HashMap::new(),
            untracked_exited_threads: HashSet::new(),
            boot_minus_mono_ns: boot.saturating_sub(mono),
            clk_tck: procinfo::clock_ticks(),
            btime_unix_s: btime,
            departed_cgroups: HashMap::new(),
            departed_blk: BTreeMap::new(),
            comm_totals: HashMap::new(),
            now_unix_ms: 0,
            attribution: None,
            cgroup_paths: procinfo::CgroupPaths::new(),
            seeded: HashMap::new(),
            seed_hits: Vec::new(),
            unix_minus_mono_ms: 0,
        }
    }

    /// Enters every live process from a /proc scan: those the probes have not seen (asleep
    /// since before ethand started, a launcher in wait(), pid 1) are known, with no activity,
    /// rather than "not found". Called once the probes are attached, so that a process born
    /// after the scan is seen by its counters. At most half of `max_processes`.
    pub fn seed_live_processes(&mut self, now_unix_ms: u64) -> usize {
        self.now_unix_ms = now_unix_ms;
        let known: HashSet<u32> = self.procs.keys().map(|k| k.tgid).collect();
        let limit = self.max_processes / 2;
        let mut n = 0;
        for pid in procinfo::pids() {
            if self.procs.len() >= limit {
                break;
            }
            if known.contains(&pid) {
                continue;
            }
            let Some(mut meta) = procinfo::read(pid) else {
                continue;
            };
            if let Some(a) = self.attribution.as_mut() {
                meta.workload = a.identify(pid, &meta.cgroup).map(Box::new);
            }
            let key = proc_key(pid, self.mono_ns_of_ticks(meta.start_ticks));
            let mut p = Box::new(Proc::new(key));
            p.meta = Some(Box::new(meta));
            p.meta_stale = false;
            p.first_seen_unix_ms = self.now_unix_ms;
            self.seeded.insert(pid, key);
            self.procs.insert(key, p);
            n += 1;
        }
        n
    }

    /// CLOCK_MONOTONIC ns of a /proc start time in clock ticks (never 0: 0 means unknown).
    fn mono_ns_of_ticks(&self, ticks: u64) -> u64 {
        let boot_ns = (ticks as u128 * 1_000_000_000 / self.clk_tck.max(1) as u128) as u64;
        boot_ns.saturating_sub(self.boot_minus_mono_ns).max(1)
    }

    /// Wall clock (ms) of a CLOCK_MONOTONIC time; None for 0 (unknown).
    fn unix_ms_of_mono_ns(&self, ns: u64) -> Option<u64> {
        (ns != 0).then(|| (self.unix_minus_mono_ms + (ns / 1_000_000) as i64).max(0) as u64)
    }

    /// /proc's start time in clock ticks of a kernel start time.
    fn ticks_of_mono_ns(&self, ns: u64) -> u64 {
        ((ns + self.boot_minus_mono_ns) as u128 * self.clk_tck as u128 / 1_000_000_000) as u64
    }

    /// Moves seeded processes whose exact key appeared to it: the exact entry takes the
    /// metadata and first-seen time; the seed entry (no counters) goes.
    fn merge_seeds(&mut self) {
        for key in std::mem::take(&mut self.seed_hits) {
            let Some(seed_key) = self.seeded.get(&key.tgid).copied() else {
                continue;
            };
            let Some(ticks) = self
                .procs
                .get(&seed_key)
                .and_then(|p| Some(p.meta.as_ref()?.start_ticks))
            else {
                self.seeded.remove(&key.tgid);
                continue;
            };
            // Another process that reused the pid: the seed stays for the liveness check.
            if seed_key == key || !self.start_matches(key.proc_start_ns, ticks) {
                continue;
            }
            self.seeded.remove(&key.tgid);
            let seed = self.procs.remove(&seed_key).expect("present");
            if let Some(p) = self.procs.get_mut(&key) {
                if p.meta.is_none() {
                    p.meta = seed.meta;
                }
                p.first_seen_unix_ms = p.first_seen_unix_ms.min(seed.first_seen_unix_ms);
            }
        }
    }

    fn proc_mut(&mut self, key: ProcKey) -> Option<&mut Proc> {
        // One hash lookup: this runs for every map entry read, every round.
        let full = self.procs.len() >= self.max_processes;
        match self.procs.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let p = &mut **e.into_mut();
                p.read_this_round = true;
                Some(p)
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                if full {
                    // Bounded: a set that large means exits went unseen; recounting is the
                    // lesser harm.
                    if self.untracked.len() >= 4 * self.max_processes.max(1024) {
                        self.untracked.clear();
                    }
                    if self.untracked.insert(key, false).is_none() {
                        self.overflow += 1;
                    }
                    return None;
                }
                let mut p = Box::new(Proc::new(key));
                p.first_seen_unix_ms = self.now_unix_ms;
                p.read_this_round = true;
                self.maps_changed.insert(key);
                if self.seeded.contains_key(&key.tgid) {
                    self.seed_hits.push(key);
                }
                Some(&mut **v.insert(p))
            }
        }
    }

    /// Drains [`Self::maps_changed`] into the pids the library scan should look at: not those
    /// known to have exited, whose /proc entries are gone (at 100 births a second most
    /// hints were short-lived processes, and each was a failed /proc read).
    pub fn drain_maps_changed(&mut self) -> impl Iterator<Item = u32> + '_ {
        let procs = &self.procs;
        self.maps_changed
            .drain()
            .filter(|k| procs.get(k).is_none_or(|p| p.alive))
            .map(|k| k.tgid)
    }

    /// A process exec'd: its name and command line changed, and its threads' names.
    pub fn on_exec(&mut self, key: ProcKey) {
        if let Some(p) = self.proc_mut(key) {
            p.meta_stale = true;
            p.thread_comms.clear();
        }
        self.maps_changed.insert(key);
    }

    /// A process exited (all its threads). `kernel`: what the exit event recorded, which
    /// identifies a process that exited before /proc was read (its parent, cgroup, name),
    /// so that its counters reach its tree and its cgroup.
    pub fn on_exit(&mut self, key: ProcKey, kernel: Option<KernelIdentity>) {
        let round = self.round;
        // Known from its exit alone when it exited before its first counters were read
        // (not when the model is full: its counters will count it as overflow, once).
        if self.procs.len() < self.max_processes && !self.untracked.contains_key(&key) {
            let _ = self.proc_mut(key);
        }
        let needs_meta = self.procs.get(&key).is_some_and(|p| p.meta.is_none());
        // An exec since /proc was read (meta_stale) and no /proc to read it again: the name
        // at exit is the one after the exec. (Otherwise /proc's name stands: the exit event's
        // is the last thread's, which may be a worker thread's own name.)
        let exit_comm = kernel
            .as_ref()
            .filter(|_| self.procs.get(&key).is_some_and(|p| p.meta_stale))
            .map(|k| k.comm.clone());
        let meta = match kernel {
            Some(k) if needs_meta => Some(self.meta_from_kernel(key, k)),
            _ => None,
        };
        if let Some(p) = self.procs.get_mut(&key) {
            p.alive = false;
            // Counted from the round that will ingest this exit.
            p.exited_round.get_or_insert(round + 1);
            if let Some(m) = meta {
                p.meta = Some(Box::new(m));
            } else if let (Some(m), Some(comm)) = (p.meta.as_mut(), exit_comm)
                && !comm.is_empty()
            {
                m.comm = comm;
            }
        } else if let Some(exited) = self.untracked.get_mut(&key) {
            *exited = true;
        }
    }

    /// Metadata of an exited process from its exit event: no command line or executable
    /// (they are gone with it); its container from the cgroup; its job from its parent's,
    /// whose environment it inherited (its own pid may already be another process's).
    fn meta_from_kernel(&mut self, key: ProcKey, k: KernelIdentity) -> procinfo::ProcMeta {
        let cgroup = self
            .cgroup_paths
            .path(k.cgroup_id, self.round)
            .unwrap_or_default();
        let parent_job = self
            .procs
            .get(&proc_key(k.ppid, k.parent_start_ns))
            .and_then(|p| p.meta.as_ref()?.workload.as_ref())
            .map(|w| (w.job_id.clone(), w.job_id_source.clone()));
        let mut workload = self.attribution.as_mut().and_then(|a| a.container(&cgroup));
        if let Some((Some(job), source)) = parent_job {
            let w = workload.get_or_insert_with(Default::default);
            w.job_id = Some(job);
            w.job_id_source = source;
        }
        procinfo::ProcMeta {
            ppid: k.ppid,
            comm: k.comm,
            cgroup,
            uid: k.uid,
            start_ticks: self.ticks_of_mono_ns(key.proc_start_ns),
            workload: workload.map(Box::new),
            ..Default::default()
        }
    }

    /// Feeds one read of the kernel maps; returns what to delete from them.
    pub fn ingest(&mut self, raw: &RawRead, now_unix_ms: u64) -> Reclaim {
        self.round += 1;
        self.now_unix_ms = now_unix_ms;
        self.unix_minus_mono_ms = now_unix_ms as i64 - (procinfo::clocks_ns().0 / 1_000_000) as i64;
        let mut reclaim = Reclaim::default();
        self.make_room(&mut reclaim, true);
        let mut untracked_exited = HashSet::new();
        // Thread entries new this round: their names are read once the processes' are.
        let mut new_threads: Vec<(ProcKey, u32)> = Vec::new();
        // Entries come sorted by process (Collector::read): one model lookup per process.
        for group in raw
            .threads
            .chunk_by(|(_, a), (_, b)| (a.tgid, a.proc_start_ns) == (b.tgid, b.proc_start_ns))
        {
            let key = proc_key(group[0].1.tgid, group[0].1.proc_start_ns);
            let Some(p) = self.proc_mut(key) else {
                for (tid, t) in group {
                    if t.flags & thread_flags::EXITED != 0 {
                        if self.untracked_exited_threads.contains(tid) {
                            reclaim.threads.push((*tid, key));
                        } else {
                            untracked_exited.insert(*tid);
                        }
                    }
                }
                continue;
            };
            for (tid, t) in group {
                let acc = match p.threads.entry(*tid) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        new_threads.push((key, *tid));
                        e.insert(Default::default())
                    }
                };
                acc.update(t, raw.running_oncpu.get(tid).copied().unwrap_or(0));
                // Deleted once seen exited twice: by then its final switch-out has been
                // counted.
                if acc.exited_reads >= 2 {
                    let done = p.threads.remove(tid).expect("present");
                    p.dead.add(&done.current());
                    reclaim.threads.push((*tid, key));
                }
            }
        }
        for group in raw
            .syscalls
            .chunk_by(|(a, _), (b, _)| (a.tgid, a.proc_start_ns) == (b.tgid, b.proc_start_ns))
        {
            let key = proc_key(group[0].0.tgid, group[0].0.proc_start_ns);
            let Some(p) = self.proc_mut(key) else {
                continue;
            };
            let mut mmap_changed = false;
            for &(k, v) in group {
                if p.kernel_released {
                    // Created again after its entries were freed: a batch of syscalls that
                    // the kernel flushed after the exit event (another thread of the process
                    // still exiting). Its values are what came since: add them, free it again.
                    let old = p.syscalls.entry(k.nr).or_default();
                    old.count += v.count;
                    old.errors += v.errors;
                    old.time_ns += v.time_ns;
                    reclaim.procs.push(p.key);
                    continue;
                }
                let changed = match p.syscalls.get_mut(&k.nr) {
                    Some(old) => std::mem::replace(old, v).count != v.count,
                    None => {
                        p.syscalls.insert(k.nr, v);
                        true
                    }
                };
                mmap_changed |= k.nr == MMAP_NR && changed;
            }
            if mmap_changed {
                self.maps_changed.insert(key);
            }
        }
        for group in raw
            .syscall_hist
            .chunk_by(|(a, _), (b, _)| (a.tgid, a.proc_start_ns) == (b.tgid, b.proc_start_ns))
        {
            let Some(p) = self.proc_mut(proc_key(group[0].0.tgid, group[0].0.proc_start_ns)) else {
                continue;
            };
            for (k, v) in group {
                // In place: a new box per histogram per round was a malloc and a free each.
                match p.syscall_hist.get_mut(&k.class) {
                    Some(h) => **h = v.buckets,
                    None => {
                        p.syscall_hist.insert(k.class, Box::new(v.buckets));
                    }
                }
            }
        }
        for &(k, v) in &raw.blk {
            if let Some(p) = self.proc_mut(proc_key(k.tgid, k.proc_start_ns)) {
                p.blk.insert((k.dev, k.op), v);
            }
        }
        for &(k, v) in &raw.net {
            if let Some(p) = self.proc_mut(k) {
                p.net = v;
            }
        }
        for &(k, v) in &raw.gpu_calls {
            if let Some(p) = self.proc_mut(proc_key(k.tgid, k.proc_start_ns)) {
                p.gpu_calls.insert((k.op, k.dir), v);
            }
        }
        for &(k, v) in &raw.gpu_procs {
            if let Some(p) = self.proc_mut(k) {
                p.gpu_state = Some(v);
            }
        }
        self.untracked_exited_threads = untracked_exited;
        self.refresh_meta(&new_threads);
        // Processes that are gone: exited long enough ago, or vanished without an exit event.
        // With exit events a vanished process is rare (lost events are counted), so the
        // check, a /proc read per process, runs less often.
        let every = if self.exit_events { 60 } else { 10 };
        let check_liveness = self.round % every == 0;
        let round = self.round;
        if check_liveness {
            let gone: Vec<ProcKey> = self
                .procs
                .values()
                .filter(|p| p.alive && !self.is_same_process_alive(p))
                .map(|p| p.key)
                .collect();
            for k in gone {
                let p = self.procs.get_mut(&k).expect("present");
                p.alive = false;
                p.exited_round = Some(round);
            }
            // Untracked processes whose exit event was lost (ring buffer full).
            let lost: Vec<ProcKey> = self
                .untracked
                .iter()
                .filter(|(k, exited)| !**exited && !self.is_key_alive(k))
                .map(|(k, _)| *k)
                .collect();
            for k in lost {
                self.untracked.insert(k, true);
            }
        }
        // Untracked processes that exited: nothing of theirs is kept, free their entries.
        self.untracked.retain(|k, exited| {
            if *exited {
                reclaim.procs.push(*k);
            }
            !*exited
        });
        let grace = self.grace_rounds;
        self.rounds.push(now_unix_ms, ());
        self.rounds.thin(now_unix_ms, self.history_ms);
        // Thinning costs a pass over a process's points: once per coarse bucket is enough.
        let thin_now = self.rounds.points.len() < 2
            || now_unix_ms / COARSE_MS
                != self.rounds.points[self.rounds.points.len() - 2].0 / COARSE_MS;
        // One pass over the processes for expiry, release and history: at 1,000 processes
        // (and 3,000 exited ones in their grace period) each pass was a cache miss per process.
        let mut expired = Vec::new();
        let mut released = 0;
        for p in self.procs.values_mut() {
            if p.exited_round
                .is_some_and(|r| round.saturating_sub(r) >= grace)
            {
                expired.push(p.key);
                continue;
            }
            // An exited process's counters are final once a read after its exit is ingested
            // (this one): free its kernel entries now rather than after the grace period, so
            // that the maps hold live processes only (100 exits/s x 30 s filled the syscall
            // map).
            let release = !p.kernel_released && p.exited_round.is_some_and(|r| r <= round);
            // Totals move only with what was read: a process none of whose entries was read
            // (idle, or released and final) keeps its last point. A released process's last
            // read and a batch flushed after its release are recorded like any other.
            if std::mem::take(&mut p.read_this_round) || p.history.last().is_none() {
                let totals = p.totals();
                if p.history.last().is_none_or(|(_, v)| *v != totals) {
                    p.history.push(now_unix_ms, totals);
                }
                charge_comm(&mut self.comm_totals, p, &totals);
            }
            if thin_now && !p.kernel_released {
                p.history.thin(now_unix_ms, self.history_ms);
            }
            if release {
                p.kernel_released = true;
                reclaim.procs.push(p.key);
                p.compact();
            }
            released += usize::from(p.kernel_released);
        }
        self.released = released;
        for k in expired {
            self.retire(k, &mut reclaim);
        }
        // Again with this round's exits counted: between rounds the model holds at most
        // max_exited exited processes, whatever the birth rate.
        self.make_room(&mut reclaim, false);
        reclaim
    }

    /// Removes a process from the model (its kernel entries go with it).
    fn retire(&mut self, k: ProcKey, reclaim: &mut Reclaim) {
        if let Some(mut p) = self.procs.remove(&k) {
            reclaim.threads.extend(p.threads.keys().map(|t| (*t, k)));
            if !p.kernel_released {
                reclaim.procs.push(k);
            }
            self.depart(&mut p);
        }
    }

    /// A model three quarters full makes room for new processes: exited ones whose final
    /// counters were read leave before their grace period ends, earliest exit first, until
    /// it is a quarter full (or no such process is left). So a burst of short-lived processes
    /// (10,000 per second) does not keep new long-lived ones out for the grace period; only
    /// more than max_processes live ones overflow. Beyond `max_exited` exited ones, the
    /// earliest exits leave too. `for_new`: called before new processes come in (only then
    /// the three-quarters rule applies; after a round only the `max_exited` cap does).
    fn make_room(&mut self, reclaim: &mut Reclaim, for_new: bool) {
        let full = for_new && self.procs.len() >= self.max_processes * 3 / 4;
        let too_many_exited = self.released > self.max_exited;
        if !full && !too_many_exited {
            return;
        }
        let mut done: Vec<(u64, ProcKey)> = self
            .procs
            .values()
            .filter(|p| p.kernel_released)
            .filter_map(|p| Some((p.exited_round?, p.key)))
            .collect();
        let mut excess = done.len().saturating_sub(self.max_exited);
        if full {
            excess = excess.max(self.procs.len() - self.max_processes / 4);
        }
        if done.len() > excess {
            done.select_nth_unstable(excess);
            done.truncate(excess);
        }
        self.released = self.released.saturating_sub(done.len());
        for (_, k) in done {
            self.retire(k, reclaim);
        }
    }

    /// Keeps a reclaimed process's totals in its cgroup's and devices' running sums.
    fn depart(&mut self, p: &mut Proc) {
        let c = charge_comm(&mut self.comm_totals, p, &p.totals());
        c.exited += 1;
        let cg = self.departed_cgroups.entry(cgroup_of(p)).or_default();
        let snap = cgroup_totals(p);
        add_cgroup(cg, &snap);
        for (k, b) in &p.blk {
            add_blk(self.departed_blk.entry(*k).or_default(), b);
        }
    }

    /// Per cgroup totals: processes in the model plus departed ones.
    pub fn cgroups(&self) -> Vec<snap::CgroupSnapshot> {
        let mut m: BTreeMap<String, snap::CgroupSnapshot> = self
            .departed_cgroups
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for p in self.procs.values() {
            let cg = m.entry(cgroup_of(p)).or_default();
            add_cgroup(cg, &cgroup_totals(p));
            cg.processes += 1;
        }
        m.into_iter()
            .map(|(k, mut v)| {
                v.workload = self
                    .attribution
                    .as_ref()
                    .and_then(|a| a.cached_container(&k));
                v.cgroup = k;
                v
            })
            .collect()
    }

    /// Per process name totals, exited processes included; `processes` counts the ones in
    /// the model now.
    pub fn comms(&self) -> Vec<snap::CommSnapshot> {
        let mut m: BTreeMap<&str, snap::CommSnapshot> = self
            .comm_totals
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        for p in self.procs.values() {
            let name = comm_of(p);
            let slot = if m.contains_key(name) {
                name
            } else {
                snap::COMM_OTHER
            };
            m.entry(slot).or_default().processes += 1;
        }
        m.into_iter()
            .map(|(k, mut v)| {
                v.comm = k.to_string();
                v
            })
            .collect()
    }

    /// Per device and op totals of all processes, departed ones included.
    pub fn block_devices(&self, devnames: &HashMap<u32, String>) -> Vec<snap::BlockStats> {
        let mut m = self.departed_blk.clone();
        for p in self.procs.values() {
            for (k, b) in &p.blk {
                add_blk(m.entry(*k).or_default(), b);
            }
        }
        m.iter()
            .map(|((dev, op), b)| blk_snapshot(*dev, *op, b, devnames))
            .collect()
    }

    fn is_same_process_alive(&self, p: &Proc) -> bool {
        self.is_key_alive(&p.key)
    }

    fn is_key_alive(&self, k: &ProcKey) -> bool {
        match procinfo::start_ticks(k.tgid) {
            Some(start_ticks) => self.start_matches(k.proc_start_ns, start_ticks),
            None => false,
        }
    }

    /// Whether /proc's start time (ticks after boot) is the kernel start time we keyed on.
    fn start_matches(&self, proc_start_ns: u64, start_ticks: u64) -> bool {
        if proc_start_ns == 0 {
            return true;
        }
        let expected = (proc_start_ns + self.boot_minus_mono_ns) as u128 * self.clk_tck as u128
            / 1_000_000_000;
        (expected as i128 - start_ticks as i128).abs() <= 2
    }

    fn refresh_meta(&mut self, new_threads: &[(ProcKey, u32)]) {
        self.merge_seeds();
        let round = self.round;
        let stale: Vec<ProcKey> = self
            .procs
            .values()
            .filter(|p| p.meta_stale && p.alive)
            .map(|p| p.key)
            .collect();
        for k in stale {
            let meta = procinfo::read(k.tgid)
                .filter(|m| self.start_matches(k.proc_start_ns, m.start_ticks));
            let meta = meta.map(|mut m| {
                if let Some(a) = self.attribution.as_mut() {
                    m.workload = a.identify(k.tgid, &m.cgroup).map(Box::new);
                }
                m
            });
            let p = self.procs.get_mut(&k).expect("present");
            p.meta_stale = false;
            // After an exec the threads' names changed too (exec leaves one thread).
            if meta.is_some() {
                for tid in p.threads.keys() {
                    if !p.thread_comms.contains_key(tid)
                        && let Some(c) = procinfo::thread_comm(k.tgid, *tid)
                    {
                        p.thread_comms.insert(*tid, c);
                    }
                }
            }
            match meta {
                Some(m) => p.meta = Some(Box::new(m)),
                // Never identified: it exited before we looked (its exit event may have come
                // before its first counters), or the pid already belongs to another process.
                None if p.meta.is_none() => {
                    if !(procinfo::exists(k.tgid) && k.proc_start_ns == 0) {
                        p.alive = false;
                        p.exited_round.get_or_insert(round);
                    }
                }
                None => {}
            }
        }
        // Only threads new this round: a pass over every thread of every process each round
        // was a cache miss per process at 1,000 processes. A thread whose name cannot be read
        // has exited (or its process has).
        for (k, tid) in new_threads {
            let Some(p) = self.procs.get_mut(k) else {
                continue;
            };
            if p.alive
                && !p.thread_comms.contains_key(tid)
                && let Some(c) = procinfo::thread_comm(k.tgid, *tid)
            {
                p.thread_comms.insert(*tid, c);
            }
        }
    }

    /// The syscall each thread of `p` was in at its last switch-out, and when it entered it
    /// (see [`crate::pipeline::inflight`]).
    pub fn entered_syscalls(&self, p: &Proc) -> crate::pipeline::inflight::Entered {
        p.threads
            .iter()
            .filter(|(_, t)| !t.exited)
            .map(|(tid, t)| (*tid, (t.last.sys_nr, t.last.sys_start_ns)))
            .collect()
    }

    /// How long (ms) ethand has known `p`.
    pub fn known_ms(&self, p: &Proc) -> u64 {
        self.now_unix_ms.saturating_sub(p.first_seen_unix_ms)
    }

    /// Change of the totals of `key` over the last `window_ms` (None without history).
    fn window(&self, key: &ProcKey, window_ms: u64) -> Option<snap::WindowStats> {
        let (now_ms, _) = *self.rounds.last()?;
        let p = self.procs.get(key)?;
        let cur = p.history.at(now_ms)?;
        let then_ms = self
            .rounds
            .points
            .iter()
            .find(|(t, _)| now_ms.saturating_sub(*t) <= window_ms)
            .map(|(t, _)| *t)?;
        // A process first seen after the window started counts from zero, and its window
        // starts at its birth: rates over a span before it was born would be diluted.
        let old = p.history.at(then_ms).copied().unwrap_or_default();
        let born_ms = self.unix_ms_of_mono_ns(p.key.proc_start_ns);
        let then_ms = match born_ms {
            Some(b) if b > then_ms => b.min(now_ms),
            _ => then_ms,
        };
        let d = cur.since(&old);
        Some(snap::WindowStats {
            duration_ms: now_ms - then_ms,
            oncpu_ns: d.oncpu_ns,
            offcpu_blocked_ns: d.offcpu_blocked_ns,
            offcpu_preempted_ns: d.offcpu_preempted_ns,
            runq_wait_ns: d.runq_wait_ns,
            syscalls: d.syscalls,
            syscall_time_ns: d.syscall_time_ns,
            block_read_bytes: d.block_read_bytes,
            block_write_bytes: d.block_write_bytes,
            net_tx_bytes: d.net_tx_bytes,
            net_rx_bytes: d.net_rx_bytes,
            gpu_launches: self.launches_counted.then_some(d.gpu_launches),
            gpu_sync_ns: d.gpu_sync_ns,
            gpu_sync_calls: d.gpu_sync_calls,
            gpu_copy_h2d_calls: d.gpu_copy_h2d_calls,
            gpu_copy_d2h_calls: d.gpu_copy_d2h_calls,
            main_thread_oncpu_ns: Some(d.main_thread_oncpu_ns),
            gpu_copy_h2d_bytes: d.gpu_copy_h2d_bytes,
            gpu_copy_d2h_bytes: d.gpu_copy_d2h_bytes,
            gpu_copy_other_bytes: d.gpu_copy_other_bytes,
            collective_calls: d.collective_calls,
            collective_ns: d.collective_ns,
            gpu_memory_growth_bytes: d.gpu_memory_live_bytes,
        })
    }

    /// Per-interval sums over `keys` for the history points within `window_ms`, oldest first.
    pub fn timeline(
        &self,
        keys: &[ProcKey],
        window_ms: u64,
    ) -> Vec<ethand_snapshot::diagnosis::TimelinePoint> {
        let Some(&(now_ms, _)) = self.rounds.last() else {
            return Vec::new();
        };
        let hists: Vec<&History> = keys
            .iter()
            .filter_map(|k| self.procs.get(k).map(|p| &p.history))
            .collect();
        let points: Vec<(u64, Totals)> = self
            .rounds
            .points
            .iter()
            .filter(|(t, _)| now_ms.saturating_sub(*t) <= window_ms)
            .map(|&(t, _)| {
                let mut s = Totals::default();
                for h in &hists {
                    if let Some(v) = h.at(t) {
                        s.add(v);
                    }
                }
                (t, s)
            })
            .collect();
        points
            .windows(2)
            .map(|w| {
                let (t0, a) = (w[0].0, w[0].1);
                let (t1, b) = (w[1].0, w[1].1);
                let d = b.since(&a);
                ethand_snapshot::diagnosis::TimelinePoint {
                    t_unix_ms: t1,
                    interval_ms: t1.saturating_sub(t0),
                    oncpu_ns: d.oncpu_ns,
                    offcpu_blocked_ns: d.offcpu_blocked_ns,
                    runq_wait_ns: d.runq_wait_ns,
                    syscalls: d.syscalls,
                    block_read_bytes: d.block_read_bytes,
                    block_write_bytes: d.block_write_bytes,
                    net_tx_bytes: d.net_tx_bytes,
                    net_rx_bytes: d.net_rx_bytes,
                    gpu_launches: self.launches_counted.then_some(d.gpu_launches),
                    gpu_sync_ns: d.gpu_sync_ns,
                    gpu_copy_bytes: d.gpu_copy_h2d_bytes
                        + d.gpu_copy_d2h_bytes
                        + d.gpu_copy_other_bytes,
                    collective_ns: d.collective_ns,
                    gpu_memory_live_bytes: b.gpu_memory_live_bytes,
                }
            })
            .collect()
    }

    /// Just what the exporters' process selection looks at (pid, comm, cgroup, recent CPU,
    /// GPU use): cheap, so that a scrape builds full snapshots of the selected few only.
    pub fn selection_view(&self, p: &Proc, window_ms: u64) -> snap::ProcessSnapshot {
        let meta = p.meta.as_ref();
        let comm = match meta {
            Some(m) if !m.comm.is_empty() => m.comm.clone(),
            _ => p.comm_fallback.clone(),
        };
        let mut v = snap::ProcessSnapshot {
            pid: p.key.tgid,
            start_time_ns: p.key.proc_start_ns,
            // The selection's age test (0: unknown).
            start_time_unix_s: self
                .unix_ms_of_mono_ns(p.key.proc_start_ns)
                .map_or(0, |ms| ms / 1000),
            comm,
            cgroup: meta.map(|m| m.cgroup.clone()).unwrap_or_default(),
            window: self.window(&p.key, window_ms),
            ..Default::default()
        };
        v.sched.oncpu_ns = p.sched().oncpu_ns;
        if !p.gpu_calls.is_empty() || p.gpu_state.is_some() {
            v.gpu = crate::pipeline::gpu::process_stats(
                &p.gpu_calls,
                p.gpu_state.as_ref(),
                self.launches_counted,
            );
        }
        v
    }

    pub fn process_snapshot(
        &self,
        p: &Proc,
        window_ms: u64,
        devnames: &HashMap<u32, String>,
    ) -> snap::ProcessSnapshot {
        let meta = p.meta.clone().unwrap_or_default();
        let comm = if meta.comm.is_empty() {
            p.comm_fallback.clone()
        } else {
            meta.comm.clone()
        };
        let mut by_nr: Vec<snap::SyscallRow> = p
            .syscalls
            .iter()
            .map(|(nr, s)| snap::SyscallRow {
                nr: *nr,
                name: syscalls_table::name(*nr),
                count: s.count,
                errors: s.errors,
                time_ns: s.time_ns,
            })
            .collect();
        by_nr.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(a.nr.cmp(&b.nr)));
        let syscalls = snap::SyscallStats {
            count: by_nr.iter().map(|r| r.count).sum(),
            errors: by_nr.iter().map(|r| r.errors).sum(),
            time_ns: by_nr.iter().map(|r| r.time_ns).sum(),
            by_nr,
            latency: p
                .syscall_hist
                .iter()
                .map(|(c, h)| snap::SyscallClassHist {
                    class: syscall_class::NAMES
                        .get(*c as usize)
                        .unwrap_or(&"unknown")
                        .to_string(),
                    count: h.iter().sum(),
                    buckets: h.to_vec(),
                })
                .collect(),
        };
        let block = p
            .blk
            .iter()
            .map(|((dev, op), b)| {
                let device = dev_string(*dev);
                snap::BlockStats {
                    device_name: devnames.get(dev).cloned().unwrap_or_else(|| device.clone()),
                    device,
                    op: blk_op::NAMES
                        .get(*op as usize)
                        .unwrap_or(&"other")
                        .to_string(),
                    ops: b.ops,
                    bytes: b.bytes,
                    queue_ns: b.queue_ns,
                    service_ns: b.service_ns,
                    queue_hist: b.queue_hist.to_vec(),
                    service_hist: b.service_hist.to_vec(),
                }
            })
            .collect();
        let gpu = crate::pipeline::gpu::process_stats(
            &p.gpu_calls,
            p.gpu_state.as_ref(),
            self.launches_counted,
        );
        snap::ProcessSnapshot {
            pid: p.key.tgid,
            ppid: meta.ppid,
            start_time_ns: p.key.proc_start_ns,
            start_time_unix_s: if meta.start_ticks > 0 {
                self.btime_unix_s + meta.start_ticks / self.clk_tck
            } else {
                0
            },
            comm,
            cmdline: meta.cmdline,
            cmdline_truncated: meta.cmdline_truncated,
            exe: meta.exe,
            cgroup: meta.cgroup,
            uid: meta.uid,
            alive: p.alive,
            observed_ms: self.now_unix_ms.saturating_sub(p.first_seen_unix_ms),
            sched: p.sched().to_snapshot(),
            threads: p
                .threads
                .iter()
                .map(|(tid, t)| snap::ThreadSnapshot {
                    tid: *tid,
                    comm: p.thread_comms.get(tid).cloned().unwrap_or_default(),
                    alive: !t.exited,
                    sched: t.current().to_snapshot(),
                    now: None,
                })
                .collect(),
            syscalls,
            block,
            net: net_snapshot(&p.net),
            workload: crate::pipeline::attribution::with_nccl_rank(
                meta.workload.map(|w| *w),
                gpu.as_ref().and_then(|g| g.comm.as_ref()?.rank),
            ),
            gpu,
            devices: Vec::new(),
            window: self.window(&p.key, window_ms),
            swap_bytes: None,
            major_faults: None,
        }
    }

    /// A live process the probes never saw over `measured_ms` (asleep throughout): its
    /// metadata from /proc and the zero activity it had. Its window is the measurement, so
    /// its idle main thread counts as idle, not as unknown.
    pub fn unseen_process_snapshot(
        &self,
        pid: u32,
        meta: procinfo::ProcMeta,
        measured_ms: u64,
    ) -> snap::ProcessSnapshot {
        snap::ProcessSnapshot {
            pid,
            ppid: meta.ppid,
            start_time_unix_s: if meta.start_ticks > 0 {
                self.btime_unix_s + meta.start_ticks / self.clk_tck
            } else {
                0
            },
            comm: meta.comm,
            cmdline: meta.cmdline,
            cmdline_truncated: meta.cmdline_truncated,
            exe: meta.exe,
            cgroup: meta.cgroup,
            uid: meta.uid,
            alive: true,
            observed_ms: measured_ms,
            window: Some(snap::WindowStats {
                duration_ms: measured_ms,
                gpu_launches: self.launches_counted.then_some(0),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

fn blk_snapshot(
    dev: u32,
    op: u32,
    b: &RawBlk,
    devnames: &HashMap<u32, String>,
) -> snap::BlockStats {
    let device = dev_string(dev);
    snap::BlockStats {
        device_name: devnames
            .get(&dev)
            .cloned()
            .unwrap_or_else(|| device.clone()),
        device,
        op: blk_op::NAMES
            .get(op as usize)
            .unwrap_or(&"other")
            .to_string(),
        ops: b.ops,
        bytes: b.bytes,
        queue_ns: b.queue_ns,
        service_ns: b.service_ns,
        queue_hist: b.queue_hist.to_vec(),
        service_hist: b.service_hist.to_vec(),
    }
}

fn add_blk(a: &mut RawBlk, b: &RawBlk) {
    a.ops += b.ops;
    a.bytes += b.bytes;
    a.queue_ns += b.queue_ns;
    a.service_ns += b.service_ns;
    for i in 0..HIST_BUCKETS {
        a.queue_hist[i] += b.queue_hist[i];
        a.service_hist[i] += b.service_hist[i];
    }
}

/// The process's name as the snapshots show it.
fn comm_of(p: &Proc) -> &str {
    match p.meta.as_ref().map(|m| m.comm.as_str()) {
        Some(c) if !c.is_empty() => c,
        _ => &p.comm_fallback,
    }
}

/// Adds what `p` did since its last charge (`totals` its totals now) to its name's totals,
/// which are made for at most COMMS_MAX names (later names go to COMM_OTHER), and returns
/// them.
fn charge_comm<'a>(
    comms: &'a mut HashMap<String, snap::CommSnapshot>,
    p: &mut Proc,
    totals: &Totals,
) -> &'a mut snap::CommSnapshot {
    let name = comm_of(p);
    let key = if comms.contains_key(name) || comms.len() < snap::COMMS_MAX {
        name
    } else {
        snap::COMM_OTHER
    };
    if !comms.contains_key(key) {
        comms.insert(key.to_string(), snap::CommSnapshot::default());
    }
    let c = comms.get_mut(key).expect("inserted");
    let charged = &mut p.comm_charged;
    c.oncpu_ns += totals.oncpu_ns.saturating_sub(charged.oncpu_ns);
    c.runq_wait_ns += totals.runq_wait_ns.saturating_sub(charged.runq_wait_ns);
    c.syscalls += totals.syscalls.saturating_sub(charged.syscalls);
    charged.oncpu_ns = charged.oncpu_ns.max(totals.oncpu_ns);
    charged.runq_wait_ns = charged.runq_wait_ns.max(totals.runq_wait_ns);
    charged.syscalls = charged.syscalls.max(totals.syscalls);
    c
}

fn cgroup_of(p: &Proc) -> String {
    match p.meta.as_ref().map(|m| m.cgroup.as_str()) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => "unknown".to_string(),
    }
}

/// A process's contribution to its cgroup's totals (`processes` left 0).
fn cgroup_totals(p: &Proc) -> snap::CgroupSnapshot {
    let t = p.totals();
    snap::CgroupSnapshot {
        cgroup: String::new(),
        processes: 0,
        oncpu_ns: t.oncpu_ns,
        offcpu_blocked_ns: t.offcpu_blocked_ns,
        offcpu_preempted_ns: t.offcpu_preempted_ns,
        runq_wait_ns: t.runq_wait_ns,
        syscalls: t.syscalls,
        syscall_time_ns: t.syscall_time_ns,
        block_read_bytes: t.block_read_bytes,
        block_write_bytes: t.block_write_bytes,
        net: net_snapshot(&p.net),
        workload: None,
    }
}

fn add_cgroup(a: &mut snap::CgroupSnapshot, b: &snap::CgroupSnapshot) {
    a.oncpu_ns += b.oncpu_ns;
    a.offcpu_blocked_ns += b.offcpu_blocked_ns;
    a.offcpu_preempted_ns += b.offcpu_preempted_ns;
    a.runq_wait_ns += b.runq_wait_ns;
    a.syscalls += b.syscalls;
    a.syscall_time_ns += b.syscall_time_ns;
    a.block_read_bytes += b.block_read_bytes;
    a.block_write_bytes += b.block_write_bytes;
    a.net.add(&b.net);
}

fn proc_key(tgid: u32, proc_start_ns: u64) -> ProcKey {
    ProcKey {
        tgid,
        _pad0: 0,
        proc_start_ns,
    }
}

fn net_snapshot(n: &RawNet) -> snap::NetStats {
    snap::NetStats {
        tcp_tx_bytes: n.tcp_tx_bytes,
        tcp_rx_bytes: n.tcp_rx_bytes,
        udp_tx_bytes: n.udp_tx_bytes,
        udp_rx_bytes: n.udp_rx_bytes,
        tcp_retransmits: n.tcp_retransmits,
        tcp_active_opens: n.tcp_active_opens,
        tcp_closes: n.tcp_closes,
        tcp_resets_sent: n.tcp_resets_sent,
        tcp_resets_received: n.tcp_resets_received,
    }
}

/// dev_t as the block tracepoints report it (MAJOR << 20 | MINOR) -> "major:minor".
pub fn dev_string(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & ((1 << 20) - 1))
}

/// Block device names from /sys/class/block/*/dev, keyed by the tracepoint dev_t encoding.
pub fn block_device_names() -> HashMap<u32, String> {
    let mut m = HashMap::new();
    let Ok(rd) = std::fs::read_dir("/sys/class/block") else {
        return m;
    };
    for e in rd.flatten() {
        let Ok(t) = std::fs::read_to_string(e.path().join("dev")) else {
            continue;
        };
        let Some((maj, min)) = t.trim().split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse::<u32>(), min.parse::<u32>()) else {
            continue;
        };
        m.insert(
            maj << 20 | min,
            e.file_name().to_string_lossy().into_owned(),
        );
    }
    m
}

/// What the process tree is built from.
pub struct TreeNode {
    pub pid: u32,
    pub ppid: u32,
    pub start_ns: u64,
    pub alive: bool,
}

/// The tree rooted at `root`: root first, then descendants breadth-first (by ppid). O(n)
/// with a children index: the pairwise scan it replaces took hundreds of milliseconds on a
/// node with thousands of processes.
pub fn tree_order_of(nodes: &[TreeNode], root: u32) -> Vec<usize> {
    let Some(r) = nodes
        .iter()
        .position(|p| p.pid == root && p.alive)
        .or_else(|| nodes.iter().position(|p| p.pid == root))
    else {
        return Vec::new();
    };
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (j, p) in nodes.iter().enumerate() {
        children.entry(p.ppid).or_default().push(j);
    }
    let mut seen = vec![false; nodes.len()];
    seen[r] = true;
    let mut out = vec![r];
    let mut i = 0;
    while i < out.len() {
        let parent = &nodes[out[i]];
        if let Some(kids) = children.get(&parent.pid) {
            for &j in kids {
                // A child started after its parent (guards against pid reuse of the parent).
                if !seen[j] && nodes[j].start_ns >= parent.start_ns {
                    seen[j] = true;
                    out.push(j);
                }
            }
        }
        i += 1;
    }
    out
}

impl Model {
    /// The processes of the tree rooted at `root`, root first (see [`tree_order_of`]), without
    /// building a snapshot of every process.
    pub fn tree_keys(&self, root: u32) -> Vec<ProcKey> {
        let procs: Vec<&Proc> = self.procs.values().map(|p| &**p).collect();
        let nodes: Vec<TreeNode> = procs
            .iter()
            .map(|p| TreeNode {
                pid: p.key.tgid,
                ppid: p.meta.as_ref().map_or(0, |m| m.ppid),
                start_ns: p.key.proc_start_ns,
                alive: p.alive,
            })
            .collect();
        tree_order_of(&nodes, root)
            .into_iter()
            .map(|i| procs[i].key)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn th(oncpu: u64, vol: u64, h0: u32) -> ThreadStats {
        let mut t = ThreadStats {
            tgid: 10,
            proc_start_ns: 5,
            oncpu_ns: oncpu,
            voluntary_switches: vol,
            ..Default::default()
        };
        t.runq_wait_hist[3] = h0;
        t
    }

    #[test]
    fn thread_counters_accumulate() {
        let mut a = ThreadAcc::default();
        a.update(&th(100, 1, 1), 0);
        a.update(&th(250, 3, 4), 0);
        let c = a.current();
        assert_eq!(c.oncpu_ns, 250);
        assert_eq!(c.voluntary_switches, 3);
        assert_eq!(c.runq_wait_hist[3], 4);
    }

    #[test]
    fn histogram_bucket_wrap() {
        let mut a = ThreadAcc::default();
        a.update(&th(100, 1, u32::MAX - 1), 0);
        // The u32 bucket wrapped: 3 more events.
        a.update(&th(200, 2, 1), 0);
        assert_eq!(a.current().runq_wait_hist[3], u64::from(u32::MAX - 1) + 3);
    }

    #[test]
    fn run_in_progress_counts_and_the_total_never_drops() {
        let mut a = ThreadAcc::default();
        a.update(&th(100, 1, 0), 0);
        // Running for 400 ns the entry does not hold yet.
        a.update(&th(100, 1, 0), 400);
        assert_eq!(a.current().oncpu_ns, 500);
        // Switched out: the kernel charged the run (to a tick's staleness of the /proc
        // reading, a little more or less than what was shown).
        a.update(&th(480, 2, 0), 0);
        assert_eq!(a.current().oncpu_ns, 500, "never lower than shown");
        a.update(&th(600, 3, 0), 0);
        assert_eq!(a.current().oncpu_ns, 600);
        // A new incarnation keeps what was shown.
        a.update(&th(0, 0, 0), 50);
        assert_eq!(a.current().oncpu_ns, 650);
    }

    #[test]
    fn recreated_entry_keeps_earlier_totals() {
        let mut a = ThreadAcc::default();
        a.update(&th(1000, 10, 5), 0);
        // ethand deleted the entry; the thread's last switch-out recreated it from zero.
        a.update(&th(0, 1, 0), 0);
        let c = a.current();
        assert_eq!(c.oncpu_ns, 1000);
        assert_eq!(c.voluntary_switches, 11);
        assert_eq!(c.runq_wait_hist[3], 5);
    }

    #[test]
    fn pid_reuse_never_merges() {
        let mut m = Model::new(1000, 60, 30, 100);
        let mut raw = RawRead::default();
        let mut a = th(500, 1, 0);
        a.proc_start_ns = 111;
        let mut b = th(700, 2, 0);
        b.proc_start_ns = 222; // same tgid 10, later start: a different process
        raw.threads = vec![(10, a), (11, b)];
        raw.syscalls = vec![
            (
                SyscallKey {
                    tgid: 10,
                    nr: 39,
                    proc_start_ns: 111,
                },
                RawSys {
                    count: 3,
                    errors: 0,
                    time_ns: 30,
                },
            ),
            (
                SyscallKey {
                    tgid: 10,
                    nr: 39,
                    proc_start_ns: 222,
                },
                RawSys {
                    count: 4,
                    errors: 1,
                    time_ns: 40,
                },
            ),
        ];
        m.ingest(&raw, 0);
        assert_eq!(m.procs.len(), 2);
        let pa = &m.procs[&ProcKey {
            tgid: 10,
            _pad0: 0,
            proc_start_ns: 111,
        }];
        let pb = &m.procs[&ProcKey {
            tgid: 10,
            _pad0: 0,
            proc_start_ns: 222,
        }];
        assert_eq!(pa.sched().oncpu_ns, 500);
        assert_eq!(pb.sched().oncpu_ns, 700);
        assert_eq!(pa.syscalls[&39].count, 3);
        assert_eq!(pb.syscalls[&39].count, 4);
    }

    #[test]
    fn exited_thread_folds_into_process_and_is_reclaimed() {
        let mut m = Model::new(1000, 60, 30, 100);
        let key = ProcKey {
            tgid: 10,
            _pad0: 0,
            proc_start_ns: 5,
        };
        let mut t = th(900, 4, 2);
        m.ingest(
            &RawRead {
                threads: vec![(12, t)],
                ..Default::default()
            },
            0,
        );
        t.flags = thread_flags::EXITED;
        t.oncpu_ns = 950;
        let r1 = m.ingest(
            &RawRead {
                threads: vec![(12, t)],
                ..Default::default()
            },
            1000,
        );
        assert!(
            r1.threads.is_empty(),
            "kept one more round for the final switch-out"
        );
        let r2 = m.ingest(
            &RawRead {
                threads: vec![(12, t)],
                ..Default::default()
            },
            2000,
        );
        assert_eq!(r2.threads, vec![(12, key)]);
        let p = &m.procs[&key];
        assert!(p.threads.is_empty());
        assert_eq!(p.sched().oncpu_ns, 950);
        assert_eq!(p.sched().runq_wait_hist[3], 2);
    }

    #[test]
    fn syscalls_flushed_after_release_add_to_the_final_counts() {
        // The test process stands in for the live process (start time 0: not checked), so
        // that reading its metadata does not find it gone.
        let mut m = Model::new(1000, 60, 30, 100);
        let me = std::process::id();
        let key = ProcKey {
            tgid: me,
            _pad0: 0,
            proc_start_ns: 0,
        };
        let read = |count, time_ns| RawRead {
            syscalls: vec![(
                SyscallKey {
                    tgid: me,
                    nr: 39,
                    proc_start_ns: 0,
                },
                RawSys {
                    count,
                    errors: 0,
                    time_ns,
                },
            )],
            ..Default::default()
        };
        m.ingest(&read(100, 1000), 0);
        m.on_exit(key, None);
        let r = m.ingest(&read(120, 1200), 1000);
        assert_eq!(r.procs, vec![key], "entries freed after the exit's read");
        // Another exiting thread's batch, flushed after that: a new entry holding only it.
        let r = m.ingest(&read(7, 70), 2000);
        assert_eq!(r.procs, vec![key], "the recreated entry is freed too");
        let s = m.procs[&key].syscalls[&39];
        assert_eq!((s.count, s.time_ns), (127, 1270));
        let r = m.ingest(&RawRead::default(), 3000);
        assert!(r.procs.is_empty());
        assert_eq!(m.procs[&key].syscalls[&39].count, 127);
        // The history has the calls of the exit's read and the late batch: windows see them.
        let w = m.window(&key, 10_000).expect("window");
        assert_eq!((w.duration_ms, w.syscalls), (3000, 27));
    }

    #[test]
    fn max_processes_overflow_is_counted() {
        let mut m = Model::new(1000, 60, 30, 1);
        let raw = RawRead {
            net: vec![
                (
                    ProcKey {
                        tgid: 1,
                        _pad0: 0,
                        proc_start_ns: 1,
                    },
                    RawNet::default(),
                ),
                (
                    ProcKey {
                        tgid: 2,
                        _pad0: 0,
                        proc_start_ns: 2,
                    },
                    RawNet::default(),
                ),
            ],
            ..Default::default()
        };
        m.ingest(&raw, 0);
        assert_eq!(m.procs.len(), 1);
        assert_eq!(m.overflow, 1);
    }

    /// Under churn at most `max_exited` exited processes stay for their grace period: the
    /// earliest exits leave first, their CPU stays in the cgroup totals.
    #[test]
    fn exited_processes_beyond_the_cap_leave_earliest_first() {
        let mut m = Model::new(1000, 60, 30, 10_000);
        m.max_exited = 3;
        // Pids above pid_max: never alive in /proc, so each exits at its first round.
        for (round, pid) in (4_999_000u32..4_999_010).enumerate() {
            let mut t = th(100, 1, 0);
            t.tgid = pid;
            t.proc_start_ns = u64::from(pid);
            m.ingest(
                &RawRead {
                    threads: vec![(pid, t)],
                    ..Default::default()
                },
                round as u64 * 1000,
            );
            assert!(m.procs.len() <= 3, "round {round}: {} kept", m.procs.len());
        }
        let mut kept: Vec<u32> = m.procs.keys().map(|k| k.tgid).collect();
        kept.sort();
        assert_eq!(kept, vec![4_999_007, 4_999_008, 4_999_009]);
        let cpu: u64 = m.cgroups().iter().map(|c| c.oncpu_ns).sum();
        assert_eq!(cpu, 10 * 100, "retired early, still counted");
    }

    /// A name's totals only grow: what a process did before exec stays with its old name,
    /// and what it does after goes to the new one; an exit counts once.
    #[test]
    fn comm_totals_follow_renames_and_only_grow() {
        let mut m = Model::new(1000, 60, 30, 100);
        let (pid, start) = (4_999_100u32, 77u64);
        let key = ProcKey {
            tgid: pid,
            _pad0: 0,
            proc_start_ns: start,
        };
        let read = |oncpu: u64| {
            let mut t = th(oncpu, 1, 0);
            t.tgid = pid;
            t.proc_start_ns = start;
            RawRead {
                threads: vec![(pid, t)],
                ..Default::default()
            }
        };
        m.ingest(&read(100), 0);
        m.procs.get_mut(&key).expect("tracked").comm_fallback = "bash".into();
        m.ingest(&read(300), 1000);
        let by_name = |m: &Model| -> BTreeMap<String, (u64, u64)> {
            m.comms()
                .into_iter()
                .map(|c| (c.comm, (c.oncpu_ns, c.exited)))
                .collect()
        };
        // The first 100 ns were charged before it had a name.
        assert_eq!(by_name(&m).get("bash"), Some(&(200, 0)));
        m.procs.get_mut(&key).expect("tracked").comm_fallback = "python3".into();
        m.ingest(&read(1300), 2000);
        let names = by_name(&m);
        assert_eq!(names.get("bash"), Some(&(200, 0)), "{names:?}");
        assert_eq!(names.get("python3"), Some(&(1000, 0)), "{names:?}");
        // Gone from the model (exited; no room for exited ones): counted once as exited,
        // totals kept.
        m.max_exited = 0;
        for t in 3..6 {
            m.ingest(&RawRead::default(), t * 1000);
        }
        assert!(m.procs.is_empty());
        let names = by_name(&m);
        assert_eq!(names.get("python3"), Some(&(1000, 1)), "{names:?}");
        assert_eq!(names.get("bash"), Some(&(200, 0)));
    }

    /// Names beyond COMMS_MAX are summed under COMM_OTHER.
    #[test]
    fn comm_names_are_bounded() {
        let mut m = Model::new(1000, 60, 30, 10_000);
        let mut threads = Vec::new();
        for i in 0..(snap::COMMS_MAX as u32 + 10) {
            let pid = 4_990_000 + i;
            let mut t = th(10, 1, 0);
            t.tgid = pid;
            t.proc_start_ns = u64::from(pid);
            threads.push((pid, t));
        }
        m.ingest(&RawRead::default(), 0);
        for (pid, t) in &threads {
            let key = proc_key(*pid, t.proc_start_ns);
            let mut p = Proc::new(key);
            p.comm_fallback = format!("name{pid}");
            m.procs.insert(key, Box::new(p));
        }
        m.ingest(
            &RawRead {
                threads,
                ..Default::default()
            },
            1000,
        );
        let comms = m.comms();
        assert_eq!(comms.len(), snap::COMMS_MAX + 1);
        let other = comms
            .iter()
            .find(|c| c.comm == snap::COMM_OTHER)
            .expect("other");
        assert_eq!((other.processes, other.oncpu_ns), (10, 100));
    }

    #[test]
    fn cgroup_totals_survive_reclaim() {
        // Grace of 1 s at a 1 s interval. The test process itself stands in for a live
        // process (start time 0: not checked) so that its /proc metadata can be read.
        let mut m = Model::new(1000, 60, 1, 100);
        let me = std::process::id();
        let key = ProcKey {
            tgid: me,
            _pad0: 0,
            proc_start_ns: 0,
        };
        let mut t = th(4000, 1, 0);
        t.tgid = me;
        t.proc_start_ns = 0;
        m.ingest(
            &RawRead {
                threads: vec![(me, t)],
                ..Default::default()
            },
            0,
        );
        let before: u64 = m.cgroups().iter().map(|c| c.oncpu_ns).sum();
        assert_eq!(before, 4000);
        m.on_exit(key, None);
        // Visible for the round that sees the exit, then for one interval of grace; its
        // kernel entries are freed at once (the read of that round holds its final values).
        let r = m.ingest(&RawRead::default(), 1000);
        assert_eq!(
            r.procs,
            vec![key],
            "kernel entries freed once the exit is ingested"
        );
        assert!(!m.procs[&key].alive);
        let r = m.ingest(&RawRead::default(), 2000);
        assert!(r.procs.is_empty(), "not freed twice");
        assert!(m.procs.is_empty());
        let after: Vec<_> = m.cgroups();
        assert_eq!(
            after.iter().map(|c| c.oncpu_ns).sum::<u64>(),
            4000,
            "the counter must not go down"
        );
        assert_eq!(after.iter().map(|c| c.processes).sum::<u64>(), 0);
    }

    #[test]
    fn process_gone_before_first_look_is_reclaimed() {
        // A pid that cannot exist (above pid_max): its metadata can never be read.
        let mut m = Model::new(1000, 60, 1, 100);
        let key = ProcKey {
            tgid: 4_999_999,
            _pad0: 0,
            proc_start_ns: 77,
        };
        let mut t = th(10, 1, 0);
        t.tgid = key.tgid;
        t.proc_start_ns = key.proc_start_ns;
        let r = m.ingest(
            &RawRead {
                threads: vec![(4_999_999, t)],
                ..Default::default()
            },
            0,
        );
        assert!(!m.procs[&key].alive);
        assert_eq!(r.procs, vec![key], "its kernel entries are freed at once");
        m.ingest(&RawRead::default(), 1000);
        assert!(
            !m.procs.contains_key(&key),
            "dropped from the model after the grace period, not kept forever"
        );
    }

    #[test]
    fn thinned_history_keeps_the_values_at_kept_rounds() {
        // A point every second for 100 s, the value changing every round; rounds alike.
        let (mut h, mut rounds) = (Thinned::default(), Thinned::default());
        for t in (0..=100_000u64).step_by(1000) {
            h.push(t, t * 3);
            rounds.push(t, ());
            h.thin(t, 60_000);
            rounds.thin(t, 60_000);
        }
        let times: Vec<u64> = rounds.points.iter().map(|(t, _)| *t).collect();
        // Full resolution for the last 30 s, one per 10 s bucket before, back to the
        // horizon (40 s) and the one point at or before it.
        assert_eq!(times.iter().filter(|&&t| t >= 70_000).count(), 31);
        assert_eq!(
            &times[..4],
            &[39_000, 49_000, 59_000, 69_000],
            "older points thinned to the last of each 10 s"
        );
        for &t in &times {
            assert_eq!(h.at(t), Some(&(t * 3)), "value at kept round {t}");
        }
        assert_eq!(h.at(38_999), None, "nothing before the horizon point");
    }

    #[test]
    fn unchanged_totals_hold_their_value_between_points() {
        let mut h: Thinned<u64> = Thinned::default();
        h.push(1000, 5);
        h.push(9000, 7);
        assert_eq!(h.at(500), None);
        assert_eq!(h.at(1000), Some(&5));
        assert_eq!(h.at(8999), Some(&5));
        assert_eq!(h.at(20_000), Some(&7));
    }

    #[test]
    fn tree_order_is_breadth_first_and_guards_pid_reuse() {
        let n = |pid, ppid, start_ns| TreeNode {
            pid,
            ppid,
            start_ns,
            alive: true,
        };
        let nodes = vec![
            n(30, 20, 300),
            n(10, 1, 100),
            n(20, 10, 200),
            n(21, 10, 210),
            // Claims parent 10 but started before it: a reused pid's old child.
            n(40, 10, 50),
            n(99, 1, 5),
        ];
        let order: Vec<u32> = tree_order_of(&nodes, 10)
            .into_iter()
            .map(|i| nodes[i].pid)
            .collect();
        assert_eq!(order, vec![10, 20, 21, 30]);
        assert!(tree_order_of(&nodes, 12345).is_empty());
    }

    #[test]
    fn dev_encoding() {
        assert_eq!(dev_string(254 << 20), "254:0");
        assert_eq!(dev_string((8 << 20) | 17), "8:17");
    }
}
