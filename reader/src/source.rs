//! One line of a source file a process names (a Python script in its frames, a C file in the
//! DWARF of its binary), read as the process's owner: the worker runs with the owner's
//! credentials and no capability that bypasses file permissions, so a path naming another
//! user's file (a forged `co_filename`, a DWARF `#line`) gets nothing. The path is resolved
//! inside the process's root (`RESOLVE_IN_ROOT`: neither `..` nor a symbolic link leaves it;
//! relative paths from its working directory), only a regular file is opened (a FIFO or a
//! device never is), at most [`MAX_SOURCE_FILE`] bytes of it and lines of at most
//! [`MAX_LINE_BYTES`] are read.
use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
};

use ethand_userspace_probes::procmaps;

/// Longest source line kept (characters).
pub const MAX_SOURCE: usize = 200;
/// Largest source file read for a line (bytes).
pub const MAX_SOURCE_FILE: u64 = 16 << 20;
/// Longest line read before it is cut (bytes).
const MAX_LINE_BYTES: usize = 64 << 10;

/// The directories a process's paths are resolved in.
pub struct Roots {
    pub root: File,
    pub cwd: Option<File>,
}

impl Roots {
    /// `/proc/PID/root` and `/proc/PID/cwd`, as `O_PATH` handles.
    pub fn of(pid: u32) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let root = procmaps::open_root(pid)?;
        let cwd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(format!("/proc/{pid}/cwd"))
            .ok();
        Ok(Self { root, cwd })
    }
}

/// Line `line` (1-based) of `file` as the process sees it, trimmed and cut to
/// [`MAX_SOURCE`] characters; None when it cannot or may not be read.
pub fn line(roots: &Roots, file: &str, line: u32) -> Option<String> {
    if line == 0 || file.is_empty() || file.contains('\0') {
        return None;
    }
    let dir = if file.starts_with('/') {
        &roots.root
    } else {
        roots.cwd.as_ref()?
    };
    let (f, st) = procmaps::open_regular_in_root(dir, file.as_bytes()).ok()?;
    if st.st_size as u64 > MAX_SOURCE_FILE {
        return None;
    }
    nth_line(BufReader::new(f.take(MAX_SOURCE_FILE)), line)
}

/// Line `n` (1-based) of `r`, lines cut at [`MAX_LINE_BYTES`] as they are read.
fn nth_line(mut r: impl BufRead, n: u32) -> Option<String> {
    let mut buf = Vec::new();
    for i in 1..=n {
        buf.clear();
        let mut got = 0usize;
        loop {
            let chunk = r.fill_buf().ok()?;
            if chunk.is_empty() {
                if got == 0 {
                    return None;
                }
                break;
            }
            let (part, used, ended) = match chunk.iter().position(|&c| c == b'\n') {
                Some(p) => (&chunk[..p], p + 1, true),
                None => (chunk, chunk.len(), false),
            };
            if i == n {
                let room = MAX_LINE_BYTES.saturating_sub(buf.len());
                buf.extend_from_slice(&part[..part.len().min(room)]);
            }
            got += used;
            r.consume(used);
            if ended {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let t = text.trim();
    (!t.is_empty()).then(|| t.chars().take(MAX_SOURCE).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_found_trimmed_and_cut() {
        let text = b"import os\n    x = compute()   \n\nlast";
        assert_eq!(nth_line(&text[..], 2).as_deref(), Some("x = compute()"));
        assert_eq!(nth_line(&text[..], 3), None);
        assert_eq!(nth_line(&text[..], 4).as_deref(), Some("last"));
        assert_eq!(nth_line(&text[..], 5), None);
        let long = vec![b'a'; 1 << 20];
        assert_eq!(nth_line(&long[..], 1).unwrap().len(), MAX_SOURCE);
    }

    #[test]
    fn a_line_is_read_inside_the_root_from_regular_files_only() {
        let dir = std::env::temp_dir().join(format!("ethand-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.py"), "a = 1\nb = 2\n").unwrap();
        let c = std::ffi::CString::new(dir.join("fifo.py").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let roots = Roots::of(std::process::id()).unwrap();
        let p = dir.join("t.py");
        assert_eq!(
            line(&roots, p.to_str().unwrap(), 2).as_deref(),
            Some("b = 2")
        );
        // A FIFO is refused at once, never opened.
        let t0 = std::time::Instant::now();
        assert_eq!(line(&roots, dir.join("fifo.py").to_str().unwrap(), 1), None);
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(line(&roots, "/dev/zero", 1), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
