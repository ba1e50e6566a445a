//! The /metrics server: HTTP/1.1 (hyper), with TLS and basic auth as the web-config file says
//! (`web_config.rs`), built so that no client can take it from Prometheus:
//! - connections are capped in all and per peer (`connlimit.rs`); a local peer is its address
//!   and user (`peer.rs`), so one user's idle connections leave Prometheus' slot free; a
//!   connection over a cap gets `503` (plain HTTP) or is closed (TLS) at once;
//! - a client has `prometheus.timeout_ms` to finish the TLS handshake and each request's
//!   headers, and an idle keep-alive connection is closed after the same time (hyper's
//!   header-read timer runs from the end of the previous reply);
//! - a reply the client does not read for that long is abandoned (`WriteDeadline`): a reader
//!   that never reads holds neither the slot nor the reply;
//! - the body is rendered once per collection round and shared by every reply of that round
//!   (`Shared::metrics_body`), so concurrent scrapes cost one render and one buffer;
//! - failed accepts (out of descriptors) back off instead of spinning.
use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::Sleep,
};
use tracing::{debug, warn};

use crate::serve::{
    connlimit::{AcceptBackoff, ConnLimiter, PeerKey, Refused},
    peer::SockDiag,
    web_config::WebConfig,
};

/// Largest request head hyper buffers per connection (its minimum is 8 KiB): a scrape's is
/// a few hundred bytes.
const MAX_REQUEST_BUF: usize = 16 * 1024;

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 38\r\nConnection: close\r\n\r\ntoo many connections from this client\n";
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";

/// Connections the kernel queues before ethand accepts them (capped by net.core.somaxconn,
/// 4096 by default). tokio's 1,024 overflowed when a local user opened connections in a burst:
/// the kernel then drops new SYNs, and a scrape meeting that waits a second for its retry.
const BACKLOG: u32 = 4096;

/// The /metrics listening socket (SO_REUSEADDR, as tokio's `bind`, and [`BACKLOG`]).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Serves `app` on `listener` until the process ends.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    web: WebConfig,
    limiter: Arc<ConnLimiter>,
    timeout: Duration,
) {
    let app = web.wrap(app);
    let tls = web.tls();
    let mut backoff = AcceptBackoff::new(limiter.clone());
    let mut diag = match SockDiag::open() {
        Ok(d) => Some(d),
        Err(e) => {
            warn!(error = %e, "no sock_diag: /metrics connections from this host are capped per address, not per user");
            None
        }
    };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => {
                backoff.succeeded();
                c
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed(&e)).await;
                continue;
            }
        };
        let key = peer_key(diag.as_mut(), &stream, peer);
        let slot = match limiter.admit(key) {
            Ok(s) => s,
            Err(why) => {
                debug!(%peer, uid = ?key.uid, ?why, "metrics connection refused");
                // No plain-text answer inside TLS: the client sees the connection close.
                let answer = match (&tls, why) {
                    (Some(_), _) => &b""[..],
                    (None, Refused::PeerLimit) => BUSY,
                    (None, Refused::Limit) => FULL,
                };
                limiter.refuse(stream, answer, b"\r\n\r\n");
                continue;
            }
        };
        let (app, tls, limiter) = (app.clone(), tls.clone(), limiter.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _ = stream.set_nodelay(true);
            let io = WriteDeadline::new(stream, timeout);
            let r = match tls {
                Some(acceptor) => match tokio::time::timeout(timeout, acceptor.accept(io)).await {
                    Ok(Ok(tls)) => serve_connection(tls, app, timeout).await,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        limiter.timed_out();
                        debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
                None => serve_connection(io, app, timeout).await,
            };
            if let Err(e) = r {
                if is_timeout(&e) {
                    limiter.timed_out();
                }
                debug!(%peer, error = %e, "metrics connection");
            }
        });
    }
}

fn peer_key(diag: Option<&mut SockDiag>, stream: &TcpStream, peer: SocketAddr) -> PeerKey {
    let uid = match (diag, stream.local_addr()) {
        (Some(d), Ok(local)) => d.tcp_peer_uid(local, peer),
        _ => None,
    };
    let ip = peer.ip();
    let addr = match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    };
    PeerKey {
        addr: Some(addr),
        uid,
    }
}

async fn serve_connection<I>(io: I, app: Router, timeout: Duration) -> Result<(), hyper::Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .keep_alive(true)
        .max_buf_size(MAX_REQUEST_BUF)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .await
}

/// hyper's header-read timeout, or a reply abandoned by [`WriteDeadline`].
fn is_timeout(e: &hyper::Error) -> bool {
    if e.is_timeout() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// A stream whose writes may wait at most `limit` for the peer to read: a write still pending
/// then fails with `TimedOut`, and the connection, its slot and its reply are dropped.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a pending write: Pending while within the limit, else the error.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} ms", limit.as_millis()),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.stall(cx).map(Err),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    /// A peer that never reads: the write fails after the limit instead of waiting forever.
    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_limit() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let mut w = WriteDeadline::new(s, Duration::from_millis(300));
        let t0 = std::time::Instant::now();
        let chunk = vec![0u8; 1 << 20];
        let err = loop {
            if let Err(e) = w.write_all(&chunk).await {
                break e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "writes never stalled"
            );
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(t0.elapsed() >= Duration::from_millis(300));
    }
}
