/*
 * Stand-in for libascendcl.so (Ascend CL: acl/acl_rt.h, acl/acl_op.h, acl/acl_op_compiler.h,
 * acl/acl_mdl.h) for ethand's tests on machines without an NPU. Exports every libascendcl
 * symbol of ethand's catalog with the real signature. Behaviour:
 *   - aclrtMalloc/aclrtMallocCached write a fake, never dereferenceable device address and
 *     return ACL_SUCCESS; aclrtMallocHost returns malloc() memory (a fake address above
 *     64 MiB); size 0 or a NULL out-pointer: ACL_ERROR_INVALID_PARAM (100000); more than
 *     STANDIN_ALLOC_LIMIT (1 TiB): ACL_ERROR_RT_MEMORY_ALLOCATION (207001), nothing written;
 *   - frees, copies (never dereferenced), operator and model executions: ACL_SUCCESS;
 *   - synchronizations sleep ETHAND_STANDIN_SYNC_US microseconds (default 1000).
 * Build: gcc -O2 -fPIC -shared -fno-inline -fno-ipa-icf -Wl,-soname,libascendcl.so
 */
#include "standin_lib.h"

static aclError check_alloc(void **p, size_t size) {
    if (!p || size == 0)
        return ACL_ERROR_INVALID_PARAM;
    if (size > STANDIN_ALLOC_LIMIT)
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    HIT();
    aclError e = check_alloc(devPtr, size);
    if (e == ACL_SUCCESS)
        *devPtr = (void *)(uintptr_t)standin_fake_addr();
    return e;
}
EXPORT aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    HIT();
    aclError e = check_alloc(devPtr, size);
    if (e == ACL_SUCCESS)
        *devPtr = (void *)(uintptr_t)standin_fake_addr();
    return e;
}
EXPORT aclError aclrtFree(void *devPtr) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size) {
    HIT();
    aclError e = check_alloc(hostPtr, size);
    if (e == ACL_SUCCESS)
        *hostPtr = standin_host_alloc(size);
    return e;
}
EXPORT aclError aclrtFreeHost(void *hostPtr) { HIT(); standin_host_free(hostPtr); return ACL_SUCCESS; }

EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind, aclrtStream stream) { HIT(); return ACL_SUCCESS; }

EXPORT aclError aclrtSynchronizeStream(aclrtStream stream) { HIT(); standin_sync_sleep(); return ACL_SUCCESS; }
EXPORT aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) { HIT(); standin_sync_sleep(); return ACL_SUCCESS; }
EXPORT aclError aclrtSynchronizeDevice(void) { HIT(); standin_sync_sleep(); return ACL_SUCCESS; }
EXPORT aclError aclrtSynchronizeEvent(aclrtEvent event) { HIT(); standin_sync_sleep(); return ACL_SUCCESS; }

EXPORT aclError aclopExecute(const char *opType, int numInputs, const aclTensorDesc *const inputDesc[],
                             const aclDataBuffer *const inputs[], int numOutputs,
                             const aclTensorDesc *const outputDesc[], aclDataBuffer *const outputs[],
                             const aclopAttr *attr, aclrtStream stream) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclopExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[],
                               aclDataBuffer *inputs[], int numOutputs, aclTensorDesc *outputDesc[],
                               aclDataBuffer *outputs[], aclopAttr *attr, aclrtStream stream) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclopCompileAndExecute(const char *opType, int numInputs,
                                       const aclTensorDesc *const inputDesc[],
                                       const aclDataBuffer *const inputs[], int numOutputs,
                                       const aclTensorDesc *const outputDesc[],
                                       aclDataBuffer *const outputs[], const aclopAttr *attr,
                                       aclopEngineType engineType, aclopCompileType compileFlag,
                                       const char *opPath, aclrtStream stream) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclopCompileAndExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[],
                                         aclDataBuffer *inputs[], int numOutputs,
                                         aclTensorDesc *outputDesc[], aclDataBuffer *outputs[],
                                         aclopAttr *attr, aclopEngineType engineType,
                                         aclopCompileType compileFlag, const char *opPath,
                                         aclrtStream stream) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclmdlExecute(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclmdlExecuteAsync(uint32_t modelId, const aclmdlDataset *input, aclmdlDataset *output, aclrtStream stream) { HIT(); return ACL_SUCCESS; }

/* Not probed; real programs call them first. */
EXPORT aclError aclInit(const char *configPath) { HIT(); return ACL_SUCCESS; }
EXPORT aclError aclrtSetDevice(int32_t deviceId) { HIT(); return ACL_SUCCESS; }

STANDIN_HITS_CHECK();
