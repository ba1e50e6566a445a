"""A training-like loop for issue 42's check of libethand_cupti.so (scripts/gpu-issue42.sh).

Each step: an fp32 matmul, a bf16 matmul, an elementwise add, a copy of a pageable host
tensor to the GPU and one of a pinned host tensor, then a sync. Prints `ready`, then on each
stdin line `run SECONDS` runs steps for that long and prints `steps N seconds S` (the step
rate of the phase), `exit` ends. With --profile, torch.profiler holds CUPTI during every run
(the library must step aside). Ground truth per run: the kernels and copies of N steps.
"""
import argparse
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=2048)
ap.add_argument("--copy-mib", type=int, default=16)
ap.add_argument("--profile", action="store_true")
ap.add_argument("--sleep-ms", type=float, default=0.0, help="host idle after each step")
ap.add_argument("--kernels-only", action="store_true", help="no copies, no sync per step")
args = ap.parse_args()

dev = torch.device("cuda")
a32 = torch.randn(args.n, args.n, device=dev)
b32 = torch.randn(args.n, args.n, device=dev)
a16 = a32.to(torch.bfloat16)
b16 = b32.to(torch.bfloat16)
elems = args.copy_mib * (1 << 20) // 4
pageable = torch.randn(elems)
pinned = torch.randn(elems).pin_memory()


def step():
    if args.kernels_only:
        c = a32 @ b32
        return c + (a16 @ b16).float(), None, None
    c = a32 @ b32
    d = a16 @ b16
    e = c + d.float()
    x = pageable.to(dev, non_blocking=True)
    y = pinned.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    return e, x, y


step()
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "exit":
        break
    seconds = float(words[1])
    prof = None
    if args.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
        print("profiling", flush=True)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
        if args.sleep_ms:
            torch.cuda.synchronize()
            time.sleep(args.sleep_ms / 1000)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
    print(f"steps {n} seconds {took:.3f} copy_bytes {elems * 4}", flush=True)
