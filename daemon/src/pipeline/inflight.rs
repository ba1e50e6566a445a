//! What a tree's live threads are doing at the snapshot: their state from /proc and the
//! syscall each is blocked in, timed from the probes' entry time (an in-flight wait is
//! otherwise counted only when it ends, so a process stuck in read() would show nothing).
use std::collections::HashMap;

use ethand_snapshot::{InFlightSyscall, ProcessSnapshot, ThreadNow, ThreadSnapshot};

use crate::pipeline::{procinfo, syscalls_table};

/// Per thread of a process, what the probes last read: the syscall it was in at its last
/// switch-out and when it entered it (CLOCK_MONOTONIC ns).
pub type Entered = HashMap<u32, (u32, u64)>;

/// Syscalls whose first argument is the descriptor they wait on.
const FD_FIRST: &[&str] = &[
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "accept",
    "accept4",
    "connect",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "ioctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "flock",
    "fcntl",
    "getdents64",
    "fallocate",
    "splice",
];

/// Most threads one tree snapshot reads the state of (three small /proc reads each).
pub const TREE_THREADS_MAX: usize = 8192;

/// Fills `now` of `p`'s live threads, adding those the probes have not seen (asleep since
/// before the process was first seen). `entered`: the model's in-flight syscalls of its
/// threads; `known_ms`: how long ethand has known the process (a thread it never saw switch
/// out has been blocked at least that long); `budget`: threads left to read in this tree.
pub fn fill(
    p: &mut ProcessSnapshot,
    entered: &Entered,
    mono_now_ns: u64,
    known_ms: u64,
    budget: &mut usize,
) {
    let max = procinfo::THREADS_NOW_MAX.min(*budget);
    let tids = procinfo::task_ids(p.pid, max);
    *budget -= tids.len();
    for tid in tids {
        let Some(now) = procinfo::thread_now(p.pid, tid) else {
            continue;
        };
        let syscall = now.syscall.map(|(nr, args)| {
            let name = syscalls_table::name(nr);
            let (elapsed_ns, elapsed_at_least_ns) = match entered.get(&tid) {
                Some(&(e_nr, start)) if e_nr == nr && start != 0 => {
                    (Some(mono_now_ns.saturating_sub(start)), None)
                }
                // Entered since the last read (or was never seen to enter): not timed.
                Some(_) => (None, None),
                None => (None, Some(known_ms * 1_000_000)),
            };
            let fd = FD_FIRST
                .contains(&name.as_str())
                .then(|| i32::try_from(args[0]).ok())
                .flatten();
            InFlightSyscall {
                nr,
                file: fd.and_then(|f| procinfo::fd_target(p.pid, f as u64)),
                fd,
                name,
                elapsed_ns,
                elapsed_at_least_ns,
            }
        });
        let state = ThreadNow {
            state: procinfo::state_name(now.state).to_string(),
            syscall,
        };
        match p.threads.iter_mut().find(|t| t.tid == tid) {
            Some(t) => t.now = Some(state),
            None => p.threads.push(ThreadSnapshot {
                tid,
                comm: procinfo::thread_comm(p.pid, tid).unwrap_or_default(),
                alive: true,
                sched: Default::default(),
                now: Some(state),
            }),
        }
    }
}
