//! C programs of the tests, compiled against the stand-in libcuda with debug information
//! and frame pointers (so that call sites come out by file and line), and driven a line at
//! a time: they print `ready`, wait for a line on stdin, work, and print `done`.
use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use crate::standins;

/// The line of `marker` in `source` (1-based).
pub fn line_of(source: &str, marker: &str) -> u32 {
    source
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker in the source") as u32
        + 1
}

/// Writes `source` to `dir/NAME.c` and compiles it (`-g -O1 -fno-omit-frame-pointer`, and
/// `extra`) against the stand-in libcuda into `dir/NAME`: (source file, binary).
pub fn compile(dir: &Path, name: &str, source: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let s = standins::shared();
    fs::create_dir_all(dir).expect("mkdir");
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, source).expect("write the source");
    let bin = dir.join(name);
    let libdir = s.cuda.parent().expect("lib dir");
    let out = Command::new("gcc")
        .args(["-g", "-O1", "-fno-omit-frame-pointer"])
        .args(extra)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-l:libcuda.so.1")
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (src, bin)
}

/// A running program of the tests, killed on drop.
pub struct Prog {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Prog {
    /// Starts `cmd` with piped stdin and stdout and waits for its `ready`.
    pub fn start(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the program");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut p = Self {
            child,
            stdin,
            stdout,
        };
        p.expect("ready");
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `what` to its stdin.
    pub fn say(&mut self, what: &[u8]) {
        let i = self.stdin.as_mut().expect("stdin");
        i.write_all(what).expect("write");
        i.flush().expect("flush");
    }

    /// Its next line must be `what`.
    pub fn expect(&mut self, what: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read stdout");
        assert_eq!(line.trim(), what, "the program said {line:?}");
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
