//! The Python line of every GPU call, walked in the kernel at the probe (issue 41): a Python
//! program calls the stand-in libcuda's `cuStreamSynchronize` through ctypes 3,000 times
//! from `f()`, 1,000 times from `g()` and once 61 frames deep, then waits. A snapshot taken after the calls (the
//! 2-second Python sample finds only the sleep) must count exactly 3,000 at `f`'s line and
//! 1,000 at `g`'s, and again once the program has exited. Then 500 calls made on native
//! threads (started with `pthread_create` on the sync itself: no Python state) must keep
//! their native site with no Python frame, and `ethand record` must carry the same lines on
//! each recorded call.
use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use ethand_snapshot::{
    gpu::PythonWalk,
    stacks::{CallSites, FrameKind},
};
use ethand_tests::{
    Daemon, TreeSnapshot, serial,
    standins::{self, Lib},
    text,
};

/// Python frames the kernel keeps per call (`PY_MAX_FRAMES`).
const PY_MAX_FRAMES: usize = 32;
/// Calls the script makes on native threads (its default).
const NATIVE_CALLS: u64 = 500;

pub(crate) const SCRIPT: &str = r#"import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
sync = lib.cuStreamSynchronize
libc = ctypes.CDLL(None)
def native(n):
    # Each call on a thread of its own that never runs Python: the sync is its start routine.
    t = ctypes.c_ulong()
    for _ in range(n):
        assert libc.pthread_create(ctypes.byref(t), None, ctypes.cast(sync, ctypes.c_void_p), None) == 0
        assert libc.pthread_join(t, None) == 0
def f():
    sync(None)  # F_LINE
def g():
    sync(None)  # G_LINE
def deeper(n):
    if n == 0:
        return sync(None)  # DEEP_LINE
    return deeper(n - 1)
def warm():
    sync(None)  # WARM_LINE
import select
print("ready", flush=True)
# Until told to go: a call now and then, so that the daemon finds a GPU process to walk.
while not select.select([sys.stdin], [], [], 0.1)[0]:
    warm()
sys.stdin.readline()
for _ in range(3000):
    f()  # FOR_F
for _ in range(1000):
    g()
deeper(60)
native(int(sys.argv[2]) if len(sys.argv) > 2 else 500)
print("done", flush=True)
sys.stdin.readline()
"#;

/// A Python script driven line by line: it prints "ready", waits for "go" on stdin, prints
/// "done" after its calls and exits at the next line.
pub(crate) struct Prompted {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Prompted {
    /// Starts `cmd` (a python3 command) and waits for its "ready".
    pub(crate) fn start(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let stdin = child.stdin.take().expect("stdin");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut p = Self { child, stdin, out };
        p.expect("ready");
        p
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn expect(&mut self, want: &str) {
        let mut line = String::new();
        self.out
            .read_line(&mut line)
            .expect("a line from the script");
        assert_eq!(line.trim(), want);
    }

    /// "go", then waits for "done".
    pub(crate) fn go(&mut self) {
        writeln!(self.stdin, "go").expect("go");
        self.expect("done");
    }

    /// Tells it to exit and waits for it; panics unless it exited with 0.
    pub(crate) fn exit(mut self) {
        writeln!(self.stdin, "exit").expect("exit");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "python: {status}");
    }
}

pub(crate) fn line_of(marker: &str) -> u32 {
    SCRIPT
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker") as u32
        + 1
}

fn snapshot(d: &Daemon, pid: u32) -> Option<TreeSnapshot> {
    let o = d.cli(&["snapshot", "--pid", &pid.to_string(), "--json"]);
    if !o.status.success() {
        let err = text(&o.stderr);
        assert!(err.contains("is known to ethand"), "snapshot: {err}");
        return None;
    }
    Some(serde_json::from_slice(&o.stdout).expect("JSON"))
}

/// Calls per (innermost Python function, line) of the syncs of `pid`.
fn by_line(t: &TreeSnapshot, pid: u32) -> (Vec<(String, u32, u64)>, CallSites) {
    let p = t.processes.iter().find(|p| p.pid == pid).expect("process");
    let cs = p
        .gpu
        .as_ref()
        .and_then(|g| {
            g.call_sites
                .iter()
                .find(|c| c.call == "cuStreamSynchronize")
        })
        .expect("sync call sites")
        .clone();
    let mut v: Vec<(String, u32, u64)> = cs
        .sites
        .iter()
        .filter_map(|s| {
            let f = s.frames.iter().find(|f| f.kind == FrameKind::Python)?;
            Some((f.function.clone()?, f.line?, s.count))
        })
        .filter(|(function, _, _)| function != "warm")
        .collect();
    v.sort();
    (v, cs)
}

#[test]
fn python_lines_of_gpu_calls_are_exact_after_the_calls_and_after_exit() {
    let _serial = serial();
    let d = Daemon::start("pyframes", "[gpu]\nrescan_interval_ms = 300\n");
    let dir = std::env::temp_dir().join(format!("ethand-pyframes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("lines.py");
    std::fs::write(&script, SCRIPT).expect("script");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(standins::shared().path(Lib::Cuda));
    let mut script_run = Prompted::start(cmd);
    let pid = script_run.pid();
    // Until the daemon has attached to the stand-in and read the interpreter.
    let t0 = Instant::now();
    let mut last = None;
    let version = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the process was never walked: last seen {last:?}"
        );
        let walk = snapshot(&d, pid).and_then(|s| {
            s.processes
                .iter()
                .find(|p| p.pid == pid)
                .and_then(|p| p.gpu.as_ref()?.python_walk.clone())
        });
        last = Some(walk.clone());
        match walk {
            Some(PythonWalk::Walked { version }) => break version,
            Some(PythonWalk::Refused { why }) => panic!("not walked: {why}"),
            _ => thread::sleep(Duration::from_millis(200)),
        }
    };
    eprintln!("observed: walked, CPython {version}");
    script_run.go();
    let script_path = script.to_str().expect("utf-8");
    let expected = vec![
        ("deeper".to_string(), line_of("DEEP_LINE"), 1),
        ("f".to_string(), line_of("F_LINE"), 3000),
        ("g".to_string(), line_of("G_LINE"), 1000),
    ];
    // The code objects are read at the round after the calls: wait for it (bounded).
    let t0 = Instant::now();
    let (lines, cs) = loop {
        let t = snapshot(&d, pid).expect("snapshot of a live process");
        let (lines, cs) = by_line(&t, pid);
        if lines == expected || t0.elapsed() > Duration::from_secs(10) {
            break (lines, cs);
        }
        thread::sleep(Duration::from_millis(300));
    };
    eprintln!(
        "observed: by line {lines:?}; total {} other {} unattributed {:?}",
        cs.total, cs.other, cs.unattributed
    );
    assert_eq!(lines, expected, "calls per Python line: {cs:#?}");
    let site = cs.sites.iter().find(|s| s.count == 3000).expect("f's site");
    // Its source text, read as the process's owner.
    assert_eq!(site.source.as_deref(), Some("sync(None)  # F_LINE"));
    let py: Vec<_> = site.frames.iter().filter(|f| f.file.is_some()).collect();
    assert_eq!(py[0].file.as_deref(), Some(script_path));
    assert_eq!(
        py.last().and_then(|f| f.function.as_deref()),
        Some("<module>")
    );
    // The deep stack keeps its innermost frames, cut at the walk's depth.
    let deep = cs
        .sites
        .iter()
        .find(|s| {
            s.count == 1
                && s.frames
                    .iter()
                    .any(|f| f.function.as_deref() == Some("deeper"))
        })
        .expect("the deep call");
    let deep_frames = deep
        .frames
        .iter()
        .filter(|f| f.function.as_deref() == Some("deeper"))
        .count();
    assert_eq!(deep_frames, PY_MAX_FRAMES, "deep frames: {deep:?}");
    // Calls on threads with no Python state keep their native site, with no Python frame:
    // called by glibc's start_thread (warm()'s calls before the walk began have no Python
    // frame either, but are called through libffi).
    let native: Vec<_> = cs
        .sites
        .iter()
        .filter(|s| {
            !s.frames.iter().any(|f| f.kind == FrameKind::Python)
                && s.frames
                    .first()
                    .and_then(|f| f.module.as_deref())
                    .is_some_and(|m| m.contains("/libc.so"))
        })
        .collect();
    eprintln!(
        "observed: sites with no Python frame: {:?}",
        native
            .iter()
            .map(|s| (
                s.count,
                s.frames.iter().map(|f| f.label()).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        native.iter().map(|s| s.count).sum::<u64>(),
        NATIVE_CALLS,
        "native threads' calls: {native:#?}"
    );

    // The process exits: what was read is kept.
    script_run.exit();
    thread::sleep(Duration::from_millis(1500));
    let t = snapshot(&d, pid).expect("snapshot of the exited process");
    let (after, _) = by_line(&t, pid);
    assert_eq!(after, expected, "after exit");
    // And after the walk's clean-up of unused stacks (every 60 rounds of 200 ms) has run.
    thread::sleep(Duration::from_millis(12_500));
    let t = snapshot(&d, pid).expect("snapshot of the exited process");
    let (later, _) = by_line(&t, pid);
    assert_eq!(later, expected, "12.5 s after exit");
}
