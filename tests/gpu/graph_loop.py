#!/usr/bin/env python3
"""A CUDA graph replayed in a loop (tiny_kernels_fixed's step: 100 x (mul, add, relu) on a
small tensor, captured once), for scripts/gpu-graph-windows.sh: prints `ready PID`, runs for
argv[1] seconds, prints `done STEPS` and exits 0; a CUDA error ends it with the error."""
import os
import sys
import time

import torch

x = torch.randn(1024, device="cuda")


def body():
    y = x
    for _ in range(100):
        y = y.mul(0.999)
        y.add_(0.001)
        y.relu_()
    x.copy_(y)


s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        body()
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    body()
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
t0 = time.time()
n = 0
while time.time() - t0 < float(sys.argv[1]):
    graph.replay()
    n += 1
    if n % 200 == 0:
        x.sum().item()
torch.cuda.synchronize()
print("done", n, flush=True)
