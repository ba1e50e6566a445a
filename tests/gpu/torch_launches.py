#!/usr/bin/env python3
"""PyTorch ground-truth workload for scripts/gpu-check.sh (needs a CUDA GPU and torch).

Modes:
  (default)        N `x.add_(1.0)` kernel launches, then one torch.cuda.synchronize().
  --copies         N host-to-device copies of a pinned tensor of B bytes
                   (`dst.copy_(src_pinned, non_blocking=True)`) and N device-to-host copies
                   (`src_pinned.copy_(dst, non_blocking=True)`), then one synchronize: shows
                   which libcuda copy symbol PyTorch really calls.
  --bench SECONDS  launch-bound loop (20 small adds + one synchronize per step); prints
                   steps/s as JSON. No stdin handshake.

Handshake (default and --copies): warm up, print `ready <pid>`, wait for a stdin line, do
exactly the work, print one JSON line of ground truth (`expect`: what ethand should count;
`soft`: what depends on how PyTorch/cudart reach the driver, reported but not a failure of
ethand), wait for a second stdin line, exit.
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


def emit(obj):
    print(json.dumps(obj, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", "-n", type=int, default=2000, help="launches, or copies per direction with --copies")
    ap.add_argument("--copies", action="store_true", help="copy mode")
    ap.add_argument("--bytes", "-b", type=int, default=1 << 20, help="bytes per copy (--copies)")
    ap.add_argument("--bench", type=float, default=None, metavar="SECONDS", help="launch-bound benchmark")
    ap.add_argument("--bench-warmup", type=float, default=2.0, help="seconds before measuring (--bench)")
    ap.add_argument("--ops-per-step", type=int, default=20, help="small adds per step (--bench)")
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("torch: CUDA not available", file=sys.stderr, flush=True)
        return 3
    torch.cuda.set_device(a.device)
    dev = torch.device("cuda", a.device)
    pid = os.getpid()

    if a.bench is not None:
        return bench(torch, dev, a)

    # Warm-up: context, caching allocator, the add kernel, the copy path.
    x = torch.zeros(1024, device=dev)
    x.add_(1.0)
    torch.cuda.synchronize()
    if a.copies:
        src = torch.empty(a.bytes, dtype=torch.uint8, pin_memory=True)
        src.fill_(7)
        dst = torch.empty(a.bytes, dtype=torch.uint8, device=dev)
        dst.copy_(src, non_blocking=True)
        src.copy_(dst, non_blocking=True)
        torch.cuda.synchronize()
    mem0 = torch.cuda.memory_reserved(dev)

    print(f"ready {pid}", flush=True)
    wait_line()

    n = a.n
    t0 = time.perf_counter()
    if a.copies:
        for _ in range(n):
            dst.copy_(src, non_blocking=True)
        for _ in range(n):
            src.copy_(dst, non_blocking=True)
    else:
        for _ in range(n):
            x.add_(1.0)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    mem1 = torch.cuda.memory_reserved(dev)

    if a.copies:
        b = a.bytes
        expect = {
            "copies.total.calls": 2 * n,
            "copies.total.bytes": 2 * n * b,
            "sync.calls": 1,
            "graph_launches": 0,
            "errors": 0,
        }
        soft = {
            "copies.host_to_device.calls": n,
            "copies.host_to_device.bytes": n * b,
            "copies.device_to_host.calls": n,
            "copies.device_to_host.bytes": n * b,
            "launches": 0,
            "memory.device.allocs": 0,
        }
        workload = "torch-copies"
        params = {"copies_per_direction": n, "bytes": b, "pinned": True, "non_blocking": True}
    else:
        expect = {"launches": n, "graph_launches": 0, "sync.calls": 1, "errors": 0}
        soft = {"copies.total.calls": 0, "memory.device.allocs": 0}
        workload = "torch-launches"
        params = {"launches": n, "op": "x.add_(1.0)", "numel": 1024}
    emit({
        "workload": workload,
        "pid": pid,
        "exact_symbols": False,
        "params": params,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev),
        "elapsed_ms": round(elapsed * 1e3, 3),
        "memory_reserved_change": mem1 - mem0,
        "expect": expect,
        "soft": soft,
    })
    wait_line()
    return 0


def bench(torch, dev, a):
    x = torch.zeros(256, device=dev)
    k = a.ops_per_step

    def step():
        for _ in range(k):
            x.add_(1.0)
        torch.cuda.synchronize()

    t = time.perf_counter()
    while time.perf_counter() - t < a.bench_warmup:
        step()
    slices = []
    steps = 0
    t0 = ts = time.perf_counter()
    ss = 0
    while True:
        now = time.perf_counter()
        if now - t0 >= a.bench:
            break
        step()
        steps += 1
        ss += 1
        now = time.perf_counter()
        if now - ts >= 0.5:
            slices.append(ss / (now - ts))
            ts, ss = now, 0
    el = time.perf_counter() - t0
    slices.sort()
    emit({
        "workload": "torch-bench",
        "pid": os.getpid(),
        "seconds": round(el, 3),
        "steps": steps,
        "steps_per_s": round(steps / max(el, 1e-9), 2),
        "median_steps_per_s": round(slices[len(slices) // 2], 2) if slices else 0.0,
        "launches_per_step": k,
        "syncs_per_step": 1,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
