//! The symbols ethand probes in each runtime library and how each is accounted. The op id of a
//! symbol is its index in [`CATALOG`]: it is the attach cookie and the key the kernel side
//! counts under, so the kernel never sees a name.
//!
//! Argument indexes follow the System V x86-64 calling convention (integer registers rdi, rsi,
//! rdx, rcx, r8, r9). A struct larger than 16 bytes passed by value (`ncclUniqueId`, 128
//! bytes) travels on the stack and takes no register: `ncclCommInitRank(comm, nranks, id,
//! rank)` has `rank` in the third register, index 2.
use ethand_common::{GPU_ARG_NONE, GpuOpDesc, gpu_dir, gpu_dtype, gpu_flags, gpu_kind, gpu_mem};

use crate::Runtime;

/// What a symbol means to a user: the unit the snapshot and the metrics count in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// A kernel launch (CUDA) or operator / model execution (Ascend).
    Launch,
    /// A CUDA graph launch (one call, many kernels).
    GraphLaunch,
    Copy,
    Alloc,
    Free,
    Sync,
    Collective,
    /// `ncclGroupStart` / `ncclGroupEnd`.
    Group,
    CommInit,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Launch => "launch",
            Self::GraphLaunch => "graph_launch",
            Self::Copy => "copy",
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::Sync => "sync",
            Self::Collective => "collective",
            Self::Group => "group",
            Self::CommInit => "comm_init",
        }
    }
}

/// One probed symbol.
#[derive(Clone, Copy, Debug)]
pub struct SymbolSpec {
    pub runtime: Runtime,
    pub name: &'static str,
    pub category: Category,
    /// Collectives: the operation (`all_reduce`, ...); empty otherwise.
    pub operation: &'static str,
    pub desc: GpuOpDesc,
}

const N: u8 = GPU_ARG_NONE;

const fn d(
    kind: u8,
    flags: u8,
    bytes_arg: u8,
    aux_arg: u8,
    aux2_arg: u8,
    mem: u8,
    dir: u8,
    dt: u8,
) -> GpuOpDesc {
    GpuOpDesc {
        kind,
        flags,
        bytes_arg,
        aux_arg,
        aux2_arg,
        mem,
        dir,
        dtype_table: dt,
    }
}

const fn s(
    runtime: Runtime,
    name: &'static str,
    category: Category,
    operation: &'static str,
    desc: GpuOpDesc,
) -> SymbolSpec {
    SymbolSpec {
        runtime,
        name,
        category,
        operation,
        desc,
    }
}

const fn launch(rt: Runtime, name: &'static str) -> SymbolSpec {
    s(
        rt,
        name,
        Category::Launch,
        "",
        d(gpu_kind::COUNT, 0, N, N, N, 0, 0, 0),
    )
}
const fn graph(name: &'static str) -> SymbolSpec {
    s(
        Runtime::Cuda,
        name,
        Category::GraphLaunch,
        "",
        d(gpu_kind::COUNT, 0, N, N, N, 0, 0, 0),
    )
}
/// `fn(out_ptr @ out, size @ size, ...)`
const fn alloc(rt: Runtime, name: &'static str, out: u8, size: u8, mem: u8) -> SymbolSpec {
    s(
        rt,
        name,
        Category::Alloc,
        "",
        d(gpu_kind::ALLOC, gpu_flags::RET, size, out, N, mem, 0, 0),
    )
}
const fn register(name: &'static str) -> SymbolSpec {
    s(
        Runtime::Cuda,
        name,
        Category::Alloc,
        "",
        d(
            gpu_kind::REGISTER,
            gpu_flags::RET,
            1,
            0,
            N,
            gpu_mem::HOST_REGISTERED,
            0,
            0,
        ),
    )
}
const fn free(rt: Runtime, name: &'static str, mem: u8) -> SymbolSpec {
    s(
        rt,
        name,
        Category::Free,
        "",
        d(gpu_kind::FREE, 0, N, 0, N, mem, 0, 0),
    )
}
const fn copy(rt: Runtime, name: &'static str, bytes: u8, dir: u8) -> SymbolSpec {
    s(
        rt,
        name,
        Category::Copy,
        "",
        d(gpu_kind::COPY, 0, bytes, N, N, 0, dir, 0),
    )
}
const fn acl_copy(name: &'static str) -> SymbolSpec {
    // aclrtMemcpy(dst, destMax, src, count, kind[, stream])
    s(
        Runtime::AscendCl,
        name,
        Category::Copy,
        "",
        d(gpu_kind::COPY, 0, 3, 4, N, 0, gpu_dir::FROM_ACL_KIND, 0),
    )
}
const fn copy2d(name: &'static str) -> SymbolSpec {
    s(
        Runtime::Cuda,
        name,
        Category::Copy,
        "",
        d(gpu_kind::COPY_2D, 0, N, 0, N, 0, 0, 0),
    )
}
const fn sync(rt: Runtime, name: &'static str) -> SymbolSpec {
    s(
        rt,
        name,
        Category::Sync,
        "",
        d(gpu_kind::SYNC, gpu_flags::TIMED, N, N, N, 0, 0, 0),
    )
}
const fn coll(
    rt: Runtime,
    name: &'static str,
    op: &'static str,
    count: u8,
    dtype: u8,
) -> SymbolSpec {
    let table = match rt {
        Runtime::Hccl => gpu_dtype::HCCL,
        _ => gpu_dtype::NCCL,
    };
    s(
        rt,
        name,
        Category::Collective,
        op,
        d(
            gpu_kind::COLLECTIVE,
            gpu_flags::TIMED,
            count,
            dtype,
            N,
            0,
            0,
            table,
        ),
    )
}
const fn group(name: &'static str) -> SymbolSpec {
    s(
        Runtime::Nccl,
        name,
        Category::Group,
        "",
        d(gpu_kind::COUNT, gpu_flags::TIMED, N, N, N, 0, 0, 0),
    )
}
/// `dtype_table` names the library (NCCL or HCCL) so the kernel can record it with the rank.
const fn comm_init(rt: Runtime, name: &'static str, rank: u8, nranks: u8) -> SymbolSpec {
    let lib = match rt {
        Runtime::Hccl => gpu_dtype::HCCL,
        _ => gpu_dtype::NCCL,
    };
    s(
        rt,
        name,
        Category::CommInit,
        "",
        d(gpu_kind::COMM_INIT, 0, N, rank, nranks, 0, 0, lib),
    )
}

use Runtime::{AscendCl as Acl, Cuda, Hccl, Nccl};
use gpu_dir::{
    DEFAULT, DEVICE_TO_DEVICE as D2D, DEVICE_TO_HOST as D2H, HOST_TO_DEVICE as H2D, PEER,
};
use gpu_mem::{DEVICE, HOST_PINNED, MANAGED};

/// Every probed symbol. The index is the op id: append, never reorder within a release.
pub const CATALOG: &[SymbolSpec] = &[
    // --- CUDA driver (libcuda): launches. `_ptsz`: per-thread default stream variants.
    launch(Cuda, "cuLaunchKernel"),
    launch(Cuda, "cuLaunchKernel_ptsz"),
    launch(Cuda, "cuLaunchKernelEx"),
    launch(Cuda, "cuLaunchKernelEx_ptsz"),
    launch(Cuda, "cuLaunchCooperativeKernel"),
    launch(Cuda, "cuLaunchCooperativeKernel_ptsz"),
    graph("cuGraphLaunch"),
    graph("cuGraphLaunch_ptsz"),
    // Device, managed and pinned host memory.
    alloc(Cuda, "cuMemAlloc_v2", 0, 1, DEVICE),
    alloc(Cuda, "cuMemAllocAsync", 0, 1, DEVICE),
    alloc(Cuda, "cuMemAllocAsync_ptsz", 0, 1, DEVICE),
    alloc(Cuda, "cuMemAllocFromPoolAsync", 0, 1, DEVICE),
    alloc(Cuda, "cuMemAllocFromPoolAsync_ptsz", 0, 1, DEVICE),
    alloc(Cuda, "cuMemAllocManaged", 0, 1, MANAGED),
    free(Cuda, "cuMemFree_v2", DEVICE),
    free(Cuda, "cuMemFreeAsync", DEVICE),
    free(Cuda, "cuMemFreeAsync_ptsz", DEVICE),
    alloc(Cuda, "cuMemAllocHost_v2", 0, 1, HOST_PINNED),
    alloc(Cuda, "cuMemHostAlloc", 0, 1, HOST_PINNED),
    free(Cuda, "cuMemFreeHost", HOST_PINNED),
    register("cuMemHostRegister_v2"),
    free(Cuda, "cuMemHostUnregister", gpu_mem::HOST_REGISTERED),
    // Copies: (dst, src, bytes[, stream]); peer: (dstDev, dstCtx, srcDev, srcCtx, bytes[, stream]).
    copy(Cuda, "cuMemcpyHtoD_v2", 2, H2D),
    copy(Cuda, "cuMemcpyHtoD_v2_ptds", 2, H2D),
    copy(Cuda, "cuMemcpyHtoDAsync_v2", 2, H2D),
    copy(Cuda, "cuMemcpyHtoDAsync_v2_ptsz", 2, H2D),
    copy(Cuda, "cuMemcpyDtoH_v2", 2, D2H),
    copy(Cuda, "cuMemcpyDtoH_v2_ptds", 2, D2H),
    copy(Cuda, "cuMemcpyDtoHAsync_v2", 2, D2H),
    copy(Cuda, "cuMemcpyDtoHAsync_v2_ptsz", 2, D2H),
    copy(Cuda, "cuMemcpyDtoD_v2", 2, D2D),
    copy(Cuda, "cuMemcpyDtoD_v2_ptds", 2, D2D),
    copy(Cuda, "cuMemcpyDtoDAsync_v2", 2, D2D),
    copy(Cuda, "cuMemcpyDtoDAsync_v2_ptsz", 2, D2D),
    copy(Cuda, "cuMemcpy", 2, DEFAULT),
    copy(Cuda, "cuMemcpy_ptds", 2, DEFAULT),
    copy(Cuda, "cuMemcpyAsync", 2, DEFAULT),
    copy(Cuda, "cuMemcpyAsync_ptsz", 2, DEFAULT),
    copy(Cuda, "cuMemcpyPeer", 4, PEER),
    copy(Cuda, "cuMemcpyPeer_ptds", 4, PEER),
    copy(Cuda, "cuMemcpyPeerAsync", 4, PEER),
    copy(Cuda, "cuMemcpyPeerAsync_ptsz", 4, PEER),
    copy2d("cuMemcpy2D_v2"),
    copy2d("cuMemcpy2D_v2_ptds"),
    copy2d("cuMemcpy2DAsync_v2"),
    copy2d("cuMemcpy2DAsync_v2_ptsz"),
    // Host blocked on the device.
    sync(Cuda, "cuStreamSynchronize"),
    sync(Cuda, "cuStreamSynchronize_ptsz"),
    sync(Cuda, "cuCtxSynchronize"),
    // CUDA 13: torch.cuda.synchronize() and CuPy's Device.synchronize() land here.
    sync(Cuda, "cuCtxSynchronize_v2"),
    sync(Cuda, "cuEventSynchronize"),
    // --- NCCL: (sendbuff, recvbuff, count, datatype, ...); send/recv/bcast: (buff, count, datatype, ...).
    coll(Nccl, "ncclAllReduce", "all_reduce", 2, 3),
    coll(Nccl, "ncclAllGather", "all_gather", 2, 3),
    coll(Nccl, "ncclReduceScatter", "reduce_scatter", 2, 3),
    coll(Nccl, "ncclBroadcast", "broadcast", 2, 3),
    coll(Nccl, "ncclBcast", "broadcast", 1, 2),
    coll(Nccl, "ncclReduce", "reduce", 2, 3),
    coll(Nccl, "ncclAlltoAll", "all_to_all", 2, 3),
    coll(Nccl, "ncclSend", "send", 1, 2),
    coll(Nccl, "ncclRecv", "recv", 1, 2),
    group("ncclGroupStart"),
    group("ncclGroupEnd"),
    comm_init(Nccl, "ncclCommInitRank", 2, 1),
    comm_init(Nccl, "ncclCommInitRankConfig", 2, 1),
    comm_init(Nccl, "ncclCommInitRankScalable", 2, 1),
    comm_init(Nccl, "ncclCommInitAll", N, 1),
    comm_init(Nccl, "ncclCommSplit", N, N),
    // --- Ascend CL (libascendcl).
    alloc(Acl, "aclrtMalloc", 0, 1, DEVICE),
    alloc(Acl, "aclrtMallocCached", 0, 1, DEVICE),
    free(Acl, "aclrtFree", DEVICE),
    alloc(Acl, "aclrtMallocHost", 0, 1, HOST_PINNED),
    free(Acl, "aclrtFreeHost", HOST_PINNED),
    acl_copy("aclrtMemcpy"),
    acl_copy("aclrtMemcpyAsync"),
    sync(Acl, "aclrtSynchronizeStream"),
    sync(Acl, "aclrtSynchronizeStreamWithTimeout"),
    sync(Acl, "aclrtSynchronizeDevice"),
    sync(Acl, "aclrtSynchronizeEvent"),
    launch(Acl, "aclopExecute"),
    launch(Acl, "aclopExecuteV2"),
    launch(Acl, "aclopCompileAndExecute"),
    launch(Acl, "aclopCompileAndExecuteV2"),
    launch(Acl, "aclmdlExecute"),
    launch(Acl, "aclmdlExecuteAsync"),
    // --- HCCL: HcclAllReduce(sendBuf, recvBuf, count, dataType, op, comm, stream), ...
    coll(Hccl, "HcclAllReduce", "all_reduce", 2, 3),
    coll(Hccl, "HcclAllGather", "all_gather", 2, 3),
    coll(Hccl, "HcclReduceScatter", "reduce_scatter", 2, 3),
    coll(Hccl, "HcclBroadcast", "broadcast", 1, 2),
    coll(Hccl, "HcclAlltoAll", "all_to_all", 1, 2),
    coll(Hccl, "HcclSend", "send", 1, 2),
    coll(Hccl, "HcclRecv", "recv", 1, 2),
    // HcclCommInitRootInfo(nRanks, rootInfo*, rank, comm*); HcclCommInitClusterInfo(path, rank, comm*).
    comm_init(Hccl, "HcclCommInitRootInfo", 2, 0),
    comm_init(Hccl, "HcclCommInitClusterInfo", 1, N),
];

impl SymbolSpec {
    /// Calls that only put work on a device queue, made per kernel or per tensor: kernel and
    /// graph launches, and asynchronous device-to-device copies (DDP copies every gradient
    /// into its bucket: ~90 per step on a 27 M parameter model, measured on 2 x H200). Level
    /// `calls` leaves them unprobed, since each probed call costs a uprobe trap (2-7 us) on
    /// the launching thread. Host-blocking and host-device copies stay probed.
    pub fn enqueues_device_work(&self) -> bool {
        match self.category {
            Category::Launch | Category::GraphLaunch => true,
            Category::Copy => {
                self.desc.dir == gpu_dir::DEVICE_TO_DEVICE && self.name.contains("Async")
            }
            _ => false,
        }
    }
}

/// Op id of a symbol of a runtime.
pub fn op_id(runtime: Runtime, name: &str) -> Option<u16> {
    CATALOG
        .iter()
        .position(|s| s.runtime == runtime && s.name == name)
        .map(|i| i as u16)
}

/// The symbols of one runtime with their op ids.
pub fn symbols_of(runtime: Runtime) -> impl Iterator<Item = (u16, &'static SymbolSpec)> {
    CATALOG
        .iter()
        .enumerate()
        .filter(move |(_, s)| s.runtime == runtime)
        .map(|(i, s)| (i as u16, s))
}

/// The catalog's symbols of one runtime looked up in one library file.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CatalogSymbols {
    /// How many symbols the catalog has for the runtime.
    pub wanted: usize,
    /// (op id, file offset) of each one found, in catalog order.
    pub resolved: Vec<(u16, u64)>,
    /// The names of those found.
    pub found: Vec<String>,
    /// "name: why" of each one not found.
    pub missing: Vec<String>,
}

impl CatalogSymbols {
    pub fn resolve(table: &crate::elf::SymbolTable, runtime: Runtime) -> Self {
        let wanted: Vec<(u16, &str)> = symbols_of(runtime).map(|(op, s)| (op, s.name)).collect();
        let mut out = Self {
            wanted: wanted.len(),
            ..Self::default()
        };
        let res = table.resolve(wanted.iter().map(|(_, n)| *n));
        for ((op, name), (_, r)) in wanted.iter().zip(res) {
            match r {
                Ok(off) => {
                    out.resolved.push((*op, off));
                    out.found.push(name.to_string());
                }
                Err(why) => out.missing.push(format!("{name}: {why}")),
            }
        }
        out
    }

    /// Whether `name` is one of the catalog's symbols of `runtime` (what a table needs keep).
    pub fn wants(runtime: Runtime, name: &str) -> bool {
        symbols_of(runtime).any(|(_, s)| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every catalog symbol of the runtime is reported, found or missing with why, in catalog
    /// order: libc exports none of CUDA's.
    #[test]
    fn catalog_symbols_are_each_found_or_missing() {
        let path = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .map(std::path::Path::new)
        .find(|p| p.exists())
        .expect("libc.so.6");
        let table = crate::elf::SymbolTable::read(path).unwrap();
        let s = CatalogSymbols::resolve(&table, Runtime::Cuda);
        let names: Vec<&str> = symbols_of(Runtime::Cuda).map(|(_, s)| s.name).collect();
        assert_eq!(s.wanted, names.len());
        assert!(s.resolved.is_empty() && s.found.is_empty(), "{s:?}");
        assert_eq!(s.missing.len(), names.len());
        for (m, n) in s.missing.iter().zip(&names) {
            assert!(m.starts_with(&format!("{n}: ")), "{m}");
        }
    }

    #[test]
    fn device_work_is_launches_and_device_to_device_async_copies() {
        let enqueues =
            |rt, name| CATALOG[op_id(rt, name).expect(name) as usize].enqueues_device_work();
        for name in [
            "cuLaunchKernel",
            "cuLaunchKernelEx_ptsz",
            "cuGraphLaunch",
            "cuMemcpyDtoDAsync_v2",
            "cuMemcpyDtoDAsync_v2_ptsz",
        ] {
            assert!(
                enqueues(Runtime::Cuda, name),
                "{name} should not be probed at calls"
            );
        }
        // Host-blocking, host-device, peer and direction-less copies stay probed.
        for name in [
            "cuMemcpyDtoD_v2",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpyDtoHAsync_v2",
            "cuMemcpyAsync",
            "cuMemcpyPeerAsync",
            "cuMemcpy2DAsync_v2",
            "cuStreamSynchronize",
            "cuMemAlloc_v2",
        ] {
            assert!(
                !enqueues(Runtime::Cuda, name),
                "{name} should be probed at calls"
            );
        }
        assert!(!enqueues(Runtime::Nccl, "ncclAllReduce"));
        assert!(!enqueues(Runtime::AscendCl, "aclrtMemcpyAsync"));
    }

    #[test]
    fn catalog_fits_and_names_are_unique() {
        assert!(CATALOG.len() <= ethand_common::GPU_MAX_OPS as usize);
        let mut names: Vec<_> = CATALOG.iter().map(|s| (s.runtime, s.name)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len());
    }

    #[test]
    fn argument_indexes_are_registers() {
        for s in CATALOG {
            for a in [s.desc.bytes_arg, s.desc.aux_arg, s.desc.aux2_arg] {
                assert!(a == GPU_ARG_NONE || a < 6, "{}: argument {a}", s.name);
            }
            if s.category == Category::Collective {
                assert!(!s.operation.is_empty(), "{}", s.name);
            }
        }
    }
}
