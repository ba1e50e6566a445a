#!/usr/bin/env python3
"""CuPy ground-truth workload for scripts/gpu-check.sh (needs a CUDA GPU and cupy).

Warm up, print `ready <pid>`, wait for a stdin line, then exactly:
  N elementwise kernel launches (`x += 1` on a float32 array: one kernel each; CuPy launches
    through the driver, cuLaunchKernel),
  A cupy.cuda.runtime.malloc of S bytes, then A cupy.cuda.runtime.free,
  C host-to-device copies of B bytes (cupy.cuda.runtime.memcpy, pinned host memory),
  C device-to-host copies of B bytes,
  K cupy.cuda.Device().synchronize() (cudaDeviceSynchronize),
print one JSON line of ground truth, wait for a second stdin line, exit.

`expect`: what ethand should count; `soft`: what depends on how CuPy/cudart reach the driver
(which symbol, which direction label), reported but not a failure of ethand.
"""
import argparse
import json
import os
import sys
import time


def wait_line():
    try:
        sys.stdin.readline()
    except Exception:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", "-n", type=int, default=2000, help="elementwise kernel launches")
    ap.add_argument("--allocs", type=int, default=10, help="cudaMalloc/cudaFree pairs")
    ap.add_argument("--alloc-bytes", type=int, default=1 << 20)
    ap.add_argument("--copies", type=int, default=200, help="copies per direction")
    ap.add_argument("--bytes", "-b", type=int, default=1 << 20, help="bytes per copy")
    ap.add_argument("--syncs", type=int, default=50, help="device synchronizations")
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()

    import cupy
    from cupy.cuda import runtime

    try:
        ndev = runtime.getDeviceCount()
    except Exception as e:  # no driver / no device
        print(f"cupy: no CUDA device: {e}", file=sys.stderr, flush=True)
        return 3
    if ndev < 1:
        print("cupy: no CUDA device", file=sys.stderr, flush=True)
        return 3
    dev = cupy.cuda.Device(a.device)
    dev.use()
    pid = os.getpid()

    # Warm-up: context, memory pool, kernel compilation and module load, the copy path.
    x = cupy.zeros(1024, dtype=cupy.float32)
    x += 1
    b = a.bytes
    host = cupy.cuda.alloc_pinned_memory(b)  # cudaHostAlloc: before the window
    dbuf = cupy.empty(b, dtype=cupy.uint8)
    H2D = runtime.memcpyHostToDevice
    D2H = runtime.memcpyDeviceToHost
    runtime.memcpy(dbuf.data.ptr, host.ptr, b, H2D)
    runtime.memcpy(host.ptr, dbuf.data.ptr, b, D2H)
    p = runtime.malloc(a.alloc_bytes)
    runtime.free(p)
    dev.synchronize()
    ptrs = [0] * a.allocs

    print(f"ready {pid}", flush=True)
    wait_line()

    n, al, s, c, k = a.n, a.allocs, a.alloc_bytes, a.copies, a.syncs
    t0 = time.perf_counter()
    for _ in range(n):
        x += 1
    for i in range(al):
        ptrs[i] = runtime.malloc(s)
    for i in range(al):
        runtime.free(ptrs[i])
    for _ in range(c):
        runtime.memcpy(dbuf.data.ptr, host.ptr, b, H2D)
    for _ in range(c):
        runtime.memcpy(host.ptr, dbuf.data.ptr, b, D2H)
    for _ in range(k):
        dev.synchronize()
    elapsed = time.perf_counter() - t0

    expect = {
        "launches": n,
        "graph_launches": 0,
        "copies.total.calls": 2 * c,
        "copies.total.bytes": 2 * c * b,
        "sync.calls": k,
        "memory.device.allocs": al,
        "memory.device.alloc_bytes": al * s,
        "memory.device.frees": al,
        "memory.device.freed_bytes": al * s,
        "memory.device.live_bytes": 0,
        "memory.device.peak_bytes": al * s,
        "errors": 0,
    }
    soft = {
        "copies.host_to_device.calls": c,
        "copies.host_to_device.bytes": c * b,
        "copies.device_to_host.calls": c,
        "copies.device_to_host.bytes": c * b,
        "symbols.libcuda:cuLaunchKernel.calls": n,
    }
    print(json.dumps({
        "workload": "cupy",
        "pid": pid,
        "exact_symbols": False,
        "params": {"launches": n, "allocs": al, "alloc_bytes": s, "copies_per_direction": c,
                   "bytes": b, "syncs": k, "host_memory": "pinned"},
        "cupy": cupy.__version__,
        "cuda_runtime": runtime.runtimeGetVersion(),
        "driver": runtime.driverGetVersion(),
        "elapsed_ms": round(elapsed * 1e3, 3),
        "expect": expect,
        "soft": soft,
    }, separators=(",", ":")), flush=True)
    wait_line()
    return 0


if __name__ == "__main__":
    sys.exit(main())
