//! Who is at the other end of a descriptor a thread waits on, where the kernel can tell: the
//! processes holding a pipe open for writing (or reading), the process holding the other end
//! of a local Unix socket (sock_diag's UNIX_DIAG_PEER), a TCP connection's remote address
//! (/proc/PID/net/tcp, tcp6). Read at a snapshot only, for the waits on a pipe or socket;
//! everything read is kernel-formatted /proc text or a netlink answer, bounded.
use std::{
    collections::{HashMap, HashSet},
    fs,
    io::Read,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use super::procinfo;

/// Most descriptor links one snapshot reads looking for the holders of its waits' pipes
/// and sockets (~1 µs each), and the longest it looks.
const FD_LINKS_MAX: usize = 100_000;
const SCAN_DEADLINE: Duration = Duration::from_millis(300);
/// Most holders named per wait.
const HOLDERS_SHOWN: usize = 3;
/// Most bytes of /proc/PID/net/tcp{,6} read (a line is 150 bytes).
const NET_TCP_MAX: u64 = 4 << 20;

/// What a wait is on, and which end of it the waiting thread wants named.
pub struct Wait {
    pub pid: u32,
    pub fd: i32,
    /// "pipe:[INODE]" or "socket:[INODE]".
    pub file: String,
    /// The thread reads (its peer writes), else it writes (its peer reads) or either.
    pub reads: bool,
}

/// Whether a syscall waiting on a descriptor waits to read from it.
pub fn reads(name: &str) -> bool {
    name.starts_with("read")
        || name.starts_with("pread")
        || name.starts_with("recv")
        || name == "accept"
        || name == "accept4"
}

fn inode(file: &str, kind: &str) -> Option<u64> {
    file.strip_prefix(kind)?.strip_suffix(']')?.parse().ok()
}

/// The peer of each wait (same order), where one was found.
pub fn describe(waits: &[Wait], tree: &[u32]) -> Vec<Option<String>> {
    // The inodes whose holders are looked for: the pipes themselves, and the other ends of
    // the Unix sockets.
    let mut unix_peer: HashMap<u64, u64> = HashMap::new();
    let mut diag = UnixDiag::open().ok();
    let mut wanted: HashSet<String> = HashSet::new();
    for w in waits {
        if w.file.starts_with("pipe:[") {
            wanted.insert(w.file.clone());
        } else if let Some(ino) = inode(&w.file, "socket:[")
            && let Some(peer) = diag.as_mut().and_then(|d| d.peer(ino))
        {
            unix_peer.insert(ino, peer);
            wanted.insert(format!("socket:[{peer}]"));
        }
    }
    let (holders, complete) = if wanted.is_empty() {
        (HashMap::new(), true)
    } else {
        holders_of(&wanted, tree)
    };
    waits
        .iter()
        .map(|w| {
            if w.file.starts_with("pipe:[") {
                let ends: Vec<&(u32, i32, u32)> = holders
                    .get(&w.file)?
                    .iter()
                    .filter(|(pid, fd, _)| !(*pid == w.pid && *fd == w.fd))
                    .filter(|(_, _, mode)| match w.reads {
                        true => *mode != libc::O_RDONLY as u32,
                        false => *mode != libc::O_WRONLY as u32,
                    })
                    .collect();
                let what = if w.reads { "writing" } else { "reading" };
                if ends.is_empty() {
                    // Said only when every process's descriptors were looked at.
                    return complete.then(|| format!("no process holds it open for {what}"));
                }
                Some(format!("{} for {what}", name_holders(&ends)))
            } else {
                let ino = inode(&w.file, "socket:[")?;
                match unix_peer.get(&ino) {
                    Some(peer) => {
                        let ends: Vec<&(u32, i32, u32)> = holders
                            .get(&format!("socket:[{peer}]"))
                            .map(|v| v.iter().collect())
                            .unwrap_or_default();
                        if ends.is_empty() {
                            complete.then(|| {
                                format!(
                                    "Unix socket, its other end socket:[{peer}] held by no process"
                                )
                            })
                        } else {
                            Some(format!("Unix socket, other end: {}", name_holders(&ends)))
                        }
                    }
                    None => tcp_remote(w.pid, ino).map(|r| format!("TCP connection to {r}")),
                }
            }
        })
        .collect()
}

/// "pid 12 (sleep) holds it" / "pids 12 (a), 13 (b) hold it".
fn name_holders(ends: &[&(u32, i32, u32)]) -> String {
    let mut pids: Vec<u32> = ends.iter().map(|(p, _, _)| *p).collect();
    pids.dedup();
    let shown: Vec<String> = pids
        .iter()
        .take(HOLDERS_SHOWN)
        .map(|p| {
            format!(
                "{p} ({})",
                procinfo::thread_comm(*p, *p).unwrap_or_default()
            )
        })
        .collect();
    let more = pids.len().saturating_sub(HOLDERS_SHOWN);
    format!(
        "{} {}{} {}",
        if pids.len() == 1 { "pid" } else { "pids" },
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        },
        if pids.len() == 1 {
            "holds it"
        } else {
            "hold it"
        }
    )
}

/// The (pid, fd, access mode) of every descriptor linking to one of `wanted`: the tree's
/// processes first, then every other, within FD_LINKS_MAX links and SCAN_DEADLINE; and
/// whether every process was looked at.
#[allow(clippy::type_complexity)]
fn holders_of(
    wanted: &HashSet<String>,
    tree: &[u32],
) -> (HashMap<String, Vec<(u32, i32, u32)>>, bool) {
    let mut out: HashMap<String, Vec<(u32, i32, u32)>> = HashMap::new();
    let mut pids: Vec<u32> = tree.to_vec();
    if let Ok(dir) = fs::read_dir("/proc") {
        let seen: HashSet<u32> = tree.iter().copied().collect();
        pids.extend(
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|p| !seen.contains(p)),
        );
    }
    let started = Instant::now();
    let mut links = 0usize;
    let mut complete = true;
    for pid in pids {
        if links >= FD_LINKS_MAX || started.elapsed() > SCAN_DEADLINE {
            complete = false;
            break;
        }
        let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in dir.flatten() {
            links += 1;
            if links >= FD_LINKS_MAX {
                break;
            }
            let Ok(target) = fs::read_link(e.path()) else {
                continue;
            };
            let Some(t) = target.to_str().filter(|t| wanted.contains(*t)) else {
                continue;
            };
            let Some(fd) = e.file_name().to_str().and_then(|f| f.parse::<i32>().ok()) else {
                continue;
            };
            let mode =
                fd_flags(pid, fd).map_or(libc::O_RDWR as u32, |f| f & libc::O_ACCMODE as u32);
            out.entry(t.to_string()).or_default().push((pid, fd, mode));
        }
    }
    (out, complete)
}

/// The open flags of a descriptor (/proc/PID/fdinfo/FD, "flags:\t0100002", octal).
fn fd_flags(pid: u32, fd: i32) -> Option<u32> {
    let mut text = String::new();
    fs::File::open(format!("/proc/{pid}/fdinfo/{fd}"))
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    let v = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// The remote address of the TCP socket `ino` of process `pid` (its network namespace's
/// /proc/PID/net/tcp and tcp6), "10.0.0.2:5000" / "[::1]:5000".
fn tcp_remote(pid: u32, ino: u64) -> Option<String> {
    for (file, v6) in [("tcp", false), ("tcp6", true)] {
        let mut text = String::new();
        fs::File::open(format!("/proc/{pid}/net/{file}"))
            .ok()?
            .take(NET_TCP_MAX)
            .read_to_string(&mut text)
            .ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(9).and_then(|i| i.parse::<u64>().ok()) != Some(ino) {
                continue;
            }
            return parse_addr(f.get(2)?, v6);
        }
    }
    None
}

/// "0100007F:1F90" (IPv4, the address's bytes as a host-order u32) -> "127.0.0.1:8080";
/// IPv6 as four such words.
pub fn parse_addr(hex: &str, v6: bool) -> Option<String> {
    let (a, port) = hex.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(a.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    if v6 {
        let mut b = [0u8; 16];
        for i in 0..4 {
            b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
        }
        let ip = std::net::Ipv6Addr::from(b);
        Some(match ip.to_ipv4_mapped() {
            Some(v4) => format!("{v4}:{port}"),
            None => format!("[{ip}]:{port}"),
        })
    } else {
        Some(format!("{}:{port}", std::net::Ipv4Addr::from(word(0)?)))
    }
}

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const UDIAG_SHOW_PEER: u32 = 4;
const UNIX_DIAG_PEER: u16 = 2;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct unix_diag_req`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UnixDiagReq {
    family: u8,
    protocol: u8,
    pad: u16,
    states: u32,
    ino: u32,
    show: u32,
    cookie: [u32; 2],
}

/// `struct unix_diag_msg`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UnixDiagMsg {
    family: u8,
    kind: u8,
    state: u8,
    pad: u8,
    ino: u32,
    cookie: [u32; 2],
}

#[repr(C)]
struct Request {
    hdr: NlMsgHdr,
    req: UnixDiagReq,
}

/// A sock_diag socket asking about Unix sockets (the interface of `ss -x`).
struct UnixDiag {
    fd: OwnedFd,
    seq: u32,
}

impl UnixDiag {
    fn open() -> std::io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
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

    /// The inode of the other end of Unix socket `ino` (None: not a Unix socket of this
    /// network namespace, or unconnected).
    fn peer(&mut self, ino: u64) -> Option<u64> {
        self.seq = self.seq.wrapping_add(1);
        let req = Request {
            hdr: NlMsgHdr {
                len: size_of::<Request>() as u32,
                kind: SOCK_DIAG_BY_FAMILY,
                flags: libc::NLM_F_REQUEST as u16,
                seq: self.seq,
                pid: 0,
            },
            req: UnixDiagReq {
                family: libc::AF_UNIX as u8,
                states: !0,
                ino: u32::try_from(ino).ok()?,
                show: UDIAG_SHOW_PEER,
                cookie: [!0; 2],
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
            let n = n as usize;
            // SAFETY: at least a header was received; read unaligned from the byte buffer.
            let hdr: NlMsgHdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
            if hdr.seq != self.seq {
                continue;
            }
            let body = size_of::<NlMsgHdr>();
            if hdr.kind == NLMSG_ERROR || n < body + size_of::<UnixDiagMsg>() {
                return None;
            }
            let end = (hdr.len as usize).min(n);
            return unix_peer_attr(&buf[body + size_of::<UnixDiagMsg>()..end]);
        }
    }
}

/// The UNIX_DIAG_PEER attribute (a u32 inode) among a unix_diag_msg's attributes.
fn unix_peer_attr(mut attrs: &[u8]) -> Option<u64> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == UNIX_DIAG_PEER && len >= 8 {
            let v = u32::from_ne_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]);
            return (v != 0).then_some(u64::from(v));
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_addresses_parse_as_the_kernel_prints_them() {
        assert_eq!(
            parse_addr("0100007F:1F90", false).as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            parse_addr("0000000000000000FFFF00000100007F:0016", true).as_deref(),
            Some("127.0.0.1:22")
        );
        assert_eq!(
            parse_addr("00000000000000000000000001000000:0050", true).as_deref(),
            Some("[::1]:80")
        );
        assert_eq!(parse_addr("zz:1", false), None);
    }

    /// A pipe whose write end this process holds: named as its writer; the scan of the
    /// node's descriptors is timed.
    #[test]
    fn a_pipe_names_its_writer() {
        use std::os::unix::fs::MetadataExt;
        let mut fds = [0i32; 2];
        // SAFETY: pipe(2) writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created and are owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let ino = fs::metadata(format!("/proc/self/fd/{}", r.as_raw_fd()))
            .expect("fd")
            .ino();
        let me = std::process::id();
        let wait = Wait {
            pid: me,
            fd: r.as_raw_fd(),
            file: format!("pipe:[{ino}]"),
            reads: true,
        };
        let t0 = Instant::now();
        let got = describe(&[wait], &[me]);
        eprintln!("observed: {got:?} in {:?}", t0.elapsed());
        let comm = procinfo::thread_comm(me, me).unwrap_or_default();
        assert_eq!(
            got,
            [Some(format!("pid {me} ({comm}) holds it for writing"))]
        );
        drop(w);
        let wait = Wait {
            pid: me,
            fd: r.as_raw_fd(),
            file: format!("pipe:[{ino}]"),
            reads: true,
        };
        assert_eq!(
            describe(&[wait], &[me]),
            [Some("no process holds it open for writing".to_string())]
        );
    }

    #[test]
    fn a_unix_socket_pair_names_its_other_end() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let ino = |s: &std::os::unix::net::UnixStream| {
            use std::os::unix::fs::MetadataExt;
            let path = format!("/proc/self/fd/{}", s.as_raw_fd());
            fs::metadata(path).expect("fd").ino()
        };
        let mut d = UnixDiag::open().expect("sock_diag");
        assert_eq!(d.peer(ino(&a)), Some(ino(&b)));
        assert_eq!(d.peer(ino(&b)), Some(ino(&a)));
    }
}
