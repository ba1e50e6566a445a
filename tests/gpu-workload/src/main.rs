//! Ground-truth CUDA driver workload for `scripts/gpu-check.sh`.
//!
//! Calls the CUDA driver API directly (`cudarc::driver::sys`: every call below is one
//! exported libcuda symbol, resolved with dlsym), so the number of calls of each symbol that
//! ethand probes is known exactly:
//!
//! 1. Set-up (not measured): cuInit, primary context, module from the PTX below, a stream,
//!    the copy buffers, and one warm-up call of every measured function (so that lazy
//!    loading in the driver and in cudarc happens here, not in the measured window).
//! 2. Prints `ready <pid>` and waits for a line on stdin (ethand takes its BEFORE snapshot).
//! 3. Measured window, exactly: N cuLaunchKernel; A cuMemAlloc_v2 of S bytes, then A
//!    cuMemFree_v2; C cuMemcpyHtoD_v2 of B bytes; C cuMemcpyDtoH_v2 of B bytes; C
//!    cuMemcpyHtoDAsync_v2 of B bytes on the stream; K cuStreamSynchronize; K cuCtxSynchronize.
//! 4. Prints one JSON line: the ground truth (`expect`: the deltas ethand should show).
//! 5. Waits for a second line (ethand takes its AFTER snapshot), then checks on the device
//!    that the kernel ran N times (prints `verify ...`), frees everything and exits.
//!
//! `--bench SECONDS`: launch-bound loop (20 launches + 1 cuStreamSynchronize per step) that
//! prints steps/s as JSON; no stdin handshake.
use std::ffi::{CStr, c_void};
use std::io::{BufRead, Write};
use std::process::exit;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use cudarc::driver::sys::*;

macro_rules! ptx {
    ($version:literal, $target:literal) => {
        concat!(
            "//\n// ethand-gpu-workload: hand-written PTX\n//\n",
            $version,
            "\n",
            $target,
            "\n",
            ".address_size 64\n",
            "\n",
            ".visible .entry ethand_count(\n",
            "\t.param .u64 ethand_count_param_0\n",
            ")\n",
            "{\n",
            "\t.reg .b32 \t%r<2>;\n",
            "\t.reg .b64 \t%rd<3>;\n",
            "\n",
            "\tld.param.u64 \t%rd1, [ethand_count_param_0];\n",
            "\tcvta.to.global.u64 \t%rd2, %rd1;\n",
            "\tatom.global.add.u32 \t%r1, [%rd2], 1;\n",
            "\tret;\n",
            "}\n",
            "\0"
        )
    };
}

/// A kernel that adds 1 to the u32 at its argument, atomically. Several PTX versions, newest
/// first: the first one the driver JIT-compiles is used.
const PTX_VARIANTS: &[&str] = &[
    ptx!(".version 7.0", ".target sm_80"),
    ptx!(".version 6.3", ".target sm_70"),
    ptx!(".version 6.0", ".target sm_52"),
];


const KERNEL_NAME: &CStr = c"ethand_count";
const BENCH_LAUNCHES_PER_STEP: u64 = 20;

struct Args {
    launches: u64,
    allocs: u64,
    alloc_bytes: u64,
    copies: u64,
    copy_bytes: u64,
    syncs: u64,
    pageable: bool,
    device: i32,
    bench: Option<f64>,
    bench_warmup: f64,
}

const USAGE: &str = "usage: ethand-gpu-workload [--launches|-N N] [--allocs|-A A] [--alloc-bytes|-S S]
       [--copies|-C C] [--copy-bytes|-B B] [--syncs|-K K] [--pageable] [--device D]
       [--bench SECONDS [--bench-warmup SECONDS]]
defaults: N=1000 A=10 S=1048576 C=20 B=4194304 K=50, pinned host memory, device 0.
Prints `ready <pid>`, waits for a stdin line, makes exactly the calls, prints the ground truth
as one JSON line, waits for a second stdin line, verifies on the device and exits.";

fn parse_args() -> Args {
    let mut a = Args {
        launches: 1000,
        allocs: 10,
        alloc_bytes: 1 << 20,
        copies: 20,
        copy_bytes: 4 << 20,
        syncs: 50,
        pageable: false,
        device: 0,
        bench: None,
        bench_warmup: 2.0,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let (flag, inline) = match argv[i].split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (argv[i].clone(), None),
        };
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            exit(0);
        }
        if flag == "--pageable" {
            a.pageable = true;
            i += 1;
            continue;
        }
        const VALUED: &[&str] = &[
            "--launches", "-N", "-n", "--allocs", "-A", "-a", "--alloc-bytes", "-S", "-s", "--copies", "-C", "-c",
            "--copy-bytes", "-B", "-b", "--syncs", "-K", "-k", "--device", "-d", "--bench", "--bench-warmup",
        ];
        if !VALUED.contains(&flag.as_str()) {
            die(&format!("unknown flag {flag}\n{USAGE}"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                match argv.get(i) {
                    Some(v) => v.clone(),
                    None => die(&format!("{flag} needs a value\n{USAGE}")),
                }
            }
        };
        let num = || -> u64 {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| die(&format!("{flag}: {value:?} is not a number")))
        };
        let secs = || -> f64 {
            value
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or_else(|| die(&format!("{flag}: {value:?} is not a duration in seconds")))
        };
        match flag.as_str() {
            "--launches" | "-N" | "-n" => a.launches = num(),
            "--allocs" | "-A" | "-a" => a.allocs = num(),
            "--alloc-bytes" | "-S" | "-s" => a.alloc_bytes = num(),
            "--copies" | "-C" | "-c" => a.copies = num(),
            "--copy-bytes" | "-B" | "-b" => a.copy_bytes = num(),
            "--syncs" | "-K" | "-k" => a.syncs = num(),
            "--device" | "-d" => a.device = num() as i32,
            "--bench" => a.bench = Some(secs()),
            "--bench-warmup" => a.bench_warmup = secs(),
            _ => die(&format!("unknown flag {flag}\n{USAGE}")),
        }
        i += 1;
    }
    if a.allocs > 0 && a.alloc_bytes == 0 {
        die("--alloc-bytes must be > 0 when --allocs > 0 (cuMemAlloc of 0 bytes fails)");
    }
    if a.copies > 0 && a.copy_bytes == 0 {
        die("--copy-bytes must be > 0 when --copies > 0");
    }
    a
}

fn die(msg: &str) -> ! {
    eprintln!("ethand-gpu-workload: {msg}");
    exit(2)
}

/// Exits with the driver's error name when a call failed.
fn ck(r: CUresult, what: &str) {
    if r != CUresult::CUDA_SUCCESS {
        let mut name: *const std::ffi::c_char = null();
        let mut text: *const std::ffi::c_char = null();
        // SAFETY: both write a pointer to a static string, or leave it null.
        unsafe {
            cuGetErrorName(r, &mut name);
            cuGetErrorString(r, &mut text);
        }
        let s = |p: *const std::ffi::c_char| {
            if p.is_null() {
                "?".to_string()
            } else {
                // SAFETY: the driver returns NUL-terminated static strings.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        die(&format!("{what} failed: {r:?} {} ({})", s(name), s(text)));
    }
}

struct Gpu {
    stream: CUstream,
    func: CUfunction,
    module: CUmodule,
    counter: CUdeviceptr,
    dev: CUdevice,
    device_name: String,
    driver_version: i32,
    ptx_target: &'static str,
}

fn setup(device: i32) -> Gpu {
    // SAFETY: plain driver calls with valid out-pointers; every result is checked.
    unsafe {
        if !is_culib_present() {
            eprintln!("ethand-gpu-workload: libcuda (libcuda.so / libcuda.so.1) cannot be loaded: no NVIDIA driver here");
            exit(3);
        }
        ck(cuInit(0), "cuInit");
        let mut driver_version = 0;
        ck(cuDriverGetVersion(&mut driver_version), "cuDriverGetVersion");
        let mut dev: CUdevice = 0;
        ck(cuDeviceGet(&mut dev, device), "cuDeviceGet");
        let mut name = [0 as std::ffi::c_char; 256];
        ck(cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev), "cuDeviceGetName");
        let device_name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let mut ctx: CUcontext = null_mut();
        ck(cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain");
        ck(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

        let mut module: CUmodule = null_mut();
        let mut ptx_target = "";
        let mut last = CUresult::CUDA_SUCCESS;
        for ptx in PTX_VARIANTS {
            last = cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void);
            if last == CUresult::CUDA_SUCCESS {
                ptx_target = ptx
                    .lines()
                    .find(|l| l.starts_with(".target"))
                    .unwrap_or("")
                    .trim_start_matches(".target ");
                break;
            }
            eprintln!("ethand-gpu-workload: cuModuleLoadData: {last:?} for {}", ptx.lines().nth(3).unwrap_or(""));
        }
        ck(last, "cuModuleLoadData (every PTX variant)");
        let mut func: CUfunction = null_mut();
        ck(cuModuleGetFunction(&mut func, module, KERNEL_NAME.as_ptr()), "cuModuleGetFunction");
        let mut stream: CUstream = null_mut();
        ck(cuStreamCreate(&mut stream, CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate");
        let mut counter: CUdeviceptr = 0;
        ck(cuMemAlloc_v2(&mut counter, 4), "cuMemAlloc_v2 (counter)");
        ck(cuMemsetD32_v2(counter, 0, 1), "cuMemsetD32_v2");
        Gpu {
            stream,
            func,
            module,
            counter,
            dev,
            device_name,
            driver_version,
            ptx_target,
        }
    }
}

impl Gpu {
    fn launch(&self) {
        let mut arg: CUdeviceptr = self.counter;
        let mut params = [&mut arg as *mut CUdeviceptr as *mut c_void];
        // SAFETY: the kernel takes one pointer argument; `params` outlives the call (the
        // driver copies the arguments before returning).
        ck(
            unsafe { cuLaunchKernel(self.func, 1, 1, 1, 1, 1, 1, 0, self.stream, params.as_mut_ptr(), null_mut()) },
            "cuLaunchKernel",
        );
    }

    fn read_counter(&self) -> u32 {
        let mut v: u32 = 0;
        // SAFETY: 4 bytes into a u32.
        unsafe {
            ck(cuCtxSynchronize(), "cuCtxSynchronize");
            ck(cuMemcpyDtoH_v2(&mut v as *mut u32 as *mut c_void, self.counter, 4), "cuMemcpyDtoH_v2 (counter)");
        }
        v
    }

    fn reset_counter(&self) {
        // SAFETY: the counter is a live 4-byte allocation.
        unsafe {
            ck(cuCtxSynchronize(), "cuCtxSynchronize");
            ck(cuMemsetD32_v2(self.counter, 0, 1), "cuMemsetD32_v2");
            ck(cuCtxSynchronize(), "cuCtxSynchronize");
        }
    }

    fn teardown(self) {
        // SAFETY: the handles were created in setup() and are not used afterwards.
        unsafe {
            let _ = cuCtxSynchronize();
            let _ = cuMemFree_v2(self.counter);
            let _ = cuStreamDestroy_v2(self.stream);
            let _ = cuModuleUnload(self.module);
            let _ = cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// Host memory for the copies: pinned (cuMemAllocHost_v2) or pageable.
struct HostBuf {
    ptr: *mut u8,
    pinned: bool,
    _pageable: Vec<u8>,
}

impl HostBuf {
    fn new(bytes: usize, pageable: bool) -> Self {
        if bytes == 0 {
            return HostBuf {
                ptr: null_mut(),
                pinned: false,
                _pageable: Vec::new(),
            };
        }
        if pageable {
            let mut v = vec![0x5au8; bytes];
            return HostBuf {
                ptr: v.as_mut_ptr(),
                pinned: false,
                _pageable: v,
            };
        }
        let mut p: *mut c_void = null_mut();
        // SAFETY: valid out-pointer; the memory is freed in drop.
        unsafe {
            ck(cuMemAllocHost_v2(&mut p, bytes), "cuMemAllocHost_v2");
            std::ptr::write_bytes(p as *mut u8, 0x5a, bytes);
        }
        HostBuf {
            ptr: p as *mut u8,
            pinned: true,
            _pageable: Vec::new(),
        }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: allocated with cuMemAllocHost_v2 in new().
            unsafe {
                let _ = cuMemFreeHost(self.ptr as *mut c_void);
            }
        }
    }
}

fn read_line() -> bool {
    let mut s = String::new();
    matches!(std::io::stdin().lock().read_line(&mut s), Ok(n) if n > 0)
}

fn main() {
    let args = parse_args();
    let gpu = setup(args.device);
    if let Some(seconds) = args.bench {
        bench(&gpu, seconds, args.bench_warmup);
        gpu.teardown();
        return;
    }
    let (n, a, s, c, b, k) = (args.launches, args.allocs, args.alloc_bytes, args.copies, args.copy_bytes, args.syncs);
    let host = HostBuf::new(if c > 0 { b as usize } else { 0 }, args.pageable);
    let mut dbuf: CUdeviceptr = 0;
    let mut ptrs: Vec<CUdeviceptr> = vec![0; a as usize];

    // Warm-up: one call of every measured function, outside the measured window.
    // SAFETY: buffers are live and at least `b` bytes; results are checked.
    unsafe {
        if c > 0 {
            ck(cuMemAlloc_v2(&mut dbuf, b as usize), "cuMemAlloc_v2 (copy buffer)");
        }
        gpu.launch();
        if a > 0 {
            let mut p: CUdeviceptr = 0;
            ck(cuMemAlloc_v2(&mut p, s as usize), "cuMemAlloc_v2 (warm-up)");
            ck(cuMemFree_v2(p), "cuMemFree_v2 (warm-up)");
        }
        if c > 0 {
            ck(cuMemcpyHtoD_v2(dbuf, host.ptr as *const c_void, b as usize), "cuMemcpyHtoD_v2 (warm-up)");
            ck(cuMemcpyDtoH_v2(host.ptr as *mut c_void, dbuf, b as usize), "cuMemcpyDtoH_v2 (warm-up)");
            ck(cuMemcpyHtoDAsync_v2(dbuf, host.ptr as *const c_void, b as usize, gpu.stream), "cuMemcpyHtoDAsync_v2 (warm-up)");
        }
        ck(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize (warm-up)");
    }
    gpu.reset_counter();

    let pid = std::process::id();
    eprintln!(
        "ethand-gpu-workload: {} (driver {}), PTX {}, {} host memory; N={n} A={a} S={s} C={c} B={b} K={k}",
        gpu.device_name,
        gpu.driver_version,
        gpu.ptx_target,
        if args.pageable { "pageable" } else { "pinned" }
    );
    println!("ready {pid}");
    let _ = std::io::stdout().flush();
    read_line();

    // ---- Measured window: exactly these probed calls, nothing else. ----
    let t0 = Instant::now();
    for _ in 0..n {
        gpu.launch();
    }
    // SAFETY: as above; `ptrs` was sized before the window (no driver call involved anyway).
    unsafe {
        for p in ptrs.iter_mut() {
            ck(cuMemAlloc_v2(p, s as usize), "cuMemAlloc_v2");
        }
        for p in ptrs.iter() {
            ck(cuMemFree_v2(*p), "cuMemFree_v2");
        }
        for _ in 0..c {
            ck(cuMemcpyHtoD_v2(dbuf, host.ptr as *const c_void, b as usize), "cuMemcpyHtoD_v2");
        }
        for _ in 0..c {
            ck(cuMemcpyDtoH_v2(host.ptr as *mut c_void, dbuf, b as usize), "cuMemcpyDtoH_v2");
        }
        for _ in 0..c {
            ck(cuMemcpyHtoDAsync_v2(dbuf, host.ptr as *const c_void, b as usize, gpu.stream), "cuMemcpyHtoDAsync_v2");
        }
        for _ in 0..k {
            ck(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
        }
        for _ in 0..k {
            ck(cuCtxSynchronize(), "cuCtxSynchronize");
        }
    }
    let elapsed = t0.elapsed();
    // ---- End of the measured window. ----

    let expect: Vec<(String, u64)> = vec![
        ("launches".into(), n),
        ("graph_launches".into(), 0),
        ("copies.host_to_device.calls".into(), 2 * c),
        ("copies.host_to_device.bytes".into(), 2 * c * b),
        ("copies.device_to_host.calls".into(), c),
        ("copies.device_to_host.bytes".into(), c * b),
        ("copies.total.calls".into(), 3 * c),
        ("copies.total.bytes".into(), 3 * c * b),
        ("sync.calls".into(), 2 * k),
        ("sync.timed_calls".into(), 2 * k),
        ("memory.device.allocs".into(), a),
        ("memory.device.alloc_bytes".into(), a * s),
        ("memory.device.frees".into(), a),
        ("memory.device.freed_bytes".into(), a * s),
        ("memory.device.live_bytes".into(), 0),
        ("memory.device.peak_bytes".into(), a * s),
        ("errors".into(), 0),
        ("untracked_frees".into(), 0),
        ("symbols.libcuda:cuLaunchKernel.calls".into(), n),
        ("symbols.libcuda:cuMemAlloc_v2.calls".into(), a),
        ("symbols.libcuda:cuMemAlloc_v2.bytes".into(), a * s),
        ("symbols.libcuda:cuMemFree_v2.calls".into(), a),
        ("symbols.libcuda:cuMemFree_v2.bytes".into(), a * s),
        ("symbols.libcuda:cuMemcpyHtoD_v2.calls".into(), c),
        ("symbols.libcuda:cuMemcpyHtoD_v2.bytes".into(), c * b),
        ("symbols.libcuda:cuMemcpyDtoH_v2.calls".into(), c),
        ("symbols.libcuda:cuMemcpyDtoH_v2.bytes".into(), c * b),
        ("symbols.libcuda:cuMemcpyHtoDAsync_v2.calls".into(), c),
        ("symbols.libcuda:cuMemcpyHtoDAsync_v2.bytes".into(), c * b),
        ("symbols.libcuda:cuStreamSynchronize.calls".into(), k),
        ("symbols.libcuda:cuCtxSynchronize.calls".into(), k),
    ];
    let expect_json = expect
        .iter()
        .map(|(k, v)| format!("{}:{v}", json_str(k)))
        .collect::<Vec<_>>()
        .join(",");
    println!(
        "{{\"workload\":\"rust-driver\",\"pid\":{pid},\"exact_symbols\":true,\
         \"params\":{{\"launches\":{n},\"allocs\":{a},\"alloc_bytes\":{s},\"copies\":{c},\"copy_bytes\":{b},\
         \"syncs\":{k},\"host_memory\":\"{}\"}},\
         \"device\":{},\"driver_version\":{},\"ptx_target\":{},\"elapsed_ms\":{:.3},\"expect\":{{{expect_json}}}}}",
        if args.pageable { "pageable" } else { "pinned" },
        json_str(&gpu.device_name),
        gpu.driver_version,
        json_str(gpu.ptx_target),
        elapsed.as_secs_f64() * 1e3,
    );
    let _ = std::io::stdout().flush();
    read_line();

    // After the AFTER snapshot: check that the kernel really ran N times.
    let counted = gpu.read_counter();
    println!("verify kernel_counter={counted} expected={n} ok={}", u64::from(counted) == n);
    let _ = std::io::stdout().flush();
    // SAFETY: allocated above, no longer used.
    unsafe {
        if dbuf != 0 {
            let _ = cuMemFree_v2(dbuf);
        }
    }
    drop(host);
    gpu.teardown();
}

/// Launch-bound loop: 20 launches and one stream synchronization per step.
fn bench(gpu: &Gpu, seconds: f64, warmup: f64) {
    let step = || {
        for _ in 0..BENCH_LAUNCHES_PER_STEP {
            gpu.launch();
        }
        // SAFETY: the stream is live.
        ck(unsafe { cuStreamSynchronize(gpu.stream) }, "cuStreamSynchronize");
    };
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < warmup {
        step();
    }
    // Steps per half-second slice: the median is robust to a hiccup.
    let slice = Duration::from_millis(500);
    let mut slices: Vec<f64> = Vec::new();
    let mut steps: u64 = 0;
    let t0 = Instant::now();
    let mut ts = t0;
    let mut ss: u64 = 0;
    while t0.elapsed().as_secs_f64() < seconds {
        step();
        steps += 1;
        ss += 1;
        if ts.elapsed() >= slice {
            slices.push(ss as f64 / ts.elapsed().as_secs_f64());
            ts = Instant::now();
            ss = 0;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    slices.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = if slices.is_empty() { 0.0 } else { slices[slices.len() / 2] };
    println!(
        "{{\"workload\":\"rust-driver-bench\",\"pid\":{},\"seconds\":{el:.3},\"steps\":{steps},\
         \"steps_per_s\":{:.2},\"median_steps_per_s\":{median:.2},\"launches_per_step\":{BENCH_LAUNCHES_PER_STEP},\
         \"syncs_per_step\":1}}",
        std::process::id(),
        steps as f64 / el.max(1e-9)
    );
    let _ = std::io::stdout().flush();
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
