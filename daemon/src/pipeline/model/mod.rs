//! The daemon's state: one entry per process (keyed by pid + start time), fed with the raw
//! kernel map contents every interval. Kernel counters are cumulative per thread / process;
//! this module turns them into process totals that survive thread exits and map reclaiming,
//! and keeps a short history ring for "what happened in the last N seconds".
//!
//! `process.rs`: one process and its sums; `history.rs`: its totals over time; `view.rs`: the
//! snapshots built from the model; this file: the model and its round-by-round ingest.
use std::collections::{BTreeMap, HashMap, HashSet};

use ethand_common::{
    BlkKey, BlkStats as RawBlk, GpuCallKey, GpuCallStats, GpuProcState, GpuSiteKey, GpuSiteStats,
    HIST_BUCKETS, Hist, NetStats as RawNet, ProcKey, SyscallHistKey, SyscallKey,
    SyscallStats as RawSys, ThreadStats, blk_op, syscall_class, thread_flags,
};
use ethand_snapshot as snap;

use crate::pipeline::{procinfo, syscalls_table};

mod history;
pub mod memory;
mod process;
#[cfg(test)]
mod tests;
mod view;

pub use history::Totals;
use history::{COARSE_MS, FINE_MS, History, Thinned};
use process::*;
pub use process::{Proc, SchedAcc, ThreadAcc};
pub use view::{TreeNode, block_device_names, dev_string, tree_order_of};

/// mmap(2): a process that maps a library calls it (dlopen), so its count moving is the
/// hint to look at the process's mappings again.
const MMAP_NR: u32 = libc::SYS_mmap as u32;

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
    pub gpu_sites: Vec<(GpuSiteKey, GpuSiteStats)>,
    /// The user stacks call sites refer to, by `GPU_STACKS` id (kept between reads: only
    /// new ids are read).
    pub gpu_stacks: HashMap<u32, crate::pipeline::gpu::sites::Stack>,
    /// `gpu_stacks` changed in this read.
    pub gpu_stacks_changed: bool,
    /// On-CPU time of runs in progress that `threads` does not hold yet (tid -> ns): the
    /// kernel charges a run at its switch-out, and a thread alone on its CPU may not be
    /// switched out for seconds.
    pub running_oncpu: HashMap<u32, u64>,
    /// The threads on a CPU at the read (`CPU_CTX.running_tid`, one per CPU).
    pub running: HashSet<u32>,
}

/// What the collector must delete from the kernel maps after an ingest.
#[derive(Default, Debug)]
pub struct Reclaim {
    /// Thread entries to delete, with the process they must still belong to (a tid can be
    /// reused by another process by the time the collector deletes).
    pub threads: Vec<(u32, ProcKey)>,
    pub procs: Vec<ProcKey>,
}

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
    departed_cgroups: HashMap<String, CgroupSeries>,
    /// Totals of processes of cgroups beyond `max_cgroups`, once those cgroups' series
    /// ended: "[other cgroups]" only grows.
    other_cgroups_departed: snap::CgroupSnapshot,
    /// How long a cgroup keeps its series after its last process left (ms).
    pub cgroup_hold_ms: u64,
    /// Most cgroups with series of their own; later ones are summed in "[other cgroups]".
    pub max_cgroups: usize,
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
    /// The user stacks of GPU call sites, by `GPU_STACKS` id (as of the last read).
    pub gpu_stacks: HashMap<u32, crate::pipeline::gpu::sites::Stack>,
    /// Call sites symbolized when a snapshot was built, kept per (process, stack).
    pub site_cache: std::sync::Arc<std::sync::Mutex<crate::pipeline::gpu::sites::SiteCache>>,
    /// The Python frames of GPU calls (stacks and code objects), shared with the walker.
    pub py_frames: std::sync::Arc<std::sync::Mutex<crate::pipeline::gpu::python::PyFrames>>,
    /// Processes whose on-CPU time moved in the last ingest: due a memory sample
    /// (`memory.rs`).
    memory_ran: Vec<ProcKey>,
}

/// One cgroup's series: the totals of its processes that left the model, when it last had a
/// process, and whether it is summed in "[other cgroups]" (seen when `max_cgroups` had
/// series already; it stays there for its whole life, so that no counter goes down).
#[derive(Clone, Debug, Default)]
pub(super) struct CgroupSeries {
    pub departed: snap::CgroupSnapshot,
    pub last_live_ms: u64,
    pub other: bool,
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
            gpu_stacks: HashMap::new(),
            site_cache: Default::default(),
            py_frames: Default::default(),
            memory_ran: Vec::new(),
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
            other_cgroups_departed: snap::CgroupSnapshot::default(),
            cgroup_hold_ms: 300_000,
            max_cgroups: 1000,
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
        self.py_frames
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .on_exec(key);
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
        // Thread entries new this round: their names are read once the processes' are.
        let new_threads = self.ingest_threads(raw, &mut reclaim);
        self.ingest_syscalls(raw, &mut reclaim);
        self.ingest_counters(raw);
        self.refresh_meta(&new_threads);
        self.check_liveness();
        // Untracked processes that exited: nothing of theirs is kept, free their entries.
        self.untracked.retain(|k, exited| {
            if *exited {
                reclaim.procs.push(*k);
            }
            !*exited
        });
        self.advance_history(now_unix_ms, &mut reclaim);
        self.hold_cgroups(now_unix_ms);
        reclaim
    }

    /// Threads' scheduler counters; returns the threads new this round. A thread seen exited
    /// twice is folded into its process's dead total and freed.
    fn ingest_threads(&mut self, raw: &RawRead, reclaim: &mut Reclaim) -> Vec<(ProcKey, u32)> {
        let mut untracked_exited = HashSet::new();
        let mut new_threads: Vec<(ProcKey, u32)> = Vec::new();
        let prev_round_ms = self.rounds.last().map_or(0, |(t, _)| *t);
        let now_ms = self.now_unix_ms;
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
                let out_before = acc.last.switch_out_ns;
                acc.update(t, raw.running_oncpu.get(tid).copied().unwrap_or(0));
                acc.note_read(out_before, raw.running.contains(tid), now_ms, prev_round_ms);
                // Deleted once seen exited twice: by then its final switch-out has been
                // counted.
                if acc.exited_reads >= 2 {
                    let done = p.threads.remove(tid).expect("present");
                    p.dead.add(&done.current());
                    reclaim.threads.push((*tid, key));
                }
            }
        }
        self.untracked_exited_threads = untracked_exited;
        new_threads
    }

    /// Syscall counts per process and number; an mmap count that moved marks the process's
    /// mappings as changed.
    fn ingest_syscalls(&mut self, raw: &RawRead, reclaim: &mut Reclaim) {
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
    }

    /// Latency histograms, block, network and GPU counters, and the GPU stacks.
    fn ingest_counters(&mut self, raw: &RawRead) {
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
        for &(k, v) in &raw.gpu_sites {
            if let Some(p) = self.proc_mut(proc_key(k.tgid, k.proc_start_ns)) {
                p.gpu_sites
                    .insert((k.op as u16, k.stack_id, k.caller, k.py_stack), v);
            }
        }
        if raw.gpu_stacks_changed {
            self.gpu_stacks = raw.gpu_stacks.clone();
        }
        if self.round.is_multiple_of(60) {
            let procs = &self.procs;
            self.site_cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|pid, start| procs.contains_key(&proc_key(pid, start)));
            // Kept after an exit as long as the process is (its sites still name them).
            self.py_frames
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|k| procs.contains_key(k));
        }
    }

    /// Processes that are gone: exited long enough ago, or vanished without an exit event.
    fn check_liveness(&mut self) {
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
    }

    /// Appends this round to every process's history, and expires, releases and thins.
    fn advance_history(&mut self, now_unix_ms: u64, reclaim: &mut Reclaim) {
        let round = self.round;
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
                if p.alive
                    && p.history
                        .last()
                        .is_none_or(|(_, v)| v.oncpu_ns != totals.oncpu_ns)
                {
                    self.memory_ran.push(p.key);
                }
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
            self.retire(k, reclaim);
        }
        // Again with this round's exits counted: between rounds the model holds at most
        // max_exited exited processes, whatever the birth rate.
        self.make_room(reclaim, false);
    }

    /// Enters every cgroup that has a process now (with a series of its own while fewer than
    /// `max_cgroups` have one, else in "[other cgroups]") and ends the series of those that
    /// have had none for `cgroup_hold_ms`: cgroups made and removed by the thousand (jobs,
    /// pods, a user's delegated subtree) leave /metrics, as the processes that left them.
    fn hold_cgroups(&mut self, now_ms: u64) {
        let mut own = self.departed_cgroups.values().filter(|c| !c.other).count();
        for p in self.procs.values() {
            let name = cgroup_of(p);
            match self.departed_cgroups.get_mut(&name) {
                Some(c) => c.last_live_ms = now_ms,
                None => {
                    let other = own >= self.max_cgroups;
                    own += usize::from(!other);
                    self.departed_cgroups.insert(
                        name,
                        CgroupSeries {
                            last_live_ms: now_ms,
                            other,
                            ..CgroupSeries::default()
                        },
                    );
                }
            }
        }
        let hold = self.cgroup_hold_ms;
        let other = &mut self.other_cgroups_departed;
        self.departed_cgroups.retain(|_, c| {
            let keep = now_ms.saturating_sub(c.last_live_ms) <= hold;
            if !keep && c.other {
                add_cgroup(other, &c.departed);
            }
            keep
        });
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
        let now = self.now_unix_ms;
        let own = self.departed_cgroups.values().filter(|c| !c.other).count();
        let max = self.max_cgroups;
        let cg = self
            .departed_cgroups
            .entry(cgroup_of(p))
            .or_insert_with(|| CgroupSeries {
                last_live_ms: now,
                other: own >= max,
                ..CgroupSeries::default()
            });
        let snap = cgroup_totals(p);
        add_cgroup(&mut cg.departed, &snap);
        for (k, b) in &p.blk {
            add_blk(self.departed_blk.entry(*k).or_default(), b);
        }
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
}

fn proc_key(tgid: u32, proc_start_ns: u64) -> ProcKey {
    ProcKey {
        tgid,
        _pad0: 0,
        proc_start_ns,
    }
}
