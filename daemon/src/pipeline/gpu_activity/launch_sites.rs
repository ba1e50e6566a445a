//! A window's launch call sites as the snapshot shows them: the kernel's stack ids and
//! Python stack keys turned into frames (the GPU call sites' resolution, `gpu::sites`), sites
//! with equal frames merged, their kernel names demangled; after the model lock is released.
use std::collections::HashMap;

use ethand_snapshot::kernels::{GpuActivity, GpuActivityProcess};

use super::{RawLaunchSites, launches};

/// Launch call sites whose frames are read per process (most GPU time first); the others are
/// summed in `other`.
const MAX_RESOLVED_SITES: usize = 256;

/// Each process's launch call sites with their frames (symbolized by the reader as the
/// process's owner, its Python frames as the kernel walked them), sites with equal frames
/// merged, most GPU time first; after the model lock is released.
pub fn resolve_launch_sites(
    activity: &mut Option<GpuActivity>,
    raw: Vec<RawLaunchSites>,
    keys: &HashMap<u32, (ethand_common::ProcKey, Option<u64>)>,
    py: &std::sync::Mutex<crate::pipeline::gpu::python::PyFrames>,
    reader: &crate::pipeline::reader::ReaderHandle,
) {
    use crate::pipeline::gpu::sites;
    use ethand_snapshot::kernels::{KERNELS_PER_SITE, LaunchSite, TOP_LAUNCH_SITES, TimedCount};
    let Some(a) = activity else { return };
    for r in raw {
        let Some(ls) = a
            .processes
            .iter_mut()
            .find(|p| p.pid == r.pid)
            .and_then(|p| p.launch_sites.as_mut())
        else {
            continue;
        };
        let (key, ticks) = keys.get(&r.pid).copied().unwrap_or((
            ethand_common::ProcKey {
                tgid: r.pid,
                _pad0: 0,
                proc_start_ns: 0,
            },
            None,
        ));
        // The busiest sites are read (each a stack to symbolize); the rest are summed.
        let mut raw = r.sites;
        raw.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then(b.kernels.cmp(&a.kernels)));
        let unread = raw.split_off(raw.len().min(MAX_RESOLVED_SITES));
        let wanted: Vec<launches::SiteKey> = raw.iter().map(|s| s.key).collect();
        // Launch stack ids are reused from one window to the next: nothing to cache.
        let cache = std::sync::Mutex::new(sites::SiteCache::default());
        let frames = sites::resolve(&cache, py, reader, key, ticks, &wanted, &r.stacks);
        let mut merged: Vec<LaunchSite> = Vec::new();
        for (s, f) in raw.into_iter().zip(frames) {
            let (frames, source) = f.unwrap_or_default();
            match merged.iter_mut().find(|m| m.frames == frames) {
                Some(m) => {
                    m.kernels += s.kernels;
                    m.gpu_ns = m.gpu_ns.saturating_add(s.gpu_ns);
                    for k in s.top {
                        match m.top.iter_mut().find(|t| t.name == k.name) {
                            Some(t) => {
                                t.count += k.count;
                                t.gpu_ns = t.gpu_ns.saturating_add(k.gpu_ns);
                            }
                            None => m.top.push(k),
                        }
                    }
                }
                None => merged.push(LaunchSite {
                    frames,
                    source,
                    kernels: s.kernels,
                    gpu_ns: s.gpu_ns,
                    top: s.top,
                }),
            }
        }
        merged.sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then(b.kernels.cmp(&a.kernels)));
        for m in merged.iter_mut() {
            m.top
                .sort_by(|a, b| b.gpu_ns.cmp(&a.gpu_ns).then_with(|| a.name.cmp(&b.name)));
            m.top.truncate(KERNELS_PER_SITE);
        }
        let beyond = merged.split_off(merged.len().min(TOP_LAUNCH_SITES));
        let other = beyond
            .iter()
            .map(|s| (s.kernels, s.gpu_ns))
            .chain(unread.iter().map(|s| (s.kernels, s.gpu_ns)))
            .fold(None, |o: Option<TimedCount>, (k, ns)| {
                let mut o = o.unwrap_or_default();
                o.count += k;
                o.gpu_ns = o.gpu_ns.saturating_add(ns);
                Some(o)
            });
        ls.other = other;
        sites::python_sources(
            reader,
            r.pid,
            ticks,
            merged
                .iter_mut()
                .map(|s| (s.frames.as_slice(), &mut s.source)),
        );
        ls.sites = merged;
    }
}

/// Demangles the kernel names of a process's launch sites (one request).
pub(super) fn demangle_sites(
    p: &mut GpuActivityProcess,
    reader: &crate::pipeline::reader::ReaderHandle,
) {
    let Some(ls) = p.launch_sites.as_mut() else {
        return;
    };
    let mut kernels: Vec<&mut ethand_snapshot::kernels::KernelStat> = ls
        .sites
        .iter_mut()
        .flat_map(|s| s.top.iter_mut())
        .filter(|k| k.name.as_deref().is_some_and(|n| n.starts_with("_Z")))
        .collect();
    if kernels.is_empty() {
        return;
    }
    let names: Vec<String> = kernels.iter().filter_map(|k| k.name.clone()).collect();
    for (k, d) in kernels.iter_mut().zip(reader.demangle(p.pid, &names)) {
        k.demangled = d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::gpu::sites::Stack;
    use ethand_snapshot::kernels::ActivityState;

    use super::super::JoinedSite;

    fn site(id: u32, kernels: u64, ns: u64, names: &[(&str, u64, u64)]) -> JoinedSite {
        JoinedSite {
            key: (id, 0, 0),
            kernels,
            gpu_ns: ns,
            top: names
                .iter()
                .map(|(n, c, t)| ethand_snapshot::kernels::KernelStat {
                    name: Some((*n).into()),
                    count: *c,
                    gpu_ns: *t,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Two stacks that differ only inside the runtime are one site: their kernels summed by
    /// name; a third, busier site first; a site without a stack is one without frames.
    #[test]
    fn launch_sites_with_equal_frames_are_one() {
        let here = launch_sites_with_equal_frames_are_one as fn() as usize as u64;
        // Innermost frame in "the runtime" (no mapping), then the same caller.
        let stacks: HashMap<u32, Stack> = [
            (1, Stack::from(vec![1, here + 16])),
            (2, Stack::from(vec![2, here + 16])),
            (3, Stack::from(vec![3, here + 4096])),
        ]
        .into_iter()
        .collect();
        let raw = vec![RawLaunchSites {
            pid: std::process::id(),
            sites: vec![
                site(1, 3, 30, &[("a", 2, 20), ("b", 1, 10)]),
                site(2, 2, 25, &[("a", 2, 25)]),
                site(3, 1, 100, &[("c", 1, 100)]),
                site(ethand_common::GPU_STACK_UNATTRIBUTED, 4, 4, &[("d", 4, 4)]),
            ],
            stacks,
        }];
        let mut a = Some(GpuActivity {
            processes: vec![GpuActivityProcess {
                pid: std::process::id(),
                state: ActivityState::Recorded,
                launch_sites: Some(Default::default()),
                ..Default::default()
            }],
            ..Default::default()
        });
        let reader = crate::pipeline::reader::ReaderHandle::unavailable(
            &crate::config::Plan::defaults().reader,
            "test".into(),
        );
        let py = std::sync::Mutex::new(crate::pipeline::gpu::python::PyFrames::default());
        resolve_launch_sites(&mut a, raw, &HashMap::new(), &py, &reader);
        let ls = a.unwrap().processes[0].launch_sites.clone().unwrap();
        let got: Vec<(u64, u64, Vec<(String, u64, u64)>)> = ls
            .sites
            .iter()
            .map(|s| {
                (
                    s.kernels,
                    s.gpu_ns,
                    s.top
                        .iter()
                        .map(|k| (k.name.clone().unwrap(), k.count, k.gpu_ns))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 100, vec![("c".into(), 1, 100)]),
                (5, 55, vec![("a".into(), 4, 45), ("b".into(), 1, 10)]),
                (4, 4, vec![("d".into(), 4, 4)]),
            ]
        );
        assert!(ls.sites[2].frames.is_empty());
        assert_eq!(ls.other, None);
    }
}
