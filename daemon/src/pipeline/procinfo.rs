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
    /// Boxed: most processes have none, and thousands of short-lived ones are kept at once.
    pub workload: Option<Box<ethand_snapshot::WorkloadIdentity>>,
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

/// The kernel's on-CPU total of a thread (`se.sum_exec_runtime`, ns): the first field of
/// /proc/PID/task/TID/schedstat. Current to the last scheduler tick while the thread runs.
pub fn thread_exec_runtime_ns(pid: u32, tid: u32) -> Option<u64> {
    let mut buf = [0u8; 96];
    let n = fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat"))
        .and_then(|mut f| std::io::Read::read(&mut f, &mut buf))
        .ok()?;
    parse_schedstat_exec(&buf[..n])
}

pub fn parse_schedstat_exec(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text)
        .ok()?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The time the hypervisor ran something else while this machine's CPUs wanted to run
/// ("steal", all CPUs together), in clock ticks since boot; None outside a VM's accounting.
pub fn steal_ticks() -> Option<u64> {
    parse_steal_ticks(&std::fs::read("/proc/stat").ok()?)
}

/// The eighth value of /proc/stat's first line ("cpu  user nice system idle iowait irq
/// softirq steal ...").
pub fn parse_steal_ticks(stat: &[u8]) -> Option<u64> {
    let line = stat.split(|b| *b == b'\n').next()?;
    let mut f = std::str::from_utf8(line).ok()?.split_ascii_whitespace();
    (f.next()? == "cpu").then_some(())?;
    f.nth(7)?.parse().ok()
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

/// The pids of /proc (processes, not threads), in directory order.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// The process a thread id belongs to (`Tgid:` of /proc/TID/status; a tid is not listed in
/// /proc but resolves there). None when no such task lives.
pub fn tgid_of(tid: u32) -> Option<u32> {
    fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// cgroup v2 ids (the kernel's `bpf_get_current_cgroup_id()`, the inode number of the
/// cgroup's directory) to paths as /proc/PID/cgroup writes them ("/system.slice/x.service"),
/// for processes that exited before their /proc entry was read.
#[derive(Debug, Default)]
pub struct CgroupPaths {
    root: Option<std::path::PathBuf>,
    by_id: std::collections::HashMap<u64, String>,
    /// Collection round of the last walk: a miss walks the hierarchy at most once a round.
    walked_round: Option<u64>,
}

/// Most cgroups one walk records (and directory levels it descends): bounds the daemon's
/// work and memory however many cgroups local users create.
const CGROUP_WALK_MAX: usize = 100_000;
const CGROUP_WALK_DEPTH: usize = 64;

impl CgroupPaths {
    pub fn new() -> Self {
        // The unified hierarchy: /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts.
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.join("cgroup.procs").exists());
        Self::with_root(root)
    }

    pub fn with_root(root: Option<std::path::PathBuf>) -> Self {
        Self {
            root,
            ..Default::default()
        }
    }

    /// The path of cgroup `id`; walks the hierarchy again on a miss (once per `round`).
    /// None: not found (removed before it could be looked up) or no cgroup v2.
    pub fn path(&mut self, id: u64, round: u64) -> Option<String> {
        if id == 0 {
            return None;
        }
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        if self.walked_round == Some(round) {
            return None;
        }
        self.walked_round = Some(round);
        self.walk();
        self.by_id.get(&id).cloned()
    }

    fn walk(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        let Some(root) = self.root.clone() else {
            return;
        };
        // Rebuilt whole: removed cgroups leave, so the table is bounded by the live ones.
        self.by_id.clear();
        let mut stack = vec![(root.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            if self.by_id.len() >= CGROUP_WALK_MAX {
                break;
            }
            let Ok(md) = fs::symlink_metadata(&dir) else {
                continue;
            };
            let rel = dir
                .strip_prefix(&root)
                .map(|r| r.to_string_lossy().into_owned());
            let Ok(rel) = rel else { continue };
            self.by_id.insert(md.ino(), format!("/{rel}"));
            if depth >= CGROUP_WALK_DEPTH {
                continue;
            }
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
    }
}

/// What a live thread is doing when a snapshot is taken, from /proc/PID/task/TID.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadNow {
    /// The state letter of /proc's stat (R, S, D, T, t, Z, X, I).
    pub state: char,
    /// The syscall it is in and its six arguments (/proc's `syscall` file); None when it is
    /// not in one (running in user space, or asleep outside a syscall such as a page fault),
    /// or the file could not be read.
    pub syscall: Option<(u32, [u64; 6])>,
}

/// Most threads of one process whose state a snapshot reads: a process with 100,000 threads
/// costs a bounded number of /proc reads.
pub const THREADS_NOW_MAX: usize = 1024;

/// The thread ids of a live process (at most `max`, lowest first).
pub fn task_ids(pid: u32, max: usize) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids.truncate(max);
    tids
}

/// The state letter of /proc/PID/task/TID/stat (the field after the name).
pub fn parse_state(stat: &str) -> Option<char> {
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// /proc/PID/task/TID/syscall: "NR ARG1 .. ARG6 SP PC" (arguments in hex) while in a syscall,
/// "-1 SP PC" when blocked outside one, "running" when on a CPU.
pub fn parse_syscall(text: &str) -> Option<(u32, [u64; 6])> {
    let mut f = text.split_whitespace();
    let nr: i64 = f.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let mut args = [0u64; 6];
    for a in &mut args {
        let v = f.next()?;
        *a = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
    }
    Some((u32::try_from(nr).ok()?, args))
}

pub fn thread_now(pid: u32, tid: u32) -> Option<ThreadNow> {
    let stat = fs::read(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let state = parse_state(&String::from_utf8_lossy(&stat))?;
    // Only a thread that is not running has a syscall worth reading (and a stable one).
    let syscall = if state == 'R' {
        None
    } else {
        fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
            .ok()
            .and_then(|t| parse_syscall(&t))
    };
    Some(ThreadNow { state, syscall })
}

/// What ps calls a state letter.
pub fn state_name(c: char) -> &'static str {
    match c {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk sleep",
        'T' => "stopped",
        't' => "tracing stop",
        'Z' => "zombie",
        'X' => "dead",
        'I' => "idle",
        _ => "unknown",
    }
}

/// What descriptor `fd` of `pid` refers to: a path, "pipe:[INODE]", "socket:[INODE]",
/// "anon_inode:[eventfd]" (at most 4 KiB of it; None when it cannot be read).
pub fn fd_target(pid: u32, fd: u64) -> Option<String> {
    let fd = i32::try_from(fd).ok().filter(|f| *f >= 0)?;
    let target = fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let mut t = target.to_string_lossy().into_owned();
    if t.len() > 4096 {
        let mut cut = 4096;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
    }
    Some(t)
}

/// Wall-clock time now, in ms since the Unix epoch (0 before it).
/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
    fn steal_is_the_eighth_value_of_the_cpu_line() {
        let stat =
            b"cpu  5758163 226 550761 3385022 30866 0 3233 4056 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(parse_steal_ticks(stat), Some(4056));
        // Old kernels' shorter line, or something else first: unknown.
        assert_eq!(parse_steal_ticks(b"cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(parse_steal_ticks(b"intr 1 2 3 4 5 6 7 8 9\n"), None);
    }

    #[test]
    fn schedstat_exec_runtime() {
        assert_eq!(
            parse_schedstat_exec(b"2533290843 13406789 1519\n"),
            Some(2_533_290_843)
        );
        assert_eq!(parse_schedstat_exec(b""), None);
        assert_eq!(parse_schedstat_exec(b"x 1 2\n"), None);
        // The test harness's main thread has run to start this test.
        let me = std::process::id();
        assert!(thread_exec_runtime_ns(me, me).unwrap() > 0);
        assert_eq!(thread_exec_runtime_ns(me, u32::MAX), None);
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
    fn thread_state_and_syscall_files() {
        assert_eq!(parse_state("77 (a) b) S 1 77 77"), Some('S'));
        assert_eq!(parse_state("77 (x) D 1"), Some('D'));
        assert_eq!(parse_state("garbage"), None);
        let t = "0 0x3 0x7ffd1234 0x1000 0x0 0x0 0x0 0x7ffd0000 0x7f00aa";
        assert_eq!(
            parse_syscall(t),
            Some((0, [3, 0x7ffd1234, 0x1000, 0, 0, 0]))
        );
        assert_eq!(parse_syscall("-1 0x7ffd0000 0x7f00aa"), None);
        assert_eq!(parse_syscall("running"), None);
        assert_eq!(parse_syscall("0 0x3"), None, "cut short");
        // This thread, reading its own state: running.
        let me = std::process::id();
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(thread_now(me, tid).map(|t| t.state), Some('R'));
        assert!(task_ids(me, 10).contains(&tid));
        assert!(fd_target(me, 0).is_some() || fd_target(me, 1).is_some());
        assert_eq!(fd_target(me, u64::MAX), None);
    }

    #[test]
    fn reads_self() {
        let m = read(std::process::id()).unwrap();
        assert!(!m.comm.is_empty());
        assert!(m.start_ticks > 0);
    }
}
