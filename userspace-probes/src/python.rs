//! Python frames of a running CPython process, read from outside it with py-spy's library:
//! `process_vm_readv` of the interpreter's thread states and frames. The process is never
//! stopped (py-spy's non-blocking mode), so a stack read while the thread moves on can be
//! torn; a sample is then dropped, never guessed. Needs CAP_SYS_PTRACE for processes of
//! other users.
//!
//! Everything read here was chosen by the profiled process: py-spy refuses strings of 4 KiB
//! and more and stacks of more than 4096 frames; this module keeps at most
//! [`ethand_snapshot::stacks::MAX_FRAMES`] frames and cuts names to [`MAX_NAME`] bytes.
use std::{
    io::{BufRead, BufReader},
    panic::{AssertUnwindSafe, catch_unwind},
};

use ethand_snapshot::stacks::{Frame, FrameKind, MAX_FRAMES};

/// Longest function or file name kept (bytes).
pub const MAX_NAME: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("process {0} is not a Python interpreter (no python binary or libpython mapped)")]
    NotPython(u32),
    #[error("cannot read the Python interpreter of process {pid}: {detail}")]
    Open { pid: u32, detail: String },
    #[error("reading the Python stacks of process {pid} failed: {detail}")]
    Read { pid: u32, detail: String },
    #[error("the Python frame reader failed on process {pid} (its memory is not what it expects)")]
    Panicked { pid: u32 },
}

/// One Python thread's stack at one moment.
#[derive(Clone, Debug)]
pub struct ThreadStack {
    /// The OS thread id; None where the interpreter does not say (the sample is then not
    /// attributable to a thread's runtime call).
    pub tid: Option<u32>,
    pub name: Option<String>,
    /// Running or runnable (the OS thread state and py-spy's idle heuristics).
    pub active: bool,
    pub owns_gil: bool,
    /// Innermost first, at most `MAX_FRAMES`.
    pub frames: Vec<Frame>,
}

/// An open reader of one Python process.
pub struct PythonReader {
    pid: u32,
    spy: py_spy::PythonSpy,
}

/// Whether `pid` runs a CPython interpreter: its executable is named python* or it maps
/// libpython (an embedding program). Cheap enough to ask of every process of a tree, unlike
/// opening a reader (~10 ms: it parses the binary's symbols).
pub fn looks_like_python(pid: u32) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    if exe
        .as_deref()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"))
    {
        return true;
    }
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
        return false;
    };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("/libpython3"))
}

impl PythonReader {
    pub fn open(pid: u32) -> Result<Self, PythonError> {
        if !looks_like_python(pid) {
            return Err(PythonError::NotPython(pid));
        }
        let config = py_spy::Config {
            blocking: py_spy::config::LockingStrategy::NonBlocking,
            native: false,
            // Idle threads too: where a blocked main thread waits is the point.
            include_idle: true,
            ..py_spy::Config::default()
        };
        let spy = catch_unwind(AssertUnwindSafe(|| {
            py_spy::PythonSpy::new(pid as py_spy::Pid, &config)
        }))
        .map_err(|_| PythonError::Panicked { pid })?
        .map_err(|e| PythonError::Open {
            pid,
            detail: format!("{e:#}"),
        })?;
        Ok(Self { pid, spy })
    }

    /// "3.12.3".
    pub fn version(&self) -> String {
        self.spy.version.to_string()
    }

    /// Every Python thread's stack now.
    pub fn stacks(&mut self) -> Result<Vec<ThreadStack>, PythonError> {
        let pid = self.pid;
        let traces = catch_unwind(AssertUnwindSafe(|| self.spy.get_stack_traces()))
            .map_err(|_| PythonError::Panicked { pid })?
            .map_err(|e| PythonError::Read {
                pid,
                detail: format!("{e:#}"),
            })?;
        Ok(traces
            .into_iter()
            .map(|t| ThreadStack {
                tid: t.os_thread_id.and_then(|t| u32::try_from(t).ok()),
                name: t.thread_name.map(|n| cut(n, MAX_NAME)),
                active: t.active,
                owns_gil: t.owns_gil,
                frames: t
                    .frames
                    .into_iter()
                    .take(MAX_FRAMES)
                    .map(|f| Frame {
                        kind: FrameKind::Python,
                        function: Some(cut(f.name, MAX_NAME)),
                        file: Some(cut(f.filename, MAX_NAME)),
                        line: u32::try_from(f.line).ok().filter(|l| *l > 0),
                        module: None,
                        offset: None,
                    })
                    .collect(),
            })
            .collect())
    }
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Line `line` (1-based) of the Python source file `file` as process `pid` sees it: only a
/// `*.py` file, read as [`crate::source::line`] reads any (inside the process's root, only a
/// file its user may read).
pub fn source_line(pid: u32, proc_uid: u32, file: &str, line: u32) -> Option<String> {
    if !file.ends_with(".py") {
        return None;
    }
    crate::source::line(pid, proc_uid, file, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_source_line_is_read_inside_the_process_root_only() {
        let dir = std::env::temp_dir().join(format!("ethand-py-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let py = dir.join("t.py");
        let mut f = std::fs::File::create(&py).unwrap();
        writeln!(f, "import os\n    x = compute()   \n").unwrap();
        let me = std::process::id();
        let uid = unsafe { libc::getuid() };
        assert_eq!(
            source_line(me, uid, py.to_str().unwrap(), 2).as_deref(),
            Some("x = compute()")
        );
        // Past the end, line 0, not a .py file: nothing.
        assert_eq!(source_line(me, uid, py.to_str().unwrap(), 40), None);
        assert_eq!(source_line(me, uid, py.to_str().unwrap(), 0), None);
        let txt = dir.join("t.txt");
        std::fs::write(&txt, "secret\n").unwrap();
        assert_eq!(source_line(me, uid, txt.to_str().unwrap(), 1), None);
        // A .py link to a file the process's user may not read: refused (as another uid).
        let secret = dir.join("secret");
        std::fs::write(&secret, "root only\n").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let link = dir.join("link.py");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert_eq!(
            source_line(me, uid.wrapping_add(1), link.to_str().unwrap(), 1),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_are_cut_on_a_character_boundary() {
        assert_eq!(cut("é".repeat(300), MAX_NAME).len(), MAX_NAME);
        assert_eq!(cut("ab".into(), 1), "a");
    }

    #[test]
    fn a_process_without_python_is_refused_cheaply() {
        // The test binary is not an interpreter.
        assert!(matches!(
            PythonReader::open(std::process::id()),
            Err(PythonError::NotPython(_))
        ));
    }
}
