//! The cores a process may use: its CPU affinity (which a cpuset cgroup bounds) and the CFS
//! bandwidth quota of its cgroup and the cgroups above it (v1 `cpu.cfs_quota_us` /
//! `cpu.cfs_period_us`, v2 `cpu.max`). Read for a tree snapshot, never on the collection loop.
//!
//! The cgroup path comes from /proc/PID/cgroup: kernel-formatted, but its names were chosen by
//! whoever may create cgroups (a delegated subtree, a container runtime), so the path is
//! checked component by component and opened beneath the controller's mount
//! (`RESOLVE_BENEATH`, no symlinks): a name never leads outside the cgroup filesystem.
use std::{
    collections::HashMap,
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use super::memory::{CgroupVersion, Hierarchy, safe_relative};

/// Most bytes read of /proc/PID/status, /proc/PID/cgroup and /proc/self/mountinfo lines.
const TEXT_MAX: u64 = 64 * 1024;

/// The limits of one process; each None where it could not be read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuLimits {
    /// CPUs in its affinity mask.
    pub affinity_cpus: Option<u32>,
    /// The tightest CFS quota of its cgroup and those above it, in cores; None: no quota
    /// (or not readable).
    pub quota_cores: Option<f64>,
}

/// Where the cpu controller is mounted in the daemon's mount namespace.
#[derive(Clone, Debug, Default)]
pub struct CpuMounts {
    v1_cpu: Option<PathBuf>,
    v2: Option<PathBuf>,
}

impl CpuMounts {
    /// From /proc/self/mountinfo (bounded).
    pub fn read() -> Self {
        read_bounded(Path::new("/proc/self/mountinfo"), TEXT_MAX)
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    fn parse(mountinfo: &str) -> Self {
        let mut m = Self::default();
        for line in mountinfo.lines() {
            let Some((before, after)) = line.split_once(" - ") else {
                continue;
            };
            let Some(point) = before.split(' ').nth(4) else {
                continue;
            };
            let mut rest = after.split(' ');
            let (Some(fstype), _, Some(opts)) = (rest.next(), rest.next(), rest.next()) else {
                continue;
            };
            match fstype {
                "cgroup2" if m.v2.is_none() => m.v2 = Some(PathBuf::from(point)),
                "cgroup" if opts.split(',').any(|o| o == "cpu") => {
                    m.v1_cpu = Some(PathBuf::from(point));
                }
                _ => {}
            }
        }
        m
    }
}

/// A process's affinity and quota; quotas cached per cgroup for one tree.
pub fn read(pid: u32, mounts: &CpuMounts, cache: &mut HashMap<String, Option<f64>>) -> CpuLimits {
    let affinity_cpus =
        read_bounded(Path::new(&format!("/proc/{pid}/status")), TEXT_MAX).and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(|v| count_cpu_list(v.trim()))
        });
    let quota_cores =
        read_bounded(Path::new(&format!("/proc/{pid}/cgroup")), TEXT_MAX).and_then(|text| {
            let (mount, path, v2) = cpu_cgroup(&text, mounts)?;
            let key = format!("{}\0{path}", mount.display());
            *cache
                .entry(key)
                .or_insert_with(|| tightest_quota(&mount, &path, v2))
        });
    CpuLimits {
        affinity_cpus,
        quota_cores,
    }
}

/// "0-3,8,10-11" -> 7. None for anything else.
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut n: u32 = 0;
    for part in list.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    (n > 0).then_some(n)
}

/// The cpu controller's mount and the process's path under it (v1 first: on a hybrid host
/// the v1 hierarchy holds the controller), and whether it is v2.
fn cpu_cgroup(text: &str, mounts: &CpuMounts) -> Option<(PathBuf, String, bool)> {
    let mut v2 = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "cpu")
            && let Some(m) = &mounts.v1_cpu
        {
            return Some((m.clone(), path.to_string(), false));
        }
    }
    Some((mounts.v2.clone()?, v2?, true))
}

/// The smallest quota in cores from the cgroup up to the root; None when none is set.
fn tightest_quota(mount: &Path, path: &str, v2: bool) -> Option<f64> {
    // The same checks and the same opening beneath the mount as the memory cgroups'.
    let parts = safe_relative(path).ok()?;
    let version = if v2 {
        CgroupVersion::V2
    } else {
        CgroupVersion::V1
    };
    let root = Hierarchy::open(mount.to_str()?, version)?;
    let mut buf = Vec::new();
    let mut control = |depth: usize, file: &str| {
        root.read(&parts[..depth], file, &mut buf)
            .then(|| String::from_utf8_lossy(&buf).into_owned())
    };
    let mut best: Option<f64> = None;
    for depth in (0..=parts.len()).rev() {
        let q = if v2 {
            control(depth, "cpu.max").and_then(|t| parse_v2_max(&t))
        } else {
            let quota = control(depth, "cpu.cfs_quota_us");
            let period = control(depth, "cpu.cfs_period_us");
            quota.zip(period).and_then(|(q, p)| parse_v1(&q, &p))
        };
        if let Some(q) = q {
            best = Some(best.map_or(q, |b: f64| b.min(q)));
        }
    }
    best
}

/// `cpu.max`: "max 100000" (none) or "50000 100000" (0.5 cores).
fn parse_v2_max(text: &str) -> Option<f64> {
    let mut f = text.split_whitespace();
    let quota = f.next()?;
    let period: f64 = f.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let q: f64 = quota.parse().ok()?;
    (q > 0.0).then(|| q / period)
}

/// v1: quota -1 is none.
fn parse_v1(quota: &str, period: &str) -> Option<f64> {
    let q: i64 = quota.trim().parse().ok()?;
    let p: i64 = period.trim().parse().ok()?;
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

fn read_bounded(path: &Path, max: u64) -> Option<String> {
    let mut s = String::new();
    File::open(path)
        .ok()?
        .take(max)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_and_garbage_is_refused() {
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("1"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("0-4294967295,0-4294967295"), None);
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("a-b"), None);
    }

    #[test]
    fn quotas_parse_as_cores() {
        assert_eq!(parse_v2_max("max 100000\n"), None);
        assert_eq!(parse_v2_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_v2_max("250000 100000"), Some(2.5));
        assert_eq!(parse_v2_max("-5 100000"), None);
        assert_eq!(parse_v2_max("garbage"), None);
        assert_eq!(parse_v1("-1\n", "100000\n"), None);
        assert_eq!(parse_v1("150000\n", "100000\n"), Some(1.5));
        assert_eq!(parse_v1("1", "0"), None);
    }

    #[test]
    fn mounts_and_the_cpu_cgroup_of_a_hybrid_host() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n\
                  31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime shared:6 - cgroup cgroup rw,cpu\n\
                  32 25 0:28 / /sys/fs/cgroup/cpuacct rw,relatime shared:7 - cgroup cgroup rw,cpuacct\n";
        let m = CpuMounts::parse(mi);
        assert_eq!(m.v1_cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        let (mount, path, v2) = cpu_cgroup("2:cpuacct:/\n1:cpu:/job/a\n0::/x\n", &m).unwrap();
        assert_eq!(
            (mount.as_path(), path.as_str(), v2),
            (Path::new("/sys/fs/cgroup/cpu"), "/job/a", false)
        );
        let only_v2 =
            CpuMounts::parse("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
        let (_, path, v2) = cpu_cgroup("0::/kubepods/pod1\n", &only_v2).unwrap();
        assert_eq!((path.as_str(), v2), ("/kubepods/pod1", true));
    }

    /// A quota set on a real v1 cgroup (this host's cpu controller) is read back, bounded by
    /// its parent's; the process's affinity is what sched_setaffinity set.
    #[test]
    fn a_real_quota_and_affinity_are_read() {
        let mounts = CpuMounts::read();
        let Some(cpu) = mounts.v1_cpu.clone().or(mounts.v2.clone()) else {
            eprintln!("no cgroup cpu controller mounted: nothing to read");
            return;
        };
        let me = std::process::id();
        let limits = read(me, &mounts, &mut HashMap::new());
        let online = std::thread::available_parallelism().unwrap().get() as u32;
        assert_eq!(limits.affinity_cpus, Some(online));
        // Creating cgroups needs root and a writable hierarchy (not the unprivileged tier).
        let dir = cpu.join(format!("ethand-cpu-limits-test-{me}"));
        if std::fs::create_dir(&dir).is_err() {
            eprintln!("cannot create {}: skipping the quota half", dir.display());
            return;
        }
        let v2 = mounts.v1_cpu.is_none();
        let set = if v2 {
            std::fs::write(dir.join("cpu.max"), "150000 100000")
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000")
                .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), "150000"))
        };
        let rel = format!("/ethand-cpu-limits-test-{me}");
        let got = set.ok().and_then(|_| tightest_quota(&cpu, &rel, v2));
        let _ = std::fs::remove_dir(&dir);
        assert_eq!(got, Some(1.5));
    }
}
