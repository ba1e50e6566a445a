//! Syscall names and histogram classes for this architecture, from libc's SYS_* constants
//! (so a misspelt name fails to compile instead of lying at run time).
use ethand_common::syscall_class as class;

macro_rules! table {
    ($($name:ident),* $(,)?) => {
        &[$((libc::$name as u32, strip(stringify!($name)))),*]
    };
}

const fn strip(s: &'static str) -> &'static str {
    // "SYS_read" -> "read"
    let (_, rest) = s.as_bytes().split_at(4);
    match core::str::from_utf8(rest) {
        Ok(r) => r,
        Err(_) => s,
    }
}

#[cfg(target_arch = "x86_64")]
const NAMES: &[(u32, &str)] = table!(
    SYS_read,
    SYS_write,
    SYS_open,
    SYS_close,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_poll,
    SYS_lseek,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_brk,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_ioctl,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_access,
    SYS_pipe,
    SYS_select,
    SYS_sched_yield,
    SYS_mremap,
    SYS_msync,
    SYS_mincore,
    SYS_madvise,
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_dup,
    SYS_dup2,
    SYS_pause,
    SYS_nanosleep,
    SYS_getitimer,
    SYS_alarm,
    SYS_setitimer,
    SYS_getpid,
    SYS_sendfile,
    SYS_socket,
    SYS_connect,
    SYS_accept,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_bind,
    SYS_listen,
    SYS_getsockname,
    SYS_getpeername,
    SYS_socketpair,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_clone,
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_exit,
    SYS_wait4,
    SYS_kill,
    SYS_uname,
    SYS_fcntl,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_ftruncate,
    SYS_getdents,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_creat,
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_readlink,
    SYS_chmod,
    SYS_fchmod,
    SYS_chown,
    SYS_fchown,
    SYS_umask,
    SYS_gettimeofday,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_times,
    SYS_ptrace,
    SYS_getuid,
    SYS_getgid,
    SYS_setuid,
    SYS_setgid,
    SYS_geteuid,
    SYS_getegid,
    SYS_setpgid,
    SYS_getppid,
    SYS_getpgrp,
    SYS_setsid,
    SYS_getgroups,
    SYS_setgroups,
    SYS_sigaltstack,
    SYS_statfs,
    SYS_fstatfs,
    SYS_getpriority,
    SYS_setpriority,
    SYS_sched_setparam,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_sched_getscheduler,
    SYS_mlock,
    SYS_munlock,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_setrlimit,
    SYS_sync,
    SYS_mount,
    SYS_umount2,
    SYS_gettid,
    SYS_readahead,
    SYS_getxattr,
    SYS_fgetxattr,
    SYS_tkill,
    SYS_time,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_submit,
    SYS_getdents64,
    SYS_set_tid_address,
    SYS_fadvise64,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_exit_group,
    SYS_epoll_wait,
    SYS_epoll_ctl,
    SYS_tgkill,
    SYS_waitid,
    SYS_inotify_add_watch,
    SYS_openat,
    SYS_mkdirat,
    SYS_newfstatat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_readlinkat,
    SYS_faccessat,
    SYS_pselect6,
    SYS_ppoll,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_splice,
    SYS_tee,
    SYS_sync_file_range,
    SYS_epoll_pwait,
    SYS_timerfd_create,
    SYS_fallocate,
    SYS_timerfd_settime,
    SYS_accept4,
    SYS_eventfd2,
    SYS_epoll_create1,
    SYS_dup3,
    SYS_pipe2,
    SYS_preadv,
    SYS_pwritev,
    SYS_perf_event_open,
    SYS_recvmmsg,
    SYS_prlimit64,
    SYS_sendmmsg,
    SYS_getcpu,
    SYS_process_vm_readv,
    SYS_sched_setattr,
    SYS_getrandom,
    SYS_memfd_create,
    SYS_bpf,
    SYS_execveat,
    SYS_membarrier,
    SYS_copy_file_range,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_statx,
    SYS_rseq,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_pidfd_open,
    SYS_clone3,
    SYS_close_range,
    SYS_openat2,
    SYS_faccessat2,
    SYS_epoll_pwait2,
    SYS_futex_waitv,
    SYS_mmap,
    SYS_epoll_create,
    SYS_inotify_init1,
    SYS_signalfd4,
);

#[cfg(not(target_arch = "x86_64"))]
const NAMES: &[(u32, &str)] = &[];

/// Name of syscall `nr`, or "syscall_<nr>" when not in the table; the kernel side's shared
/// keys by what they hold.
pub fn name(nr: u32) -> String {
    match nr {
        ethand_common::SYSCALL_NR_UNIMPLEMENTED => return "[unimplemented]".into(),
        ethand_common::SYSCALL_NR_OVER_LIMIT => return "[over the per-process limit]".into(),
        _ => {}
    }
    NAMES
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("syscall_{nr}"))
}

/// (syscall number, class) for every syscall that gets a latency histogram.
pub fn classes() -> Vec<(u32, u8)> {
    use libc::*;
    let groups: &[(u8, &[i64])] = &[
        (
            class::READ_WRITE,
            &[
                SYS_read,
                SYS_write,
                SYS_readv,
                SYS_writev,
                SYS_pread64,
                SYS_pwrite64,
                SYS_preadv,
                SYS_pwritev,
                SYS_preadv2,
                SYS_pwritev2,
                SYS_sendfile,
                SYS_splice,
                SYS_copy_file_range,
            ],
        ),
        (class::FUTEX, &[SYS_futex, SYS_futex_waitv]),
        (
            class::POLL,
            &[
                SYS_poll,
                SYS_ppoll,
                SYS_select,
                SYS_pselect6,
                SYS_epoll_wait,
                SYS_epoll_pwait,
                SYS_epoll_pwait2,
            ],
        ),
        (class::SLEEP, &[SYS_nanosleep, SYS_clock_nanosleep]),
        (class::IO_URING, &[SYS_io_uring_enter]),
        (
            class::OPEN_CLOSE_SYNC,
            &[
                SYS_open,
                SYS_openat,
                SYS_openat2,
                SYS_creat,
                SYS_close,
                SYS_fsync,
                SYS_fdatasync,
                SYS_sync_file_range,
            ],
        ),
        (
            class::NET,
            &[
                SYS_sendto,
                SYS_recvfrom,
                SYS_sendmsg,
                SYS_recvmsg,
                SYS_sendmmsg,
                SYS_recvmmsg,
                SYS_accept,
                SYS_accept4,
                SYS_connect,
            ],
        ),
    ];
    groups
        .iter()
        .flat_map(|(c, nrs)| nrs.iter().map(move |n| (*n as u32, *c)))
        .collect()
}

/// Which way a file-I/O syscall moves data: the read family, or the write family with the
/// syncs (write, pwrite, writev, fsync, fdatasync, sync_file_range); None for the rest
/// (io_uring and AIO calls carry both).
pub fn io_direction(nr: u32) -> Option<IoDirection> {
    const READS: [libc::c_long; 5] = [
        libc::SYS_read,
        libc::SYS_pread64,
        libc::SYS_readv,
        libc::SYS_preadv,
        libc::SYS_preadv2,
    ];
    const WRITES: [libc::c_long; 8] = [
        libc::SYS_write,
        libc::SYS_pwrite64,
        libc::SYS_writev,
        libc::SYS_pwritev,
        libc::SYS_pwritev2,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_sync_file_range,
    ];
    let nr = libc::c_long::from(nr);
    if READS.contains(&nr) {
        Some(IoDirection::Read)
    } else if WRITES.contains(&nr) {
        Some(IoDirection::Write)
    } else {
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDirection {
    Read,
    Write,
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert_eq!(super::name(libc::SYS_getpid as u32), "getpid");
        assert_eq!(super::name(libc::SYS_openat as u32), "openat");
        assert_eq!(super::name(100_000), "syscall_100000");
    }

    #[test]
    fn io_directions() {
        use super::{IoDirection, io_direction};
        assert_eq!(
            io_direction(libc::SYS_pread64 as u32),
            Some(IoDirection::Read)
        );
        assert_eq!(
            io_direction(libc::SYS_fdatasync as u32),
            Some(IoDirection::Write)
        );
        assert_eq!(io_direction(libc::SYS_futex as u32), None);
    }
}
