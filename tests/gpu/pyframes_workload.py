"""The GPU machine's counterpart of tests/tests/e2e/pyframes.rs (issue 41), on real CUDA with
PyTorch: 3,000 torch.cuda.synchronize() from f(), 1,000 from g(), then a storm of 2,000
`.item()` syncs from storm(); each line is marked so that the checker finds it. It warms up
(a sync every 100 ms) until a line comes on stdin, prints "done" after the calls, and exits
at the next line."""
import select
import sys

import torch

x = torch.ones(1, device="cuda")


def f():
    torch.cuda.synchronize()  # F_LINE


def g():
    torch.cuda.synchronize()  # G_LINE


def storm():
    return (x * 2).item()  # ITEM_LINE


def warm():
    torch.cuda.synchronize()  # WARM_LINE


print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.1)[0]:
    warm()
sys.stdin.readline()
for _ in range(3000):
    f()
for _ in range(1000):
    g()
for _ in range(2000):
    storm()
print("done", flush=True)
sys.stdin.readline()
