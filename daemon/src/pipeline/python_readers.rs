//! The Python processes a snapshot's stack sample or `ethand record` reads, through the
//! reader: one worker per process owner (its credentials, its limits), each process opened
//! once. A worker that dies or is late on a process (a frame chain thousands deep, a hostile
//! interpreter) takes that process out of the sample with a note; the owner's other
//! processes are opened again on a new worker, so one bad process costs only itself.
use std::collections::{BTreeMap, HashMap};

use ethand_reader::{Owner, ReaderError, Session, ThreadStack};

use crate::pipeline::reader::{PYTHON_OPEN_TIMEOUT, ReaderHandle};

/// Why a read gave no stacks.
#[derive(Debug)]
pub enum ReadError {
    /// The read failed and the process stays (a stack torn while the thread moved on).
    Torn(String),
    /// The process is out of the sample (its worker died or was late): the note says why.
    Lost(String),
}

struct Opened {
    owner: Owner,
    start: Option<u64>,
    version: String,
}

pub struct PythonReaders<'r> {
    reader: &'r ReaderHandle,
    sessions: HashMap<Owner, Session>,
    open: BTreeMap<u32, Opened>,
}

impl<'r> PythonReaders<'r> {
    pub fn new(reader: &'r ReaderHandle) -> Self {
        Self {
            reader,
            sessions: HashMap::new(),
            open: BTreeMap::new(),
        }
    }

    /// Opens `pid` when it runs Python: Ok(true) opened, Ok(false) not a Python process,
    /// Err(why) a Python process that cannot be read.
    pub fn open(&mut self, pid: u32) -> Result<bool, String> {
        if self.open.contains_key(&pid) {
            return Ok(true);
        }
        if !ethand_reader::python::looks_like_python(pid) {
            return Ok(false);
        }
        let reader = self
            .reader
            .reader
            .as_ref()
            .map_err(|why| format!("process {pid}: not read: {why}"))?;
        let owner =
            ethand_reader::owner::owner_of(pid).map_err(|e| format!("process {pid}: {e}"))?;
        let start = ethand_reader::owner::start_ticks(pid);
        if !self.sessions.get(&owner).is_some_and(Session::alive) {
            let s = reader
                .session(pid, start)
                .map_err(|e| format!("process {pid}: {e}"))?;
            self.sessions.insert(owner.clone(), s);
        }
        let session = self.sessions.get_mut(&owner).expect("inserted above");
        match session.python_open(pid, start, PYTHON_OPEN_TIMEOUT) {
            Ok(version) => {
                self.open.insert(
                    pid,
                    Opened {
                        owner,
                        start,
                        version,
                    },
                );
                Ok(true)
            }
            Err(ReaderError::Failed(e)) => Err(e),
            Err(e) => Err(format!("process {pid}: {e}")),
        }
    }

    /// The processes open, lowest pid first.
    pub fn pids(&self) -> Vec<u32> {
        self.open.keys().copied().collect()
    }

    pub fn version(&self, pid: u32) -> Option<&str> {
        self.open.get(&pid).map(|o| o.version.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Drops a process (it exited).
    pub fn close(&mut self, pid: u32) {
        self.open.remove(&pid);
    }

    /// Every Python thread's stack of `pid` now.
    pub fn stacks(&mut self, pid: u32) -> Result<Vec<ThreadStack>, ReadError> {
        let Some(o) = self.open.get(&pid) else {
            return Err(ReadError::Lost(format!("process {pid} is not open")));
        };
        let owner = o.owner.clone();
        let Some(session) = self.sessions.get_mut(&owner) else {
            return Err(ReadError::Lost(format!("process {pid}: no reader")));
        };
        match session.python_stacks(pid, self.reader.python_read_timeout) {
            Ok(v) => Ok(v),
            Err(ReaderError::Failed(e)) => Err(ReadError::Torn(e)),
            Err(e) => {
                self.open.remove(&pid);
                self.sessions.remove(&owner);
                // The owner's other processes go on, on a new worker.
                let others: Vec<u32> = self
                    .open
                    .iter()
                    .filter(|(_, o)| o.owner == owner)
                    .map(|(p, _)| *p)
                    .collect();
                for p in others {
                    self.open.remove(&p);
                    let _ = self.open(p);
                }
                Err(ReadError::Lost(format!(
                    "process {pid}: {e}; not read further"
                )))
            }
        }
    }

    /// Lines of Python source files as `pid` names them, read as its owner (None each where
    /// they cannot or may not be read).
    pub fn source_lines(&mut self, pid: u32, lines: &[(String, u32)]) -> Vec<Option<String>> {
        let none = || vec![None; lines.len()];
        let Some(o) = self.open.get(&pid) else {
            return none();
        };
        let start = o.start;
        let Some(session) = self.sessions.get_mut(&o.owner) else {
            return none();
        };
        session
            .source_lines(pid, start, lines, self.reader.symbolize_timeout)
            .unwrap_or_else(|_| none())
    }
}
