/*
 * The contract between libethand_cupti.so (in the job's process) and the ethand daemon.
 * Mirrored in Rust by ethand-common's `cupti` module, whose unit tests pin every size and
 * offset below. Change both, and ETHAND_CUPTI_ABI, together.
 *
 * Daemon to library: the control file, owned and written by the daemon, mapped read-only by
 * the library. Nothing flows back through it, and the daemon never writes into the job.
 * Library to daemon: three probe functions (ethand_cupti_batch, _name, _window), each an
 * exported noinline function whose arguments are in the calling convention's registers; the
 * daemon's uprobes copy them into a ring buffer. With no uprobe attached a probe costs a call
 * and a return.
 */
#ifndef ETHAND_CUPTI_H
#define ETHAND_CUPTI_H

#include <stdint.h>

#define ETHAND_CUPTI_ABI 2
/* "ETHCUPTI" read as a little-endian u64. */
#define ETHAND_CUPTI_CTL_MAGIC 0x4954505543485445ULL
#define ETHAND_CUPTI_SLOTS 256
/* The control file's name beside the library, unless ETHAND_CUPTI_CTL names another. */
#define ETHAND_CUPTI_CTL_NAME "ethand-cupti.ctl"

/* The control file: this header, then ETHAND_CUPTI_SLOTS slots. */
struct ethand_cupti_ctl_header {
    uint64_t magic;
    uint32_t abi;
    /* A futex word: the daemon adds one after changing any slot and wakes every waiter. */
    uint32_t wake_seq;
    uint32_t nslots;
    uint32_t slot_size;
    uint8_t reserved[40];
};

/* What the daemon asks of one process, found by (pid namespace inode, pid in that
 * namespace). A seqlock: `seq` is odd while the daemon writes the slot. */
struct ethand_cupti_slot {
    uint32_t seq;
    uint32_t nspid;
    uint64_t pidns_ino;
    /* 0: no window. A new id opens a new window. */
    uint64_t window_id;
    /* CLOCK_MONOTONIC: the window closes then at the latest. */
    uint64_t deadline_mono_ns;
    /* ETHAND_CUPTI_KIND_* bits. */
    uint32_t kinds;
    /* The window closes after this many records (0: no limit beyond the deadline). */
    uint32_t max_records;
    uint8_t reserved[24];
};

#define ETHAND_CUPTI_KIND_KERNEL (1u << 0)
#define ETHAND_CUPTI_KIND_MEMCPY (1u << 1)
#define ETHAND_CUPTI_KIND_MEMSET (1u << 2)
#define ETHAND_CUPTI_KIND_SYNC (1u << 3)

/* One activity, whatever CUPTI's struct version: the fields ethand reads. */
enum ethand_cupti_rec_kind {
    ETHAND_CUPTI_REC_KERNEL = 1,
    ETHAND_CUPTI_REC_MEMCPY = 2,
    ETHAND_CUPTI_REC_MEMSET = 3,
    ETHAND_CUPTI_REC_SYNC = 4,
};

/* Device or name unknown. */
#define ETHAND_CUPTI_NONE 0xFFFFFFFFu

struct ethand_cupti_rec {
    uint8_t kind;
    /* Memcpy: CUPTI's MemcpyKind (HTOD 1, DTOH 2, DTOD 8, HTOH 9, PTOP 10, ...). */
    uint8_t copy_kind;
    /* Memcpy: CUPTI's MemoryKind of source and destination (PAGEABLE 1, PINNED 2,
     * DEVICE 3, ...); memset: the memory's kind in src_kind. */
    uint8_t src_kind;
    uint8_t dst_kind;
    /* Sync: CUPTI's sync type (EVENT 1, STREAM_WAIT_EVENT 2, STREAM 3, CONTEXT 4). */
    uint32_t sync_type;
    uint32_t device;
    uint32_t context;
    uint32_t stream;
    uint32_t correlation;
    /* Kernel: the id its name was given by ethand_cupti_name in this window. */
    uint32_t name_id;
    /* Memcpy: CUPTI's flags (ASYNC 1). */
    uint32_t flags;
    /* CUPTI's clock (see the window events' clock pairs). */
    uint64_t start;
    uint64_t end;
    uint64_t bytes;
    uint32_t grid[3];
    uint32_t block[3];
    /* Kernel: when the host queued the launch (CUPTI's clock; 0: unknown, as CUPTI leaves it
     * for work it cannot time, CUDA graphs among them). The idle split needs it. */
    uint64_t queued;
};

/* Records per ethand_cupti_batch call at most. */
#define ETHAND_CUPTI_BATCH 64
/* Bytes of a kernel name the daemon keeps. */
#define ETHAND_CUPTI_NAME_MAX 256

enum ethand_cupti_window_state {
    /* CUPTI subscribed and the kinds enabled: records follow. */
    ETHAND_CUPTI_OPENED = 1,
    /* The window ended: every record of it was handed over before this. */
    ETHAND_CUPTI_CLOSED = 2,
    /* Another tool holds CUPTI (torch.profiler, Nsight): the library stepped aside. */
    ETHAND_CUPTI_REFUSED = 3,
    /* It could not open: no libcupti, a missing function, an error (`result`). */
    ETHAND_CUPTI_FAILED = 4,
};

/* Why a window closed. */
enum ethand_cupti_close_reason {
    ETHAND_CUPTI_CLOSE_DEADLINE = 1,
    ETHAND_CUPTI_CLOSE_DAEMON = 2,
    ETHAND_CUPTI_CLOSE_MAX_RECORDS = 3,
    /* Another window was asked for (a second snapshot, or a snapshot during a recording):
     * the library keeps one at a time. */
    ETHAND_CUPTI_CLOSE_ANOTHER_WINDOW = 4,
};

struct ethand_cupti_window_event {
    uint64_t window_id;
    uint32_t state;
    /* CUPTI's result code of the failed call (REFUSED: 39), else 0. */
    int32_t result;
    uint32_t cupti_version;
    /* CLOSED: an ethand_cupti_close_reason. FAILED: which step failed (1 load, 2 symbol,
     * 3 subscribe, 4 register, 5 enable). */
    uint32_t reason;
    /* The same instant on CUPTI's clock and on CLOCK_MONOTONIC (ns), taken at open and at
     * close: the daemon maps record times between the two. */
    uint64_t clock_cupti;
    uint64_t clock_mono;
    /* CLOSED: records handed over, records CUPTI dropped, buffers the library declined
     * (all in use), kernel names given ids, records of kernels with no id left. */
    uint64_t records;
    uint64_t dropped;
    uint64_t buffers_declined;
    uint64_t names;
    uint64_t unnamed;
};

#endif
