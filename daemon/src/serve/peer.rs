//! The user behind a TCP connection from this host, asked of the kernel through sock_diag
//! (NETLINK_SOCK_DIAG, the interface of `ss`): the connecting socket is looked up by its
//! exact address pair and its owner's uid read. A remote peer's socket is not on this host:
//! the lookup finds nothing (None). Used to count /metrics connections per local user.
use std::{
    io,
    mem::size_of,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const INET_DIAG_NOCOOKIE: u32 = !0;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InetDiagSockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    ifindex: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InetDiagReqV2 {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: InetDiagSockId,
}

/// `struct inet_diag_msg`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InetDiagMsg {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: InetDiagSockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

#[repr(C)]
struct Request {
    hdr: NlMsgHdr,
    req: InetDiagReqV2,
}

/// A sock_diag netlink socket, kept open by the accept loop that asks.
pub struct SockDiag {
    fd: OwnedFd,
    seq: u32,
}

/// An IPv4 address that reached an IPv6 socket (`::ffff:a.b.c.d`) is the IPv4 socket's.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

fn put_addr(out: &mut [u8; 16], a: IpAddr) {
    match a {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => *out = v6.octets(),
    }
}

impl SockDiag {
    pub fn open() -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // A reply that never comes must not stall the accept loop.
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: fd is ours; tv is a valid timeval of the size given.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(Self {
            // SAFETY: fd was just created and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            seq: 0,
        })
    }

    /// The uid owning the TCP socket at the other end of a connection that `local` accepted
    /// from `peer`, when that socket is on this host (same network namespace); None for a
    /// remote peer or when the kernel does not answer.
    pub fn tcp_peer_uid(&mut self, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
        let (lip, pip) = (canonical(local.ip()), canonical(peer.ip()));
        let family = match (lip, pip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
            (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
            _ => return None,
        };
        self.seq = self.seq.wrapping_add(1);
        // The peer's socket: its own end is `peer`, its remote end `local`.
        let mut id = InetDiagSockId {
            sport: peer.port().to_be_bytes(),
            dport: local.port().to_be_bytes(),
            cookie: [INET_DIAG_NOCOOKIE; 2],
            ..Default::default()
        };
        put_addr(&mut id.src, pip);
        put_addr(&mut id.dst, lip);
        let req = Request {
            hdr: NlMsgHdr {
                len: size_of::<Request>() as u32,
                kind: SOCK_DIAG_BY_FAMILY,
                flags: libc::NLM_F_REQUEST as u16,
                seq: self.seq,
                pid: 0,
            },
            req: InetDiagReqV2 {
                family: family as u8,
                protocol: libc::IPPROTO_TCP as u8,
                states: !0,
                id,
                ..Default::default()
            },
        };
        let fd = self.fd.as_raw_fd();
        // SAFETY: sends the bytes of a repr(C) request to the kernel (nl_pid 0).
        let sent = unsafe {
            let mut to: libc::sockaddr_nl = std::mem::zeroed();
            to.nl_family = libc::AF_NETLINK as u16;
            libc::sendto(
                fd,
                (&req as *const Request).cast(),
                size_of::<Request>(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent != size_of::<Request>() as isize {
            return None;
        }
        let mut buf = [0u8; 1024];
        loop {
            // SAFETY: receives into our buffer, at most its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < size_of::<NlMsgHdr>() as isize {
                return None;
            }
            // SAFETY: at least a header was received; read unaligned from the byte buffer.
            let hdr: NlMsgHdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
            if hdr.seq != self.seq {
                // An answer to an earlier request that timed out: skip it.
                continue;
            }
            if hdr.kind == NLMSG_ERROR
                || (n as usize) < size_of::<NlMsgHdr>() + size_of::<InetDiagMsg>()
            {
                return None;
            }
            // SAFETY: the message holds a whole inet_diag_msg after the header.
            let msg: InetDiagMsg =
                unsafe { std::ptr::read_unaligned(buf[size_of::<NlMsgHdr>()..].as_ptr().cast()) };
            return Some(msg.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn struct_sizes_match_the_kernels() {
        assert_eq!(size_of::<NlMsgHdr>(), 16);
        assert_eq!(size_of::<InetDiagSockId>(), 48);
        assert_eq!(size_of::<InetDiagReqV2>(), 56);
        assert_eq!(size_of::<InetDiagMsg>(), 72);
    }

    /// A loopback connection of this process: the kernel names our own uid; a made-up remote
    /// peer is not found.
    #[test]
    fn finds_the_uid_of_a_local_peer_and_none_for_a_remote_one() {
        let mut diag = SockDiag::open().expect("sock_diag socket");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = TcpListener::bind(bind) else {
                eprintln!("skipped {bind}: cannot bind here");
                continue;
            };
            let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, peer) = l.accept().unwrap();
            let local = s.local_addr().unwrap();
            assert_eq!(diag.tcp_peer_uid(local, peer), Some(me), "{bind}");
            let remote: SocketAddr = match peer {
                SocketAddr::V4(_) => "192.0.2.7:40000".parse().unwrap(),
                SocketAddr::V6(_) => "[2001:db8::7]:40000".parse().unwrap(),
            };
            assert_eq!(diag.tcp_peer_uid(local, remote), None, "{bind}");
        }
    }

    /// An IPv4 client of a dual-stack listener arrives as ::ffff:a.b.c.d.
    #[test]
    fn v4_mapped_peers_are_looked_up_as_ipv4() {
        let Ok(l) = TcpListener::bind("[::]:0") else {
            eprintln!("skipped: no IPv6 here");
            return;
        };
        let port = l.local_addr().unwrap().port();
        let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert!(matches!(peer.ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()));
        let mut diag = SockDiag::open().expect("sock_diag socket");
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(diag.tcp_peer_uid(s.local_addr().unwrap(), peer), Some(me));
    }
}
