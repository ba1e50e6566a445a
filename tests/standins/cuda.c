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
 *   - synchronizations sleep ETHAND_STANDIN_SYNC_US microseconds (default 1000).
 * Build: gcc -O2 -fPIC -shared -fno-inline -fno-ipa-icf -Wl,-soname,libcuda.so.1
 */
#include "standin_lib.h"

/* ---- launches */
EXPORT CUresult cuLaunchKernel(CU_LAUNCH_ARGS, void **extra) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernel_ptsz(CU_LAUNCH_ARGS, void **extra) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel(CU_LAUNCH_ARGS) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CU_LAUNCH_ARGS) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) { HIT(); return CUDA_SUCCESS; }

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
EXPORT CUresult cuMemFreeHost(void *p) { HIT(); standin_host_free(p); return CUDA_SUCCESS; }
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    HIT();
    if (!p || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return bytesize > STANDIN_ALLOC_LIMIT ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostUnregister(void *p) { HIT(); return CUDA_SUCCESS; }

/* ---- copies: nothing is copied, no pointer is dereferenced */
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) { HIT(); return CUDA_SUCCESS; }
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
EXPORT CUresult cuStreamSynchronize(CUstream hStream) { HIT(); standin_sync_sleep(); return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { HIT(); standin_sync_sleep(); return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize(void) { HIT(); standin_sync_sleep(); return CUDA_SUCCESS; }
/* CUDA 13: what torch.cuda.synchronize() and CuPy's Device.synchronize() call. */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) { (void)ctx; HIT(); standin_sync_sleep(); return CUDA_SUCCESS; }
EXPORT CUresult cuEventSynchronize(CUevent hEvent) { HIT(); standin_sync_sleep(); return CUDA_SUCCESS; }

/* Not probed; real programs call them first. */
EXPORT CUresult cuInit(unsigned int Flags) { HIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
    HIT();
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

STANDIN_HITS_CHECK();
