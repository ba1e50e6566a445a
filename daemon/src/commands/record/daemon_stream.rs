//! The recording's side of the API's `gpu_trace` (serve/gpu_trace.rs): while the daemon
//! owns the CUPTI directory, it opens the tree's windows and streams their entries here,
//! read by a thread of their own into a bounded queue (a slow trace writer makes the
//! daemon's queue refuse entries, counted, rather than hold the daemon).
use std::{
    io::{BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    sync::mpsc::{Receiver, sync_channel},
    time::Duration,
};

use base64::Engine;

use crate::{
    pipeline::gpu_activity::{QUEUE_ENTRIES, StreamEnd, TracedProcess},
    serve::{
        api::{Request, TIMEOUT},
        gpu_trace::{TraceLine, read_line},
    },
};

/// What the client's reader thread hands on.
#[derive(Debug)]
pub enum Incoming {
    Entry(Vec<u8>),
    Done(StreamEnd),
    /// The stream broke off before `done` (the daemon ended, a line it could not read).
    Broken(String),
}

/// A client's stream: entries arrive on `incoming`; [`TraceStream::end`] ends the windows.
pub struct TraceStream {
    socket: UnixStream,
    pub incoming: Receiver<Incoming>,
}

impl TraceStream {
    /// Asks the daemon at `socket` for `pids`' GPU trace over `duration`; returns the
    /// processes as it answered for them and the stream. Blocking (the first line within
    /// the API's timeout).
    pub fn open(
        socket: &Path,
        pids: &[u32],
        duration: Duration,
    ) -> Result<(Vec<TracedProcess>, Self), String> {
        let s = UnixStream::connect(socket)
            .map_err(|e| format!("connecting to the daemon at {}: {e}", socket.display()))?;
        let req = Request::GpuTrace {
            pids: pids.to_vec(),
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        };
        let mut line = serde_json::to_vec(&req).expect("serializable");
        line.push(b'\n');
        (&s).write_all(&line)
            .map_err(|e| format!("asking the daemon for the GPU trace: {e}"))?;
        let reader = s.try_clone().map_err(|e| e.to_string())?;
        // The first line: a round of the collection loop away, at most.
        reader
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(reader);
        let processes = match read_line(&mut reader)? {
            Some(TraceLine::Opened(p)) => p,
            Some(TraceLine::Error(e)) => return Err(format!("the daemon refused: {e}")),
            Some(other) => return Err(format!("the daemon answered {other:?} first")),
            None => return Err("the daemon closed the connection without an answer (a daemon older than this ethand?)".into()),
        };
        reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(|e| e.to_string())?;
        let (tx, incoming) = sync_channel(QUEUE_ENTRIES);
        std::thread::Builder::new()
            .name("ethand-gputrace".into())
            .spawn(move || {
                loop {
                    let item = match read_line(&mut reader) {
                        Ok(Some(TraceLine::Entry(b))) => {
                            match base64::engine::general_purpose::STANDARD.decode(b) {
                                Ok(b) => Incoming::Entry(b),
                                Err(e) => Incoming::Broken(format!("an entry not in base64: {e}")),
                            }
                        }
                        Ok(Some(TraceLine::Done(e))) => Incoming::Done(e),
                        Ok(Some(TraceLine::Error(e))) => Incoming::Broken(e),
                        Ok(Some(TraceLine::Opened(_))) => {
                            Incoming::Broken("a second opened line".into())
                        }
                        Ok(None) => {
                            Incoming::Broken("the daemon closed the stream before its end".into())
                        }
                        Err(e) => Incoming::Broken(e),
                    };
                    let last = !matches!(item, Incoming::Entry(_));
                    if tx.send(item).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(|e| format!("starting the GPU trace reader: {e}"))?;
        Ok((
            processes,
            Self {
                socket: s,
                incoming,
            },
        ))
    }

    /// Ends the windows before their deadline: their last entries and `done` still come.
    pub fn end(&self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Write);
    }
}
