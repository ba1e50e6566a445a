//! What keeps a local user from blinding the daemon through its servers: a cap on open
//! connections, in all and per peer, and accept loops that back off instead of spinning when
//! the process runs out of descriptors, and refusals that take the refused request before they
//! close. Shared by /metrics (`http.rs`) and the local API (`api.rs`); their counts reach
//! `ethand status` and `ethand_server_connections*`.
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ethand_snapshot::ServerConnections;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::Semaphore,
};
use tracing::warn;

/// Who a connection counts against. A remote peer is its address; a peer on this host (found
/// by `peer::tcp_peer_uid`, or a Unix socket's credentials) is its address and user, so that
/// one local user holding connections takes no slot of another's (Prometheus' scrape).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct PeerKey {
    pub addr: Option<IpAddr>,
    pub uid: Option<u32>,
}

/// Why a connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The server had `max` connections open.
    Limit,
    /// The peer had `per_peer` connections open.
    PeerLimit,
}

/// Counters of one server, read by `ethand status` and /metrics.
#[derive(Default)]
struct Counters {
    refused_limit: AtomicU64,
    refused_peer_limit: AtomicU64,
    timed_out: AtomicU64,
    accept_errors: AtomicU64,
}

/// Open connections of one server, in all and per peer.
pub struct ConnLimiter {
    server: &'static str,
    max: usize,
    per_peer: usize,
    open: Mutex<(usize, HashMap<PeerKey, usize>)>,
    counters: Counters,
    /// Refused connections being told so and drained (`refuse`).
    refusing: Arc<Semaphore>,
}

/// One admitted connection: its slot is given back when this is dropped.
pub struct Slot {
    limiter: Arc<ConnLimiter>,
    peer: PeerKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().expect("lock");
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.peer);
            }
        }
    }
}

impl ConnLimiter {
    pub fn new(server: &'static str, max: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            server,
            max: max.max(1),
            per_peer: per_peer.clamp(1, max.max(1)),
            open: Mutex::new((0, HashMap::new())),
            counters: Counters::default(),
            refusing: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
        })
    }

    /// A slot for a connection of `peer`, or why there is none (counted).
    pub fn admit(self: &Arc<Self>, peer: PeerKey) -> Result<Slot, Refused> {
        let mut open = self.open.lock().expect("lock");
        let refused = if open.0 >= self.max {
            self.counters.refused_limit.fetch_add(1, Ordering::Relaxed);
            Refused::Limit
        } else if open.1.get(&peer).copied().unwrap_or(0) >= self.per_peer {
            self.counters
                .refused_peer_limit
                .fetch_add(1, Ordering::Relaxed);
            Refused::PeerLimit
        } else {
            open.0 += 1;
            *open.1.entry(peer).or_insert(0) += 1;
            return Ok(Slot {
                limiter: self.clone(),
                peer,
            });
        };
        Err(refused)
    }

    /// Answers a refused connection with `answer` (none for TLS) and closes it once its
    /// request is taken: closing a socket with unread data resets it (TCP and Unix alike), and
    /// the client then loses the answer it was sent (seen: "Connection reset by peer" in CI's
    /// flood of 200 API clients). The write side is shut first, so the client reads the answer
    /// and its end at once; the request is read up to `request_end`, the client's close,
    /// [`REFUSAL_DRAIN_BYTES`] or [`REFUSAL_DRAIN`], whichever comes first. At most
    /// [`REFUSALS_AT_ONCE`] are drained at once, each holding its descriptor for at most that
    /// long; beyond them a refusal takes what has arrived and closes at once.
    pub fn refuse<S, A>(&self, mut stream: S, answer: A, request_end: &'static [u8])
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        A: AsRef<[u8]> + Send + Sync + 'static,
    {
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            // One poll each: a fresh socket's send buffer is empty, so the answer goes out.
            tokio::spawn(async move {
                let zero = Duration::ZERO;
                let _ = tokio::time::timeout(zero, stream.write_all(answer.as_ref())).await;
                let mut sink = [0u8; 4096];
                for _ in 0..16 {
                    match tokio::time::timeout(zero, stream.read(&mut sink)).await {
                        Ok(Ok(n)) if n > 0 => {}
                        _ => break,
                    }
                }
            });
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REFUSAL_DRAIN, async {
                stream.write_all(answer.as_ref()).await?;
                stream.shutdown().await?;
                drain_request(&mut stream, request_end).await
            })
            .await;
        });
    }

    /// A connection closed for not sending or not reading in time.
    pub fn timed_out(&self) {
        self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
    }

    pub fn open(&self) -> usize {
        self.open.lock().expect("lock").0
    }

    pub fn status(&self) -> ServerConnections {
        let c = &self.counters;
        ServerConnections {
            server: self.server.into(),
            open: self.open() as u64,
            max: self.max as u64,
            max_per_peer: self.per_peer as u64,
            refused_limit: c.refused_limit.load(Ordering::Relaxed),
            refused_peer_limit: c.refused_peer_limit.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            accept_errors: c.accept_errors.load(Ordering::Relaxed),
        }
    }
}

/// Refused connections drained at once (`ConnLimiter::refuse`).
pub const REFUSALS_AT_ONCE: usize = 16;
/// The longest a refused connection is kept to take its request.
pub const REFUSAL_DRAIN: Duration = Duration::from_secs(1);
/// The most a refused connection's request is read: the API's requests are at most 64 KiB.
pub const REFUSAL_DRAIN_BYTES: usize = 64 * 1024 + 1;

/// Reads `stream` until `end` has been read, the peer closed, or [`REFUSAL_DRAIN_BYTES`].
async fn drain_request<S: AsyncRead + Unpin>(stream: &mut S, end: &[u8]) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    // The last bytes of the previous read: `end` may straddle two reads.
    let mut seen: Vec<u8> = Vec::with_capacity(end.len() + buf.len());
    let mut total = 0;
    while total < REFUSAL_DRAIN_BYTES {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n;
        seen.extend_from_slice(&buf[..n]);
        if !end.is_empty() && seen.windows(end.len()).any(|w| w == end) {
            break;
        }
        seen.drain(..seen.len().saturating_sub(end.len().saturating_sub(1)));
    }
    Ok(())
}

/// Sleeps between failed accepts: out of descriptors (EMFILE), the accept would fail again
/// at once, and retrying in a loop burnt a core and wrote a gigabyte of log in 40 s. The delay
/// doubles from 5 ms to 1 s and resets on the next success; the failure is logged at most
/// once per 10 s, with how many were not.
pub struct AcceptBackoff {
    limiter: Arc<ConnLimiter>,
    delay: Duration,
    last_log: Option<Instant>,
    unlogged: u64,
}

const BACKOFF_MIN: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const LOG_EVERY: Duration = Duration::from_secs(10);

impl AcceptBackoff {
    pub fn new(limiter: Arc<ConnLimiter>) -> Self {
        Self {
            limiter,
            delay: BACKOFF_MIN,
            last_log: None,
            unlogged: 0,
        }
    }

    pub fn succeeded(&mut self) {
        self.delay = BACKOFF_MIN;
    }

    /// The delay before the next accept after `e`, logged (rate-limited) and counted.
    pub fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.limiter
            .counters
            .accept_errors
            .fetch_add(1, Ordering::Relaxed);
        if self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            warn!(
                server = self.limiter.server,
                error = %e,
                not_logged_since_last = self.unlogged,
                retry_in_ms = self.delay.as_millis() as u64,
                "accept failed"
            );
            self.last_log = Some(Instant::now());
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
        let d = self.delay;
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        d
    }
}

/// Raises the soft limit on open descriptors to the hard one (as Go's runtime does) and returns
/// the soft limit in force.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// The per-peer cap for a total cap fitted down from `configured` to `fitted`: shrunk in the
/// same proportion (at least 1). Left as configured, two local users would hold a small
/// fitted total between them (8 each of 16 under a 400-descriptor limit) and Prometheus'
/// scrape would find no slot.
pub fn per_peer_in_proportion(per_peer: u64, configured: u64, fitted: u64) -> u64 {
    if fitted >= configured {
        return per_peer;
    }
    (per_peer * fitted / configured.max(1)).max(1)
}

/// Descriptors kept free of connections, for what the daemon opens later (uprobe links and
/// library files of runtimes loaded later, /proc files, the device collectors).
pub const FD_RESERVE: u64 = 256;

/// The connection caps that fit the descriptor limit: `(metrics, api)`, each at most what was
/// configured. With too few descriptors left both shrink in proportion (at least 1 each), so
/// that connections can never use the descriptors the daemon needs to keep measuring.
pub fn fit_to_fd_limit(metrics: u64, api: u64, fd_limit: u64, fds_open: u64) -> (u64, u64) {
    let room = fd_limit.saturating_sub(fds_open + FD_RESERVE);
    let want = metrics + api;
    if want <= room {
        return (metrics, api);
    }
    let m = (metrics * room / want.max(1)).max(1);
    let a = (room.saturating_sub(m)).clamp(1, api.max(1));
    (m, a)
}

/// Descriptors this process has open now.
pub fn fds_open() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> PeerKey {
        PeerKey {
            addr: Some("127.0.0.1".parse().unwrap()),
            uid: Some(uid),
        }
    }

    /// Waits until every drain permit is back (the refusals closed), at most `within`.
    async fn drained_within(l: &ConnLimiter, within: Duration) -> Duration {
        let t0 = Instant::now();
        while l.refusing.available_permits() < REFUSALS_AT_ONCE {
            assert!(
                t0.elapsed() < within,
                "refusals still open after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        t0.elapsed()
    }

    /// A refused client gets the whole answer and then its end, never a reset, whether its
    /// request came before the refusal, in pieces, or after it; the refusal closes as soon as
    /// the request's end arrived.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_client_reads_the_answer_and_no_reset() {
        use tokio::net::UnixStream;
        let l = ConnLimiter::new("test", 1, 1);
        let answer = b"busy: try again\n";
        // The request is there before the refusal (without the drain: a reset, every time).
        for _ in 0..50 {
            let (server, mut client) = UnixStream::pair().unwrap();
            client.write_all(b"{\"cmd\":\"node\"}\n").await.unwrap();
            l.refuse(server, &answer[..], b"\n");
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("no reset");
            assert_eq!(got, answer);
        }
        drained_within(&l, Duration::from_secs(1)).await;
        // In pieces, the last one after the answer was read.
        let (server, mut client) = UnixStream::pair().unwrap();
        client.write_all(b"{\"cmd\":").await.unwrap();
        l.refuse(server, &answer[..], b"\n");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("no reset");
        assert_eq!(got, answer);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(l.refusing.available_permits(), REFUSALS_AT_ONCE - 1);
        client.write_all(b"\"node\"}\n").await.unwrap();
        let took = drained_within(&l, Duration::from_millis(500)).await;
        eprintln!("closed {took:?} after the request's end");
    }

    /// A refused client that sends nothing is closed after `REFUSAL_DRAIN`; beyond
    /// `REFUSALS_AT_ONCE` such clients a refusal answers and closes at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_refused_clients_are_bounded_in_number_and_time() {
        use tokio::net::UnixStream;
        let l = ConnLimiter::new("test", 1, 1);
        let mut silent = Vec::new();
        for _ in 0..REFUSALS_AT_ONCE {
            let (server, client) = UnixStream::pair().unwrap();
            l.refuse(server, &b"busy\n"[..], b"\n");
            silent.push(client);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(l.refusing.available_permits(), 0);
        // One more: answered, and its end comes at once though it sent nothing.
        let (server, mut client) = UnixStream::pair().unwrap();
        let t0 = Instant::now();
        l.refuse(server, &b"busy\n"[..], b"\n");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"busy\n");
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
        // The silent ones: each answered, then closed after the drain time.
        let took = drained_within(&l, REFUSAL_DRAIN + Duration::from_secs(1)).await;
        assert!(took + Duration::from_millis(50) >= REFUSAL_DRAIN - Duration::from_millis(100));
        for mut c in silent {
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"busy\n");
        }
    }

    #[test]
    fn per_peer_and_total_caps_hold_and_slots_come_back() {
        let l = ConnLimiter::new("test", 5, 2);
        let a1 = l.admit(peer(1000)).unwrap();
        let _a2 = l.admit(peer(1000)).unwrap();
        assert_eq!(l.admit(peer(1000)).err(), Some(Refused::PeerLimit));
        // Another user on the same address still gets in.
        let _b = l.admit(peer(0)).unwrap();
        drop(a1);
        let _a3 = l.admit(peer(1000)).unwrap();
        let _c1 = l.admit(peer(2)).unwrap();
        let _c2 = l.admit(peer(3)).unwrap();
        assert_eq!(l.open(), 5);
        assert_eq!(l.admit(peer(4)).err(), Some(Refused::Limit));
        let s = l.status();
        assert_eq!((s.open, s.refused_limit, s.refused_peer_limit), (5, 1, 1));
    }

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = AcceptBackoff::new(ConnLimiter::new("test", 1, 1));
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let delays: Vec<u128> = (0..10).map(|_| b.failed(&e).as_millis()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(&e), BACKOFF_MIN);
        assert_eq!(b.limiter.status().accept_errors, 11);
    }

    #[test]
    fn connection_caps_shrink_to_the_descriptor_limit() {
        assert_eq!(fit_to_fd_limit(64, 64, 65_536, 100), (64, 64));
        // systemd's default soft limit, 300 descriptors in use: 468 left for connections.
        assert_eq!(fit_to_fd_limit(512, 512, 1024, 300), (234, 234));
        // Nothing left: one each, never zero.
        assert_eq!(fit_to_fd_limit(64, 64, 256, 200), (1, 1));
        // The per-peer cap follows: 8 of 64 become 2 of 16 (the e2e test's 400-descriptor
        // limit), so that two users cannot take the whole of it.
        assert_eq!(per_peer_in_proportion(8, 64, 16), 2);
        assert_eq!(per_peer_in_proportion(8, 64, 64), 8);
        assert_eq!(per_peer_in_proportion(8, 64, 1), 1);
    }
}
