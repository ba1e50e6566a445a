//! Stand-in GPU/NPU runtime libraries and a driver program with exact ground truth, for
//! end-to-end tests on machines without a GPU or NPU (CI).
//!
//! `tests/standins/` holds C sources of stand-ins for `libcuda.so.1`, `libnccl.so.2`,
//! `libascendcl.so` and `libhccl.so` that export every symbol of ethand's catalog
//! (`userspace-probes/src/catalog.rs`) with the real C signatures, a stand-in `libcupti.so.12` /
//! `.13` (`cupti.c`: CUPTI's Activity API, fed by the stand-in libcuda), and `gpu_driver.c`, which
//! opens them with `dlopen`/`dlmopen`, calls them through `dlsym` following a plan and prints
//! the ground truth of what it did as one JSON line. [`build`] compiles them (gcc) into a
//! directory laid out like real installs; [`shared`] does it once per test process.
//!
//! The plan language is documented at the top of `tests/standins/gpu_driver.c`.
use std::{
    collections::BTreeMap,
    fs,
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The C sources.
pub const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/standins");
/// The catalog of probed symbols, parsed by [`catalog`].
pub const CATALOG_RS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../userspace-probes/src/catalog.rs"
);
/// How long a sync of the stand-ins sleeps (µs): read by the libraries when loaded and by the
/// driver for its ground truth. Default 1000.
pub const SYNC_ENV: &str = "ETHAND_STANDIN_SYNC_US";
/// Microseconds each stand-in collective blocks (`STANDIN_COLL_ENV` in standin_lib.h; 0 by
/// default).
pub const COLL_ENV: &str = "ETHAND_STANDIN_COLL_US";
/// An allocation or registration of more than this many bytes fails (CUDA_ERROR_OUT_OF_MEMORY,
/// ACL_ERROR_RT_MEMORY_ALLOCATION): an error, no bytes.
pub const ALLOC_LIMIT: u64 = 1 << 40;
/// Memory kinds of the ground truth, as `ethand_common::gpu_mem::NAMES`.
pub const MEM_KINDS: [&str; 4] = ["device", "managed", "host_pinned", "host_registered"];

const DRIVER_TIMEOUT: Duration = Duration::from_secs(60);

/// The built stand-ins, laid out like real installs under `root`.
#[derive(Clone, Debug)]
pub struct Standins {
    pub root: PathBuf,
    /// `root/usr/lib/x86_64-linux-gnu/libcuda.so.1`
    pub cuda: PathBuf,
    /// `root/opt/other/libcuda.so.1`: the same bytes as `cuda`, another inode.
    pub cuda_copy: PathBuf,
    /// `root/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2`
    pub nccl: PathBuf,
    /// `root/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so`
    pub ascendcl: PathBuf,
    /// `root/usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so`
    pub hccl: PathBuf,
    /// Stand-in CUPTI 13.5 (`cupti.c`), where the `nvidia-cuda-cupti` wheel puts it:
    /// `root/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13`
    pub cupti13: PathBuf,
    /// Stand-in CUPTI 12.9, where `nvidia-cuda-cupti-cu12` puts it:
    /// `root/venv/lib/python3.12/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12`
    pub cupti12: PathBuf,
    /// `root/bin/gpu_driver`
    pub driver: PathBuf,
}

/// A library the driver can open: each has its slot in the plan language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lib {
    Cuda,
    /// The second copy of libcuda, opened with `dlmopen(LM_ID_NEWLM)` (slot `cuda2`).
    CudaCopy,
    Nccl,
    AscendCl,
    Hccl,
}

impl Lib {
    /// The four runtimes, each in its first slot.
    pub const RUNTIMES: [Lib; 4] = [Lib::Cuda, Lib::Nccl, Lib::AscendCl, Lib::Hccl];

    /// Its slot in the plan language (`--SLOT PATH`, `use SLOT`, `dlopen_late SLOT PATH`).
    pub fn slot(self) -> &'static str {
        match self {
            Lib::Cuda => "cuda",
            Lib::CudaCopy => "cuda2",
            Lib::Nccl => "nccl",
            Lib::AscendCl => "acl",
            Lib::Hccl => "hccl",
        }
    }

    /// The runtime's name in the ground truth and in [`CatalogSymbol::runtime`].
    pub fn runtime(self) -> &'static str {
        match self {
            Lib::Cuda | Lib::CudaCopy => "cuda",
            Lib::Nccl => "nccl",
            Lib::AscendCl => "ascendcl",
            Lib::Hccl => "hccl",
        }
    }

    /// The first-slot library of a runtime name (`cuda`, `nccl`, `ascendcl`, `hccl`).
    pub fn of_runtime(runtime: &str) -> Option<Lib> {
        Lib::RUNTIMES.into_iter().find(|l| l.runtime() == runtime)
    }
}

/// Compiles the stand-ins and the driver into `dir` (created if needed). Under a second on
/// two cores: the seven compilers run in parallel.
pub fn build(dir: &Path) -> io::Result<Standins> {
    let site_packages = dir.join("venv/lib/python3.12/site-packages");
    let s = Standins {
        root: dir.to_path_buf(),
        cuda: dir.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        cuda_copy: dir.join("opt/other/libcuda.so.1"),
        nccl: dir.join("venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"),
        ascendcl: dir.join("usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"),
        hccl: dir.join("usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so"),
        cupti13: site_packages.join("nvidia/cu13/lib/libcupti.so.13"),
        cupti12: site_packages.join("nvidia/cuda_cupti/lib/libcupti.so.12"),
        driver: dir.join("bin/gpu_driver"),
    };
    let src = Path::new(SOURCES);
    // (source, soname, output, extra flags, libraries): libcuda dlopens the injection library
    // and CUPTI finds libcuda and runs a worker thread.
    let dl: &[&str] = &["-ldl"];
    let libs: [(&str, &str, &PathBuf, &[&str], &[&str]); 6] = [
        ("cuda.c", "libcuda.so.1", &s.cuda, &["-pthread"], dl),
        ("nccl.c", "libnccl.so.2", &s.nccl, &[], &[]),
        ("ascendcl.c", "libascendcl.so", &s.ascendcl, &[], &[]),
        ("hccl.c", "libhccl.so", &s.hccl, &[], &[]),
        (
            "cupti.c",
            "libcupti.so.13",
            &s.cupti13,
            &["-pthread", "-DSTANDIN_CUPTI_MAJOR=13"],
            dl,
        ),
        (
            "cupti.c",
            "libcupti.so.12",
            &s.cupti12,
            &["-pthread", "-DSTANDIN_CUPTI_MAJOR=12"],
            dl,
        ),
    ];
    let mut jobs = Vec::new();
    for (file, soname, out, flags, link) in libs {
        let mut cmd = Command::new("gcc");
        cmd.args([
            "-O2",
            "-fPIC",
            "-shared",
            "-fno-inline",
            "-fno-ipa-icf",
            "-Wall",
        ])
        .args(flags)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o");
        let link = link.iter().map(|l| l.to_string()).collect();
        jobs.push((cmd, src.join(file), out.clone(), link));
    }
    let mut cmd = Command::new("gcc");
    // -O1: -O2 takes 1.7 s here and the driver has nothing to gain from it.
    cmd.args(["-O1", "-Wall", "-o"]);
    jobs.push((
        cmd,
        src.join("gpu_driver.c"),
        s.driver.clone(),
        vec!["-ldl".to_string()],
    ));

    let mut running = Vec::new();
    for (mut cmd, source, out, tail) in jobs {
        let parent = out.parent().expect("output has a parent");
        fs::create_dir_all(parent)?;
        // Compile to a temporary name and rename: a reader never sees half a file.
        let tmp = out.with_extension("tmp-build");
        cmd.arg(&tmp).arg(&source).args(&tail);
        let what = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run gcc ({what}): {e}")))?;
        running.push((child, what, tmp, out));
    }
    let mut errors = Vec::new();
    for (child, what, tmp, out) in running {
        let o = child.wait_with_output()?;
        if o.status.success() {
            fs::rename(&tmp, &out)?;
        } else {
            errors.push(format!(
                "{what}: {}\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
    }
    if !errors.is_empty() {
        return Err(io::Error::other(errors.join("\n")));
    }
    // The second copy: identical bytes, a new inode (a copy, not a link).
    fs::create_dir_all(s.cuda_copy.parent().expect("parent"))?;
    let _ = fs::remove_file(&s.cuda_copy);
    fs::copy(&s.cuda, &s.cuda_copy)?;
    Ok(s)
}

/// The stand-ins of this test process, built once into `$TMPDIR/ethand-standins-PID`
/// (directories of dead test processes are removed then). Panics if they cannot be built.
pub fn shared() -> &'static Standins {
    static ONCE: OnceLock<Standins> = OnceLock::new();
    ONCE.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("ethand-standins-"))
                    .and_then(|p| p.parse::<u32>().ok())
                else {
                    continue;
                };
                if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = tmp.join(format!("ethand-standins-{}", std::process::id()));
        build(&dir).unwrap_or_else(|e| panic!("cannot build the stand-ins into {dir:?}: {e}"))
    })
}

impl Standins {
    /// The file of a library.
    pub fn path(&self, lib: Lib) -> &Path {
        match lib {
            Lib::Cuda => &self.cuda,
            Lib::CudaCopy => &self.cuda_copy,
            Lib::Nccl => &self.nccl,
            Lib::AscendCl => &self.ascendcl,
            Lib::Hccl => &self.hccl,
        }
    }

    /// The plan words that open `lib` at that point of the plan: `dlopen_late SLOT PATH`.
    pub fn dlopen_late(&self, lib: Lib) -> String {
        format!("dlopen_late {} {}", lib.slot(), self.path(lib).display())
    }

    /// `gpu_driver --SLOT PATH ... -- PLAN...`: `libs` are opened at start-up. Each plan
    /// element may hold several words (`"alloc 1M x 3"`). Add `.env(SYNC_ENV, "5000")` to
    /// change how long syncs sleep.
    pub fn command(&self, libs: &[Lib], plan: &[&str]) -> Command {
        let mut cmd = Command::new(&self.driver);
        for &l in libs {
            cmd.arg(format!("--{}", l.slot())).arg(self.path(l));
        }
        cmd.arg("--");
        for p in plan {
            cmd.args(p.split_whitespace());
        }
        cmd
    }

    /// Starts the driver and waits until it printed `ready` (start-up libraries open).
    pub fn spawn_driver(&self, libs: &[Lib], plan: &[&str]) -> Driver {
        Driver::spawn(&mut self.command(libs, plan))
    }

    /// Runs a plan to its end: the ground truth. Panics if the driver fails.
    pub fn run_driver(&self, libs: &[Lib], plan: &[&str]) -> GroundTruth {
        self.spawn_driver(libs, plan).finish()
    }
}

/// A running gpu_driver. Killed on drop.
pub struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: mpsc::Receiver<String>,
    stderr_log: Arc<Mutex<String>>,
    stdout: Option<thread::JoinHandle<String>>,
    pub pid: u32,
    what: String,
}

impl Driver {
    /// Spawns `cmd` (a [`Standins::command`]) with piped stdio and waits for `ready`.
    pub fn spawn(cmd: &mut Command) -> Self {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let err = child.stderr.take().expect("piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = Arc::clone(&log);
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { return };
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
                let _ = tx.send(line);
            }
        });
        let mut out = child.stdout.take().expect("piped");
        let stdout = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let pid = child.id();
        let mut d = Self {
            stdin: child.stdin.take(),
            child,
            stderr: rx,
            stderr_log: log,
            stdout: Some(stdout),
            pid,
            what,
        };
        d.wait_for("ready");
        d
    }

    /// Waits until the driver printed `line` on stderr (`ready`, `waiting`, `mark NAME`);
    /// lines before it are skipped. Panics after 60 s or if the driver exits first.
    pub fn wait_for(&mut self, line: &str) {
        let deadline = Instant::now() + DRIVER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) if l == line => return,
                Ok(_) => continue,
                Err(e) => panic!(
                    "{}: no `{line}` on stderr ({e}); exit status {:?}; stderr:\n{}",
                    self.what,
                    self.child.try_wait(),
                    self.stderr_text()
                ),
            }
        }
    }

    /// Waits for a stderr line starting with `prefix` and returns the rest of it.
    pub fn wait_for_prefix(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + DRIVER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(e) => panic!(
                    "{}: no line starting `{prefix}` on stderr ({e}); exit status {:?}; stderr:\n{}",
                    self.what,
                    self.child.try_wait(),
                    self.stderr_text()
                ),
            }
        }
    }

    /// Releases one `wait_stdin` of the plan.
    pub fn resume(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: cannot write to stdin: {e}", self.what));
    }

    /// What the driver printed on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr_log
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Waits for the end of the plan (stdin is closed: later `wait_stdin`s do not block),
    /// checks the exit status and parses the ground truth.
    pub fn finish(mut self) -> GroundTruth {
        let (code, out) = self.wait_exit();
        assert_eq!(
            code,
            Some(0),
            "{} failed; stderr:\n{}",
            self.what,
            self.stderr_text()
        );
        let line = out.lines().last().unwrap_or_default();
        GroundTruth::parse(line)
            .unwrap_or_else(|e| panic!("{}: bad ground truth ({e}): {out:?}", self.what))
    }

    /// Waits for the driver to exit, expecting a failure: (exit code, stderr).
    pub fn finish_err(mut self) -> (Option<i32>, String) {
        let (code, _) = self.wait_exit();
        // Until the stderr reader saw the end: every line is in the log.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) = self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if Instant::now() >= deadline {
                break;
            }
        }
        (code, self.stderr_text())
    }

    fn wait_exit(&mut self) -> (Option<i32>, String) {
        drop(self.stdin.take());
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                t0.elapsed() < DRIVER_TIMEOUT,
                "{} still running after {DRIVER_TIMEOUT:?}; stderr:\n{}",
                self.what,
                self.stderr_text()
            );
            thread::sleep(Duration::from_millis(5));
        };
        let out = self
            .stdout
            .take()
            .map(|h| h.join().expect("stdout reader"))
            .unwrap_or_default();
        (status.code(), out)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Calls of one symbol through one library file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SymbolTruth {
    pub calls: u64,
    /// Calls that returned an error (allocations and registrations only).
    pub errors: u64,
    /// Copy bytes, collective bytes (count x data type size), bytes allocated, registered or
    /// freed (successful calls only).
    pub bytes: u64,
    /// Syncs: calls x the sleep of the stand-in; the host time is at least this.
    pub min_time_ns: u64,
    /// Copies: calls and bytes by direction (`ethand_common::gpu_dir::NAMES`).
    pub dirs: BTreeMap<String, DirTruth>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirTruth {
    pub calls: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibraryTruth {
    /// `cuda`, `nccl`, `ascendcl` or `hccl`.
    pub runtime: String,
    /// `base` (dlopen) or `new` (dlmopen(LM_ID_NEWLM)).
    pub namespace: String,
    /// Only the symbols that were called.
    pub symbols: BTreeMap<String, SymbolTruth>,
}

/// A communicator creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommTruth {
    pub library: PathBuf,
    pub symbol: String,
    /// None: the call does not say (ncclCommSplit). u32::MAX: ncclCommInitAll (every rank).
    pub rank: Option<u32>,
    /// None: the call does not say (ncclCommSplit, HcclCommInitClusterInfo).
    pub nranks: Option<u32>,
}

/// What the driver did: its final JSON line.
#[derive(Clone, Debug)]
pub struct GroundTruth {
    pub pid: u32,
    pub sync_us: u64,
    /// By library path: every library opened, even if not called.
    pub libraries: BTreeMap<PathBuf, LibraryTruth>,
    /// Per process (all libraries): bytes allocated and not freed, by [`MEM_KINDS`].
    pub live_bytes: BTreeMap<String, u64>,
    /// The largest `live_bytes` reached, by kind.
    pub peak_bytes: BTreeMap<String, u64>,
    /// `untracked_free` calls: frees of addresses never allocated.
    pub untracked_frees: u64,
    pub comms: Vec<CommTruth>,
    /// Of the communicator with the most ranks (the first of equals); None when there is none.
    pub rank: Option<u32>,
    /// 0 when no communicator with a known size was created.
    pub nranks: u32,
    /// Launches by kernel name, of the `kernel NAME [x N]` words (also counted as
    /// cuLaunchKernel calls).
    pub kernels: BTreeMap<String, u64>,
    /// The counters of the stand-in CUPTI loaded in the driver (`ethand_standin_cupti_counts`,
    /// cupti.c), or None when none was loaded.
    pub cupti: Option<Value>,
    pub raw: Value,
}

fn u64_of(v: &Value, key: &str) -> Result<u64, String> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("no number {key} in {v}"))
}

fn opt_u32(v: &Value, key: &str) -> Result<Option<u32>, String> {
    match v.get(key) {
        Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{key} is not a u32 in {v}")),
        None => Err(format!("no {key} in {v}")),
    }
}

fn obj<'a>(v: &'a Value, key: &str) -> Result<&'a serde_json::Map<String, Value>, String> {
    v.get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| format!("no object {key} in {v}"))
}

fn u64_map(v: &Value, key: &str) -> Result<BTreeMap<String, u64>, String> {
    obj(v, key)?
        .iter()
        .map(|(k, n)| {
            n.as_u64()
                .map(|n| (k.clone(), n))
                .ok_or_else(|| format!("{key}.{k} is not a number"))
        })
        .collect()
}

impl GroundTruth {
    pub fn parse(line: &str) -> Result<Self, String> {
        let raw: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let mut libraries = BTreeMap::new();
        for (path, l) in obj(&raw, "libraries")? {
            let mut symbols = BTreeMap::new();
            for (name, s) in obj(l, "symbols")? {
                let mut dirs = BTreeMap::new();
                for (d, x) in obj(s, "dirs")? {
                    dirs.insert(
                        d.clone(),
                        DirTruth {
                            calls: u64_of(x, "calls")?,
                            bytes: u64_of(x, "bytes")?,
                        },
                    );
                }
                symbols.insert(
                    name.clone(),
                    SymbolTruth {
                        calls: u64_of(s, "calls")?,
                        errors: u64_of(s, "errors")?,
                        bytes: u64_of(s, "bytes")?,
                        min_time_ns: u64_of(s, "min_time_ns")?,
                        dirs,
                    },
                );
            }
            let text = |k: &str| -> Result<String, String> {
                l.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("no {k} in {l}"))
            };
            libraries.insert(
                PathBuf::from(path),
                LibraryTruth {
                    runtime: text("runtime")?,
                    namespace: text("namespace")?,
                    symbols,
                },
            );
        }
        let mut comms = Vec::new();
        for c in raw
            .get("comms")
            .and_then(Value::as_array)
            .ok_or("no comms array")?
        {
            comms.push(CommTruth {
                library: PathBuf::from(c.get("library").and_then(Value::as_str).ok_or("library")?),
                symbol: c
                    .get("symbol")
                    .and_then(Value::as_str)
                    .ok_or("symbol")?
                    .to_string(),
                rank: opt_u32(c, "rank")?,
                nranks: opt_u32(c, "nranks")?,
            });
        }
        Ok(Self {
            pid: u32::try_from(u64_of(&raw, "pid")?).map_err(|e| e.to_string())?,
            sync_us: u64_of(&raw, "sync_us")?,
            libraries,
            live_bytes: u64_map(&raw, "live_bytes")?,
            peak_bytes: u64_map(&raw, "peak_bytes")?,
            untracked_frees: u64_of(&raw, "untracked_frees")?,
            comms,
            rank: opt_u32(&raw, "rank")?,
            nranks: u32::try_from(u64_of(&raw, "nranks")?).map_err(|e| e.to_string())?,
            kernels: u64_map(&raw, "kernels")?,
            cupti: raw.get("cupti").filter(|v| !v.is_null()).cloned(),
            raw,
        })
    }

    /// The calls of `name` through the library file `lib` (zero when never called).
    pub fn symbol(&self, lib: &Path, name: &str) -> SymbolTruth {
        self.libraries
            .get(lib)
            .and_then(|l| l.symbols.get(name))
            .cloned()
            .unwrap_or_default()
    }

    /// The calls of `name` through every library file, summed.
    pub fn total(&self, name: &str) -> SymbolTruth {
        let mut t = SymbolTruth::default();
        for l in self.libraries.values() {
            if let Some(s) = l.symbols.get(name) {
                t.calls += s.calls;
                t.errors += s.errors;
                t.bytes += s.bytes;
                t.min_time_ns += s.min_time_ns;
                for (d, x) in &s.dirs {
                    let e = t.dirs.entry(d.clone()).or_default();
                    e.calls += x.calls;
                    e.bytes += x.bytes;
                }
            }
        }
        t
    }

    /// Live bytes of a memory kind ([`MEM_KINDS`]).
    pub fn live(&self, mem: &str) -> u64 {
        self.live_bytes.get(mem).copied().unwrap_or(0)
    }

    pub fn peak(&self, mem: &str) -> u64 {
        self.peak_bytes.get(mem).copied().unwrap_or(0)
    }
}

/// One symbol of ethand's catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogSymbol {
    /// `cuda`, `nccl`, `ascendcl` or `hccl`.
    pub runtime: &'static str,
    pub name: String,
    /// The catalog's constructor: launch, graph, alloc, register, free, copy, acl_copy,
    /// copy2d, sync, coll, group, comm_init.
    pub helper: String,
}

impl CatalogSymbol {
    pub fn lib(&self) -> Lib {
        Lib::of_runtime(self.runtime).expect("known runtime")
    }

    /// Plan words that call this symbol once and nothing else (a free needs a live
    /// allocation of its kind, made through the same slot).
    pub fn plan_once(&self) -> String {
        let n = &self.name;
        match self.helper.as_str() {
            "launch" | "graph" | "group" | "sync" | "free" => format!("{n} 1"),
            "alloc" | "register" | "copy" => format!("{n} 4K"),
            "acl_copy" => format!("{n} 4K 1"),
            "copy2d" => format!("{n} 64x8 htod"),
            "coll" => format!("{n} 16 2"),
            "comm_init" => match n.as_str() {
                "ncclCommInitAll" => format!("{n} 2"),
                "ncclCommSplit" => n.clone(),
                "HcclCommInitRootInfo" => format!("{n} 4 1"),
                "HcclCommInitClusterInfo" => format!("{n} 1"),
                _ => format!("{n} 1 4"),
            },
            h => panic!("catalog helper {h} of {n} has no plan"),
        }
    }
}

/// The symbols of ethand's catalog (`userspace-probes/src/catalog.rs`, read as text: this
/// crate does not depend on the probes crate), in catalog order.
pub fn catalog() -> Vec<CatalogSymbol> {
    let text =
        fs::read_to_string(CATALOG_RS).unwrap_or_else(|e| panic!("cannot read {CATALOG_RS}: {e}"));
    parse_catalog(&text).unwrap_or_else(|e| panic!("cannot parse {CATALOG_RS}: {e}"))
}

/// Parses the entries of `pub const CATALOG: &[SymbolSpec] = &[ ... ];`.
pub fn parse_catalog(text: &str) -> Result<Vec<CatalogSymbol>, String> {
    let start = text
        .find("pub const CATALOG")
        .ok_or("no `pub const CATALOG`")?;
    let open = start
        + text[start..]
            .find("= &[")
            .ok_or("no `= &[` after CATALOG")?
        + 4;
    let body: String = text[open..]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    // Split at commas outside parentheses, up to the closing bracket.
    let mut entries = Vec::new();
    let (mut depth, mut in_str, mut cur) = (0i32, false, String::new());
    for ch in body.chars() {
        match ch {
            '"' => in_str = !in_str,
            '(' | '[' if !in_str => depth += 1,
            ')' if !in_str => depth -= 1,
            ']' if !in_str => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            }
            ',' if !in_str && depth == 0 => {
                entries.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    entries.push(cur);
    let mut out = Vec::new();
    for e in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let (helper, args) = e
            .split_once('(')
            .ok_or_else(|| format!("entry without arguments: {e}"))?;
        let helper = helper.trim().to_string();
        let name = args
            .split('"')
            .nth(1)
            .ok_or_else(|| format!("entry without a name: {e}"))?
            .to_string();
        let first = args
            .split(',')
            .next()
            .unwrap_or("")
            .trim()
            .trim_start_matches("Runtime::");
        let runtime = match (first, helper.as_str()) {
            ("Cuda", _) | (_, "graph" | "register" | "copy2d") => "cuda",
            ("Nccl", _) | (_, "group") => "nccl",
            ("Acl" | "AscendCl", _) | (_, "acl_copy") => "ascendcl",
            ("Hccl", _) => "hccl",
            _ => return Err(format!("cannot tell the runtime of {e}")),
        };
        out.push(CatalogSymbol {
            runtime,
            name,
            helper,
        });
    }
    if out.is_empty() {
        return Err("no entries".into());
    }
    Ok(out)
}

/// A plan that calls every catalog symbol exactly once: everything but the frees first, then
/// the frees (the catalog has at least as many allocations of each kind as frees of it).
pub fn plan_every_symbol() -> Vec<String> {
    let cat = catalog();
    let (frees, rest): (Vec<_>, Vec<_>) = cat.iter().partition(|s| s.helper == "free");
    let mut plan = Vec::new();
    for s in rest.into_iter().chain(frees) {
        plan.push(s.plan_once());
    }
    plan
}

/// A defined dynamic symbol of a library file (`nm -D --defined-only`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynSymbol {
    pub name: String,
    pub addr: u64,
    /// nm's type letter: `T` global function, `W` weak, ...
    pub kind: char,
}

/// The defined dynamic symbols of an ELF file, by `nm -D --defined-only` (binutils).
pub fn dynamic_symbols(file: &Path) -> io::Result<Vec<DynSymbol>> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(file)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "nm -D {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let mut syms = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [addr, kind, name] = f[..] {
            let addr = u64::from_str_radix(addr, 16)
                .map_err(|e| io::Error::other(format!("nm line {line:?}: {e}")))?;
            syms.push(DynSymbol {
                name: name.to_string(),
                addr,
                kind: kind.chars().next().unwrap_or('?'),
            });
        }
    }
    Ok(syms)
}

/// The files a process maps (/proc/PID/maps): (path, inode), each once.
pub fn mapped_files(pid: u32) -> Vec<(PathBuf, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut files: Vec<(PathBuf, u64)> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with('/') {
            continue;
        }
        let Ok(inode) = f[4].parse() else { continue };
        let e = (PathBuf::from(f[5]), inode);
        if !files.contains(&e) {
            files.push(e);
        }
    }
    files
}

/// Compiles the stand-in device management library `source` (`nvml.c`, `dcmi.c` of
/// [`SOURCES`]) into `dir/file` (`libnvidia-ml.so.1`, `libdcmi.so`), for a daemon's
/// `devices.nvml_library` / `dcmi_library`.
pub fn build_device_library(dir: &Path, source: &str, file: &str) -> PathBuf {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let out = dir.join(file);
    let o = Command::new("gcc")
        .args(["-O1", "-shared", "-fPIC", "-Wall", "-o"])
        .arg(&out)
        .arg(Path::new(SOURCES).join(source))
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc {source}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
