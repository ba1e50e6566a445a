//! A process's own I/O accounting (/proc/PID/io): kernel-formatted text, read bounded. Read
//! for a tree snapshot's live processes only (one small read each, outside the model lock).
use std::io::Read;

/// /proc/PID/io is seven short lines (~100 bytes); anything longer is not that file.
const PROC_IO_MAX: u64 = 1024;

/// `write_bytes` of /proc/PID/io: bytes the process caused to be sent to storage (its dirtied
/// page-cache pages and direct writes), since it started. None when the file cannot be read
/// (gone, or no ptrace-read access to it) or has no such line.
pub fn write_bytes(pid: u32) -> Option<u64> {
    let mut text = String::new();
    std::fs::File::open(format!("/proc/{pid}/io"))
        .ok()?
        .take(PROC_IO_MAX)
        .read_to_string(&mut text)
        .ok()?;
    parse_write_bytes(&text)
}

pub fn parse_write_bytes(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_write_bytes() {
        let io = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 40960\ncancelled_write_bytes: 0\n";
        assert_eq!(super::parse_write_bytes(io), Some(40960));
        assert_eq!(super::parse_write_bytes("rchar: 1\n"), None);
        // Our own file: readable, and this test binary has written nothing it must count.
        assert!(super::write_bytes(std::process::id()).is_some());
    }
}
