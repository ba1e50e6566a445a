//! Bad input on the local API: whatever a client writes to the control socket (random bytes,
//! nothing, a 10 MB line, broken or ill-typed JSON, a request cut off, hundreds of connections
//! dropped), it gets an error reply or a closed connection, never a crash or a hang, and the
//! daemon still measures and answers correctly afterwards, with its memory and descriptors
//! back where they were.
use std::{
    fs,
    io::{Read, Write},
    net::Shutdown,
    os::unix::net::UnixStream,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use ethand_tests::{Daemon, measure, serial};
use serde_json::Value;

use crate::workload;

/// Longest a reply may take: the daemon answers bad input at once (the idle-connection
/// timeout is 10 s, checked separately).
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

fn connect(sock: &Path) -> UnixStream {
    let s =
        UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
    s.set_read_timeout(Some(REPLY_TIMEOUT)).expect("timeout");
    s
}

/// Sends `req` (from a thread: a large one may not fit in the socket buffer), closes the
/// write side and reads the whole reply: (reply, how long it took).
fn exchange(sock: &Path, req: Vec<u8>) -> (String, Duration) {
    let mut s = connect(sock);
    let mut w = s.try_clone().expect("clone");
    let t0 = Instant::now();
    let writer = thread::spawn(move || {
        // The daemon stops reading after 64 KiB and closes: the rest may fail (EPIPE).
        let _ = w.write_all(&req);
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut reply = Vec::new();
    let read = s.read_to_end(&mut reply);
    let took = t0.elapsed();
    writer.join().expect("writer");
    match read {
        Ok(_) => {}
        // The daemon closed with part of a long request unread: Linux then resets the
        // connection after the reply has been delivered. The reply is what counts.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && reply.ends_with(b"\n") => {}
        Err(e) => panic!(
            "reading the reply failed after {took:?} ({} bytes so far): {e}",
            reply.len()
        ),
    }
    (String::from_utf8_lossy(&reply).into_owned(), took)
}

/// The error message of a `{"error": "..."}` reply line.
fn error_of(reply: &str) -> Option<String> {
    let v: Value = serde_json::from_str(reply.trim_end()).ok()?;
    v.get("error")?.as_str().map(str::to_string)
}

fn assert_error(sock: &Path, what: &str, req: Vec<u8>, want: &str) {
    let len = req.len();
    let (reply, took) = exchange(sock, req);
    let msg = error_of(&reply)
        .unwrap_or_else(|| panic!("{what}: expected an error reply, got {reply:?}"));
    // Quiet when right: a failure's message then shows at the head of CI's excerpt.
    assert!(
        msg.contains(want),
        "{what} ({len} bytes): error {msg:?} (after {took:?}) does not say {want:?}"
    );
    assert!(
        reply.ends_with('\n') && reply.matches('\n').count() == 1,
        "{what}: one reply line expected: {reply:?}"
    );
}

fn vm_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("daemon status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("daemon fds")
        .count()
}

/// Deterministic noise (xorshift), so that a failure reproduces.
fn noise(len: usize, mut x: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn malformed_api_requests_get_errors_and_the_daemon_keeps_working() {
    let _g = serial();
    let d = Daemon::start("badinput", "");
    let sock = d.socket.clone();
    let dpid = d.pid();
    // A client that connects and says nothing: answered (and closed) after the timeout.
    let mut idle = connect(&sock);
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let idle_t0 = Instant::now();
    thread::sleep(Duration::from_millis(500));
    let rss0 = vm_rss_kib(dpid);
    let fds0 = open_fds(dpid);
    println!("daemon before: VmRSS {rss0} KiB, {fds0} open descriptors");

    for seed in 1..=8u64 {
        let mut bytes = noise(4096, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        // Not UTF-8 in all of them; a line end in the middle in half of them.
        bytes[17] = 0xff;
        if seed % 2 == 0 {
            bytes[100] = b'\n';
        }
        assert_error(
            &sock,
            &format!("random bytes #{seed}"),
            bytes,
            "bad request",
        );
    }
    assert_error(&sock, "empty request", Vec::new(), "empty request");
    assert_error(&sock, "blank line", b"  \n".to_vec(), "empty request");
    let mut huge = vec![b'{'; 10 << 20];
    huge.push(b'\n');
    assert_error(&sock, "10 MB line", huge, "longer than 65536 bytes");
    let mut huge_json = br#"{"cmd":"set_level","level":""#.to_vec();
    huge_json.extend(std::iter::repeat_n(b'x', 1 << 20));
    huge_json.extend(b"\"}\n");
    assert_error(&sock, "1 MB JSON string", huge_json, "longer than");
    for (what, req, want) in [
        ("invalid JSON", "{\"cmd\": \"status\"\n", "bad request"),
        ("not JSON", "status please\n", "bad request"),
        ("JSON array", "[1, 2, 3]\n", "bad request"),
        ("unknown command", r#"{"cmd":"reboot"}"#, "unknown variant"),
        ("no command", r#"{"pid":1}"#, "missing field `cmd`"),
        (
            "pid as a string",
            r#"{"cmd":"snapshot","pid":"1","window_s":10}"#,
            "invalid type",
        ),
        (
            "missing pid",
            r#"{"cmd":"snapshot","window_s":10}"#,
            "missing field `pid`",
        ),
        (
            "level as a number",
            r#"{"cmd":"set_level","level":5}"#,
            "invalid type",
        ),
        (
            "unknown level",
            r#"{"cmd":"set_level","level":"max"}"#,
            "unknown level",
        ),
        (
            "negative pid",
            r#"{"cmd":"snapshot","pid":-1,"window_s":10}"#,
            "invalid value",
        ),
        (
            "pid over 2^32",
            r#"{"cmd":"snapshot","pid":4294967296,"window_s":10}"#,
            "invalid value",
        ),
        (
            "pid 1e300",
            r#"{"cmd":"snapshot","pid":1e300,"window_s":10}"#,
            "invalid type",
        ),
        (
            "negative window",
            r#"{"cmd":"snapshot","pid":1,"window_s":-5}"#,
            "invalid value",
        ),
        (
            "deeply nested JSON",
            // Under the size limit: refused as a whole, no recursion into it.
            &format!("{}{}\n", "[".repeat(20_000), "]".repeat(20_000)),
            "bad request",
        ),
    ] {
        assert_error(&sock, what, req.as_bytes().to_vec(), want);
    }
    // Well-formed but naming no process: "not found", not an error or a crash.
    for pid in [0u32, u32::MAX] {
        let req = format!("{{\"cmd\":\"snapshot\",\"pid\":{pid},\"window_s\":10}}\n");
        let (reply, _) = exchange(&sock, req.into_bytes());
        let v: Value = serde_json::from_str(&reply).expect("JSON reply");
        println!("snapshot of pid {pid}: {}", reply.trim_end());
        assert!(v.get("not_found").is_some(), "pid {pid}: {reply}");
    }
    // The largest window: answered with the daemon's own process, no overflow.
    let req = format!(
        "{{\"cmd\":\"snapshot\",\"pid\":{dpid},\"window_s\":{}}}\n",
        u64::MAX
    );
    let (reply, _) = exchange(&sock, req.into_bytes());
    let v: Value = serde_json::from_str(&reply).expect("JSON reply");
    assert_eq!(
        v["ok"]["root_pid"].as_u64(),
        Some(u64::from(dpid)),
        "window_s = u64::MAX: {}",
        &reply[..reply.len().min(300)]
    );

    // A request cut mid-way, write side closed: an error reply.
    assert_error(
        &sock,
        "cut request",
        br#"{"cmd":"snapshot","pi"#.to_vec(),
        "EOF while parsing",
    );
    // A request cut mid-way and the whole connection closed: nothing to answer to.
    for _ in 0..20 {
        let mut s = connect(&sock);
        s.write_all(br#"{"cmd":"sta"#).expect("write");
        drop(s);
    }
    // 200 connections opened at once, some with half a request, then all dropped.
    let conns: Vec<UnixStream> = (0..200)
        .map(|i| {
            let mut s = connect(&sock);
            // Beyond daemon.api_max_connections (64) the daemon answers "busy" and closes
            // at once: the write may then find the connection closed (EPIPE).
            if i % 3 == 0 {
                let _ = s.write_all(br#"{"cmd":"snapshot","pid":"#);
            }
            s
        })
        .collect();
    let open_with_200 = open_fds(dpid);
    drop(conns);
    println!("200 connections: daemon held {open_with_200} descriptors, then they were dropped");

    // Still working: status answers, and a measurement with known ground truth is exact.
    let st = d.status();
    assert!(!st.probes.is_empty(), "status lists no probes");
    let mut w = workload(&["syscalls", "5000", "0"]);
    let m = measure(&d, &mut w);
    let getpids = m.syscall_delta(w.pid, libc::SYS_getpid);
    w.finish();
    println!("after the bad input: getpid counted {getpids:?} of 5000");
    assert_eq!(
        getpids,
        (5000, 0),
        "getpid (count, errors) after the bad input"
    );

    // The idle client is answered and closed by the daemon's request timeout.
    let mut reply = String::new();
    idle.read_to_string(&mut reply)
        .expect("idle connection: the daemon neither answered nor closed it within 20 s");
    let idle_took = idle_t0.elapsed();
    println!(
        "idle connection answered after {idle_took:?}: {}",
        reply.trim_end()
    );
    assert!(
        error_of(&reply).is_some_and(|m| m.contains("no request line")),
        "idle connection: {reply:?}"
    );
    assert!(
        idle_took >= Duration::from_secs(9),
        "closed too early: {idle_took:?}"
    );

    // Nothing kept: descriptors back to the baseline, memory not grown by the 10 MB line.
    let t0 = Instant::now();
    let mut fds = open_fds(dpid);
    while fds >= fds0 && t0.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(100));
        fds = open_fds(dpid);
    }
    let rss = vm_rss_kib(dpid);
    println!("daemon after: VmRSS {rss} KiB, {fds} open descriptors (before: {rss0} KiB, {fds0})");
    // The baseline counted the idle connection, closed now.
    assert!(
        fds <= fds0,
        "descriptors leaked: {fds0} before, {fds} after"
    );
    assert!(
        rss < rss0 + 32 * 1024,
        "VmRSS grew from {rss0} KiB to {rss} KiB"
    );
    assert!(
        !d.log_text().contains("panicked"),
        "the daemon logged a panic:\n{}",
        d.log_text()
    );
}
