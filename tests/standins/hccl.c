/*
 * Stand-in for libhccl.so (HCCL: hccl/hccl.h) for ethand's tests on machines without an NPU.
 * Exports every libhccl symbol of ethand's catalog with the real signature. Behaviour:
 * collectives return HCCL_SUCCESS touching no memory; communicator creation writes a fake
 * non-NULL communicator and returns HCCL_SUCCESS (arguments are not validated).
 * Build: gcc -O2 -fPIC -shared -fno-inline -fno-ipa-icf -Wl,-soname,libhccl.so
 */
#include "standin_lib.h"

static HcclComm fake_comm(void) { return (HcclComm)(uintptr_t)standin_fake_addr(); }

EXPORT HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    HIT();
    if (!rootInfo)
        return HCCL_E_PARA;
    memset(rootInfo, 0x3c, sizeof *rootInfo);
    return HCCL_SUCCESS;
}
EXPORT HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
    HIT();
    if (!comm)
        return HCCL_E_PARA;
    *comm = fake_comm();
    return HCCL_SUCCESS;
}
EXPORT HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm) {
    HIT();
    if (!comm)
        return HCCL_E_PARA;
    *comm = fake_comm();
    return HCCL_SUCCESS;
}
EXPORT HcclResult HcclCommDestroy(HcclComm comm) { HIT(); return HCCL_SUCCESS; }

EXPORT HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType, const void *recvBuf, uint64_t recvCount, HcclDataType recvType, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }
EXPORT HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm, aclrtStream stream) { HIT(); return HCCL_SUCCESS; }

STANDIN_HITS_CHECK();
