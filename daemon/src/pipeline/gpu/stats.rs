//! The snapshot view of a process's GPU/NPU calls, from the kernel's per-(process, symbol)
//! counters and per-process state.
use super::*;

/// The snapshot view of a process's GPU/NPU calls. None when it made no probed call.
/// `launches_counted`: the level in force probes launches; otherwise they stay None.
pub fn process_stats(
    calls: &BTreeMap<(u16, u16), GpuCallStats>,
    state: Option<&GpuProcState>,
    launches_counted: bool,
) -> Option<g::GpuProcessStats> {
    if calls.is_empty() && state.is_none() {
        return None;
    }
    let mut out = g::GpuProcessStats::default();
    if launches_counted {
        out.launches = Some(0);
        out.graph_launches = Some(0);
    }
    let mut copies: BTreeMap<u16, g::GpuCopyStats> = BTreeMap::new();
    let mut mem: Vec<g::GpuMemoryStats> = gpu_mem::NAMES
        .iter()
        .map(|k| g::GpuMemoryStats {
            kind: k.to_string(),
            ..Default::default()
        })
        .collect();
    let mut colls: BTreeMap<(&str, &str), g::CollectiveStats> = BTreeMap::new();
    for ((op, dir), s) in calls {
        let Some(spec) = CATALOG.get(*op as usize) else {
            continue;
        };
        out.errors += s.errors;
        let direction = if spec.category == Category::Copy {
            gpu_dir::NAMES
                .get(*dir as usize)
                .copied()
                .unwrap_or("default")
        } else {
            ""
        };
        out.symbols.push(g::GpuSymbolStats {
            library: spec.runtime.library().into(),
            symbol: spec.name.into(),
            category: spec.category.as_str().into(),
            direction: direction.into(),
            calls: s.calls,
            errors: s.errors,
            bytes: s.bytes,
            time_ns: s.time_ns,
            timed_calls: s.timed_calls,
        });
        let m = (spec.desc.mem as usize).min(gpu_mem::COUNT - 1);
        match spec.category {
            Category::Launch => {
                if let Some(n) = &mut out.launches {
                    *n += s.calls;
                }
            }
            Category::GraphLaunch => {
                if let Some(n) = &mut out.graph_launches {
                    *n += s.calls;
                }
            }
            Category::Copy => {
                let c = copies.entry(*dir).or_insert_with(|| g::GpuCopyStats {
                    direction: direction.into(),
                    ..Default::default()
                });
                c.calls += s.calls;
                c.bytes += s.bytes;
            }
            Category::Alloc => {
                // Successful allocations only: failed ones carry no bytes.
                mem[m].allocs += s.calls - s.errors.min(s.calls);
                mem[m].alloc_bytes += s.bytes;
            }
            // Frees are counted per allocation kind from the kernel's process state below.
            Category::Free => {}
            Category::Sync => add_timed(&mut out.sync, s),
            Category::Group => add_timed(&mut out.groups, s),
            Category::Collective => {
                let c = colls
                    .entry((spec.runtime.as_str(), spec.operation))
                    .or_insert_with(|| g::CollectiveStats {
                        library: spec.runtime.as_str().into(),
                        operation: spec.operation.into(),
                        ..Default::default()
                    });
                c.calls += s.calls;
                c.bytes += s.bytes;
                c.time_ns += s.time_ns;
                c.timed_calls += s.timed_calls;
            }
            Category::CommInit => out.comm_inits += s.calls,
        }
    }
    if let Some(st) = state {
        for (i, m) in mem.iter_mut().enumerate() {
            m.live_bytes = st.live_bytes[i];
            m.peak_bytes = st.peak_bytes[i].max(st.live_bytes[i]);
            m.frees = st.frees[i];
            m.freed_bytes = st.freed_bytes[i];
        }
        out.untracked_frees = st.untracked_frees;
        if st.nranks > 0 {
            out.comm = Some(g::CommRank {
                library: if st.comm_lib == u32::from(ethand_common::gpu_dtype::HCCL) {
                    "hccl".into()
                } else {
                    "nccl".into()
                },
                rank: (st.rank != u32::MAX).then_some(st.rank),
                nranks: st.nranks,
            });
        }
    }
    out.copies = copies.into_values().collect();
    out.memory = mem
        .into_iter()
        .filter(|m| m.allocs + m.frees + m.live_bytes > 0)
        .collect();
    out.collectives = colls.into_values().collect();
    out.symbols
        .sort_by(|a, b| b.calls.cmp(&a.calls).then(a.symbol.cmp(&b.symbol)));
    Some(out)
}

fn add_timed(t: &mut g::GpuTimedCalls, s: &GpuCallStats) {
    t.calls += s.calls;
    t.time_ns += s.time_ns;
    t.timed_calls += s.timed_calls;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_userspace_probes::catalog::op_id;

    fn st(calls: u64, errors: u64, bytes: u64, time_ns: u64, timed: u64) -> GpuCallStats {
        GpuCallStats {
            calls,
            errors,
            bytes,
            time_ns,
            timed_calls: timed,
        }
    }

    #[test]
    fn kernel_counters_become_the_process_picture() {
        let op = |rt, n| op_id(rt, n).unwrap();
        let mut calls = BTreeMap::new();
        calls.insert((op(Runtime::Cuda, "cuLaunchKernel"), 0), st(10, 0, 0, 0, 0));
        calls.insert(
            (op(Runtime::Cuda, "cuLaunchKernel_ptsz"), 0),
            st(5, 0, 0, 0, 0),
        );
        calls.insert((op(Runtime::Cuda, "cuGraphLaunch"), 0), st(2, 0, 0, 0, 0));
        // Two copy symbols in one direction sum; 2D copies carry their own direction.
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpyHtoD_v2"),
                u16::from(gpu_dir::HOST_TO_DEVICE),
            ),
            st(3, 0, 300, 0, 0),
        );
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpy2D_v2"),
                u16::from(gpu_dir::HOST_TO_DEVICE),
            ),
            st(1, 0, 50, 0, 0),
        );
        calls.insert(
            (
                op(Runtime::Cuda, "cuMemcpy2D_v2"),
                u16::from(gpu_dir::DEVICE_TO_HOST),
            ),
            st(1, 0, 70, 0, 0),
        );
        // One failed allocation: counted as a call and an error, not as an allocation.
        calls.insert(
            (op(Runtime::Cuda, "cuMemAlloc_v2"), 0),
            st(4, 1, 3000, 10, 4),
        );
        calls.insert((op(Runtime::Cuda, "cuMemFree_v2"), 0), st(2, 0, 1000, 0, 0));
        calls.insert(
            (op(Runtime::Cuda, "cuStreamSynchronize"), 0),
            st(6, 0, 0, 600, 6),
        );
        calls.insert(
            (op(Runtime::Nccl, "ncclAllReduce"), 0),
            st(2, 0, 8192, 40, 2),
        );
        calls.insert(
            (op(Runtime::Nccl, "ncclCommInitRankConfig"), 0),
            st(1, 0, 0, 0, 0),
        );
        let mut state = GpuProcState::default();
        state.live_bytes[0] = 2000;
        state.peak_bytes[0] = 3000;
        // Two cuMemFree_v2 calls: one of a tracked device allocation, one untracked.
        state.frees[0] = 1;
        state.freed_bytes[0] = 1000;
        state.untracked_frees = 1;
        state.comm_lib = u32::from(ethand_common::gpu_dtype::NCCL);
        state.rank = 1;
        state.nranks = 4;
        let g = process_stats(&calls, Some(&state), true).unwrap();
        assert_eq!(g.launches, Some(15));
        assert_eq!(g.graph_launches, Some(2));
        // Below `process` a launch count is not taken: absent, never 0.
        let below = process_stats(&calls, Some(&state), false).unwrap();
        assert_eq!((below.launches, below.graph_launches), (None, None));
        assert_eq!(g.copy_bytes("host_to_device"), 350);
        assert_eq!(g.copy_bytes("device_to_host"), 70);
        let dev = g.memory.iter().find(|m| m.kind == "device").unwrap();
        assert_eq!(
            (dev.allocs, dev.alloc_bytes, dev.frees, dev.freed_bytes),
            (3, 3000, 1, 1000)
        );
        assert_eq!((dev.live_bytes, dev.peak_bytes), (2000, 3000));
        assert_eq!((g.sync.calls, g.sync.time_ns), (6, 600));
        assert_eq!(g.collectives.len(), 1);
        assert_eq!(
            (g.collectives[0].operation.as_str(), g.collectives[0].bytes),
            ("all_reduce", 8192)
        );
        assert_eq!(
            g.comm,
            Some(g::CommRank {
                library: "nccl".into(),
                rank: Some(1),
                nranks: 4
            })
        );
        assert_eq!(g.errors, 1);
        assert_eq!(g.symbols.len(), calls.len());
    }

    #[test]
    fn nothing_called_means_no_gpu_section() {
        assert!(process_stats(&BTreeMap::new(), None, true).is_none());
    }
}
