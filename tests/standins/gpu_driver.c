/*
 * gpu_driver: calls GPU/NPU runtime libraries (the stand-ins of this directory) through
 * dlopen/dlsym following a plan, and prints the exact ground truth of what it did as ONE JSON
 * line on stdout when the plan is done. ethand's end-to-end tests compare ethand's counts with
 * it.
 *
 *   gpu_driver [--sync-us N] [--SLOT PATH]... [--] WORD...
 *
 * SLOT: cuda, nccl, acl, hccl (dlopen(PATH, RTLD_NOW|RTLD_LOCAL)) or cuda2, nccl2, acl2, hccl2
 * (dlmopen(LM_ID_NEWLM, PATH, RTLD_NOW|RTLD_LOCAL): a second copy of a runtime, really mapped
 * again even if it is the same file). `ready` goes to stderr once these are open.
 * --sync-us N: how long each synchronization of the stand-ins sleeps (sets
 * ETHAND_STANDIN_SYNC_US before loading them; default: that variable, else 1000).
 *
 * The plan (words may also be passed several to an argument, separated by blanks):
 *   control:  sleep MS | wait_stdin | mark NAME | use SLOT | dlopen_late SLOT PATH |
 *             dlclose SLOT | fork_idle (a child that sleeps until the driver ends; prints
 *             `forked PID` on stderr)
 *   counts:   OP [N] | OP x N                  launches, graphs, groups, executions, syncs
 *   sync:     sync stream|stream_ptsz|ctx|ctx_v2|event [N]
 *   allocs:   OP SIZE [x N]                     (SIZE > 1 TiB fails: an error, no bytes)
 *   frees:    free all|K                        the K oldest live allocations, each with the
 *                                               free function of its kind, in its library
 *             OP all|K                          a free symbol: the K oldest live allocations
 *                                               it frees, made through the current slot
 *             untracked_free N                  cuMemFree_v2 of never-allocated addresses
 *   copies:   OP SIZE [x N]
 *             memcpy2d* WxH htod|dtoh|dtod|htoh [x N]
 *             acl_memcpy* SIZE KIND [x N]       KIND 0..4 or h2h h2d d2h d2d default
 *   colls:    OP COUNT DTYPE [x N]              DTYPE: a number or a type name
 *   comms:    comm_init_rank* RANK NRANKS | comm_init_all NDEV | comm_split |
 *             hccl_comm_init_root_info NRANKS RANK | hccl_comm_init_cluster_info RANK
 *             (each [x N])
 *   cuda:     cuinit                            cuInit(0) of the current cuda slot (the stand-in
 *                                               loads CUDA_INJECTION64_PATH on the first one)
 *             kernel NAME [x N]                 cuModuleGetFunction(&f, module, NAME), then N
 *                                               cuLaunchKernel(f, grid 1,1,1, block 128,1,1,
 *                                               NULL stream): counted as cuLaunchKernel calls
 *             cupti_take_buffers                what torch.profiler does when it starts inside a
 *                                               window: registers its own activity buffer
 *                                               callbacks with the loaded stand-in CUPTI
 *                                               (records go to it from then on)
 *             wait_cupti_enabled                until a stand-in CUPTI loaded in the process
 *                                               has kernel activity enabled (an injection
 *                                               library opened a window); prints
 *                                               `cupti enabled` on stderr; fails after 20 s
 * OP is a catalog symbol name (cuMemAlloc_v2) or its alias (alloc); see SYMBOLS below.
 * Numbers take binary suffixes K M G T (4K = 4096). Runtime ops use the current slot of
 * their runtime: cuda, nccl, acl, hccl unless `use SLOT` chose another.
 *
 * The ground truth also has "kernels": {NAME: launches by `kernel`, ...} and "cupti": the
 * counters of a loaded stand-in CUPTI (ethand_standin_cupti_counts of libcupti.so.13, else
 * libcupti.so.12, found with RTLD_NOLOAD), or null when none is loaded.
 *
 * Build: gcc -O1 -Wall -o gpu_driver gpu_driver.c -ldl
 */
#define _GNU_SOURCE
#include "standins.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

enum { RT_CUDA, RT_NCCL, RT_ACL, RT_HCCL, RT_N };
static const char *const RT_NAMES[RT_N] = {"cuda", "nccl", "ascendcl", "hccl"};

/* ethand_common::gpu_mem */
enum { MEM_DEVICE, MEM_MANAGED, MEM_HOST_PINNED, MEM_HOST_REGISTERED, MEM_N };
static const char *const MEM_NAMES[MEM_N] = {"device", "managed", "host_pinned", "host_registered"};
/* ethand_common::gpu_dir */
enum { D_H2D, D_D2H, D_D2D, D_PEER, D_DEFAULT, D_H2H, D_N };
static const char *const DIR_NAMES[D_N] = {"host_to_device", "device_to_host", "device_to_device",
                                           "peer", "default", "host_to_host"};
/* What frees an allocation. */
enum { FC_CUDA_DEV, FC_CUDA_HOST, FC_CUDA_REG, FC_ACL_DEV, FC_ACL_HOST, FC_N };

enum kind { K_COUNT, K_SYNC, K_ALLOC, K_REGISTER, K_FREE, K_COPY, K_COPY2D, K_ACLCOPY, K_COLL, K_COMM };

/* X(symbol, alias, runtime, kind, param): param is the memory kind of an allocation, the free
 * class of a free, the direction of a copy. */
#define SYMBOLS(X)                                                                             \
    X(cuLaunchKernel, "launches", RT_CUDA, K_COUNT, 0)                                        \
    X(cuLaunchKernel_ptsz, "launches_ptsz", RT_CUDA, K_COUNT, 0)                              \
    X(cuLaunchKernelEx, "launch_ex", RT_CUDA, K_COUNT, 0)                                     \
    X(cuLaunchKernelEx_ptsz, "launch_ex_ptsz", RT_CUDA, K_COUNT, 0)                           \
    X(cuLaunchCooperativeKernel, "launch_coop", RT_CUDA, K_COUNT, 0)                          \
    X(cuLaunchCooperativeKernel_ptsz, "launch_coop_ptsz", RT_CUDA, K_COUNT, 0)                \
    X(cuGraphLaunch, "graph", RT_CUDA, K_COUNT, 0)                                            \
    X(cuGraphLaunch_ptsz, "graph_ptsz", RT_CUDA, K_COUNT, 0)                                  \
    X(cuMemAlloc_v2, "alloc", RT_CUDA, K_ALLOC, MEM_DEVICE)                                   \
    X(cuMemAllocAsync, "alloc_async", RT_CUDA, K_ALLOC, MEM_DEVICE)                           \
    X(cuMemAllocAsync_ptsz, "alloc_async_ptsz", RT_CUDA, K_ALLOC, MEM_DEVICE)                 \
    X(cuMemAllocFromPoolAsync, "alloc_pool", RT_CUDA, K_ALLOC, MEM_DEVICE)                    \
    X(cuMemAllocFromPoolAsync_ptsz, "alloc_pool_ptsz", RT_CUDA, K_ALLOC, MEM_DEVICE)          \
    X(cuMemAllocManaged, "alloc_managed", RT_CUDA, K_ALLOC, MEM_MANAGED)                      \
    X(cuMemFree_v2, "cuda_free", RT_CUDA, K_FREE, FC_CUDA_DEV)                                \
    X(cuMemFreeAsync, "free_async", RT_CUDA, K_FREE, FC_CUDA_DEV)                             \
    X(cuMemFreeAsync_ptsz, "free_async_ptsz", RT_CUDA, K_FREE, FC_CUDA_DEV)                   \
    X(cuMemAllocHost_v2, "alloc_host", RT_CUDA, K_ALLOC, MEM_HOST_PINNED)                     \
    X(cuMemHostAlloc, "host_alloc", RT_CUDA, K_ALLOC, MEM_HOST_PINNED)                        \
    X(cuMemFreeHost, "free_host", RT_CUDA, K_FREE, FC_CUDA_HOST)                              \
    X(cuMemHostRegister_v2, "host_register", RT_CUDA, K_REGISTER, MEM_HOST_REGISTERED)        \
    X(cuMemHostUnregister, "host_unregister", RT_CUDA, K_FREE, FC_CUDA_REG)                   \
    X(cuMemcpyHtoD_v2, "htod", RT_CUDA, K_COPY, D_H2D)                                        \
    X(cuMemcpyHtoD_v2_ptds, "htod_ptds", RT_CUDA, K_COPY, D_H2D)                              \
    X(cuMemcpyHtoDAsync_v2, "htod_async", RT_CUDA, K_COPY, D_H2D)                             \
    X(cuMemcpyHtoDAsync_v2_ptsz, "htod_async_ptsz", RT_CUDA, K_COPY, D_H2D)                   \
    X(cuMemcpyDtoH_v2, "dtoh", RT_CUDA, K_COPY, D_D2H)                                        \
    X(cuMemcpyDtoH_v2_ptds, "dtoh_ptds", RT_CUDA, K_COPY, D_D2H)                              \
    X(cuMemcpyDtoHAsync_v2, "dtoh_async", RT_CUDA, K_COPY, D_D2H)                             \
    X(cuMemcpyDtoHAsync_v2_ptsz, "dtoh_async_ptsz", RT_CUDA, K_COPY, D_D2H)                   \
    X(cuMemcpyDtoD_v2, "dtod", RT_CUDA, K_COPY, D_D2D)                                        \
    X(cuMemcpyDtoD_v2_ptds, "dtod_ptds", RT_CUDA, K_COPY, D_D2D)                              \
    X(cuMemcpyDtoDAsync_v2, "dtod_async", RT_CUDA, K_COPY, D_D2D)                             \
    X(cuMemcpyDtoDAsync_v2_ptsz, "dtod_async_ptsz", RT_CUDA, K_COPY, D_D2D)                   \
    X(cuMemcpy, "memcpy_default", RT_CUDA, K_COPY, D_DEFAULT)                                 \
    X(cuMemcpy_ptds, "memcpy_default_ptds", RT_CUDA, K_COPY, D_DEFAULT)                       \
    X(cuMemcpyAsync, "memcpy_async", RT_CUDA, K_COPY, D_DEFAULT)                              \
    X(cuMemcpyAsync_ptsz, "memcpy_async_ptsz", RT_CUDA, K_COPY, D_DEFAULT)                    \
    X(cuMemcpyPeer, "peer", RT_CUDA, K_COPY, D_PEER)                                          \
    X(cuMemcpyPeer_ptds, "peer_ptds", RT_CUDA, K_COPY, D_PEER)                                \
    X(cuMemcpyPeerAsync, "peer_async", RT_CUDA, K_COPY, D_PEER)                               \
    X(cuMemcpyPeerAsync_ptsz, "peer_async_ptsz", RT_CUDA, K_COPY, D_PEER)                     \
    X(cuMemcpy2D_v2, "memcpy2d", RT_CUDA, K_COPY2D, 0)                                        \
    X(cuMemcpy2D_v2_ptds, "memcpy2d_ptds", RT_CUDA, K_COPY2D, 0)                              \
    X(cuMemcpy2DAsync_v2, "memcpy2d_async", RT_CUDA, K_COPY2D, 0)                             \
    X(cuMemcpy2DAsync_v2_ptsz, "memcpy2d_async_ptsz", RT_CUDA, K_COPY2D, 0)                   \
    X(cuStreamSynchronize, "sync_stream", RT_CUDA, K_SYNC, 0)                                 \
    X(cuStreamSynchronize_ptsz, "sync_stream_ptsz", RT_CUDA, K_SYNC, 0)                       \
    X(cuCtxSynchronize, "sync_ctx", RT_CUDA, K_SYNC, 0)                                       \
    X(cuCtxSynchronize_v2, "sync_ctx_v2", RT_CUDA, K_SYNC, 0)                                 \
    X(cuEventSynchronize, "sync_event", RT_CUDA, K_SYNC, 0)                                   \
    X(ncclAllReduce, "allreduce", RT_NCCL, K_COLL, 0)                                         \
    X(ncclAllGather, "allgather", RT_NCCL, K_COLL, 0)                                         \
    X(ncclReduceScatter, "reduce_scatter", RT_NCCL, K_COLL, 0)                                \
    X(ncclBroadcast, "broadcast", RT_NCCL, K_COLL, 0)                                         \
    X(ncclBcast, "bcast", RT_NCCL, K_COLL, 0)                                                 \
    X(ncclReduce, "reduce", RT_NCCL, K_COLL, 0)                                               \
    X(ncclAlltoAll, "alltoall", RT_NCCL, K_COLL, 0)                                           \
    X(ncclSend, "send", RT_NCCL, K_COLL, 0)                                                   \
    X(ncclRecv, "recv", RT_NCCL, K_COLL, 0)                                                   \
    X(ncclGroupStart, "group_start", RT_NCCL, K_COUNT, 0)                                     \
    X(ncclGroupEnd, "group_end", RT_NCCL, K_COUNT, 0)                                         \
    X(ncclCommInitRank, "comm_init_rank", RT_NCCL, K_COMM, 0)                                 \
    X(ncclCommInitRankConfig, "comm_init_rank_config", RT_NCCL, K_COMM, 0)                    \
    X(ncclCommInitRankScalable, "comm_init_rank_scalable", RT_NCCL, K_COMM, 0)                \
    X(ncclCommInitAll, "comm_init_all", RT_NCCL, K_COMM, 0)                                   \
    X(ncclCommSplit, "comm_split", RT_NCCL, K_COMM, 0)                                        \
    X(aclrtMalloc, "acl_malloc", RT_ACL, K_ALLOC, MEM_DEVICE)                                 \
    X(aclrtMallocCached, "acl_malloc_cached", RT_ACL, K_ALLOC, MEM_DEVICE)                    \
    X(aclrtFree, "acl_free", RT_ACL, K_FREE, FC_ACL_DEV)                                      \
    X(aclrtMallocHost, "acl_malloc_host", RT_ACL, K_ALLOC, MEM_HOST_PINNED)                   \
    X(aclrtFreeHost, "acl_free_host", RT_ACL, K_FREE, FC_ACL_HOST)                            \
    X(aclrtMemcpy, "acl_memcpy", RT_ACL, K_ACLCOPY, 0)                                        \
    X(aclrtMemcpyAsync, "acl_memcpy_async", RT_ACL, K_ACLCOPY, 0)                             \
    X(aclrtSynchronizeStream, "acl_sync_stream", RT_ACL, K_SYNC, 0)                           \
    X(aclrtSynchronizeStreamWithTimeout, "acl_sync_stream_timeout", RT_ACL, K_SYNC, 0)        \
    X(aclrtSynchronizeDevice, "acl_sync_device", RT_ACL, K_SYNC, 0)                           \
    X(aclrtSynchronizeEvent, "acl_sync_event", RT_ACL, K_SYNC, 0)                             \
    X(aclopExecute, "acl_op_execute", RT_ACL, K_COUNT, 0)                                     \
    X(aclopExecuteV2, "acl_op_execute_v2", RT_ACL, K_COUNT, 0)                                \
    X(aclopCompileAndExecute, "acl_op_compile_execute", RT_ACL, K_COUNT, 0)                   \
    X(aclopCompileAndExecuteV2, "acl_op_compile_execute_v2", RT_ACL, K_COUNT, 0)              \
    X(aclmdlExecute, "acl_mdl_execute", RT_ACL, K_COUNT, 0)                                   \
    X(aclmdlExecuteAsync, "acl_mdl_execute_async", RT_ACL, K_COUNT, 0)                        \
    X(HcclAllReduce, "hccl_allreduce", RT_HCCL, K_COLL, 0)                                    \
    X(HcclAllGather, "hccl_allgather", RT_HCCL, K_COLL, 0)                                    \
    X(HcclReduceScatter, "hccl_reduce_scatter", RT_HCCL, K_COLL, 0)                           \
    X(HcclBroadcast, "hccl_broadcast", RT_HCCL, K_COLL, 0)                                    \
    X(HcclAlltoAll, "hccl_alltoall", RT_HCCL, K_COLL, 0)                                      \
    X(HcclSend, "hccl_send", RT_HCCL, K_COLL, 0)                                              \
    X(HcclRecv, "hccl_recv", RT_HCCL, K_COLL, 0)                                              \
    X(HcclCommInitRootInfo, "hccl_comm_init_root_info", RT_HCCL, K_COMM, 0)                   \
    X(HcclCommInitClusterInfo, "hccl_comm_init_cluster_info", RT_HCCL, K_COMM, 0)

#define X_ENUM(sym, alias, rt, kind, param) S_##sym,
enum { SYMBOLS(X_ENUM) S_N };
struct symdef {
    const char *name, *alias;
    int rt;
    enum kind kind;
    int param;
};
#define X_DEF(sym, alias, rt, kind, param) {#sym, alias, rt, kind, param},
static const struct symdef SYMS[S_N] = {SYMBOLS(X_DEF)};

/* The default free of each free class. */
static const int FREE_SYM[FC_N] = {S_cuMemFree_v2, S_cuMemFreeHost, S_cuMemHostUnregister,
                                   S_aclrtFree, S_aclrtFreeHost};

/* ------------------------------------------------------------------ ground truth */
struct tally {
    unsigned long long calls, errors, bytes, min_time_ns;
    unsigned long long dir_calls[D_N], dir_bytes[D_N];
};
/* One per distinct library path. */
struct lib {
    char *path;
    int rt;
    int newns;
    struct tally st[S_N];
};
#define MAX_LIBS 32
static struct lib libs[MAX_LIBS];
static int nlibs;

struct slot {
    const char *name;
    int rt, newns;
    void *handle;
    int lib; /* index into libs; -1: never loaded */
    void *fn[S_N];
};
static struct slot slots[] = {
    {"cuda", RT_CUDA, 0, NULL, -1, {0}}, {"nccl", RT_NCCL, 0, NULL, -1, {0}},
    {"acl", RT_ACL, 0, NULL, -1, {0}},   {"hccl", RT_HCCL, 0, NULL, -1, {0}},
    {"cuda2", RT_CUDA, 1, NULL, -1, {0}}, {"nccl2", RT_NCCL, 1, NULL, -1, {0}},
    {"acl2", RT_ACL, 1, NULL, -1, {0}},   {"hccl2", RT_HCCL, 1, NULL, -1, {0}},
};
#define NSLOTS ((int)(sizeof slots / sizeof slots[0]))
static int current[RT_N] = {0, 1, 2, 3};

struct alloc {
    int slot, fclass, mem;
    unsigned long long ptr, size;
    void *buf;         /* registration: the buffer to release after unregistering */
    size_t buf_mapped; /* ... mmap()ed with this length, or 0 for malloc() */
};
static struct alloc *allocs;
static size_t nallocs, cap_allocs;

static unsigned long long live[MEM_N], peak[MEM_N], untracked_frees;

struct comm {
    int lib, sym;
    long long rank, nranks; /* -1: unknown */
};
static struct comm *comms;
static size_t ncomms, cap_comms;

static unsigned int sync_us = STANDIN_SYNC_US_DEFAULT;

/* ------------------------------------------------------------------ helpers */
static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("gpu_driver: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}
#define PLAN_ERROR(...) die(2, __VA_ARGS__)
static void do_wait_cupti_enabled(void);
static void do_cupti_take_buffers(void);
static int read_cupti_counts(char *json, size_t cap);

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n);
    if (!p)
        die(1, "out of memory");
    return p;
}

/* The plan, one word per element. */
static char **words;
static int nwords, pos;

static const char *next_word(const char *what) {
    if (pos >= nwords)
        PLAN_ERROR("plan ends where %s was expected", what);
    return words[pos++];
}
static const char *peek_word(void) { return pos < nwords ? words[pos] : NULL; }

static int is_number(const char *s) {
    if (!s || !isdigit((unsigned char)*s))
        return 0;
    while (isdigit((unsigned char)*s))
        s++;
    return *s == 0 || ((strchr("KMGTkmgt", *s) != NULL) && s[1] == 0);
}

/* Decimal with an optional binary suffix K M G T. */
static unsigned long long parse_num(const char *s, const char *what) {
    if (!is_number(s))
        PLAN_ERROR("%s: expected a number (with an optional K/M/G/T suffix), got '%s'", what, s);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    }
    if (errno || (shift && v > (~0ULL >> shift)))
        PLAN_ERROR("%s: '%s' is out of range", what, s);
    return v << shift;
}

/* `x N` after an op: how many times; 1 without. */
static unsigned long long opt_times(void) {
    const char *w = peek_word();
    if (w && strcmp(w, "x") == 0) {
        pos++;
        return parse_num(next_word("a repeat count after x"), "x");
    }
    return 1;
}

/* Count ops: `OP`, `OP N` or `OP x N`. */
static unsigned long long opt_count(void) {
    const char *w = peek_word();
    if (is_number(w)) {
        pos++;
        return parse_num(w, "count");
    }
    return opt_times();
}

static struct slot *slot_named(const char *name) {
    for (int i = 0; i < NSLOTS; i++)
        if (strcmp(slots[i].name, name) == 0)
            return &slots[i];
    PLAN_ERROR("no slot '%s' (cuda nccl acl hccl cuda2 nccl2 acl2 hccl2)", name);
    return NULL;
}

static int lib_for(const char *path, int rt, int newns) {
    for (int i = 0; i < nlibs; i++)
        if (strcmp(libs[i].path, path) == 0)
            return i;
    if (nlibs == MAX_LIBS)
        die(1, "more than %d libraries", MAX_LIBS);
    libs[nlibs].path = strdup(path);
    libs[nlibs].rt = rt;
    libs[nlibs].newns = newns;
    return nlibs++;
}

static void load(struct slot *s, const char *path) {
    if (s->handle)
        PLAN_ERROR("slot %s is already open", s->name);
    dlerror();
    s->handle = s->newns ? dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL)
                         : dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!s->handle)
        die(1, "cannot open %s for slot %s: %s", path, s->name, dlerror());
    for (int i = 0; i < S_N; i++)
        s->fn[i] = SYMS[i].rt == s->rt ? dlsym(s->handle, SYMS[i].name) : NULL;
    s->lib = lib_for(path, s->rt, s->newns);
}

static struct slot *cur(int rt) {
    struct slot *s = &slots[current[rt]];
    if (!s->handle)
        PLAN_ERROR("no %s library is open in slot %s", RT_NAMES[rt], s->name);
    return s;
}

static struct tally *stat_of(struct slot *s, int sym) { return &libs[s->lib].st[sym]; }

/* The function `name` of slot s, typed as the real prototype. */
#define FN(s, name)                                                                            \
    ((__typeof__(name) *)need_fn((s), S_##name))
static void *need_fn(struct slot *s, int sym) {
    if (!s->fn[sym])
        die(1, "%s does not export %s", libs[s->lib].path, SYMS[sym].name);
    return s->fn[sym];
}

static void expect_ok(int rc, int sym) {
    if (rc != 0)
        die(1, "%s returned %d", SYMS[sym].name, rc);
}

static void sleep_ms(unsigned long long ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* Fake handles and buffers: the stand-ins never dereference what they are given. */
static char host_buf[256];
#define FAKE_DEV ((CUdeviceptr)0xd0000000ULL)
#define FAKE_HANDLE(n) ((void *)(uintptr_t)(0x1000u * (n)))

/* ------------------------------------------------------------------ ops */
static void do_count(int sym, unsigned long long n) {
    struct slot *s = cur(SYMS[sym].rt);
    CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    CUfunction f = FAKE_HANDLE(1);
    CUstream st = FAKE_HANDLE(2);
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        switch (sym) {
        case S_cuLaunchKernel: rc = FN(s, cuLaunchKernel)(f, 1, 1, 1, 32, 1, 1, 0, st, NULL, NULL); break;
        case S_cuLaunchKernel_ptsz: rc = FN(s, cuLaunchKernel_ptsz)(f, 1, 1, 1, 32, 1, 1, 0, st, NULL, NULL); break;
        case S_cuLaunchKernelEx: rc = FN(s, cuLaunchKernelEx)(&cfg, f, NULL, NULL); break;
        case S_cuLaunchKernelEx_ptsz: rc = FN(s, cuLaunchKernelEx_ptsz)(&cfg, f, NULL, NULL); break;
        case S_cuLaunchCooperativeKernel: rc = FN(s, cuLaunchCooperativeKernel)(f, 1, 1, 1, 32, 1, 1, 0, st, NULL); break;
        case S_cuLaunchCooperativeKernel_ptsz: rc = FN(s, cuLaunchCooperativeKernel_ptsz)(f, 1, 1, 1, 32, 1, 1, 0, st, NULL); break;
        case S_cuGraphLaunch: rc = FN(s, cuGraphLaunch)(FAKE_HANDLE(3), st); break;
        case S_cuGraphLaunch_ptsz: rc = FN(s, cuGraphLaunch_ptsz)(FAKE_HANDLE(3), st); break;
        case S_ncclGroupStart: rc = FN(s, ncclGroupStart)(); break;
        case S_ncclGroupEnd: rc = FN(s, ncclGroupEnd)(); break;
        case S_aclopExecute: rc = FN(s, aclopExecute)("Add", 0, NULL, NULL, 0, NULL, NULL, NULL, st); break;
        case S_aclopExecuteV2: rc = FN(s, aclopExecuteV2)("Add", 0, NULL, NULL, 0, NULL, NULL, NULL, st); break;
        case S_aclopCompileAndExecute: rc = FN(s, aclopCompileAndExecute)("Add", 0, NULL, NULL, 0, NULL, NULL, NULL, ACL_ENGINE_SYS, ACL_COMPILE_SYS, NULL, st); break;
        case S_aclopCompileAndExecuteV2: rc = FN(s, aclopCompileAndExecuteV2)("Add", 0, NULL, NULL, 0, NULL, NULL, NULL, ACL_ENGINE_SYS, ACL_COMPILE_SYS, NULL, st); break;
        case S_aclmdlExecute: rc = FN(s, aclmdlExecute)(1, NULL, NULL); break;
        case S_aclmdlExecuteAsync: rc = FN(s, aclmdlExecuteAsync)(1, NULL, NULL, st); break;
        /* syncs */
        case S_cuStreamSynchronize: rc = FN(s, cuStreamSynchronize)(st); break;
        case S_cuStreamSynchronize_ptsz: rc = FN(s, cuStreamSynchronize_ptsz)(st); break;
        case S_cuCtxSynchronize: rc = FN(s, cuCtxSynchronize)(); break;
        case S_cuCtxSynchronize_v2: rc = FN(s, cuCtxSynchronize_v2)(NULL); break;
        case S_cuEventSynchronize: rc = FN(s, cuEventSynchronize)(FAKE_HANDLE(4)); break;
        case S_aclrtSynchronizeStream: rc = FN(s, aclrtSynchronizeStream)(st); break;
        case S_aclrtSynchronizeStreamWithTimeout: rc = FN(s, aclrtSynchronizeStreamWithTimeout)(st, -1); break;
        case S_aclrtSynchronizeDevice: rc = FN(s, aclrtSynchronizeDevice)(); break;
        case S_aclrtSynchronizeEvent: rc = FN(s, aclrtSynchronizeEvent)(FAKE_HANDLE(4)); break;
        default: die(1, "internal: %s is not a count op", SYMS[sym].name); return;
        }
        expect_ok(rc, sym);
        struct tally *t = stat_of(s, sym);
        t->calls++;
        if (SYMS[sym].kind == K_SYNC)
            t->min_time_ns += (unsigned long long)sync_us * 1000ULL;
    }
}

static void add_alloc(struct slot *s, int fclass, int mem, unsigned long long ptr,
                      unsigned long long size, void *buf, size_t buf_mapped) {
    if (nallocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        allocs = xrealloc(allocs, cap_allocs * sizeof *allocs);
    }
    allocs[nallocs++] = (struct alloc){(int)(s - slots), fclass, mem, ptr, size, buf, buf_mapped};
    live[mem] += size;
    if (live[mem] > peak[mem])
        peak[mem] = live[mem];
}

static void do_alloc(int sym, unsigned long long size, unsigned long long n) {
    struct slot *s = cur(SYMS[sym].rt);
    int mem = SYMS[sym].param;
    int fclass = s->rt == RT_ACL ? (mem == MEM_DEVICE ? FC_ACL_DEV : FC_ACL_HOST)
                                 : (mem == MEM_HOST_PINNED ? FC_CUDA_HOST : FC_CUDA_DEV);
    for (unsigned long long i = 0; i < n; i++) {
        CUdeviceptr d = 0;
        void *h = NULL;
        int rc;
        switch (sym) {
        case S_cuMemAlloc_v2: rc = FN(s, cuMemAlloc_v2)(&d, size); break;
        case S_cuMemAllocAsync: rc = FN(s, cuMemAllocAsync)(&d, size, FAKE_HANDLE(2)); break;
        case S_cuMemAllocAsync_ptsz: rc = FN(s, cuMemAllocAsync_ptsz)(&d, size, FAKE_HANDLE(2)); break;
        case S_cuMemAllocFromPoolAsync: rc = FN(s, cuMemAllocFromPoolAsync)(&d, size, FAKE_HANDLE(5), FAKE_HANDLE(2)); break;
        case S_cuMemAllocFromPoolAsync_ptsz: rc = FN(s, cuMemAllocFromPoolAsync_ptsz)(&d, size, FAKE_HANDLE(5), FAKE_HANDLE(2)); break;
        case S_cuMemAllocManaged: rc = FN(s, cuMemAllocManaged)(&d, size, 1 /* CU_MEM_ATTACH_GLOBAL */); break;
        case S_cuMemAllocHost_v2: rc = FN(s, cuMemAllocHost_v2)(&h, size); break;
        case S_cuMemHostAlloc: rc = FN(s, cuMemHostAlloc)(&h, size, 0); break;
        case S_aclrtMalloc: rc = FN(s, aclrtMalloc)(&h, size, ACL_MEM_MALLOC_HUGE_FIRST); break;
        case S_aclrtMallocCached: rc = FN(s, aclrtMallocCached)(&h, size, ACL_MEM_MALLOC_HUGE_FIRST); break;
        case S_aclrtMallocHost: rc = FN(s, aclrtMallocHost)(&h, size); break;
        default: die(1, "internal: %s is not an allocation", SYMS[sym].name); return;
        }
        struct tally *t = stat_of(s, sym);
        t->calls++;
        if (rc != 0) {
            t->errors++;
            continue;
        }
        unsigned long long ptr = h ? (unsigned long long)(uintptr_t)h : d;
        if (ptr == 0)
            die(1, "%s succeeded but wrote no address", SYMS[sym].name);
        t->bytes += size;
        add_alloc(s, fclass, mem, ptr, size, NULL, 0);
    }
}

static void do_register(unsigned long long size, unsigned long long n) {
    struct slot *s = cur(RT_CUDA);
    for (unsigned long long i = 0; i < n; i++) {
        void *buf;
        size_t mapped = 0;
        if (size <= STANDIN_HOST_MALLOC_MAX) {
            buf = malloc(size ? size : 1);
            if (!buf)
                die(1, "malloc(%llu) failed", size);
        } else {
            /* A reservation of the real size: a unique range, nothing committed. */
            buf = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (buf == MAP_FAILED)
                die(1, "cannot reserve %llu bytes to register", size);
            mapped = size;
        }
        int rc = FN(s, cuMemHostRegister_v2)(buf, size, 0);
        struct tally *t = stat_of(s, S_cuMemHostRegister_v2);
        t->calls++;
        if (rc != 0) {
            t->errors++;
            if (mapped)
                munmap(buf, mapped);
            else
                free(buf);
            continue;
        }
        t->bytes += size;
        add_alloc(s, FC_CUDA_REG, MEM_HOST_REGISTERED, (unsigned long long)(uintptr_t)buf, size,
                  buf, mapped);
    }
}

/* Frees allocation i with free symbol sym (through the allocation's own slot). */
static void free_one(size_t i, int sym) {
    struct alloc a = allocs[i];
    struct slot *s = &slots[a.slot];
    if (!s->handle)
        die(1, "allocation of %s freed after its library was closed", s->name);
    void *h = (void *)(uintptr_t)a.ptr;
    int rc;
    switch (sym) {
    case S_cuMemFree_v2: rc = FN(s, cuMemFree_v2)(a.ptr); break;
    case S_cuMemFreeAsync: rc = FN(s, cuMemFreeAsync)(a.ptr, FAKE_HANDLE(2)); break;
    case S_cuMemFreeAsync_ptsz: rc = FN(s, cuMemFreeAsync_ptsz)(a.ptr, FAKE_HANDLE(2)); break;
    case S_cuMemFreeHost: rc = FN(s, cuMemFreeHost)(h); break;
    case S_cuMemHostUnregister: rc = FN(s, cuMemHostUnregister)(h); break;
    case S_aclrtFree: rc = FN(s, aclrtFree)(h); break;
    case S_aclrtFreeHost: rc = FN(s, aclrtFreeHost)(h); break;
    default: die(1, "internal: %s is not a free", SYMS[sym].name); return;
    }
    expect_ok(rc, sym);
    struct tally *t = stat_of(s, sym);
    t->calls++;
    t->bytes += a.size;
    live[a.mem] -= a.size;
    if (a.buf) {
        if (a.buf_mapped)
            munmap(a.buf, a.buf_mapped);
        else
            free(a.buf);
    }
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof *allocs);
    nallocs--;
}

/* `free all|K` (sym < 0: each with its default free) or `FREESYM all|K`. */
static void do_free(int sym) {
    const char *w = next_word("all or a number of allocations to free");
    int all = strcmp(w, "all") == 0;
    unsigned long long k = all ? ~0ULL : parse_num(w, "free");
    int want_slot = sym >= 0 ? current[SYMS[sym].rt] : -1;
    if (sym >= 0)
        cur(SYMS[sym].rt);
    unsigned long long done = 0;
    size_t i = 0;
    while (done < k && i < nallocs) {
        struct alloc *a = &allocs[i];
        if (sym < 0) {
            free_one(i, FREE_SYM[a->fclass]);
        } else if (a->fclass == SYMS[sym].param && a->slot == want_slot) {
            free_one(i, sym);
        } else {
            i++;
            continue;
        }
        done++;
    }
    if (!all && done < k)
        PLAN_ERROR("%s %llu: only %llu live allocations to free", sym >= 0 ? SYMS[sym].name : "free",
                   k, done);
}

static void do_untracked_free(unsigned long long n) {
    struct slot *s = cur(RT_CUDA);
    for (unsigned long long i = 0; i < n; i++) {
        /* Below any mapping of this process: never an allocation. */
        CUdeviceptr p = 0xdead0000ULL + (i % 0x10000) * 256;
        expect_ok(FN(s, cuMemFree_v2)(p), S_cuMemFree_v2);
        stat_of(s, S_cuMemFree_v2)->calls++;
        untracked_frees++;
    }
}

static void count_copy(struct slot *s, int sym, int dir, unsigned long long bytes) {
    struct tally *t = stat_of(s, sym);
    t->calls++;
    t->bytes += bytes;
    t->dir_calls[dir]++;
    t->dir_bytes[dir] += bytes;
}

static void do_copy(int sym, unsigned long long size, unsigned long long n) {
    struct slot *s = cur(RT_CUDA);
    CUstream st = FAKE_HANDLE(2);
    CUcontext c0 = FAKE_HANDLE(6), c1 = FAKE_HANDLE(7);
    CUdeviceptr d0 = FAKE_DEV, d1 = FAKE_DEV + 0x100000;
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        switch (sym) {
        case S_cuMemcpyHtoD_v2: rc = FN(s, cuMemcpyHtoD_v2)(d0, host_buf, size); break;
        case S_cuMemcpyHtoD_v2_ptds: rc = FN(s, cuMemcpyHtoD_v2_ptds)(d0, host_buf, size); break;
        case S_cuMemcpyHtoDAsync_v2: rc = FN(s, cuMemcpyHtoDAsync_v2)(d0, host_buf, size, st); break;
        case S_cuMemcpyHtoDAsync_v2_ptsz: rc = FN(s, cuMemcpyHtoDAsync_v2_ptsz)(d0, host_buf, size, st); break;
        case S_cuMemcpyDtoH_v2: rc = FN(s, cuMemcpyDtoH_v2)(host_buf, d0, size); break;
        case S_cuMemcpyDtoH_v2_ptds: rc = FN(s, cuMemcpyDtoH_v2_ptds)(host_buf, d0, size); break;
        case S_cuMemcpyDtoHAsync_v2: rc = FN(s, cuMemcpyDtoHAsync_v2)(host_buf, d0, size, st); break;
        case S_cuMemcpyDtoHAsync_v2_ptsz: rc = FN(s, cuMemcpyDtoHAsync_v2_ptsz)(host_buf, d0, size, st); break;
        case S_cuMemcpyDtoD_v2: rc = FN(s, cuMemcpyDtoD_v2)(d1, d0, size); break;
        case S_cuMemcpyDtoD_v2_ptds: rc = FN(s, cuMemcpyDtoD_v2_ptds)(d1, d0, size); break;
        case S_cuMemcpyDtoDAsync_v2: rc = FN(s, cuMemcpyDtoDAsync_v2)(d1, d0, size, st); break;
        case S_cuMemcpyDtoDAsync_v2_ptsz: rc = FN(s, cuMemcpyDtoDAsync_v2_ptsz)(d1, d0, size, st); break;
        case S_cuMemcpy: rc = FN(s, cuMemcpy)(d1, d0, size); break;
        case S_cuMemcpy_ptds: rc = FN(s, cuMemcpy_ptds)(d1, d0, size); break;
        case S_cuMemcpyAsync: rc = FN(s, cuMemcpyAsync)(d1, d0, size, st); break;
        case S_cuMemcpyAsync_ptsz: rc = FN(s, cuMemcpyAsync_ptsz)(d1, d0, size, st); break;
        case S_cuMemcpyPeer: rc = FN(s, cuMemcpyPeer)(d1, c1, d0, c0, size); break;
        case S_cuMemcpyPeer_ptds: rc = FN(s, cuMemcpyPeer_ptds)(d1, c1, d0, c0, size); break;
        case S_cuMemcpyPeerAsync: rc = FN(s, cuMemcpyPeerAsync)(d1, c1, d0, c0, size, st); break;
        case S_cuMemcpyPeerAsync_ptsz: rc = FN(s, cuMemcpyPeerAsync_ptsz)(d1, c1, d0, c0, size, st); break;
        default: die(1, "internal: %s is not a copy", SYMS[sym].name); return;
        }
        expect_ok(rc, sym);
        count_copy(s, sym, SYMS[sym].param, size);
    }
}

static void do_copy2d(int sym, unsigned long long w, unsigned long long h, const char *dirw,
                      unsigned long long n) {
    struct slot *s = cur(RT_CUDA);
    CUmemorytype src, dst;
    int dir;
    if (strcmp(dirw, "htod") == 0) {
        src = CU_MEMORYTYPE_HOST, dst = CU_MEMORYTYPE_DEVICE, dir = D_H2D;
    } else if (strcmp(dirw, "dtoh") == 0) {
        src = CU_MEMORYTYPE_DEVICE, dst = CU_MEMORYTYPE_HOST, dir = D_D2H;
    } else if (strcmp(dirw, "dtod") == 0) {
        src = CU_MEMORYTYPE_DEVICE, dst = CU_MEMORYTYPE_DEVICE, dir = D_D2D;
    } else if (strcmp(dirw, "htoh") == 0) {
        src = CU_MEMORYTYPE_HOST, dst = CU_MEMORYTYPE_HOST, dir = D_H2H;
    } else {
        PLAN_ERROR("%s: direction must be htod, dtoh, dtod or htoh, not '%s'", SYMS[sym].name, dirw);
        return;
    }
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = src;
    c.dstMemoryType = dst;
    if (src == CU_MEMORYTYPE_HOST)
        c.srcHost = host_buf;
    else
        c.srcDevice = FAKE_DEV;
    if (dst == CU_MEMORYTYPE_HOST)
        c.dstHost = host_buf;
    else
        c.dstDevice = FAKE_DEV + 0x100000;
    c.srcPitch = c.dstPitch = w;
    c.WidthInBytes = w;
    c.Height = h;
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        switch (sym) {
        case S_cuMemcpy2D_v2: rc = FN(s, cuMemcpy2D_v2)(&c); break;
        case S_cuMemcpy2D_v2_ptds: rc = FN(s, cuMemcpy2D_v2_ptds)(&c); break;
        case S_cuMemcpy2DAsync_v2: rc = FN(s, cuMemcpy2DAsync_v2)(&c, FAKE_HANDLE(2)); break;
        case S_cuMemcpy2DAsync_v2_ptsz: rc = FN(s, cuMemcpy2DAsync_v2_ptsz)(&c, FAKE_HANDLE(2)); break;
        default: die(1, "internal: %s is not a 2D copy", SYMS[sym].name); return;
        }
        expect_ok(rc, sym);
        count_copy(s, sym, dir, w * h);
    }
}

static void do_aclcopy(int sym, unsigned long long size, const char *kindw, unsigned long long n) {
    static const char *const names[] = {"h2h", "h2d", "d2h", "d2d", "default"};
    static const int dirs[] = {D_H2H, D_H2D, D_D2H, D_D2D, D_DEFAULT}; /* gpu_dir::ACL_KINDS */
    int kind = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(kindw, names[i]) == 0)
            kind = i;
    if (kind < 0 && is_number(kindw) && parse_num(kindw, "kind") < 5)
        kind = (int)parse_num(kindw, "kind");
    if (kind < 0)
        PLAN_ERROR("%s: kind must be 0..4 or h2h h2d d2h d2d default, not '%s'", SYMS[sym].name, kindw);
    struct slot *s = cur(RT_ACL);
    void *dst = kind == 0 || kind == 2 ? (void *)host_buf : (void *)(uintptr_t)FAKE_DEV;
    const void *src = kind <= 1 ? (const void *)host_buf : (const void *)(uintptr_t)FAKE_DEV;
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        if (sym == S_aclrtMemcpy)
            rc = FN(s, aclrtMemcpy)(dst, size, src, size, (aclrtMemcpyKind)kind);
        else
            rc = FN(s, aclrtMemcpyAsync)(dst, size, src, size, (aclrtMemcpyKind)kind, FAKE_HANDLE(2));
        expect_ok(rc, sym);
        count_copy(s, sym, dirs[kind], size);
    }
}

/* ethand_common::gpu_dtype */
static const unsigned NCCL_SIZES[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char *const NCCL_TYPES[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                         "float16", "float32", "float64", "bfloat16",
                                         "float8e4m3", "float8e5m2"};
static const unsigned HCCL_SIZES[] = {1, 2, 4, 2, 4, 8, 8, 1, 2, 4, 8, 2, 16};
static const char *const HCCL_TYPES[] = {"int8", "int16", "int32", "fp16", "fp32", "int64", "uint64",
                                         "uint8", "uint16", "uint32", "fp64", "bfp16", "int128"};

static int parse_dtype(int rt, const char *w) {
    const char *const *names = rt == RT_HCCL ? HCCL_TYPES : NCCL_TYPES;
    int n = rt == RT_HCCL ? 13 : 12;
    for (int i = 0; i < n; i++)
        if (strcmp(w, names[i]) == 0)
            return i;
    if (rt == RT_NCCL) {
        static const struct { const char *name; int v; } more[] = {
            {"char", 0}, {"int", 2}, {"half", 6}, {"float", 7}, {"double", 8}};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
            if (strcmp(w, more[i].name) == 0)
                return more[i].v;
    }
    if (is_number(w) && parse_num(w, "dtype") < (unsigned long long)n)
        return (int)parse_num(w, "dtype");
    PLAN_ERROR("'%s' is not a %s data type", w, RT_NAMES[rt]);
    return -1;
}

static void do_coll(int sym, unsigned long long count, int dt, unsigned long long n) {
    int rt = SYMS[sym].rt;
    struct slot *s = cur(rt);
    unsigned long long bytes = count * (rt == RT_HCCL ? HCCL_SIZES[dt] : NCCL_SIZES[dt]);
    void *sb = FAKE_HANDLE(0x100), *rb = FAKE_HANDLE(0x200);
    void *comm = FAKE_HANDLE(0x300), *st = FAKE_HANDLE(2);
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        switch (sym) {
        case S_ncclAllReduce: rc = FN(s, ncclAllReduce)(sb, rb, count, dt, ncclSum, comm, st); break;
        case S_ncclAllGather: rc = FN(s, ncclAllGather)(sb, rb, count, dt, comm, st); break;
        case S_ncclReduceScatter: rc = FN(s, ncclReduceScatter)(sb, rb, count, dt, ncclSum, comm, st); break;
        case S_ncclBroadcast: rc = FN(s, ncclBroadcast)(sb, rb, count, dt, 0, comm, st); break;
        case S_ncclBcast: rc = FN(s, ncclBcast)(sb, count, dt, 0, comm, st); break;
        case S_ncclReduce: rc = FN(s, ncclReduce)(sb, rb, count, dt, ncclSum, 0, comm, st); break;
        case S_ncclAlltoAll: rc = FN(s, ncclAlltoAll)(sb, rb, count, dt, comm, st); break;
        case S_ncclSend: rc = FN(s, ncclSend)(sb, count, dt, 1, comm, st); break;
        case S_ncclRecv: rc = FN(s, ncclRecv)(rb, count, dt, 1, comm, st); break;
        case S_HcclAllReduce: rc = FN(s, HcclAllReduce)(sb, rb, count, dt, HCCL_REDUCE_SUM, comm, st); break;
        case S_HcclAllGather: rc = FN(s, HcclAllGather)(sb, rb, count, dt, comm, st); break;
        case S_HcclReduceScatter: rc = FN(s, HcclReduceScatter)(sb, rb, count, dt, HCCL_REDUCE_SUM, comm, st); break;
        case S_HcclBroadcast: rc = FN(s, HcclBroadcast)(sb, count, dt, 0, comm, st); break;
        case S_HcclAlltoAll: rc = FN(s, HcclAlltoAll)(sb, count, dt, rb, count, dt, comm, st); break;
        case S_HcclSend: rc = FN(s, HcclSend)(sb, count, dt, 1, comm, st); break;
        case S_HcclRecv: rc = FN(s, HcclRecv)(rb, count, dt, 1, comm, st); break;
        default: die(1, "internal: %s is not a collective", SYMS[sym].name); return;
        }
        expect_ok(rc, sym);
        struct tally *t = stat_of(s, sym);
        t->calls++;
        t->bytes += bytes;
    }
}

static void do_comm(int sym) {
    long long rank = -1, nranks = -1;
    switch (sym) {
    case S_ncclCommInitRank:
    case S_ncclCommInitRankConfig:
    case S_ncclCommInitRankScalable:
    case S_HcclCommInitClusterInfo:
        rank = (long long)parse_num(next_word("RANK"), "rank");
        if (sym != S_HcclCommInitClusterInfo)
            nranks = (long long)parse_num(next_word("NRANKS"), "nranks");
        break;
    case S_ncclCommInitAll:
        nranks = (long long)parse_num(next_word("NDEV"), "ndev");
        rank = 0xffffffffLL; /* one process drives every rank */
        break;
    case S_HcclCommInitRootInfo:
        nranks = (long long)parse_num(next_word("NRANKS"), "nranks");
        rank = (long long)parse_num(next_word("RANK"), "rank");
        break;
    }
    unsigned long long n = opt_times();
    struct slot *s = cur(SYMS[sym].rt);
    static ncclUniqueId id;
    static HcclRootInfo root;
    static ncclConfig_t config;
    memset(id.internal, 0x11, sizeof id.internal);
    config.size = sizeof config;
    for (unsigned long long i = 0; i < n; i++) {
        int rc;
        ncclComm_t nc = NULL, all[64];
        HcclComm hc = NULL;
        switch (sym) {
        case S_ncclCommInitRank: rc = FN(s, ncclCommInitRank)(&nc, (int)nranks, id, (int)rank); break;
        case S_ncclCommInitRankConfig: rc = FN(s, ncclCommInitRankConfig)(&nc, (int)nranks, id, (int)rank, &config); break;
        case S_ncclCommInitRankScalable: rc = FN(s, ncclCommInitRankScalable)(&nc, (int)nranks, (int)rank, 1, &id, &config); break;
        case S_ncclCommInitAll:
            if (nranks < 1 || nranks > 64)
                PLAN_ERROR("comm_init_all: NDEV must be 1..64");
            rc = FN(s, ncclCommInitAll)(all, (int)nranks, NULL);
            nc = all[0];
            break;
        case S_ncclCommSplit: rc = FN(s, ncclCommSplit)(FAKE_HANDLE(0x300), 0, 0, &nc, &config); break;
        case S_HcclCommInitRootInfo: rc = FN(s, HcclCommInitRootInfo)((uint32_t)nranks, &root, (uint32_t)rank, &hc); break;
        case S_HcclCommInitClusterInfo: rc = FN(s, HcclCommInitClusterInfo)("/etc/hccl.json", (uint32_t)rank, &hc); break;
        default: die(1, "internal: %s is not a communicator creation", SYMS[sym].name); return;
        }
        expect_ok(rc, sym);
        if (!nc && !hc)
            die(1, "%s succeeded but wrote no communicator", SYMS[sym].name);
        stat_of(s, sym)->calls++;
        if (ncomms == cap_comms) {
            cap_comms = cap_comms ? 2 * cap_comms : 16;
            comms = xrealloc(comms, cap_comms * sizeof *comms);
        }
        comms[ncomms++] = (struct comm){s->lib, sym, rank, nranks};
    }
}

/* Launches by kernel name, for the ground truth. */
struct kernel_launches {
    char *name;
    unsigned long long launches;
};
static struct kernel_launches *kernels;
static size_t nkernels;

static void do_kernel(const char *name, unsigned long long n) {
    struct slot *s = cur(RT_CUDA);
    __typeof__(cuModuleGetFunction) *get_function = dlsym(s->handle, "cuModuleGetFunction");
    if (!get_function)
        die(1, "%s does not export cuModuleGetFunction", libs[s->lib].path);
    CUfunction f = NULL;
    int rc = get_function(&f, (CUmodule)FAKE_HANDLE(8), name);
    if (rc != 0)
        die(1, "cuModuleGetFunction(%s) returned %d", name, rc);
    for (unsigned long long i = 0; i < n; i++) {
        expect_ok(FN(s, cuLaunchKernel)(f, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), S_cuLaunchKernel);
        stat_of(s, S_cuLaunchKernel)->calls++;
    }
    size_t k = 0;
    while (k < nkernels && strcmp(kernels[k].name, name) != 0)
        k++;
    if (k == nkernels) {
        kernels = xrealloc(kernels, (nkernels + 1) * sizeof *kernels);
        kernels[nkernels++] = (struct kernel_launches){strdup(name), 0};
    }
    kernels[k].launches += n;
}

static void do_cuinit(void) {
    struct slot *s = cur(RT_CUDA);
    __typeof__(cuInit) *init = dlsym(s->handle, "cuInit");
    if (!init)
        die(1, "%s does not export cuInit", libs[s->lib].path);
    int rc = init(0);
    if (rc != 0)
        die(1, "cuInit returned %d", rc);
}

static int find_sym(const char *w) {
    for (int i = 0; i < S_N; i++)
        if (strcmp(w, SYMS[i].name) == 0 || strcmp(w, SYMS[i].alias) == 0)
            return i;
    return -1;
}

static void run_op(const char *w) {
    if (strcmp(w, "sleep") == 0) {
        sleep_ms(parse_num(next_word("MS"), "sleep"));
    } else if (strcmp(w, "fork_idle") == 0) {
        /* A child that only sleeps (a DataLoader worker forked after cuInit): it keeps every
         * mapping, no thread but this one; it dies with the driver. */
        pid_t c = fork();
        if (c == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (;;)
                pause();
        }
        if (c < 0)
            die(1, "fork_idle: fork failed");
        say("forked %d", (int)c);
    } else if (strcmp(w, "wait_stdin") == 0) {
        say("waiting");
        char line[256];
        if (!fgets(line, sizeof line, stdin))
            clearerr(stdin); /* EOF: go on */
    } else if (strcmp(w, "mark") == 0) {
        say("mark %s", next_word("a name after mark"));
    } else if (strcmp(w, "use") == 0) {
        struct slot *s = slot_named(next_word("SLOT"));
        current[s->rt] = (int)(s - slots);
    } else if (strcmp(w, "dlopen_late") == 0) {
        struct slot *s = slot_named(next_word("SLOT"));
        load(s, next_word("PATH"));
    } else if (strcmp(w, "dlclose") == 0) {
        struct slot *s = slot_named(next_word("SLOT"));
        if (!s->handle)
            PLAN_ERROR("dlclose %s: not open", s->name);
        for (size_t i = 0; i < nallocs; i++)
            if (allocs[i].slot == s - slots)
                PLAN_ERROR("dlclose %s: it has live allocations", s->name);
        if (dlclose(s->handle) != 0)
            die(1, "dlclose %s: %s", s->name, dlerror());
        s->handle = NULL;
        memset(s->fn, 0, sizeof s->fn);
    } else if (strcmp(w, "cuinit") == 0) {
        do_cuinit();
    } else if (strcmp(w, "cupti_take_buffers") == 0) {
        do_cupti_take_buffers();
    } else if (strcmp(w, "wait_cupti_enabled") == 0) {
        do_wait_cupti_enabled();
    } else if (strcmp(w, "kernel") == 0) {
        const char *name = next_word("a kernel name");
        do_kernel(name, opt_times());
    } else if (strcmp(w, "free") == 0) {
        do_free(-1);
    } else if (strcmp(w, "untracked_free") == 0) {
        do_untracked_free(parse_num(next_word("N"), "untracked_free"));
    } else if (strcmp(w, "sync") == 0) {
        const char *k = next_word("stream, stream_ptsz, ctx or event");
        char alias[64];
        snprintf(alias, sizeof alias, "sync_%s", k);
        int sym = find_sym(alias);
        if (sym < 0 || SYMS[sym].rt != RT_CUDA)
            PLAN_ERROR("sync %s: not stream, stream_ptsz, ctx or event", k);
        do_count(sym, opt_count());
    } else {
        int sym = find_sym(w);
        if (sym < 0)
            PLAN_ERROR("unknown plan word '%s'", w);
        unsigned long long a, b;
        const char *c;
        switch (SYMS[sym].kind) {
        case K_COUNT:
        case K_SYNC:
            do_count(sym, opt_count());
            break;
        case K_ALLOC:
            a = parse_num(next_word("SIZE"), w);
            do_alloc(sym, a, opt_times());
            break;
        case K_REGISTER:
            a = parse_num(next_word("SIZE"), w);
            do_register(a, opt_times());
            break;
        case K_FREE:
            do_free(sym);
            break;
        case K_COPY:
            a = parse_num(next_word("SIZE"), w);
            do_copy(sym, a, opt_times());
            break;
        case K_COPY2D: {
            const char *wh = next_word("WxH");
            char buf[64];
            snprintf(buf, sizeof buf, "%s", wh);
            char *x = strchr(buf, 'x');
            if (!x)
                PLAN_ERROR("%s: expected WIDTHxHEIGHT, got '%s'", w, wh);
            *x = 0;
            a = parse_num(buf, "width");
            b = parse_num(x + 1, "height");
            c = next_word("htod, dtoh, dtod or htoh");
            do_copy2d(sym, a, b, c, opt_times());
            break;
        }
        case K_ACLCOPY:
            a = parse_num(next_word("SIZE"), w);
            c = next_word("KIND");
            do_aclcopy(sym, a, c, opt_times());
            break;
        case K_COLL: {
            a = parse_num(next_word("COUNT"), w);
            int dt = parse_dtype(SYMS[sym].rt, next_word("DTYPE"));
            do_coll(sym, a, dt, opt_times());
            break;
        }
        case K_COMM:
            do_comm(sym);
            break;
        }
    }
}

/* ------------------------------------------------------------------ output */
static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void json_mem(const char *key, const unsigned long long *v) {
    printf(",\"%s\":{", key);
    for (int m = 0; m < MEM_N; m++)
        printf("%s\"%s\":%llu", m ? "," : "", MEM_NAMES[m], v[m]);
    putchar('}');
}

static void json_opt(long long v) {
    if (v < 0)
        printf("null");
    else
        printf("%lld", v);
}

/* The stand-in CUPTI's count of enables of CONCURRENT_KERNEL minus disables (0 when none is
 * loaded): > 0 while an injection library's window records kernels. */
static long long cupti_kernel_enabled(void) {
    char json[8192];
    if (!read_cupti_counts(json, sizeof json))
        return 0;
    long long n = 0;
    const char *const keys[] = {"\"enable\":{", "\"disable\":{"};
    for (int k = 0; k < 2; k++) {
        const char *obj = strstr(json, keys[k]);
        const char *v = obj ? strstr(obj, "\"concurrent_kernel\":") : NULL;
        if (v)
            n += (k ? -1 : 1) * strtoll(v + strlen("\"concurrent_kernel\":"), NULL, 10);
    }
    return n;
}

/* The other tool's buffers: handed out, and freed when CUPTI completes them. */
static void other_tool_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 64 << 10;
    *buffer = malloc(*size);
    *max_records = 0;
}
static void other_tool_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                 size_t valid) {
    (void)ctx, (void)stream, (void)size, (void)valid;
    free(buffer);
}

/* A stand-in CUPTI loaded in this process (by an injection library, by soname whatever its
 * path): a handle to dlclose, or null when none is. */
static void *loaded_cupti(void) {
    static const char *const sonames[] = {"libcupti.so.13", "libcupti.so.12"};
    for (size_t i = 0; i < sizeof sonames / sizeof sonames[0]; i++) {
        void *h = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
        if (h)
            return h;
    }
    return NULL;
}

static void do_cupti_take_buffers(void) {
    void *h = loaded_cupti();
    if (!h)
        die(1, "cupti_take_buffers: no CUPTI loaded");
    int (*reg)(void *, void *) = (int (*)(void *, void *))dlsym(h, "cuptiActivityRegisterCallbacks");
    int r = reg ? reg((void *)other_tool_requested, (void *)other_tool_completed) : -1;
    dlclose(h);
    if (r != 0)
        die(1, "cupti_take_buffers: cuptiActivityRegisterCallbacks returned %d", r);
    say("cupti buffers taken");
}

static void do_wait_cupti_enabled(void) {
    for (int i = 0; i < 20000; i++) {
        if (cupti_kernel_enabled() > 0) {
            fprintf(stderr, "cupti enabled\n");
            return;
        }
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    die(1, "wait_cupti_enabled: no CUPTI window within 20 s");
}

/* The counters of a stand-in CUPTI loaded in this process (by an injection library) into
 * `json`: 0 when none is loaded. */
static int read_cupti_counts(char *json, size_t cap) {
    void *h = loaded_cupti();
    if (!h)
        return 0;
    __typeof__(ethand_standin_cupti_counts) *counts = dlsym(h, "ethand_standin_cupti_counts");
    json[0] = 0;
    if (counts)
        counts(json, cap);
    dlclose(h);
    return json[0] != 0;
}

/* The counters of a stand-in CUPTI loaded in this process, or null. */
static void print_cupti_counts(void) {
    static char json[8192];
    fputs(read_cupti_counts(json, sizeof json) ? json : "null", stdout);
}

static void print_truth(void) {
    printf("{\"pid\":%d,\"sync_us\":%u,\"libraries\":{", (int)getpid(), sync_us);
    for (int l = 0; l < nlibs; l++) {
        struct lib *L = &libs[l];
        if (l)
            putchar(',');
        json_str(L->path);
        printf(":{\"runtime\":\"%s\",\"namespace\":\"%s\",\"symbols\":{", RT_NAMES[L->rt],
               L->newns ? "new" : "base");
        int first = 1;
        for (int i = 0; i < S_N; i++) {
            struct tally *t = &L->st[i];
            if (!t->calls)
                continue;
            printf("%s\"%s\":{\"calls\":%llu,\"errors\":%llu,\"bytes\":%llu,\"min_time_ns\":%llu,"
                   "\"dirs\":{",
                   first ? "" : ",", SYMS[i].name, t->calls, t->errors, t->bytes, t->min_time_ns);
            first = 0;
            int fd = 1;
            for (int d = 0; d < D_N; d++) {
                if (!t->dir_calls[d])
                    continue;
                printf("%s\"%s\":{\"calls\":%llu,\"bytes\":%llu}", fd ? "" : ",", DIR_NAMES[d],
                       t->dir_calls[d], t->dir_bytes[d]);
                fd = 0;
            }
            printf("}}");
        }
        printf("}}");
    }
    putchar('}');
    json_mem("live_bytes", live);
    json_mem("peak_bytes", peak);
    printf(",\"untracked_frees\":%llu,\"comms\":[", untracked_frees);
    long long best_rank = -1, best_nranks = 0;
    for (size_t i = 0; i < ncomms; i++) {
        struct comm *c = &comms[i];
        printf("%s{\"library\":", i ? "," : "");
        json_str(libs[c->lib].path);
        printf(",\"symbol\":\"%s\",\"rank\":", SYMS[c->sym].name);
        json_opt(c->rank);
        printf(",\"nranks\":");
        json_opt(c->nranks);
        putchar('}');
        if (c->nranks > best_nranks) {
            best_nranks = c->nranks;
            best_rank = c->rank;
        }
    }
    printf("],\"rank\":");
    json_opt(best_rank);
    printf(",\"nranks\":%lld,\"kernels\":{", best_nranks);
    for (size_t k = 0; k < nkernels; k++) {
        if (k)
            putchar(',');
        json_str(kernels[k].name);
        printf(":%llu", kernels[k].launches);
    }
    printf("},\"cupti\":");
    print_cupti_counts();
    printf("}\n");
    fflush(stdout);
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    const char *env = getenv(STANDIN_SYNC_ENV);
    if (env && is_number(env))
        sync_us = (unsigned int)strtoul(env, NULL, 10);
    struct {
        struct slot *slot;
        const char *path;
    } startup[NSLOTS * 4];
    int nstartup = 0;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strncmp(a, "--", 2) != 0)
            break;
        if (i + 1 >= argc)
            PLAN_ERROR("%s needs a value", a);
        if (strcmp(a, "--sync-us") == 0) {
            sync_us = (unsigned int)parse_num(argv[++i], "--sync-us");
            continue;
        }
        if (nstartup == (int)(sizeof startup / sizeof startup[0]))
            PLAN_ERROR("too many libraries");
        startup[nstartup].slot = slot_named(a + 2);
        startup[nstartup++].path = argv[++i];
    }
    /* The stand-ins read it when loaded; the driver's ground truth uses the same value. */
    char us[32];
    snprintf(us, sizeof us, "%u", sync_us);
    setenv(STANDIN_SYNC_ENV, us, 1);

    /* The plan: each remaining argument, split at blanks. */
    words = xrealloc(NULL, sizeof *words);
    for (; i < argc; i++) {
        char *copy = strdup(argv[i]);
        for (char *t = strtok(copy, " \t\n"); t; t = strtok(NULL, " \t\n")) {
            words = xrealloc(words, (size_t)(nwords + 1) * sizeof *words);
            words[nwords++] = t;
        }
    }

    for (int k = 0; k < nstartup; k++)
        load(startup[k].slot, startup[k].path);
    say("ready");

    while (pos < nwords)
        run_op(next_word("an op"));
    print_truth();
    return 0;
}
