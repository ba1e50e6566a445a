/*
 * Stand-in for libcuda.so.1 (CUDA driver API) for ethand's tests on machines without a GPU.
 * Exports every libcuda symbol of ethand's catalog (userspace-probes/src/catalog.rs) with the
 * real cuda.h signature. Behaviour the probes depend on:
 *   - allocations write a unique non-zero address through the out-pointer and return
 *     CUDA_SUCCESS; size 0 or a NULL out-pointer: CUDA_ERROR_INVALID_VALUE (1); more than
 *     STANDIN_ALLOC_LIMIT (1 TiB): CUDA_ERROR_OUT_OF_MEMORY (2), nothing written;
 *     device/managed memory is a fake, never dereferenceable address; host memory is malloc()
 *     up to 64 MiB, a fake address above;
 *   - host registration: CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY above the limit;
 *   - frees, copies, launches: CUDA_SUCCESS, touching no memory (copies never dereference);
 *   - synchronizations sleep ETHAND_STANDIN_SYNC_US microseconds (default 1000);
 *   - cuInit emulates the driver's injection: the first call in the process dlopens
 *     CUDA_INJECTION64_PATH (if set and not empty) and calls its InitializeInjection() once;
 *     failures are printed on stderr and ignored, and the return value is ignored;
 *   - cuModuleGetFunction hands out one CUfunction per kernel name (any name exists);
 *   - the stand-in CUPTI (cupti.c) registers a hook with ethand_standin_cuda_set_activity_hook;
 *     then these calls report what a GPU would have done (struct standin_activity, standins.h):
 *       kernels  cuLaunchKernel, cuLaunchKernelEx (+ _ptsz): the name given to
 *                cuModuleGetFunction for that CUfunction, else "ethand_standin_kernel";
 *       copies   cuMemcpyHtoD/DtoH/DtoD_v2 and their Async forms (+ _ptds/_ptsz): a host side is
 *                PINNED when it lies in memory from cuMemAllocHost_v2, cuMemHostAlloc or
 *                cuMemHostRegister_v2 (still live), else PAGEABLE;
 *       memsets  cuMemsetD8/D16/D32_v2 and cuMemsetD8/D16/D32Async;
 *       syncs    cuStreamSynchronize(_ptsz), cuCtxSynchronize(_v2), cuEventSynchronize: reported
 *                when they return, with the time they began.
 * Build: gcc -O2 -fPIC -shared -fno-inline -fno-ipa-icf -pthread -Wl,-soname,libcuda.so.1 ... -ldl
 */
#define _GNU_SOURCE
#include "standin_lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* ---- what the stand-in CUPTI learns about each call */
typedef void (*activity_hook_fn)(const struct standin_activity *a);
static activity_hook_fn activity_hook; /* atomic: set by CUPTI's thread, read by every caller */

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Small numbers for opaque handles (streams, events), in order of first use; NULL is 0. */
struct handle_ids {
    pthread_mutex_t mu;
    const void **handles;
    uint32_t n, cap;
};
static struct handle_ids stream_ids = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static struct handle_ids event_ids = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static uint32_t handle_id(struct handle_ids *t, const void *h) {
    if (!h)
        return 0;
    uint32_t id = 0;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < t->n && !id; i++)
        if (t->handles[i] == h)
            id = i + 1;
    if (!id) {
        if (t->n == t->cap) {
            uint32_t cap = t->cap ? 2 * t->cap : 16;
            const void **grown = realloc(t->handles, cap * sizeof *grown);
            if (grown) {
                t->handles = grown;
                t->cap = cap;
            }
        }
        if (t->n < t->cap) {
            t->handles[t->n++] = h;
            id = t->n;
        } else {
            id = UINT32_MAX; /* out of memory: one id for every later handle */
        }
    }
    pthread_mutex_unlock(&t->mu);
    return id;
}

/* Live page-locked host memory, so that a copy can say PINNED or PAGEABLE as CUPTI does. Few
 * entries in tests: a linear array is enough. */
struct host_range {
    uintptr_t start;
    size_t bytes;
};
static pthread_mutex_t pinned_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_range *pinned;
static size_t npinned, cap_pinned;

static void pinned_add(const void *p, size_t bytes) {
    pthread_mutex_lock(&pinned_mu);
    if (npinned == cap_pinned) {
        size_t cap = cap_pinned ? 2 * cap_pinned : 64;
        struct host_range *grown = realloc(pinned, cap * sizeof *grown);
        if (grown) {
            pinned = grown;
            cap_pinned = cap;
        }
    }
    if (npinned < cap_pinned)
        pinned[npinned++] = (struct host_range){(uintptr_t)p, bytes};
    pthread_mutex_unlock(&pinned_mu);
}

static void pinned_remove(const void *p) {
    pthread_mutex_lock(&pinned_mu);
    for (size_t i = 0; i < npinned; i++) {
        if (pinned[i].start == (uintptr_t)p) {
            pinned[i] = pinned[--npinned];
            break;
        }
    }
    pthread_mutex_unlock(&pinned_mu);
}

static uint32_t host_memory_kind(const void *p) {
    uint32_t kind = STANDIN_CUPTI_MEMORY_PAGEABLE;
    pthread_mutex_lock(&pinned_mu);
    for (size_t i = 0; i < npinned; i++)
        if ((uintptr_t)p - pinned[i].start < pinned[i].bytes)
            kind = STANDIN_CUPTI_MEMORY_PINNED;
    pthread_mutex_unlock(&pinned_mu);
    return kind;
}

/* CUfunctions of cuModuleGetFunction: one per name, never freed, so a name pointer stays valid
 * and is the same for every launch (CUPTI shares it between records of one kernel). Entries
 * are written once, before `nfunctions` publishes them: readers take no lock. */
struct CUfunc_st {
    const char *name;
};
#define MAX_FUNCTIONS 4096
static struct CUfunc_st functions[MAX_FUNCTIONS];
static unsigned nfunctions;
static pthread_mutex_t functions_mu = PTHREAD_MUTEX_INITIALIZER;
static const char DEFAULT_KERNEL_NAME[] = "ethand_standin_kernel";

static const char *kernel_name(CUfunction f) {
    unsigned n = __atomic_load_n(&nfunctions, __ATOMIC_ACQUIRE);
    uintptr_t i = ((uintptr_t)f - (uintptr_t)functions) / sizeof functions[0];
    if ((uintptr_t)f >= (uintptr_t)functions && i < n && f == &functions[i])
        return functions[i].name;
    return DEFAULT_KERNEL_NAME;
}

static void report_launch(const char *api, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes,
                          CUstream stream) {
    activity_hook_fn hook = __atomic_load_n(&activity_hook, __ATOMIC_ACQUIRE);
    if (!hook)
        return;
    struct standin_activity a = {
        .kind = STANDIN_ACTIVITY_KERNEL,
        .stream = handle_id(&stream_ids, stream),
        .api = api,
        .call_start_ns = realtime_ns(),
        .name = kernel_name(f),
        .grid_x = gx, .grid_y = gy, .grid_z = gz,
        .block_x = bx, .block_y = by, .block_z = bz,
        .dynamic_shared_bytes = shared_bytes,
    };
    hook(&a);
}

static void report_launch_ex(const char *api, const CUlaunchConfig *c, CUfunction f) {
    if (c)
        report_launch(api, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                      c->blockDimZ, c->sharedMemBytes, c->hStream);
}

/* host: the host side of an HtoD or DtoH copy; NULL for DtoD. */
static void report_copy(const char *api, uint32_t copy_kind, const void *host, size_t bytes,
                        CUstream stream, uint32_t async) {
    activity_hook_fn hook = __atomic_load_n(&activity_hook, __ATOMIC_ACQUIRE);
    if (!hook)
        return;
    uint32_t host_kind = host ? host_memory_kind(host) : STANDIN_CUPTI_MEMORY_DEVICE;
    struct standin_activity a = {
        .kind = STANDIN_ACTIVITY_MEMCPY,
        .stream = handle_id(&stream_ids, stream),
        .api = api,
        .call_start_ns = realtime_ns(),
        .copy_kind = copy_kind,
        .src_kind = copy_kind == STANDIN_CUPTI_MEMCPY_HTOD ? host_kind : STANDIN_CUPTI_MEMORY_DEVICE,
        .dst_kind = copy_kind == STANDIN_CUPTI_MEMCPY_DTOH ? host_kind : STANDIN_CUPTI_MEMORY_DEVICE,
        .async = async,
        .bytes = bytes,
    };
    hook(&a);
}

static void report_memset(const char *api, uint32_t value, size_t bytes, CUstream stream,
                          uint32_t async) {
    activity_hook_fn hook = __atomic_load_n(&activity_hook, __ATOMIC_ACQUIRE);
    if (!hook)
        return;
    struct standin_activity a = {
        .kind = STANDIN_ACTIVITY_MEMSET,
        .stream = handle_id(&stream_ids, stream),
        .api = api,
        .call_start_ns = realtime_ns(),
        .async = async,
        .memset_value = value,
        .bytes = bytes,
    };
    hook(&a);
}

/* The sleep of a sync, then its report. The hook is read after the sleep: CUPTI may have been
 * detached (and unloaded) meanwhile. */
static void sync_and_report(const char *api, uint32_t sync_type, CUstream stream, CUevent event) {
    uint64_t start_ns = realtime_ns();
    standin_sync_sleep();
    activity_hook_fn hook = __atomic_load_n(&activity_hook, __ATOMIC_ACQUIRE);
    if (!hook)
        return;
    struct standin_activity a = {
        .kind = STANDIN_ACTIVITY_SYNC,
        .stream = handle_id(&stream_ids, stream),
        .api = api,
        .call_start_ns = start_ns,
        .sync_type = sync_type,
        .event = handle_id(&event_ids, event),
    };
    hook(&a);
}

EXPORT void ethand_standin_cuda_set_activity_hook(void (*hook)(const struct standin_activity *a)) {
    HIT();
    __atomic_store_n(&activity_hook, hook, __ATOMIC_RELEASE);
}

/* ---- launches */
EXPORT CUresult cuLaunchKernel(CU_LAUNCH_ARGS, void **extra) {
    HIT();
    report_launch("cuLaunchKernel", f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel_ptsz(CU_LAUNCH_ARGS, void **extra) {
    HIT();
    report_launch("cuLaunchKernel_ptsz", f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) { HIT(); report_launch_ex("cuLaunchKernelEx", config, f); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) { HIT(); report_launch_ex("cuLaunchKernelEx_ptsz", config, f); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel(CU_LAUNCH_ARGS) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CU_LAUNCH_ARGS) { HIT(); return CUDA_SUCCESS; }
static void report_graph_launch(const char *api) {
    activity_hook_fn hook = __atomic_load_n(&activity_hook, __ATOMIC_ACQUIRE);
    if (!hook)
        return;
    struct standin_activity a = {
        .kind = STANDIN_ACTIVITY_GRAPH_LAUNCH,
        .api = api,
        .call_start_ns = realtime_ns(),
    };
    hook(&a);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    HIT();
    report_graph_launch("cuGraphLaunch");
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    HIT();
    report_graph_launch("cuGraphLaunch_ptsz");
    return CUDA_SUCCESS;
}

/* ---- memory */
static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytesize) {
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_ALLOC_LIMIT)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = standin_fake_addr();
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t bytesize) {
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_ALLOC_LIMIT)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pp = standin_host_alloc(bytesize);
    pinned_add(*pp, bytesize);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) { HIT(); return dev_alloc(dptr, bytesize); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { HIT(); return host_alloc(pp, bytesize); }
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) { HIT(); return host_alloc(pp, bytesize); }
EXPORT CUresult cuMemFreeHost(void *p) { HIT(); pinned_remove(p); standin_host_free(p); return CUDA_SUCCESS; }
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    HIT();
    if (!p || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > STANDIN_ALLOC_LIMIT)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pinned_add(p, bytesize);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostUnregister(void *p) { HIT(); pinned_remove(p); return CUDA_SUCCESS; }

/* ---- copies: nothing is copied, no pointer is dereferenced */
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { HIT(); report_copy("cuMemcpyHtoD_v2", STANDIN_CUPTI_MEMCPY_HTOD, srcHost, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { HIT(); report_copy("cuMemcpyHtoD_v2_ptds", STANDIN_CUPTI_MEMCPY_HTOD, srcHost, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyHtoDAsync_v2", STANDIN_CUPTI_MEMCPY_HTOD, srcHost, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyHtoDAsync_v2_ptsz", STANDIN_CUPTI_MEMCPY_HTOD, srcHost, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); report_copy("cuMemcpyDtoH_v2", STANDIN_CUPTI_MEMCPY_DTOH, dstHost, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); report_copy("cuMemcpyDtoH_v2_ptds", STANDIN_CUPTI_MEMCPY_DTOH, dstHost, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyDtoHAsync_v2", STANDIN_CUPTI_MEMCPY_DTOH, dstHost, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyDtoHAsync_v2_ptsz", STANDIN_CUPTI_MEMCPY_DTOH, dstHost, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); report_copy("cuMemcpyDtoD_v2", STANDIN_CUPTI_MEMCPY_DTOD, NULL, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); report_copy("cuMemcpyDtoD_v2_ptds", STANDIN_CUPTI_MEMCPY_DTOD, NULL, ByteCount, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyDtoDAsync_v2", STANDIN_CUPTI_MEMCPY_DTOD, NULL, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); report_copy("cuMemcpyDtoDAsync_v2_ptsz", STANDIN_CUPTI_MEMCPY_DTOD, NULL, ByteCount, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy) { HIT(); return pCopy ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy) { HIT(); return pCopy ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream) { HIT(); return pCopy ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream) { HIT(); return pCopy ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* ---- synchronization: the host waits */
EXPORT CUresult cuStreamSynchronize(CUstream hStream) { HIT(); sync_and_report("cuStreamSynchronize", STANDIN_CUPTI_SYNC_STREAM, hStream, NULL); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { HIT(); sync_and_report("cuStreamSynchronize_ptsz", STANDIN_CUPTI_SYNC_STREAM, hStream, NULL); return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize(void) { HIT(); sync_and_report("cuCtxSynchronize", STANDIN_CUPTI_SYNC_CONTEXT, NULL, NULL); return CUDA_SUCCESS; }
/* CUDA 13: what torch.cuda.synchronize() and CuPy's Device.synchronize() call. */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) { (void)ctx; HIT(); sync_and_report("cuCtxSynchronize_v2", STANDIN_CUPTI_SYNC_CONTEXT, NULL, NULL); return CUDA_SUCCESS; }
EXPORT CUresult cuEventSynchronize(CUevent hEvent) { HIT(); sync_and_report("cuEventSynchronize", STANDIN_CUPTI_SYNC_EVENT, NULL, hEvent); return CUDA_SUCCESS; }

/* ---- memsets (not probed): recorded by the stand-in CUPTI */
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) { HIT(); report_memset("cuMemsetD8_v2", uc, N, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) { HIT(); report_memset("cuMemsetD16_v2", us, 2 * N, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) { HIT(); report_memset("cuMemsetD32_v2", ui, 4 * N, NULL, 0); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) { HIT(); report_memset("cuMemsetD8Async", uc, N, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) { HIT(); report_memset("cuMemsetD16Async", us, 2 * N, hStream, 1); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) { HIT(); report_memset("cuMemsetD32Async", ui, 4 * N, hStream, 1); return CUDA_SUCCESS; }

/* ---- not probed; real programs call them first */

/* The driver's injection: once per process, on the first cuInit. Other threads wait until it is
 * done; a cuInit from inside InitializeInjection (same thread) returns at once. */
static pthread_mutex_t injection_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t injection_done = PTHREAD_COND_INITIALIZER;
enum { INJECTION_NOT_STARTED, INJECTION_RUNNING, INJECTION_DONE };
static int injection_state;
static __thread int injection_on_this_thread;

static void load_injection(void) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path)
        return;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "libcuda (stand-in): cannot load CUDA_INJECTION64_PATH %s: %s\n", path, dlerror());
        return;
    }
    int (*initialize)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
    if (!initialize) {
        fprintf(stderr, "libcuda (stand-in): %s has no InitializeInjection\n", path);
        return;
    }
    (void)initialize();
}

static void inject_once(void) {
    if (__atomic_load_n(&injection_state, __ATOMIC_ACQUIRE) == INJECTION_DONE || injection_on_this_thread)
        return;
    pthread_mutex_lock(&injection_mu);
    if (injection_state == INJECTION_NOT_STARTED) {
        injection_state = INJECTION_RUNNING;
        pthread_mutex_unlock(&injection_mu);
        injection_on_this_thread = 1;
        load_injection();
        injection_on_this_thread = 0;
        pthread_mutex_lock(&injection_mu);
        __atomic_store_n(&injection_state, INJECTION_DONE, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&injection_done);
    }
    while (injection_state != INJECTION_DONE)
        pthread_cond_wait(&injection_done, &injection_mu);
    pthread_mutex_unlock(&injection_mu);
}

EXPORT CUresult cuInit(unsigned int Flags) { HIT(); inject_once(); return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    HIT();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&functions_mu);
    unsigned n = nfunctions, i = 0;
    while (i < n && strcmp(functions[i].name, name) != 0)
        i++;
    if (i == n) {
        char *copy = n < MAX_FUNCTIONS ? strdup(name) : NULL;
        if (copy) {
            functions[n].name = copy;
            __atomic_store_n(&nfunctions, n + 1, __ATOMIC_RELEASE);
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&functions_mu);
    if (rc == CUDA_SUCCESS)
        *hfunc = &functions[i];
    return rc;
}
EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    HIT();
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

STANDIN_HITS_CHECK();
