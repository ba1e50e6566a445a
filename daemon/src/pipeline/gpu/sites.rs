//! Call sites of GPU/NPU runtime calls: the user stacks the kernel took at each probed call
//! (`GPU_SITES` per process, symbol and `GPU_STACKS` id) turned into frames. Symbolized by
//! the reader (`pipeline/reader.rs`: the process's own files, as its owner, in a sandboxed
//! worker) only when a tree snapshot is built, outside the model lock and never for
//! /metrics, and then only stacks not seen before: frames are cached per (process, stack id).
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use ethand_common::{GPU_STACK_UNATTRIBUTED, GpuSiteStats, ProcKey};
use ethand_snapshot::stacks::{CallSite, CallSites, Frame, MAX_FRAMES, MAX_SITES, SiteBasis};
use ethand_userspace_probes::catalog::CATALOG;

use crate::pipeline::{gpu::python::PyFrames, reader::ReaderHandle};

/// One call site as the kernel keys it: (op id, `GPU_STACKS` id, the caller's return
/// address, the `PY_STACKS` key of the calling thread's Python frames or 0).
pub type SiteId = (u16, u32, u64, u64);

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

/// What the call sites of one process are made from, taken out of the model under its lock
/// so that symbolizing happens after it is released.
#[derive(Clone, Debug)]
pub struct SiteInputs {
    pub key: ProcKey,
    /// /proc's start time (clock ticks), so that the reader refuses a reused pid.
    pub start_ticks: Option<u64>,
    pub sites: BTreeMap<SiteId, GpuSiteStats>,
    /// The stacks `sites` refers to.
    pub stacks: HashMap<u32, Stack>,
}

impl SiteInputs {
    pub fn new(
        key: ProcKey,
        start_ticks: Option<u64>,
        sites: &BTreeMap<SiteId, GpuSiteStats>,
        all_stacks: &HashMap<u32, Stack>,
    ) -> Option<Self> {
        if sites.is_empty() {
            return None;
        }
        let stacks = sites
            .keys()
            .filter_map(|(_, id, _, _)| Some((*id, all_stacks.get(id)?.clone())))
            .collect();
        Some(Self {
            key,
            start_ticks,
            sites: sites.clone(),
            stacks,
        })
    }
}

/// A site's frames as the snapshot shows them: the native stack above the runtime library,
/// its Python frames in place of the interpreter's own, and the source line of its innermost
/// native frame that has one.
pub type SiteFrames = (Vec<Frame>, Option<String>);

/// The frames of each of `wanted` ((stack id, caller, Python stack) of process `key`; a stack
/// id `stacks` maps, or [`GPU_STACK_UNATTRIBUTED`]); None where neither a native stack nor
/// Python frames could be had. Symbolizes what `cache` lacks in one request to the reader,
/// without holding the cache's lock.
pub fn resolve(
    cache: &Mutex<SiteCache>,
    py: &Mutex<PyFrames>,
    reader: &ReaderHandle,
    key: ProcKey,
    start_ticks: Option<u64>,
    wanted: &[(u32, u64, u64)],
    stacks: &HashMap<u32, Stack>,
) -> Vec<Option<SiteFrames>> {
    let (pid, start) = (key.tgid, key.proc_start_ns);
    let mut missing: Vec<((u32, u64), Stack)> = {
        let cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
        wanted
            .iter()
            .filter_map(|(id, caller, _)| Some(((*id, *caller), stacks.get(id)?.clone())))
            .filter(|((id, caller), st)| {
                cache
                    .entries
                    .get(&(pid, start, *id, *caller))
                    .is_none_or(|(had, _)| !Arc::ptr_eq(had, st))
            })
            .collect()
    };
    missing.sort_by_key(|(k, _)| *k);
    missing.dedup_by(|a, b| a.0 == b.0);
    // Answers not kept (a request that timed out is asked again by the next snapshot).
    let mut fresh: HashMap<(u32, u64), Resolved> = HashMap::new();
    if !missing.is_empty() {
        let with_caller: Vec<Vec<u64>> = missing
            .iter()
            .map(|((_, caller), st)| with_caller(st, *caller))
            .collect();
        let answer = reader.symbolize(pid, start_ticks, &with_caller, true, true, true);
        let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
        for (((id, caller), st), s) in missing.into_iter().zip(answer.stacks) {
            let transient = ethand_reader::client::is_transient(&s);
            let r = above_runtime(s);
            if transient {
                fresh.insert((id, caller), r);
            } else {
                cache.entries.insert((pid, start, id, caller), (st, r));
            }
        }
    }
    let cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    let py = py.lock().unwrap_or_else(PoisonError::into_inner);
    wanted
        .iter()
        .map(|&(id, caller, py_stack)| {
            let resolved = (id != GPU_STACK_UNATTRIBUTED)
                .then(|| {
                    fresh.get(&(id, caller)).or_else(|| {
                        cache
                            .entries
                            .get(&(pid, start, id, caller))
                            .filter(|(st, _)| {
                                stacks.get(&id).is_some_and(|now| Arc::ptr_eq(now, st))
                            })
                            .map(|(_, r)| r)
                    })
                })
                .flatten();
            let python = (py_stack != 0).then(|| py.frames(&key, py_stack)).flatten();
            match (resolved, python) {
                (None, None) => None,
                (Some(r), None) => Some((r.frames.clone(), r.source.clone())),
                (r, Some(python)) => Some((
                    with_python(r.map(|r| r.frames.as_slice()).unwrap_or(&[]), python),
                    None,
                )),
            }
        })
        .collect()
}

/// The call sites of one process's probed calls, per symbol (busiest symbol first).
pub fn call_sites(
    cache: &Mutex<SiteCache>,
    py: &Mutex<PyFrames>,
    reader: &ReaderHandle,
    inputs: &SiteInputs,
) -> Vec<CallSites> {
    let (key, sites, stacks) = (inputs.key, &inputs.sites, &inputs.stacks);
    let wanted: Vec<(u32, u64, u64)> = sites
        .keys()
        .map(|&(_, id, caller, py_stack)| (id, caller, py_stack))
        .collect();
    let resolved = resolve(cache, py, reader, key, inputs.start_ticks, &wanted, stacks);
    let mut by_op: BTreeMap<u16, CallSites> = BTreeMap::new();
    let mut merged: BTreeMap<u16, Vec<CallSite>> = BTreeMap::new();
    for ((&(op, _, _, _), s), frames) in sites.iter().zip(resolved) {
        let Some(spec) = CATALOG.get(op as usize) else {
            continue;
        };
        let cs = by_op.entry(op).or_insert_with(|| CallSites {
            pid: key.tgid,
            call: spec.name.into(),
            category: spec.category.as_str().into(),
            basis: SiteBasis::Calls,
            unattributed: Some(0),
            ..CallSites::default()
        });
        cs.total += s.calls;
        let Some((frames, source)) = frames else {
            *cs.unattributed.get_or_insert(0) += s.calls;
            continue;
        };
        let time_ns = (s.timed_calls > 0).then_some(s.time_ns);
        let list = merged.entry(op).or_default();
        // Two stacks that differ only inside the runtime library are one call site.
        match list.iter_mut().find(|c| c.frames == frames) {
            Some(c) => {
                c.count += s.calls;
                c.time_ns = match (c.time_ns, time_ns) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                };
            }
            None => list.push(CallSite {
                frames,
                count: s.calls,
                time_ns,
                source,
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
    python_sources(
        reader,
        key.tgid,
        inputs.start_ticks,
        out.iter_mut()
            .flat_map(|cs| cs.sites.iter_mut())
            .map(|s| (s.frames.as_slice(), &mut s.source)),
    );
    out
}

/// The (file, line) of a site named by a Python frame.
fn python_line(frames: &[Frame]) -> Option<(String, u32)> {
    let f = ethand_snapshot::stacks::key_frame(frames)
        .filter(|f| f.kind == ethand_snapshot::stacks::FrameKind::Python)?;
    Some((f.file.clone()?, f.line?))
}

/// The source text of the sites (frames, source) the kernel's Python walk named and that
/// have none yet, read as the process's owner in one request (none where the process is gone
/// or the file cannot be read).
pub fn python_sources<'a>(
    reader: &ReaderHandle,
    pid: u32,
    start_ticks: Option<u64>,
    sites: impl Iterator<Item = (&'a [Frame], &'a mut Option<String>)>,
) {
    let mut sites: Vec<((String, u32), &'a mut Option<String>)> = sites
        .filter(|(_, source)| source.is_none())
        .filter_map(|(frames, source)| Some((python_line(frames)?, source)))
        .collect();
    let mut want: Vec<(String, u32)> = sites.iter().map(|(k, _)| k.clone()).collect();
    want.sort();
    want.dedup();
    if want.is_empty() {
        return;
    }
    let Ok(r) = reader.reader.as_ref() else {
        return;
    };
    let texts = r
        .session(pid, start_ticks)
        .and_then(|mut s| s.source_lines(pid, start_ticks, &want, reader.symbolize_timeout));
    let Ok(texts) = texts else {
        return;
    };
    let found: HashMap<(String, u32), String> = want
        .into_iter()
        .zip(texts)
        .filter_map(|(k, t)| Some((k, t?)))
        .collect();
    for (k, source) in sites.iter_mut() {
        **source = found.get(k).cloned();
    }
}

/// A call's native frames up to the interpreter's own (the python executable or libpython:
/// its C frames say only that Python code ran), then its Python frames, at most
/// [`MAX_FRAMES`].
fn with_python(native: &[Frame], python: Vec<Frame>) -> Vec<Frame> {
    let interpreter = |f: &Frame| {
        f.module.as_deref().is_some_and(|m| {
            let name = m.rsplit('/').next().unwrap_or(m);
            name.starts_with("python") || name.starts_with("libpython")
        })
    };
    let mut frames: Vec<Frame> = native
        .iter()
        .take_while(|f| !interpreter(f))
        .cloned()
        .collect();
    frames.extend(python);
    frames.truncate(MAX_FRAMES);
    frames
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

/// A symbolized stack with the probed library's own frames dropped (the first is the probed
/// function; the runtime's own calls on the way in follow it in the same file), at most
/// [`MAX_FRAMES`] kept.
fn above_runtime(s: ethand_reader::SymStack) -> Resolved {
    let frames = s.frames;
    let lib = frames.first().map(|f| f.module.clone());
    let inner = frames
        .iter()
        .skip(1)
        .take_while(|f| f.module.is_some() && Some(&f.module) == lib.as_ref())
        .count();
    let mut frames: Vec<Frame> = frames.into_iter().skip(1 + inner).collect();
    frames.truncate(MAX_FRAMES);
    Resolved {
        frames,
        source: s.source,
    }
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

    /// Sites rank by count, beyond MAX_SITES they are summed in `other`, unattributed calls
    /// apart. Without a reader (unit tests run no supervisor; the end-to-end tests name real
    /// call sites) each frame keeps its address and says why it has no name.
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
            sites.insert((op, id, 0, 0), st(100 - u64::from(id)));
        }
        sites.insert((op, GPU_STACK_UNATTRIBUTED, 0, 0), st(5));
        let cache = Mutex::new(SiteCache::default());
        let reader =
            ReaderHandle::unavailable(&crate::config::Plan::defaults().reader, "test".into());
        let inputs = SiteInputs::new(key, None, &sites, &stacks).unwrap();
        let py = Mutex::new(PyFrames::default());
        let out = call_sites(&cache, &py, &reader, &inputs);
        assert_eq!(out.len(), 1);
        let cs = &out[0];
        assert_eq!(cs.call, "cuStreamSynchronize");
        assert_eq!(cs.unattributed, Some(5));
        let counted: u64 = cs.sites.iter().map(|s| s.count).sum::<u64>() + cs.other + 5;
        assert_eq!(cs.total, counted);
        assert!(cs.sites.len() <= MAX_SITES);
        assert!(cs.sites.windows(2).all(|w| w[0].count >= w[1].count));
        let f = &cs.sites[0].frames[0];
        assert!(f.offset.is_some(), "{f:?}");
        assert_eq!(
            f.unresolved.as_deref(),
            Some(ethand_reader::client::NO_READER)
        );
        // Not cached (asked again once there is a reader), the same answer.
        assert!(cache.lock().unwrap().entries.is_empty());
        assert_eq!(call_sites(&cache, &py, &reader, &inputs), out);
    }

    #[test]
    fn python_frames_replace_the_interpreters_own() {
        let native = |function: &str, module: &str| Frame {
            function: Some(function.into()),
            module: Some(module.into()),
            ..Frame::default()
        };
        let py = Frame {
            kind: ethand_snapshot::stacks::FrameKind::Python,
            function: Some("f".into()),
            line: Some(5),
            ..Frame::default()
        };
        let frames = with_python(
            &[
                native("ffi_call", "/usr/lib/x86_64-linux-gnu/libffi.so.8"),
                native(
                    "_ctypes_callproc",
                    "/usr/lib/python3.11/lib-dynload/_ctypes.so",
                ),
                native("_PyEval_EvalFrameDefault", "/usr/bin/python3.11"),
                native("main", "/usr/bin/python3.11"),
            ],
            vec![py.clone()],
        );
        let names: Vec<_> = frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .collect();
        assert_eq!(names, ["ffi_call", "_ctypes_callproc", "f"]);
        // A shared libpython is the interpreter too.
        let frames = with_python(
            &[native("PyObject_Call", "/opt/py/lib/libpython3.12.so.1.0")],
            vec![py],
        );
        assert_eq!(frames.len(), 1);
    }

    #[test]
    fn the_caller_is_added_where_the_walk_missed_it() {
        assert_eq!(with_caller(&[1, 3, 4], 2), [1, 2, 3, 4]);
        assert_eq!(with_caller(&[1, 2, 3], 2), [1, 2, 3]);
        assert_eq!(with_caller(&[1, 3], 0), [1, 3]);
    }
}
