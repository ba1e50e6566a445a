//! Self-tests of the stand-in runtime libraries and of gpu_driver (tests/standins): no BPF, no
//! root. The end-to-end GPU tests trust these: every catalog symbol is exported with a distinct
//! address, and the driver's ground truth is exactly what its plan asked for.
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use ethand_tests::standins::{
    self, CatalogSymbol, DirTruth, Lib, MEM_KINDS, Standins, SymbolTruth, catalog, dynamic_symbols,
    mapped_files, plan_every_symbol,
};

fn sd() -> &'static Standins {
    standins::shared()
}

fn sym(calls: u64, errors: u64, bytes: u64) -> SymbolTruth {
    SymbolTruth {
        calls,
        errors,
        bytes,
        ..Default::default()
    }
}

fn copy(calls: u64, bytes: u64, dir: &str) -> SymbolTruth {
    SymbolTruth {
        calls,
        bytes,
        dirs: BTreeMap::from([(dir.to_string(), DirTruth { calls, bytes })]),
        ..Default::default()
    }
}

fn catalog_of(runtime: &str) -> Vec<CatalogSymbol> {
    catalog()
        .into_iter()
        .filter(|s| s.runtime == runtime)
        .collect()
}

#[test]
fn build_is_fast_and_laid_out_like_real_installs() {
    let dir = std::env::temp_dir().join(format!("ethand-standins-selftest-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let t0 = Instant::now();
    let s = standins::build(&dir).expect("build");
    let took = t0.elapsed();
    println!("build took {took:?}");
    assert!(took < Duration::from_secs(5), "build took {took:?}");
    for (p, suffix) in [
        (&s.cuda, "usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (&s.cuda_copy, "opt/other/libcuda.so.1"),
        (
            &s.nccl,
            "venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        ),
        (
            &s.ascendcl,
            "usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
        ),
        (
            &s.hccl,
            "usr/local/Ascend/ascend-toolkit/latest/lib64/libhccl.so",
        ),
        (&s.driver, "bin/gpu_driver"),
    ] {
        assert_eq!(*p, dir.join(suffix));
        assert!(p.is_file(), "{p:?} missing");
    }
    // Rebuilding over an existing tree works (the copy is replaced).
    standins::build(&dir).expect("rebuild");
    fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn the_catalog_parses() {
    let cat = catalog();
    for rt in ["cuda", "nccl", "ascendcl", "hccl"] {
        assert!(
            cat.iter().any(|s| s.runtime == rt),
            "no {rt} symbol in the catalog"
        );
    }
    let find = |n: &str| {
        cat.iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    assert_eq!(find("cuMemcpy2D_v2").runtime, "cuda");
    assert_eq!(find("ncclGroupEnd").runtime, "nccl");
    assert_eq!(find("aclrtMemcpyAsync").helper, "acl_copy");
    assert_eq!(find("HcclCommInitRootInfo").runtime, "hccl");
    let mut names: Vec<_> = cat.iter().map(|s| (s.runtime, &s.name)).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), cat.len(), "duplicate catalog entries");
}

#[test]
fn each_library_exports_every_catalog_symbol_with_its_own_address() {
    let s = sd();
    for lib in Lib::RUNTIMES {
        let path = s.path(lib);
        let syms = dynamic_symbols(path).expect("nm");
        let mut by_addr: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for c in catalog_of(lib.runtime()) {
            let d = syms
                .iter()
                .find(|d| d.name == c.name)
                .unwrap_or_else(|| panic!("{} does not export {}", path.display(), c.name));
            assert_ne!(d.addr, 0, "{}", c.name);
            if lib == Lib::Nccl {
                // Like real NCCL: the API weak, `pnccl*` a global alias at the same address.
                assert_eq!(d.kind, 'W', "{} should be weak: {d:?}", c.name);
                let p = syms
                    .iter()
                    .find(|p| p.name == format!("p{}", c.name))
                    .unwrap_or_else(|| panic!("no p{}", c.name));
                assert_eq!((p.kind, p.addr), ('T', d.addr), "p{}", c.name);
            } else {
                assert_eq!(d.kind, 'T', "{d:?}");
            }
            by_addr.entry(d.addr).or_default().push(&d.name);
        }
        for (addr, names) in by_addr {
            assert_eq!(
                names.len(),
                1,
                "{}: {names:?} share address {addr:#x}",
                path.display()
            );
        }
    }
}

#[test]
fn the_second_copy_is_identical_with_another_inode() {
    let s = sd();
    let (a, b) = (
        fs::metadata(&s.cuda).expect("cuda"),
        fs::metadata(&s.cuda_copy).expect("copy"),
    );
    assert_ne!((a.dev(), a.ino()), (b.dev(), b.ino()));
    assert_eq!(
        fs::read(&s.cuda).expect("read"),
        fs::read(&s.cuda_copy).expect("read")
    );
}

#[test]
fn ground_truth_is_what_the_plan_asked_for() {
    let s = sd();
    let t = s.run_driver(
        &Lib::RUNTIMES,
        &[
            "launches 3",
            "launches_ptsz x 2",
            "launch_ex",
            "graph 4",
            "alloc 1M x 3",
            "alloc 2T", // over the 1 TiB limit: an error, no bytes
            "alloc_async 4K",
            "alloc_managed 8K x 2",
            "host_alloc 64K",
            "alloc_host 32K",
            "host_register 1M",
            "host_register 100M", // above malloc's range: a reservation
            "htod 4K x 3",
            "htod_async 1K",
            "dtoh 2K x 2",
            "dtod 100",
            "memcpy_default 10 x 5",
            "peer 1G",
            "memcpy2d 64x8 htod x 2",
            "memcpy2d_async 3x3 dtod",
            "sync stream 2",
            "sync_ctx",
            "sync event 1",
            "comm_init_rank 1 4",
            "group_start",
            "allreduce 1024 float32 x 2",
            "allgather 10 bfloat16",
            "send 3 7", // 3 x float32 (7)
            "group_end",
            "comm_init_rank_config 2 8",
            "acl_malloc 1K x 2",
            "acl_malloc 5T",
            "acl_malloc_host 2K",
            "acl_memcpy 100 1 x 2",
            "acl_memcpy_async 50 d2h",
            "acl_sync_stream 2",
            "acl_op_execute 5",
            "hccl_comm_init_root_info 16 3",
            "hccl_allreduce 10 fp16 x 4",
            "free 2",        // the two oldest: cuMemAlloc_v2's 1 MiB x 2
            "free_async 1",  // the next CUDA device one: the third 1 MiB
            "free_host all", // both pinned host allocations of cuda
            "untracked_free 3",
        ],
    );
    let cuda = &s.cuda;
    let sync = |calls: u64| SymbolTruth {
        calls,
        min_time_ns: calls * t.sync_us * 1000,
        ..Default::default()
    };
    let want_cuda: BTreeMap<String, SymbolTruth> = [
        ("cuLaunchKernel", sym(3, 0, 0)),
        ("cuLaunchKernel_ptsz", sym(2, 0, 0)),
        ("cuLaunchKernelEx", sym(1, 0, 0)),
        ("cuGraphLaunch", sym(4, 0, 0)),
        ("cuMemAlloc_v2", sym(4, 1, 3 << 20)),
        ("cuMemAllocAsync", sym(1, 0, 4096)),
        ("cuMemAllocManaged", sym(2, 0, 16384)),
        ("cuMemHostAlloc", sym(1, 0, 65536)),
        ("cuMemAllocHost_v2", sym(1, 0, 32768)),
        ("cuMemHostRegister_v2", sym(2, 0, (1 << 20) + (100 << 20))),
        ("cuMemFree_v2", sym(2 + 3, 0, 2 << 20)),
        ("cuMemFreeAsync", sym(1, 0, 1 << 20)),
        ("cuMemFreeHost", sym(2, 0, 65536 + 32768)),
        ("cuMemcpyHtoD_v2", copy(3, 12288, "host_to_device")),
        ("cuMemcpyHtoDAsync_v2", copy(1, 1024, "host_to_device")),
        ("cuMemcpyDtoH_v2", copy(2, 4096, "device_to_host")),
        ("cuMemcpyDtoD_v2", copy(1, 100, "device_to_device")),
        ("cuMemcpy", copy(5, 50, "default")),
        ("cuMemcpyPeer", copy(1, 1 << 30, "peer")),
        ("cuMemcpy2D_v2", copy(2, 1024, "host_to_device")),
        ("cuMemcpy2DAsync_v2", copy(1, 9, "device_to_device")),
        ("cuStreamSynchronize", sync(2)),
        ("cuCtxSynchronize", sync(1)),
        ("cuEventSynchronize", sync(1)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(t.libraries[cuda].symbols, want_cuda);
    assert_eq!(t.libraries[cuda].runtime, "cuda");
    assert_eq!(t.libraries[cuda].namespace, "base");

    let want_nccl: BTreeMap<String, SymbolTruth> = [
        ("ncclCommInitRank", sym(1, 0, 0)),
        ("ncclCommInitRankConfig", sym(1, 0, 0)),
        ("ncclGroupStart", sym(1, 0, 0)),
        ("ncclGroupEnd", sym(1, 0, 0)),
        ("ncclAllReduce", sym(2, 0, 2 * 1024 * 4)),
        ("ncclAllGather", sym(1, 0, 20)),
        ("ncclSend", sym(1, 0, 12)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(t.libraries[&s.nccl].symbols, want_nccl);

    let want_acl: BTreeMap<String, SymbolTruth> = [
        ("aclrtMalloc", sym(3, 1, 2048)),
        ("aclrtMallocHost", sym(1, 0, 2048)),
        ("aclrtMemcpy", copy(2, 200, "host_to_device")),
        ("aclrtMemcpyAsync", copy(1, 50, "device_to_host")),
        ("aclrtSynchronizeStream", sync(2)),
        ("aclopExecute", sym(5, 0, 0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(t.libraries[&s.ascendcl].symbols, want_acl);

    let want_hccl: BTreeMap<String, SymbolTruth> = [
        ("HcclCommInitRootInfo", sym(1, 0, 0)),
        ("HcclAllReduce", sym(4, 0, 80)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(t.libraries[&s.hccl].symbols, want_hccl);

    // Live: cuda device 4K (async) + acl device 2K; managed 16K; pinned: acl 2K;
    // registered 101 MiB.
    assert_eq!(t.live("device"), 4096 + 2048);
    assert_eq!(t.live("managed"), 16384);
    assert_eq!(t.live("host_pinned"), 2048);
    assert_eq!(t.live("host_registered"), 101 << 20);
    // Peak device: 3 MiB + 4K were live before any free, then the acl allocations came.
    assert_eq!(t.peak("device"), (3 << 20) + 4096 + 2048);
    assert_eq!(t.peak("host_pinned"), 65536 + 32768 + 2048);
    let mut kinds = MEM_KINDS.to_vec();
    kinds.sort();
    assert_eq!(
        t.live_bytes.keys().map(String::as_str).collect::<Vec<_>>(),
        kinds
    );
    assert_eq!(t.untracked_frees, 3);
    assert_eq!(t.comms.len(), 3);
    assert_eq!(
        (
            t.comms[0].symbol.as_str(),
            t.comms[0].rank,
            t.comms[0].nranks
        ),
        ("ncclCommInitRank", Some(1), Some(4))
    );
    assert_eq!(t.comms[2].library, s.hccl);
    // The largest communicator: HCCL's 16 ranks, rank 3.
    assert_eq!((t.rank, t.nranks), (Some(3), 16));
    assert_eq!(t.sync_us, 1000);
    assert!(t.pid > 0);
}

#[test]
fn every_catalog_symbol_is_called_once_by_its_plan() {
    let s = sd();
    let plan = plan_every_symbol();
    let words: Vec<&str> = plan.iter().map(String::as_str).collect();
    let t = s.run_driver(&Lib::RUNTIMES, &words);
    let cat = catalog();
    for c in &cat {
        let got = t.symbol(s.path(c.lib()), &c.name);
        assert_eq!(got.calls, 1, "{}: {got:?}", c.name);
        assert_eq!(got.errors, 0, "{}", c.name);
    }
    let called: usize = t.libraries.values().map(|l| l.symbols.len()).sum();
    assert_eq!(called, cat.len(), "symbols outside the catalog were called");
    // What each communicator creation says about rank and size.
    let comm = |name: &str| {
        let c = t.comms.iter().find(|c| c.symbol == name);
        c.map(|c| (c.rank, c.nranks))
    };
    assert_eq!(comm("ncclCommInitRank"), Some((Some(1), Some(4))));
    assert_eq!(comm("ncclCommInitAll"), Some((Some(u32::MAX), Some(2))));
    assert_eq!(comm("ncclCommSplit"), Some((None, None)));
    assert_eq!(comm("HcclCommInitRootInfo"), Some((Some(1), Some(4))));
    assert_eq!(comm("HcclCommInitClusterInfo"), Some((Some(1), None)));
    // The first of the largest (4 ranks): ncclCommInitRank's.
    assert_eq!((t.rank, t.nranks), (Some(1), 4));
}

#[test]
fn syncs_take_the_time_they_say() {
    let s = sd();
    let t0 = Instant::now();
    let t = s
        .command(
            &[Lib::Cuda, Lib::AscendCl],
            &["sync stream 10", "acl_sync_device 5"],
        )
        .env(standins::SYNC_ENV, "4000")
        .output()
        .expect("run driver");
    let took = t0.elapsed();
    assert!(t.status.success());
    let truth = standins::GroundTruth::parse(String::from_utf8_lossy(&t.stdout).trim())
        .expect("ground truth");
    assert_eq!(truth.sync_us, 4000);
    assert_eq!(
        truth.symbol(&s.cuda, "cuStreamSynchronize").min_time_ns,
        40_000_000
    );
    assert_eq!(
        truth
            .symbol(&s.ascendcl, "aclrtSynchronizeDevice")
            .min_time_ns,
        20_000_000
    );
    assert!(
        took >= Duration::from_millis(60),
        "15 syncs of 4 ms took {took:?}"
    );
}

#[test]
fn dlopen_late_maps_the_library_only_then() {
    let s = sd();
    let mut d = s.spawn_driver(
        &[Lib::Cuda],
        &[
            "launches 1",
            "wait_stdin",
            &s.dlopen_late(Lib::CudaCopy),
            "use cuda2",
            "launches 2",
            "alloc 1K",
            "use cuda",
            "graph 1",
            "mark loaded",
            "wait_stdin",
            "free all",
        ],
    );
    d.wait_for("waiting");
    let before = mapped_files(d.pid);
    let ino = |p: &std::path::Path| fs::metadata(p).expect("stat").ino();
    assert!(
        before.contains(&(s.cuda.clone(), ino(&s.cuda))),
        "{before:?}"
    );
    assert!(!before.iter().any(|(p, _)| *p == s.cuda_copy), "{before:?}");
    d.resume();
    d.wait_for("mark loaded");
    d.wait_for("waiting");
    let after = mapped_files(d.pid);
    assert!(
        after.contains(&(s.cuda_copy.clone(), ino(&s.cuda_copy))),
        "{after:?}"
    );
    assert!(after.contains(&(s.cuda.clone(), ino(&s.cuda))));
    d.resume();
    let t = d.finish();
    assert_eq!(t.symbol(&s.cuda, "cuLaunchKernel").calls, 1);
    assert_eq!(t.symbol(&s.cuda, "cuGraphLaunch").calls, 1);
    assert_eq!(t.symbol(&s.cuda_copy, "cuLaunchKernel").calls, 2);
    // Freed through the library that allocated it.
    assert_eq!(t.symbol(&s.cuda_copy, "cuMemFree_v2"), sym(1, 0, 1024));
    assert_eq!(t.libraries[&s.cuda_copy].namespace, "new");
    assert_eq!(t.live("device"), 0);
    assert_eq!(t.peak("device"), 1024);
}

#[test]
fn the_second_copy_at_start_up_is_a_second_mapping() {
    let s = sd();
    let mut d = s.spawn_driver(
        &[Lib::Cuda, Lib::CudaCopy],
        &["htod 10", "use cuda2", "htod 20 x 2", "wait_stdin"],
    );
    d.wait_for("waiting");
    let libcuda: Vec<_> = mapped_files(d.pid)
        .into_iter()
        .filter(|(p, _)| p.file_name().is_some_and(|n| n == "libcuda.so.1"))
        .collect();
    assert_eq!(libcuda.len(), 2, "{libcuda:?}");
    assert_ne!(libcuda[0].1, libcuda[1].1);
    let t = d.finish();
    assert_eq!(
        t.symbol(&s.cuda, "cuMemcpyHtoD_v2"),
        copy(1, 10, "host_to_device")
    );
    assert_eq!(
        t.symbol(&s.cuda_copy, "cuMemcpyHtoD_v2"),
        copy(2, 40, "host_to_device")
    );
    assert_eq!(t.total("cuMemcpyHtoD_v2"), copy(3, 50, "host_to_device"));
}

#[test]
fn bad_plans_are_refused() {
    let s = sd();
    for plan in [
        &["no_such_op"][..],
        &["free 1"],                        // nothing to free
        &["alloc"],                         // size missing
        &["allreduce 10 float99"],          // unknown type
        &["memcpy2d 4x4 sideways"],         // unknown direction
        &["use hccl2", "hccl_send 1 int8"], // slot not open
    ] {
        let (code, err) = s
            .spawn_driver(&[Lib::Cuda, Lib::Nccl, Lib::Hccl], plan)
            .finish_err();
        assert_eq!(code, Some(2), "{plan:?}: {err}");
        assert!(err.contains("gpu_driver:"), "{plan:?}: {err}");
    }
    // A library that cannot be opened: exit 1 before `ready`.
    let out = s
        .command(&[], &["dlopen_late cuda /nonexistent/libcuda.so.1"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
}
