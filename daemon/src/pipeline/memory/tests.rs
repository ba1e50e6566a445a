use super::*;

const STATUS: &str = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t  300000 kB\nVmHWM:\t  120000 kB\nVmRSS:\t  110000 kB\nRssAnon:\t  100000 kB\nRssFile:\t    8000 kB\nRssShmem:\t    2000 kB\nVmSwap:\t      12 kB\nThreads:\t1\n";

#[test]
fn status_gives_the_split_in_bytes() {
    let m = parse_status(STATUS.as_bytes());
    assert_eq!(m.anon, Some(100_000 * 1024));
    assert_eq!(m.file, Some(8_000 * 1024));
    assert_eq!(m.shmem, Some(2_000 * 1024));
    assert_eq!(m.swap, Some(12 * 1024));
    assert_eq!(m.hwm, Some(120_000 * 1024));
    assert_eq!(m.rss(), Some(110_000 * 1024));
}

#[test]
fn status_hostile_lines_are_none_not_zero() {
    // A comm crafted to look like a field (the kernel escapes newlines, but be sure), a
    // missing unit, garbage, an overflow, a huge line.
    let huge = "x".repeat(1 << 20);
    let text = format!(
        "Name:\tRssAnon: 5 kB\nRssAnon:\t12abc kB\nRssFile:\t99999999999999999999 kB\nRssShmem:\t7\nVmSwap:\t1 kB extra\nVmHWM:\t{huge}\n"
    );
    let m = parse_status(text.as_bytes());
    assert_eq!(m, StatusMemory::default());
    assert_eq!(m.rss(), None);
    // u64 kB that overflows when made bytes.
    let m = parse_status(format!("RssAnon:\t{} kB\n", u64::MAX / 512).as_bytes());
    assert_eq!(m.anon, None);
    // Not UTF-8.
    assert_eq!(parse_status(b"RssAnon:\t\xff\xfe kB\n").anon, None);
    // A partial split has no RSS.
    let m = parse_status(b"RssAnon:\t4 kB\nRssFile:\t4 kB\n");
    assert_eq!((m.anon, m.rss()), (Some(4096), None));
}

#[test]
fn stat_faults_after_the_last_parenthesis() {
    let stat = b"42 (a) b) c) S 1 42 42 0 -1 4194304 1234 50 7 0 10 5 0 0 20 0 1 0 999 1000 200 1";
    assert_eq!(parse_stat_faults(stat), Some((1234, 7)));
    assert_eq!(parse_stat_faults(b"42 (x) S 1 2"), None);
    assert_eq!(parse_stat_faults(b"no parenthesis at all"), None);
    assert_eq!(parse_stat_faults(b"1 (x) S 1 1 1 0 -1 0 -5 0 7"), None);
    assert_eq!(parse_stat_faults(b""), None);
}

#[test]
fn meminfo_needs_total_and_available() {
    let m = parse_meminfo(b"MemTotal:  8000 kB\nMemFree: 100 kB\nMemAvailable:  2000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
        .expect("parsed");
    assert_eq!(m.total_bytes, 8000 * 1024);
    assert_eq!(m.available_bytes, 2000 * 1024);
    assert_eq!(m.available_ratio(), Some(0.25));
    assert_eq!(parse_meminfo(b"MemTotal: 8000 kB\n"), None);
    assert_eq!(parse_meminfo(b"MemTotal: x kB\nMemAvailable: 1 kB\n"), None);
}

#[test]
fn memory_cgroup_line_v1_first_then_v2() {
    let text = b"9:name=systemd:/\n4:memory:/job/a\n0::/user.slice\n";
    assert_eq!(
        parse_memory_cgroup(text, true),
        Some((CgroupVersion::V1, "/job/a".into()))
    );
    // Combined controllers.
    assert_eq!(
        parse_memory_cgroup(b"3:cpu,memory:/x\n", false),
        Some((CgroupVersion::V1, "/x".into()))
    );
    assert_eq!(
        parse_memory_cgroup(b"0::/a/b\n", true),
        Some((CgroupVersion::V2, "/a/b".into()))
    );
    // v2 without the memory controller there: no memory cgroup.
    assert_eq!(parse_memory_cgroup(b"0::/a/b\n", false), None);
    // A path with ':' keeps it.
    assert_eq!(
        parse_memory_cgroup(b"4:memory:/a:b\n", false),
        Some((CgroupVersion::V1, "/a:b".into()))
    );
    assert_eq!(parse_memory_cgroup(b"garbage\n\xff\n", true), None);
}

#[test]
fn hostile_cgroup_paths_are_refused() {
    assert_eq!(safe_relative("/a/b"), Ok(vec!["a", "b"]));
    assert_eq!(safe_relative("/"), Ok(vec![]));
    assert_eq!(safe_relative("//a//b/"), Ok(vec!["a", "b"]));
    assert!(safe_relative("/../../etc").is_err());
    assert!(safe_relative("/a/../../b").is_err());
    assert!(safe_relative("/a/./b").is_err());
    assert!(safe_relative("a/b").is_err());
    assert!(safe_relative("").is_err());
    assert!(safe_relative(&"/a".repeat(65)).is_err());
    assert!(safe_relative(&format!("/{}", "x".repeat(5000))).is_err());
    assert!(safe_relative("/a\0b").is_err());
}

#[test]
fn limits_and_events() {
    assert_eq!(parse_limit(b"max\n", CgroupVersion::V2), None);
    assert_eq!(
        parse_limit(b"268435456\n", CgroupVersion::V2),
        Some(268435456)
    );
    assert_eq!(
        parse_limit(b"9223372036854771712\n", CgroupVersion::V1),
        None
    );
    assert_eq!(
        parse_limit(b"268435456\n", CgroupVersion::V1),
        Some(268435456)
    );
    assert_eq!(parse_limit(b"-1\n", CgroupVersion::V1), None);
    assert_eq!(parse_limit(b"", CgroupVersion::V1), None);
    let events = b"low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n";
    assert_eq!(keyed(events, "oom"), Some(3));
    assert_eq!(keyed(events, "oom_kill"), Some(2));
    assert_eq!(
        keyed(b"oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "oom_kill"),
        Some(1)
    );
    assert_eq!(
        keyed(b"oom_kill_disable 0\nunder_oom 0\n", "oom_kill"),
        None
    );
    assert_eq!(keyed(b"oom_kill x\n", "oom_kill"), None);
}

#[test]
fn this_process_reads_itself() {
    let m = read_process(std::process::id()).expect("own memory");
    let rss = m.rss_bytes.expect("rss");
    assert!(rss > 0 && m.anon_bytes.unwrap() <= rss);
    assert!(m.minor_faults.expect("faults") > 0);
    assert_eq!(read_process(u32::MAX), None);
}

/// The per-read cost of a round's sample and of the sweep's fault read, over every process
/// of this machine (`cargo test --release -p ethand --lib memory_read_cost -- --ignored
/// --nocapture`).
#[test]
#[ignore = "a measurement, not a check"]
fn memory_read_cost() {
    let pids = crate::pipeline::procinfo::pids();
    let mut buf = Vec::with_capacity(4096);
    let rounds = 50;
    let t0 = std::time::Instant::now();
    let mut read = 0u64;
    for _ in 0..rounds {
        for &p in &pids {
            read += u64::from(sample(p, &mut buf).is_some());
        }
    }
    let status_us = t0.elapsed().as_secs_f64() * 1e6 / (rounds * pids.len()) as f64;
    let t0 = std::time::Instant::now();
    for _ in 0..rounds {
        for &p in &pids {
            let _ = faults(p, &mut buf);
        }
    }
    let stat_us = t0.elapsed().as_secs_f64() * 1e6 / (rounds * pids.len()) as f64;
    println!(
        "{} processes ({} with memory), {rounds} passes: status sample {status_us:.1} us a process, stat faults {stat_us:.1} us",
        pids.len(),
        read / rounds as u64
    );
}
