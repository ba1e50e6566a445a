//! The local API: one JSON request per line on a Unix socket, one JSON response per line.
//! The socket is owned by root and `daemon.socket_group`, mode 0660 (root only, 0600, without
//! the group): it exposes the command lines of every process and switches probing levels.
use std::{os::unix::fs::PermissionsExt, path::Path, sync::Arc};

use ethand_snapshot::GpuLevel;
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::Semaphore,
};
use tracing::{debug, warn};

use crate::serve::{
    connlimit::{AcceptBackoff, ConnLimiter, PeerKey},
    shared::Shared,
};

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Snapshot {
        pid: u32,
        window_s: u64,
        /// Count kernel launches on demand when the level does not (default: yes).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        launch_sample: Option<bool>,
        /// Sample the tree's Python frames (default: yes).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stack_sample: Option<bool>,
        /// Profile the tree's threads natively. Default: when the snapshot samples anyway (a
        /// Python process in the tree, or a launch sample), so that a snapshot that has
        /// nothing else to wait for stays immediate and its window ends when it was asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_profile: Option<bool>,
    },
    Node,
    /// Open CUPTI windows in `pids` (processes started with libethand_cupti.so) for
    /// `duration_ms` and stream their entries (`ethand record` while the daemon runs; the
    /// protocol: serve/gpu_trace.rs).
    GpuTrace {
        pids: Vec<u32>,
        duration_ms: u64,
    },
    /// Switch the GPU/NPU probing level live: "system", "calls", "process" or "op"; another
    /// name is refused as "unknown level ...".
    SetLevel {
        #[serde(with = "ethand_snapshot::level::named")]
        level: GpuLevel,
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

/// Why a request line was refused. The text is the error line sent back to the client.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("bad request: longer than {MAX_REQUEST} bytes (one JSON object per line)")]
    TooLong,
    #[error("bad request: not UTF-8 text: {source}")]
    NotUtf8 { source: std::str::Utf8Error },
    #[error("bad request: empty request (expected one JSON object per line)")]
    Empty,
    #[error("bad request: {source}")]
    Json { source: serde_json::Error },
}

/// Parses one request line as read from the socket (at most `MAX_REQUEST` + 1 bytes, the
/// final newline included).
pub fn parse_request(line: &[u8]) -> Result<Request, RequestError> {
    if line.len() > MAX_REQUEST {
        return Err(RequestError::TooLong);
    }
    let text = std::str::from_utf8(line).map_err(|source| RequestError::NotUtf8 { source })?;
    if text.trim().is_empty() {
        return Err(RequestError::Empty);
    }
    serde_json::from_str(text).map_err(|source| RequestError::Json { source })
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

/// Snapshots and node dumps built at once: each locks the model for its build and holds its
/// reply until the client has read it. More wait for their turn, at most [`TIMEOUT`].
const HEAVY_AT_ONCE: usize = 2;

/// Largest reply: a snapshot takes a few KB per process (command lines are capped at 4 KiB),
/// so this is a tree of tens of thousands of processes. A larger one is refused with an
/// error, never built whole.
pub const MAX_REPLY: usize = 256 << 20;

/// How long a client may take to send its request and to take each part of the reply, and
/// how long a request waits for its turn.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the API until the process ends: at most `limiter`'s connections at once (more get
/// a "busy" error line and are closed), failed accepts backed off.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, limiter: Arc<ConnLimiter>) {
    let heavy = Arc::new(Semaphore::new(HEAVY_AT_ONCE));
    let mut backoff = AcceptBackoff::new(limiter.clone());
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                backoff.succeeded();
                s
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed(&e)).await;
                continue;
            }
        };
        let uid = stream.peer_cred().ok().map(|c| c.uid());
        let slot = match limiter.admit(PeerKey { addr: None, uid }) {
            Ok(s) => s,
            Err(_) => {
                let busy = error_line(&format!(
                    "busy: {} local API connections are open (daemon.api_max_connections); try again",
                    limiter.status().max
                ));
                limiter.refuse(stream, busy, b"\n");
                continue;
            }
        };
        let (shared, heavy, limiter) = (shared.clone(), heavy.clone(), limiter.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = handle(stream, shared, heavy, &limiter, uid).await {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    limiter.timed_out();
                }
                debug!(error = %e, "api connection");
            }
        });
    }
}

async fn handle(
    stream: UnixStream,
    shared: Arc<Shared>,
    heavy: Arc<Semaphore>,
    limiter: &ConnLimiter,
    uid: Option<u32>,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    // One byte over the limit tells a too-long request from one of exactly MAX_REQUEST.
    let mut r = BufReader::new(r).take(MAX_REQUEST as u64 + 1);
    let mut line = Vec::new();
    let read = tokio::time::timeout(TIMEOUT, r.read_until(b'\n', &mut line)).await;
    // Held until the reply is written: a client that reads slowly delays the next build
    // instead of making the daemon hold many replies.
    let mut _permit = None;
    let reply: Arc<Vec<u8>> = match read {
        // A client that connects and sends nothing must not hold a task and a descriptor.
        Err(_) => {
            limiter.timed_out();
            Arc::new(error_line(&format!(
                "bad request: no request line within {} s",
                TIMEOUT.as_secs()
            )))
        }
        Ok(read) => {
            read?;
            match parse_request(&line) {
                Ok(Request::SetLevel { level }) => Arc::new(set_level(&shared, level, uid).await),
                Ok(Request::Status) => Arc::new(status_line(&shared)),
                Ok(Request::GpuTrace { pids, duration_ms }) => {
                    match crate::serve::gpu_trace::check(&pids, duration_ms) {
                        Ok(d) => {
                            let from = r.into_inner();
                            return crate::serve::gpu_trace::serve(
                                from,
                                w,
                                &shared,
                                (pids, d),
                                TIMEOUT,
                            )
                            .await;
                        }
                        Err(why) => Arc::new(error_line(&why)),
                    }
                }
                Ok(req) => match tokio::time::timeout(TIMEOUT, heavy.acquire_owned()).await {
                    Ok(Ok(permit)) => {
                        _permit = Some(permit);
                        let shared = shared.clone();
                        tokio::task::spawn_blocking(move || answer(&shared, req))
                            .await
                            .unwrap_or_else(|e| {
                                Arc::new(error_line(&format!("internal error: {e}")))
                            })
                    }
                    _ => Arc::new(error_line(&format!(
                        "busy: {HEAVY_AT_ONCE} snapshots are being built and none finished within {} s; try again",
                        TIMEOUT.as_secs()
                    ))),
                },
                Err(e) => Arc::new(error_line(&e.to_string())),
            }
        }
    };
    // Each part must be taken within the timeout: a client that stops reading is dropped.
    for chunk in reply.chunks(64 * 1024) {
        match tokio::time::timeout(TIMEOUT, w.write_all(chunk)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client stopped reading the reply",
                ));
            }
        }
    }
    w.shutdown().await
}

/// `{"ok":VALUE}` and a newline, serialized straight from `v` (no intermediate JSON tree);
/// an error line instead when it would exceed [`MAX_REPLY`], found before it is built whole.
pub fn ok_line<T: Serialize>(v: &T) -> Vec<u8> {
    const HEAD: &[u8] = b"{\"ok\":";
    const TAIL: &[u8] = b"}\n";
    // Measured first, then written into a buffer of exactly that size: grown by doubling, the
    // reply of a large tree (30 MB) passed through 16, 32 and 64 MB buffers, the daemon's
    // memory peak under churn. Serializing twice costs CPU, not memory.
    let mut size = Counted(HEAD.len() + TAIL.len());
    match serde_json::to_writer(&mut size, v) {
        Ok(()) => {}
        Err(_) if size.0 + 64 * 1024 > MAX_REPLY => {
            return error_line(&format!(
                "the reply would exceed {} MiB (ethand's limit); ask for a smaller tree",
                MAX_REPLY >> 20
            ));
        }
        Err(e) => return error_line(&format!("internal error: {e}")),
    }
    let mut out = Vec::with_capacity(size.0);
    out.extend_from_slice(HEAD);
    if let Err(e) = serde_json::to_writer(&mut out, v) {
        return error_line(&format!("internal error: {e}"));
    }
    out.extend_from_slice(TAIL);
    out
}

/// `{"error":MESSAGE}` and a newline.
pub fn error_line(msg: &str) -> Vec<u8> {
    response_line(&Response::Error(msg.into()))
}

pub fn response_line(r: &Response) -> Vec<u8> {
    let mut out = serde_json::to_vec(r).expect("serializable");
    out.push(b'\n');
    out
}

/// Counts the bytes written to it, and refuses to count past [`MAX_REPLY`].
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0 + buf.len() > MAX_REPLY {
            return Err(std::io::Error::other("reply too large"));
        }
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The answer to `ethand status`: one `{"ok":...}` line.
fn status_line(shared: &Shared) -> Vec<u8> {
    let node = shared.node.read().expect("lock").clone();
    let mut status = node.ethand.clone();
    // A collection that stopped shows as a round that grows old.
    status.last_round_age_ms =
        Some(crate::pipeline::procinfo::unix_ms().saturating_sub(status.last_round_unix_ms));
    ok_line(&status)
}

/// The answer to a node dump or a snapshot: one reply line. Built under the bound on
/// concurrent builds.
fn answer(shared: &Shared, req: Request) -> Arc<Vec<u8>> {
    match req {
        Request::Node => shared.node_reply(ok_line),
        Request::Snapshot {
            pid,
            window_s,
            launch_sample,
            stack_sample,
            cpu_profile,
        } => {
            let ask = crate::serve::tree::Samples {
                launches: launch_sample.unwrap_or(true),
                stacks: stack_sample.unwrap_or(true),
                profile: cpu_profile,
            };
            Arc::new(
                match crate::serve::tree::daemon_snapshot(shared, pid, window_s, ask) {
                    Some(t) => ok_line(&t),
                    None => response_line(&Response::NotFound(format!(
                        "no process with pid {pid} is known to ethand (not running, or exited longer ago than daemon.exit_grace_seconds)"
                    ))),
                },
            )
        }
        Request::Status => Arc::new(status_line(shared)),
        Request::SetLevel { .. } | Request::GpuTrace { .. } => {
            Arc::new(error_line("answered by the API task"))
        }
    }
}

/// Hands the change to the collection loop (which owns the probes) and waits for its answer.
async fn set_level(shared: &Arc<Shared>, level: GpuLevel, uid: Option<u32>) -> Vec<u8> {
    let (who, every) = shared.level_policy;
    if who == crate::config::LevelSwitch::Root && uid != Some(0) {
        return error_line(
            "permission denied: only root may switch the GPU level (daemon.level_switch = \"root\")",
        );
    }
    {
        let mut last = shared.last_level_switch.lock().expect("lock");
        if let Some(t) = *last
            && t.elapsed() < every
        {
            return error_line(&format!(
                "refused: the GPU level was switched {:.0} s ago; at most one switch every {} s (daemon.level_switch_interval_seconds)",
                t.elapsed().as_secs_f64(),
                every.as_secs()
            ));
        }
        *last = Some(std::time::Instant::now());
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    *shared.level_request.lock().expect("lock") = Some((level, tx));
    match tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(10)))
        .await
    {
        Ok(Ok(Ok(msg))) => ok_line(&serde_json::json!({ "level": level.as_str(), "message": msg })),
        Ok(Ok(Err(e))) => error_line(&e),
        _ => error_line("the daemon did not apply the level within 10 s"),
    }
}

/// Why a client got no answer: each case has its own remedy, and only a daemon that is not
/// there at all lets `ethand snapshot` measure on its own.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no ethand daemon listens at {path} (is it running? systemctl status ethand)")]
    NoDaemon {
        path: String,
        source: std::io::Error,
    },
    #[error("permission denied on {path}: {hint}")]
    PermissionDenied { path: String, hint: String },
    #[error("the ethand daemon at {path} did not answer within {secs} s (--timeout)")]
    Timeout { path: String, secs: u64 },
    #[error("{path} is not an ethand daemon's socket, or the daemon broke off: {detail}")]
    NotEthand { path: String, detail: String },
    #[error("talking to the ethand daemon at {path}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Client side: sends one request and returns the daemon's response, all within `timeout`.
/// A "busy" answer (the daemon at its connection or build cap) is asked again with backoff
/// until `timeout`: connections closed a moment ago free their slots only once the daemon has
/// seen them close. The last busy answer is returned when the time is up.
pub async fn call(
    path: &Path,
    req: &Request,
    timeout: std::time::Duration,
) -> Result<Response, CallError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        let answer = call_once(
            path,
            req,
            deadline.saturating_duration_since(tokio::time::Instant::now()),
        )
        .await;
        match answer {
            Ok(Response::Error(ref msg)) if is_busy(msg) => {
                if tokio::time::Instant::now() + pause >= deadline {
                    return answer;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            _ => return answer,
        }
    }
}

/// A "busy" error line: the request was not looked at and may be sent again.
pub fn is_busy(msg: &str) -> bool {
    msg.starts_with("busy:")
}

/// One request, one answer, within `timeout`.
pub async fn call_once(
    path: &Path,
    req: &Request,
    timeout: std::time::Duration,
) -> Result<Response, CallError> {
    let p = path.display().to_string();
    match tokio::time::timeout(timeout, call_unbounded(path, req)).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Timeout {
            path: p,
            secs: timeout.as_secs().max(1),
        }),
    }
}

/// Who else serves at `path`, asked before a daemon binds it: a daemon that answers (its pid
/// named), or something that takes connections there and does not answer as one. None when
/// nobody listens: no socket, or one left by a killed daemon (`bind` replaces it).
pub async fn other_daemon(path: &Path, timeout: std::time::Duration) -> Option<String> {
    let p = path.display();
    match call_once(path, &Request::Status, timeout).await {
        Ok(Response::Ok(v)) => Some(match v["pid"].as_u64() {
            Some(pid) => format!("another ethand daemon (pid {pid}) answers on {p}"),
            None => format!("another ethand daemon answers on {p}"),
        }),
        // A daemon at its connection cap still answers, with an error line.
        Ok(_) => Some(format!("another ethand daemon answers on {p}")),
        Err(CallError::Timeout { secs, .. }) => Some(format!(
            "something takes connections on {p} but did not answer within {secs} s (another ethand daemon starting?)"
        )),
        Err(e @ CallError::NotEthand { .. }) => Some(e.to_string()),
        Err(_) => None,
    }
}

async fn call_unbounded(path: &Path, req: &Request) -> Result<Response, CallError> {
    let p = || path.display().to_string();
    let stream = UnixStream::connect(path)
        .await
        .map_err(|e| match e.kind() {
            // No socket, or one nobody listens on (left by a killed daemon).
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                CallError::NoDaemon {
                    path: p(),
                    source: e,
                }
            }
            std::io::ErrorKind::PermissionDenied => CallError::PermissionDenied {
                path: p(),
                hint: access_hint(path),
            },
            _ => CallError::Io {
                path: p(),
                source: e,
            },
        })?;
    let (r, mut w) = stream.into_split();
    let io = |source| CallError::Io { path: p(), source };
    // A daemon that refuses the connection (busy) answers and closes before reading the
    // request: the answer is still there to read when the write fails.
    let sent = w.write_all(&request_line(req)).await;
    let mut line = Vec::new();
    let read = BufReader::new(r)
        .take(MAX_REPLY as u64 + 1)
        .read_until(b'\n', &mut line)
        .await;
    if line.is_empty() {
        sent.map_err(io)?;
        read.map_err(io)?;
    }
    if line.is_empty() {
        return Err(CallError::NotEthand {
            path: p(),
            detail: "the connection closed without an answer".into(),
        });
    }
    serde_json::from_slice(&line).map_err(|e| {
        let head = String::from_utf8_lossy(&line[..line.len().min(60)]);
        CallError::NotEthand {
            path: p(),
            detail: format!("its answer starts {head:?}, not an ethand reply ({e})"),
        }
    })
}

fn request_line(req: &Request) -> Vec<u8> {
    let mut body = serde_json::to_vec(req).expect("serializable");
    body.push(b'\n');
    body
}

/// What to do about a socket the caller may not use: who owns it, and how to get in.
fn access_hint(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata(path) {
        Ok(md) if md.mode() & 0o060 == 0 => format!(
            "the socket is root only (mode {:04o}: daemon.socket_group is empty or did not exist when the daemon started); run as root",
            md.mode() & 0o7777
        ),
        Ok(md) => {
            let group = crate::privilege::group_name(md.gid())
                .unwrap_or_else(|| format!("gid {}", md.gid()));
            format!(
                "the socket is for root and group {group} (mode {:04o}); add your user to the group (sudo usermod -aG {group} $USER, then log in again) or run as root",
                md.mode() & 0o7777
            )
        }
        Err(_) => "a directory on its path is closed to you; run as root or as a member of the socket's group".into(),
    }
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
                window_s: 10,
                launch_sample: None,
                stack_sample: None,
                cpu_profile: None,
            })
        ));
        assert!(matches!(
            parse_request(b"{\"cmd\":\"status\"}"),
            Ok(Request::Status)
        ));
        assert!(matches!(
            parse_request(b"{\"cmd\":\"set_level\",\"level\":\"op\"}\n"),
            Ok(Request::SetLevel {
                level: GpuLevel::Op
            })
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
            (
                b"{\"cmd\":\"set_level\",\"level\":\"max\"}\n",
                "bad request: unknown level \"max\": expected system, calls, process or op",
            ),
            (b"{\"cmd\":\"set_level\",\"level\":5}\n", "invalid type"),
            (b"{\"cmd\":\"snap", "EOF"),
        ] {
            let e = parse_request(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("bad request: ") && e.contains(want),
                "{bad:?}: {e}"
            );
        }
        let long = vec![b' '; MAX_REQUEST + 1];
        assert!(matches!(parse_request(&long), Err(RequestError::TooLong)));
        assert_eq!(
            parse_request(&long).unwrap_err().to_string(),
            format!("bad request: longer than {MAX_REQUEST} bytes (one JSON object per line)")
        );
    }

    /// The reply line is allocated once at its final size (no doubling of a 30 MB buffer),
    /// and a value over the limit becomes an error line.
    #[test]
    fn ok_line_is_exactly_sized() {
        let v: Vec<String> = (0..10_000).map(|i| format!("process {i}")).collect();
        let line = ok_line(&v);
        assert_eq!(line.capacity(), line.len());
        let parsed: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
        assert_eq!(parsed["ok"].as_array().map(Vec::len), Some(10_000));
        assert!(line.ends_with(b"}\n"));
        let huge = vec![0u8; MAX_REPLY / 2];
        let line = String::from_utf8(ok_line(&huge)).expect("text");
        assert!(line.contains("would exceed"), "{line}");
    }

    /// A client told "busy" asks again until the daemon has room, and gives the last busy
    /// answer back when the time is up; other answers are taken at once.
    #[tokio::test]
    async fn busy_answers_are_asked_again_until_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("api.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let busy = error_line("busy: 64 local API connections are open; try again");
        let server = tokio::spawn(async move {
            let mut asked = 0u32;
            loop {
                let (mut s, _) = listener.accept().await.expect("accept");
                asked += 1;
                let mut line = Vec::new();
                let mut r = BufReader::new(&mut s);
                r.read_until(b'\n', &mut line).await.expect("request");
                let reply = if asked <= 3 {
                    busy.clone()
                } else {
                    ok_line(&serde_json::json!({ "asked": asked }))
                };
                s.write_all(&reply).await.expect("reply");
            }
        });
        let t = std::time::Duration::from_secs(5);
        match call(&path, &Request::Status, t).await {
            Ok(Response::Ok(v)) => assert_eq!(v["asked"], 4),
            other => panic!("{other:?}"),
        }
        // Always busy: the busy line comes back after about the timeout.
        server.abort();
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        let busy = error_line("busy: 2 snapshots are being built; try again");
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.expect("accept");
                let mut line = Vec::new();
                BufReader::new(&mut s)
                    .read_until(b'\n', &mut line)
                    .await
                    .expect("request");
                s.write_all(&busy).await.expect("reply");
            }
        });
        let t0 = std::time::Instant::now();
        let t = std::time::Duration::from_millis(400);
        match call(&path, &Request::Status, t).await {
            Ok(Response::Error(m)) => assert!(is_busy(&m), "{m}"),
            other => panic!("{other:?}"),
        }
        let took = t0.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(200)
                && took < t + std::time::Duration::from_millis(200),
            "{took:?}"
        );
    }
}
