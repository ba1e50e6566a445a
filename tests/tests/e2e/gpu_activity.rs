//! What the GPU ran, recorded by libethand_cupti.so for a snapshot, against the stand-ins: the
//! stand-in libcuda loads the library at cuInit as the driver does (CUDA_INJECTION64_PATH),
//! the library loads the stand-in libcupti (ETHAND_CUPTI_LIB) only when the daemon opens a
//! window, and the stand-in CUPTI records every kernel, copy and sync the driver program makes
//! on an emulated serial GPU (10 us per kernel, 100 ns per KiB copied). The snapshot must give
//! exactly those: counts by kernel name, GPU busy time, copies by kind, syncs; a process with
//! CUPTI held by another tool must be told apart, one without the library named, and a
//! process no snapshot asked about must never load CUPTI at all.
use std::{
    path::{Path, PathBuf},
    thread,
    time::Instant,
};

use ethand_snapshot::kernels::{
    ActivityState, CopyKind, GpuActivity, KernelClass, MemoryKind, SyncKind,
};
use ethand_tests::{
    Daemon, SETTLE, serial,
    standins::{self, Driver, Lib},
    text,
};

const KERNEL_NS: u64 = 10_000;
const WINDOW_MS: u64 = 3000;
/// The traced driver's kernels start this long after their launch call at the earliest.
const LAUNCH_NS: u64 = 50_000;
/// PyTorch's float add kernel, as CUPTI names it.
const TORCH_ADD: &str = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_";

fn config() -> String {
    // The launch sample as long as the window, as at the defaults (both 2 s).
    format!(
        "[gpu]\nrescan_interval_ms = 300\n[diagnosis]\ngpu_activity_ms = {WINDOW_MS}\nlaunch_sample_ms = {WINDOW_MS}\n"
    )
}

/// The library the daemon `name` installed.
fn library(name: &str) -> PathBuf {
    let dir = ethand_tests::temp_path(name, "cupti");
    let lib = dir.join("libethand_cupti.so");
    assert!(lib.exists(), "the daemon did not install {}", lib.display());
    lib
}

/// The driver with the library injected (or not) and the stand-in CUPTI to find.
fn driver(lib: Option<&Path>, plan: &[&str], busy: bool) -> Driver {
    driver_with(lib, plan, busy, &[])
}

fn driver_with(lib: Option<&Path>, plan: &[&str], busy: bool, env: &[(&str, &str)]) -> Driver {
    let s = standins::shared();
    let mut cmd = s.command(&[Lib::Cuda], plan);
    cmd.envs(env.iter().copied());
    if let Some(lib) = lib {
        cmd.env("CUDA_INJECTION64_PATH", lib);
    }
    cmd.env("ETHAND_CUPTI_LIB", &s.cupti13);
    if busy {
        cmd.env("ETHAND_STANDIN_CUPTI_BUSY", "1");
    }
    Driver::spawn(&mut cmd)
}

fn activity(d: &Daemon, pid: u32) -> GpuActivity {
    activity_of(snapshot(d, pid), pid)
}

fn activity_of(t: ethand_tests::TreeSnapshot, pid: u32) -> GpuActivity {
    let a = t
        .gpu_activity
        .unwrap_or_else(|| panic!("no gpu_activity in the snapshot of {pid}"));
    eprintln!("observed: {}", serde_json::to_string(&a).expect("json"));
    a
}

/// The snapshot of `job`, taken while the job, released from its `wait_stdin`, runs on until
/// the stderr line `mark` (the window is recording by then) and its next `wait_stdin`.
fn snapshot_during(d: &Daemon, job: &mut Driver, mark: &str) -> ethand_tests::TreeSnapshot {
    let pid = job.pid;
    thread::scope(|s| {
        let snap = s.spawn(|| snapshot(d, pid));
        job.resume();
        job.wait_for(mark);
        job.wait_for("waiting");
        snap.join().expect("snapshot thread")
    })
}

/// The GPU activity of [`snapshot_during`].
fn activity_during(d: &Daemon, job: &mut Driver, mark: &str) -> GpuActivity {
    let pid = job.pid;
    activity_of(snapshot_during(d, job, mark), pid)
}

#[test]
fn a_snapshot_records_exactly_what_the_gpu_ran() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity", &config());
    let lib = library("gpu-activity");
    let torch_add = format!("kernel {TORCH_ADD} x 50");
    let plan: Vec<&str> = vec![
        "cuinit",
        "wait_stdin",
        "wait_cupti_enabled",
        // The copies queue behind the gemms; after the sleep (host wait) the adds (each
        // LAUNCH_NS late at least: kernel wait). The last device work is a kernel: the idle
        // split's ground truth then covers every gap between the window's first and last.
        "kernel gemm_fp32 x 300",
        "htod 1M x 4",
        "sleep 20",
        "kernel add x 100",
        // As PyTorch and NCCL name theirs: a mangled C++ name (demangled by the reader) and
        // a collective (communication; on the serial stand-in GPU never overlapped).
        &torch_add,
        "kernel ncclDevKernel_AllReduce_Sum_f32_RING_LL x 20",
        "sync ctx",
        "wait_stdin",
        // After the window: the call at whose exit the library detaches CUPTI.
        "kernel add x 1",
    ];
    let launch = LAUNCH_NS.to_string();
    let mut traced = driver_with(
        Some(&lib),
        &plan,
        false,
        &[("ETHAND_STANDIN_CUPTI_LAUNCH_NS", &launch)],
    );
    // Injected, never asked about: CUPTI is never loaded.
    let mut dormant = driver(
        Some(&lib),
        &[
            "cuinit",
            "kernel gemm_fp32 x 50",
            "wait_stdin",
            "kernel add x 5",
        ],
        false,
    );
    let mut plain = driver(
        None,
        &["cuinit", "wait_stdin", "kernel add x 7", "wait_stdin"],
        false,
    );
    traced.wait_for("waiting");
    dormant.wait_for("waiting");
    plain.wait_for("waiting");
    thread::sleep(SETTLE);

    let t0 = Instant::now();
    // Released now, the driver waits until the window has CUPTI recording.
    let a = activity_during(&d, &mut traced, "cupti enabled");
    let took = t0.elapsed();
    eprintln!("observed: the snapshot took {took:?}");
    let truth = traced.finish();
    assert_eq!(truth.kernels.get("gemm_fp32"), Some(&300));
    assert_eq!(a.processes.len(), 1, "{a:?}");
    let p = &a.processes[0];
    assert_eq!(
        (p.pid, p.state),
        (truth.pid, ActivityState::Recorded),
        "{p:?}"
    );
    assert_eq!(p.cupti_version, Some(130500));
    assert_eq!(p.records_dropped_by_cupti, 0);
    assert_eq!(p.records_lost_by_ethand, 0);
    assert_eq!(p.incomplete, None, "{p:?}");
    // 470 kernels, 4 copies, 1 sync: nothing else happened in the window.
    assert_eq!(p.records, 475, "{p:?}");
    let names: Vec<(Option<&str>, Option<&str>, KernelClass, u64, u64)> = p
        .kernels
        .iter()
        .map(|k| {
            (
                k.name.as_deref(),
                k.demangled.as_deref(),
                k.class,
                k.count,
                k.gpu_ns,
            )
        })
        .collect();
    let nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
    assert_eq!(
        names,
        vec![
            (
                Some("gemm_fp32"),
                None,
                KernelClass::Gemm,
                300,
                300 * KERNEL_NS
            ),
            (Some("add"), None, KernelClass::Other, 100, 100 * KERNEL_NS),
            (
                Some(TORCH_ADD),
                Some(
                    "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3> >"
                ),
                KernelClass::Elementwise,
                50,
                50 * KERNEL_NS
            ),
            (
                Some(nccl),
                None,
                KernelClass::Communication,
                20,
                20 * KERNEL_NS
            ),
        ]
    );
    let classes: Vec<(KernelClass, u64, u64)> = p
        .kernel_classes
        .iter()
        .map(|c| (c.class, c.count, c.gpu_ns))
        .collect();
    assert_eq!(
        classes,
        vec![
            (KernelClass::Gemm, 300, 300 * KERNEL_NS),
            (KernelClass::Other, 100, 100 * KERNEL_NS),
            (KernelClass::Elementwise, 50, 50 * KERNEL_NS),
            (KernelClass::Communication, 20, 20 * KERNEL_NS),
        ]
    );
    // Serial kernels: busy is their sum, on device 0, within the window.
    assert_eq!(p.devices.len(), 1, "{p:?}");
    let dev = &p.devices[0];
    assert_eq!((dev.device, dev.kernels), (0, 470));
    assert_eq!(dev.busy_ns, 470 * KERNEL_NS);
    assert_eq!(dev.kernel_ns, 470 * KERNEL_NS);
    // The collectives ran alone (one kernel at a time on the stand-in GPU).
    let comm = dev.communication.as_ref().expect("collectives");
    assert_eq!(
        (comm.communication_ns, comm.overlapped_ns),
        (20 * KERNEL_NS, 0)
    );
    let window_ns = p.window_ns.expect("window");
    assert!(
        (WINDOW_MS * 1_000_000 * 9 / 10..WINDOW_MS * 1_000_000 * 3 / 2).contains(&window_ns),
        "window {window_ns} ns"
    );
    assert_eq!(
        dev.busy_fraction,
        Some(dev.busy_ns as f64 / window_ns as f64)
    );
    // The idle split against the stand-in's own account of every gap after the window's
    // first kernel: host wait up to each launch call, launch latency after it; the copies
    // ran alone between the gemms and the sleep.
    let cupti = truth.cupti.clone().expect("the stand-in CUPTI was loaded");
    let idle = dev.idle.as_ref().expect("idle split");
    assert_eq!(
        cupti["latency_timestamps"], 2,
        "on at open, off at close: {cupti}"
    );
    assert_eq!(
        Some(idle.host_wait_ns),
        cupti["gap_host_ns"].as_u64(),
        "{idle:?} {cupti}"
    );
    assert_eq!(
        Some(idle.kernel_wait_ns),
        cupti["gap_launch_ns"].as_u64(),
        "{idle:?} {cupti}"
    );
    // The sleep less the work still queued when it began (the gemms and copies at most).
    assert!(
        idle.host_wait_ns >= 20_000_000 - 300 * KERNEL_NS - 4 * 1024 * 100,
        "the sleep: {idle:?}"
    );
    assert!(idle.kernel_wait_ns >= LAUNCH_NS, "{idle:?}");
    assert_eq!(idle.copy_ns, 4 * 1024 * 100, "{idle:?}");
    assert!(idle.gaps >= 1, "{idle:?}");
    // The parts and the busy time fill the window (CUPTI's clock against the monotonic one
    // the window is timed on: the same rate, pairs read a few microseconds apart).
    let filled =
        dev.busy_ns + idle.host_wait_ns + idle.kernel_wait_ns + idle.copy_ns + idle.unattributed_ns;
    assert!(
        filled.abs_diff(window_ns) < 1_000_000,
        "{filled} of {window_ns}: {idle:?}"
    );
    // The driver copies from ordinary (pageable) memory: 100 ns per KiB.
    assert_eq!(p.copies.len(), 1, "{:?}", p.copies);
    let c = &p.copies[0];
    assert_eq!(
        (c.kind, c.src, c.dst, c.count, c.bytes, c.gpu_ns),
        (
            CopyKind::HostToDevice,
            MemoryKind::Pageable,
            MemoryKind::Device,
            4,
            4 << 20,
            4 * 1024 * 100
        )
    );
    assert_eq!(
        c.bytes_per_s,
        Some((4u64 << 20) as f64 * 1e9 / (4 * 1024 * 100) as f64)
    );
    assert_eq!(p.syncs.len(), 1, "{:?}", p.syncs);
    assert_eq!((p.syncs[0].kind, p.syncs[0].count), (SyncKind::Context, 1));
    // The window closed: CUPTI was detached at the exit of the next CUDA call...
    assert_eq!(truth.kernels.get("add"), Some(&101));
    assert_eq!(cupti["subscribe"], 1, "{cupti}");
    assert_eq!(cupti["finalize"], 1, "{cupti}");
    assert_eq!(cupti["api_exit_callbacks"], 1, "{cupti}");
    assert_eq!(cupti["records_dropped"], 0, "{cupti}");
    // ... and nothing of the dormant process went near CUPTI.
    dormant.resume();
    let quiet = dormant.finish();
    assert_eq!(quiet.kernels.get("add"), Some(&5));
    assert!(
        quiet.cupti.is_none(),
        "CUPTI loaded without a window: {:?}",
        quiet.cupti
    );
    // A process without the library is named as such, with what to set.
    let a = activity(&d, plain.pid);
    assert_eq!(a.processes.len(), 1, "{a:?}");
    assert_eq!(a.processes[0].state, ActivityState::NotInjected);
    let detail = a.processes[0].detail.clone().unwrap_or_default();
    assert!(
        detail.contains(&format!("CUDA_INJECTION64_PATH={}", lib.display())),
        "{detail}"
    );
    // The terminal view says it too.
    let out = d.cli(&["snapshot", "--pid", &plain.pid.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("GPU ACTIVITY") && shown.contains("not started with libethand_cupti.so"),
        "{shown}"
    );
    plain.resume();
    plain.resume();
    let _ = plain.finish();
}

/// CUPTI held by another tool (torch.profiler, Nsight): the library steps aside and the
/// snapshot says so; the process carries on.
#[test]
fn a_process_whose_cupti_is_taken_is_told_apart() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-busy", &config());
    let lib = library("gpu-activity-busy");
    let mut busy = driver(
        Some(&lib),
        &["cuinit", "wait_stdin", "kernel add x 10", "wait_stdin"],
        true,
    );
    busy.wait_for("waiting");
    thread::sleep(SETTLE);
    let a = activity(&d, busy.pid);
    assert_eq!(a.processes.len(), 1, "{a:?}");
    let p = &a.processes[0];
    assert_eq!(p.state, ActivityState::Refused, "{p:?}");
    assert!(
        p.detail.as_deref().unwrap_or("").contains("stepped aside"),
        "{p:?}"
    );
    assert_eq!(p.records, 0);
    busy.resume();
    busy.resume();
    let truth = busy.finish();
    assert_eq!(truth.kernels.get("add"), Some(&10));
    let cupti = truth.cupti.expect("loaded for the window");
    assert_eq!(cupti["subscribe_refused"], 1, "{cupti}");
    // Answered as soon as the library said so, not at the window's end.
    assert!(a.duration_ms < WINDOW_MS, "{a:?}");
}

/// Another tool registers its own activity buffers with CUPTI inside a window: the library's
/// records stop once its current buffer is full, and the snapshot must not pass the rest off
/// as the whole window: the launches the uprobes counted over the same time show the records
/// fell short.
#[test]
fn records_cut_short_by_another_tool_are_called_incomplete() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-taken", &config());
    let lib = library("gpu-activity-taken");
    let mut job = driver(
        Some(&lib),
        &[
            "cuinit",
            "wait_stdin",
            "wait_cupti_enabled",
            "kernel add x 200",
            "cupti_take_buffers",
            // Past the library's buffer (1 MiB: 4,228 kernel records of CUPTI 13).
            "kernel add x 20000",
            "wait_stdin",
        ],
        false,
    );
    job.wait_for("waiting");
    thread::sleep(SETTLE);
    let a = activity_during(&d, &mut job, "cupti buffers taken");
    job.resume();
    let truth = job.finish();
    assert_eq!(truth.kernels.get("add"), Some(&20_200));
    let p = &a.processes[0];
    assert_eq!(p.state, ActivityState::Recorded, "{p:?}");
    let recorded = p.devices.iter().map(|d| d.kernels).sum::<u64>();
    assert!(
        (200..20_200).contains(&recorded),
        "{recorded} of 20,200 kernels recorded"
    );
    let why = p
        .incomplete
        .as_deref()
        .unwrap_or_else(|| panic!("not called incomplete: {p:?}"));
    assert!(why.contains("launches/s counted by the uprobes"), "{why}");
}

/// A job that loads its CUDA libraries by path from the wheels' directories (JAX does: its
/// plugin opens nvidia/.../lib/... itself) and sets no ETHAND_CUPTI_LIB: the library finds
/// the wheel's libcupti beside them and records. CUDA 13's wheels keep every library in
/// nvidia/cu13/lib (a libcuda copied there stands for them); CUDA 12's each in its own
/// nvidia/NAME/lib, CUPTI's in nvidia/cuda_cupti/lib (found from the stand-in NCCL's
/// nvidia/nccl/lib).
#[test]
fn the_library_finds_cupti_beside_the_jobs_cuda_libraries() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-beside", &config());
    let lib = library("gpu-activity-beside");
    let s = standins::shared();
    let wheel = ethand_tests::temp_path("gpu-activity-beside", "site");
    let cu13 = wheel.join("nvidia/cu13/lib");
    std::fs::create_dir_all(&cu13).expect("wheel dir");
    let cuda13 = cu13.join("libcuda.so.1");
    std::fs::copy(&s.cuda, &cuda13).expect("copy libcuda");
    std::fs::copy(&s.cupti13, cu13.join("libcupti.so.13")).expect("copy libcupti");
    let cases: [(&str, Vec<(&str, &Path)>, u32); 2] = [
        ("CUDA 13 wheel", vec![("cuda", &cuda13)], 130500),
        (
            "CUDA 12 wheels",
            vec![("cuda", &s.cuda), (Lib::Nccl.slot(), &s.nccl)],
            28,
        ),
    ];
    for (what, libs, version) in cases {
        let mut cmd = std::process::Command::new(&s.driver);
        for (slot, path) in libs {
            cmd.arg(format!("--{slot}")).arg(path);
        }
        cmd.arg("--")
            .args(
                "cuinit wait_stdin wait_cupti_enabled kernel add x 10 wait_stdin kernel add x 1"
                    .split(' '),
            )
            .env("CUDA_INJECTION64_PATH", &lib)
            .env_remove("ETHAND_CUPTI_LIB");
        let mut job = Driver::spawn(&mut cmd);
        job.wait_for("waiting");
        thread::sleep(SETTLE);
        let pid = job.pid;
        let a = thread::scope(|sc| {
            let snap = sc.spawn(|| activity(&d, pid));
            job.resume();
            job.wait_for("cupti enabled");
            job.wait_for("waiting");
            snap.join().expect("snapshot thread")
        });
        job.resume();
        let truth = job.finish();
        assert_eq!(truth.kernels.get("add"), Some(&11), "{what}");
        let p = &a.processes[0];
        assert_eq!(p.state, ActivityState::Recorded, "{what}: {p:?}");
        assert_eq!(p.cupti_version, Some(version), "{what}: {p:?}");
        assert_eq!(
            p.kernels.iter().map(|k| k.count).sum::<u64>(),
            10,
            "{what}: {p:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&wheel);
}

/// The whole snapshot of `pid` (findings and all).
fn snapshot(d: &Daemon, pid: u32) -> ethand_tests::TreeSnapshot {
    let p = pid.to_string();
    let out = d.cli(&["snapshot", "--pid", &p, "--json", "--window", "5"]);
    assert!(out.status.success(), "snapshot: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("snapshot JSON")
}

/// A finding's evidence value.
fn evidence(t: &ethand_tests::TreeSnapshot, rule: &str, signal: &str) -> f64 {
    let f = t
        .findings
        .iter()
        .find(|f| f.id == rule)
        .unwrap_or_else(|| panic!("no {rule} among {:?}", t.findings));
    f.evidence
        .iter()
        .find(|e| e.signal == signal)
        .unwrap_or_else(|| panic!("{rule} shows no {signal}: {:?}", f.evidence))
        .value
}

/// The rules that read the kernels themselves, on jobs the stand-ins make with known GPU
/// time: a loop of tiny kernels (10 us each on the emulated GPU) with the host sleeping a
/// millisecond after every 30 must be `short_kernels` (the uprobes' launch_bound cannot see
/// it: the main thread mostly sleeps), with the kernels' mean duration and the host-wait
/// share exactly the stand-in CUPTI's own account; the same loop with 2 ms kernels, one per
/// 5 ms sleep, is a GPU waiting for the host for no known reason: `gpu_waits_for_host`; a
/// 1 ms GEMM and a 1 ms all-reduce per 2 ms (the serial stand-in GPU never overlaps them)
/// is `collectives_not_overlapped`.
#[test]
fn rules_on_the_recorded_kernels() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-rules", &config());
    let lib = library("gpu-activity-rules");
    let nccl = "kernel ncclDevKernel_AllReduce_Sum_f32_RING_LL x 1";
    for (kernel_ns, step, sleep_ms, rounds, rule) in [
        (
            10_000u64,
            &["kernel add x 30"][..],
            1,
            4000u64,
            "short_kernels",
        ),
        (
            2_000_000,
            &["kernel add x 1"][..],
            5,
            900,
            "gpu_waits_for_host",
        ),
        (
            1_000_000,
            &["kernel gemm x 1", nccl][..],
            2,
            1800,
            "collectives_not_overlapped",
        ),
    ] {
        let kernel_env = kernel_ns.to_string();
        let pause = format!("sleep {sleep_ms}");
        let mut plan: Vec<&str> = vec!["cuinit", "wait_stdin", "wait_cupti_enabled"];
        for _ in 0..rounds {
            plan.extend(step);
            plan.push(&pause);
        }
        plan.push("wait_stdin");
        let mut job = driver_with(
            Some(&lib),
            &plan,
            false,
            &[("ETHAND_STANDIN_CUPTI_KERNEL_NS", &kernel_env)],
        );
        job.wait_for("waiting");
        thread::sleep(SETTLE);
        let t = snapshot_during(&d, &mut job, "cupti enabled");
        job.resume();
        let truth = job.finish();
        let launched: u64 = truth.kernels.values().sum();
        assert_eq!(
            launched,
            step.len() as u64 * rounds * if rule == "short_kernels" { 30 } else { 1 },
            "{rule}"
        );
        let ids: Vec<&str> = t.findings.iter().map(|f| f.id.as_str()).collect();
        eprintln!("observed {rule}: findings {ids:?}");
        let top = t
            .findings
            .iter()
            .find(|f| f.severity != ethand_snapshot::diagnosis::Severity::Info)
            .map(|f| f.id.as_str());
        assert_eq!(top, Some(rule), "{:?}", t.findings);
        let a = t.gpu_activity.as_ref().expect("gpu_activity");
        let p = &a.processes[0];
        assert_eq!(p.state, ActivityState::Recorded, "{p:?}");
        let window_ns = p.window_ns.expect("window") as f64;
        let dev = &p.devices[0];
        if rule == "collectives_not_overlapped" {
            // The collectives' time, all of it alone on the GPU: 1 ms per recorded one (less
            // what of the first and last lies outside the window).
            let comm = dev.communication.as_ref().expect("collectives");
            assert_eq!(comm.overlapped_ns, 0, "{comm:?}");
            let nccl_kernels = p
                .kernels
                .iter()
                .filter(|k| k.class == KernelClass::Communication)
                .map(|k| k.count)
                .sum::<u64>();
            let whole = nccl_kernels * kernel_ns;
            assert!(
                comm.communication_ns <= whole && whole - comm.communication_ns <= 2 * kernel_ns,
                "{comm:?} against {nccl_kernels} collectives of {kernel_ns} ns"
            );
            let exposed = evidence(&t, rule, "gpu.communication_exposed_ratio");
            assert!(
                (exposed - comm.communication_ns as f64 / window_ns).abs() < 1e-9,
                "{exposed}"
            );
            assert_eq!(evidence(&t, rule, "gpu.communication_overlap_ratio"), 0.0);
            assert!(exposed > 0.15, "{exposed}");
            continue;
        }
        let cupti = truth.cupti.clone().expect("the stand-in CUPTI was loaded");
        let host_wait = cupti["gap_host_ns"].as_u64().expect("gap_host_ns") as f64;
        let shown = evidence(&t, rule, "gpu.host_wait_idle_ratio");
        assert!(
            (shown - host_wait / window_ns).abs() < 1e-9,
            "{rule}: host wait {shown} against the stand-in's {host_wait} ns of {window_ns}"
        );
        assert!(shown > 0.3, "{rule}: host wait {shown}");
        if rule == "short_kernels" {
            // Every kernel took exactly 10 us on the emulated GPU.
            let mean = evidence(&t, rule, "gpu.kernel_mean_seconds");
            assert!((mean - 1e-5).abs() < 1e-15, "mean kernel {mean} s");
            let rate = evidence(&t, rule, "gpu.kernels_per_second");
            assert!(
                (rate - dev.kernels as f64 * 1e9 / window_ns).abs() < 1e-6,
                "{rate}/s against {} kernels in {window_ns} ns",
                dev.kernels
            );
            assert!(rate > 5000.0, "{rate}");
        }
    }
}

/// A standalone snapshot beside the running daemon leaves the daemon's control file alone
/// (it once replaced it: every job started afterwards followed a file nobody wrote, and the
/// daemon's windows never reached them) and says who records GPU activity here.
#[test]
fn a_standalone_snapshot_leaves_the_daemons_switch_alone() {
    use std::os::unix::fs::MetadataExt;
    let _serial = serial();
    let d = Daemon::start("gpu-activity-owner", &config());
    let lib = library("gpu-activity-owner");
    let ctl = lib.with_file_name("ethand-cupti.ctl");
    let ino = std::fs::metadata(&ctl).expect("control file").ino();
    let mut early = driver(
        Some(&lib),
        &["cuinit", "wait_stdin", "kernel add x 5", "wait_stdin"],
        false,
    );
    early.wait_for("waiting");
    thread::sleep(SETTLE);
    let p = early.pid.to_string();
    // The daemon's own config: the same gpu.cupti_dir.
    let out = ethand_tests::ethand(&[
        "--config",
        d.config.to_str().expect("utf-8"),
        "snapshot",
        "--standalone",
        "--pid",
        &p,
        "--duration",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "standalone: {}", text(&out.stderr));
    let t: ethand_tests::TreeSnapshot = serde_json::from_slice(&out.stdout).expect("JSON");
    let notes = t.gpu_activity.map(|a| a.notes).unwrap_or_default();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("held by another ethand") && n.contains("without --standalone")),
        "{notes:?}"
    );
    assert_eq!(
        std::fs::metadata(&ctl).expect("control file").ino(),
        ino,
        "the standalone snapshot replaced the daemon's control file"
    );
    // A job started after it is still recorded by the daemon.
    let mut late = driver(
        Some(&lib),
        &[
            "cuinit",
            "wait_stdin",
            "wait_cupti_enabled",
            "kernel add x 7",
            "wait_stdin",
        ],
        false,
    );
    late.wait_for("waiting");
    thread::sleep(SETTLE);
    let a = activity_during(&d, &mut late, "cupti enabled");
    late.resume();
    let _ = late.finish();
    let p = &a.processes[0];
    assert_eq!(p.state, ActivityState::Recorded, "{p:?}");
    assert_eq!(p.devices.iter().map(|d| d.kernels).sum::<u64>(), 7, "{p:?}");
    early.resume();
    early.resume();
    let _ = early.finish();
}

/// A job that replays CUDA graphs: on an H100 (driver 580, CUPTI 13.0) a PyTorch graph loop
/// died as its window closed, and CUPTI's detach with graphs is a known crash. The library
/// watches graph launches during a window and then never detaches CUPTI from that process:
/// after the window no cuptiFinalize (the stand-in counts it), every activity kind off, and
/// a second window records again on the CUPTI that stayed.
#[test]
fn a_job_that_launches_cuda_graphs_keeps_cupti_attached() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-graphs", &config());
    let lib = library("gpu-activity-graphs");
    let mut plan: Vec<&str> = vec!["cuinit", "wait_stdin", "wait_cupti_enabled"];
    for _ in 0..400 {
        plan.extend(["kernel add x 10", "graph 1", "sleep 1"]);
    }
    // After the first window: CUDA calls at whose exit a detach would happen.
    plan.extend([
        "wait_stdin",
        "kernel add x 3",
        "graph 1",
        "sync ctx",
        "wait_stdin",
    ]);
    plan.push("wait_cupti_enabled");
    plan.extend(["kernel add x 7", "wait_stdin"]);
    let mut job = driver(Some(&lib), &plan, false);
    job.wait_for("waiting");
    thread::sleep(SETTLE);
    let first = activity_during(&d, &mut job, "cupti enabled");
    assert_eq!(
        first.processes[0].state,
        ActivityState::Recorded,
        "{first:?}"
    );
    job.resume();
    job.wait_for("waiting");
    // Let the library's control thread turn the callbacks off (it wakes every second).
    thread::sleep(std::time::Duration::from_millis(1500));
    let second = activity_during(&d, &mut job, "cupti enabled");
    job.resume();
    let truth = job.finish();
    let p = &second.processes[0];
    assert_eq!(p.state, ActivityState::Recorded, "{p:?}");
    assert_eq!(p.devices.iter().map(|d| d.kernels).sum::<u64>(), 7, "{p:?}");
    let cupti = truth.cupti.clone().expect("the stand-in CUPTI was loaded");
    assert_eq!(
        cupti["finalize"], 0,
        "CUPTI detached from a graph job: {cupti}"
    );
    assert_eq!(cupti["subscribe"], 1, "{cupti}");
    assert!(
        cupti["graph_callbacks"].as_u64().unwrap_or(0) >= 1,
        "{cupti}"
    );
    // No callback on every CUDA call after the windows: none at API exit.
    assert_eq!(cupti["api_exit_callbacks"], 0, "{cupti}");
}

/// A child forked from an injected job after cuInit (a DataLoader worker) maps the library
/// but has no thread of it: the snapshot calls it `forked` at once instead of waiting out the
/// window's grace for an answer that cannot come (on the H100 that made each snapshot of a
/// job with four workers take 7 s), and the parent is recorded as usual.
#[test]
fn a_forked_child_is_named_not_waited_for() {
    let _serial = serial();
    let d = Daemon::start("gpu-activity-forked", &config());
    let lib = library("gpu-activity-forked");
    let mut job = driver(
        Some(&lib),
        &[
            "cuinit",
            "fork_idle",
            "wait_stdin",
            "wait_cupti_enabled",
            "kernel add x 5",
            "wait_stdin",
        ],
        false,
    );
    let child: u32 = job.wait_for_prefix("forked ").parse().expect("child pid");
    job.wait_for("waiting");
    thread::sleep(SETTLE);
    let pid = job.pid;
    let a = activity_during(&d, &mut job, "cupti enabled");
    job.resume();
    let _ = job.finish();
    let state = |p: u32| {
        a.processes
            .iter()
            .find(|x| x.pid == p)
            .unwrap_or_else(|| panic!("pid {p} not in {a:?}"))
            .state
    };
    assert_eq!(state(pid), ActivityState::Recorded, "{a:?}");
    assert_eq!(state(child), ActivityState::Forked, "{a:?}");
    // Answered when the parent's window closed, not after the grace for the child.
    assert!(
        a.duration_ms < WINDOW_MS + 2000,
        "the window was held {} ms",
        a.duration_ms
    );
}
