//! Kernel launches counted on demand for one diagnosis. At the default level `calls` no
//! launch is probed (each costs the caller a uprobe trap, and a launch-bound step makes
//! hundreds), yet the diagnosis needs launch rates to tell a launch-bound loop from an input
//! stall. So a snapshot asks for a sample: uprobes on the launch symbols of the library files
//! the tree's processes map, scoped to those processes (the kernel installs the breakpoints
//! in their address spaces only: nothing else on the node pays), for the sample and no longer.
//! Counts go to their own map (`LAUNCH_SAMPLE`), never into the cumulative counters.
use std::{
    collections::HashMap,
    num::NonZeroU32,
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        ProgramError, UProbe,
        uprobe::{UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use ethand_snapshot::gpu::{LaunchSample, LaunchSampleProcess};
use tracing::{debug, warn};

use crate::pipeline::{
    bpf_error::{error_chain, take_map},
    gpu::GpuProbes,
    uprobes::{self, UprobeSetupError},
};

pub const PROG: &str = "gpu_launch_sample";
pub const PROG_MULTI: &str = "gpu_launch_sample_multi";

/// What every sample's output says about how it was taken and what it costs.
pub const METHOD: &str = "uprobes on the launch symbols (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, aclopExecute...) of the library files the tree's processes map, scoped to those processes and attached only for this sample; each launch in the sample pays one uprobe trap (~0.7 us measured beyond the tracepoints on an H200 VM)";

/// At most this many processes are sampled for one snapshot (the tree's GPU processes).
pub const MAX_PIDS: usize = 64;

/// A snapshot's request, answered by the collection loop (which owns the probes).
pub struct Request {
    pub pids: Vec<u32>,
    pub duration: Duration,
    pub reply: std::sync::mpsc::SyncSender<LaunchSample>,
}

struct Active {
    pids: Vec<u32>,
    base: HashMap<u32, u64>,
    started: Instant,
    started_unix_ms: u64,
    duration: Duration,
    links: Vec<LinkKey>,
    notes: Vec<String>,
    reply: std::sync::mpsc::SyncSender<LaunchSample>,
}

type LinkKey = ((String, u64), u32);

/// Why the sample program could not be attached to a library file of a process; told
/// without the program's name (the note is the sample's).
#[derive(Debug, thiserror::Error)]
pub enum SampleAttachError {
    #[error("sample program missing")]
    Missing,
    #[error("{}", error_chain(source))]
    Program { source: ProgramError },
}

pub struct LaunchSampler {
    prog: &'static str,
    counts: Option<BpfHashMap<MapData, u32, u64>>,
    error: Option<String>,
    /// (library file, pid) -> (link, samples using it).
    links: HashMap<LinkKey, (UProbeLinkId, usize)>,
    active: Vec<Active>,
}

impl LaunchSampler {
    pub fn new(ebpf: &mut Ebpf, multi: bool) -> Self {
        let prog = if multi { PROG_MULTI } else { PROG };
        let mut me = Self {
            prog,
            counts: None,
            error: None,
            links: HashMap::new(),
            active: Vec::new(),
        };
        let r = (|| -> Result<BpfHashMap<MapData, u32, u64>, UprobeSetupError> {
            uprobes::load(ebpf, prog)?;
            Ok(BpfHashMap::try_from(take_map(ebpf, "LAUNCH_SAMPLE")?)?)
        })();
        match r {
            Ok(m) => me.counts = Some(m),
            Err(e) => {
                warn!(error = %e, "on-demand launch sampling unavailable");
                me.error = Some(e.to_string());
            }
        }
        me
    }

    pub fn program(&self) -> &'static str {
        self.prog
    }

    /// Why sampling cannot work here, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn count(&self, pid: u32) -> u64 {
        self.counts
            .as_ref()
            .and_then(|m| m.get(&pid, 0).ok())
            .unwrap_or(0)
    }

    /// Starts the new requests and answers those whose time is up (all of them with `force`).
    pub fn tick(&mut self, ebpf: &mut Ebpf, gpu: &GpuProbes, new: Vec<Request>, force: bool) {
        for r in new {
            self.start(ebpf, gpu, r);
        }
        let (due, keep): (Vec<Active>, Vec<Active>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| force || a.started.elapsed() >= a.duration);
        self.active = keep;
        for a in due {
            self.finish(ebpf, a);
        }
    }

    fn start(&mut self, ebpf: &mut Ebpf, gpu: &GpuProbes, r: Request) {
        let mut a = Active {
            pids: Vec::new(),
            base: HashMap::new(),
            started: Instant::now(),
            started_unix_ms: crate::pipeline::procinfo::unix_ms(),
            duration: r.duration,
            links: Vec::new(),
            notes: Vec::new(),
            reply: r.reply,
        };
        if let Some(e) = &self.error {
            a.notes.push(format!("launch sampling unavailable: {e}"));
            a.duration = Duration::ZERO;
            self.active.push(a);
            return;
        }
        let mut pids = r.pids;
        pids.sort_unstable();
        pids.dedup();
        if pids.len() > MAX_PIDS {
            a.notes.push(format!(
                "{} processes map a GPU runtime; the first {MAX_PIDS} by pid were sampled",
                pids.len()
            ));
            pids.truncate(MAX_PIDS);
        }
        for pid in pids {
            let Some(nz) = NonZeroU32::new(pid) else {
                continue;
            };
            let points = match gpu.launch_points(pid) {
                Ok(p) => p,
                Err(e) => {
                    a.notes.push(format!("pid {pid}: {e}"));
                    continue;
                }
            };
            if points.is_empty() {
                continue;
            }
            let mut attached = false;
            for (lib, path, offsets) in points {
                let key = (lib, pid);
                if let Some((_, users)) = self.links.get_mut(&key) {
                    *users += 1;
                    a.links.push(key);
                    attached = true;
                    continue;
                }
                match self.attach(ebpf, &path, &offsets, nz) {
                    Ok(link) => {
                        self.links.insert(key.clone(), (link, 1));
                        a.links.push(key);
                        attached = true;
                    }
                    Err(e) => a.notes.push(format!("pid {pid}: attaching failed: {e}")),
                }
            }
            if attached {
                a.base.insert(pid, self.count(pid));
                a.pids.push(pid);
            }
        }
        // The counting starts once every link is in place.
        a.started = Instant::now();
        a.started_unix_ms = crate::pipeline::procinfo::unix_ms();
        debug!(pids = ?a.pids, "launch sample started");
        self.active.push(a);
    }

    fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        path: &Path,
        offsets: &[u64],
        pid: NonZeroU32,
    ) -> Result<UProbeLinkId, SampleAttachError> {
        let points: Vec<UProbeAttachPoint> = offsets
            .iter()
            .map(|off| uprobes::at_offset(*off, None))
            .collect();
        uprobes::attach(ebpf, self.prog, path, points, UProbeScope::OneProcess(pid)).map_err(|e| {
            match e.into_program_error() {
                None => SampleAttachError::Missing,
                Some(source) => SampleAttachError::Program { source },
            }
        })
    }

    fn finish(&mut self, ebpf: &mut Ebpf, a: Active) {
        let elapsed = a.started.elapsed();
        let processes: Vec<LaunchSampleProcess> = a
            .pids
            .iter()
            .map(|pid| LaunchSampleProcess {
                pid: *pid,
                launches: self
                    .count(*pid)
                    .saturating_sub(a.base.get(pid).copied().unwrap_or(0)),
            })
            .collect();
        for key in &a.links {
            let gone = match self.links.get_mut(key) {
                Some((_, users)) => {
                    *users -= 1;
                    *users == 0
                }
                None => false,
            };
            if gone
                && let Some((link, _)) = self.links.remove(key)
                && let Some(p) = ebpf.program_mut(self.prog)
                && let Ok(p) = <&mut UProbe>::try_from(p)
            {
                let _ = p.detach(link);
            }
        }
        // A pid no sample watches any more: its count goes, so the map never fills.
        for pid in &a.pids {
            if !self.links.keys().any(|(_, p)| p == pid)
                && let Some(m) = self.counts.as_mut()
            {
                let _ = m.remove(pid);
            }
        }
        let launches: u64 = processes.iter().map(|p| p.launches).sum();
        let secs = elapsed.as_secs_f64();
        let sample = LaunchSample {
            method: METHOD.into(),
            started_unix_ms: a.started_unix_ms,
            duration_ms: elapsed.as_millis() as u64,
            launches_per_second: (secs > 0.0 && !processes.is_empty())
                .then(|| launches as f64 / secs),
            launches: (!processes.is_empty()).then_some(launches),
            processes,
            notes: a.notes,
        };
        let _ = a.reply.try_send(sample);
    }
}
