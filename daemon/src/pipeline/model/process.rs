//! One process in the model: its threads' scheduler figures (absorbing recreated entries and
//! histogram wrap), syscalls, block IO, network and GPU counters, its [`Totals`], and what it
//! adds to its name's, cgroup's and block devices' sums.
use super::*;
use crate::pipeline::syscalls_table::IoDirection;

/// What a process has added to its name's totals (`Model::comms`) so far.
#[derive(Clone, Copy, Debug, Default)]
struct CommCharged {
    oncpu_ns: u64,
    runq_wait_ns: u64,
    syscalls: u64,
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
    pub(super) fn add(&mut self, o: &SchedAcc) {
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

    pub(super) fn to_snapshot(&self) -> snap::SchedStats {
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
    pub(super) last: ThreadStats,
    /// Histogram accumulated from wrapping deltas of `last.runq_wait_hist`.
    hist: [u64; HIST_BUCKETS],
    /// On-CPU time of this incarnation shown so far: `last.oncpu_ns` plus the run in
    /// progress at the last read, never lower than at an earlier read (a counter).
    oncpu_shown_ns: u64,
    pub exited: bool,
    /// Consecutive reads that found the entry marked exited.
    pub(super) exited_reads: u32,
    /// Wall clock (ms) of the read that first held the current `last.switch_out_ns`, and of
    /// the read before it: the switch-out happened between the two.
    out_seen_ms: u64,
    out_prev_ms: u64,
    /// On a CPU at the last read (`CPU_CTX.running_tid`).
    running: bool,
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

    /// Notes when this read found the entry (`out_before`: its switch-out time at the
    /// previous read; `prev_ms`: that read's wall clock) and whether the thread was on a CPU.
    pub(super) fn note_read(&mut self, out_before: u64, running: bool, now_ms: u64, prev_ms: u64) {
        if self.last.switch_out_ns != out_before || self.out_seen_ms == 0 {
            self.out_seen_ms = now_ms;
            self.out_prev_ms = prev_ms;
        }
        self.running = running;
    }

    /// The off-CPU span in progress at the last read, which the kernel accounts only when
    /// the thread next runs: when it began (wall ms) and whether it began with the thread
    /// blocking (else a preemption). None for a thread on a CPU or exited. The switch-out
    /// is stamped by the run queue's clock, which may drift from CLOCK_MONOTONIC
    /// (`unix_minus_mono_ms`): the estimate is held between the two reads it fell between.
    pub(super) fn off_cpu_since_ms(&self, unix_minus_mono_ms: i64) -> Option<(u64, bool)> {
        let out = self.last.switch_out_ns;
        if self.exited || self.running || out == 0 || self.last.switch_in_ns != 0 {
            return None;
        }
        let est = (unix_minus_mono_ms + (out / 1_000_000) as i64).max(0) as u64;
        let since = est.clamp(self.out_prev_ms, self.out_seen_ms.max(self.out_prev_ms));
        Some((since, self.last.flags & thread_flags::BLOCKED != 0))
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
    /// Per call site (see [`SiteId`](crate::pipeline::gpu::sites::SiteId)): calls from each
    /// (cumulative).
    pub gpu_sites: BTreeMap<crate::pipeline::gpu::sites::SiteId, ethand_common::GpuSiteStats>,
    /// Metadata must be (re)read: first sight or exec.
    pub meta_stale: bool,
    /// Totals over time, for the snapshot windows and timelines.
    pub(super) history: History,
    /// Its kernel map entries were deleted (after its exit was ingested): the model holds
    /// the final values.
    pub(super) kernel_released: bool,
    /// A map entry of it was read this round: its totals may have moved (a history point
    /// is due). Idle and released processes are not summed again.
    pub(super) read_this_round: bool,
    /// CPU, run-queue wait and syscalls already added to its name's totals (`Model::comms`):
    /// each round adds what came since, so a name's totals only grow, even when exec renames
    /// the process.
    comm_charged: CommCharged,
    /// Host memory readings and samples (`memory.rs`); None until first sampled.
    pub(super) memory: Option<Box<super::memory::ProcMemory>>,
}

impl Proc {
    pub(super) fn new(key: ProcKey) -> Self {
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
            gpu_sites: BTreeMap::new(),
            history: History::default(),
            kernel_released: false,
            read_this_round: false,
            meta_stale: true,
            comm_charged: CommCharged::default(),
            memory: None,
        }
    }

    /// Once its final counters are in (exited, kernel entries released), spare capacity
    /// goes, so that thousands kept for the grace period cost little. (Its exited threads
    /// fold into `dead` as usual, after their second exited read.)
    pub(super) fn compact(&mut self) {
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
    pub(super) fn totals(&self) -> Totals {
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
        for (nr, v) in &self.syscalls {
            t.syscalls += v.count;
            t.syscall_time_ns += v.time_ns;
            match crate::pipeline::syscalls_table::io_direction(*nr) {
                Some(IoDirection::Read) => t.io_read_syscall_ns += v.time_ns,
                Some(IoDirection::Write) => t.io_write_syscall_ns += v.time_ns,
                None => {}
            }
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
                // Frees back to the driver; the stream-ordered ones return to a pool.
                Category::Free if !spec.name.contains("Async") => t.gpu_blocking_frees += c.calls,
                _ => {}
            }
        }
        t
    }
}

pub(super) fn blk_snapshot(
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

pub(super) fn add_blk(a: &mut RawBlk, b: &RawBlk) {
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
pub(super) fn comm_of(p: &Proc) -> &str {
    match p.meta.as_ref().map(|m| m.comm.as_str()) {
        Some(c) if !c.is_empty() => c,
        _ => &p.comm_fallback,
    }
}

/// Adds what `p` did since its last charge (`totals` its totals now) to its name's totals,
/// which are made for at most COMMS_MAX names (later names go to COMM_OTHER), and returns
/// them.
pub(super) fn charge_comm<'a>(
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

pub(super) fn cgroup_of(p: &Proc) -> String {
    match p.meta.as_ref().map(|m| m.cgroup.as_str()) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => "unknown".to_string(),
    }
}

/// A process's contribution to its cgroup's totals (`processes` left 0).
pub(super) fn cgroup_totals(p: &Proc) -> snap::CgroupSnapshot {
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

pub(super) fn add_cgroup(a: &mut snap::CgroupSnapshot, b: &snap::CgroupSnapshot) {
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

pub(super) fn net_snapshot(n: &RawNet) -> snap::NetStats {
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
