//! The Python line of every GPU call (issue 41): the kernel walks the calling thread's CPython
//! frames at the probe (`ebpf/ethand-ebpf/src/python.rs`) for the processes registered here,
//! and each collection round turns the code objects its stacks name into file, function and
//! line table, read by the reader (a sandboxed worker, as the process's owner) while the
//! process lives. What was read is kept per process until the model reclaims it (after it
//! exits), and dropped when it execs. The collection loop never waits on the reader: a thread
//! asks, the next round picks the answers up.
//!
//! Registration: a process that makes a probed GPU call and looks like CPython is read once
//! (its version and gilstate key, `ethand_reader::pycode::PyRuntime`); calls made before that
//! answer came are counted at their native call site only.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, PoisonError,
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
};
use ethand_common::{PY_LAYOUTS, ProcKey, PyLayout, PyProc, PyStack, PyStackKey, py_layout};
use ethand_reader::pycode::{PyCode, PyRuntime};
use ethand_snapshot::stacks::{Frame, FrameKind};
use tracing::{debug, warn};

use crate::pipeline::{bpf_error::take_map, reader::ReaderHandle};

/// Requests waiting at once; more are asked again at a later round.
const QUEUE: usize = 64;
/// Rounds between two clean-ups of the stacks kept.
const ROUNDS_PER_CLEANUP: u64 = 60;

/// Which stacks a walker keeps between rounds (the kernel's map holds only one round's new
/// ones: a stack let go is stored again the next time it occurs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// The daemon's: those a call site names (the sites a round hands in are the kernel's,
    /// which count a call at its entry), and those of an exited process the model still
    /// keeps.
    NamedBySites,
    /// A recording's: every stack up to this many, then only those the round names. A call
    /// is counted when it returns, so a stack read at its entry must outlive a long call.
    UpTo(usize),
}
/// Code objects asked per request.
const CODES_PER_ASK: usize = ethand_reader::pycode::MAX_CODES;

/// Whether and how a process's Python frames are walked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalkState {
    /// Not a CPython process (nothing to walk).
    NotPython,
    /// Its interpreter is being read.
    Pending,
    /// Walked: CPython 3.`minor`.
    Walked { minor: u32 },
    /// A CPython process that cannot be walked, and why.
    Refused(String),
}

/// One process's code objects, by address.
#[derive(Debug)]
pub struct ProcFrames {
    pub state: WalkState,
    pub codes: HashMap<u64, Result<Arc<PyCode>, String>>,
    asked: HashSet<u64>,
}

/// What the snapshot path reads: Python stacks by key and each process's code objects.
#[derive(Debug, Default)]
pub struct PyFrames {
    pub stacks: HashMap<PyStackKey, Arc<PyStack>>,
    pub procs: HashMap<ProcKey, ProcFrames>,
    /// Processes that exec'd since the last round: their entries are forgotten there.
    execd: Vec<ProcKey>,
}

impl PyFrames {
    /// `key` exec'd: its code objects and registration no longer hold.
    pub fn on_exec(&mut self, key: ProcKey) {
        if self.procs.remove(&key).is_some() {
            self.execd.push(key);
        }
    }

    /// Keeps the processes `keep` says yes to (the model's: an exited process stays while
    /// the model keeps it).
    pub fn retain(&mut self, mut keep: impl FnMut(&ProcKey) -> bool) {
        self.procs.retain(|k, _| keep(k));
    }

    /// What a snapshot says of `proc`'s walk (None: not a CPython process, or no GPU call).
    pub fn walk(&self, proc: &ProcKey) -> Option<ethand_snapshot::gpu::PythonWalk> {
        use ethand_snapshot::gpu::PythonWalk as W;
        match &self.procs.get(proc)?.state {
            WalkState::NotPython => None,
            WalkState::Pending => Some(W::Pending),
            WalkState::Walked { minor } => Some(W::Walked {
                version: format!("3.{minor}"),
            }),
            WalkState::Refused(why) => Some(W::Refused { why: why.clone() }),
        }
    }

    /// The Python frames of stack `key` in process `proc`, innermost first; None where the
    /// process is not walked or the stack is unknown.
    pub fn frames(&self, proc: &ProcKey, key: u64) -> Option<Vec<Frame>> {
        let p = self.procs.get(proc)?;
        let WalkState::Walked { minor } = p.state else {
            return None;
        };
        let st = self.stacks.get(&stack_key(proc.tgid, key))?;
        let n = (st.len as usize).min(st.frames.len());
        Some(
            st.frames[..n]
                .iter()
                .map(|f| match p.codes.get(&f.code) {
                    Some(Ok(code)) => Frame {
                        kind: FrameKind::Python,
                        function: Some(code.function.clone()),
                        file: Some(code.file.clone()),
                        line: code.line(minor, f.pos),
                        ..Frame::default()
                    },
                    Some(Err(why)) => Frame {
                        kind: FrameKind::Python,
                        unresolved: Some(why.clone()),
                        ..Frame::default()
                    },
                    None => Frame {
                        kind: FrameKind::Python,
                        unresolved: Some("not read yet".into()),
                        ..Frame::default()
                    },
                })
                .collect(),
        )
    }
}

enum Job {
    Runtime(ProcKey),
    Codes {
        key: ProcKey,
        minor: u32,
        codes: Vec<u64>,
    },
}

enum Answer {
    Runtime(ProcKey, Result<PyRuntime, String>),
    Codes(
        ProcKey,
        Vec<u64>,
        Result<Vec<Result<PyCode, String>>, String>,
    ),
}

/// The kernel side's maps and the thread that asks the reader.
pub struct PyWalker {
    /// Held: a program loaded after this (a recording's, a library found later) refers to
    /// the map by this descriptor.
    _layouts: Option<Array<MapData, PyLayout>>,
    procs_map: Option<BpfHashMap<MapData, u32, PyProc>>,
    stacks_map: Option<BpfHashMap<MapData, PyStackKey, PyStack>>,
    jobs: SyncSender<Job>,
    done: Receiver<Answer>,
    pub frames: Arc<Mutex<PyFrames>>,
    /// Processes in `PY_PROCS`, by tgid.
    registered: HashMap<u32, ProcKey>,
    retention: Retention,
    rounds: u64,
}

impl PyWalker {
    /// Fills the layouts and takes the maps; without them (or without the kernel offset the
    /// walk needs) nothing is registered and every call keeps its native site only.
    pub fn new(
        ebpf: &mut Ebpf,
        enabled: bool,
        reader: ReaderHandle,
        frames: Arc<Mutex<PyFrames>>,
        retention: Retention,
    ) -> Self {
        let maps = (|| -> Result<_, String> {
            if !enabled {
                return Err("gpu.python_frames (or gpu.call_stacks) is off".into());
            }
            let mut layouts: Array<MapData, PyLayout> =
                Array::try_from(take_map(ebpf, "PY_LAYOUT").map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            for (i, l) in PY_LAYOUTS.iter().enumerate() {
                layouts.set(i as u32, l, 0).map_err(|e| e.to_string())?;
            }
            let procs =
                BpfHashMap::try_from(take_map(ebpf, "PY_PROCS").map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            let stacks =
                BpfHashMap::try_from(take_map(ebpf, "PY_STACKS").map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            Ok((layouts, procs, stacks))
        })();
        let (layouts, procs_map, stacks_map) = match maps {
            Ok((l, p, s)) => (Some(l), Some(p), Some(s)),
            Err(e) => {
                if enabled {
                    warn!(error = %e, "Python frames of GPU calls unavailable");
                }
                (None, None, None)
            }
        };
        let (jobs, done) = start_asker(reader);
        Self {
            _layouts: layouts,
            procs_map,
            stacks_map,
            jobs,
            done,
            frames,
            registered: HashMap::new(),
            retention,
            rounds: 0,
        }
    }

    /// One round: answers in, new GPU processes registered, new stacks read, their code
    /// objects asked for. `callers`: processes with probed GPU calls (or, for a recording,
    /// the recorded ones); `stacks`: the Python stacks (process, hash) that this round's call
    /// sites or events name.
    pub fn round(
        &mut self,
        callers: impl Iterator<Item = ProcKey>,
        stacks: impl Iterator<Item = (ProcKey, u64)> + Clone,
    ) {
        if self.procs_map.is_none() {
            return;
        }
        self.rounds += 1;
        let shared = self.frames.clone();
        let mut frames = shared.lock().unwrap_or_else(PoisonError::into_inner);
        for key in std::mem::take(&mut frames.execd) {
            self.unregister(key.tgid);
        }
        while let Ok(a) = self.done.try_recv() {
            self.take(&mut frames, a);
        }
        for key in callers {
            if frames.procs.contains_key(&key) {
                continue;
            }
            let python = ethand_reader::python::looks_like_python(key.tgid);
            let state = if python {
                WalkState::Pending
            } else {
                WalkState::NotPython
            };
            if python && !self.ask(Job::Runtime(key)) {
                continue;
            }
            frames.procs.insert(
                key,
                ProcFrames {
                    state,
                    codes: HashMap::new(),
                    asked: HashSet::new(),
                },
            );
        }
        // Code objects are asked for as soon as a stack is read (stored at the call's entry),
        // not only once a site or event names it: a long call's process may be gone by its
        // return.
        let new = self.read_stacks(&mut frames);
        let new = new
            .into_iter()
            .filter_map(|k| Some((*self.registered.get(&k.tgid)?, k.hash)));
        let asked: Vec<(ProcKey, u64)> = new.chain(stacks.clone()).collect();
        self.ask_codes(&mut frames, asked.into_iter());
        if self.rounds.is_multiple_of(ROUNDS_PER_CLEANUP) {
            let used: HashSet<PyStackKey> = stacks
                .clone()
                .filter(|(_, h)| *h != 0)
                .map(|(p, h)| stack_key(p.tgid, h))
                .collect();
            match self.retention {
                Retention::NamedBySites => {
                    let calling: HashSet<u32> = stacks.map(|(p, _)| p.tgid).collect();
                    let known: HashSet<u32> = frames.procs.keys().map(|k| k.tgid).collect();
                    // A stack stays while a site names it, or while its process is still
                    // known but has no site in the kernel any more: it exited, and its sites
                    // stay in the model until the model forgets it (then `procs` does too,
                    // and so the stack here).
                    frames.stacks.retain(|k, _| {
                        used.contains(k) || (known.contains(&k.tgid) && !calling.contains(&k.tgid))
                    });
                }
                Retention::UpTo(max) => {
                    if frames.stacks.len() > max {
                        frames.stacks.retain(|k, _| used.contains(k));
                    }
                }
            }
            // Processes the model forgot leave the kernel's table too.
            let gone: Vec<u32> = self
                .registered
                .iter()
                .filter(|(_, k)| !frames.procs.contains_key(k))
                .map(|(t, _)| *t)
                .collect();
            for tgid in gone {
                self.unregister(tgid);
            }
        }
    }

    fn take(&mut self, frames: &mut PyFrames, a: Answer) {
        match a {
            Answer::Runtime(key, answer) => {
                let Some(p) = frames.procs.get_mut(&key) else {
                    return;
                };
                p.state = match answer.and_then(|rt| self.register(key, rt)) {
                    Ok(minor) => WalkState::Walked { minor },
                    Err(why) => {
                        debug!(pid = key.tgid, %why, "Python frames of GPU calls not walked");
                        WalkState::Refused(why)
                    }
                };
            }
            Answer::Codes(key, asked, answer) => {
                let Some(p) = frames.procs.get_mut(&key) else {
                    return;
                };
                match answer {
                    Ok(codes) => {
                        for (addr, c) in asked.iter().zip(codes) {
                            match c {
                                // Past what one reply carries: asked again next round.
                                Err(why) if why.contains("ask again") => {
                                    p.asked.remove(addr);
                                }
                                c => {
                                    p.codes.insert(*addr, c.map(Arc::new));
                                }
                            }
                        }
                    }
                    // Asked again at the next round (the reader was late or restarting).
                    Err(_) => {
                        for addr in &asked {
                            p.asked.remove(addr);
                        }
                    }
                }
            }
        }
    }

    /// Whether `tgid` is walked (its registration is in the kernel's table).
    pub fn walks(&self, tgid: u32) -> bool {
        self.registered.contains_key(&tgid)
    }

    fn register(&mut self, key: ProcKey, rt: PyRuntime) -> Result<u32, String> {
        let (layout, _) = py_layout(rt.minor)
            .ok_or_else(|| format!("CPython 3.{} is not walked (3.9 to 3.13 are)", rt.minor))?;
        let map = self.procs_map.as_mut().ok_or("no PY_PROCS map")?;
        let v = PyProc {
            proc_start_ns: key.proc_start_ns,
            tss_key: rt.tss_key,
            layout,
        };
        map.insert(&key.tgid, &v, 0)
            .map_err(|e| format!("PY_PROCS: {e}"))?;
        self.registered.insert(key.tgid, key);
        Ok(rt.minor)
    }

    fn unregister(&mut self, tgid: u32) {
        self.registered.remove(&tgid);
        if let Some(m) = self.procs_map.as_mut() {
            let _ = m.remove(&tgid);
        }
    }

    /// Copies the stacks the kernel stored since the last round and removes them from its
    /// map, which so holds only one round's new stacks (the kernel stores a stack again the
    /// next time it occurs; known ones are not read twice).
    /// Returns the stacks new to `frames`.
    fn read_stacks(&mut self, frames: &mut PyFrames) -> Vec<PyStackKey> {
        let Some(map) = self.stacks_map.as_mut() else {
            return Vec::new();
        };
        let keys: Vec<PyStackKey> = map.keys().filter_map(Result::ok).collect();
        let mut new = Vec::new();
        for k in keys {
            if !frames.stacks.contains_key(&k) {
                if let Ok(st) = map.get(&k, 0) {
                    frames.stacks.insert(k, Arc::new(st));
                    new.push(k);
                }
            }
            let _ = map.remove(&k);
        }
        new
    }

    /// Asks for the code objects of walked processes' stacks not read or asked yet.
    fn ask_codes(&mut self, frames: &mut PyFrames, stacks: impl Iterator<Item = (ProcKey, u64)>) {
        let mut want: HashMap<ProcKey, Vec<u64>> = HashMap::new();
        for (key, hash) in stacks.filter(|(_, h)| *h != 0) {
            let Some(st) = frames.stacks.get(&stack_key(key.tgid, hash)).cloned() else {
                continue;
            };
            let Some(p) = frames.procs.get_mut(&key) else {
                continue;
            };
            if !matches!(p.state, WalkState::Walked { .. }) {
                continue;
            }
            let n = (st.len as usize).min(st.frames.len());
            for f in &st.frames[..n] {
                if !p.codes.contains_key(&f.code) && p.asked.insert(f.code) {
                    want.entry(key).or_default().push(f.code);
                }
            }
        }
        for (key, codes) in want {
            let Some(WalkState::Walked { minor }) = frames.procs.get(&key).map(|p| p.state.clone())
            else {
                continue;
            };
            for chunk in codes.chunks(CODES_PER_ASK) {
                let job = Job::Codes {
                    key,
                    minor,
                    codes: chunk.to_vec(),
                };
                if !self.ask(job) {
                    // Asked again next round.
                    if let Some(p) = frames.procs.get_mut(&key) {
                        for c in chunk {
                            p.asked.remove(c);
                        }
                    }
                }
            }
        }
    }

    /// Queues a job; false when the queue is full (asked again later).
    fn ask(&self, job: Job) -> bool {
        match self.jobs.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => false,
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

/// The `PY_STACKS` key of stack `hash` of process `tgid`.
pub fn stack_key(tgid: u32, hash: u64) -> PyStackKey {
    PyStackKey {
        tgid,
        _pad0: 0,
        hash,
    }
}

/// The thread that asks the reader, one session per process owner (kept while it lives).
fn start_asker(reader: ReaderHandle) -> (SyncSender<Job>, Receiver<Answer>) {
    let (jobs, rx) = sync_channel::<Job>(QUEUE);
    let (tx, done) = sync_channel::<Answer>(QUEUE);
    let spawned = std::thread::Builder::new()
        .name("ethand-pyframes".into())
        .spawn(move || {
            let mut sessions: HashMap<ethand_reader::Owner, ethand_reader::Session> =
                HashMap::new();
            while let Ok(job) = rx.recv() {
                let answer = answer(&reader, &mut sessions, job);
                if tx.send(answer).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the Python frames thread");
    }
    (jobs, done)
}

/// The session of `pid`'s owner, started when there is none alive.
fn session<'s>(
    reader: &ReaderHandle,
    sessions: &'s mut HashMap<ethand_reader::Owner, ethand_reader::Session>,
    pid: u32,
    start: Option<u64>,
) -> Result<&'s mut ethand_reader::Session, String> {
    let r = reader.reader.as_ref().map_err(Clone::clone)?;
    let owner = ethand_reader::owner::owner_of(pid).map_err(|e| e.to_string())?;
    if !sessions
        .get(&owner)
        .is_some_and(ethand_reader::Session::alive)
    {
        let s = r.session(pid, start).map_err(|e| e.to_string())?;
        sessions.insert(owner.clone(), s);
    }
    Ok(sessions.get_mut(&owner).expect("inserted above"))
}

fn answer(
    reader: &ReaderHandle,
    sessions: &mut HashMap<ethand_reader::Owner, ethand_reader::Session>,
    job: Job,
) -> Answer {
    let key = match &job {
        Job::Runtime(k) | Job::Codes { key: k, .. } => *k,
    };
    let pid = key.tgid;
    let start = ethand_reader::owner::start_ticks(pid);
    let session = session(reader, sessions, pid, start);
    let deadline = reader.symbolize_timeout;
    match job {
        Job::Runtime(_) => Answer::Runtime(
            key,
            session.and_then(|s| {
                s.python_runtime(pid, start, deadline)
                    .map_err(|e| e.to_string())
            }),
        ),
        Job::Codes { minor, codes, .. } => {
            let got = session.and_then(|s| {
                s.python_code(pid, start, minor, &codes, deadline)
                    .map_err(|e| e.to_string())
            });
            Answer::Codes(key, codes, got)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ethand_common::{PY_MAX_FRAMES, PyFrameRef};

    fn key() -> ProcKey {
        ProcKey {
            tgid: 7,
            _pad0: 0,
            proc_start_ns: 1,
        }
    }

    /// A 3.11 location table: 2 code units one line below the first, then 1 unit two lines
    /// further (one-line forms 11 and 12, with their two column bytes).
    fn code() -> PyCode {
        PyCode {
            file: "/srv/train.py".into(),
            function: "Trainer.step".into(),
            first_line: 10,
            line_table: vec![0x80 | (11 << 3) | 1, 0, 0, 0x80 | (12 << 3), 0, 0],
        }
    }

    fn frames_with(state: WalkState) -> PyFrames {
        let mut st = PyStack::default();
        st.len = 3;
        st.frames[0] = PyFrameRef {
            code: 0x1000,
            pos: 2,
            _pad0: 0,
        };
        st.frames[1] = PyFrameRef {
            code: 0x2000,
            pos: 0,
            _pad0: 0,
        };
        st.frames[2] = PyFrameRef {
            code: 0x3000,
            pos: 0,
            _pad0: 0,
        };
        let mut f = PyFrames::default();
        f.stacks.insert(stack_key(7, 99), Arc::new(st));
        let mut codes = HashMap::new();
        codes.insert(0x1000, Ok(Arc::new(code())));
        codes.insert(0x2000, Err("not a code object".into()));
        f.procs.insert(
            key(),
            ProcFrames {
                state,
                codes,
                asked: HashSet::new(),
            },
        );
        f
    }

    #[test]
    fn a_stack_becomes_python_frames_with_lines_and_reasons() {
        let f = frames_with(WalkState::Walked { minor: 11 });
        let v = f.frames(&key(), 99).expect("frames");
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].function.as_deref(), Some("Trainer.step"));
        assert_eq!(v[0].file.as_deref(), Some("/srv/train.py"));
        assert_eq!(v[0].line, Some(13));
        assert_eq!(v[1].unresolved.as_deref(), Some("not a code object"));
        assert_eq!(v[2].unresolved.as_deref(), Some("not read yet"));
        assert!(v.iter().all(|f| f.kind == FrameKind::Python));
        // Unknown stack, other process, or a process not walked: no Python frames.
        assert!(f.frames(&key(), 98).is_none());
        let other = ProcKey {
            proc_start_ns: 2,
            ..key()
        };
        assert!(f.frames(&other, 99).is_none());
        assert!(frames_with(WalkState::Pending).frames(&key(), 99).is_none());
        assert_eq!(PY_MAX_FRAMES, 32);
    }

    #[test]
    fn the_walk_state_reads_as_the_snapshot_says_it() {
        use ethand_snapshot::gpu::PythonWalk;
        let walked = frames_with(WalkState::Walked { minor: 12 });
        assert_eq!(
            walked.walk(&key()),
            Some(PythonWalk::Walked {
                version: "3.12".into()
            })
        );
        assert_eq!(frames_with(WalkState::NotPython).walk(&key()), None);
        let mut f = frames_with(WalkState::Refused("CPython 3.8".into()));
        assert_eq!(
            f.walk(&key()),
            Some(PythonWalk::Refused {
                why: "CPython 3.8".into()
            })
        );
        // An exec drops what was read; the walker takes the process out of the kernel's table.
        f.on_exec(key());
        assert_eq!(f.walk(&key()), None);
        assert_eq!(f.execd, vec![key()]);
    }
}
