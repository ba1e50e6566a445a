//! The local API's `gpu_trace` request: the daemon opens CUPTI windows in the processes
//! named and streams their `CUPTI_EVENTS` entries to the client as the probes wrote them
//! (`pipeline/gpu_activity/stream.rs`), for `ethand record` while the daemon owns the CUPTI
//! directory. One JSON object per line:
//!
//! - `{"opened":[{"pid":P,"window_id":W} | {"pid":P,"state":S,"detail":D}, ...]}` once,
//! - `{"entry":"BASE64"}` per entry,
//! - `{"done":{"entries":N,"entries_dropped":M,"closed":B}}` last,
//!
//! or one `{"error":"..."}` line. Closing the connection for writing ends the windows early
//! (the rest of their entries and `done` still come); closing it ends them at once.
use std::{
    io::{BufRead, Read},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::{
    pipeline::gpu_activity::{
        MAX_PIDS, MAX_STREAM_DURATION, QUEUE_ENTRIES, StreamEnd, StreamRequest, Streamed,
        TracedProcess,
    },
    serve::shared::Shared,
};

/// A line of the stream.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceLine {
    Opened(Vec<TracedProcess>),
    Entry(String),
    Done(StreamEnd),
    Error(String),
}

/// Longest line a client takes: an entry is ~5 KiB in base64; the first line names up to
/// [`MAX_PIDS`] processes with a reason each.
const MAX_LINE: usize = 1 << 20;

/// The stream's length, if `pids` and `duration_ms` make a request served; else why not.
pub fn check(pids: &[u32], duration_ms: u64) -> Result<Duration, String> {
    let duration = Duration::from_millis(duration_ms);
    if pids.is_empty() || pids.len() > MAX_PIDS {
        Err(format!(
            "bad request: gpu_trace takes 1 to {MAX_PIDS} pids, not {}",
            pids.len()
        ))
    } else if duration.is_zero() || duration > MAX_STREAM_DURATION {
        Err(format!(
            "bad request: gpu_trace's duration_ms must be 1 to {}",
            MAX_STREAM_DURATION.as_millis()
        ))
    } else {
        Ok(duration)
    }
}

/// Serves one `gpu_trace` request (checked) on its connection until the windows are over,
/// the client goes away or stops reading for `timeout`, or (the collection loop not
/// answering) the stream's length and a margin pass.
pub async fn serve(
    mut from_client: impl AsyncRead + Unpin,
    mut to_client: tokio::net::unix::OwnedWriteHalf,
    shared: &Shared,
    (pids, duration): (Vec<u32>, Duration),
    timeout: Duration,
) -> std::io::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(QUEUE_ENTRIES);
    let end = Arc::new(AtomicBool::new(false));
    shared
        .gpu_trace_requests
        .lock()
        .expect("lock")
        .push(StreamRequest {
            pids,
            duration,
            out: tx,
            end: end.clone(),
        });
    // Started and ended at collection rounds, closed within the grace after the deadline.
    let give_up = tokio::time::Instant::now()
        + duration
        + 4 * shared.round_interval
        + Duration::from_secs(10);
    let mut reading = true;
    let mut scratch = [0u8; 256];
    loop {
        tokio::select! {
            item = rx.recv() => {
                let Some(item) = item else { break };
                let done = matches!(item, Streamed::Done(_) | Streamed::Refused(_));
                let mut line = serde_json::to_vec(&TraceLine::from(item)).expect("serializable");
                line.push(b'\n');
                match tokio::time::timeout(timeout, to_client.write_all(&line)).await {
                    Ok(r) => r?,
                    Err(_) => return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client stopped reading the GPU trace",
                    )),
                }
                if done {
                    break;
                }
            }
            n = from_client.read(&mut scratch), if reading => {
                // End of the client's side (or an error): end the windows now. Anything else
                // it sends means nothing.
                if !matches!(n, Ok(n) if n > 0) {
                    end.store(true, Ordering::Relaxed);
                    reading = false;
                }
            }
            _ = tokio::time::sleep_until(give_up) => break,
        }
    }
    to_client.shutdown().await
}

impl From<Streamed> for TraceLine {
    fn from(s: Streamed) -> Self {
        match s {
            Streamed::Opened(p) => Self::Opened(p),
            Streamed::Entry(b) => Self::Entry(base64::engine::general_purpose::STANDARD.encode(b)),
            Streamed::Done(e) => Self::Done(e),
            Streamed::Refused(why) => Self::Error(why),
        }
    }
}

/// One line, bounded before it is held whole (None: the end of the stream).
pub fn read_line(r: &mut impl BufRead) -> Result<Option<TraceLine>, String> {
    let mut line = Vec::new();
    let n = r
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("reading the GPU trace: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        return Err(format!("a GPU trace line longer than {MAX_LINE} bytes"));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| format!("a GPU trace line that is not one: {e}"))
}
