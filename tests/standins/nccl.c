/*
 * Stand-in for libnccl.so.2 (NCCL 2.28) for ethand's tests on machines without a GPU.
 * Exports every libnccl symbol of ethand's catalog with the real nccl.h signature, the way
 * real NCCL does (src/include/core.h, NCCL_API): `ncclX` is a WEAK symbol and `pncclX` (the
 * profiling interface) a global alias of it, at the same address. ethand's resolver must
 * accept weak definitions.
 * Behaviour: collectives, group calls: ncclSuccess, no memory touched. Communicator creation
 * writes a fake non-NULL communicator and returns ncclSuccess (arguments are not validated).
 * Build: gcc -O2 -fPIC -shared -fno-inline -fno-ipa-icf -Wl,-soname,libnccl.so.2
 */
#include "standin_lib.h"

#define NCCL_API(ret, func, ...)                                                               \
    __attribute__((visibility("default"), alias(#func))) ret p##func(__VA_ARGS__);             \
    __attribute__((visibility("default"), weak, noinline, used)) ret func(__VA_ARGS__)

static ncclComm_t fake_comm(void) { return (ncclComm_t)(uintptr_t)standin_fake_addr(); }

NCCL_API(ncclResult_t, ncclGetVersion, int *version) {
    HIT();
    if (!version)
        return ncclInvalidArgument;
    *version = 22800;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId) {
    HIT();
    if (!uniqueId)
        return ncclInvalidArgument;
    memset(uniqueId, 0x5a, sizeof *uniqueId);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    HIT();
    if (!comm)
        return ncclInvalidArgument;
    *comm = fake_comm();
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
    HIT();
    if (!comm)
        return ncclInvalidArgument;
    *comm = fake_comm();
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config) {
    HIT();
    if (!newcomm)
        return ncclInvalidArgument;
    *newcomm = fake_comm();
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist) {
    HIT();
    if (!comm || ndev < 1)
        return ncclInvalidArgument;
    for (int i = 0; i < ndev; i++)
        comm[i] = fake_comm();
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    HIT();
    if (!newcomm)
        return ncclInvalidArgument;
    *newcomm = fake_comm();
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) { HIT(); return ncclSuccess; }

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) { HIT(); standin_coll_sleep(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclGroupStart, void) { HIT(); return ncclSuccess; }
NCCL_API(ncclResult_t, ncclGroupEnd, void) { HIT(); return ncclSuccess; }

STANDIN_HITS_CHECK();
