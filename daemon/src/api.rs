//! The local API: one JSON request per line on a Unix socket, one JSON response per line.
//! The socket is owned by root and `daemon.socket_group`, mode 0660 (root only, 0600, without
//! the group): it exposes the command lines of every process and switches probing levels.
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

/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Parses one request line as read from the socket (at most `MAX_REQUEST` + 1 bytes, the
/// final newline included). The error is the message sent back to the client.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    if line.len() > MAX_REQUEST {
        return Err(format!(
            "bad request: longer than {MAX_REQUEST} bytes (one JSON object per line)"
        ));
    }
    let text =
        std::str::from_utf8(line).map_err(|e| format!("bad request: not UTF-8 text: {e}"))?;
    if text.trim().is_empty() {
        return Err("bad request: empty request (expected one JSON object per line)".into());
    }
    serde_json::from_str(text).map_err(|e| format!("bad request: {e}"))
}

/// Creates the socket, owned by root and `group`, mode 0660; with `group` empty, missing or
/// not assignable: root only, mode 0600 (logged). Also returns who may connect, in one line
/// for `ethand status`: "root and group ethand (gid 990), mode 0660" or why root only.
pub fn bind(path: &Path, group: &str) -> std::io::Result<(UnixListener, String)> {
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
    // Born 0600: no moment in which others could connect before the chmod below.
    // SAFETY: umask only swaps the process's file mode mask.
    let old_mask = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old_mask) };
    let l = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let root_only = |why: String| format!("root only, mode 0600 ({why})");
    let access = if group.is_empty() {
        root_only("daemon.socket_group is empty".into())
    } else {
        match crate::privilege::group_id(group) {
            None => {
                warn!(
                    group,
                    socket = %path.display(),
                    "daemon.socket_group does not exist: the socket is root only (0600)"
                );
                root_only(format!("group {group} does not exist"))
            }
            Some(gid) => match std::os::unix::fs::chown(path, None, Some(gid)).and_then(|()| {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            }) {
                Ok(()) => format!("root and group {group} (gid {gid}), mode 0660"),
                Err(e) => {
                    // Needs CAP_CHOWN (or membership of the group).
                    warn!(group, error = %e, socket = %path.display(), "cannot give the socket to its group: root only (0600)");
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                    root_only(format!("cannot give it to group {group}: {e}"))
                }
            },
        }
    };
    Ok((l, access))
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
    // One byte over the limit tells a too-long request from one of exactly MAX_REQUEST.
    let mut r = BufReader::new(r).take(MAX_REQUEST as u64 + 1);
    let mut line = Vec::new();
    let read = tokio::time::timeout(REQUEST_TIMEOUT, r.read_until(b'\n', &mut line)).await;
    let resp = match read {
        // A client that connects and sends nothing must not hold a task and a descriptor.
        Err(_) => Response::Error(format!(
            "bad request: no request line within {} s",
            REQUEST_TIMEOUT.as_secs()
        )),
        Ok(read) => {
            read?;
            match parse_request(&line) {
                Ok(Request::SetLevel { level }) => set_level(&shared, &level).await,
                Ok(req) => shared.answer(req),
                Err(msg) => Response::Error(msg),
            }
        }
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
            "unknown level {level:?}: expected system, calls, process or op"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_rejects_malformed_ones() {
        assert!(matches!(
            parse_request(b"{\"cmd\":\"snapshot\",\"pid\":1,\"window_s\":10}\n"),
            Ok(Request::Snapshot {
                pid: 1,
                window_s: 10
            })
        ));
        assert!(matches!(
            parse_request(b"{\"cmd\":\"status\"}"),
            Ok(Request::Status)
        ));
        for (bad, want) in [
            (&b""[..], "empty request"),
            (b"\n", "empty request"),
            (b"\xff\xfe{}\n", "not UTF-8"),
            (b"{\"cmd\":\"reboot\"}\n", "unknown variant"),
            (
                b"{\"cmd\":\"snapshot\",\"pid\":-1,\"window_s\":1}\n",
                "invalid value",
            ),
            (
                b"{\"cmd\":\"snapshot\",\"pid\":4294967296,\"window_s\":1}\n",
                "invalid value",
            ),
            (
                b"{\"cmd\":\"snapshot\",\"pid\":\"1\",\"window_s\":1}\n",
                "invalid type",
            ),
            (b"{\"cmd\":\"snap", "EOF"),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(
                e.starts_with("bad request: ") && e.contains(want),
                "{bad:?}: {e}"
            );
        }
        let long = vec![b' '; MAX_REQUEST + 1];
        assert!(parse_request(&long).unwrap_err().contains("longer than"));
    }
}
