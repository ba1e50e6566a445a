"""Workloads with a known bottleneck, for `ethand snapshot` diagnosis on a GPU machine.

python3 diag_workloads.py MODE SECONDS
  dataloader  input pipeline stall: a DataLoader with no workers and a slow CPU transform
  item        a .item() (host-device sync) after every tiny step
  leak        a list of GPU tensors that keeps growing (~100 MiB/s)
  healthy     large matrix products back to back (GPU busy, no per-step sync)
  straggler   (under torchrun, 2 ranks) all_reduce each step; rank 1 sleeps 40 ms first
Prints "ready <pid>" once warmed up, then runs for SECONDS.
"""
import os
import sys
import time

import torch


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    t_end = None

    def ready():
        nonlocal t_end
        print(f"ready {os.getpid()}", flush=True)
        t_end = time.time() + seconds

    if mode == "dataloader":
        import numpy as np
        from torch.utils.data import DataLoader, Dataset

        class Slow(Dataset):
            def __len__(self):
                return 10**9

            def __getitem__(self, i):
                # CPU-heavy "decoding" on the main process (num_workers=0).
                a = np.random.rand(64, 64)
                for _ in range(6):
                    a = np.tanh(a @ a.T / 64.0)
                return torch.from_numpy(a.astype(np.float32))

        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(dev)
        loader = iter(DataLoader(Slow(), batch_size=32, num_workers=0))
        ready()
        while time.time() < t_end:
            x = next(loader).to(dev)
            model(x).sum().backward()
    elif mode == "item":
        x = torch.randn(256, 256, device=dev)
        w = torch.randn(256, 256, device=dev)
        ready()
        total = 0.0
        while time.time() < t_end:
            y = (x @ w).relu().sum()
            total += y.item()
    elif mode == "leak":
        keep = []
        ready()
        while time.time() < t_end:
            keep.append(torch.empty(25 << 20, dtype=torch.uint8, device=dev))
            time.sleep(0.25)
    elif mode == "healthy":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        ready()
        while time.time() < t_end:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    elif mode == "straggler":
        import torch.distributed as dist

        dist.init_process_group("nccl")
        rank = dist.get_rank()
        t = torch.ones(1 << 20, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ready()
        while time.time() < t_end:
            if rank == 1:
                time.sleep(0.04)
            dist.all_reduce(t)
            torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
