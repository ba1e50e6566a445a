//! Call sites of GPU/NPU runtime calls: the user stacks the kernel took at each probed call
//! (`GPU_SITES` per process, symbol and `GPU_STACKS` id) turned into frames. Symbolized
//! (blazesym) only when a snapshot is built, and then only stacks not seen before: frames are
//! cached per (process, stack id). Files are opened through `/proc/PID/root`, so a
//! container's binaries and libraries are the ones read (no CAP_SYS_ADMIN needed, unlike
//! `/proc/PID/map_files`).
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use ethand_common::{GPU_STACK_UNATTRIBUTED, GpuSiteStats, ProcKey};
use ethand_snapshot::stacks::{CallSite, CallSites, Frame, MAX_FRAMES, MAX_SITES, SiteBasis};
use ethand_userspace_probes::{catalog::CATALOG, source};

use crate::pipeline::symbols;

/// The instruction pointers of one user stack, innermost first (the probed function's entry,
/// then return addresses).
pub type Stack = Arc<[u64]>;

/// A stack's frames above the runtime library, and the source line of its innermost frame
/// that has one.
#[derive(Clone, Debug, Default)]
struct Resolved {
    frames: Vec<Frame>,
    source: Option<String>,
}

/// Symbolized stacks per (tgid, start time, stack id, caller), with the stack they were made
/// from (a stack id freed and taken again by another stack is symbolized again).
#[derive(Default)]
pub struct SiteCache {
    entries: HashMap<(u32, u64, u32, u64), (Stack, Resolved)>,
}

impl SiteCache {
    /// Keeps the entries of the processes `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u32, u64) -> bool) {
        self.entries
            .retain(|(pid, start, _, _), _| keep(*pid, *start));
    }
}

/// The call sites of one process's probed calls, per symbol (busiest symbol first).
pub fn call_sites(
    cache: &Mutex<SiteCache>,
    key: ProcKey,
    sites: &BTreeMap<(u16, u32, u64), GpuSiteStats>,
    stacks: &HashMap<u32, Stack>,
) -> Vec<CallSites> {
    if sites.is_empty() {
        return Vec::new();
    }
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    let (pid, start) = (key.tgid, key.proc_start_ns);
    // Symbolize what the cache lacks, in one go (one symbolizer, one read of the maps).
    let mut missing: Vec<((u32, u64), Stack)> = sites
        .keys()
        .filter_map(|(_, id, caller)| Some(((*id, *caller), stacks.get(id)?.clone())))
        .filter(|((id, caller), st)| {
            cache
                .entries
                .get(&(pid, start, *id, *caller))
                .is_none_or(|(had, _)| !Arc::ptr_eq(had, st))
        })
        .collect();
    missing.dedup_by(|a, b| a.0 == b.0);
    if !missing.is_empty() {
        let with_caller: Vec<Vec<u64>> = missing
            .iter()
            .map(|((_, caller), st)| with_caller(st, *caller))
            .collect();
        let resolved = symbolize(pid, with_caller.iter().map(Vec::as_slice));
        for (((id, caller), st), r) in missing.into_iter().zip(resolved) {
            cache.entries.insert((pid, start, id, caller), (st, r));
        }
    }
    let mut by_op: BTreeMap<u16, CallSites> = BTreeMap::new();
    let mut merged: BTreeMap<u16, Vec<CallSite>> = BTreeMap::new();
    for (&(op, id, caller), s) in sites {
        let Some(spec) = CATALOG.get(op as usize) else {
            continue;
        };
        let cs = by_op.entry(op).or_insert_with(|| CallSites {
            pid,
            call: spec.name.into(),
            category: spec.category.as_str().into(),
            basis: SiteBasis::Calls,
            unattributed: Some(0),
            ..CallSites::default()
        });
        cs.total += s.calls;
        let resolved = (id != GPU_STACK_UNATTRIBUTED)
            .then(|| cache.entries.get(&(pid, start, id, caller)))
            .flatten()
            .filter(|(st, _)| stacks.get(&id).is_some_and(|now| Arc::ptr_eq(now, st)));
        let Some((_, r)) = resolved else {
            *cs.unattributed.get_or_insert(0) += s.calls;
            continue;
        };
        let time_ns = (s.timed_calls > 0).then_some(s.time_ns);
        let list = merged.entry(op).or_default();
        // Two stacks that differ only inside the runtime library are one call site.
        match list.iter_mut().find(|c| c.frames == r.frames) {
            Some(c) => {
                c.count += s.calls;
                c.time_ns = match (c.time_ns, time_ns) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                };
            }
            None => list.push(CallSite {
                frames: r.frames.clone(),
                count: s.calls,
                time_ns,
                source: r.source.clone(),
            }),
        }
    }
    for (op, mut list) in merged {
        list.sort_by_key(|c| std::cmp::Reverse(c.count));
        let cs = by_op.get_mut(&op).expect("entered above");
        cs.other = list.iter().skip(MAX_SITES).map(|c| c.count).sum();
        list.truncate(MAX_SITES);
        cs.sites = list;
    }
    let mut out: Vec<CallSites> = by_op.into_values().collect();
    out.sort_by(|a, b| b.total.cmp(&a.total).then(a.call.cmp(&b.call)));
    out
}

/// The stack with the caller's return address as its second frame, unless the kernel put it
/// there already: a frame-pointer walk from a function's first instruction misses it.
fn with_caller(stack: &[u64], caller: u64) -> Vec<u64> {
    let mut v = stack.to_vec();
    if caller != 0 && !v.is_empty() && v.get(1) != Some(&caller) {
        v.insert(1, caller);
    }
    v
}

/// Frames of each stack of process `pid`: the probed library's own frames dropped (the first
/// is the probed function), at most [`MAX_FRAMES`] kept.
fn symbolize<'a>(pid: u32, stacks: impl Iterator<Item = &'a [u64]>) -> Vec<Resolved> {
    let uid = source::process_uid(pid);
    symbols::user_frames(pid, stacks, true)
        .into_iter()
        .map(|frames| {
            // The first frame is the probed function: drop it and every frame after it in
            // the same library (the runtime's own calls on the way in).
            let lib = frames.first().map(|f| f.module.clone());
            let inner = frames
                .iter()
                .skip(1)
                .take_while(|f| f.module.is_some() && Some(&f.module) == lib.as_ref())
                .count();
            let mut frames: Vec<Frame> = frames.into_iter().skip(1 + inner).collect();
            frames.truncate(MAX_FRAMES);
            let source = uid.and_then(|uid| {
                frames
                    .iter()
                    .find_map(|f| source::line(pid, uid, f.file.as_deref()?, f.line?))
            });
            Resolved { frames, source }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_userspace_probes::{Runtime, catalog::op_id};

    fn st(calls: u64) -> GpuSiteStats {
        GpuSiteStats {
            calls,
            time_ns: calls * 10,
            timed_calls: calls,
        }
    }

    /// Stacks of this very process: its own functions are symbolized; sites rank by count,
    /// beyond MAX_SITES they are summed in `other`, unattributed calls apart.
    #[test]
    fn sites_rank_and_the_rest_is_summed() {
        let op = op_id(Runtime::Cuda, "cuStreamSynchronize").unwrap();
        let key = ProcKey {
            tgid: std::process::id(),
            _pad0: 0,
            proc_start_ns: 1,
        };
        let here = sites_rank_and_the_rest_is_summed as fn() as usize as u64;
        let mut stacks = HashMap::new();
        let mut sites = BTreeMap::new();
        for id in 0..(MAX_SITES as u32 + 2) {
            // A first frame outside any mapping, then distinct addresses in this binary.
            stacks.insert(id, Stack::from(vec![1, here + 1 + u64::from(id) * 64]));
            sites.insert((op, id, 0), st(100 - u64::from(id)));
        }
        sites.insert((op, GPU_STACK_UNATTRIBUTED, 0), st(5));
        let cache = Mutex::new(SiteCache::default());
        let out = call_sites(&cache, key, &sites, &stacks);
        assert_eq!(out.len(), 1);
        let cs = &out[0];
        assert_eq!(cs.call, "cuStreamSynchronize");
        assert_eq!(cs.unattributed, Some(5));
        let counted: u64 = cs.sites.iter().map(|s| s.count).sum::<u64>() + cs.other + 5;
        assert_eq!(cs.total, counted);
        assert!(cs.sites.len() <= MAX_SITES);
        assert!(cs.sites.windows(2).all(|w| w[0].count >= w[1].count));
        let f = &cs.sites[0].frames[0];
        assert!(f.module.is_some() && f.offset.is_some(), "{f:?}");
        // Cached: a second build symbolizes nothing and gives the same answer.
        assert_eq!(call_sites(&cache, key, &sites, &stacks), out);
    }

    #[test]
    fn the_caller_is_added_where_the_walk_missed_it() {
        assert_eq!(with_caller(&[1, 3, 4], 2), [1, 2, 3, 4]);
        assert_eq!(with_caller(&[1, 2, 3], 2), [1, 2, 3]);
        assert_eq!(with_caller(&[1, 3], 0), [1, 3]);
    }
}
