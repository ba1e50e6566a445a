//! The catalog's symbols of newly found runtime library files, resolved off the collection
//! loop: a thread hands each file to the reader (a worker parses it, as the owner of the
//! process that maps it) and the loop picks the answers up at its next round. Anyone can map
//! a file named `libcuda.so`; whatever it holds, the loop never waits on it.
use std::{
    collections::HashSet,
    sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    time::{Duration, Instant},
};

use ethand_reader::FileId;
use ethand_userspace_probes::{MappedLibrary, catalog::CatalogSymbols};

use crate::pipeline::reader::ReaderHandle;

/// A library's (device, inode) as the daemon keys it.
pub type Key = (String, u64);

/// Files waiting at once; more are found again at a later rescan.
const QUEUE: usize = 256;

/// What the reader answered for one file.
pub struct Done {
    pub key: Key,
    pub lib: MappedLibrary,
    pub answer: Result<(FileId, CatalogSymbols, usize), String>,
}

pub struct Resolver {
    jobs: SyncSender<(Key, MappedLibrary)>,
    done: Receiver<Done>,
    pending: HashSet<Key>,
}

impl Resolver {
    pub fn start(reader: ReaderHandle) -> Self {
        let (jobs, rx) = sync_channel::<(Key, MappedLibrary)>(QUEUE);
        let (tx, done) = sync_channel::<Done>(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("ethand-symbols".into())
            .spawn(move || {
                while let Ok((key, lib)) = rx.recv() {
                    let answer = match &reader.reader {
                        Ok(r) => r
                            .elf_symbols(&lib, reader.symbolize_timeout)
                            .map_err(|e| format!("reading its symbols: {e}")),
                        Err(why) => Err(why.clone()),
                    };
                    if tx.send(Done { key, lib, answer }).is_err() {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the symbol resolver thread");
        }
        Self {
            jobs,
            done,
            pending: HashSet::new(),
        }
    }

    pub fn is_pending(&self, key: &Key) -> bool {
        self.pending.contains(key)
    }

    /// Asks for `lib`'s symbols; false when the queue is full (it is found again later).
    pub fn submit(&mut self, key: Key, lib: MappedLibrary) -> bool {
        if self.pending.contains(&key) {
            return true;
        }
        match self.jobs.try_send((key.clone(), lib)) {
            Ok(()) => {
                self.pending.insert(key);
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// The answers that have come in, without waiting.
    pub fn done(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while let Ok(d) = self.done.try_recv() {
            self.pending.remove(&d.key);
            out.push(d);
        }
        out
    }

    /// Waits up to `limit` for every pending answer (start-up only).
    pub fn wait(&mut self, limit: Duration) -> Vec<Done> {
        let until = Instant::now() + limit;
        let mut out = self.done();
        while !self.pending.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(d) => {
                    self.pending.remove(&d.key);
                    out.push(d);
                }
                Err(_) => break,
            }
        }
        out
    }
}
