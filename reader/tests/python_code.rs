//! `PythonRuntime` and `PythonCode` (reader/src/pycode.rs) against real interpreters, through
//! a real supervisor and worker: each interpreter runs `python_code.py`, which prints what it
//! says of itself (its gilstate TSS key read with ctypes, its code objects' addresses, names,
//! first lines and the line of every position by `co_lines()` / `dis.findlinestarts`), and
//! the reader's answers must equal it. Debian's python3 (3.11, libpython linked in, not PIE)
//! always; pyenv's 3.9-3.13 (shared libpython) where installed.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ethand_reader::{PyRuntime, Reader, proto::cut, supervisor::Args};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(10);
const SCRIPT: &str = include_str!("python_code.py");
const PYENV: [&str; 5] = ["3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"];

fn reader() -> Reader {
    Reader::spawn(
        Command::new(env!("CARGO_BIN_EXE_ethand-reader")),
        &Args::default(),
    )
    .expect("spawn the supervisor")
}

/// A running interpreter, killed when dropped.
struct Python(Child);

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The script in a directory of its own whose name is not ASCII (so is `co_filename`).
struct Script(PathBuf);

impl Script {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("ethand-pycode-jöb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Workers run as the owner: let anyone traverse (the unprivileged pass runs as nobody).
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = dir.join("python_code.py");
        std::fs::write(&path, SCRIPT).unwrap();
        Self(path)
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// Starts `python` on the script; what it printed.
fn start(python: &Path, script: &Path) -> (Python, Value) {
    let mut child = Python(
        Command::new(python)
            .arg(script)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", python.display())),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("{}: {e}: {line:?}", python.display()));
    (child, v)
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Asks the reader about `python` running the script, and checks every answer against what
/// the interpreter printed.
fn check(reader: &Reader, python: &Path, script: &Path) {
    let (child, v) = start(python, script);
    let name = python.display();
    let pid = child.0.id();
    let start_ticks = ethand_reader::owner::start_ticks(pid);
    let minor = u64_of(&v["minor"]) as u32;
    let mut s = reader.session(pid, start_ticks).unwrap();
    if ethand_common::py_layout(minor).is_none() {
        let e = s.python_runtime(pid, start_ticks, DEADLINE).unwrap_err();
        let version = v["version"].as_str().unwrap();
        assert!(e.to_string().contains(version), "{name}: {e}");
        eprintln!("{name}: Python {version} is not walked, refused: {e}");
        return;
    }
    // The script's own check that the key's slot holds its thread's state.
    assert_eq!(v["tss_key_ok"], Value::Bool(true), "{name}: {v}");
    let t0 = Instant::now();
    let runtime = s.python_runtime(pid, start_ticks, DEADLINE).unwrap();
    let runtime_took = t0.elapsed();
    assert_eq!(
        runtime,
        PyRuntime {
            minor,
            tss_key: u64_of(&v["tss_key"]) as u32,
        },
        "{name}"
    );

    let want = v["codes"].as_array().unwrap();
    let freed = u64_of(&v["freed"]);
    assert_eq!(
        v["freed_ok"],
        Value::Bool(true),
        "{name}: the code object lives on"
    );
    let mut addrs: Vec<u64> = want.iter().map(|c| u64_of(&c["addr"])).collect();
    addrs.extend([u64_of(&v["list"]), freed, 0, 8]);
    let t0 = Instant::now();
    let got = s
        .python_code(pid, start_ticks, minor, &addrs, DEADLINE)
        .unwrap();
    let code_took = t0.elapsed();
    assert_eq!(got.len(), addrs.len());
    let mut positions = 0;
    for (w, g) in want.iter().zip(&got) {
        let code = g.as_ref().unwrap_or_else(|e| panic!("{name}: {w}: {e}"));
        assert_eq!(code.file, w["file"].as_str().unwrap(), "{name}");
        let function = cut(w["function"].as_str().unwrap().to_string(), 512);
        assert_eq!(code.function, function, "{name}");
        assert_eq!(
            u64::from(code.first_line),
            u64_of(&w["first_line"]),
            "{name}"
        );
        for p in w["lines"].as_array().unwrap() {
            let (pos, line) = (u64_of(&p[0]) as u32, p[1].as_u64().map(|l| l as u32));
            assert_eq!(
                code.line(minor, pos),
                line,
                "{name}: {} at {pos}",
                code.function
            );
            positions += 1;
        }
    }
    let script_file = script.to_str().unwrap();
    let names: Vec<&str> = got[..4]
        .iter()
        .map(|c| c.as_ref().unwrap().function.as_str())
        .collect();
    let method = if minor >= 11 { "K.method" } else { "method" };
    assert_eq!(names, [method, "größe", "δέλτα", "f𠀀"], "{name}");
    assert!(
        got[..4]
            .iter()
            .all(|c| c.as_ref().unwrap().file == script_file)
    );
    // A list, a freed code object, null and an unmapped address: errors, not garbage.
    for (what, g) in ["list", "freed", "null", "unmapped"]
        .iter()
        .zip(&got[want.len()..])
    {
        assert!(g.is_err(), "{name}: the {what} was decoded: {g:?}");
    }
    let list_error = got[want.len()].as_ref().unwrap_err();
    assert!(
        list_error.contains("code object at"),
        "{name}: {list_error}"
    );
    eprintln!(
        "{name}: 3.{minor} key {} ({runtime_took:?}): {} code objects ({code_took:?}), \
         {positions} positions; the freed one: {}",
        runtime.tss_key,
        addrs.len(),
        got[want.len() + 1].as_ref().unwrap_err()
    );
    let other = s
        .python_code(pid, start_ticks, minor + 1, &addrs[..1], DEADLINE)
        .unwrap_err()
        .to_string();
    assert!(other.contains(&format!("runs Python 3.{minor}")), "{other}");
}

/// Reading another process's memory as its owner, without CAP_SYS_PTRACE, needs Yama off.
fn can_read_memory() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root || std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map_or(true, |s| s.trim() == "0")
}

#[test]
fn code_objects_and_the_tss_key_are_those_the_interpreters_report() {
    if !can_read_memory() {
        eprintln!("skipped: not root and Yama's ptrace_scope is not 0");
        return;
    }
    let reader = reader();
    let script = Script::new();
    // Debian's interpreter is the one CI has.
    check(&reader, Path::new("/usr/bin/python3"), &script.0);
    for v in PYENV {
        let python = PathBuf::from(format!("/root/.pyenv/versions/{v}/bin/python"));
        if python.exists() {
            check(&reader, &python, &script.0);
        } else {
            eprintln!(
                "skipped: {} is not there (or not ours to run)",
                python.display()
            );
        }
    }
    // A process that runs no Python (not this one: its name starts with "python").
    let sleep = Python(Command::new("sleep").arg("60").spawn().unwrap());
    let pid = sleep.0.id();
    // Until its exec, the child is a copy of this test.
    let t0 = Instant::now();
    while !std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|e| e.file_name().is_some_and(|n| n == "sleep"))
    {
        assert!(t0.elapsed() < DEADLINE, "sleep did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut s = reader.session(pid, None).unwrap();
    let e = s.python_runtime(pid, None, DEADLINE).unwrap_err();
    assert!(e.to_string().contains("not a Python interpreter"), "{e}");
}
