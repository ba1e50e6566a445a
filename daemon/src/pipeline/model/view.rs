//! What the model shows: process, tree, cgroup, name and block-device snapshots, the
//! "recent" windows and timelines, and the process tree's order.
use super::*;

impl Model {
    /// Per cgroup totals: processes in the model plus departed ones.
    /// Per cgroup totals: every cgroup with a process, and those whose last one left within
    /// `cgroup_hold_ms`; beyond `max_cgroups` of them, the rest summed in
    /// [`snap::CGROUP_OTHER`].
    pub fn cgroups(&self) -> Vec<snap::CgroupSnapshot> {
        let mut m: BTreeMap<String, snap::CgroupSnapshot> = self
            .departed_cgroups
            .iter()
            .filter(|(_, c)| !c.other)
            .map(|(k, c)| (k.clone(), c.departed.clone()))
            .collect();
        let mut other = self.other_cgroups_departed.clone();
        let mut other_seen = other != snap::CgroupSnapshot::default();
        for c in self.departed_cgroups.values().filter(|c| c.other) {
            add_cgroup(&mut other, &c.departed);
            other_seen = true;
        }
        let mut own = m.len();
        for p in self.procs.values() {
            let name = cgroup_of(p);
            // A cgroup new since the last round is placed as the next round will place it.
            let to_other = match self.departed_cgroups.get(&name) {
                Some(c) => c.other,
                None => !m.contains_key(&name) && own >= self.max_cgroups,
            };
            let cg = if to_other {
                other_seen = true;
                &mut other
            } else {
                own += usize::from(!m.contains_key(&name));
                m.entry(name).or_default()
            };
            add_cgroup(cg, &cgroup_totals(p));
            cg.processes += 1;
        }
        if other_seen {
            m.insert(snap::CGROUP_OTHER.to_string(), other);
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

    /// The round whose point starts the window of `window_ms` ending at `now_ms`: the one
    /// nearest to `now_ms - window_ms` (rounds come once per interval, with jitter; beyond
    /// FINE_MS only one per COARSE_MS is kept), else the earliest one there is.
    fn window_start_ms(&self, now_ms: u64, window_ms: u64) -> Option<u64> {
        let target = now_ms.saturating_sub(window_ms);
        let pts = &self.rounds.points;
        let after = pts.partition_point(|(t, _)| *t < target);
        let before = after.checked_sub(1).map(|i| pts[i].0);
        let at_or_after = pts.get(after).map(|(t, _)| *t);
        match (before, at_or_after) {
            (Some(b), Some(a)) if target - b <= a - target => Some(b),
            (_, Some(a)) => Some(a),
            (b, None) => b,
        }
    }

    /// The off-CPU spans of `p`'s threads in progress at the last read, from `from_ms` to
    /// `to_ms` (ns): blocked, and preempted (waiting for a CPU). The kernel accounts an
    /// off-CPU span when the thread runs again, so a thread blocked through the whole window
    /// would otherwise show none of it. Added to windows only, never to the history or the
    /// counters: when the wait ends the kernel's figure covers it exactly.
    fn open_off_cpu_ns(&self, p: &Proc, from_ms: u64, to_ms: u64) -> (u64, u64) {
        let mut open = (0, 0);
        for t in p.threads.values() {
            let Some((since, blocked)) = t.off_cpu_since_ms(self.unix_minus_mono_ms) else {
                continue;
            };
            let ns = to_ms.saturating_sub(since.max(from_ms)) * 1_000_000;
            if blocked {
                open.0 += ns;
            } else {
                open.1 += ns;
            }
        }
        open
    }

    /// How long the window of the snapshot of `keys` falls short of `window_ms` and why, when
    /// it does by more than a round's jitter (None when it is what was asked).
    pub fn window_note(&self, keys: &[ProcKey], window_ms: u64) -> Option<String> {
        let &(now_ms, _) = self.rounds.last()?;
        let then_ms = self.window_start_ms(now_ms, window_ms)?;
        let born_ms = keys
            .iter()
            .filter_map(|k| self.unix_ms_of_mono_ns(k.proc_start_ns))
            .min()
            .unwrap_or(0);
        let span = now_ms - then_ms.max(born_ms.min(now_ms));
        let asked = format!("{:.1} s asked", window_ms as f64 / 1000.0);
        let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
        let first = self.rounds.points.front().map_or(now_ms, |(t, _)| *t);
        if span.abs_diff(window_ms) < 100 {
            None
        } else if born_ms > then_ms && born_ms > now_ms.saturating_sub(window_ms) {
            Some(format!(
                "{asked}: the tree's processes started {} ago",
                secs(now_ms - born_ms)
            ))
        } else if first >= now_ms.saturating_sub(window_ms) {
            Some(format!(
                "{asked}: ethand has collected for {}",
                secs(now_ms - first)
            ))
        } else {
            Some(format!(
                "{asked}: beyond {} s ethand keeps one point per {} s",
                FINE_MS / 1000,
                COARSE_MS / 1000
            ))
        }
    }

    /// Change of the totals of `key` over the last `window_ms` (None without history), with
    /// the off-CPU spans in progress added.
    pub(super) fn window(&self, key: &ProcKey, window_ms: u64) -> Option<snap::WindowStats> {
        let (now_ms, _) = *self.rounds.last()?;
        let p = self.procs.get(key)?;
        let cur = p.history.at(now_ms)?;
        let then_ms = self.window_start_ms(now_ms, window_ms)?;
        // A process first seen after the window started counts from zero, and its window
        // starts at its birth: rates over a span before it was born would be diluted.
        let old = p.history.at(then_ms).copied().unwrap_or_default();
        let born_ms = self.unix_ms_of_mono_ns(p.key.proc_start_ns);
        let then_ms = match born_ms {
            Some(b) if b > then_ms => b.min(now_ms),
            _ => then_ms,
        };
        let (open_blocked, open_preempted) = if p.alive {
            self.open_off_cpu_ns(p, then_ms, now_ms)
        } else {
            (0, 0)
        };
        let d = cur.since(&old);
        Some(snap::WindowStats {
            duration_ms: now_ms - then_ms,
            oncpu_ns: d.oncpu_ns,
            offcpu_blocked_ns: d.offcpu_blocked_ns + open_blocked,
            offcpu_preempted_ns: d.offcpu_preempted_ns + open_preempted,
            // A preempted thread off its CPU is waiting for one throughout.
            runq_wait_ns: d.runq_wait_ns + open_preempted,
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
            io_read_syscall_ns: Some(d.io_read_syscall_ns),
            io_write_syscall_ns: Some(d.io_write_syscall_ns),
            gpu_copy_h2d_bytes: d.gpu_copy_h2d_bytes,
            gpu_copy_d2h_bytes: d.gpu_copy_d2h_bytes,
            gpu_copy_other_bytes: d.gpu_copy_other_bytes,
            collective_calls: d.collective_calls,
            collective_ns: d.collective_ns,
            gpu_memory_growth_bytes: d.gpu_memory_live_bytes,
            gpu_blocking_frees: Some(d.gpu_blocking_frees),
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
        // Off-CPU spans in progress (see `open_off_cpu_ns`): each interval holds its part.
        let open: Vec<(u64, bool)> = keys
            .iter()
            .filter_map(|k| self.procs.get(k))
            .filter(|p| p.alive)
            .flat_map(|p| p.threads.values())
            .filter_map(|t| t.off_cpu_since_ms(self.unix_minus_mono_ms))
            .collect();
        let open_in = |t0: u64, t1: u64, blocked: bool| -> u64 {
            open.iter()
                .filter(|(_, b)| *b == blocked)
                .map(|(since, _)| t1.saturating_sub((*since).max(t0)) * 1_000_000)
                .sum()
        };
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
                    offcpu_blocked_ns: d.offcpu_blocked_ns + open_in(t0, t1, true),
                    runq_wait_ns: d.runq_wait_ns + open_in(t0, t1, false),
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

    /// What the call sites of `p` are made from (None: no probed call took a stack).
    pub fn site_inputs(&self, p: &Proc) -> Option<crate::pipeline::gpu::sites::SiteInputs> {
        let start_ticks = p.meta.as_ref().map(|m| m.start_ticks).filter(|t| *t > 0);
        crate::pipeline::gpu::sites::SiteInputs::new(
            p.key,
            start_ticks,
            &p.gpu_sites,
            &self.gpu_stacks,
        )
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
            .map(|(&(dev, op), b)| blk_snapshot(dev, op, b, devnames))
            .collect();
        // Call sites are named later, outside the model lock, for tree snapshots only
        // (`Model::site_inputs`).
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
            gpu_xid_events: Vec::new(),
            window: self.window(&p.key, window_ms),
            swap_bytes: None,
            major_faults: None,
            cpus_allowed: None,
            cpu_quota_cores: None,
            proc_write_bytes: None,
            memory: self.memory_snapshot(p, window_ms),
        }
    }

    /// A live process's memory as last sampled, with its window; None when never sampled or
    /// exited (its last figures are no longer true).
    fn memory_snapshot(&self, p: &Proc, window_ms: u64) -> Option<snap::memory::ProcessMemory> {
        let (now_ms, _) = *self.rounds.last()?;
        let m = p.memory.as_ref().filter(|_| p.alive)?;
        Some(m.snapshot(now_ms.saturating_sub(window_ms), now_ms))
    }

    /// The processes outside `tree` that used the most CPU over the window (busiest first,
    /// at most `MAX_NEIGHBOURS`), and all of them together in cores. One pass over the
    /// model's processes, for a tree snapshot.
    pub fn neighbours(&self, tree: &[ProcKey], window_ms: u64) -> (Vec<snap::CpuNeighbour>, f64) {
        let secs = window_ms as f64 / 1000.0;
        if secs <= 0.0 {
            return (Vec::new(), 0.0);
        }
        let mut all: Vec<(f64, &Proc)> = self
            .procs
            .values()
            .filter(|p| !tree.contains(&p.key))
            .filter_map(|p| {
                let w = self.window(&p.key, window_ms)?;
                (w.oncpu_ns > 0).then(|| (w.oncpu_ns as f64 / 1e9 / secs, &**p))
            })
            .collect();
        let total = all.iter().map(|(c, _)| c).sum();
        all.sort_by(|a, b| b.0.total_cmp(&a.0));
        let top = all
            .into_iter()
            .take(snap::MAX_NEIGHBOURS)
            .map(|(cores, p)| {
                let meta = p.meta.as_ref();
                snap::CpuNeighbour {
                    pid: p.key.tgid,
                    comm: match meta {
                        Some(m) if !m.comm.is_empty() => m.comm.clone(),
                        _ => p.comm_fallback.clone(),
                    },
                    cgroup: meta.map(|m| m.cgroup.clone()).unwrap_or_default(),
                    cores,
                    cpus_allowed: None,
                }
            })
            .collect();
        (top, total)
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
