/*
 * Stand-in for libcupti.so.12 / libcupti.so.13 (CUPTI Activity and Callback API), for the tests of
 * libethand_cupti.so on machines without a GPU. Real prototypes and numbers, as described in
 * docs/design/cupti-injection.md §2; no NVIDIA header is used.
 *
 * Built twice: -DSTANDIN_CUPTI_MAJOR=13 (cuptiGetVersion 130500; record bytes: kernel 248, memcpy
 * 112, memset 104, synchronization 56) and -DSTANDIN_CUPTI_MAJOR=12 (version 28; 208, 96, 88, 56).
 *
 * Where the activity comes from: the stand-in libcuda (cuda.c) reports each launch, copy, memset
 * and sync to a hook that this library registers through ethand_standin_cuda_set_activity_hook.
 * Every CUPTI call below marked ATTACH first looks for a loaded stand-in libcuda
 * (dlopen("libcuda.so.1", RTLD_NOLOAD), then every loaded ".../libcuda.so.1" of
 * dl_iterate_phdr) until it finds one, so libcuda must be loaded before the CUPTI calls whose
 * activity should be seen (as with a real driver). cuptiFinalize detaches again.
 *
 * The emulated device: one GPU (deviceId 0, contextId 1) that runs kernels, copies and memsets one
 * after the other: each starts at max(call time, end of the previous one) (a kernel at max(call
 * time + ETHAND_STANDIN_CUPTI_LAUNCH_NS (default 0), ...): its launch latency) and lasts
 *   kernel  ETHAND_STANDIN_CUPTI_KERNEL_NS (default 10000) ns,
 *   copy    ETHAND_STANDIN_CUPTI_COPY_NS_PER_KIB (default 100) ns per KiB, at least 1000 ns,
 *   memset  2000 ns.
 * A sync record runs from the call to its return (the stand-in sleeps ETHAND_STANDIN_SYNC_US).
 * Kernel records carry `queued` = the call's time while cuptiActivityEnableLatencyTimestamps(1)
 * holds, else 0 (CUPTI_TIMESTAMP_UNKNOWN). Timestamps are CLOCK_REALTIME ns, the clock of cuptiGetTimestamp (as real CUPTI on Linux).
 * Every reported call takes the next correlation id of the process (1, 2, 3, ...), recorded or not.
 * Stream ids are libcuda's: 0 for the NULL stream, else 1, 2, ... by first use.
 *
 * Buffers: a record goes into the buffer from bufferRequested (its size; maxNumRecords honoured
 * when not 0). A declined buffer (NULL) drops the record; cuptiActivityGetNumDroppedRecords
 * returns the drops and resets them. Full buffers are completed by a worker thread of this
 * library; cuptiActivityFlushAll (any flag) waits for those, then completes the current buffer
 * and spare ones (possibly with validSize 0) on the caller's thread. No callback is called with a
 * lock held.
 *
 * Callbacks: cuptiSubscribe returns 39 when ETHAND_STANDIN_CUPTI_BUSY=1 or when a subscriber is
 * registered. With CUPTI_CB_DOMAIN_DRIVER_API (1) or RUNTIME_API (2) enabled by
 * cuptiEnableDomain, each reported CUDA call calls the subscriber once, at API exit:
 * callback(userdata, 1 (or 2 if only RUNTIME is enabled), cbid 0, &data) where data is a
 * CUpti_CallbackData (layout of cupti_callbacks.h) with callbackSite 1 (exit), functionName (the
 * CUDA function), symbolName (kernels: the kernel name, else NULL), functionReturnValue (points
 * to CUDA_SUCCESS), contextUid 1 and correlationId; the rest is NULL. cuptiEnableCallback routes
 * one id: the driver's cuGraphLaunch (514, 515 for _ptsz): each graph launch of the stand-in
 * libcuda calls back (1, 514, &data at exit) where it is on or the driver domain is; the other
 * ids are counted only. "graph_callbacks" counts those calls.
 *
 * ethand_standin_cupti_counts(json, cap) writes the call counters as one JSON object (see
 * write_counts).
 */
#define _GNU_SOURCE
#include "standin_lib.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>

#if !defined(STANDIN_CUPTI_MAJOR)
#error "build with -DSTANDIN_CUPTI_MAJOR=12 or 13"
#elif STANDIN_CUPTI_MAJOR == 13
#define CUPTI_VERSION_NUMBER 130500
#define KERNEL_RECORD_BYTES 248 /* CUpti_ActivityKernel13 */
#define MEMCPY_RECORD_BYTES 112 /* CUpti_ActivityMemcpy7 */
#define MEMSET_RECORD_BYTES 104 /* CUpti_ActivityMemset5 */
#elif STANDIN_CUPTI_MAJOR == 12
#define CUPTI_VERSION_NUMBER 28
#define KERNEL_RECORD_BYTES 208 /* CUpti_ActivityKernel9 */
#define MEMCPY_RECORD_BYTES 96  /* CUpti_ActivityMemcpy6 */
#define MEMSET_RECORD_BYTES 88  /* CUpti_ActivityMemset4 */
#else
#error "STANDIN_CUPTI_MAJOR must be 12 or 13"
#endif
#define SYNC_RECORD_BYTES 56 /* CUpti_ActivitySynchronization2 */

/* ------------------------------------------------------------------ cupti.h, as declared there */
typedef int CUptiResult;
#define CUPTI_SUCCESS 0
#define CUPTI_ERROR_INVALID_PARAMETER 1
#define CUPTI_ERROR_INVALID_OPERATION 7
#define CUPTI_ERROR_MAX_LIMIT_REACHED 12
#define CUPTI_ERROR_INVALID_KIND 21
#define CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED 39
#define CUPTI_ERROR_UNKNOWN 999

typedef int CUpti_ActivityKind;
#define CUPTI_ACTIVITY_KIND_MEMCPY 1
#define CUPTI_ACTIVITY_KIND_MEMSET 2
#define CUPTI_ACTIVITY_KIND_KERNEL 3
#define CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL 10
#define CUPTI_ACTIVITY_KIND_SYNCHRONIZATION 38
/* CUpti_ActivityFlag: MEMCPY_ASYNC and MEMSET_ASYNC are both 1 << 0. */
#define CUPTI_ACTIVITY_FLAG_ASYNC 1u
#define CUPTI_SYNCHRONIZATION_INVALID_VALUE 0xFFFFFFFFu

typedef int CUpti_CallbackDomain;
#define CUPTI_CB_DOMAIN_DRIVER_API 1
#define CUPTI_CB_DOMAIN_RUNTIME_API 2
typedef uint32_t CUpti_CallbackId;
typedef int CUpti_ActivityAttribute;
typedef int CUpti_ApiCallbackSite;
#define CUPTI_API_EXIT 1

typedef struct CUpti_Subscriber_st *CUpti_SubscriberHandle;
typedef void (*CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain domain,
                                   CUpti_CallbackId cbid, const void *cbdata);
typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size,
                                                 size_t *maxNumRecords);
typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext ctx, uint32_t streamId,
                                                  uint8_t *buffer, size_t size, size_t validSize);

#define RECORD __attribute__((packed, aligned(8)))
typedef struct RECORD {
    CUpti_ActivityKind kind;
} CUpti_Activity;

typedef struct {
    CUpti_ApiCallbackSite callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CUpti_CallbackData;
_Static_assert(offsetof(CUpti_CallbackData, symbolName) == 32, "CUpti_CallbackData layout");
_Static_assert(offsetof(CUpti_CallbackData, contextUid) == 48, "CUpti_CallbackData layout");
_Static_assert(offsetof(CUpti_CallbackData, correlationId) == 64, "CUpti_CallbackData layout");

/* ------------------------------------------------------------------ records (design note §2) */
/* Only the stable prefix is named; `unmodelled_N` (offset N) stays zero. */
struct RECORD kernel_record {
    uint32_t kind;
    uint8_t unmodelled_4[12];
    uint64_t start, end, completed;
    uint32_t deviceId, contextId, streamId;
    int32_t gridX, gridY, gridZ;
    int32_t blockX, blockY, blockZ;
    int32_t staticSharedMemory, dynamicSharedMemory;
    uint8_t unmodelled_84[8];
    uint32_t correlationId;
    int64_t gridId;
    const char *name;
    uint8_t unmodelled_112[8];
    uint64_t queued, submitted;
    uint8_t unmodelled_136[8];
    uint64_t graphNodeId;
    uint8_t unmodelled_152[4];
    uint32_t graphId;
    uint8_t unmodelled_160[KERNEL_RECORD_BYTES - 160];
};
_Static_assert(sizeof(struct kernel_record) == KERNEL_RECORD_BYTES, "kernel record size");
_Static_assert(offsetof(struct kernel_record, kind) == 0, "kernel record");
_Static_assert(offsetof(struct kernel_record, start) == 16, "kernel record");
_Static_assert(offsetof(struct kernel_record, end) == 24, "kernel record");
_Static_assert(offsetof(struct kernel_record, completed) == 32, "kernel record");
_Static_assert(offsetof(struct kernel_record, deviceId) == 40, "kernel record");
_Static_assert(offsetof(struct kernel_record, contextId) == 44, "kernel record");
_Static_assert(offsetof(struct kernel_record, streamId) == 48, "kernel record");
_Static_assert(offsetof(struct kernel_record, gridX) == 52, "kernel record");
_Static_assert(offsetof(struct kernel_record, gridY) == 56, "kernel record");
_Static_assert(offsetof(struct kernel_record, gridZ) == 60, "kernel record");
_Static_assert(offsetof(struct kernel_record, blockX) == 64, "kernel record");
_Static_assert(offsetof(struct kernel_record, blockY) == 68, "kernel record");
_Static_assert(offsetof(struct kernel_record, blockZ) == 72, "kernel record");
_Static_assert(offsetof(struct kernel_record, staticSharedMemory) == 76, "kernel record");
_Static_assert(offsetof(struct kernel_record, dynamicSharedMemory) == 80, "kernel record");
_Static_assert(offsetof(struct kernel_record, correlationId) == 92, "kernel record");
_Static_assert(offsetof(struct kernel_record, gridId) == 96, "kernel record");
_Static_assert(offsetof(struct kernel_record, name) == 104, "kernel record");
_Static_assert(offsetof(struct kernel_record, queued) == 120, "kernel record");
_Static_assert(offsetof(struct kernel_record, submitted) == 128, "kernel record");
_Static_assert(offsetof(struct kernel_record, graphNodeId) == 144, "kernel record");
_Static_assert(offsetof(struct kernel_record, graphId) == 156, "kernel record");

struct RECORD memcpy_record {
    uint32_t kind;
    uint8_t copyKind, srcKind, dstKind, flags;
    uint64_t bytes;
    uint64_t start, end;
    uint32_t deviceId, contextId, streamId, correlationId, runtimeCorrelationId;
    uint8_t unmodelled_52[12];
    uint64_t graphNodeId;
    uint32_t graphId;
    uint8_t unmodelled_76[MEMCPY_RECORD_BYTES - 76];
};
_Static_assert(sizeof(struct memcpy_record) == MEMCPY_RECORD_BYTES, "memcpy record size");
_Static_assert(offsetof(struct memcpy_record, kind) == 0, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, copyKind) == 4, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, srcKind) == 5, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, dstKind) == 6, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, flags) == 7, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, bytes) == 8, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, start) == 16, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, end) == 24, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, deviceId) == 32, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, contextId) == 36, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, streamId) == 40, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, correlationId) == 44, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, runtimeCorrelationId) == 48, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, graphNodeId) == 64, "memcpy record");
_Static_assert(offsetof(struct memcpy_record, graphId) == 72, "memcpy record");

struct RECORD memset_record {
    uint32_t kind;
    uint32_t value;
    uint64_t bytes;
    uint64_t start, end;
    uint32_t deviceId, contextId, streamId, correlationId;
    uint16_t flags, memoryKind;
    uint8_t unmodelled_52[MEMSET_RECORD_BYTES - 52];
};
_Static_assert(sizeof(struct memset_record) == MEMSET_RECORD_BYTES, "memset record size");
_Static_assert(offsetof(struct memset_record, kind) == 0, "memset record");
_Static_assert(offsetof(struct memset_record, value) == 4, "memset record");
_Static_assert(offsetof(struct memset_record, bytes) == 8, "memset record");
_Static_assert(offsetof(struct memset_record, start) == 16, "memset record");
_Static_assert(offsetof(struct memset_record, end) == 24, "memset record");
_Static_assert(offsetof(struct memset_record, deviceId) == 32, "memset record");
_Static_assert(offsetof(struct memset_record, contextId) == 36, "memset record");
_Static_assert(offsetof(struct memset_record, streamId) == 40, "memset record");
_Static_assert(offsetof(struct memset_record, correlationId) == 44, "memset record");
_Static_assert(offsetof(struct memset_record, flags) == 48, "memset record");
_Static_assert(offsetof(struct memset_record, memoryKind) == 50, "memset record");

struct RECORD sync_record {
    uint32_t kind;
    uint32_t type;
    uint64_t start, end;
    uint32_t correlationId, contextId, streamId, cudaEventId, cudaEventSyncId;
    uint8_t unmodelled_44[SYNC_RECORD_BYTES - 44];
};
_Static_assert(sizeof(struct sync_record) == SYNC_RECORD_BYTES, "sync record size");
_Static_assert(offsetof(struct sync_record, kind) == 0, "sync record");
_Static_assert(offsetof(struct sync_record, type) == 4, "sync record");
_Static_assert(offsetof(struct sync_record, start) == 8, "sync record");
_Static_assert(offsetof(struct sync_record, end) == 16, "sync record");
_Static_assert(offsetof(struct sync_record, correlationId) == 24, "sync record");
_Static_assert(offsetof(struct sync_record, contextId) == 28, "sync record");
_Static_assert(offsetof(struct sync_record, streamId) == 32, "sync record");
_Static_assert(offsetof(struct sync_record, cudaEventId) == 36, "sync record");
_Static_assert(offsetof(struct sync_record, cudaEventSyncId) == 40, "sync record");

#define DEVICE_ID 0
#define CONTEXT_ID 1

/* The size of a record of this kind in this version; 0 for a kind this library never writes. */
static size_t record_bytes(uint32_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY: return MEMCPY_RECORD_BYTES;
    case CUPTI_ACTIVITY_KIND_MEMSET: return MEMSET_RECORD_BYTES;
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return KERNEL_RECORD_BYTES;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: return SYNC_RECORD_BYTES;
    default: return 0;
    }
}

/* ------------------------------------------------------------------ counters */
/* Kinds that are counted by name in the counters; any other kind is "other". */
enum { KI_MEMCPY, KI_MEMSET, KI_KERNEL, KI_CONCURRENT_KERNEL, KI_SYNCHRONIZATION, KI_OTHER, KI_N };
static const char *const KIND_NAMES[KI_N] = {"memcpy", "memset", "kernel", "concurrent_kernel",
                                             "synchronization", "other"};
static int kind_index(int kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY: return KI_MEMCPY;
    case CUPTI_ACTIVITY_KIND_MEMSET: return KI_MEMSET;
    case CUPTI_ACTIVITY_KIND_KERNEL: return KI_KERNEL;
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return KI_CONCURRENT_KERNEL;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: return KI_SYNCHRONIZATION;
    default: return KI_OTHER;
    }
}

struct counters {
    unsigned long long subscribe, subscribe_refused, unsubscribe, finalize;
    unsigned long long enable_domain, enable_callback, register_callbacks, graph_callbacks;
    unsigned long long enable[KI_N], enable_and_dump[KI_N], disable[KI_N];
    unsigned long long enable_driver_api, set_attribute, flush;
    unsigned long long buffers_requested, buffers_declined, buffers_completed;
    unsigned long long activities, records_made, records[KI_N], records_dropped, api_exit_callbacks;
    unsigned long long latency_timestamps;
    /* Ground truth of the idle split: the emulated GPU's waits before each recorded kernel,
     * copy or memset but the first since kernels were enabled, split at the call: before it
     * (nothing queued) and after it (the kernel's launch latency, or the work ahead of it). */
    unsigned long long gap_host_ns, gap_launch_ns;
};

/* ------------------------------------------------------------------ state, under `mu` */
struct buffer {
    uint8_t *data; /* NULL: no buffer */
    size_t size, used, max_records, records;
    CUpti_BuffersCallbackCompleteFunc complete; /* of the registration that gave it */
};

struct CUpti_Subscriber_st {
    CUpti_CallbackFunc callback;
    void *userdata;
    uint32_t domains; /* bit (1 << domain) per enabled domain */
    uint32_t graph_cbids; /* bit 0: driver cbid 514 on, bit 1: 515 */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;    /* the worker waits */
static pthread_cond_t all_completed = PTHREAD_COND_INITIALIZER; /* flushers wait */

static struct CUpti_Subscriber_st subscriber;
static int subscribed;
static uint64_t enabled_kinds; /* bit (1 << kind) */
static CUpti_BuffersCallbackRequestFunc buffer_requested;
static CUpti_BuffersCallbackCompleteFunc buffer_completed;

static struct buffer current;
#define MAX_SPARE_BUFFERS 4
static struct buffer spare[MAX_SPARE_BUFFERS]; /* won by threads that raced for a buffer */
static int nspare;
static struct buffer *full; /* for the worker, oldest first */
static size_t nfull, cap_full;
static size_t completing; /* taken by the worker, not yet completed */
static int worker_running;
static pthread_t worker;

static uint64_t gpu_idle_at_ns;
/* Set by cuptiActivityEnableLatencyTimestamps: kernel records carry `queued`. */
static int latency_timestamps;
/* Whether a recorded device item came since kernels were last enabled (gap truth). */
static int gaps_started;
static uint32_t last_correlation_id;
static size_t dropped_unread;
static struct counters counts;

/* Read once at load. */
static uint64_t kernel_ns = 10000, copy_ns_per_kib = 100, launch_ns = 0;
#define MIN_COPY_NS 1000
#define MEMSET_NS 2000

__attribute__((constructor)) static void read_timing_env(void) {
    const char *v = getenv("ETHAND_STANDIN_CUPTI_KERNEL_NS");
    if (v && *v)
        kernel_ns = strtoull(v, NULL, 10);
    v = getenv("ETHAND_STANDIN_CUPTI_COPY_NS_PER_KIB");
    if (v && *v)
        copy_ns_per_kib = strtoull(v, NULL, 10);
    v = getenv("ETHAND_STANDIN_CUPTI_LAUNCH_NS");
    if (v && *v)
        launch_ns = strtoull(v, NULL, 10);
}

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ the worker */
static void *worker_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (nfull == 0)
            pthread_cond_wait(&work_ready, &mu);
        struct buffer b = full[0];
        memmove(&full[0], &full[1], (nfull - 1) * sizeof *full);
        nfull--;
        completing++;
        pthread_mutex_unlock(&mu);
        if (b.complete)
            b.complete(NULL, 0, b.data, b.size, b.used);
        pthread_mutex_lock(&mu);
        completing--;
        counts.buffers_completed++;
        pthread_cond_broadcast(&all_completed);
    }
    return NULL;
}

/* A forked child has no worker: the next full buffer starts one. */
static void reset_in_child(void) {
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&work_ready, NULL);
    pthread_cond_init(&all_completed, NULL);
    worker_running = 0;
    completing = 0;
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, reset_in_child); }

static void start_worker_locked(void) {
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, register_atfork);
    /* Signals stay with the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&worker, NULL, worker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        abort(); /* a test stand-in: buffers would never be completed */
    pthread_detach(worker);
    pthread_setname_np(worker, "cupti-standin");
    worker_running = 1;
}

static void queue_for_worker_locked(struct buffer b) {
    if (nfull == cap_full) {
        size_t cap = cap_full ? 2 * cap_full : 16;
        struct buffer *grown = realloc(full, cap * sizeof *grown);
        if (!grown)
            abort(); /* a test stand-in: losing a buffer silently would fake a result */
        full = grown;
        cap_full = cap;
    }
    full[nfull++] = b;
    if (!worker_running)
        start_worker_locked();
    pthread_cond_signal(&work_ready);
}

static int on_worker_thread(void) { return worker_running && pthread_equal(pthread_self(), worker); }

/* Waits until the worker has completed every full buffer. */
static void wait_all_completed_locked(void) {
    while (nfull > 0 || completing > 0)
        pthread_cond_wait(&all_completed, &mu);
}

/* Takes the current and spare buffers, to be completed by the caller once `mu` is released. */
static int take_held_buffers_locked(struct buffer out[1 + MAX_SPARE_BUFFERS]) {
    int n = 0;
    if (current.data)
        out[n++] = current;
    current.data = NULL;
    while (nspare > 0)
        out[n++] = spare[--nspare];
    return n;
}

static void complete_buffers(struct buffer *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].complete)
            b[i].complete(NULL, 0, b[i].data, b[i].size, b[i].used);
    pthread_mutex_lock(&mu);
    counts.buffers_completed += (unsigned long long)n;
    pthread_mutex_unlock(&mu);
}

/* Room for one record of `bytes` in `current`, or NULL: the record is dropped. Called with `mu`
 * held; releases it around bufferRequested, which may call back into this library. */
static uint8_t *room_for_locked(size_t bytes) {
    for (;;) {
        if (current.data && current.used + bytes <= current.size &&
            (current.max_records == 0 || current.records < current.max_records))
            return current.data + current.used;
        if (current.data) {
            queue_for_worker_locked(current);
            current.data = NULL;
        }
        if (nspare > 0) {
            current = spare[--nspare];
            continue;
        }
        CUpti_BuffersCallbackRequestFunc request = buffer_requested;
        CUpti_BuffersCallbackCompleteFunc complete = buffer_completed;
        if (!request)
            return NULL;
        counts.buffers_requested++;
        uint8_t *data = NULL;
        size_t size = 0, max_records = 0;
        pthread_mutex_unlock(&mu);
        request(&data, &size, &max_records);
        pthread_mutex_lock(&mu);
        if (!data) {
            counts.buffers_declined++;
            return NULL;
        }
        struct buffer b = {data, size, 0, max_records, 0, complete};
        if (size < bytes) {
            /* Too small for any record: handed back empty. */
            counts.buffers_declined++;
            queue_for_worker_locked(b);
            return NULL;
        }
        if (!current.data)
            current = b;
        else if (nspare < MAX_SPARE_BUFFERS)
            spare[nspare++] = b;
        else
            queue_for_worker_locked(b);
    }
}

/* The record kind an activity becomes under the enabled kinds; 0: none. */
static int record_kind_locked(uint32_t activity) {
    uint64_t on = enabled_kinds;
#define ON(k) ((on >> (k)) & 1)
    switch (activity) {
    case STANDIN_ACTIVITY_KERNEL:
        return ON(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
               : ON(CUPTI_ACTIVITY_KIND_KERNEL)          ? CUPTI_ACTIVITY_KIND_KERNEL
                                                         : 0;
    case STANDIN_ACTIVITY_MEMCPY: return ON(CUPTI_ACTIVITY_KIND_MEMCPY) ? CUPTI_ACTIVITY_KIND_MEMCPY : 0;
    case STANDIN_ACTIVITY_MEMSET: return ON(CUPTI_ACTIVITY_KIND_MEMSET) ? CUPTI_ACTIVITY_KIND_MEMSET : 0;
    case STANDIN_ACTIVITY_SYNC:
        return ON(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) ? CUPTI_ACTIVITY_KIND_SYNCHRONIZATION : 0;
    default: return 0;
    }
#undef ON
}

/* When the emulated GPU runs it: serial work for kernels, copies and memsets; the host's wait
 * for syncs. */
static void schedule_locked(const struct standin_activity *a, uint64_t now_ns, uint64_t *start,
                            uint64_t *end) {
    uint64_t called = a->call_start_ns ? a->call_start_ns : now_ns;
    uint64_t duration;
    switch (a->kind) {
    case STANDIN_ACTIVITY_SYNC:
        *start = called;
        *end = now_ns > called ? now_ns : called;
        return;
    case STANDIN_ACTIVITY_KERNEL: duration = kernel_ns; break;
    case STANDIN_ACTIVITY_MEMCPY:
        duration = a->bytes * copy_ns_per_kib / 1024;
        if (duration < MIN_COPY_NS)
            duration = MIN_COPY_NS;
        break;
    default: duration = MEMSET_NS; break;
    }
    uint64_t ready = a->kind == STANDIN_ACTIVITY_KERNEL ? called + launch_ns : called;
    *start = ready > gpu_idle_at_ns ? ready : gpu_idle_at_ns;
    *end = *start + duration;
}

static void write_record(uint8_t *dst, int kind, const struct standin_activity *a, uint32_t corr,
                         uint64_t start, uint64_t end, uint64_t called) {
    switch (a->kind) {
    case STANDIN_ACTIVITY_KERNEL: {
        struct kernel_record r;
        memset(&r, 0, sizeof r);
        r.kind = (uint32_t)kind;
        r.start = start;
        r.end = end;
        r.completed = end;
        r.deviceId = DEVICE_ID;
        r.contextId = CONTEXT_ID;
        r.streamId = a->stream;
        r.gridX = (int32_t)a->grid_x, r.gridY = (int32_t)a->grid_y, r.gridZ = (int32_t)a->grid_z;
        r.blockX = (int32_t)a->block_x, r.blockY = (int32_t)a->block_y, r.blockZ = (int32_t)a->block_z;
        r.dynamicSharedMemory = (int32_t)a->dynamic_shared_bytes;
        r.correlationId = corr;
        r.gridId = corr;
        r.name = a->name;
        r.queued = latency_timestamps ? called : 0;
        memcpy(dst, &r, sizeof r);
        break;
    }
    case STANDIN_ACTIVITY_MEMCPY: {
        struct memcpy_record r;
        memset(&r, 0, sizeof r);
        r.kind = (uint32_t)kind;
        r.copyKind = (uint8_t)a->copy_kind;
        r.srcKind = (uint8_t)a->src_kind;
        r.dstKind = (uint8_t)a->dst_kind;
        r.flags = a->async ? CUPTI_ACTIVITY_FLAG_ASYNC : 0;
        r.bytes = a->bytes;
        r.start = start;
        r.end = end;
        r.deviceId = DEVICE_ID;
        r.contextId = CONTEXT_ID;
        r.streamId = a->stream;
        r.correlationId = corr;
        memcpy(dst, &r, sizeof r);
        break;
    }
    case STANDIN_ACTIVITY_MEMSET: {
        struct memset_record r;
        memset(&r, 0, sizeof r);
        r.kind = (uint32_t)kind;
        r.value = a->memset_value;
        r.bytes = a->bytes;
        r.start = start;
        r.end = end;
        r.deviceId = DEVICE_ID;
        r.contextId = CONTEXT_ID;
        r.streamId = a->stream;
        r.correlationId = corr;
        r.flags = a->async ? CUPTI_ACTIVITY_FLAG_ASYNC : 0;
        r.memoryKind = STANDIN_CUPTI_MEMORY_DEVICE;
        memcpy(dst, &r, sizeof r);
        break;
    }
    case STANDIN_ACTIVITY_SYNC: {
        struct sync_record r;
        memset(&r, 0, sizeof r);
        r.kind = (uint32_t)kind;
        r.type = a->sync_type;
        r.start = start;
        r.end = end;
        r.correlationId = corr;
        r.contextId = CONTEXT_ID;
        r.streamId = a->sync_type == STANDIN_CUPTI_SYNC_STREAM ? a->stream : CUPTI_SYNCHRONIZATION_INVALID_VALUE;
        r.cudaEventId = a->sync_type == STANDIN_CUPTI_SYNC_EVENT ? a->event : CUPTI_SYNCHRONIZATION_INVALID_VALUE;
        r.cudaEventSyncId = CUPTI_SYNCHRONIZATION_INVALID_VALUE;
        memcpy(dst, &r, sizeof r);
        break;
    }
    }
}

/* A graph launch: only its callback, where one is on. */
static void on_graph_launch(const struct standin_activity *a) {
    int ptsz = strcmp(a->api, "cuGraphLaunch_ptsz") == 0;
    CUpti_CallbackFunc callback = NULL;
    void *userdata = NULL;
    pthread_mutex_lock(&mu);
    if (subscribed && subscriber.callback &&
        ((subscriber.graph_cbids & (ptsz ? 2u : 1u)) ||
         (subscriber.domains & (1u << CUPTI_CB_DOMAIN_DRIVER_API)))) {
        callback = subscriber.callback;
        userdata = subscriber.userdata;
        counts.graph_callbacks++;
    }
    uint32_t corr = ++last_correlation_id;
    pthread_mutex_unlock(&mu);
    if (callback) {
        static CUresult success = CUDA_SUCCESS;
        CUpti_CallbackData data = {
            .callbackSite = CUPTI_API_EXIT,
            .functionName = a->api,
            .functionReturnValue = &success,
            .contextUid = CONTEXT_ID,
            .correlationId = corr,
        };
        callback(userdata, CUPTI_CB_DOMAIN_DRIVER_API, ptsz ? 515 : 514, &data);
    }
}

/* The hook libcuda calls, from any application thread. */
static void on_activity(const struct standin_activity *a) {
    if (a->kind == STANDIN_ACTIVITY_GRAPH_LAUNCH) {
        on_graph_launch(a);
        return;
    }
    uint64_t now_ns = realtime_ns();
    pthread_mutex_lock(&mu);
    counts.activities++;
    int kind = record_kind_locked(a->kind);
    uint8_t *dst = kind ? room_for_locked(record_bytes((uint32_t)kind)) : NULL;
    /* Ids and times are taken on the same hold of `mu` as the write: records of a buffer are in
     * correlation and start order. */
    uint32_t corr = ++last_correlation_id;
    uint64_t start, end;
    uint64_t idle_at = gpu_idle_at_ns;
    schedule_locked(a, now_ns, &start, &end);
    uint64_t called = a->call_start_ns ? a->call_start_ns : now_ns;
    if (a->kind != STANDIN_ACTIVITY_SYNC) {
        gpu_idle_at_ns = end;
        if (dst && gaps_started && start > idle_at) {
            uint64_t host_until = called < start ? called : start;
            counts.gap_host_ns += host_until > idle_at ? host_until - idle_at : 0;
            counts.gap_launch_ns += start - (host_until > idle_at ? host_until : idle_at);
        }
        gaps_started |= dst != NULL;
    }
    if (dst) {
        write_record(dst, kind, a, corr, start, end, called);
        current.used += record_bytes((uint32_t)kind);
        current.records++;
        counts.records_made++;
        counts.records[kind_index(kind)]++;
    } else if (kind) {
        dropped_unread++;
        counts.records_dropped++;
    }
    CUpti_CallbackFunc callback = NULL;
    void *userdata = NULL;
    CUpti_CallbackDomain domain = CUPTI_CB_DOMAIN_DRIVER_API;
    if (subscribed && subscriber.callback) {
        if (subscriber.domains & (1u << CUPTI_CB_DOMAIN_DRIVER_API))
            callback = subscriber.callback;
        else if (subscriber.domains & (1u << CUPTI_CB_DOMAIN_RUNTIME_API))
            callback = subscriber.callback, domain = CUPTI_CB_DOMAIN_RUNTIME_API;
        userdata = subscriber.userdata;
        if (callback)
            counts.api_exit_callbacks++;
    }
    pthread_mutex_unlock(&mu);
    if (callback) {
        static CUresult success = CUDA_SUCCESS;
        CUpti_CallbackData data = {
            .callbackSite = CUPTI_API_EXIT,
            .functionName = a->api,
            .functionReturnValue = &success,
            .symbolName = a->kind == STANDIN_ACTIVITY_KERNEL ? a->name : NULL,
            .contextUid = CONTEXT_ID,
            .correlationId = corr,
        };
        callback(userdata, domain, 0, &data);
    }
}

/* ------------------------------------------------------------------ finding libcuda */
typedef void (*set_hook_fn)(void (*hook)(const struct standin_activity *a));
struct cuda_lib {
    void *handle; /* kept open while attached: the hook must not outlive the library */
    set_hook_fn set_hook;
};
#define MAX_CUDA_LIBS 8
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cuda_lib cuda_libs[MAX_CUDA_LIBS];
static int ncuda_libs;
static int attached;

static void add_cuda_lib(void *handle) {
    if (!handle)
        return;
    set_hook_fn set_hook = (set_hook_fn)dlsym(handle, "ethand_standin_cuda_set_activity_hook");
    int known = 0;
    for (int i = 0; i < ncuda_libs; i++)
        known |= cuda_libs[i].set_hook == set_hook;
    if (!set_hook || known || ncuda_libs == MAX_CUDA_LIBS) {
        dlclose(handle);
        return;
    }
    cuda_libs[ncuda_libs++] = (struct cuda_lib){handle, set_hook};
}

struct cuda_paths {
    char path[MAX_CUDA_LIBS][4096];
    int n;
};

static int collect_cuda_path(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct cuda_paths *paths = data;
    const char *name = info->dlpi_name;
    size_t len = name ? strlen(name) : 0;
    const char *suffix = "/libcuda.so.1";
    size_t slen = strlen(suffix);
    if (len > slen && len < sizeof paths->path[0] && strcmp(name + len - slen, suffix) == 0 &&
        paths->n < MAX_CUDA_LIBS)
        memcpy(paths->path[paths->n++], name, len + 1);
    return 0;
}

static void attach_to_cuda(void) {
    if (__atomic_load_n(&attached, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&attach_mu);
    if (!attached) {
        add_cuda_lib(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD));
        /* dlopen() is not called from inside dl_iterate_phdr's callback. */
        static struct cuda_paths paths;
        paths.n = 0;
        dl_iterate_phdr(collect_cuda_path, &paths);
        for (int i = 0; i < paths.n; i++)
            add_cuda_lib(dlopen(paths.path[i], RTLD_NOW | RTLD_NOLOAD));
        for (int i = 0; i < ncuda_libs; i++)
            cuda_libs[i].set_hook(on_activity);
        if (ncuda_libs > 0)
            __atomic_store_n(&attached, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_mu);
}

static void detach_from_cuda(void) {
    pthread_mutex_lock(&attach_mu);
    for (int i = 0; i < ncuda_libs; i++) {
        cuda_libs[i].set_hook(NULL);
        dlclose(cuda_libs[i].handle);
    }
    ncuda_libs = 0;
    __atomic_store_n(&attached, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&attach_mu);
}

/* ------------------------------------------------------------------ the API */
/* Every export bumps its own counter (HIT); ATTACH also looks for libcuda. */
#define ATTACH() attach_to_cuda()

EXPORT CUptiResult cuptiGetVersion(uint32_t *version) {
    HIT();
    if (!version)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *version = CUPTI_VERSION_NUMBER;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
    HIT();
    if (!str)
        return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_INVALID_OPERATION: *str = "CUPTI_ERROR_INVALID_OPERATION"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return result == CUPTI_ERROR_UNKNOWN ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
    }
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetTimestamp(uint64_t *timestamp) {
    HIT();
    if (!timestamp)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *timestamp = realtime_ns();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *handle, CUpti_CallbackFunc callback, void *userdata) {
    HIT();
    if (!handle)
        return CUPTI_ERROR_INVALID_PARAMETER;
    ATTACH();
    const char *busy = getenv("ETHAND_STANDIN_CUPTI_BUSY");
    CUptiResult rc = CUPTI_SUCCESS;
    pthread_mutex_lock(&mu);
    counts.subscribe++;
    if ((busy && strcmp(busy, "1") == 0) || subscribed) {
        counts.subscribe_refused++;
        rc = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    } else {
        subscriber = (struct CUpti_Subscriber_st){callback, userdata, 0};
        subscribed = 1;
        *handle = &subscriber;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle handle) {
    HIT();
    CUptiResult rc = CUPTI_SUCCESS;
    pthread_mutex_lock(&mu);
    counts.unsubscribe++;
    if (subscribed && handle == &subscriber) {
        subscribed = 0;
        subscriber = (struct CUpti_Subscriber_st){NULL, NULL, 0};
    } else {
        rc = CUPTI_ERROR_INVALID_PARAMETER;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle handle, CUpti_CallbackDomain domain) {
    HIT();
    ATTACH();
    CUptiResult rc = CUPTI_SUCCESS;
    pthread_mutex_lock(&mu);
    counts.enable_domain++;
    if (!subscribed || handle != &subscriber || domain <= 0 || domain >= 32)
        rc = CUPTI_ERROR_INVALID_PARAMETER;
    else if (enable)
        subscriber.domains |= 1u << domain;
    else
        subscriber.domains &= ~(1u << domain);
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle handle, CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    HIT();
    ATTACH();
    CUptiResult rc = CUPTI_SUCCESS;
    pthread_mutex_lock(&mu);
    counts.enable_callback++;
    if (!subscribed || handle != &subscriber)
        rc = CUPTI_ERROR_INVALID_PARAMETER;
    else if (domain == CUPTI_CB_DOMAIN_DRIVER_API && (cbid == 514 || cbid == 515)) {
        uint32_t bit = cbid == 514 ? 1u : 2u;
        subscriber.graph_cbids = enable ? subscriber.graph_cbids | bit : subscriber.graph_cbids & ~bit;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested, CUpti_BuffersCallbackCompleteFunc funcBufferCompleted) {
    HIT();
    if (!funcBufferRequested || !funcBufferCompleted)
        return CUPTI_ERROR_INVALID_PARAMETER;
    ATTACH();
    pthread_mutex_lock(&mu);
    counts.register_callbacks++;
    buffer_requested = funcBufferRequested;
    buffer_completed = funcBufferCompleted;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

static CUptiResult set_kind(CUpti_ActivityKind kind, int on, unsigned long long *counter) {
    if (kind <= 0 || kind >= 64)
        return CUPTI_ERROR_INVALID_KIND;
    pthread_mutex_lock(&mu);
    counter[kind_index(kind)]++;
    if (on && (kind == CUPTI_ACTIVITY_KIND_KERNEL || kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL))
        gaps_started = 0;
    if (on)
        enabled_kinds |= 1ULL << kind;
    else
        enabled_kinds &= ~(1ULL << kind);
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
    HIT();
    ATTACH();
    return set_kind(kind, 1, counts.enable);
}

/* Real CUPTI also re-emits DEVICE/CONTEXT/STREAM records; the stand-in writes none of those. */
EXPORT CUptiResult cuptiActivityEnableAndDump(CUpti_ActivityKind kind) {
    HIT();
    ATTACH();
    return set_kind(kind, 1, counts.enable_and_dump);
}

EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
    HIT();
    return set_kind(kind, 0, counts.disable);
}

/* Counted only: the stand-in writes no DRIVER records. */
EXPORT CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
    HIT();
    ATTACH();
    pthread_mutex_lock(&mu);
    counts.enable_driver_api++;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

/* Kernel records carry `queued` (the launch call's time) while on. */
EXPORT CUptiResult cuptiActivityEnableLatencyTimestamps(uint8_t enable) {
    HIT();
    pthread_mutex_lock(&mu);
    counts.latency_timestamps++;
    latency_timestamps = enable != 0;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

/* Counted only: buffer sizes and pools do not change anything here. */
EXPORT CUptiResult cuptiActivitySetAttribute(CUpti_ActivityAttribute attr, size_t *valueSize, void *value) {
    HIT();
    ATTACH();
    pthread_mutex_lock(&mu);
    counts.set_attribute++;
    pthread_mutex_unlock(&mu);
    return valueSize && value ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    HIT();
    ATTACH();
    struct buffer held[1 + MAX_SPARE_BUFFERS];
    pthread_mutex_lock(&mu);
    counts.flush++;
    /* CUPTI forbids it from a buffer callback; here it would wait for itself. */
    if (on_worker_thread()) {
        pthread_mutex_unlock(&mu);
        return CUPTI_ERROR_INVALID_OPERATION;
    }
    wait_all_completed_locked();
    int n = take_held_buffers_locked(held);
    pthread_mutex_unlock(&mu);
    complete_buffers(held, n);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record) {
    HIT();
    if (!buffer || !record)
        return CUPTI_ERROR_INVALID_PARAMETER;
    size_t offset = 0;
    if (*record) {
        const uint8_t *at = (const uint8_t *)*record;
        if (at < buffer || at >= buffer + validBufferSizeBytes)
            return CUPTI_ERROR_INVALID_PARAMETER;
        size_t step = record_bytes((*record)->kind);
        if (!step)
            return CUPTI_ERROR_INVALID_KIND;
        offset = (size_t)(at - buffer) + step;
    }
    if (offset >= validBufferSizeBytes || validBufferSizeBytes - offset < sizeof(uint32_t))
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    uint32_t kind;
    memcpy(&kind, buffer + offset, sizeof kind);
    size_t bytes = record_bytes(kind);
    if (!bytes)
        return CUPTI_ERROR_INVALID_KIND;
    if (validBufferSizeBytes - offset < bytes)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)(buffer + offset);
    return CUPTI_SUCCESS;
}

/* Global count (ctx and streamId are ignored, as for ctx NULL), reset by the read. */
EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped) {
    HIT();
    if (!dropped)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    *dropped = dropped_unread;
    dropped_unread = 0;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

/* Detach: every kind and domain off, the subscriber gone, held buffers completed (after the
 * worker's), the buffer callbacks forgotten, the hook removed from libcuda. Counters, correlation
 * ids and the emulated GPU's clock go on. A later ATTACH call starts again. */
EXPORT CUptiResult cuptiFinalize(void) {
    HIT();
    struct buffer held[1 + MAX_SPARE_BUFFERS];
    pthread_mutex_lock(&mu);
    counts.finalize++;
    enabled_kinds = 0;
    subscribed = 0;
    subscriber = (struct CUpti_Subscriber_st){NULL, NULL, 0};
    if (!on_worker_thread())
        wait_all_completed_locked();
    int n = take_held_buffers_locked(held);
    buffer_requested = NULL;
    buffer_completed = NULL;
    pthread_mutex_unlock(&mu);
    complete_buffers(held, n);
    detach_from_cuda();
    return CUPTI_SUCCESS;
}

/* ------------------------------------------------------------------ counters for ground truth */
static void json_kinds(char **at, size_t *left, const char *key, const unsigned long long *v) {
    int w = snprintf(*at, *left, ",\"%s\":{", key);
    for (int k = 0; k < KI_N && w >= 0 && (size_t)w < *left; k++) {
        *at += w, *left -= (size_t)w;
        w = snprintf(*at, *left, "%s\"%s\":%llu", k ? "," : "", KIND_NAMES[k], v[k]);
    }
    if (w >= 0 && (size_t)w < *left) {
        *at += w, *left -= (size_t)w;
        w = snprintf(*at, *left, "}");
    }
    if (w >= 0 && (size_t)w < *left)
        *at += w, *left -= (size_t)w;
    else
        *left = 0;
}

/* One JSON object: {"version", "subscribe", "subscribe_refused", "unsubscribe", "finalize",
 * "enable_domain", "enable_callback", "register_callbacks", "graph_callbacks", "enable_driver_api",
 * "set_attribute", "flush", "buffers_requested", "buffers_declined", "buffers_completed",
 * "activities" (hook calls), "records_made", "records_dropped", "api_exit_callbacks",
 * "attached" (0/1: the hook is registered in a libcuda), "latency_timestamps" (calls of
 * cuptiActivityEnableLatencyTimestamps), "gap_host_ns" and "gap_launch_ns" (the idle split's
 * ground truth, see struct counters), and the
 * objects by kind "enable", "enable_and_dump", "disable", "records" (keys memcpy, memset, kernel,
 * concurrent_kernel, synchronization, other)}. Truncated to "" if cap is too small. */
EXPORT void ethand_standin_cupti_counts(char *json, size_t cap) {
    HIT();
    if (!json || cap == 0)
        return;
    pthread_mutex_lock(&mu);
    struct counters c = counts;
    pthread_mutex_unlock(&mu);
    char *at = json;
    size_t left = cap;
    int w = snprintf(at, left,
                     "{\"version\":%u,\"subscribe\":%llu,\"subscribe_refused\":%llu,"
                     "\"unsubscribe\":%llu,\"finalize\":%llu,\"enable_domain\":%llu,"
                     "\"enable_callback\":%llu,\"register_callbacks\":%llu,\"graph_callbacks\":%llu,"
                     "\"enable_driver_api\":%llu,\"set_attribute\":%llu,\"flush\":%llu,"
                     "\"buffers_requested\":%llu,\"buffers_declined\":%llu,"
                     "\"buffers_completed\":%llu,\"activities\":%llu,\"records_made\":%llu,"
                     "\"records_dropped\":%llu,"
                     "\"api_exit_callbacks\":%llu,\"attached\":%d,"
                     "\"latency_timestamps\":%llu,\"gap_host_ns\":%llu,\"gap_launch_ns\":%llu",
                     CUPTI_VERSION_NUMBER, c.subscribe, c.subscribe_refused, c.unsubscribe,
                     c.finalize, c.enable_domain, c.enable_callback, c.register_callbacks, c.graph_callbacks,
                     c.enable_driver_api, c.set_attribute, c.flush, c.buffers_requested,
                     c.buffers_declined, c.buffers_completed, c.activities, c.records_made, c.records_dropped,
                     c.api_exit_callbacks, __atomic_load_n(&attached, __ATOMIC_ACQUIRE),
                     c.latency_timestamps, c.gap_host_ns, c.gap_launch_ns);
    if (w < 0 || (size_t)w >= left) {
        json[0] = 0;
        return;
    }
    at += w, left -= (size_t)w;
    json_kinds(&at, &left, "enable", c.enable);
    json_kinds(&at, &left, "enable_and_dump", c.enable_and_dump);
    json_kinds(&at, &left, "disable", c.disable);
    json_kinds(&at, &left, "records", c.records);
    if (left < 2) {
        json[0] = 0;
        return;
    }
    snprintf(at, left, "}");
}

STANDIN_HITS_CHECK();
