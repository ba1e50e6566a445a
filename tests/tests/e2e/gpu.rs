//! GPU/NPU runtime uprobes end to end: the stand-in libcuda, libnccl, libascendcl and libhccl
//! (tests/standins) are called by `gpu_driver` following a plan, and what ethand reports for
//! the driver (`processes[].gpu` of `ethand snapshot --json`, `ethand status --json`, /metrics)
//! must equal the driver's ground truth exactly. Only host times are compared with a bound
//! (at least the stand-ins' sleep).
//!
//! Pattern of every test: start a daemon (rescan 300 ms), start the driver with `wait_stdin`
//! first in its plan, wait until `ethand status` lists its libraries attached, release it,
//! wait until it is idle at the `wait_stdin` that ends the plan (still alive), let the daemon
//! collect, snapshot, then end the driver and compare with its ground truth.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{GpuLevel, GpuLibraryStatus, gpu::GpuProcessStats};
use ethand_tests::{
    Daemon, INTERVAL_MS, ProbeState, SETTLE, SelfStatus, find_proc, probe, promtool_check, serial,
    standins::{self, CATALOG_RS, Driver, GroundTruth, Lib, MEM_KINDS, catalog, plan_every_symbol},
    temp_path, text,
};

/// Rescan every 300 ms: a library loaded by a process is attached within about that.
const GPU_TOML: &str = "[gpu]\nlevel = \"process\"\nrescan_interval_ms = 300\n";
/// How long a library may take to show up attached (a rescan is 300 ms).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(6);
const UPROBES: [&str; 4] = [
    "uprobe_cuda",
    "uprobe_nccl",
    "uprobe_ascendcl",
    "uprobe_hccl",
];

fn start(name: &str) -> Daemon {
    Daemon::start(name, GPU_TOML)
}

// ------------------------------------------------------------------ status helpers

/// The canonical path and inode of a library file.
fn file_id(path: &Path) -> (PathBuf, u64) {
    let canon =
        fs::canonicalize(path).unwrap_or_else(|e| panic!("canonicalize {}: {e}", path.display()));
    let ino = fs::metadata(&canon)
        .unwrap_or_else(|e| panic!("stat {}: {e}", canon.display()))
        .ino();
    (canon, ino)
}

/// The `gpu_libraries` entries of one file (by inode and path).
fn lib_entries<'a>(st: &'a SelfStatus, path: &Path) -> Vec<&'a GpuLibraryStatus> {
    let (canon, ino) = file_id(path);
    st.gpu_libraries
        .iter()
        .filter(|l| l.inode == ino && Path::new(&l.path) == canon)
        .collect()
}

/// Polls `ethand status` until every file of `paths` is listed attached. Returns that status
/// and how long it took.
fn wait_attached(d: &Daemon, paths: &[&Path]) -> (SelfStatus, Duration) {
    let t0 = Instant::now();
    loop {
        let st = d.status();
        let missing: Vec<String> = paths
            .iter()
            .filter(|p| {
                !lib_entries(&st, p)
                    .iter()
                    .any(|l| l.state == ProbeState::Attached)
            })
            .map(|p| p.display().to_string())
            .collect();
        if missing.is_empty() {
            return (st, t0.elapsed());
        }
        assert!(
            t0.elapsed() < ATTACH_TIMEOUT,
            "not attached after {ATTACH_TIMEOUT:?}: {missing:?}\ngpu_libraries: {:#?}\nprobes: {:#?}",
            st.gpu_libraries,
            st.probes
                .iter()
                .filter(|p| p.name.starts_with("uprobe_"))
                .collect::<Vec<_>>()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `ethand status` until `pred` holds (the status is rebuilt once per collection, so
/// it may lag a change by an interval). Returns the status and how long it took, or the last
/// status (`pred` false) after 3 s.
fn status_when(d: &Daemon, pred: impl Fn(&SelfStatus) -> bool) -> (SelfStatus, Duration) {
    let t0 = Instant::now();
    loop {
        let st = d.status();
        if pred(&st) || t0.elapsed() > Duration::from_secs(3) {
            return (st, t0.elapsed());
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Prints how long a test took (on drop, also when it fails).
struct Took(&'static str, Instant);

impl Took {
    fn new(name: &'static str) -> Self {
        Self(name, Instant::now())
    }
}

impl Drop for Took {
    fn drop(&mut self) {
        eprintln!("observed: {} took {:?}", self.0, self.1.elapsed());
    }
}

fn set_level(d: &Daemon, level: &str) {
    let out = d.cli(&["level", level]);
    assert!(
        out.status.success(),
        "ethand level {level} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    eprintln!(
        "observed: ethand level {level}: {}",
        text(&out.stdout).trim()
    );
}

// ------------------------------------------------------------------ snapshot helpers

/// The GPU picture of `pid` in the current snapshot (None: no probed call seen).
fn gpu_now(d: &Daemon, pid: u32) -> Option<GpuProcessStats> {
    find_proc(&d.snapshot(pid), pid).gpu.clone()
}

/// The GPU picture of an idle process once the daemon has collected: after SETTLE (four
/// intervals), until two snapshots an interval apart agree (3 s at most).
fn settled_gpu(d: &Daemon, pid: u32) -> Option<GpuProcessStats> {
    thread::sleep(SETTLE);
    let mut last = gpu_now(d, pid);
    let t0 = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(INTERVAL_MS + 50));
        let g = gpu_now(d, pid);
        if g == last || t0.elapsed() > Duration::from_secs(3) {
            return g;
        }
        last = g;
    }
}

fn settled(d: &Daemon, pid: u32) -> GpuProcessStats {
    settled_gpu(d, pid).unwrap_or_else(|| panic!("no gpu section for pid {pid}"))
}

/// `wait_stdin OPS... wait_stdin`.
fn plan<'a>(ops: &[&'a str]) -> Vec<&'a str> {
    let mut p = vec!["wait_stdin"];
    p.extend_from_slice(ops);
    p.push("wait_stdin");
    p
}

/// Starts the driver on `plan(ops)`, waits for its libraries to be attached, runs the ops and
/// returns it idle at its last `wait_stdin` (alive) with the settled GPU picture.
fn run_ops(d: &Daemon, libs: &[Lib], ops: &[&str]) -> (Driver, GpuProcessStats) {
    let s = standins::shared();
    let mut drv = s.spawn_driver(libs, &plan(ops));
    drv.wait_for("waiting");
    let paths: Vec<&Path> = libs.iter().map(|&l| s.path(l)).collect();
    let (_, took) = wait_attached(d, &paths);
    eprintln!(
        "observed: {} libraries attached after {took:?}",
        paths.len()
    );
    drv.resume();
    drv.wait_for("waiting");
    let g = settled(d, drv.pid);
    (drv, g)
}

// ------------------------------------------------------------------ the catalog, as text

/// The catalog entry of `name` (one line of catalog.rs), e.g.
/// `alloc(Cuda, "cuMemAlloc_v2", 0, 1, DEVICE),`.
fn catalog_line(name: &str) -> String {
    let src = fs::read_to_string(CATALOG_RS).expect("read catalog.rs");
    let body = &src[src.find("pub const CATALOG").expect("CATALOG")..];
    let quoted = format!("\"{name}\"");
    body.lines()
        .find(|l| l.contains(&quoted) && !l.trim_start().starts_with("//"))
        .unwrap_or_else(|| panic!("{name} not in the catalog"))
        .trim()
        .to_string()
}

/// The catalog helper (launch, graph, alloc, register, free, copy, acl_copy, copy2d, sync,
/// coll, group, comm_init) of every symbol.
fn helpers() -> BTreeMap<String, String> {
    catalog().into_iter().map(|s| (s.name, s.helper)).collect()
}

/// The memory kind (gpu_mem names) an allocation, registration or free symbol accounts to.
fn mem_kind(name: &str, helper: &str) -> Option<&'static str> {
    match helper {
        "register" => Some("host_registered"),
        "alloc" | "free" => {
            let line = catalog_line(name);
            let last = line
                .trim_end_matches(',')
                .trim_end_matches(')')
                .rsplit(',')
                .next()
                .expect("arguments")
                .trim()
                .rsplit("::")
                .next()
                .expect("name")
                .to_ascii_lowercase();
            MEM_KINDS.into_iter().find(|k| *k == last)
        }
        _ => None,
    }
}

/// The operation (all_reduce, ...) of a collective symbol.
fn operation(name: &str) -> String {
    catalog_line(name)
        .split('"')
        .nth(3)
        .unwrap_or_else(|| panic!("no operation for {name}"))
        .to_string()
}

fn library_of_runtime(runtime: &str) -> String {
    format!("lib{runtime}")
}

// ------------------------------------------------------------------ comparison

/// Every difference found, reported together.
#[derive(Default)]
struct Mismatches(Vec<String>);

impl Mismatches {
    fn eq<T: PartialEq + Debug>(&mut self, what: impl std::fmt::Display, got: T, want: T) {
        if got != want {
            self.0
                .push(format!("{what}: ethand {got:?}, ground truth {want:?}"));
        }
    }

    fn ok(&mut self, what: impl std::fmt::Display, cond: bool) {
        if !cond {
            self.0.push(what.to_string());
        }
    }

    fn assert_none(self, context: &str) {
        assert!(
            self.0.is_empty(),
            "{context}: {} mismatch(es):\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Sym {
    calls: u64,
    errors: u64,
    bytes: u64,
    timed_calls: u64,
    time_ns: u64,
    /// Copies: direction -> (calls, bytes).
    dirs: BTreeMap<String, (u64, u64)>,
}

/// ethand's symbols by (library, symbol), summed over directions.
fn ethand_symbols(g: &GpuProcessStats) -> BTreeMap<(String, String), Sym> {
    let mut m: BTreeMap<(String, String), Sym> = BTreeMap::new();
    for s in &g.symbols {
        let e = m.entry((s.library.clone(), s.symbol.clone())).or_default();
        e.calls += s.calls;
        e.errors += s.errors;
        e.bytes += s.bytes;
        e.timed_calls += s.timed_calls;
        e.time_ns += s.time_ns;
        if !s.direction.is_empty() {
            let d = e.dirs.entry(s.direction.clone()).or_default();
            d.0 += s.calls;
            d.1 += s.bytes;
        }
    }
    m
}

/// The ground truth by (library, symbol), summed over library files; `time_ns` is the
/// minimum host time.
fn truth_symbols(t: &GroundTruth) -> BTreeMap<(String, String), Sym> {
    let mut m: BTreeMap<(String, String), Sym> = BTreeMap::new();
    for l in t.libraries.values() {
        for (name, s) in &l.symbols {
            let e = m
                .entry((library_of_runtime(&l.runtime), name.clone()))
                .or_default();
            e.calls += s.calls;
            e.errors += s.errors;
            e.bytes += s.bytes;
            e.time_ns += s.min_time_ns;
            for (dir, x) in &s.dirs {
                let d = e.dirs.entry(dir.clone()).or_default();
                d.0 += x.calls;
                d.1 += x.bytes;
            }
        }
    }
    m
}

/// Which calls get a return probe (and so a host time) at `level`.
fn timed(helper: &str, level: &str) -> bool {
    level == "op" || matches!(helper, "sync" | "coll" | "group" | "alloc" | "register")
}

/// What the comparison should expect beyond the ground truth.
struct Expect<'a> {
    /// "process" or "op".
    level: &'a str,
    /// Frees by memory kind of the freed allocation. None: each free symbol's calls count
    /// for its own kind, less the untracked frees (cuMemFree_v2 of unknown addresses).
    frees: Option<BTreeMap<&'static str, u64>>,
    /// Compare `comm` with the ground truth's rank and size (and library, given here; with
    /// [`NO_COMM`], `comm` must be absent). None: not compared.
    comm_library: Option<&'a str>,
}

/// `Expect::comm_library` of a process that creates no communicator (the truth then has
/// none, and `comm` must be None).
const NO_COMM: Option<&str> = Some("(no communicator)");

/// Compares ethand's GPU picture of a process with the driver's ground truth: every symbol
/// (calls, errors, bytes, copy directions, timing), and every process figure derived from
/// the symbols.
fn compare(g: &GpuProcessStats, t: &GroundTruth, x: &Expect) -> Mismatches {
    let mut mm = Mismatches::default();
    let helpers = helpers();
    let helper = |name: &str| -> String {
        helpers
            .get(name)
            .cloned()
            .unwrap_or_else(|| format!("unknown:{name}"))
    };

    // Symbols.
    let es = ethand_symbols(g);
    let ts = truth_symbols(t);
    let keys: BTreeSet<_> = es.keys().chain(ts.keys()).cloned().collect();
    for k in &keys {
        let (lib, name) = k;
        let e = es.get(k).cloned().unwrap_or_default();
        let w = ts.get(k).cloned().unwrap_or_default();
        let h = helper(name);
        mm.eq(format!("{lib} {name} calls"), e.calls, w.calls);
        mm.eq(format!("{lib} {name} errors"), e.errors, w.errors);
        mm.eq(format!("{lib} {name} bytes"), e.bytes, w.bytes);
        if matches!(h.as_str(), "copy" | "acl_copy" | "copy2d") {
            mm.eq(
                format!("{lib} {name} by direction (calls, bytes)"),
                &e.dirs,
                &w.dirs,
            );
        }
        let want_timed = if timed(&h, x.level) { w.calls } else { 0 };
        mm.eq(
            format!("{lib} {name} timed_calls at level {}", x.level),
            e.timed_calls,
            want_timed,
        );
        mm.ok(
            format!(
                "{lib} {name} time_ns {} < the stand-in's sleep {}",
                e.time_ns, w.time_ns
            ),
            e.time_ns >= w.time_ns,
        );
    }

    // Process figures from the truth's symbols.
    let sum = |pred: &dyn Fn(&str) -> bool, f: &dyn Fn(&Sym) -> u64| -> u64 {
        ts.iter()
            .filter(|((_, n), _)| pred(&helper(n)))
            .map(|(_, s)| f(s))
            .sum()
    };
    // Launches are counted from level `process` on; below it they are absent, never 0.
    let counted = matches!(x.level, "process" | "op");
    mm.eq(
        "launches",
        g.launches,
        counted.then(|| sum(&|h| h == "launch", &|s| s.calls)),
    );
    mm.eq(
        "graph_launches",
        g.graph_launches,
        counted.then(|| sum(&|h| h == "graph", &|s| s.calls)),
    );
    let mut want_copies: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in ts.values() {
        for (dir, (c, b)) in &s.dirs {
            let e = want_copies.entry(dir.clone()).or_default();
            e.0 += c;
            e.1 += b;
        }
    }
    let got_copies: BTreeMap<String, (u64, u64)> = g
        .copies
        .iter()
        .map(|c| (c.direction.clone(), (c.calls, c.bytes)))
        .collect();
    mm.eq(
        "copies by direction (calls, bytes)",
        got_copies,
        want_copies,
    );
    let sync_calls = sum(&|h| h == "sync", &|s| s.calls);
    let sync_min = sum(&|h| h == "sync", &|s| s.time_ns);
    mm.eq("sync.calls", g.sync.calls, sync_calls);
    mm.eq("sync.timed_calls", g.sync.timed_calls, sync_calls);
    mm.ok(
        format!(
            "sync.time_ns {} < the stand-ins' sleeps {sync_min}",
            g.sync.time_ns
        ),
        g.sync.time_ns >= sync_min,
    );
    let group_calls = sum(&|h| h == "group", &|s| s.calls);
    mm.eq("groups.calls", g.groups.calls, group_calls);
    mm.eq("groups.timed_calls", g.groups.timed_calls, group_calls);
    mm.eq(
        "comm_inits",
        g.comm_inits,
        sum(&|h| h == "comm_init", &|s| s.calls),
    );
    mm.eq("errors", g.errors, ts.values().map(|s| s.errors).sum());
    mm.eq("untracked_frees", g.untracked_frees, t.untracked_frees);

    // Memory by kind.
    let got_mem: BTreeMap<&str, _> = g.memory.iter().map(|m| (m.kind.as_str(), m)).collect();
    for kind in MEM_KINDS {
        let of_kind = |n: &str, hs: &[&str]| {
            let h = helper(n);
            hs.contains(&h.as_str()) && mem_kind(n, &h) == Some(kind)
        };
        let allocs: u64 = ts
            .iter()
            .filter(|((_, n), _)| of_kind(n, &["alloc", "register"]))
            .map(|(_, s)| s.calls - s.errors)
            .sum();
        let alloc_bytes: u64 = ts
            .iter()
            .filter(|((_, n), _)| of_kind(n, &["alloc", "register"]))
            .map(|(_, s)| s.bytes)
            .sum();
        let frees = match &x.frees {
            Some(f) => f.get(kind).copied().unwrap_or(0),
            None => {
                let n: u64 = ts
                    .iter()
                    .filter(|((_, n), _)| of_kind(n, &["free"]))
                    .map(|(_, s)| s.calls)
                    .sum();
                if kind == "device" {
                    n - t.untracked_frees
                } else {
                    n
                }
            }
        };
        let live = t.live(kind);
        let m = got_mem.get(kind).copied().cloned().unwrap_or_default();
        mm.eq(format!("memory[{kind}].allocs"), m.allocs, allocs);
        mm.eq(
            format!("memory[{kind}].alloc_bytes"),
            m.alloc_bytes,
            alloc_bytes,
        );
        mm.eq(
            format!("memory[{kind}].frees (frees of {kind} allocations)"),
            m.frees,
            frees,
        );
        mm.eq(
            format!("memory[{kind}].freed_bytes (= alloc_bytes - live_bytes)"),
            m.freed_bytes,
            alloc_bytes - live,
        );
        mm.eq(format!("memory[{kind}].live_bytes"), m.live_bytes, live);
        mm.eq(
            format!("memory[{kind}].peak_bytes"),
            m.peak_bytes,
            t.peak(kind),
        );
    }

    // Collectives by (library, operation).
    let mut want_coll: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for ((lib, n), s) in &ts {
        if helper(n) == "coll" {
            let rt = lib.trim_start_matches("lib").to_string();
            let e = want_coll.entry((rt, operation(n))).or_default();
            e.0 += s.calls;
            e.1 += s.bytes;
        }
    }
    let got_coll: BTreeMap<(String, String), (u64, u64)> = g
        .collectives
        .iter()
        .map(|c| ((c.library.clone(), c.operation.clone()), (c.calls, c.bytes)))
        .collect();
    mm.eq("collectives (calls, bytes)", got_coll, want_coll);
    for c in &g.collectives {
        mm.eq(
            format!("collective {} {} timed_calls", c.library, c.operation),
            c.timed_calls,
            c.calls,
        );
    }

    if let Some(lib) = x.comm_library {
        let want =
            (t.nranks > 0).then(|| (lib.to_string(), t.rank.filter(|&r| r != u32::MAX), t.nranks));
        let got = g
            .comm
            .as_ref()
            .map(|c| (c.library.clone(), c.rank, c.nranks));
        mm.eq("comm (library, rank, nranks)", got, want);
    }
    mm
}

fn print_observed(what: &str, g: &GpuProcessStats) {
    eprintln!(
        "observed {what}: launches {:?} graphs {:?} copies {:?} sync {:?} memory {:?} untracked {} errors {} collectives {:?} groups {:?} comm_inits {} comm {:?} ({} symbol rows)",
        g.launches,
        g.graph_launches,
        g.copies
            .iter()
            .map(|c| (c.direction.as_str(), c.calls, c.bytes))
            .collect::<Vec<_>>(),
        g.sync,
        g.memory
            .iter()
            .map(|m| (
                m.kind.as_str(),
                m.allocs,
                m.alloc_bytes,
                m.frees,
                m.freed_bytes,
                m.live_bytes,
                m.peak_bytes
            ))
            .collect::<Vec<_>>(),
        g.untracked_frees,
        g.errors,
        g.collectives
            .iter()
            .map(|c| (c.library.as_str(), c.operation.as_str(), c.calls, c.bytes))
            .collect::<Vec<_>>(),
        g.groups,
        g.comm_inits,
        g.comm,
        g.symbols.len()
    );
}

/// Calls of one symbol (all directions) in ethand's picture.
fn calls_of(g: &GpuProcessStats, name: &str) -> (u64, u64) {
    g.symbols
        .iter()
        .filter(|s| s.symbol == name)
        .fold((0, 0), |(c, t), s| (c + s.calls, t + s.timed_calls))
}

// ------------------------------------------------------------------ /metrics helpers

/// The value of the one sample of `family` whose labels include all of `labels`.
fn sample(body: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let hits: Vec<&str> = body
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{family}{{")) && want.iter().all(|w| l.contains(w.as_str()))
        })
        .collect();
    assert!(
        hits.len() <= 1,
        "more than one {family} sample with {labels:?}: {hits:?}"
    );
    let v = hits.first()?.rsplit(' ').next().expect("value");
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{family}: value {v:?} is not a number")),
    )
}

// ------------------------------------------------------------------ tests

/// Every CUDA category through libcuda: launches of each variant, graph launches,
/// allocations of every kind (one failing: an error, no bytes), frees (of device, managed,
/// pinned and registered memory), copies of every variant and direction, 2D copies, every
/// sync, untracked frees. Every figure equals the ground truth.
#[test]
fn cuda_counts_exact() {
    let _serial = serial();
    let _took = Took::new("cuda_counts_exact");
    let d = start("gpu-cuda");
    let (drv, g) = run_ops(
        &d,
        &[Lib::Cuda],
        &[
            "launches 7",
            "launches_ptsz 3",
            "launch_ex 2",
            "launch_ex_ptsz 1",
            "launch_coop 4",
            "launch_coop_ptsz 1",
            "graph 5",
            "graph_ptsz 2",
            // Allocation order (what the frees below release, oldest first).
            "alloc 1M x 3",
            "alloc 2T", // over the stand-in's 1 TiB: CUDA_ERROR_OUT_OF_MEMORY
            "alloc_async 4K x 2",
            "alloc_async_ptsz 8K",
            "alloc_pool 16K",
            "alloc_pool_ptsz 32K",
            "alloc_managed 64K x 2",
            "alloc_host 128K",
            "host_alloc 256K x 2",
            "host_register 1M",
            "htod 4K x 3",
            "htod_ptds 1K",
            "htod_async 2K x 2",
            "htod_async_ptsz 512",
            "dtoh 8K x 2",
            "dtoh_ptds 100",
            "dtoh_async 8K x 2",
            "dtoh_async_ptsz 300",
            "dtod 1M",
            "dtod_ptds 10",
            "dtod_async 20 x 3",
            "dtod_async_ptsz 30",
            "memcpy_default 10 x 5",
            "memcpy_default_ptds 11",
            "memcpy_async 12 x 2",
            "memcpy_async_ptsz 13",
            "peer 1G",
            "peer_ptds 2K",
            "peer_async 3K",
            "peer_async_ptsz 4K",
            "memcpy2d 100x10 htod",
            "memcpy2d 64x8 dtoh x 2",
            "memcpy2d_ptds 3x3 dtod",
            "memcpy2d_async 7x5 htoh",
            "memcpy2d_async_ptsz 16x16 htod",
            "sync stream 2",
            "sync stream_ptsz 1",
            "sync ctx 1",
            "sync event 3",
            // Device: the three 1 MiB, 4K x 2, 8K, 16K, 32K (8 frees); then the first
            // managed 64K through cuMemFree_v2 (as CUDA frees managed memory).
            "free_async 1",
            "free_async_ptsz 1",
            "cuda_free 5",
            "cuda_free 2",
            "free_host 2", // 128K and the first 256K
            "host_unregister 1",
            "untracked_free 2",
        ],
    );
    let t = drv.finish();
    print_observed("cuda", &g);
    let frees = BTreeMap::from([
        ("device", 8),
        ("managed", 1),
        ("host_pinned", 2),
        ("host_registered", 1),
    ]);
    compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: Some(frees),
            comm_library: NO_COMM,
        },
    )
    .assert_none("cuda_counts_exact");
}

/// NCCL: every collective with different data types (bytes = count x type size), group
/// start/end, two communicators (the larger gives rank and size), and in /metrics the
/// collective series carry the rank and the rank info gauge is 1.
#[test]
fn nccl_collectives_and_rank() {
    let _serial = serial();
    let _took = Took::new("nccl_collectives_and_rank");
    let d = start("gpu-nccl");
    let (drv, g) = run_ops(
        &d,
        &[Lib::Nccl],
        &[
            "comm_init_rank_config 3 8",
            "comm_init_rank 1 2", // smaller: rank and size stay 3 / 8
            "group_start",
            "allreduce 1024 float32 x 2",
            "allgather 10 bfloat16 x 3",
            "reduce_scatter 100 int8",
            "broadcast 7 float64",
            "bcast 9 int32",
            "reduce 5 uint64 x 2",
            "alltoall 33 float16",
            "send 3 float32 x 4",
            "recv 3 uint8 x 4",
            "group_end",
            "group_start 2",
            "allreduce 8 float8e4m3",
            "allreduce 3 int64",
            "group_end 2",
        ],
    );
    let body = d.metrics();
    let pid = drv.pid.to_string();
    let t = drv.finish();
    print_observed("nccl", &g);
    let mut mm = compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: None,
            comm_library: Some("nccl"),
        },
    );
    mm.eq("ground truth rank/nranks", (t.rank, t.nranks), (Some(3), 8));

    // /metrics: the collective series per operation with the rank, and the rank info.
    let rank = "3";
    for c in &g.collectives {
        let calls = sample(
            &body,
            "ethand_process_collective_calls_total",
            &[
                ("pid", &pid),
                ("library", "nccl"),
                ("operation", &c.operation),
                ("rank", rank),
            ],
        );
        mm.eq(
            format!(
                "collective_calls_total{{operation={:?},rank=3}}",
                c.operation
            ),
            calls,
            Some(c.calls as f64),
        );
        let bytes = sample(
            &body,
            "ethand_process_collective_bytes_total",
            &[
                ("pid", &pid),
                ("library", "nccl"),
                ("operation", &c.operation),
                ("rank", rank),
            ],
        );
        mm.eq(
            format!(
                "collective_bytes_total{{operation={:?},rank=3}}",
                c.operation
            ),
            bytes,
            Some(c.bytes as f64),
        );
    }
    let all_reduce_truth: u64 = t
        .libraries
        .values()
        .filter_map(|l| l.symbols.get("ncclAllReduce"))
        .map(|s| s.calls)
        .sum();
    mm.eq(
        "collective_calls_total{operation=\"all_reduce\",rank=\"3\"} vs ground truth",
        sample(
            &body,
            "ethand_process_collective_calls_total",
            &[("pid", &pid), ("operation", "all_reduce"), ("rank", rank)],
        ),
        Some(all_reduce_truth as f64),
    );
    mm.eq(
        "collective_rank_info{library=\"nccl\",rank=\"3\",nranks=\"8\"}",
        sample(
            &body,
            "ethand_process_collective_rank_info",
            &[
                ("pid", &pid),
                ("library", "nccl"),
                ("rank", rank),
                ("nranks", "8"),
            ],
        ),
        Some(1.0),
    );
    eprintln!(
        "observed: collective series of pid {pid}: {:?}",
        body.lines()
            .filter(|l| l.starts_with("ethand_process_collective")
                && l.contains(&format!("pid=\"{pid}\"")))
            .collect::<Vec<_>>()
    );
    mm.assert_none("nccl_collectives_and_rank");
}

/// Ascend CL and HCCL: aclrtMalloc*/Free*, aclrtMemcpy of each kind (its direction), syncs,
/// operator and model executions (launches), HCCL collectives with HCCL data types and
/// HcclCommInitRootInfo's rank and size.
#[test]
fn ascend_and_hccl_exact() {
    let _serial = serial();
    let _took = Took::new("ascend_and_hccl_exact");
    let d = start("gpu-ascend");
    let (drv, g) = run_ops(
        &d,
        &[Lib::AscendCl, Lib::Hccl],
        &[
            "acl_malloc 1K x 2",
            "acl_malloc 5T", // over the limit: ACL_ERROR_RT_MEMORY_ALLOCATION
            "acl_malloc_cached 4K",
            "acl_malloc_host 2K x 2",
            "acl_memcpy 100 h2h",
            "acl_memcpy 200 h2d x 2",
            "acl_memcpy 300 d2h x 3",
            "acl_memcpy 400 d2d",
            "acl_memcpy 500 default",
            "acl_memcpy_async 50 d2h",
            "acl_memcpy_async 60 h2d x 2",
            "acl_memcpy_async 70 4",
            "acl_sync_stream 2",
            "acl_sync_stream_timeout 1",
            "acl_sync_device 1",
            "acl_sync_event 1",
            "acl_op_execute 5",
            "acl_op_execute_v2 2",
            "acl_op_compile_execute 1",
            "acl_op_compile_execute_v2 1",
            "acl_mdl_execute 3",
            "acl_mdl_execute_async 4",
            "hccl_comm_init_root_info 16 3",
            "hccl_allreduce 10 fp16 x 4",
            "hccl_allgather 7 fp32",
            "hccl_reduce_scatter 9 int128",
            "hccl_broadcast 11 bfp16 x 2",
            "hccl_alltoall 5 int64",
            "hccl_send 3 uint8 x 2",
            "hccl_recv 3 fp64",
            "acl_free 2",      // the two 1K
            "acl_free_host 1", // the first 2K
        ],
    );
    let t = drv.finish();
    print_observed("ascend", &g);
    let mut mm = compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: Some(BTreeMap::from([("device", 2), ("host_pinned", 1)])),
            comm_library: Some("hccl"),
        },
    );
    mm.eq(
        "ground truth rank/nranks",
        (t.rank, t.nranks),
        (Some(3), 16),
    );
    mm.eq("launches (16 executions)", g.launches, Some(16));
    mm.assert_none("ascend_and_hccl_exact");
}

/// A process that loads libcuda late (dlopen after start-up) is found by the rescan and its
/// calls after the attach are exact.
#[test]
fn late_dlopen_is_picked_up() {
    let _serial = serial();
    let _took = Took::new("late_dlopen_is_picked_up");
    let d = start("gpu-late");
    let s = standins::shared();
    let late = s.dlopen_late(Lib::Cuda);
    let mut drv = s.spawn_driver(
        &[],
        &[
            "wait_stdin",
            &late,
            "mark opened",
            "wait_stdin",
            "launches 10",
            "graph 2",
            "htod 4K x 3",
            "alloc 1M",
            "alloc 2M",
            "free 1",
            "sync stream 1",
            "wait_stdin",
        ],
    );
    drv.wait_for("waiting");
    // Not loaded yet: ethand lists no entry for it after a few rescans.
    thread::sleep(Duration::from_millis(700));
    let st = d.status();
    assert!(
        lib_entries(&st, &s.cuda).is_empty(),
        "libcuda listed before the driver loaded it: {:?}",
        lib_entries(&st, &s.cuda)
    );
    drv.resume();
    drv.wait_for("mark opened");
    let (st, took) = wait_attached(&d, &[&s.cuda]);
    let e = lib_entries(&st, &s.cuda);
    eprintln!(
        "observed: attached {took:?} after dlopen: {:?} found in pid {} (driver {})",
        e[0].path, e[0].found_in_pid, drv.pid
    );
    assert!(
        took < Duration::from_secs(3),
        "the late-loaded libcuda took {took:?} to be attached (rescan 300 ms)"
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].found_in_pid, drv.pid, "found_in_pid");
    drv.wait_for("waiting");
    drv.resume();
    drv.wait_for("waiting");
    let g = settled(&d, drv.pid);
    let t = drv.finish();
    print_observed("late", &g);
    compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: None,
            comm_library: NO_COMM,
        },
    )
    .assert_none("late_dlopen_is_picked_up");
}

/// Two files of one runtime in one process (libcuda and an identical copy, another inode,
/// through dlmopen): both listed and attached, counts through each summed exactly per symbol.
/// A second process mapping the first file: still one entry, attached once, its own counts.
#[test]
fn two_copies_attached_once_each() {
    let _serial = serial();
    let _took = Took::new("two_copies_attached_once_each");
    let d = start("gpu-copies");
    let s = standins::shared();
    let (drv, g) = run_ops(
        &d,
        &[Lib::Cuda, Lib::CudaCopy],
        &[
            "launches 5",
            "alloc 1M x 2",
            "htod 4K x 3",
            "sync stream 1",
            "use cuda2",
            "launches 7",
            "alloc 2M",
            "htod 8K x 2",
            "dtoh 1K",
            "sync ctx 2",
            "free 2", // the two 1 MiB, each through its own library (the first file)
            "use cuda",
        ],
    );
    let st = d.status();
    let a = lib_entries(&st, &s.cuda);
    let b = lib_entries(&st, &s.cuda_copy);
    eprintln!("observed: first file {a:?}\nobserved: copy {b:?}");
    assert_eq!(a.len(), 1, "entries of {}: {a:?}", s.cuda.display());
    assert_eq!(b.len(), 1, "entries of {}: {b:?}", s.cuda_copy.display());
    assert_ne!(a[0].inode, b[0].inode, "the copy has its own inode");
    for l in [a[0], b[0]] {
        assert_eq!(l.state, ProbeState::Attached, "{l:?}");
        assert_eq!(l.runtime, "cuda", "{l:?}");
    }
    let first_pid = drv.pid;

    // A second process mapping the first file: no new entry, its calls counted.
    let mut drv2 = s.spawn_driver(&[Lib::Cuda], &plan(&["launches 3", "htod 100"]));
    drv2.wait_for("waiting");
    thread::sleep(Duration::from_millis(3 * 300 + 100));
    let st2 = d.status();
    let a2 = lib_entries(&st2, &s.cuda);
    assert_eq!(a2.len(), 1, "second process: entries {a2:?}");
    assert_eq!(a2[0].state, ProbeState::Attached, "{:?}", a2[0]);
    assert_eq!(
        a2[0].found_in_pid, first_pid,
        "the entry still names the first process"
    );
    // Entries of the stand-ins' files (other processes on the machine may load others).
    let root = fs::canonicalize(&s.root).expect("stand-in root");
    let ours = |st: &SelfStatus| -> Vec<(String, u64)> {
        st.gpu_libraries
            .iter()
            .filter(|l| Path::new(&l.path).starts_with(&root))
            .map(|l| (l.path.clone(), l.inode))
            .collect()
    };
    assert_eq!(
        ours(&st2),
        ours(&st),
        "stand-in library entries after and before the second process"
    );
    assert_eq!(ours(&st).len(), 2, "{:?}", ours(&st));
    drv2.resume();
    drv2.wait_for("waiting");
    let g2 = settled(&d, drv2.pid);
    let g1_again = gpu_now(&d, first_pid).expect("first driver's gpu");
    let t2 = drv2.finish();
    let t = drv.finish();
    print_observed("two copies", &g);
    print_observed("second process", &g2);

    let mut mm = compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: Some(BTreeMap::from([("device", 2)])),
            comm_library: NO_COMM,
        },
    );
    mm.eq(
        "cuLaunchKernel through both files",
        calls_of(&g, "cuLaunchKernel").0,
        12,
    );
    mm.eq("first process unchanged by the second", &g1_again, &g);
    let mut mm2 = compare(
        &g2,
        &t2,
        &Expect {
            level: "process",
            frees: None,
            comm_library: NO_COMM,
        },
    );
    mm.0.extend(mm2.0.drain(..).map(|m| format!("second process: {m}")));
    mm.assert_none("two_copies_attached_once_each");
}

/// Every symbol of the catalog, called once through the four stand-ins: each shows one call
/// in `symbols`, and everything equals the ground truth.
#[test]
fn every_catalog_symbol_counted() {
    let _serial = serial();
    let _took = Took::new("every_catalog_symbol_counted");
    let d = start("gpu-every");
    let owned = plan_every_symbol();
    let ops: Vec<&str> = owned.iter().map(String::as_str).collect();
    let (drv, g) = run_ops(&d, &Lib::RUNTIMES, &ops);
    let t = drv.finish();
    print_observed("every symbol", &g);
    let es = ethand_symbols(&g);
    let mut mm = Mismatches::default();
    for c in catalog() {
        let key = (library_of_runtime(c.runtime), c.name.clone());
        let calls = es.get(&key).map_or(0, |s| s.calls);
        mm.eq(format!("{} {} calls", key.0, key.1), calls, 1);
    }
    mm.eq("symbols counted", es.len(), catalog().len());
    // Ties between communicators of equal size are not compared (the ground truth keeps the
    // first, the kernel the last).
    mm.0.extend(
        compare(
            &g,
            &t,
            &Expect {
                level: "process",
                frees: None,
                comm_library: None,
            },
        )
        .0,
    );
    mm.assert_none("every_catalog_symbol_counted");
}

/// `ethand level` live: process (launches untimed) -> op (every call timed) -> system
/// (uprobes detached: not counted, probes disabled) -> process (counted again).
#[test]
fn level_switch_live() {
    let _serial = serial();
    let _took = Took::new("level_switch_live");
    let d = start("gpu-level");
    let s = standins::shared();
    let mut drv = s.spawn_driver(
        &[Lib::Cuda],
        &[
            "wait_stdin",
            "launches 10",
            "htod 1K",
            "wait_stdin", // A: level process
            "launches 20",
            "htod 1K x 2",
            "sync stream 2",
            "wait_stdin", // B: level op
            "launches 40",
            "htod 1K x 4",
            "wait_stdin", // C: level system
            "launches 50",
            "htod 1K x 5",
            "dtod_async 1K x 3",
            "wait_stdin", // D: level process again
            "launches 60",
            "htod 1K x 6",
            "dtod_async 1K x 4",
            "sync stream 3",
            "wait_stdin", // E: level calls (every probed call but launches and D2D async copies)
        ],
    );
    drv.wait_for("waiting");
    let (st, _) = wait_attached(&d, &[&s.cuda]);
    assert_eq!(st.gpu_level, Some(GpuLevel::Process));
    let step = |drv: &mut Driver| {
        drv.resume();
        drv.wait_for("waiting");
        settled(&d, drv.pid)
    };
    let mut mm = Mismatches::default();

    let a = step(&mut drv);
    mm.eq(
        "A (process): cuLaunchKernel (calls, timed_calls)",
        calls_of(&a, "cuLaunchKernel"),
        (10, 0),
    );
    mm.eq(
        "A: cuMemcpyHtoD_v2",
        calls_of(&a, "cuMemcpyHtoD_v2"),
        (1, 0),
    );

    set_level(&d, "op");
    let (st, lag) = status_when(&d, |st| st.gpu_level == Some(GpuLevel::Op));
    eprintln!("observed: status shows level op {lag:?} after `ethand level` returned");
    mm.eq(
        "gpu_level after `level op`",
        st.gpu_level,
        Some(GpuLevel::Op),
    );
    mm.eq(
        "libcuda state at op",
        lib_entries(&st, &s.cuda).first().map(|l| l.state),
        Some(ProbeState::Attached),
    );
    let b = step(&mut drv);
    mm.eq(
        "B (op): cuLaunchKernel (calls, timed_calls)",
        calls_of(&b, "cuLaunchKernel"),
        (30, 20),
    );
    mm.eq(
        "B: cuMemcpyHtoD_v2",
        calls_of(&b, "cuMemcpyHtoD_v2"),
        (3, 2),
    );
    mm.eq(
        "B: cuStreamSynchronize",
        calls_of(&b, "cuStreamSynchronize"),
        (2, 2),
    );
    let launch_time: u64 = b
        .symbols
        .iter()
        .filter(|x| x.symbol == "cuLaunchKernel")
        .map(|x| x.time_ns)
        .sum();
    mm.ok(
        format!("B: cuLaunchKernel time_ns {launch_time} should be > 0 at level op"),
        launch_time > 0,
    );

    set_level(&d, "system");
    let (st, lag) = status_when(&d, |st| st.gpu_level == Some(GpuLevel::System));
    eprintln!("observed: status shows level system {lag:?} after `ethand level` returned");
    mm.eq(
        "gpu_level after `level system`",
        st.gpu_level,
        Some(GpuLevel::System),
    );
    for name in UPROBES {
        let p = probe(&st.probes, name);
        mm.eq(format!("{name} at system"), p.state, ProbeState::Disabled);
    }
    mm.eq(
        "libcuda state at system",
        lib_entries(&st, &s.cuda).first().map(|l| l.state),
        Some(ProbeState::Disabled),
    );
    let c = step(&mut drv);
    mm.eq(
        "C (system): cuLaunchKernel unchanged",
        calls_of(&c, "cuLaunchKernel"),
        (30, 20),
    );
    mm.eq(
        "C: cuMemcpyHtoD_v2 unchanged",
        calls_of(&c, "cuMemcpyHtoD_v2"),
        (3, 2),
    );

    set_level(&d, "process");
    let (st, lag) = status_when(&d, |st| st.gpu_level == Some(GpuLevel::Process));
    eprintln!("observed: status shows level process {lag:?} after `ethand level` returned");
    mm.eq(
        "gpu_level after `level process`",
        st.gpu_level,
        Some(GpuLevel::Process),
    );
    mm.eq(
        "uprobe_cuda at process",
        probe(&st.probes, "uprobe_cuda").state,
        ProbeState::Attached,
    );
    mm.eq(
        "libcuda state back at process",
        lib_entries(&st, &s.cuda).first().map(|l| l.state),
        Some(ProbeState::Attached),
    );
    let e = step(&mut drv);
    mm.eq(
        "D (process): cuLaunchKernel (calls, timed_calls)",
        calls_of(&e, "cuLaunchKernel"),
        (80, 20),
    );
    mm.eq(
        "D: cuMemcpyHtoD_v2",
        calls_of(&e, "cuMemcpyHtoD_v2"),
        (8, 2),
    );
    mm.eq("D: launches", e.launches, Some(80));
    mm.eq(
        "D (process): cuMemcpyDtoDAsync_v2",
        calls_of(&e, "cuMemcpyDtoDAsync_v2"),
        (3, 0),
    );

    set_level(&d, "calls");
    let (st, lag) = status_when(&d, |st| st.gpu_level == Some(GpuLevel::Calls));
    eprintln!("observed: status shows level calls {lag:?} after `ethand level` returned");
    mm.eq(
        "gpu_level after `level calls`",
        st.gpu_level,
        Some(GpuLevel::Calls),
    );
    let lib = lib_entries(&st, &s.cuda).first().cloned().cloned();
    mm.eq(
        "libcuda state at calls",
        lib.as_ref().map(|l| l.state),
        Some(ProbeState::Attached),
    );
    let detail = lib.map(|l| l.detail).unwrap_or_default();
    eprintln!("observed: libcuda at level calls: {detail}");
    mm.ok(
        format!("libcuda detail at calls should say launches are not probed: {detail}"),
        detail.contains("launch and device-copy symbols not probed at level calls"),
    );
    let f = step(&mut drv);
    // Launches made at level calls are not counted; copies and syncs are, exactly.
    mm.eq(
        "E (calls): cuLaunchKernel unchanged",
        calls_of(&f, "cuLaunchKernel"),
        (80, 20),
    );
    // Not counted at `calls`: the process's launch count is absent, not a stale 80 or a 0.
    mm.eq("E: launches not counted", f.launches, None);
    mm.eq(
        "E: cuMemcpyHtoD_v2",
        calls_of(&f, "cuMemcpyHtoD_v2"),
        (14, 2),
    );
    mm.eq(
        "E (calls): cuMemcpyDtoDAsync_v2 unchanged",
        calls_of(&f, "cuMemcpyDtoDAsync_v2"),
        (3, 0),
    );
    mm.eq(
        "E: cuStreamSynchronize (sync is timed at every level)",
        calls_of(&f, "cuStreamSynchronize"),
        (5, 5),
    );
    let snap = d.snapshot(drv.pid);
    mm.eq(
        "E: snapshot gpu_level",
        snap.gpu_level,
        Some(GpuLevel::Calls),
    );
    let text_out = text(&d.cli(&["snapshot", "--pid", &drv.pid.to_string()]).stdout);
    mm.ok(
        format!("E: the text snapshot should say launches are not counted:\n{text_out}"),
        text_out.contains("launches and device-to-device async copies not counted at level calls"),
    );
    let t = drv.finish();
    mm.eq(
        "ground truth cuLaunchKernel (all levels)",
        t.symbol(&s.cuda, "cuLaunchKernel").calls,
        180,
    );
    mm.eq(
        "ground truth cuMemcpyHtoD_v2 (all levels)",
        t.symbol(&s.cuda, "cuMemcpyHtoD_v2").calls,
        18,
    );
    mm.eq(
        "ground truth cuMemcpyDtoDAsync_v2 (all levels)",
        t.symbol(&s.cuda, "cuMemcpyDtoDAsync_v2").calls,
        7,
    );
    print_observed("level D", &e);
    mm.assert_none("level_switch_live");
}

/// A libcuda.so.1 that exports only cuLaunchKernel: attached, every other catalog symbol
/// listed missing ("not exported by this library"), and its calls exact.
#[test]
fn missing_symbols_reported() {
    let _serial = serial();
    let _took = Took::new("missing_symbols_reported");
    let dir = temp_path("gpu-partial", "d");
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmDir(dir.clone());
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("partial.c");
    fs::write(
        &src,
        "volatile unsigned long partial_hits;\n\
         int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,\n\
                            unsigned by, unsigned bz, unsigned shm, void *stream, void **params,\n\
                            void **extra) {\n\
             (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm;\n\
             (void)stream; (void)params; (void)extra;\n\
             partial_hits++;\n\
             return 0;\n\
         }\n",
    )
    .expect("write source");
    let lib = dir.join("libcuda.so.1");
    let out = Command::new("cc")
        .args(["-O2", "-fPIC", "-shared", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let d = start("gpu-partial");
    let s = standins::shared();
    let mut cmd = Command::new(&s.driver);
    cmd.arg("--cuda").arg(&lib).arg("--");
    for w in plan(&["launches 25"]) {
        cmd.args(w.split_whitespace());
    }
    let mut drv = Driver::spawn(&mut cmd);
    drv.wait_for("waiting");
    let (st, _) = wait_attached(&d, &[&lib]);
    let e = lib_entries(&st, &lib);
    eprintln!("observed: {e:#?}");
    assert_eq!(e.len(), 1, "{e:?}");
    let l = e[0];
    let mut mm = Mismatches::default();
    mm.eq("state", l.state, ProbeState::Attached);
    mm.eq("runtime", l.runtime.as_str(), "cuda");
    mm.eq(
        "symbols_attached",
        l.symbols_attached.clone(),
        vec!["cuLaunchKernel".to_string()],
    );
    let want_missing: BTreeSet<String> = catalog()
        .into_iter()
        .filter(|c| c.runtime == "cuda" && c.name != "cuLaunchKernel")
        .map(|c| format!("{}: not exported by this library", c.name))
        .collect();
    let got_missing: BTreeSet<String> = l.symbols_missing.iter().cloned().collect();
    mm.eq(
        "symbols_missing not listed",
        want_missing
            .difference(&got_missing)
            .cloned()
            .collect::<Vec<_>>(),
        vec![],
    );
    mm.eq(
        "symbols_missing unexpected",
        got_missing
            .difference(&want_missing)
            .cloned()
            .collect::<Vec<_>>(),
        vec![],
    );
    mm.eq(
        "symbols_missing entries",
        l.symbols_missing.len(),
        want_missing.len(),
    );
    mm.eq(
        "uprobe_cuda",
        probe(&st.probes, "uprobe_cuda").state,
        ProbeState::Attached,
    );
    drv.resume();
    drv.wait_for("waiting");
    let g = settled(&d, drv.pid);
    let t = drv.finish();
    print_observed("partial", &g);
    mm.eq(
        "ground truth cuLaunchKernel",
        t.symbol(&lib, "cuLaunchKernel").calls,
        25,
    );
    mm.0.extend(
        compare(
            &g,
            &t,
            &Expect {
                level: "process",
                frees: None,
                comm_library: NO_COMM,
            },
        )
        .0,
    );
    mm.assert_none("missing_symbols_reported");
}

/// /metrics while a driver runs: `promtool check metrics` accepts the exposition with the
/// GPU families, and the driver's series equal its ground truth (launches by kind, copy bytes
/// and calls by direction, live memory by kind, calls per symbol, sync calls).
#[test]
fn prometheus_gpu_series_pass_promtool() {
    let _serial = serial();
    let _took = Took::new("prometheus_gpu_series_pass_promtool");
    let d = start("gpu-prom");
    let (drv, g) = run_ops(
        &d,
        &[Lib::Cuda, Lib::Nccl, Lib::AscendCl],
        &[
            "launches 12",
            "launch_ex 2",
            "graph 3",
            "acl_op_execute 4",
            "alloc 1M x 2",
            "alloc 2T",
            "alloc_managed 4K",
            "host_alloc 8K",
            "acl_malloc 2K",
            "free 1",
            "htod 4K x 3",
            "dtoh 1K",
            "acl_memcpy 100 d2d",
            "memcpy_default 7",
            "sync stream 2",
            "comm_init_rank 5 8",
            "allreduce 256 float32 x 3",
            "allgather 16 int8",
        ],
    );
    let body = d.metrics();
    let pid = drv.pid.to_string();
    let t = drv.finish();
    print_observed("prometheus", &g);
    promtool_check(&body);

    let mut mm = compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: Some(BTreeMap::from([("device", 1)])),
            comm_library: Some("nccl"),
        },
    );
    let ts = truth_symbols(&t);
    let h = helpers();
    let sum = |helper: &str| -> u64 {
        ts.iter()
            .filter(|((_, n), _)| h.get(n).is_some_and(|x| x == helper))
            .map(|(_, s)| s.calls)
            .sum()
    };
    let p = pid.as_str();
    mm.eq(
        "ethand_process_gpu_launches_total{kind=\"kernel\"}",
        sample(
            &body,
            "ethand_process_gpu_launches_total",
            &[("pid", p), ("kind", "kernel")],
        ),
        Some(sum("launch") as f64),
    );
    mm.eq(
        "ethand_process_gpu_launches_total{kind=\"graph\"}",
        sample(
            &body,
            "ethand_process_gpu_launches_total",
            &[("pid", p), ("kind", "graph")],
        ),
        Some(sum("graph") as f64),
    );
    mm.eq("kernel launches in the plan", sum("launch"), 18);
    let mut dirs: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in ts.values() {
        for (dir, (c, b)) in &s.dirs {
            let e = dirs.entry(dir.clone()).or_default();
            e.0 += c;
            e.1 += b;
        }
    }
    for (dir, (c, b)) in &dirs {
        mm.eq(
            format!("ethand_process_gpu_memcpy_bytes_total{{direction={dir:?}}}"),
            sample(
                &body,
                "ethand_process_gpu_memcpy_bytes_total",
                &[("pid", p), ("direction", dir)],
            ),
            Some(*b as f64),
        );
        mm.eq(
            format!("ethand_process_gpu_memcpy_calls_total{{direction={dir:?}}}"),
            sample(
                &body,
                "ethand_process_gpu_memcpy_calls_total",
                &[("pid", p), ("direction", dir)],
            ),
            Some(*c as f64),
        );
    }
    for kind in MEM_KINDS {
        if t.peak(kind) == 0 {
            continue;
        }
        mm.eq(
            format!("ethand_process_gpu_memory_allocated_bytes{{memory={kind:?}}}"),
            sample(
                &body,
                "ethand_process_gpu_memory_allocated_bytes",
                &[("pid", p), ("memory", kind)],
            ),
            Some(t.live(kind) as f64),
        );
        mm.eq(
            format!("ethand_process_gpu_memory_peak_bytes{{memory={kind:?}}}"),
            sample(
                &body,
                "ethand_process_gpu_memory_peak_bytes",
                &[("pid", p), ("memory", kind)],
            ),
            Some(t.peak(kind) as f64),
        );
    }
    for ((lib, name), s) in &ts {
        mm.eq(
            format!("ethand_process_gpu_api_calls_total{{library={lib:?},symbol={name:?}}}"),
            sample(
                &body,
                "ethand_process_gpu_api_calls_total",
                &[("pid", p), ("library", lib), ("symbol", name)],
            ),
            Some(s.calls as f64),
        );
    }
    mm.eq(
        "ethand_process_gpu_api_errors_total{library=\"libcuda\"}",
        sample(
            &body,
            "ethand_process_gpu_api_errors_total",
            &[("pid", p), ("library", "libcuda")],
        ),
        Some(1.0),
    );
    mm.eq(
        "ethand_process_gpu_sync_calls_total",
        sample(&body, "ethand_process_gpu_sync_calls_total", &[("pid", p)]),
        Some(sum("sync") as f64),
    );
    let sync_s = sample(
        &body,
        "ethand_process_gpu_sync_seconds_total",
        &[("pid", p)],
    );
    mm.ok(
        format!("ethand_process_gpu_sync_seconds_total {sync_s:?} < 2 ms of stand-in sleeps"),
        sync_s.is_some_and(|v| v >= 0.002),
    );
    mm.eq(
        "ethand_process_collective_rank_info{library=\"nccl\",rank=\"5\",nranks=\"8\"}",
        sample(
            &body,
            "ethand_process_collective_rank_info",
            &[
                ("pid", p),
                ("library", "nccl"),
                ("rank", "5"),
                ("nranks", "8"),
            ],
        ),
        Some(1.0),
    );
    eprintln!(
        "observed: {} GPU samples for pid {pid}",
        body.lines()
            .filter(
                |l| l.starts_with("ethand_process_gpu_") && l.contains(&format!("pid=\"{pid}\""))
            )
            .count()
    );
    mm.assert_none("prometheus_gpu_series_pass_promtool");
}

/// A process with an NCCL communicator of 8 ranks and an HCCL one of 2: `comm` is the larger
/// (nccl, rank 5 of 8), library included, in the snapshot and in the rank info series.
#[test]
fn comm_library_is_that_of_the_largest_communicator() {
    let _serial = serial();
    let _took = Took::new("comm_library_is_that_of_the_largest_communicator");
    let d = start("gpu-comm");
    let (drv, g) = run_ops(
        &d,
        &[Lib::Nccl, Lib::Hccl],
        &["comm_init_rank 5 8", "hccl_comm_init_root_info 2 1"],
    );
    let body = d.metrics();
    let pid = drv.pid.to_string();
    let t = drv.finish();
    print_observed("two communicators", &g);
    let mut mm = compare(
        &g,
        &t,
        &Expect {
            level: "process",
            frees: None,
            comm_library: Some("nccl"),
        },
    );
    mm.eq(
        "collective_rank_info{library=\"nccl\",rank=\"5\",nranks=\"8\"}",
        sample(
            &body,
            "ethand_process_collective_rank_info",
            &[
                ("pid", &pid),
                ("library", "nccl"),
                ("rank", "5"),
                ("nranks", "8"),
            ],
        ),
        Some(1.0),
    );
    mm.assert_none("comm_library_is_that_of_the_largest_communicator");
}
