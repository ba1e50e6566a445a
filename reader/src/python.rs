//! Python frames of a running CPython process, read from outside it with py-spy's library
//! (`process_vm_readv` of the interpreter's thread states and frames), inside a worker. The
//! process is never stopped (py-spy's non-blocking mode), so a stack read while the thread
//! moves on can be torn; that read is then an error, never a guess.
//!
//! Before py-spy is let near a process, every libpython file it maps must be a regular file
//! that is the mapped one and whose path has no newline: py-spy opens it by the text of
//! /proc/PID/maps, which spells a newline `\012`, so a FIFO planted at that spelling would
//! block it. What py-spy reads is bounded by the worker's memory limit and each read's
//! deadline; this module keeps at most `MAX_FRAMES` frames and cuts names to `MAX_NAME`.
use std::collections::HashMap;

use ethand_snapshot::stacks::{Frame, FrameKind, MAX_FRAMES};
use ethand_userspace_probes::procmaps::{self, ProcMaps};

use crate::{
    owner::ProcessError,
    proto::{MAX_NAME, MAX_THREADS, ThreadStack, cut},
};

/// Why an interpreter cannot be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("process {0} is not a Python interpreter (no python binary or libpython mapped)")]
    NotPython(u32),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("process {pid}: its libpython path has a newline ({name:?}); not read")]
    NewlineInPath { pid: u32, name: String },
    #[error("process {pid}: its libpython {name:?} is not read: {source}")]
    Libpython {
        pid: u32,
        name: String,
        source: procmaps::OpenError,
    },
    /// py-spy could not read the interpreter's layout (its error is an `anyhow::Error`).
    #[error("{}", with_causes(format_args!("cannot read the Python interpreter of process {pid}"), .source))]
    Open { pid: u32, source: anyhow::Error },
    #[error("process {0} was not opened")]
    NotOpened(u32),
    /// A torn read (the thread moved on while it was read) or a process gone.
    #[error("{}", with_causes(format_args!("reading the Python stacks of process {pid} failed"), .source))]
    Read { pid: u32, source: anyhow::Error },
}

/// `what: ` and py-spy's error with its causes, cut to a bound (the causes name addresses
/// and files of the process read).
fn with_causes(what: std::fmt::Arguments<'_>, e: &anyhow::Error) -> String {
    cut(format!("{what}: {e:#}"), 2 * MAX_NAME)
}

/// Whether `pid` runs a CPython interpreter: its executable is named python* or it maps
/// libpython (an embedding program). Cheap enough to ask of every process of a tree.
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
    ProcMaps::open(pid)
        .and_then(|mut m| m.files(is_libpython))
        .is_ok_and(|v| !v.is_empty())
}

fn is_libpython(name: &[u8]) -> bool {
    name.windows(b"/libpython".len())
        .any(|w| w == b"/libpython")
}

/// The open interpreters of a worker, by pid.
#[derive(Default)]
pub struct Pythons {
    spies: HashMap<u32, py_spy::PythonSpy>,
}

impl Pythons {
    /// Starts reading `pid`'s interpreter; its version ("3.12.3").
    pub fn open(&mut self, pid: u32) -> Result<String, PythonError> {
        if !looks_like_python(pid) {
            return Err(PythonError::NotPython(pid));
        }
        check_libraries(pid)?;
        let config = py_spy::Config {
            blocking: py_spy::config::LockingStrategy::NonBlocking,
            native: false,
            // Idle threads too: where a blocked main thread waits is the point.
            include_idle: true,
            ..py_spy::Config::default()
        };
        let spy = py_spy::PythonSpy::new(pid as py_spy::Pid, &config)
            .map_err(|source| PythonError::Open { pid, source })?;
        let version = spy.version.to_string();
        self.spies.insert(pid, spy);
        Ok(version)
    }

    /// Every Python thread's stack of `pid` now.
    pub fn stacks(&mut self, pid: u32) -> Result<Vec<ThreadStack>, PythonError> {
        let spy = self
            .spies
            .get_mut(&pid)
            .ok_or(PythonError::NotOpened(pid))?;
        let traces = spy
            .get_stack_traces()
            .map_err(|source| PythonError::Read { pid, source })?;
        Ok(traces
            .into_iter()
            .take(MAX_THREADS)
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
                        ..Frame::default()
                    })
                    .collect(),
            })
            .collect())
    }
}

/// Refuses a process whose libpython py-spy would not open as mapped (see the module doc).
pub(crate) fn check_libraries(pid: u32) -> Result<(), PythonError> {
    let libs = ProcMaps::open(pid)
        .and_then(|mut m| m.files(is_libpython))
        .map_err(|source| ProcessError::Mappings { pid, source })?;
    if libs.is_empty() {
        return Ok(());
    }
    let root = procmaps::open_root(pid).map_err(|source| ProcessError::Root { pid, source })?;
    for v in libs {
        let name = cut(String::from_utf8_lossy(&v.name).into_owned(), MAX_NAME);
        if v.name.contains(&b'\n') {
            return Err(PythonError::NewlineInPath { pid, name });
        }
        procmaps::open_mapped(&root, &v).map_err(|source| PythonError::Libpython {
            pid,
            name,
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_spy_errors_keep_their_causes_in_a_bounded_message() {
        let e = PythonError::Open {
            pid: 7,
            source: anyhow::anyhow!("no such symbol").context("reading the layout"),
        };
        assert_eq!(
            e.to_string(),
            "cannot read the Python interpreter of process 7: reading the layout: no such symbol"
        );
        assert!(std::error::Error::source(&e).is_some());
        let long = PythonError::Read {
            pid: 7,
            source: anyhow::anyhow!("x".repeat(4 * MAX_NAME)),
        };
        let text = long.to_string();
        assert_eq!(text.len(), 2 * MAX_NAME);
        assert!(text.starts_with("reading the Python stacks of process 7 failed: x"));
    }
}
