//! Process memory: a Python workload that touches exactly N MiB of anonymous memory, reads
//! M MiB of a mapped file and writes K MiB of shared memory (a memfd) is read back by ethand
//! by kind, against both what it made and /proc/PID/status read by the test at the same
//! moment; a process that grows inside a memory cgroup with a 256 MiB limit gets the
//! `near_oom` finding naming it, and a steady one far below its limit gets none.
use std::{
    fs,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{ProcessSnapshot, TreeSnapshot};
use ethand_tests::{Daemon, Workload, find_proc, serial, temp_path};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// The workload: `python3 -c SCRIPT anon_mib file_mib shmem_mib file_path grow_to_mib`.
/// Prints `ready` with its own RssAnon/RssFile/RssShmem before allocating (the interpreter's
/// share), on `g` makes the three kinds and prints `made` (so that the test can move it into
/// a cgroup first), then on `g` grows its anonymous memory in
/// 8 MiB steps every 100 ms up to grow_to_mib (0: no growth) and prints `done`; exits when
/// stdin closes. Transparent huge pages are refused (MADV_NOHUGEPAGE) so that a page is a
/// fault: the fault count is known.
const SCRIPT: &str = r#"
import mmap, os, sys, time
anon_mib, file_mib, shmem_mib = (int(a) for a in sys.argv[1:4])
path, grow_to = sys.argv[4], int(sys.argv[5])
P = 4096
def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0]) * 1024
    return out
def touch(m, n):
    for i in range(0, n, P):
        m[i] = 1
s = status()
print("ready", f"anon={s['RssAnon']} file={s['RssFile']} shmem={s['RssShmem']}", flush=True)
sys.stdin.buffer.read(1)
anon = mmap.mmap(-1, anon_mib << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
anon.madvise(mmap.MADV_NOHUGEPAGE)
touch(anon, anon_mib << 20)
with open(path, "wb") as f:
    f.write(b"x" * (file_mib << 20))
fd = os.open(path, os.O_RDONLY)
fm = mmap.mmap(fd, file_mib << 20, mmap.MAP_SHARED, mmap.PROT_READ)
total = 0
for i in range(0, file_mib << 20, P):
    total += fm[i]
mfd = os.memfd_create("ethand-e2e-shm")
os.ftruncate(mfd, shmem_mib << 20)
sm = mmap.mmap(mfd, shmem_mib << 20, mmap.MAP_SHARED)
touch(sm, shmem_mib << 20)
print("made", f"read={total}", flush=True)
chunks = []
while True:
    b = sys.stdin.buffer.read(1)
    if not b:
        break
    have = anon_mib
    while have + 8 <= grow_to:
        c = mmap.mmap(-1, 8 << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        c.madvise(mmap.MADV_NOHUGEPAGE)
        touch(c, 8 << 20)
        chunks.append(c)
        have += 8
        time.sleep(0.1)
    print("done", f"mib={have}", flush=True)
"#;

fn python(anon: u64, file: u64, shmem: u64, path: &str, grow_to: u64) -> Workload {
    Workload::start(
        "python3",
        &[
            "-c",
            SCRIPT,
            &anon.to_string(),
            &file.to_string(),
            &shmem.to_string(),
            path,
            &grow_to.to_string(),
        ],
    )
}

/// RssAnon, RssFile, RssShmem of /proc/PID/status and minflt of /proc/PID/stat, read by the
/// test.
fn kernel_memory(pid: u32) -> (u64, u64, u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
            * 1024
    };
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect(")") + 1..];
    let minflt = after
        .split_whitespace()
        .nth(7)
        .expect("minflt")
        .parse()
        .expect("number");
    (kb("RssAnon"), kb("RssFile"), kb("RssShmem"), minflt)
}

fn memory_of(t: &TreeSnapshot, pid: u32) -> ethand_snapshot::memory::ProcessMemory {
    let p: &ProcessSnapshot = find_proc(t, pid);
    p.memory
        .clone()
        .unwrap_or_else(|| panic!("no memory for pid {pid} in the snapshot"))
}

/// The kernel's RSS counters are per-CPU caches folded in batches: two reads of an idle
/// process agree, but allow a batch (64 pages) per CPU between ethand's read and ours.
fn counter_slack() -> u64 {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get() as u64);
    64 * PAGE * cpus
}

#[test]
fn process_memory_by_kind_is_exact() {
    let _g = serial();
    let d = Daemon::start("memory-kinds", "");
    let file = temp_path("memory-file", "bin");
    let _rm = ethand_tests::RemoveOnDrop(file.clone());
    let (n, m, k) = (64u64, 16u64, 8u64);
    let mut w = python(n, m, k, file.to_str().expect("utf-8"), 0);
    let base = w.ready.clone();
    w.send_byte();
    w.expect("made");
    // The workload now waits in read(): its memory holds still.
    let t = d.snapshot(w.pid);
    let got = memory_of(&t, w.pid);
    let (anon, filek, shmem, minflt) = kernel_memory(w.pid);
    let slack = counter_slack();
    println!(
        "ethand anon {:?} file {:?} shmem {:?} minflt {:?}; kernel anon {anon} file {filek} shmem {shmem} minflt {minflt}; base {:?}",
        got.anon_bytes, got.file_bytes, got.shmem_bytes, got.minor_faults, base.0
    );
    let (ga, gf, gs) = (
        got.anon_bytes.expect("anon"),
        got.file_bytes.expect("file"),
        got.shmem_bytes.expect("shmem"),
    );
    // Against the kernel's figures read by the test at the same moment.
    for (what, e, k) in [
        ("anon", ga, anon),
        ("file", gf, filek),
        ("shmem", gs, shmem),
    ] {
        assert!(
            e.abs_diff(k) <= slack,
            "{what}: ethand {e}, /proc/PID/status {k} (slack {slack})"
        );
    }
    assert_eq!(got.rss_bytes, Some(ga + gf + gs));
    // Against what the workload made: at least N/M/K, at most that plus the interpreter's own
    // share before it allocated, plus what the interpreter allocated meanwhile (a few MiB of
    // objects and the loop's pages: 4 MiB), plus the counters' slack.
    let own = 4 * MIB + slack;
    let within = |what: &str, v: u64, made_mib: u64, base: u64| {
        assert!(
            v >= made_mib * MIB - slack && v <= made_mib * MIB + base + own,
            "{what}: {v} bytes, made {made_mib} MiB, interpreter's own {base}"
        );
    };
    within("anon", ga, n, base.u64("anon"));
    within("file", gf, m, base.u64("file"));
    within("shmem", gs, k, base.u64("shmem"));
    // Each touched anonymous and shmem page was a minor fault (no huge pages).
    let faults = got.minor_faults.expect("minor faults");
    assert!(
        faults >= (n + k) * MIB / PAGE,
        "minor faults {faults} < {} pages touched",
        (n + k) * MIB / PAGE
    );
    assert!(
        faults <= minflt,
        "ethand's minor faults {faults} > the kernel's later {minflt}"
    );
    assert_eq!(got.major_faults.map(|_| ()), Some(()));
    // Tree totals are the live processes' sums.
    let tot = t.memory_totals().expect("tree memory");
    assert_eq!(tot.anon_bytes, ga);
    // The same figures on /metrics.
    let body = d.metrics();
    let series = format!("ethand_process_memory_rss_bytes{{");
    assert!(
        body.lines()
            .any(|l| l.starts_with(&series) && l.contains("kind=\"anon\"")),
        "no ethand_process_memory_rss_bytes series on /metrics"
    );
    w.finish();
}

/// A memory cgroup made for one test (v1's memory hierarchy, or v2's where memory is
/// there), removed on drop.
struct TestCgroup {
    dir: PathBuf,
    procs_file: &'static str,
    /// The path as /proc/PID/cgroup shows it.
    path: String,
}

impl TestCgroup {
    fn make(name: &str, limit: u64) -> Option<Self> {
        let (root, limit_file, procs_file) =
            if fs::metadata("/sys/fs/cgroup/memory/memory.limit_in_bytes").is_ok() {
                (
                    "/sys/fs/cgroup/memory",
                    "memory.limit_in_bytes",
                    "cgroup.procs",
                )
            } else if fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
                .is_ok_and(|c| c.contains("memory"))
            {
                ("/sys/fs/cgroup", "memory.max", "cgroup.procs")
            } else {
                return None;
            };
        let leaf = format!("ethand-e2e-{name}-{}", std::process::id());
        let dir = PathBuf::from(root).join(&leaf);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let c = Self {
            dir,
            procs_file,
            path: format!("/{leaf}"),
        };
        fs::write(c.dir.join(limit_file), limit.to_string()).expect("write the limit");
        Some(c)
    }

    fn enter(&self, pid: u32) {
        fs::write(self.dir.join(self.procs_file), pid.to_string()).expect("move into the cgroup");
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The workload is killed and reaped before (declared after); rmdir may race its exit.
        let t0 = Instant::now();
        while fs::remove_dir(&self.dir).is_err() && t0.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `snapshot --window 2` of `pid`, polled until its window's samples show no growth.
fn steady_snapshot(d: &Daemon, pid: u32) -> TreeSnapshot {
    let t0 = Instant::now();
    loop {
        let out = d.cli(&[
            "snapshot",
            "--pid",
            &pid.to_string(),
            "--json",
            "--window",
            "2",
        ]);
        assert!(
            out.status.success(),
            "snapshot: {}",
            ethand_tests::text(&out.stderr)
        );
        let t: TreeSnapshot = serde_json::from_slice(&out.stdout).expect("TreeSnapshot");
        let w = memory_of(&t, pid).window;
        let grew = w.as_ref().and_then(|w| w.rss_growth_bytes_per_second());
        if grew.is_some_and(|g| g <= 0.0) {
            return t;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "steady process still growing after 15 s: {w:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn growing_process_near_its_cgroup_limit_is_named() {
    let _g = serial();
    let limit = 256 * MIB;
    let (Some(grow_cg), Some(steady_cg)) = (
        TestCgroup::make("grow", limit),
        TestCgroup::make("steady", limit),
    ) else {
        println!("skipped: no memory cgroup controller to make a cgroup in");
        return;
    };
    let d = Daemon::start("memory-oom", "");
    let file = temp_path("memory-oom", "bin");
    let _rm = ethand_tests::RemoveOnDrop(file.clone());
    let path = file.to_str().expect("utf-8");
    // Steady: 32 MiB, far below its 256 MiB.
    let mut steady = python(32, 1, 1, path, 0);
    steady_cg.enter(steady.pid);
    steady.send_byte();
    steady.expect("made");
    // Growing: from 16 MiB to 216 MiB (84 % of the limit with the interpreter's own).
    let mut grow = python(16, 1, 1, path, 216);
    grow_cg.enter(grow.pid);
    grow.send_byte();
    grow.expect("made");
    grow.send_byte();
    let done = grow.expect("done");
    println!("grown to {} MiB", done.u64("mib"));

    let t = d.snapshot(grow.pid);
    let cg = t
        .memory_cgroups
        .iter()
        .find(|c| c.path == grow_cg.path)
        .unwrap_or_else(|| panic!("cgroup {} not in {:?}", grow_cg.path, t.memory_cgroups));
    println!("cgroup {cg:?}");
    assert_eq!(cg.limit_bytes, Some(limit));
    let usage = cg.usage_bytes.expect("usage");
    // Its usage covers the process's anonymous memory made since it moved in (what the
    // interpreter had before stays charged to the cgroup it came from).
    let anon = memory_of(&t, grow.pid).anon_bytes.expect("anon");
    let before = grow.ready.u64("anon");
    assert!(
        usage + before >= anon,
        "cgroup usage {usage} + {before} from before < the process's anon {anon}"
    );
    assert!(anon >= 216 * MIB, "anon {anon} after growing to 216 MiB");
    assert_eq!(cg.oom_kills, Some(0), "no OOM kill expected");
    let f = t
        .findings
        .iter()
        .find(|f| f.id == "near_oom")
        .unwrap_or_else(|| panic!("no near_oom finding: {:?}", t.findings));
    println!("{f:#?}");
    let named = format!("pid {} (", grow.pid);
    assert!(
        f.detail.iter().any(|l| l.starts_with(&named)),
        "near_oom detail does not name pid {}: {:?}",
        grow.pid,
        f.detail
    );
    let ratio = f
        .evidence
        .iter()
        .find(|e| e.signal == "mem.cgroup_limit_ratio")
        .expect("ratio evidence")
        .value;
    assert!(
        (ratio - usage as f64 / limit as f64).abs() < 0.05,
        "ratio {ratio}"
    );

    // The steady process, in a cgroup of its own far below its limit: nothing, once the
    // window (2 s) no longer holds its start (when it did grow).
    let t = steady_snapshot(&d, steady.pid);
    let cg = t
        .memory_cgroups
        .iter()
        .find(|c| c.path == steady_cg.path)
        .expect("steady cgroup");
    assert!(cg.limit_ratio().expect("ratio") < 0.5, "{cg:?}");
    assert!(
        !t.findings.iter().any(|f| f.id == "near_oom"),
        "steady process got {:?}",
        t.findings
    );
    let text = ethand_tests::text(&d.cli(&["snapshot", "--pid", &grow.pid.to_string()]).stdout);
    assert!(text.contains("MEMORY"), "no MEMORY section:\n{text}");
    assert!(
        text.contains(&grow_cg.path),
        "cgroup not in the text:\n{text}"
    );
    grow.finish();
    steady.finish();
}
