/*
 * libethand_cupti.so: GPU activity (kernels, copies, memsets, syncs) of one process, taken
 * with NVIDIA's CUPTI only while the ethand daemon asks, handed to the daemon through
 * uprobes on three probe functions. Contract: ethand_cupti.h. Design:
 * docs/design/cupti-injection.md.
 *
 * Loaded by the CUDA driver at cuInit when the job runs with
 * CUDA_INJECTION64_PATH=/path/to/libethand_cupti.so. InitializeInjection only starts a
 * control thread; while no window is open, libcupti is not even loaded, so the job pays
 * nothing and other tools (torch.profiler, Nsight) find CUPTI free. The control thread
 * sleeps on a futex in the daemon's control file (mapped read-only) and opens or closes a
 * window when the daemon changes this process's slot, or when the window's deadline passes.
 *
 * Rules, since this code runs inside someone else's training job: C11 and libc only (no
 * C++ runtime, no exceptions across the driver), every symbol hidden but the entry point and
 * the probes, no allocation after the first window's buffers, nothing that can block a CUDA
 * call of the job (the probes never wait; a full ring buffer loses records, counted).
 */
#define _GNU_SOURCE
#include "ethand_cupti.h"

#include <dlfcn.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define PROBE __attribute__((visibility("default"), noinline, used))

/* ---- The part of CUPTI's C API used here (cupti_activity.h, cupti_callbacks.h). Only the
 * stable prefix of each record is read (offsets the same in CUDA 12.x and 13.x records;
 * docs/design/cupti-injection.md section 2). Functions are found with dlsym. */
typedef int CUptiResult;
typedef void *CUpti_SubscriberHandle;
typedef void (*cupti_callback_fn)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*cupti_buffer_request_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*cupti_buffer_complete_fn)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                         size_t valid);

enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
    CUPTI_ACTIVITY_KIND_MEMCPY = 1,
    CUPTI_ACTIVITY_KIND_MEMSET = 2,
    CUPTI_ACTIVITY_KIND_KERNEL = 3,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION = 38,
    CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1,
    CUPTI_CB_DOMAIN_DRIVER_API = 1,
    CUPTI_CB_DOMAIN_RUNTIME_API = 2,
    CUPTI_API_EXIT = 1,
};

/* The daemon's mirror (ethand-common's cupti_layout test) pins the same figures. */
_Static_assert(sizeof(struct ethand_cupti_rec) == 88, "ethand_cupti_rec");
_Static_assert(offsetof(struct ethand_cupti_rec, queued) == 80, "ethand_cupti_rec");

static struct {
    CUptiResult (*get_version)(uint32_t *);
    CUptiResult (*subscribe)(CUpti_SubscriberHandle *, cupti_callback_fn, void *);
    CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*enable_domain)(uint32_t, CUpti_SubscriberHandle, int);
    CUptiResult (*finalize)(void);
    CUptiResult (*get_timestamp)(uint64_t *);
    CUptiResult (*register_callbacks)(cupti_buffer_request_fn, cupti_buffer_complete_fn);
    CUptiResult (*enable)(int);
    CUptiResult (*disable)(int);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, void **);
    CUptiResult (*dropped)(void *, uint32_t, size_t *);
    /* Optional (NULL where missing): kernels' queued times, for the idle split. */
    CUptiResult (*latency_timestamps)(uint8_t);
    /* Optional: one callback id on or off (the CUDA graph launches, below). */
    CUptiResult (*enable_callback)(uint32_t, CUpti_SubscriberHandle, int, uint32_t);
} cupti;
static void *cupti_handle;
static uint32_t cupti_version;

/* ---- Probes: the daemon's uprobes read their arguments. The empty asm keeps each body
 * distinct and the call from being dropped. */
PROBE void ethand_cupti_batch(const struct ethand_cupti_rec *recs, uint32_t n, uint64_t window_id) {
    __asm__ volatile("" : : "r"(recs), "r"(n), "r"(window_id) : "memory");
}
PROBE void ethand_cupti_name(uint64_t window_id, uint32_t name_id, const char *name) {
    __asm__ volatile("" : : "r"(window_id), "r"(name_id), "r"(name) : "memory");
}
PROBE void ethand_cupti_window(const struct ethand_cupti_window_event *ev) {
    __asm__ volatile("" : : "r"(ev) : "memory");
}

/* ---- State of this process. */
static char ctl_path[PATH_MAX];
static uint64_t my_pidns_ino;
static uint32_t my_pid;

/* The window records are handed over for (set before the kinds are enabled, kept after
 * close so that late buffers still name their window). */
static _Atomic uint64_t window_id;
static _Atomic uint64_t window_records, window_dropped, window_declined;
static uint32_t window_max_records;

/* CUPTI buffers: a fixed pool, allocated at the first window; when all are in use CUPTI is
 * told no and drops records (counted by CUPTI, read at close). */
#define BUFFER_BYTES (1u << 20)
#define BUFFERS 8
static uint8_t *buffers[BUFFERS];
static _Atomic uint32_t buffers_busy;

/* Kernel names: CUPTI shares one name pointer among every record of a kernel. Interned per
 * window into ids, each announced once through ethand_cupti_name. Open addressing;
 * written only under names_lock (buffer completions may run on two threads at once). */
#define NAMES 4096
static const char *name_ptr[NAMES];
static uint32_t name_count;
static uint64_t name_unnamed;
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;

/* Finalize at the next API exit (the only safe moment, NVIDIA's samples say): the control
 * thread asks, the callback does it. */
enum { FIN_NONE, FIN_PENDING, FIN_RUNNING, FIN_DONE };
static _Atomic int finalize_state = FIN_NONE;
static CUpti_SubscriberHandle subscriber;
static int subscribed;
/* Diagnosis knobs, read once at start-up (ETHAND_CUPTI_KEEP=1: never detach CUPTI after a
 * window; ETHAND_CUPTI_NO_QUEUED=1: no latency timestamps): for finding which step of a
 * window a job does not survive. */
static int keep_attached, no_queued;

static uint64_t now_mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The same instant on both clocks: of three bracketed readings, the tightest. */
static void clock_pair(uint64_t *cupti_ns, uint64_t *mono_ns) {
    uint64_t best = UINT64_MAX;
    *cupti_ns = 0;
    *mono_ns = now_mono();
    for (int i = 0; i < 3 && cupti.get_timestamp; i++) {
        uint64_t c = 0;
        uint64_t m0 = now_mono();
        if (cupti.get_timestamp(&c) != CUPTI_SUCCESS)
            return;
        uint64_t m1 = now_mono();
        if (m1 - m0 < best) {
            best = m1 - m0;
            *cupti_ns = c;
            *mono_ns = m0 + (m1 - m0) / 2;
        }
    }
}

static void window_event(uint64_t id, uint32_t state, int32_t result, uint32_t reason) {
    struct ethand_cupti_window_event ev;
    memset(&ev, 0, sizeof ev);
    ev.window_id = id;
    ev.state = state;
    ev.result = result;
    ev.reason = reason;
    ev.cupti_version = cupti_version;
    clock_pair(&ev.clock_cupti, &ev.clock_mono);
    if (state == ETHAND_CUPTI_CLOSED) {
        ev.records = atomic_load(&window_records);
        ev.dropped = atomic_load(&window_dropped);
        ev.buffers_declined = atomic_load(&window_declined);
        pthread_mutex_lock(&names_lock);
        ev.names = name_count;
        ev.unnamed = name_unnamed;
        pthread_mutex_unlock(&names_lock);
    }
    ethand_cupti_window(&ev);
}

/* The id of a kernel's name in this window, announced the first time. */
static uint32_t name_id(const char *name, uint64_t id) {
    if (!name)
        return ETHAND_CUPTI_NONE;
    uint32_t h = (uint32_t)(((uintptr_t)name >> 4) * 2654435761u) % NAMES;
    uint32_t out = ETHAND_CUPTI_NONE;
    pthread_mutex_lock(&names_lock);
    for (uint32_t i = 0; i < NAMES; i++) {
        uint32_t slot = (h + i) % NAMES;
        if (name_ptr[slot] == name) {
            out = slot;
            break;
        }
        if (!name_ptr[slot]) {
            if (name_count + 1 >= NAMES)
                break; /* full: keep one slot free so a lookup always ends */
            name_ptr[slot] = name;
            name_count++;
            out = slot;
            ethand_cupti_name(id, slot, name);
            break;
        }
    }
    if (out == ETHAND_CUPTI_NONE)
        name_unnamed++;
    pthread_mutex_unlock(&names_lock);
    return out;
}

static uint32_t rd32(const uint8_t *p, size_t off) {
    uint32_t v;
    memcpy(&v, p + off, sizeof v);
    return v;
}
static uint64_t rd64(const uint8_t *p, size_t off) {
    uint64_t v;
    memcpy(&v, p + off, sizeof v);
    return v;
}

/* One CUPTI record into ours; 0 for kinds not handed over. Offsets: the design note, §2. */
static int convert(const uint8_t *r, struct ethand_cupti_rec *out, uint64_t id) {
    memset(out, 0, sizeof *out);
    out->device = ETHAND_CUPTI_NONE;
    out->name_id = ETHAND_CUPTI_NONE;
    switch (rd32(r, 0)) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        out->kind = ETHAND_CUPTI_REC_KERNEL;
        out->start = rd64(r, 16);
        out->end = rd64(r, 24);
        out->device = rd32(r, 40);
        out->context = rd32(r, 44);
        out->stream = rd32(r, 48);
        for (int i = 0; i < 3; i++) {
            out->grid[i] = rd32(r, 52 + 4 * (size_t)i);
            out->block[i] = rd32(r, 64 + 4 * (size_t)i);
        }
        out->correlation = rd32(r, 92);
        out->queued = rd64(r, 120);
        const char *name;
        memcpy(&name, r + 104, sizeof name);
        out->name_id = name_id(name, id);
        return 1;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        out->kind = ETHAND_CUPTI_REC_MEMCPY;
        out->copy_kind = r[4];
        out->src_kind = r[5];
        out->dst_kind = r[6];
        out->flags = r[7];
        out->bytes = rd64(r, 8);
        out->start = rd64(r, 16);
        out->end = rd64(r, 24);
        out->device = rd32(r, 32);
        out->context = rd32(r, 36);
        out->stream = rd32(r, 40);
        out->correlation = rd32(r, 44);
        return 1;
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        out->kind = ETHAND_CUPTI_REC_MEMSET;
        out->bytes = rd64(r, 8);
        out->start = rd64(r, 16);
        out->end = rd64(r, 24);
        out->device = rd32(r, 32);
        out->context = rd32(r, 36);
        out->stream = rd32(r, 40);
        out->correlation = rd32(r, 44);
        uint16_t mem;
        memcpy(&mem, r + 50, sizeof mem);
        out->src_kind = (uint8_t)mem;
        return 1;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        out->kind = ETHAND_CUPTI_REC_SYNC;
        out->sync_type = rd32(r, 4);
        out->start = rd64(r, 8);
        out->end = rd64(r, 16);
        out->correlation = rd32(r, 24);
        out->context = rd32(r, 28);
        out->stream = rd32(r, 32);
        return 1;
    default:
        return 0;
    }
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *max_records = 0;
    for (;;) {
        uint32_t busy = atomic_load(&buffers_busy);
        int free_slot = -1;
        for (int i = 0; i < BUFFERS; i++)
            if (!(busy & (1u << i)) && buffers[i]) {
                free_slot = i;
                break;
            }
        if (free_slot < 0) {
            /* CUPTI drops records (counted by it); the job never waits for the daemon. */
            atomic_fetch_add(&window_declined, 1);
            *buffer = NULL;
            *size = 0;
            return;
        }
        if (atomic_compare_exchange_weak(&buffers_busy, &busy, busy | (1u << free_slot))) {
            *buffer = buffers[free_slot];
            *size = BUFFER_BYTES;
            return;
        }
    }
}

static void buffer_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    uint64_t id = atomic_load(&window_id);
    struct ethand_cupti_rec batch[ETHAND_CUPTI_BATCH];
    uint32_t n = 0;
    void *rec = NULL;
    while (cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS && rec) {
        if (!convert(rec, &batch[n], id))
            continue;
        if (++n == ETHAND_CUPTI_BATCH) {
            ethand_cupti_batch(batch, n, id);
            atomic_fetch_add(&window_records, n);
            n = 0;
        }
    }
    if (n) {
        ethand_cupti_batch(batch, n, id);
        atomic_fetch_add(&window_records, n);
    }
    size_t dropped = 0;
    if (cupti.dropped && cupti.dropped(NULL, 0, &dropped) == CUPTI_SUCCESS)
        atomic_fetch_add(&window_dropped, dropped);
    for (int i = 0; i < BUFFERS; i++)
        if (buffers[i] == buffer)
            atomic_fetch_and(&buffers_busy, ~(1u << i));
}

/* CUDA graph launches (cupti_driver_cbid.h, cupti_runtime_cbid.h). A PyTorch job replaying a
 * CUDA graph died ("unspecified launch failure", an Xid) as its window closed, twice, on an
 * H100 with driver 580 and CUPTI 13.0 (2026-12-07); CUPTI's detach with graphs is a known
 * crash (pytorch #112507, Kineto's TEARDOWN_CUPTI=0 for graphs). A process seen launching a
 * graph is never detached: CUPTI stays loaded with every activity kind and callback off. */
enum {
    CBID_DRIVER_GRAPH_LAUNCH = 514,
    CBID_DRIVER_GRAPH_LAUNCH_PTSZ = 515,
    CBID_RUNTIME_GRAPH_LAUNCH = 311,
    CBID_RUNTIME_GRAPH_LAUNCH_PTSZ = 312,
};
static _Atomic int graphs_seen;
/* The API domains are on (for the detach at the next call's exit). */
static _Atomic int domains_on;

static int graph_launch(int domain, uint32_t cbid) {
    return domain == CUPTI_CB_DOMAIN_DRIVER_API
               ? cbid == CBID_DRIVER_GRAPH_LAUNCH || cbid == CBID_DRIVER_GRAPH_LAUNCH_PTSZ
               : cbid == CBID_RUNTIME_GRAPH_LAUNCH || cbid == CBID_RUNTIME_GRAPH_LAUNCH_PTSZ;
}

/* Graph launches (their callbacks are on while a window is open), and at the exit of the
 * job's next CUDA call after a window: CUPTI detached from the process, so that nothing of it
 * stays instrumented between windows; not in a process that launches graphs. */
static void api_callback(void *userdata, int domain, uint32_t cbid, const void *cbdata) {
    (void)userdata;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API && domain != CUPTI_CB_DOMAIN_RUNTIME_API)
        return;
    if (graph_launch(domain, cbid)) {
        atomic_store(&graphs_seen, 1);
        /* A detach already asked for is called off (the control thread turns the domains
         * off again). */
        int pending = FIN_PENDING;
        atomic_compare_exchange_strong(&finalize_state, &pending, FIN_NONE);
        return;
    }
    /* cbdata is a CUpti_CallbackData, whose first field is the callback site. */
    uint32_t site;
    memcpy(&site, cbdata, sizeof site);
    if (site != CUPTI_API_EXIT || atomic_load(&graphs_seen))
        return;
    int expect = FIN_PENDING;
    if (!atomic_compare_exchange_strong(&finalize_state, &expect, FIN_RUNNING))
        return;
    cupti.finalize();
    atomic_store(&domains_on, 0);
    atomic_store(&finalize_state, FIN_DONE);
}

/* The graph launch callbacks on or off. */
static void graph_callbacks(uint32_t on) {
    if (!cupti.enable_callback)
        return;
    cupti.enable_callback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CBID_DRIVER_GRAPH_LAUNCH);
    cupti.enable_callback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CBID_DRIVER_GRAPH_LAUNCH_PTSZ);
    cupti.enable_callback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CBID_RUNTIME_GRAPH_LAUNCH);
    cupti.enable_callback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CBID_RUNTIME_GRAPH_LAUNCH_PTSZ);
}

/* Directories of the CUDA libraries the process has loaded (a wheel's nvidia/.../lib, the
 * toolkit's lib64), gathered under the loader's lock and tried after it is released. */
#define CUDA_DIRS 16
struct cuda_dirs {
    char dir[CUDA_DIRS][PATH_MAX];
    int n;
};

static int note_cuda_dir(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct cuda_dirs *d = arg;
    const char *name = info->dlpi_name;
    const char *slash = name ? strrchr(name, '/') : NULL;
    if (!slash || d->n >= CUDA_DIRS || (size_t)(slash - name) >= PATH_MAX)
        return d->n >= CUDA_DIRS;
    /* libcudart, libcublas, libcudnn, libnccl, libnvrtc and the like, or a wheel's own. */
    if (strncmp(slash + 1, "libcu", 5) != 0 && strncmp(slash + 1, "libnv", 5) != 0 &&
        !strstr(name, "/nvidia/"))
        return 0;
    size_t len = (size_t)(slash - name);
    for (int i = 0; i < d->n; i++)
        if (strlen(d->dir[i]) == len && memcmp(d->dir[i], name, len) == 0)
            return 0;
    memcpy(d->dir[d->n], name, len);
    d->dir[d->n][len] = 0;
    d->n++;
    return 0;
}

/* libcupti beside the CUDA libraries the job loaded: the same directory (the CUDA 13 wheels'
 * nvidia/cu13/lib, the toolkit's lib64 where CUPTI was copied), the CUDA 12 wheels' sibling
 * nvidia/cuda_cupti/lib, the toolkit's extras/CUPTI/lib64. JAX loads its wheels' libraries
 * by path, so the loader's search alone does not find theirs. */
static void *cupti_beside_cuda(void) {
    static struct cuda_dirs dirs;
    dirs.n = 0;
    dl_iterate_phdr(note_cuda_dir, &dirs);
    static const char *const rel[] = {
        "libcupti.so.13",
        "libcupti.so.12",
        "../../cuda_cupti/lib/libcupti.so.13",
        "../../cuda_cupti/lib/libcupti.so.12",
        "../extras/CUPTI/lib64/libcupti.so",
    };
    char path[PATH_MAX];
    for (int i = 0; i < dirs.n; i++) {
        for (size_t j = 0; j < sizeof rel / sizeof *rel; j++) {
            int n = snprintf(path, sizeof path, "%s/%s", dirs.dir[i], rel[j]);
            if (n <= 0 || (size_t)n >= sizeof path || access(path, R_OK) != 0)
                continue;
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h)
                return h;
        }
    }
    return NULL;
}

/* libcupti: ETHAND_CUPTI_LIB, else one the process has loaded already (PyTorch's), else the
 * loader's search (the job's LD_LIBRARY_PATH; the wheels' RPATHs do not apply here), else
 * one beside the CUDA libraries the process loaded. */
static int load_cupti(void) {
    if (cupti_handle)
        return 1;
    const char *env = getenv("ETHAND_CUPTI_LIB");
    static const char *const sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
    void *h = NULL;
    if (env && *env)
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; !h && i < sizeof sonames / sizeof *sonames; i++)
        h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    for (size_t i = 0; !h && i < sizeof sonames / sizeof *sonames; i++)
        h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = cupti_beside_cuda();
    if (!h)
        return 0;
#define SYM(field, name)                                                                       \
    do {                                                                                       \
        *(void **)(&cupti.field) = dlsym(h, name);                                             \
        if (!cupti.field) {                                                                    \
            dlclose(h);                                                                        \
            memset(&cupti, 0, sizeof cupti);                                                   \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)
    SYM(get_version, "cuptiGetVersion");
    SYM(subscribe, "cuptiSubscribe");
    SYM(unsubscribe, "cuptiUnsubscribe");
    SYM(enable_domain, "cuptiEnableDomain");
    SYM(finalize, "cuptiFinalize");
    SYM(get_timestamp, "cuptiGetTimestamp");
    SYM(register_callbacks, "cuptiActivityRegisterCallbacks");
    SYM(enable, "cuptiActivityEnable");
    SYM(disable, "cuptiActivityDisable");
    SYM(flush_all, "cuptiActivityFlushAll");
    SYM(next_record, "cuptiActivityGetNextRecord");
    SYM(dropped, "cuptiActivityGetNumDroppedRecords");
#undef SYM
    *(void **)(&cupti.latency_timestamps) = dlsym(h, "cuptiActivityEnableLatencyTimestamps");
    *(void **)(&cupti.enable_callback) = dlsym(h, "cuptiEnableCallback");
    cupti_handle = h;
    if (cupti.get_version(&cupti_version) != CUPTI_SUCCESS)
        cupti_version = 0;
    return 1;
}

static const struct {
    uint32_t bit;
    int kind;
} KINDS[] = {
    {ETHAND_CUPTI_KIND_KERNEL, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL},
    {ETHAND_CUPTI_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY},
    {ETHAND_CUPTI_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMSET},
    {ETHAND_CUPTI_KIND_SYNC, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION},
};
#define NKINDS (sizeof KINDS / sizeof *KINDS)

/* The window being recorded by the control thread (0: none). */
static uint64_t open_id;
static uint64_t open_deadline;
static uint32_t open_kinds;

static void close_window(uint32_t reason) {
    for (size_t i = 0; i < NKINDS; i++)
        if (open_kinds & KINDS[i].bit)
            cupti.disable(KINDS[i].kind);
    if ((open_kinds & ETHAND_CUPTI_KIND_KERNEL) && cupti.latency_timestamps && !no_queued)
        cupti.latency_timestamps(0);
    /* Every buffer, complete or not, is handed back before this returns. */
    cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    window_event(open_id, ETHAND_CUPTI_CLOSED, 0, reason);
    /* Detach at the job's next CUDA call; a job that makes none keeps only the idle
     * subscription (the control thread never waits for it). */
    if (!keep_attached && !atomic_load(&graphs_seen)) {
        atomic_store(&finalize_state, FIN_PENDING);
        atomic_store(&domains_on, 1);
        cupti.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
        cupti.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    } else {
        graph_callbacks(0);
    }
    open_id = 0;
}

static void open_window(uint64_t id, uint64_t deadline, uint32_t kinds, uint32_t max_records) {
    int loaded = load_cupti();
    if (loaded <= 0) {
        window_event(id, ETHAND_CUPTI_FAILED, 0, loaded == 0 ? 1 : 2);
        return;
    }
    /* The previous window's finalize may not have run yet (no CUDA call since): take the
     * subscription back instead, or wait for a finalize already running. */
    int expect = FIN_PENDING;
    if (atomic_compare_exchange_strong(&finalize_state, &expect, FIN_NONE) ||
        (atomic_load(&finalize_state) == FIN_NONE && atomic_load(&domains_on))) {
        atomic_store(&domains_on, 0);
        cupti.enable_domain(0, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
        cupti.enable_domain(0, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    } else {
        while (atomic_load(&finalize_state) == FIN_RUNNING) {
            struct timespec t = {0, 1000000};
            nanosleep(&t, NULL);
        }
        if (atomic_load(&finalize_state) == FIN_DONE) {
            subscribed = 0;
            atomic_store(&finalize_state, FIN_NONE);
        }
    }
    if (!subscribed) {
        CUptiResult r = cupti.subscribe(&subscriber, api_callback, NULL);
        if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
            window_event(id, ETHAND_CUPTI_REFUSED, r, 0);
            return;
        }
        if (r != CUPTI_SUCCESS) {
            window_event(id, ETHAND_CUPTI_FAILED, r, 3);
            return;
        }
        subscribed = 1;
        /* While a window is open only the graph launches call back: the domains stay off. */
    }
    graph_callbacks(1);
    for (int i = 0; i < BUFFERS; i++)
        if (!buffers[i])
            buffers[i] = aligned_alloc(8, BUFFER_BYTES);
    CUptiResult r = cupti.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        window_event(id, ETHAND_CUPTI_FAILED, r, 4);
        return;
    }
    pthread_mutex_lock(&names_lock);
    memset(name_ptr, 0, sizeof name_ptr);
    name_count = 0;
    name_unnamed = 0;
    pthread_mutex_unlock(&names_lock);
    atomic_store(&window_records, 0);
    atomic_store(&window_dropped, 0);
    atomic_store(&window_declined, 0);
    atomic_store(&window_id, id);
    window_max_records = max_records;
    open_id = id;
    open_deadline = deadline;
    open_kinds = 0;
    /* Queued times cost CUPTI a timestamp per launch; without them (an error, or a CUPTI
     * that lacks the call) kernels come with queued 0 and their gaps stay unattributed. */
    if ((kinds & ETHAND_CUPTI_KIND_KERNEL) && cupti.latency_timestamps && !no_queued)
        cupti.latency_timestamps(1);
    for (size_t i = 0; i < NKINDS; i++) {
        if (!(kinds & KINDS[i].bit))
            continue;
        r = cupti.enable(KINDS[i].kind);
        if (r != CUPTI_SUCCESS) {
            window_event(id, ETHAND_CUPTI_FAILED, r, 5);
            close_window(ETHAND_CUPTI_CLOSE_DAEMON);
            return;
        }
        open_kinds |= KINDS[i].bit;
    }
    window_event(id, ETHAND_CUPTI_OPENED, 0, 0);
}

/* ---- The control file. */
static const struct ethand_cupti_ctl_header *ctl;
static size_t ctl_len;
static dev_t ctl_dev;
static ino_t ctl_ino;

static const size_t CTL_BYTES =
    sizeof(struct ethand_cupti_ctl_header) + ETHAND_CUPTI_SLOTS * sizeof(struct ethand_cupti_slot);

static void unmap_ctl(void) {
    if (ctl)
        munmap((void *)ctl, ctl_len);
    ctl = NULL;
}

/* Maps the control file if it is there and is one (a regular file of the right size and
 * magic); anything else is ignored until it changes. */
static void map_ctl(void) {
    int fd = open(ctl_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < CTL_BYTES) {
        close(fd);
        return;
    }
    void *p = mmap(NULL, CTL_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return;
    const struct ethand_cupti_ctl_header *h = p;
    if (h->magic != ETHAND_CUPTI_CTL_MAGIC || h->abi != ETHAND_CUPTI_ABI ||
        h->nslots != ETHAND_CUPTI_SLOTS || h->slot_size != sizeof(struct ethand_cupti_slot)) {
        munmap(p, CTL_BYTES);
        return;
    }
    ctl = h;
    ctl_len = CTL_BYTES;
    ctl_dev = st.st_dev;
    ctl_ino = st.st_ino;
}

/* The daemon replaced or removed the file (a restart): map the new one. */
static int ctl_replaced(void) {
    struct stat st;
    return stat(ctl_path, &st) != 0 || st.st_dev != ctl_dev || st.st_ino != ctl_ino;
}

struct wish {
    uint64_t id, deadline;
    uint32_t kinds, max_records;
};

/* This process's slot, read whole (seqlock): what the daemon wants now. */
static struct wish read_wish(void) {
    struct wish w = {0, 0, 0, 0};
    const struct ethand_cupti_slot *slots = (const void *)(ctl + 1);
    for (uint32_t i = 0; i < ETHAND_CUPTI_SLOTS; i++) {
        const volatile struct ethand_cupti_slot *s = &slots[i];
        for (int tries = 0; tries < 100; tries++) {
            uint32_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
            if (seq & 1)
                continue;
            struct wish got = {s->window_id, s->deadline_mono_ns, s->kinds, s->max_records};
            int mine = s->nspid == my_pid && s->pidns_ino == my_pidns_ino;
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&s->seq, __ATOMIC_RELAXED) != seq)
                continue;
            if (mine && got.id)
                return got;
            break;
        }
    }
    return w;
}

static void futex_wait(const uint32_t *word, uint32_t seen, uint64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    /* A shared futex: keyed by the file's inode and offset, so the daemon's wake on its own
     * mapping reaches this read-only one. */
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &t, NULL, 0);
}

static void *control_thread(void *arg) {
    (void)arg;
    uint64_t last_stat = 0;
    for (;;) {
        uint64_t now = now_mono();
        if (!ctl || now - last_stat >= 5000000000ull) {
            last_stat = now;
            if (ctl && ctl_replaced())
                unmap_ctl();
            if (!ctl)
                map_ctl();
        }
        if (!ctl) {
            if (open_id)
                close_window(ETHAND_CUPTI_CLOSE_DAEMON);
            struct timespec t = {1, 0};
            nanosleep(&t, NULL);
            continue;
        }
        /* A graph launch called the detach off: the callbacks on every CUDA call go too. */
        if (!open_id && atomic_load(&graphs_seen) && atomic_load(&finalize_state) == FIN_NONE &&
            atomic_exchange(&domains_on, 0)) {
            cupti.enable_domain(0, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
            cupti.enable_domain(0, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
            graph_callbacks(0);
        }
        uint32_t seq = __atomic_load_n(&ctl->wake_seq, __ATOMIC_ACQUIRE);
        struct wish w = read_wish();
        now = now_mono();
        int wanted = w.id && w.deadline > now;
        if (open_id) {
            uint32_t reason = 0;
            if (w.id != open_id)
                reason = wanted ? ETHAND_CUPTI_CLOSE_ANOTHER_WINDOW : ETHAND_CUPTI_CLOSE_DAEMON;
            else if (!wanted)
                reason = ETHAND_CUPTI_CLOSE_DEADLINE;
            else if (now >= open_deadline)
                reason = ETHAND_CUPTI_CLOSE_DEADLINE;
            else if (window_max_records && atomic_load(&window_records) >= window_max_records)
                reason = ETHAND_CUPTI_CLOSE_MAX_RECORDS;
            if (reason)
                close_window(reason);
        }
        /* A window is opened once: one that failed or was refused is not retried. */
        static uint64_t tried_id;
        if (!open_id && wanted && w.id != tried_id) {
            tried_id = w.id;
            open_window(w.id, w.deadline, w.kinds, w.max_records);
        }
        uint64_t sleep_ns = 1000000000ull;
        if (open_id) {
            now = now_mono();
            uint64_t left = open_deadline > now ? open_deadline - now : 0;
            /* A window with a record limit is checked often enough to end near it. */
            if (window_max_records && left > 50000000ull)
                left = 50000000ull;
            if (left < sleep_ns)
                sleep_ns = left ? left : 1;
        }
        futex_wait(&ctl->wake_seq, seq, sleep_ns);
    }
    return NULL;
}

static void pid_namespace(void) {
    struct stat st;
    my_pidns_ino = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
    my_pid = (uint32_t)getpid();
}

/* A forked child has no control thread: it is not traced (a CUDA job's forked workers
 * cannot use CUDA anyway). Its key would be wrong too. */
static void after_fork_child(void) {
    my_pid = 0;
}

/* Called by the CUDA driver at cuInit. Returns 1 (success) whatever happens: a missing
 * control file or libcupti must never stop the job. */
EXPORT int InitializeInjection(void) {
    static atomic_int once;
    if (atomic_exchange(&once, 1))
        return 1;
    const char *env = getenv("ETHAND_CUPTI_CTL");
    if (env && *env) {
        snprintf(ctl_path, sizeof ctl_path, "%s", env);
    } else {
        Dl_info info;
        if (!dladdr((void *)InitializeInjection, &info) || !info.dli_fname)
            return 1;
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(ctl_path, sizeof ctl_path, "%.*s/%s", dir, slash ? info.dli_fname : ".",
                 ETHAND_CUPTI_CTL_NAME);
    }
    pid_namespace();
    const char *knob = getenv("ETHAND_CUPTI_KEEP");
    keep_attached = knob && *knob == '1';
    knob = getenv("ETHAND_CUPTI_NO_QUEUED");
    no_queued = knob && *knob == '1';
    pthread_atfork(NULL, NULL, after_fork_child);
    /* The thread takes no signal meant for the job. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t t;
    if (pthread_create(&t, &attr, control_thread, NULL) == 0)
        pthread_setname_np(t, "ethand-cupti");
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return 1;
}
