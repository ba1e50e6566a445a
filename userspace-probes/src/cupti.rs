//! The daemon's side of the switch of `libethand_cupti.so` (cupti/ethand_cupti.h): the control
//! file, written here and mapped read-only by every injected process, which finds its slot by
//! its pid namespace and pid, and sleeps on the header's futex word until the slot changes.
//!
//! The file is replaced whole at creation (a new inode: libraries of a previous daemon notice
//! and map the new one within 5 s) and is world-readable and writable by its owner only: what
//! it says is which processes the daemon wants traced, nothing secret. One writer per
//! directory: whoever creates the file holds [`ControlLock`] first, for as long as it writes
//! (a standalone `ethand snapshot` beside a running daemon must not replace the daemon's file,
//! or every job started after it would follow a file nobody writes).
use std::{
    fs::File,
    io,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering, fence},
};

use ethand_common::{CUPTI_ABI, CUPTI_CTL_MAGIC, CUPTI_SLOTS, CuptiCtlHeader, CuptiSlot};

/// A process as the library sees itself: its pid namespace's inode and its pid there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessKey {
    pub pidns_ino: u64,
    pub nspid: u32,
}

impl ProcessKey {
    /// The key of host pid `pid`: `/proc/PID/ns/pid`'s inode and the last `NSpid` field.
    pub fn of(pid: u32) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let pidns_ino = std::fs::metadata(format!("/proc/{pid}/ns/pid"))?.ino();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("/proc/{pid}/status: no NSpid")))?;
        Ok(Self { pidns_ino, nspid })
    }
}

/// What a window records and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRequest {
    pub window_id: u64,
    pub deadline_mono_ns: u64,
    /// `ethand_common::cupti_kinds` bits.
    pub kinds: u32,
    /// 0: no limit but the deadline.
    pub max_records: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot create the CUPTI control file {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("all {CUPTI_SLOTS} CUPTI window slots are in use")]
    Full,
    #[error("cannot lock {}: {source}", path.display())]
    Lock { path: PathBuf, source: io::Error },
    #[error("{} is held by another ethand{}: it owns GPU activity recording in that directory", path.display(), holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Owned { path: PathBuf, holder: Option<u32> },
}

/// The name of the lock beside the control file.
pub const LOCK_NAME: &str = "ethand-cupti.lock";

/// The right to write a directory's control file: an exclusive `flock` on its lock file,
/// held while this value lives (released by the kernel when the holder dies, however).
pub struct ControlLock {
    _file: File,
}

impl ControlLock {
    /// Takes `dir`'s lock without waiting; [`ControlError::Owned`] names the holder's pid
    /// (as it wrote it) when another process has it.
    pub fn acquire(dir: &Path) -> Result<Self, ControlError> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let path = dir.join(LOCK_NAME);
        let err = |source| ControlError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(err)?;
        if !file.metadata().map_err(err)?.is_file() {
            return Err(err(io::Error::other("not a regular file")));
        }
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err(e));
            }
            // The holder's pid, as it wrote it: a few digits, read bounded.
            let mut text = String::new();
            let _ = (&mut file).take(16).read_to_string(&mut text);
            return Err(ControlError::Owned {
                path: path.clone(),
                holder: text.trim().parse().ok(),
            });
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(err)?;
        Ok(Self { _file: file })
    }
}

/// The control file, mapped read-write.
pub struct ControlFile {
    path: PathBuf,
    map: *mut u8,
    len: usize,
    _file: File,
}

// SAFETY: the mapping is owned by this value and only written through `&mut self`.
unsafe impl Send for ControlFile {}

const HEADER: usize = size_of::<CuptiCtlHeader>();
const SLOT: usize = size_of::<CuptiSlot>();
const LEN: usize = HEADER + CUPTI_SLOTS as usize * SLOT;

impl ControlFile {
    /// Creates `path` afresh (mode 0644, a new inode) with every slot empty, and maps it.
    pub fn create(path: &Path) -> Result<Self, ControlError> {
        let err = |source| ControlError::Create {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(err)?;
        file.set_len(LEN as u64).map_err(err)?;
        // The umask may have taken bits: readers need read.
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(err)?;
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file of LEN bytes, unmapped in Drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        let ctl = Self {
            path: path.to_path_buf(),
            map: map.cast(),
            len: LEN,
            _file: file,
        };
        let header = CuptiCtlHeader {
            magic: CUPTI_CTL_MAGIC,
            abi: CUPTI_ABI,
            wake_seq: 0,
            nslots: CUPTI_SLOTS,
            slot_size: SLOT as u32,
            reserved: [0; 5],
        };
        // SAFETY: the header fits at offset 0 of the mapping; the file is not yet visible.
        unsafe { std::ptr::write_volatile(ctl.map.cast::<CuptiCtlHeader>(), header) };
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })?;
        ctl.wake();
        Ok(ctl)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn slot_ptr(&self, i: usize) -> *mut CuptiSlot {
        assert!(i < CUPTI_SLOTS as usize);
        // SAFETY: inside the mapping (checked above).
        unsafe { self.map.add(HEADER + i * SLOT).cast() }
    }

    fn wake_word(&self) -> &AtomicU32 {
        // SAFETY: wake_seq is a 4-byte aligned u32 at offset 12 of the page-aligned mapping.
        unsafe { &*self.map.add(12).cast::<AtomicU32>() }
    }

    /// The slot as last written.
    pub fn slot(&self, i: usize) -> CuptiSlot {
        // SAFETY: inside the mapping; only this process writes it.
        unsafe { std::ptr::read_volatile(self.slot_ptr(i)) }
    }

    /// Writes slot `i` as a seqlock (odd while written) and wakes every library.
    fn write_slot(&mut self, i: usize, key: ProcessKey, req: WindowRequest) {
        let p = self.slot_ptr(i);
        let seq = self.slot(i).seq;
        // SAFETY: `p` is inside the mapping; readers retry while `seq` is odd or changed.
        unsafe {
            let seq_word = &*(p.cast::<AtomicU32>());
            seq_word.store(seq.wrapping_add(1) | 1, Ordering::Release);
            fence(Ordering::Release);
            std::ptr::write_volatile(&raw mut (*p).nspid, key.nspid);
            std::ptr::write_volatile(&raw mut (*p).pidns_ino, key.pidns_ino);
            std::ptr::write_volatile(&raw mut (*p).window_id, req.window_id);
            std::ptr::write_volatile(&raw mut (*p).deadline_mono_ns, req.deadline_mono_ns);
            std::ptr::write_volatile(&raw mut (*p).kinds, req.kinds);
            std::ptr::write_volatile(&raw mut (*p).max_records, req.max_records);
            fence(Ordering::Release);
            seq_word.store((seq.wrapping_add(1) | 1).wrapping_add(1), Ordering::Release);
        }
        self.wake();
    }

    /// Asks `key`'s library to record `req` (replacing what its slot asked). The slot of an
    /// ended window is reused: one whose deadline passed, or whose window id is 0.
    pub fn open(
        &mut self,
        key: ProcessKey,
        req: WindowRequest,
        now_mono_ns: u64,
    ) -> Result<usize, ControlError> {
        let mut free = None;
        for i in 0..CUPTI_SLOTS as usize {
            let s = self.slot(i);
            if s.nspid == key.nspid && s.pidns_ino == key.pidns_ino && s.window_id != 0 {
                self.write_slot(i, key, req);
                return Ok(i);
            }
            if free.is_none() && (s.window_id == 0 || s.deadline_mono_ns <= now_mono_ns) {
                free = Some(i);
            }
        }
        let i = free.ok_or(ControlError::Full)?;
        self.write_slot(i, key, req);
        Ok(i)
    }

    /// Ends `key`'s window if its slot still holds `window_id`.
    pub fn close(&mut self, key: ProcessKey, window_id: u64) {
        for i in 0..CUPTI_SLOTS as usize {
            let s = self.slot(i);
            if s.nspid == key.nspid && s.pidns_ino == key.pidns_ino && s.window_id == window_id {
                let empty = WindowRequest {
                    window_id: 0,
                    deadline_mono_ns: 0,
                    kinds: 0,
                    max_records: 0,
                };
                self.write_slot(
                    i,
                    ProcessKey {
                        pidns_ino: 0,
                        nspid: 0,
                    },
                    empty,
                );
            }
        }
    }

    /// One more on the futex word and a wake of every waiter (shared futex: keyed by the
    /// file, so the libraries' read-only mappings are woken too).
    fn wake(&self) {
        let w = self.wake_word();
        w.fetch_add(1, Ordering::AcqRel);
        // SAFETY: FUTEX_WAKE on a valid, mapped u32.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0,
            );
        }
    }
}

impl Drop for ControlFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`.
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> ProcessKey {
        ProcessKey {
            pidns_ino: 4026531836,
            nspid: n,
        }
    }

    fn req(id: u64, deadline: u64) -> WindowRequest {
        WindowRequest {
            window_id: id,
            deadline_mono_ns: deadline,
            kinds: ethand_common::cupti_kinds::ALL,
            max_records: 0,
        }
    }

    /// Slots: a process's second window reuses its slot, ended windows free theirs, and
    /// a full table says so; each write leaves an even sequence and bumps the futex word.
    #[test]
    fn slots_are_reused_and_bounded() {
        let dir = std::env::temp_dir().join(format!("ethand-cupti-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ethand-cupti.ctl");
        let mut ctl = ControlFile::create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, LEN);
        let w0 = ctl.wake_word().load(Ordering::Relaxed);
        let a = ctl.open(key(10), req(1, 100), 50).unwrap();
        assert_eq!(ctl.open(key(10), req(2, 200), 50).unwrap(), a);
        assert_eq!(ctl.slot(a).window_id, 2);
        assert_eq!(ctl.slot(a).seq % 2, 0);
        assert_eq!(ctl.wake_word().load(Ordering::Relaxed), w0 + 2);
        for n in 11..10 + CUPTI_SLOTS {
            ctl.open(key(n), req(3, 100), 50).unwrap();
        }
        assert!(matches!(
            ctl.open(key(999), req(4, 100), 50),
            Err(ControlError::Full)
        ));
        // Deadlines passed: slots free again.
        assert!(ctl.open(key(999), req(4, 300), 150).is_ok());
        ctl.close(key(10), 2);
        assert_eq!(ctl.slot(a).window_id, 0);
        // A second daemon replaces the file: a new inode.
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&path).unwrap().ino();
        drop(ctl);
        let _again = ControlFile::create(&path).unwrap();
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), ino);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// One writer per directory: a second taker is told who holds it, and gets it once the
    /// first lets go; a symlink planted as the lock is refused, not followed.
    #[test]
    fn the_lock_admits_one_writer() {
        let dir = std::env::temp_dir().join(format!("ethand-cupti-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = ControlLock::acquire(&dir).unwrap();
        match ControlLock::acquire(&dir) {
            Err(ControlError::Owned { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()))
            }
            other => panic!("a second writer admitted: {:?}", other.err()),
        }
        drop(first);
        let again = ControlLock::acquire(&dir).unwrap();
        drop(again);
        std::fs::remove_file(dir.join(LOCK_NAME)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(LOCK_NAME)).unwrap();
        assert!(matches!(
            ControlLock::acquire(&dir),
            Err(ControlError::Lock { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
