//! The detail of the memory findings: the process that grows (or the largest), with its
//! measured figures, and each memory cgroup's limit, usage and OOM kills.
use ethand_exporters::format;
use ethand_exporters::terminal::memory;
use ethand_snapshot::TreeSnapshot;

/// "pid 12 (python3): resident 230 MiB (anonymous 220 MiB, file 8 MiB, shmem 2 MiB), grew
/// 12.0 MiB/s over the last 30 s (peak 231 MiB), swap 0 B" then one line per memory cgroup.
pub(super) fn detail(t: &TreeSnapshot) -> Vec<String> {
    let mut out = Vec::new();
    let named = t
        .memory_fastest_growth()
        .map(|(p, _)| p)
        .or_else(|| t.memory_largest().map(|(p, _)| p));
    if let Some((p, m)) = named.and_then(|p| Some((p, p.memory_now()?))) {
        let mut line = format!("pid {} ({}): {}", p.pid, p.comm, memory::split(m));
        let w = memory::window(m);
        if !w.is_empty() {
            line.push_str("; ");
            line.push_str(&w);
        }
        out.push(line);
    }
    for c in &t.memory_cgroups {
        out.push(memory::cgroup_line(c));
    }
    if let Some(n) = &t.node_memory {
        out.push(format!(
            "node: {} available of {} ({})",
            format::bytes_u(n.available_bytes),
            format::bytes_u(n.total_bytes),
            n.available_ratio().map_or("?".into(), format::percent)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use ethand_snapshot::memory::{CgroupMemory, MemoryWindow, NodeMemory, ProcessMemory};
    use ethand_snapshot::{ProcessSnapshot, SnapshotSource, TreeSnapshot};

    use super::super::rules::{BUILTIN_RULES, parse_rules};
    use super::super::{diagnose, signals};

    const MIB: u64 = 1 << 20;

    fn process(pid: u32, rss_mib: u64, first_mib: u64, window_s: u64) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            comm: format!("worker{pid}"),
            alive: true,
            memory: Some(ProcessMemory {
                rss_bytes: Some(rss_mib * MIB),
                anon_bytes: Some((rss_mib - 2) * MIB),
                file_bytes: Some(2 * MIB),
                shmem_bytes: Some(0),
                swap_bytes: Some(0),
                minor_faults: Some(1),
                major_faults: Some(0),
                window: Some(MemoryWindow {
                    duration_ms: window_s * 1000,
                    samples: 10,
                    peak_rss_bytes: rss_mib * MIB,
                    first_rss_bytes: first_mib * MIB,
                    last_rss_bytes: rss_mib * MIB,
                    first_anon_bytes: (first_mib - 2) * MIB,
                    last_anon_bytes: (rss_mib - 2) * MIB,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn tree(ps: Vec<ProcessSnapshot>, limit_mib: Option<u64>, usage_mib: u64) -> TreeSnapshot {
        TreeSnapshot {
            source: SnapshotSource::Daemon,
            root_pid: ps[0].pid,
            memory_cgroups: vec![CgroupMemory {
                path: "/job".into(),
                version: "v1".into(),
                pids: ps.iter().map(|p| p.pid).collect(),
                limit_bytes: limit_mib.map(|l| l * MIB),
                limit_path: limit_mib.map(|_| "/job".into()),
                usage_bytes: Some(usage_mib * MIB),
                oom_kills: Some(0),
                ..Default::default()
            }],
            node_memory: Some(NodeMemory {
                total_bytes: 64 << 30,
                available_bytes: 48 << 30,
                ..Default::default()
            }),
            processes: ps,
            ..Default::default()
        }
    }

    fn findings(t: &TreeSnapshot) -> Vec<ethand_snapshot::diagnosis::Finding> {
        let rules: Vec<_> = parse_rules(BUILTIN_RULES, "built-in")
            .unwrap()
            .into_iter()
            .filter_map(|(_, r)| r)
            .collect();
        diagnose(t, &rules)
    }

    #[test]
    fn growing_process_near_its_limit_is_named() {
        // Root steady at 100 MiB, a worker that grew from 20 to 120 MiB in 10 s; 230 of 256.
        let t = tree(
            vec![process(10, 100, 100, 10), process(11, 120, 20, 10)],
            Some(256),
            230,
        );
        let s = signals(&t);
        assert_eq!(s["mem.rss_bytes"], (220 * MIB) as f64);
        assert_eq!(s["mem.rss_growth_bytes_per_second"], (10 * MIB) as f64);
        assert!((s["mem.cgroup_limit_ratio"] - 230.0 / 256.0).abs() < 1e-9);
        assert_eq!(s["mem.seconds_to_limit"], 2.6);
        let f = findings(&t);
        let near = f.iter().find(|f| f.id == "near_oom").expect("near_oom");
        assert!(
            near.detail[0].starts_with("pid 11 (worker11): resident 120 MiB"),
            "{:?}",
            near.detail
        );
        assert!(
            near.detail[0].contains("grew 10.0 MiB/s"),
            "{:?}",
            near.detail
        );
        assert!(
            near.detail[1].contains("230 MiB used of its 256 MiB limit (89.8 %)"),
            "{:?}",
            near.detail
        );
    }

    #[test]
    fn growth_with_minutes_to_the_limit_fires_before_the_ratio() {
        // 50 of 256 MiB but growing 2 MiB/s: the limit is ~100 s away.
        let t = tree(vec![process(10, 50, 30, 10)], Some(256), 50);
        assert!(findings(&t).iter().any(|f| f.id == "near_oom"));
    }

    #[test]
    fn a_start_up_jump_is_not_extrapolated_to_the_limit() {
        // JAX on the H100: 118 MiB to 2.9 GiB in the 9 s window while it compiled, a 128 GiB
        // cgroup. At that rate the node's 48 GiB last 155 s, but that is 17 windows ahead.
        let t = tree(vec![process(10, 2970, 118, 9)], Some(128 * 1024), 4800);
        let s = signals(&t);
        assert_eq!(s["mem.growth_window_seconds"], 9.0);
        assert!(s["mem.seconds_to_limit"] > 12.0 * 9.0);
        assert!(
            !findings(&t).iter().any(|f| f.id == "near_oom"),
            "{:?}",
            findings(&t)
        );
    }

    #[test]
    fn big_steady_process_far_from_its_limit_gets_nothing() {
        let t = tree(vec![process(10, 4000, 4000, 10)], Some(16 * 1024), 4100);
        let s = signals(&t);
        assert_eq!(s["mem.rss_growth_bytes_per_second"], 0.0);
        assert!(!s.contains_key("mem.seconds_to_limit"));
        assert!(findings(&t).is_empty(), "{:?}", findings(&t));
        // No limit at all: no ratio, still nothing.
        let t = tree(vec![process(10, 4000, 4000, 10)], None, 4100);
        assert!(!signals(&t).contains_key("mem.cgroup_limit_ratio"));
        assert!(findings(&t).is_empty());
    }

    #[test]
    fn an_oom_kill_fires_and_unread_memory_is_absent() {
        let mut t = tree(vec![process(10, 100, 100, 10)], None, 100);
        t.memory_cgroups[0].oom_kills = Some(2);
        assert!(findings(&t).iter().any(|f| f.id == "near_oom"));
        t.processes[0].memory = None;
        t.memory_cgroups.clear();
        let s = signals(&t);
        for k in [
            "mem.rss_bytes",
            "mem.rss_growth_bytes_per_second",
            "mem.oom_kills",
        ] {
            assert!(!s.contains_key(k), "{k} without a reading");
        }
    }
}
