//! The native CPU profile of a snapshot: while the snapshot samples a tree's Python frames,
//! a CPU-clock perf event on every CPU (`profile_cpu`, `diagnosis.cpu_profile_hz`) counts the
//! tree's threads at their user and kernel stacks, and a sched_switch program
//! (`profile_switch`) counts each wait of at least `diagnosis.offcpu_min_us` at the stacks the
//! thread blocked with (ebpf/ethand-ebpf/src/profile.rs). Both are attached for the window
//! and detached after; the collection loop, which owns the programs, starts and ends a
//! profile ([`CpuProfiler::tick`]); the snapshot's thread symbolizes ([`build`]).
//!
//! Profiles of disjoint trees may overlap; a second profile of a process being profiled is
//! refused with a note (the counts could not be told apart).
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap},
    programs::{
        BtfTracePoint, PerfEvent, ProgramError,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
        tp_btf::BtfTracePointLinkId,
    },
};
use ethand_common::{
    PROFILE_NO_STACK, ProfileCount, ProfileKey, ProfileOff, profile_drop, profile_kind,
};
use ethand_snapshot::stacks::{
    CallSite, CpuProfile, CpuThreadProfile, Frame, FrameKind, FrameShare, MAX_FOLDED, MAX_FRAMES,
    MAX_SITES, Share, fold,
};
use tracing::{debug, warn};

use crate::pipeline::{
    bpf_error::{MapSetupError, error_chain, take_map},
    procinfo::{self, monotonic_ns, unix_ms},
    reader::ReaderHandle,
    stack_sample::top,
    symbols::{self, Kallsyms},
};

pub const PROG_CPU: &str = "profile_cpu";
pub const PROG_SWITCH: &str = "profile_switch";

/// Most processes of one profile (`PROFILE_PIDS` holds 4096 for all profiles at once).
pub const MAX_PIDS: usize = 1024;
/// Most threads a profile reports (main threads first, then the busiest).
pub const MAX_THREADS: usize = 16;

/// A snapshot's request, answered by the collection loop.
pub struct Request {
    /// The tree's root (its threads are listed first), then the whole tree.
    pub root: u32,
    pub pids: Vec<u32>,
    pub duration: Duration,
    pub reply: std::sync::mpsc::SyncSender<Raw>,
}

/// What the kernel counted for one profile, before symbolization.
#[derive(Debug, Default)]
pub struct Raw {
    pub root: u32,
    pub started_unix_ms: u64,
    pub duration_ms: u64,
    pub rate_hz: u32,
    pub offcpu_min_ns: u64,
    pub counts: Vec<(ProfileKey, ProfileCount)>,
    /// Stack id -> instruction pointers, innermost first.
    pub stacks: HashMap<i32, Vec<u64>>,
    pub lost_stacks: Option<u64>,
    pub lost_samples: Option<u64>,
    /// Steal time over the window, all CPUs together (None: not accounted here).
    pub stolen_ms: Option<u64>,
    pub notes: Vec<String>,
    /// Whether anything was attached (else the profile is only its notes).
    pub taken: bool,
}

struct Maps {
    pids: BpfHashMap<MapData, u32, u32>,
    counts: BpfHashMap<MapData, ProfileKey, ProfileCount>,
    off: BpfHashMap<MapData, u32, ProfileOff>,
    stacks: StackTraceMap<MapData>,
    drops: PerCpuArray<MapData, u64>,
}

struct Active {
    root: u32,
    pids: Vec<u32>,
    started: Instant,
    started_unix_ms: u64,
    duration: Duration,
    drops_base: [u64; 2],
    steal_base: Option<u64>,
    notes: Vec<String>,
    reply: std::sync::mpsc::SyncSender<Raw>,
}

/// Why the profile's programs could not be attached (the profile is refused with it).
#[derive(Debug, thiserror::Error)]
pub enum ProfileAttachError {
    /// The online CPUs could not be read (`what`: the file).
    #[error("{what}: {source}")]
    OnlineCpus {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("program missing")]
    ProgramMissing,
    #[error("{}", error_chain(source))]
    NotPerfEvent { source: ProgramError },
    #[error("perf event on CPU {cpu}: {}", error_chain(source))]
    PerfEvent { cpu: u32, source: ProgramError },
}

pub struct CpuProfiler {
    rate_hz: u32,
    offcpu_min_ns: u64,
    maps: Option<Maps>,
    error: Option<String>,
    /// Why waits are not counted, where the off-CPU program is not loaded.
    offcpu_error: Option<String>,
    perf_links: Vec<PerfEventLinkId>,
    switch_link: Option<BtfTracePointLinkId>,
    active: Vec<Active>,
}

impl CpuProfiler {
    /// `programs`: whether the loader loaded the programs (`Loaded::profile_programs`).
    pub fn new(
        ebpf: &mut Ebpf,
        plan: Result<crate::config::CpuProfile, &'static str>,
        programs: &Result<Option<String>, String>,
    ) -> Self {
        let mut me = Self {
            rate_hz: plan.map_or(0, |p| p.rate_hz),
            offcpu_min_ns: plan.map_or(0, |p| p.offcpu_min_ns),
            maps: None,
            error: None,
            offcpu_error: None,
            perf_links: Vec::new(),
            switch_link: None,
            active: Vec::new(),
        };
        match programs {
            Err(e) => {
                me.error = Some(e.clone());
                return me;
            }
            Ok(why) => me.offcpu_error = why.clone(),
        }
        let r = (|| -> Result<Maps, MapSetupError> {
            let mut take = |name| take_map(ebpf, name);
            Ok(Maps {
                pids: BpfHashMap::try_from(take("PROFILE_PIDS")?)?,
                counts: BpfHashMap::try_from(take("PROFILE_COUNTS")?)?,
                off: BpfHashMap::try_from(take("PROFILE_OFF")?)?,
                stacks: StackTraceMap::try_from(take("PROFILE_STACKS")?)?,
                drops: PerCpuArray::try_from(take("PROFILE_DROPS")?)?,
            })
        })();
        match r {
            Ok(m) => me.maps = Some(m),
            Err(e) => {
                warn!(error = %e, "CPU profiles unavailable");
                me.error = Some(e.to_string());
            }
        }
        me
    }

    /// Why profiles cannot be taken here, if they cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Starts the new requests and answers those whose time is up (all of them with `force`).
    pub fn tick(&mut self, ebpf: &mut Ebpf, new: Vec<Request>, force: bool) {
        for r in new {
            self.start(ebpf, r);
        }
        let (due, keep): (Vec<Active>, Vec<Active>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| force || a.started.elapsed() >= a.duration);
        self.active = keep;
        if due.is_empty() {
            return;
        }
        // Stop counting the ended profiles' processes, and stop sampling when none is left,
        // before their counts are read.
        if let Some(maps) = self.maps.as_mut() {
            for p in due.iter().flat_map(|a| &a.pids) {
                let _ = maps.pids.remove(p);
            }
        }
        let last = self.active.is_empty();
        if last {
            self.detach(ebpf);
        }
        for a in due {
            self.finish(a);
        }
        // Stacks are kept only for the profiles that took them: the map starts empty.
        if last && let Some(maps) = self.maps.as_mut() {
            let ids: Vec<u32> = maps.stacks.stack_ids().filter_map(Result::ok).collect();
            for id in ids {
                let _ = maps.stacks.remove(&id);
            }
        }
    }

    fn drops(&self) -> [u64; 2] {
        let sum = |i: u32| {
            self.maps
                .as_ref()
                .and_then(|m| m.drops.get(&i, 0).ok())
                .map_or(0, |v| v.iter().sum())
        };
        [
            sum(profile_drop::STACK_LOST),
            sum(profile_drop::COUNTS_FULL),
        ]
    }

    fn start(&mut self, ebpf: &mut Ebpf, r: Request) {
        let refuse = |reply: std::sync::mpsc::SyncSender<Raw>, note: String| {
            let _ = reply.try_send(Raw {
                notes: vec![note],
                ..Raw::default()
            });
        };
        if let Some(e) = &self.error {
            return refuse(r.reply, format!("CPU profile unavailable: {e}"));
        }
        let busy: HashSet<u32> = self.active.iter().flat_map(|a| a.pids.clone()).collect();
        if r.pids.iter().any(|p| busy.contains(p)) {
            return refuse(
                r.reply,
                "no CPU profile: another snapshot is profiling this tree now".into(),
            );
        }
        let mut notes = Vec::new();
        let mut pids = r.pids;
        pids.sort_unstable();
        pids.dedup();
        if pids.len() > MAX_PIDS {
            notes.push(format!(
                "{} processes in the tree; the first {MAX_PIDS} by pid were profiled",
                pids.len()
            ));
            pids.truncate(MAX_PIDS);
        }
        let Some(maps) = self.maps.as_mut() else {
            return;
        };
        pids.retain(|p| maps.pids.insert(p, &1, 0).is_ok());
        if self.perf_links.is_empty()
            && let Err(e) = self.attach(ebpf)
        {
            if let Some(maps) = self.maps.as_mut() {
                for p in &pids {
                    let _ = maps.pids.remove(p);
                }
            }
            return refuse(r.reply, format!("CPU profile not taken: {e}"));
        }
        if let Some(why) = &self.offcpu_error {
            notes.push(format!("waits off the CPU not counted: {why}"));
        }
        debug!(pids = pids.len(), "CPU profile started");
        self.active.push(Active {
            root: r.root,
            pids,
            started: Instant::now(),
            started_unix_ms: unix_ms(),
            duration: r.duration,
            drops_base: self.drops(),
            steal_base: procinfo::steal_ticks(),
            notes,
            reply: r.reply,
        });
    }

    fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), ProfileAttachError> {
        let cpus = aya::util::online_cpus()
            .map_err(|(what, source)| ProfileAttachError::OnlineCpus { what, source })?;
        let p: &mut PerfEvent = ebpf
            .program_mut(PROG_CPU)
            .ok_or(ProfileAttachError::ProgramMissing)?
            .try_into()
            .map_err(|source| ProfileAttachError::NotPerfEvent { source })?;
        for cpu in cpus {
            match p.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(u64::from(self.rate_hz)),
                false,
            ) {
                Ok(l) => self.perf_links.push(l),
                Err(e) => {
                    for l in self.perf_links.drain(..) {
                        let _ = p.detach(l);
                    }
                    return Err(ProfileAttachError::PerfEvent { cpu, source: e });
                }
            }
        }
        if self.offcpu_error.is_none()
            && let Some(p) = ebpf.program_mut(PROG_SWITCH)
            && let Ok(p) = <&mut BtfTracePoint>::try_from(p)
        {
            match p.attach() {
                Ok(l) => self.switch_link = Some(l),
                Err(e) => warn!(error = %error_chain(&e), "off-CPU profile program not attached"),
            }
        }
        Ok(())
    }

    fn detach(&mut self, ebpf: &mut Ebpf) {
        if let Some(p) = ebpf.program_mut(PROG_CPU)
            && let Ok(p) = <&mut PerfEvent>::try_from(p)
        {
            for l in self.perf_links.drain(..) {
                let _ = p.detach(l);
            }
        }
        if let Some(l) = self.switch_link.take()
            && let Some(p) = ebpf.program_mut(PROG_SWITCH)
            && let Ok(p) = <&mut BtfTracePoint>::try_from(p)
        {
            let _ = p.detach(l);
        }
    }

    /// Reads and removes one ended profile's counts (its processes already out of
    /// `PROFILE_PIDS`) and answers it.
    fn finish(&mut self, a: Active) {
        let elapsed = a.started.elapsed();
        let Some(maps) = self.maps.as_mut() else {
            return;
        };
        let mine: HashSet<u32> = a.pids.iter().copied().collect();
        let mut counts: HashMap<ProfileKey, ProfileCount> = maps
            .counts
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| mine.contains(&k.tgid))
            .collect();
        for k in counts.keys() {
            let _ = maps.counts.remove(k);
        }
        // Waits still going at the end count up to now (bpf_ktime_get_ns is CLOCK_MONOTONIC).
        let now = monotonic_ns();
        let going: Vec<(u32, ProfileOff)> = maps
            .off
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, o)| mine.contains(&o.tgid))
            .collect();
        for (tid, o) in going {
            let _ = maps.off.remove(&tid);
            let waited = now.saturating_sub(o.since_ns);
            // As the kernel side does: long waits at their stacks, short ones summed.
            let (user_stack, kernel_stack, kind) = if waited >= self.offcpu_min_ns {
                (o.user_stack, o.kernel_stack, profile_kind::OFF_CPU)
            } else {
                (
                    PROFILE_NO_STACK,
                    PROFILE_NO_STACK,
                    profile_kind::OFF_CPU_SHORT,
                )
            };
            let c = counts
                .entry(ProfileKey {
                    tgid: o.tgid,
                    tid,
                    user_stack,
                    kernel_stack,
                    kind,
                    _pad0: 0,
                })
                .or_default();
            c.count += 1;
            c.off_ns += waited;
        }
        let mut stacks = HashMap::new();
        for k in counts.keys() {
            for id in [k.user_stack, k.kernel_stack] {
                if id != PROFILE_NO_STACK
                    && !stacks.contains_key(&id)
                    && let Ok(st) = maps.stacks.get(&(id as u32), 0)
                {
                    stacks.insert(id, st.frames().iter().map(|f| f.ip).collect());
                }
            }
        }
        let drops = self.drops();
        let raw = Raw {
            root: a.root,
            started_unix_ms: a.started_unix_ms,
            duration_ms: elapsed.as_millis() as u64,
            rate_hz: self.rate_hz,
            offcpu_min_ns: self.offcpu_min_ns,
            counts: counts.into_iter().collect(),
            stacks,
            // Counters are per CPU for all profiles at once: a concurrent profile's losses
            // may be included.
            lost_stacks: Some(drops[0].saturating_sub(a.drops_base[0])),
            lost_samples: Some(drops[1].saturating_sub(a.drops_base[1])),
            stolen_ms: a
                .steal_base
                .zip(procinfo::steal_ticks())
                .map(|(b, n)| n.saturating_sub(b) * 1000 / procinfo::clock_ticks().max(1)),
            notes: a.notes,
            taken: true,
        };
        let _ = a.reply.try_send(raw);
    }
}

/// A CPU-clock sample that comes due while the hypervisor runs something else is taken when
/// the VM runs again, on the thread it had paused (often one that had just entered the kernel,
/// where VM exits happen): steal inflates some threads' samples, and the profile says so.
fn steal_note(stolen_ms: Option<u64>, rate_hz: u32) -> Option<String> {
    let ms = stolen_ms?;
    let samples = ms * u64::from(rate_hz) / 1000;
    (samples > 0).then(|| {
        format!(
            "the hypervisor ran something else for {ms} ms of this VM's CPU time during the \
             window (steal): up to {samples} samples may be counted on the threads it paused"
        )
    })
}

/// What the method of every profile says.
pub fn method(rate_hz: u32, offcpu_min_ns: u64) -> String {
    format!(
        "a CPU-clock perf event on every CPU {rate_hz} times a second, counting the tree's \
         threads at their user and kernel stacks (frame-pointer walk: code built without \
         frame pointers shows its innermost frame only), and every wait off the CPU \
         (sched_switch: blocked, not preempted) counted and timed per thread, those of at \
         least {} also at the stacks the thread blocked with; attached for this window \
         only",
        ethand_exporters::format::duration_ns_u(offcpu_min_ns)
    )
}

/// Turns the kernel's counts into the snapshot's profile: frames symbolized (user stacks
/// through each process's own files, kernel stacks through kallsyms).
pub fn build(raw: Raw, kallsyms: &Kallsyms, reader: &ReaderHandle) -> Option<CpuProfile> {
    if !raw.taken {
        return (!raw.notes.is_empty()).then(|| CpuProfile {
            notes: raw.notes,
            ..CpuProfile::default()
        });
    }
    let mut notes = raw.notes;
    notes.extend(steal_note(raw.stolen_ms, raw.rate_hz));
    // Frames per (pid, user stack id) and per kernel stack id.
    let mut user_ids: HashMap<u32, Vec<i32>> = HashMap::new();
    let mut kernel_ids: HashSet<i32> = HashSet::new();
    for (k, _) in &raw.counts {
        if raw.stacks.contains_key(&k.user_stack) {
            user_ids.entry(k.tgid).or_default().push(k.user_stack);
        }
        if raw.stacks.contains_key(&k.kernel_stack) {
            kernel_ids.insert(k.kernel_stack);
        }
    }
    let mut user: HashMap<(u32, i32), Vec<Frame>> = HashMap::new();
    for (pid, mut ids) in user_ids {
        ids.sort_unstable();
        ids.dedup();
        let stacks: Vec<Vec<u64>> = ids.iter().map(|id| raw.stacks[id].clone()).collect();
        let answer = reader.symbolize(pid, None, &stacks, false, false, false);
        notes.extend(
            answer
                .notes
                .into_iter()
                .map(|n| format!("process {pid}: {n}")),
        );
        for (id, s) in ids.into_iter().zip(answer.stacks) {
            user.insert((pid, id), s.frames.into_iter().map(by_function).collect());
        }
    }
    let ksyms = if kernel_ids.is_empty() {
        None
    } else {
        let k = kallsyms.load();
        if k.is_none() {
            notes.push("kernel frames unnamed: /proc/kallsyms showed no addresses".into());
        }
        k
    };
    let kernel: HashMap<i32, Vec<Frame>> = kernel_ids
        .into_iter()
        .map(|id| {
            let ips = &raw.stacks[&id];
            let f = match &ksyms {
                Some(k) => without_tracing(k.frames(ips)),
                None => symbols::unnamed_kernel_frames(ips.len()),
            };
            (id, f)
        })
        .collect();
    drop(ksyms);
    let mut threads: HashMap<(u32, u32), ThreadAcc> = HashMap::new();
    for (k, c) in raw.counts {
        let mut frames: Vec<Frame> = kernel.get(&k.kernel_stack).cloned().unwrap_or_default();
        frames.extend(
            user.get(&(k.tgid, k.user_stack))
                .cloned()
                .unwrap_or_default(),
        );
        frames.truncate(MAX_FRAMES);
        let th = threads.entry((k.tgid, k.tid)).or_default();
        if k.kind == profile_kind::OFF_CPU_SHORT {
            th.waits += c.count;
            th.wait_ns += c.off_ns;
        } else if k.kind == profile_kind::OFF_CPU {
            th.waits += c.count;
            th.wait_ns += c.off_ns;
            th.long_waits += c.count;
            th.long_wait_ns += c.off_ns;
            let w = th.wait_sites.entry(frames).or_default();
            w.0 += c.count;
            w.1 += c.off_ns;
        } else {
            th.samples += c.count;
            if k.kernel_stack != PROFILE_NO_STACK {
                th.kernel_samples += c.count;
            }
            let module = module_of(&frames, k.kernel_stack != PROFILE_NO_STACK);
            *th.modules.entry(module).or_default() += c.count;
            if let Some(f) = frames.first() {
                *th.functions.entry(f.clone()).or_default() += c.count;
            }
            *th.stacks.entry(frames).or_default() += c.count;
        }
    }
    let mut out: Vec<CpuThreadProfile> = threads
        .into_iter()
        .map(|((pid, tid), th)| th.finish(pid, tid))
        .collect();
    // The root process first (the trainer a snapshot was asked for, not its data workers),
    // then main threads, then the busiest.
    out.sort_by(|a, b| {
        (b.pid == raw.root)
            .cmp(&(a.pid == raw.root))
            .then(b.main_thread.cmp(&a.main_thread))
            .then(b.samples.cmp(&a.samples))
            .then(b.wait_ns.cmp(&a.wait_ns))
            .then(a.tid.cmp(&b.tid))
    });
    if out.len() > MAX_THREADS {
        notes.push(format!(
            "{} threads profiled; the main threads and the busiest shown ({MAX_THREADS})",
            out.len()
        ));
        // Keep the busiest, main threads first among equals: re-rank the tail by activity.
        let mains = out
            .iter()
            .filter(|t| t.main_thread)
            .count()
            .min(MAX_THREADS / 2);
        let mut rest = out.split_off(mains);
        rest.sort_by(|a, b| b.samples.cmp(&a.samples).then(b.wait_ns.cmp(&a.wait_ns)));
        rest.truncate(MAX_THREADS - mains);
        out.extend(rest);
    }
    Some(CpuProfile {
        method: method(raw.rate_hz, raw.offcpu_min_ns),
        started_unix_ms: raw.started_unix_ms,
        duration_ms: raw.duration_ms,
        rate_hz: raw.rate_hz,
        offcpu_min_ns: raw.offcpu_min_ns,
        lost_stacks: raw.lost_stacks,
        lost_samples: raw.lost_samples,
        stolen_ms: raw.stolen_ms,
        threads: out,
        notes,
    })
}

/// A frame as the profile counts it: by function where it has a name (every sample in a
/// function is one frame, whatever the instruction), by file where it has none (a stripped
/// library's internal functions: "libcuda.so.1"), by address only outside any mapping.
fn by_function(mut f: Frame) -> Frame {
    if f.function.is_some() || f.module.is_some() {
        f.offset = None;
        f.line = None;
        f.file = None;
    }
    f
}

/// A kernel stack without the frames of the tracing path that took it (the off-CPU
/// program's own frames on top of `__schedule`).
fn without_tracing(frames: Vec<Frame>) -> Vec<Frame> {
    let tracing = |f: &Frame| {
        f.function.as_deref().is_some_and(|n| {
            [
                "bpf_prog_",
                "bpf_trace_run",
                "__traceiter_",
                "__bpf_trace_",
                "perf_trace_",
            ]
            .iter()
            .any(|p| n.starts_with(p))
        })
    };
    let skip = frames.iter().take_while(|f| tracing(f)).count();
    frames.into_iter().skip(skip).collect()
}

/// Where a sample's CPU time goes by file: "[kernel]" for kernel code, the innermost user
/// frame's file name, "[unknown]" for code in no mapped file.
fn module_of(frames: &[Frame], in_kernel: bool) -> String {
    if in_kernel {
        return "[kernel]".into();
    }
    match frames.iter().find(|f| f.kind == FrameKind::Native) {
        Some(Frame {
            module: Some(m), ..
        }) => m.rsplit('/').next().unwrap_or(m).to_string(),
        _ => "[unknown]".into(),
    }
}

#[derive(Default)]
struct ThreadAcc {
    samples: u64,
    kernel_samples: u64,
    modules: HashMap<String, u64>,
    functions: HashMap<Frame, u64>,
    /// Innermost first.
    stacks: HashMap<Vec<Frame>, u64>,
    /// Every wait, whatever its length.
    waits: u64,
    wait_ns: u64,
    /// Of them, those of at least `offcpu_min_ns` (the ones in `wait_sites`).
    long_waits: u64,
    long_wait_ns: u64,
    /// Innermost first -> (waits, time).
    wait_sites: HashMap<Vec<Frame>, (u64, u64)>,
}

impl ThreadAcc {
    fn finish(self, pid: u32, tid: u32) -> CpuThreadProfile {
        // A thread gone by now keeps its samples under "?".
        let name = procinfo::thread_comm(pid, tid).unwrap_or_else(|| "?".into());
        let (modules, _) = top(self.modules, MAX_SITES);
        let modules = modules
            .into_iter()
            .map(|(name, samples)| Share { name, samples })
            .collect();
        let (functions, _) = top(self.functions, MAX_SITES);
        let functions = functions
            .into_iter()
            .map(|(frame, samples)| FrameShare { frame, samples })
            .collect();
        let (stacks, folded_other) = top(self.stacks, MAX_FOLDED);
        let (folded, frames) = fold(stacks);
        let mut wait_sites: Vec<CallSite> = self
            .wait_sites
            .into_iter()
            .map(|(frames, (count, ns))| CallSite {
                frames,
                count,
                time_ns: Some(ns),
                source: None,
            })
            .collect();
        wait_sites.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(b.count.cmp(&a.count)));
        wait_sites.truncate(MAX_SITES);
        CpuThreadProfile {
            pid,
            tid,
            name,
            main_thread: pid == tid,
            samples: self.samples,
            kernel_samples: self.kernel_samples,
            by_module: modules,
            top_functions: functions,
            folded,
            folded_other,
            frames,
            waits: self.waits,
            wait_ns: self.wait_ns,
            long_waits: Some(self.long_waits),
            long_wait_ns: Some(self.long_wait_ns),
            wait_sites,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tid: u32, user: i32, kernel: i32, kind: u32) -> ProfileKey {
        ProfileKey {
            tgid: std::process::id(),
            tid,
            user_stack: user,
            kernel_stack: kernel,
            kind,
            _pad0: 0,
        }
    }

    #[test]
    fn counts_become_threads_modules_functions_and_waits() {
        // Stacks the symbolizer cannot place (addresses in no mapping of this process):
        // frames with offsets only, module unknown.
        let me = std::process::id();
        let raw = Raw {
            root: me,
            started_unix_ms: 1,
            duration_ms: 2000,
            rate_hz: 99,
            offcpu_min_ns: 1_000_000,
            counts: vec![
                (
                    key(me, 1, PROFILE_NO_STACK, profile_kind::ON_CPU),
                    ProfileCount {
                        count: 150,
                        off_ns: 0,
                    },
                ),
                (
                    key(me, 2, 3, profile_kind::ON_CPU),
                    ProfileCount {
                        count: 50,
                        off_ns: 0,
                    },
                ),
                (
                    key(me, 2, 3, profile_kind::OFF_CPU),
                    ProfileCount {
                        count: 4,
                        off_ns: 40_000_000,
                    },
                ),
                (
                    key(
                        me,
                        PROFILE_NO_STACK,
                        PROFILE_NO_STACK,
                        profile_kind::OFF_CPU_SHORT,
                    ),
                    ProfileCount {
                        count: 1_000,
                        off_ns: 200_000_000,
                    },
                ),
            ],
            stacks: HashMap::from([(1, vec![0x10, 0x20]), (2, vec![0x30]), (3, vec![0x40])]),
            lost_stacks: Some(0),
            lost_samples: Some(0),
            stolen_ms: Some(30),
            notes: vec![],
            taken: true,
        };
        let k = Kallsyms::open();
        // Unit tests run no reader: user frames keep their addresses.
        let r = ReaderHandle::unavailable(&crate::config::Plan::defaults().reader, "test".into());
        let p = build(raw, &k, &r).expect("a profile");
        assert_eq!(p.threads.len(), 1);
        let t = &p.threads[0];
        assert!(t.main_thread);
        assert_eq!((t.samples, t.kernel_samples), (200, 50));
        assert_eq!(t.by_module[0].samples, 150);
        assert_eq!(t.by_module[1].name, "[kernel]");
        // Every wait summed, the long ones apart (and only they have a site).
        assert_eq!((t.waits, t.wait_ns), (1_004, 240_000_000));
        assert_eq!((t.long_waits, t.long_wait_ns), (Some(4), Some(40_000_000)));
        assert_eq!(t.wait_sites.len(), 1);
        assert_eq!(t.wait_sites[0].frames[0].kind, FrameKind::Kernel);
        assert_eq!(t.folded.iter().map(|f| f.samples).sum::<u64>(), 200);
        // Outermost first: the two-frame stack's outer frame (0x20 - 1) leads.
        let two = t.folded.iter().find(|f| f.frames.len() == 2).unwrap();
        assert_eq!(t.frames[two.frames[0] as usize].offset, Some(0x20));
        assert_eq!(p.full_samples(), 198.0);
        // 30 ms of steal at 99 Hz: 2 samples may have landed where the VM was paused.
        assert_eq!(p.stolen_ms, Some(30));
        assert!(
            p.notes.iter().any(|n| n.contains("up to 2 samples")),
            "{:?}",
            p.notes
        );
        assert_eq!(steal_note(Some(10), 99), None);
        assert_eq!(steal_note(None, 99), None);
    }

    #[test]
    fn a_refused_profile_is_its_note() {
        let raw = Raw {
            notes: vec!["CPU profile unavailable: off".into()],
            ..Raw::default()
        };
        let r = ReaderHandle::unavailable(&crate::config::Plan::defaults().reader, "test".into());
        let p = build(raw, &Kallsyms::open(), &r).unwrap();
        assert!(p.threads.is_empty());
        assert_eq!(p.notes.len(), 1);
        assert!(build(Raw::default(), &Kallsyms::open(), &r).is_none());
    }
}
