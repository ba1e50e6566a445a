//! The launch probes of GPU activity windows (`launch_trace`, `launch_trace_return` in
//! ebpf/ethand-ebpf/src/cupti.rs): attached to the launch symbols of a recorded process's
//! runtime libraries for its window's length, scoped to it, and the maps they write.
use std::collections::HashMap;

use aya::{
    Ebpf,
    maps::{MapData, RingBuf, StackTraceMap},
    programs::uprobe::UProbeScope,
};

use super::JoinedSite;
use crate::pipeline::{
    bpf_error::take_map,
    gpu::{GpuProbes, sites::Stack},
    uprobes::{self, LibraryLinks, Progs},
};

/// A launch probe pair on one library file for one process: (library, pid).
/// (The library as `GpuProbes::launch_points` names it.)
pub type LinkKey = ((String, u64), u32);

/// The launch programs, their maps, and the links open windows hold.
pub struct LaunchTracer {
    progs: Progs,
    /// `LAUNCH_EVENTS`, mapped only while windows are open (as `CUPTI_EVENTS`).
    pub events: aya::maps::Map,
    stacks: StackTraceMap<MapData>,
    /// Links and how many windows use each.
    pub links: HashMap<LinkKey, (LibraryLinks, usize)>,
}

impl LaunchTracer {
    pub fn new(ebpf: &mut Ebpf, multi: bool) -> anyhow::Result<Self> {
        let progs = Progs::launch_trace(multi);
        uprobes::load(ebpf, progs.entry)?;
        uprobes::load(ebpf, progs.ret)?;
        let events = take_map(ebpf, "LAUNCH_EVENTS")?;
        drop(RingBuf::try_from(&events)?);
        let stacks = StackTraceMap::try_from(take_map(ebpf, "LAUNCH_STACKS")?)?;
        Ok(Self {
            progs,
            events,
            stacks,
            links: HashMap::new(),
        })
    }

    /// Attaches the launch probes to the launch symbols of every runtime library `pid` maps
    /// (scoped to it); the links it holds are added to `held`.
    pub fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        gpu: &GpuProbes,
        pid: u32,
        held: &mut Vec<LinkKey>,
    ) -> Result<(), String> {
        let nz = std::num::NonZeroU32::new(pid).ok_or("pid 0")?;
        let points = gpu.launch_points(pid).map_err(|e| e.to_string())?;
        if points.is_empty() {
            return Err("no launch symbol found in the runtime libraries it maps".into());
        }
        for (lib, path, offsets) in points {
            let key = (lib, pid);
            if let Some((_, users)) = self.links.get_mut(&key) {
                *users += 1;
                held.push(key);
                continue;
            }
            let at: Vec<_> = offsets
                .iter()
                .map(|off| uprobes::at_offset(*off, None))
                .collect();
            let mut links = LibraryLinks::default();
            match links.attach(
                ebpf,
                self.progs,
                &path,
                at.clone(),
                at,
                UProbeScope::OneProcess(nz),
            ) {
                Ok(()) => {
                    self.links.insert(key.clone(), (links, 1));
                    held.push(key);
                }
                Err((_, e)) => {
                    links.detach(ebpf, self.progs);
                    return Err(format!("attaching to {}: {}", path.display(), e.detail()));
                }
            }
        }
        Ok(())
    }

    pub fn release(&mut self, ebpf: &mut Ebpf, held: Vec<LinkKey>) {
        for key in held {
            let gone = match self.links.get_mut(&key) {
                Some((_, users)) => {
                    *users -= 1;
                    *users == 0
                }
                None => false,
            };
            if gone && let Some((mut links, _)) = self.links.remove(&key) {
                links.detach(ebpf, self.progs);
            }
        }
    }

    /// The user stacks `sites` name.
    pub fn stacks_of(&self, sites: &[JoinedSite]) -> HashMap<u32, Stack> {
        sites
            .iter()
            .map(|s| s.key.0)
            .filter(|id| *id != ethand_common::GPU_STACK_UNATTRIBUTED)
            .filter_map(|id| {
                let st = self.stacks.get(&id, 0).ok()?;
                let ips: Vec<u64> = st.frames().iter().map(|f| f.ip).collect();
                Some((id, Stack::from(ips)))
            })
            .collect()
    }

    /// Empties `LAUNCH_STACKS` (no window open: its ids name nothing any more).
    pub fn clear_stacks(&mut self) {
        let ids: Vec<u32> = self.stacks.stack_ids().filter_map(Result::ok).collect();
        for id in ids {
            let _ = self.stacks.remove(&id);
        }
    }
}
