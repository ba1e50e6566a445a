//! Block I/O, I/O wait, the network and memory pressure.
use ethand_snapshot::ProcessSnapshot;

use super::{HowToGet, Signal, Unit};

/// Syscalls whose time is I/O wait.
const RW_SYSCALLS: &[&str] = &[
    "read",
    "pread64",
    "readv",
    "preadv",
    "preadv2",
    "write",
    "pwrite64",
    "writev",
    "pwritev",
    "pwritev2",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "io_getevents",
    "io_pgetevents",
    "io_uring_enter",
];

/// The write family with the syncs, as `syscalls_table::io_direction` (the daemon's window
/// figures) names them: read by name here for files without those figures.
const WRITE_SYSCALLS: &[&str] = &[
    "write",
    "pwrite64",
    "writev",
    "pwritev",
    "pwritev2",
    "fsync",
    "fdatasync",
    "sync_file_range",
];
const READ_SYSCALLS: &[&str] = &["read", "pread64", "readv", "preadv", "preadv2"];

/// (read, write-and-sync) syscall time of the tree: over the window where the processes'
/// windows have it, else over the processes' counted life (a standalone snapshot, an older
/// file).
fn read_write_syscall_ns(c: &super::Ctx) -> (u64, u64) {
    let windowed: Vec<(u64, u64)> = c
        .windows
        .iter()
        .filter_map(|w| Some((w.io_read_syscall_ns?, w.io_write_syscall_ns?)))
        .collect();
    if !windowed.is_empty() {
        return windowed
            .into_iter()
            .fold((0, 0), |(r, w), (a, b)| (r + a, w + b));
    }
    let rows = c.t.processes.iter().flat_map(|p| p.syscalls.by_nr.iter());
    rows.fold((0, 0), |(r, w), row| {
        if READ_SYSCALLS.contains(&row.name.as_str()) {
            (r + row.time_ns, w)
        } else if WRITE_SYSCALLS.contains(&row.name.as_str()) {
            (r, w + row.time_ns)
        } else {
            (r, w)
        }
    })
}

pub(super) const SIGNALS: &[Signal] = &[
    Signal {
        name: "io.wait_ratio",
        unit: Unit::Ratio,
        doc: "per process, time in read/write-class syscalls against its longest-lived thread's time; the worst process",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            c.worst_share_of_life(&|p| {
                p.syscalls
                    .by_nr
                    .iter()
                    .filter(|r| RW_SYSCALLS.contains(&r.name.as_str()))
                    .map(|r| r.time_ns)
                    .sum()
            })
            .map(|v| v.min(1.0))
        },
    },
    Signal {
        name: "io.block_read_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "block reads submitted by the tree",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.block_read_bytes)),
    },
    Signal {
        name: "io.block_write_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "block writes submitted by the tree",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.block_write_bytes)),
    },
    Signal {
        name: "io.block_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "block reads and writes submitted by the tree",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.block_read_bytes) + c.sum(|x| x.block_write_bytes)),
    },
    Signal {
        name: "io.write_wait_share",
        unit: Unit::Ratio,
        doc: "of the tree's time in file read and write syscalls, the share in the write family and the syncs (write, pwrite64, writev, pwritev, pwritev2, fsync, fdatasync, sync_file_range) against the read family (read, pread64, readv, preadv, preadv2); over the window (the daemon), else the counted life; absent when the tree spent no time in either. Tells a writer waiting on its writes and fsyncs from a reader",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let (r, w) = read_write_syscall_ns(c);
            (r + w > 0).then(|| w as f64 / (r + w) as f64)
        },
    },
    Signal {
        name: "io.block_write_share",
        unit: Unit::Ratio,
        doc: "of the block bytes the tree submitted in the window, the share written (journal and metadata included); absent when it moved none",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let (r, w) = (
                c.sum(|x| x.block_read_bytes),
                c.sum(|x| x.block_write_bytes),
            );
            (r + w > 0.0).then(|| w / (r + w))
        },
    },
    Signal {
        name: "io.block_service_seconds_per_op",
        unit: Unit::Seconds,
        doc: "mean device time per request",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let (ops, svc): (u64, u64) =
                c.t.processes
                    .iter()
                    .flat_map(|p| p.block.iter())
                    .fold((0, 0), |(o, s), b| (o + b.ops, s + b.service_ns));
            (ops > 0).then(|| svc as f64 / 1e9 / ops as f64)
        },
    },
    Signal {
        name: "io.disk_busy_ratio",
        unit: Unit::Ratio,
        doc: "per process, the device time of its block requests against its longest-lived thread's time (at most 1); the worst process. Tells a process waiting on the disk from one reading the page cache that sees a few evicted pages read again",
        how_to_get: HowToGet::Measured,
        // Time in read() alone cannot tell the disk from the page cache, and a few requests
        // of a process that reads from the cache move a MiB/s without the disk being its
        // bottleneck.
        compute: |c| {
            c.worst_share_of_life(&|p: &ProcessSnapshot| p.block.iter().map(|b| b.service_ns).sum())
                .map(|v| v.min(1.0))
        },
    },
    Signal {
        name: "net.tx_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "TCP and UDP bytes sent",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.net_tx_bytes)),
    },
    Signal {
        name: "net.rx_bytes_per_second",
        unit: Unit::BytesPerSecond,
        doc: "TCP and UDP bytes received",
        how_to_get: HowToGet::Measured,
        compute: |c| c.per_second(c.sum(|x| x.net_rx_bytes)),
    },
    Signal {
        name: "net.tcp_retransmits",
        unit: Unit::Count,
        doc: "retransmitted TCP segments",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(c.t.total.net.tcp_retransmits as f64),
    },
    Signal {
        name: "net.tcp_tx_bytes",
        unit: Unit::Bytes,
        doc: "TCP bytes sent",
        how_to_get: HowToGet::Measured,
        compute: |c| Some(c.t.total.net.tcp_tx_bytes as f64),
    },
    Signal {
        name: "net.retransmits_per_mib",
        unit: Unit::Count,
        doc: "retransmits per MiB sent",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let n = &c.t.total.net;
            Some(n.tcp_retransmits as f64 / (n.tcp_tx_bytes as f64 / 1048576.0).max(1.0 / 1024.0))
        },
    },
    Signal {
        name: "mem.swap_bytes",
        unit: Unit::Bytes,
        doc: "swapped-out memory of the tree's live processes, from /proc when the snapshot was taken (kept in it, so `ethand diagnose` reads the same later)",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let live = c.t.processes.iter().filter(|p| p.alive);
            let known: Vec<u64> = live.filter_map(|p| p.swap_bytes).collect();
            (!known.is_empty()).then(|| known.iter().sum::<u64>() as f64)
        },
    },
    Signal {
        name: "mem.major_faults_per_second",
        unit: Unit::PerSecond,
        doc: "major faults per second of life of the tree's live processes, read as `mem.swap_bytes`",
        how_to_get: HowToGet::Measured,
        compute: |c| {
            let t = c.t;
            let now_s = t.taken_at_unix_ms as f64 / 1000.0;
            let live: Vec<&ProcessSnapshot> = t.processes.iter().filter(|p| p.alive).collect();
            live.iter().any(|p| p.major_faults.is_some()).then(|| {
                live.iter()
                    .filter(|p| p.start_time_unix_s > 0)
                    .filter_map(|p| {
                        let age = now_s - p.start_time_unix_s as f64;
                        let faults = p.major_faults?;
                        (age > 0.0).then(|| faults as f64 / age)
                    })
                    .sum()
            })
        },
    },
];
