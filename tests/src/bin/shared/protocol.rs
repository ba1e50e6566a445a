//! The stdin/stdout protocol shared by the test binaries (`#[path = "shared/protocol.rs"]
//! mod protocol;`): `ready [k=v ...]` on stdout, one byte on stdin (`go`), the work, `done
//! [k=v ...]`, then blocking until stdin closes. Raw reads of stdin, never buffered: a byte the
//! test sends later must not be swallowed by an earlier read.
use std::io::Write as _;

/// Exits with 101, naming `bin`.
pub fn fail(bin: &str, msg: &str) -> ! {
    eprintln!("{bin}: {msg}");
    std::process::exit(101)
}

/// One protocol line on stdout (line-buffered: one write).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Blocks for one byte on stdin; false when stdin closed first.
pub fn wait_byte() -> bool {
    let mut b = [0u8; 1];
    // SAFETY: reading into a valid 1-byte buffer.
    unsafe { libc::read(0, b.as_mut_ptr().cast(), 1) == 1 }
}

/// Blocks until stdin is closed (the test has taken its snapshots).
pub fn wait_release() {
    let mut b = [0u8; 64];
    // SAFETY: reading into a valid buffer.
    while unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) } > 0 {}
}
