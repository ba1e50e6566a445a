#!/usr/bin/env python3
"""The training bench's model driven in phases, for the dormant cost of libethand_cupti.so
(scripts/gpu-busy-vs-nvml.sh): the same TransformerEncoder LM as tests/gpu/train_bench.py
(d_model 512, 6 layers, bf16 autocast, AdamW, a DataLoader with 4 workers), built once. Prints
`ready`, then on each stdin line `run SECONDS` runs training steps for that long (after 10
untimed warm-up steps) and prints `steps N seconds S`; `exit` ends. Two such processes, one
started with CUDA_INJECTION64_PATH and one without, alternate phases: the step rates compare
the dormant library against no library on the same machine and minute.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import train_bench  # noqa: E402

args = argparse.Namespace(
    model="transformer", precision="bf16", batch=32, d_model=512, layers=6, heads=8, seq=128,
    vocab=8192, image=64, width=64, classes=100, workers=4, sample_work=4,
)
trainer = train_bench.TorchTrainer(args, torch.device("cuda"), distributed=False)
for _ in range(20):
    trainer.step()
trainer.sync()
print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "exit":
        break
    seconds = float(words[1])
    for _ in range(10):
        trainer.step()
    trainer.sync()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        trainer.step()
        n += 1
    trainer.sync()
    print(f"steps {n} seconds {time.perf_counter() - t0:.3f}", flush=True)
trainer.close()
