//! The local API: one JSON request per line on a Unix socket, one JSON response per line.
//! The socket is created mode 0600 (root only): it exposes command lines of every process.
use std::{os::unix::fs::PermissionsExt, path::Path, sync::Arc};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};
use tracing::{debug, warn};

use crate::daemon::Shared;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Snapshot {
        pid: u32,
        window_s: u64,
    },
    Node,
    /// Switch the GPU/NPU probing level live: "system", "process" or "op".
    SetLevel {
        level: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(serde_json::Value),
    NotFound(String),
    Error(String),
}

/// Largest request accepted (bytes): requests are tiny.
const MAX_REQUEST: usize = 64 * 1024;

pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket left by a killed daemon: remove it (only if it is a socket).
    if let Ok(md) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if md.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

pub async fn serve(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "api accept failed");
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(stream, shared).await {
                debug!(error = %e, "api connection");
            }
        });
    }
}

async fn handle(stream: UnixStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r).take(MAX_REQUEST as u64);
    let mut line = String::new();
    r.read_line(&mut line).await?;
    let resp = match serde_json::from_str::<Request>(&line) {
        Ok(Request::SetLevel { level }) => set_level(&shared, &level).await,
        Ok(req) => shared.answer(req),
        Err(e) => Response::Error(format!("bad request: {e}")),
    };
    let mut out = serde_json::to_vec(&resp).expect("serializable");
    out.push(b'\n');
    w.write_all(&out).await?;
    w.shutdown().await
}

/// Hands the change to the collection loop (which owns the probes) and waits for its answer.
async fn set_level(shared: &Arc<Shared>, level: &str) -> Response {
    let Some(level) = crate::config::GpuLevel::parse(level) else {
        return Response::Error(format!(
            "unknown level {level:?}: expected system, process or op"
        ));
    };
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    *shared.level_request.lock().expect("lock") = Some((level, tx));
    match tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(10)))
        .await
    {
        Ok(Ok(Ok(msg))) => {
            Response::Ok(serde_json::json!({ "level": level.as_str(), "message": msg }))
        }
        Ok(Ok(Err(e))) => Response::Error(e),
        _ => Response::Error("the daemon did not apply the level within 10 s".into()),
    }
}

/// Client side: sends one request, returns the response. Err: no daemon listening.
pub async fn call(path: &Path, req: &Request) -> std::io::Result<Response> {
    let stream = UnixStream::connect(path).await?;
    let (r, mut w) = stream.into_split();
    let mut body = serde_json::to_vec(req).expect("serializable");
    body.push(b'\n');
    w.write_all(&body).await?;
    let mut line = String::new();
    BufReader::new(r).read_line(&mut line).await?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
