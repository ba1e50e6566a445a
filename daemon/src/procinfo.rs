//! Process metadata from /proc. Read once when ethand first sees a process and again after
//! it execs; never on a per-event path.
use std::fs;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcMeta {
    pub ppid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// The command line was longer than [`CMDLINE_MAX`] and is cut there.
    pub cmdline_truncated: bool,
    pub exe: String,
    pub cgroup: String,
    pub uid: u32,
    /// Start time in clock ticks after boot (field 22 of /proc/PID/stat).
    pub start_ticks: u64,
    /// Container, pod, job and rank (filled by the model through `attribution`).
    pub workload: Option<ethand_exporters::snapshot::WorkloadIdentity>,
}

/// Parses /proc/PID/stat: "pid (comm) state ppid ...". comm may contain spaces and ')'.
pub fn parse_stat(text: &str) -> Option<(String, u32, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] = state (field 3), rest[1] = ppid (4), rest[19] = starttime (22).
    let ppid = rest.get(1)?.parse().ok()?;
    let start = rest.get(19)?.parse().ok()?;
    Some((comm, ppid, start))
}

/// The cgroup v2 path from /proc/PID/cgroup (the "0::" line).
pub fn parse_cgroup(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("")
        .to_string()
}

pub fn parse_uid(status: &str) -> u32 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX)
}

/// The start time (clock ticks after boot) of a process, from /proc/PID/stat alone: the
/// liveness check of every tracked process, so one small read.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&String::from_utf8_lossy(&stat)).map(|(_, _, start)| start)
}

/// Most bytes of a command line ethand reads and keeps, as `ps` keeps a bounded one: any user
/// can start processes with megabytes of arguments, and whole they cost the daemon their size
/// per process and made one snapshot hundreds of MB. Longer ones are cut and marked.
pub const CMDLINE_MAX: usize = 4096;

/// The arguments of a command line as /proc gives it (NUL-separated), at most
/// [`CMDLINE_MAX`] bytes of it, and whether it went on beyond.
pub fn parse_cmdline(raw: &[u8]) -> (Vec<String>, bool) {
    let truncated = raw.len() > CMDLINE_MAX;
    let args = raw[..raw.len().min(CMDLINE_MAX)]
        .split(|c| *c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    (args, truncated)
}

/// Reads at most [`CMDLINE_MAX`] + 1 bytes: the kernel copies out of the process's memory
/// only what is asked for.
fn read_cmdline(pid: u32) -> (Vec<String>, bool) {
    use std::io::Read as _;
    let mut raw = Vec::new();
    match fs::File::open(format!("/proc/{pid}/cmdline"))
        .and_then(|f| f.take(CMDLINE_MAX as u64 + 1).read_to_end(&mut raw))
    {
        Ok(_) => parse_cmdline(&raw),
        Err(_) => (Vec::new(), false),
    }
}

/// Longest cgroup file read: a path nested as deep as a user may make it stays far below.
const CGROUP_FILE_MAX: u64 = 64 * 1024;

pub fn read(pid: u32) -> Option<ProcMeta> {
    use std::io::Read as _;
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let (comm, ppid, start_ticks) = parse_stat(&String::from_utf8_lossy(&stat))?;
    let (cmdline, cmdline_truncated) = read_cmdline(pid);
    let exe = fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut cgroup_file = String::new();
    let cgroup = fs::File::open(format!("/proc/{pid}/cgroup"))
        .and_then(|f| f.take(CGROUP_FILE_MAX).read_to_string(&mut cgroup_file))
        .map(|_| parse_cgroup(&cgroup_file))
        .unwrap_or_default();
    let uid = fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|t| parse_uid(&t))
        .unwrap_or(u32::MAX);
    Some(ProcMeta {
        ppid,
        comm,
        cmdline,
        cmdline_truncated,
        exe,
        cgroup,
        uid,
        start_ticks,
        workload: None,
    })
}

pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    // Bytes: a name is not always UTF-8 (invalid sequences become U+FFFD, as for comm).
    fs::read(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\n')
                .to_string()
        })
}

pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// CLOCK_MONOTONIC and CLOCK_BOOTTIME now, in ns.
pub fn clocks_ns() -> (u64, u64) {
    let get = |id| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid pointer to a timespec.
        unsafe { libc::clock_gettime(id, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    (get(libc::CLOCK_MONOTONIC), get(libc::CLOCK_BOOTTIME))
}

/// ethand's own CPU seconds and RSS bytes.
pub fn self_usage() -> (f64, u64) {
    let cpu = fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| {
            let close = t.rfind(')')?;
            let f: Vec<&str> = t[close + 1..].split_whitespace().collect();
            let utime: u64 = f.get(11)?.parse().ok()?;
            let stime: u64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / clock_ticks() as f64)
        })
        .unwrap_or(0.0);
    let rss = fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4096)
        .unwrap_or(0);
    (cpu, rss)
}

/// `root` and every live process below it, from /proc now (each process's parent in its
/// `stat`), root first. Empty when `root` does not exist.
pub fn descendants(root: u32) -> Vec<u32> {
    if !exists(root) {
        return Vec::new();
    }
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some((_, ppid, _)) = parse_stat(&stat)
            {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// Swapped-out bytes (`VmSwap`) and major faults since start (`stat` field 12) of a live
/// process; None for what could not be read.
pub fn memory(pid: u32) -> (Option<u64>, Option<u64>) {
    let swap = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("VmSwap:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    let majflt = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let i = stat.rfind(')')?;
            stat[i + 1..].split_whitespace().nth(9)?.parse::<u64>().ok()
        });
    (swap, majflt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_comm() {
        let t = "1234 (a) b (c)) S 77 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        let (comm, ppid, start) = parse_stat(t).unwrap();
        assert_eq!(comm, "a) b (c)");
        assert_eq!(ppid, 77);
        assert_eq!(start, 98765);
    }

    #[test]
    fn cgroup_v2_line() {
        let t = "12:pids:/user.slice\n0::/kubepods.slice/cri-containerd-abc.scope\n";
        assert_eq!(parse_cgroup(t), "/kubepods.slice/cri-containerd-abc.scope");
        assert_eq!(parse_cgroup("3:cpu:/\n"), "");
    }

    #[test]
    fn long_command_lines_are_cut_and_marked() {
        let (args, cut) = parse_cmdline(b"python3\0train.py\0--lr\x000.1\0");
        assert_eq!(args, ["python3", "train.py", "--lr", "0.1"]);
        assert!(!cut);
        let mut raw = b"sleep\0".to_vec();
        raw.extend(std::iter::repeat_n(b'x', 3 * CMDLINE_MAX));
        let (args, cut) = parse_cmdline(&raw);
        assert!(cut);
        assert_eq!(args.len(), 2);
        // "sleep", its NUL and the first 4,090 bytes of the next argument: 4 KiB in all.
        assert_eq!(args.join(" ").len(), CMDLINE_MAX);
        // Exactly the limit is not cut.
        let (_, cut) = parse_cmdline(&vec![b'y'; CMDLINE_MAX]);
        assert!(!cut);
    }

    #[test]
    fn reads_self() {
        let m = read(std::process::id()).unwrap();
        assert!(!m.comm.is_empty());
        assert!(m.start_ticks > 0);
    }
}
