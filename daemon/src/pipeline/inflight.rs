//! What a tree's live threads are doing at the snapshot: their state from /proc and the
//! syscall each is blocked in, timed from the probes' entry time (an in-flight wait is
//! otherwise counted only when it ends, so a process stuck in read() would show nothing).
use std::collections::HashMap;

use ethand_snapshot::{InFlightSyscall, ProcessSnapshot, ThreadNow, ThreadSnapshot};

use crate::pipeline::{peers, procinfo, syscalls_table};

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

/// Waits a thread chooses rather than waits for a peer: timed sleeps, waits for signals,
/// and the event loops' waits for any of their descriptors (an event loop with nothing to
/// do waits there, with or without a timeout).
const IDLE_WAITS: &[&str] = &[
    "nanosleep",
    "clock_nanosleep",
    "pause",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "select",
    "pselect6",
    "poll",
    "ppoll",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
];

/// Whether syscall `name` with arguments `args` (as /proc's `syscall` file gives them) is an
/// idle wait. A poll of one descriptor without a timeout waits for that descriptor's peer
/// like a read: not idle.
pub fn idle_wait(name: &str, args: &[u64; 6]) -> bool {
    match name {
        // poll(fds, nfds, timeout_ms): a negative timeout waits forever.
        "poll" => !(args[1] == 1 && (args[2] as i32) < 0),
        // ppoll(fds, nfds, tmo_p, ...): no timespec waits forever.
        "ppoll" => !(args[1] == 1 && args[2] == 0),
        _ => IDLE_WAITS.contains(&name),
    }
}

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
    let listed_all = tids.len() < max;
    let mut read = Vec::with_capacity(tids.len());
    for tid in tids {
        let Some(now) = procinfo::thread_now(p.pid, tid) else {
            continue;
        };
        read.push(tid);
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
                idle: idle_wait(&name, &args),
                name,
                elapsed_ns,
                elapsed_at_least_ns,
                peer: None,
            }
        });
        let state = ThreadNow {
            state: procinfo::state_name(now.state).to_string(),
            syscall,
        };
        match p.threads.iter_mut().find(|t| t.tid == tid) {
            Some(t) => t.now = Some(state),
            None => {
                // Never switched out since ethand first saw its process: off its CPU (not
                // running now) all that time, which the window's figures cannot hold yet.
                if now.state != 'R'
                    && let Some(w) = p.window.as_mut()
                {
                    w.offcpu_blocked_ns += w.duration_ms.min(known_ms) * 1_000_000;
                }
                p.threads.push(ThreadSnapshot {
                    tid,
                    comm: procinfo::thread_comm(p.pid, tid).unwrap_or_default(),
                    alive: true,
                    sched: Default::default(),
                    now: Some(state),
                })
            }
        }
    }
    // A thread the model still holds alive that /proc no longer lists (or whose state could
    // not be read) exited since the last round: it has no "now".
    if listed_all {
        for t in p.threads.iter_mut().filter(|t| t.alive && t.now.is_none()) {
            if !read.contains(&t.tid) {
                t.alive = false;
            }
        }
    }
}

/// Names the peer of every wait of the tree's threads on a pipe or socket that is not idle
/// (see [`crate::pipeline::peers`]): one scan of the node's descriptors for all of them.
pub fn name_peers(processes: &mut [ProcessSnapshot]) {
    let mut waits = Vec::new();
    let mut at = Vec::new();
    for (i, p) in processes.iter().enumerate() {
        for (j, th) in p.threads.iter().enumerate() {
            let Some(sc) = th.now.as_ref().and_then(|n| n.syscall.as_ref()) else {
                continue;
            };
            let (Some(fd), Some(file)) = (sc.fd, sc.file.as_ref()) else {
                continue;
            };
            if sc.idle || !(file.starts_with("pipe:[") || file.starts_with("socket:[")) {
                continue;
            }
            waits.push(peers::Wait {
                pid: p.pid,
                fd,
                file: file.clone(),
                reads: peers::reads(&sc.name),
            });
            at.push((i, j));
        }
    }
    if waits.is_empty() {
        return;
    }
    let tree: Vec<u32> = processes
        .iter()
        .filter(|p| p.alive)
        .map(|p| p.pid)
        .collect();
    for ((i, j), peer) in at.into_iter().zip(peers::describe(&waits, &tree)) {
        if let Some(sc) = processes[i].threads[j]
            .now
            .as_mut()
            .and_then(|n| n.syscall.as_mut())
        {
            sc.peer = peer;
        }
    }
}
