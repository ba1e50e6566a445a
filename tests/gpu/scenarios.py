"""Training-like workloads with one known bottleneck each, for the GPU scenario suite
(scripts/gpu-scenarios.sh, expected findings in tests/gpu/scenarios.json).

python scenarios.py MODE SECONDS

Device: cuda:LOCAL_RANK (env, default 0) when CUDA is available, else the CPU (SMOKE=1 shrinks
models and batches for a quick CPU test; use it only there). Prints "ready <pid>" (this
process's pid) once warmed up (model built, first steps done), then runs SECONDS more and exits 0.
With STEP_LOG=FILE, appends one line "step <unix time>" per step to FILE (buffered, flushed every
second and at exit).

Modes (each has one bottleneck; the rule id the suite expects in brackets):
  healthy_resnet   ResNet-50 (hand-written), bf16 autocast, channels_last, batch 128 at 224x224,
                   SGD; no per-step sync (loss.item() every 50 steps)                     [none]
  healthy_lm       TransformerEncoder LM: d_model 1024, 8 layers, 16 heads, seq 512, batch 32,
                   vocab 32000, bf16 autocast, AdamW; tokens generated on the GPU          [none]
  input_main       DataLoader(num_workers=0), CPU-heavy numpy __getitem__: the main thread decodes
                   while the GPU waits                                      [input_pipeline_stall]
  input_workers    DataLoader(num_workers=4, pin_memory, persistent_workers) whose transform is
                   too heavy for 4 workers: workers busy, main thread waits, GPU idle
                                                                             [input_workers_stall]
  sync_storm       256x256 matmul + relu + sum, .item() every step             [excessive_sync]
  pageable_copies  64 separate 16 KiB pageable host tensors .to(dev) per step, small compute
                                                                           [small_pageable_copies]
  tiny_kernels     ~300 tiny elementwise kernels per step on 1024-element tensors, .item() every
                   200 steps: launch-bound, main thread ~100 % CPU               [launch_bound]
  leak             a 25 MiB GPU tensor appended to a list every 0.25 s, light compute
                                                                               [gpu_memory_growth]
  cpu_contention   small, otherwise healthy loop with moderate numpy preprocessing in the main
                   thread, pinned to CPUs {0,1}; the runner adds busy-loop hogs on those CPUs
                                                                                  [cpu_contention]
  disk_bound       8 random 1 MiB O_DIRECT reads per step from DATA_FILE (page cache bypassed),
                   small GPU compute                                               [disk_io_bound]
  straggler        (torchrun, 2 ranks) all_reduce each step; rank 1 sleeps 40 ms before it
                                                                                  [straggler_rank]
  fp32_matmul      8192x8192 FP32 matrix products at PyTorch's default precision (TF32 off): the
                   CUDA cores busy, the tensor cores idle           [fp32_without_tensor_cores]
  alloc_churn      an MLP training step followed by torch.cuda.empty_cache()  [allocator_churn]
  memory_full      bf16 matrix products on a GPU filled to 97.5 % of its memory
                                                                            [gpu_memory_near_full]
The *_fixed, *_tf32, *_alone, *_pinned, async_* and memory_headroom modes are the same work done
as the finding advises (or with headroom): the healthy counterparts.
"""
import os
import sys
import tempfile
import threading
import time

MODES = (
    "healthy_resnet healthy_lm input_main input_workers sync_storm pageable_copies tiny_kernels "
    "leak cpu_contention disk_bound straggler bulk_copy bulk_copy_pinned sync_checkpoint "
    "async_checkpoint input_main_fixed sync_storm_fixed pageable_copies_fixed tiny_kernels_fixed "
    "cpu_contention_alone fp32_matmul fp32_matmul_tf32 alloc_churn alloc_churn_fixed memory_full "
    "memory_headroom"
).split()

if len(sys.argv) != 3 or sys.argv[1] not in MODES:
    sys.exit(f"usage: {sys.argv[0]} MODE SECONDS  (MODE: {' '.join(MODES)})")
MODE, SECONDS = sys.argv[1], float(sys.argv[2])
SMOKE = os.environ.get("SMOKE") == "1"

# Modes whose CPU work is numpy in the main thread or in DataLoader workers: one BLAS/OpenMP
# thread each, so that the thread that does the work is the one that is busy (set before numpy
# and torch load their thread pools).
if MODE in ("input_main", "input_main_fixed", "input_workers", "cpu_contention", "cpu_contention_alone", "disk_bound"):
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"
if MODE in ("cpu_contention", "cpu_contention_alone"):
    # Pinned before torch starts any thread: every thread created later inherits it.
    cpus = {0, 1} & os.sched_getaffinity(0) or os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CUDA = torch.cuda.is_available()
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
DEV = torch.device("cuda", LOCAL_RANK) if CUDA else torch.device("cpu")
if CUDA:
    torch.cuda.set_device(DEV)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def autocast():
    return torch.autocast(device_type=DEV.type, dtype=torch.bfloat16)


class StepLog:
    """One "step <unix time>" line per step into STEP_LOG, written out every second."""

    def __init__(self):
        path = os.environ.get("STEP_LOG")
        self.f = open(path, "a") if path else None
        self.buf = []
        self.last = time.time()

    def tick(self, now):
        if self.f is None:
            return
        self.buf.append(f"step {now:.6f}\n")
        if now - self.last >= 1.0:
            self.flush()
            self.last = now

    def flush(self):
        if self.f is not None and self.buf:
            self.f.write("".join(self.buf))
            self.f.flush()
            self.buf.clear()


# ---------------------------------------------------------------------------- models


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inp != out:
            self.down = nn.Sequential(nn.Conv2d(inp, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = F.relu(self.bn2(self.conv2(y)), inplace=True)
        y = self.bn3(self.conv3(y))
        return F.relu(y + idt, inplace=True)


class ResNet50(nn.Module):
    def __init__(self, classes=1000, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers, inp = [], 64
        for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
            for j in range(n):
                layers.append(Bottleneck(inp, planes, 2 if (j == 0 and i > 0) else 1))
                inp = planes * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inp, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class LM(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(
            d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tok):
        return self.head(self.norm(self.enc(self.emb(tok) + self.pos)))


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o)).to(DEV)


# ---------------------------------------------------------------------------- datasets


def decode(rng_seed, size, rounds):
    """CPU-heavy stand-in for image decoding and augmentation (numpy, one thread)."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    a = rng.random((size, size))
    for _ in range(rounds):
        # + 0.5 keeps the values away from 0: no denormals, so every round costs the same.
        a = np.tanh(a @ a.T / size) + 0.5
    return a.astype(np.float32)


def slow_dataset(size, rounds):
    from torch.utils.data import Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            return torch.from_numpy(decode(i, size, rounds)), i % 10

    return Slow()


# ---------------------------------------------------------------------------- modes
# Each returns (step(i), warm-up step count, cleanup or None).


def mode_healthy_resnet():
    torch.backends.cudnn.benchmark = True
    b, hw = (4, 64) if SMOKE else (128, 224)
    model = ResNet50().to(DEV).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(b, 3, hw, hw, device=DEV).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), device=DEV)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i % 50 == 0:
            loss.item()

    return step, 5, None


def mode_healthy_lm():
    if SMOKE:
        vocab, d, layers, heads, seq, b = 1000, 64, 2, 4, 32, 4
    else:
        vocab, d, layers, heads, seq, b = 32000, 1024, 8, 16, 512, 32
    model = LM(vocab, d, layers, heads, seq).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)

    def step(i):
        tok = torch.randint(0, vocab, (b, seq + 1), device=DEV)
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        if i % 50 == 0:
            loss.item()

    return step, 3, None


def mode_input_main():
    from torch.utils.data import DataLoader

    size = 64
    loader = iter(DataLoader(slow_dataset(size, 6), batch_size=32, num_workers=0))
    model = mlp(size * size, 256, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = next(loader)
        x, y = x.to(DEV).flatten(1), y.to(DEV)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step, 3, None


def mode_input_workers():
    from torch.utils.data import DataLoader

    # ~5 ms of numpy per sample, 32 samples per batch: one worker makes ~6 batches/s, four
    # ~25/s, while the GPU step takes well under a millisecond: the GPU idles, the main thread
    # waits in the loader, the four workers are busy.
    size, rounds = (64, 4) if SMOKE else (160, 24)
    dl = DataLoader(
        slow_dataset(size, rounds),
        batch_size=32,
        num_workers=4,
        pin_memory=CUDA,
        persistent_workers=True,
    )
    loader = iter(dl)
    model = mlp(size * size, 512, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = next(loader)
        x, y = x.to(DEV, non_blocking=True).flatten(1), y.to(DEV, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def cleanup():
        nonlocal loader
        # Stops the persistent workers now rather than at interpreter exit.
        if hasattr(loader, "_shutdown_workers"):
            loader._shutdown_workers()
        loader = None

    return step, 4, cleanup


def mode_sync_storm():
    x = torch.randn(256, 256, device=DEV)
    w = torch.randn(256, 256, device=DEV)
    total = [0.0]

    def step(i):
        total[0] += (x @ w).relu().sum().item()

    return step, 10, None


def mode_pageable_copies():
    # 64 separate pageable (not pinned) 16 KiB host tensors, each copied with a plain .to(dev):
    # a synchronous host-to-device copy per tensor.
    hosts = [torch.randn(4096) for _ in range(64)]
    w = torch.randn(4096, 64, device=DEV)

    def step(i):
        ys = [h.to(DEV) for h in hosts]
        out = torch.stack(ys) @ w
        if i % 50 == 0:
            out.sum().item()

    return step, 5, None


def mode_tiny_kernels():
    x = torch.rand(1024, device=DEV)

    def step(i):
        nonlocal x
        for _ in range(100):  # 3 kernels per round: ~300 launches per step
            x = x.mul(0.999)
            x.add_(0.001)
            x.relu_()
        if i % 200 == 0:
            x.sum().item()

    return step, 20, None


def mode_leak():
    keep = []
    a = torch.randn(512, 512, device=DEV)
    last = [0.0]
    chunk = (1 << 20) if SMOKE else (25 << 20)

    def step(i):
        b = (a @ a).relu_()
        if i % 20 == 0:
            b.sum().item()
        now = time.time()
        if now - last[0] >= 0.25:
            keep.append(torch.empty(chunk, dtype=torch.uint8, device=DEV))
            last[0] = now
        time.sleep(0.01)

    return step, 2, None


def mode_cpu_contention():
    import numpy as np

    # Per step: ~2-3 ms of numpy in the main thread (one BLAS thread), then a GPU step that takes
    # longer than that, launched without a per-step sync (pinned staging, non_blocking copy):
    # alone on its CPUs the loop keeps the GPU busy; the hogs the runner pins on the same CPUs
    # make its threads wait in the run queue.
    torch.set_num_threads(1)
    n, d, rows, chain = (32, 64, 64, 2) if SMOKE else (256, 4096, 8192, 48)
    rng = np.random.default_rng(0)
    base = rng.random((n, n))
    staging = [torch.empty(n, n, dtype=torch.float32, pin_memory=CUDA) for _ in range(4)]
    proj = torch.randn(n, d, device=DEV, dtype=torch.bfloat16) / n**0.5
    w = torch.randn(d, d, device=DEV, dtype=torch.bfloat16) / d**0.5

    def step(i):
        a = base
        for _ in range(4):
            a = np.tanh(a @ a.T / n) + 0.5
        buf = staging[i % len(staging)]
        buf.copy_(torch.from_numpy(a.astype(np.float32)))
        x = buf.to(DEV, non_blocking=True).to(torch.bfloat16)
        h = (x @ proj).repeat(rows // n, 1)
        for _ in range(chain):  # ~20 ms of bf16 matmuls on an H200
            h = torch.tanh(h @ w)
        if i % 20 == 0:
            h.float().sum().item()

    return step, 5, None


def mode_disk_bound():
    import mmap
    import random
    import tempfile

    mib = 1 << 20
    path = os.environ.get("DATA_FILE")
    tmp = None
    if not path:
        # No file from the runner (a CPU smoke test): a small one here.
        fd, tmp = tempfile.mkstemp(prefix="scenario-data-")
        with os.fdopen(fd, "wb") as f:
            for _ in range(32 if SMOKE else 512):
                f.write(os.urandom(mib))
        path = tmp
    size = os.path.getsize(path)
    if size < 8 * mib:
        sys.exit(f"DATA_FILE {path}: {size} bytes, needs at least 8 MiB")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        direct = True
    except OSError as e:  # tmpfs and some file systems refuse O_DIRECT
        print(f"disk_bound: O_DIRECT refused ({e}); reading through the page cache", file=sys.stderr)
        fd = os.open(path, os.O_RDONLY)
        direct = False
    buf = mmap.mmap(-1, 8 * mib)  # page-aligned, as O_DIRECT needs
    view = memoryview(buf)
    slots = size // mib
    samples = torch.frombuffer(buf, dtype=torch.uint8)
    w = torch.randn(1024, 64, device=DEV)

    def step(i):
        for k in range(8):
            off = random.randrange(slots) * mib
            if not direct:
                os.posix_fadvise(fd, off, mib, os.POSIX_FADV_DONTNEED)
            os.preadv(fd, [view[k * mib:(k + 1) * mib]], off)
        # One 8 MiB copy of the batch, then a small product.
        x = samples.to(DEV).view(8192, 1024)[:1024].float()
        out = x @ w
        if i % 20 == 0:
            out.sum().item()

    def cleanup():
        os.close(fd)
        if tmp:
            os.unlink(tmp)

    return step, 3, cleanup


def mode_straggler():
    import torch.distributed as dist

    dist.init_process_group("nccl" if CUDA else "gloo")
    rank = dist.get_rank()
    t = torch.ones((1 << 10) if SMOKE else (1 << 20), device=DEV)
    dist.all_reduce(t)
    sync()
    stop = [False]
    state = {"t_end": None}

    def step(i):
        if rank == 1:
            time.sleep(0.04)
        # The stop decision travels in the reduced tensor, so both ranks leave after the same
        # all_reduce (a rank that stopped alone would leave the other one hanging).
        t[:1].fill_(1.0 if (state["t_end"] is not None and time.time() >= state["t_end"]) else 0.0)
        dist.all_reduce(t)
        sync()
        if t[0].item() > 0:
            stop[0] = True

    def cleanup():
        dist.destroy_process_group()

    return step, 3, cleanup, stop, state


def matmul_work(n):
    """A fixed amount of GPU work: n products of 8192 x 8192 bf16 matrices (~1.1 TFLOP each)."""
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)

    def work():
        c = a
        for _ in range(n):
            c = (c @ b).tanh_()
        return c

    return work


def mode_bulk_copy():
    # 1 GiB of pageable (not pinned) host memory copied to the GPU every step, then the step's
    # GPU work: the driver stages a pageable copy through its own pinned buffers with the CPU,
    # and the host waits for it, so the GPU idles during every copy. Its fix is bulk_copy_pinned.
    n = (1 << 20) if SMOKE else (1 << 28)  # float32 elements: 4 MiB / 1 GiB
    host = torch.rand(n)
    dev = torch.empty(n, device=DEV)
    work = matmul_work(1 if SMOKE else 40)

    def step(i):
        dev.copy_(host)
        work()
        if i % 4 == 0:
            sync()

    return step, 2, None


def mode_bulk_copy_pinned():
    # bulk_copy fixed: the same bytes from pinned memory, copied asynchronously on a side
    # stream into one of two device buffers while the previous batch's work runs.
    n = (1 << 20) if SMOKE else (1 << 28)
    host = torch.rand(n).pin_memory() if CUDA else torch.rand(n)
    devs = [torch.empty(n, device=DEV), torch.empty(n, device=DEV)]
    copy_stream = torch.cuda.Stream() if CUDA else None
    work = matmul_work(1 if SMOKE else 40)

    def step(i):
        buf = devs[i % 2]
        if CUDA:
            copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                buf.copy_(host, non_blocking=True)
        else:
            buf.copy_(host)
        work()
        if CUDA:
            torch.cuda.current_stream().wait_stream(copy_stream)
        if i % 4 == 0:
            sync()

    return step, 2, None


def checkpoint_model():
    layers = 2 if SMOKE else 8
    width = 256 if SMOKE else 4096  # 8 x 4096 x 4096 float32: 512 MiB of parameters
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(64 if SMOKE else 8192, width, device=DEV)

    def train_step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()

    return model, train_step


def checkpoint_path():
    d = os.environ.get("CKPT_DIR") or tempfile.gettempdir()
    return os.path.join(d, f"ethand-scenario-ckpt-{os.getpid()}.pt")


def save_synced(state, path):
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def mode_sync_checkpoint():
    # A synchronous checkpoint after every step: torch.save of the model (device to host,
    # pickling, 512 MiB written) and an fsync, on the main thread, while the GPU waits.
    model, train_step = checkpoint_model()
    path = checkpoint_path()

    def step(i):
        for _ in range(4):
            train_step()
        save_synced(model.state_dict(), path)

    def cleanup():
        if os.path.exists(path):
            os.unlink(path)

    return step, 1, cleanup


def mode_async_checkpoint():
    # sync_checkpoint fixed: the state is copied into pinned host buffers (asynchronously, on
    # a side stream) and a background thread saves it; a new checkpoint starts only when the
    # previous one is written, so the training loop never waits for the disk.
    model, train_step = checkpoint_model()
    path = checkpoint_path()
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=CUDA) for k, v in model.state_dict().items()}
    copy_stream = torch.cuda.Stream() if CUDA else None
    saver = [None]

    def step(i):
        for _ in range(4):
            train_step()
        if saver[0] is not None and saver[0].is_alive():
            return
        if CUDA:
            copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                for k, v in model.state_dict().items():
                    host[k].copy_(v, non_blocking=True)
            done = torch.cuda.Event()
            done.record(copy_stream)
        else:
            for k, v in model.state_dict().items():
                host[k].copy_(v)
            done = None

        def save():
            if done is not None:
                done.synchronize()
            save_synced(host, path)

        saver[0] = threading.Thread(target=save, name="ckpt-saver", daemon=True)
        saver[0].start()

    def cleanup():
        if saver[0] is not None:
            saver[0].join()
        if os.path.exists(path):
            os.unlink(path)

    return step, 1, cleanup


# ---------------------------------------------------------------------------- fixes
# The problem modes fixed the way their finding advises, same work per step: the step rate of
# a pair is the measured speed-up its finding's estimate is checked against
# (tests/gpu/scenarios.json "fixed_by"; tests/tests/gpu_scenarios.rs).


def mode_input_main_fixed():
    # input_main with the decoding in 4 DataLoader worker processes and pinned batches.
    from torch.utils.data import DataLoader

    size = 64
    dl = DataLoader(slow_dataset(size, 6), batch_size=32, num_workers=4, pin_memory=CUDA, persistent_workers=True)
    loader = iter(dl)
    model = mlp(size * size, 256, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = next(loader)
        x, y = x.to(DEV, non_blocking=True).flatten(1), y.to(DEV, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def cleanup():
        nonlocal loader
        if hasattr(loader, "_shutdown_workers"):
            loader._shutdown_workers()
        loader = None

    return step, 4, cleanup


def mode_sync_storm_fixed():
    # sync_storm with the loss summed on the GPU and read back every 50 steps.
    x = torch.randn(256, 256, device=DEV)
    w = torch.randn(256, 256, device=DEV)
    total = torch.zeros((), device=DEV)

    def step(i):
        total.add_((x @ w).relu().sum())
        if i % 50 == 0:
            total.item()

    return step, 10, None


def mode_pageable_copies_fixed():
    # pageable_copies with the 64 host tensors kept in one pinned buffer, copied at once.
    hosts = torch.randn(64, 4096)
    if CUDA:
        hosts = hosts.pin_memory()
    w = torch.randn(4096, 64, device=DEV)

    def step(i):
        out = hosts.to(DEV, non_blocking=True) @ w
        if i % 50 == 0:
            out.sum().item()

    return step, 5, None


def mode_tiny_kernels_fixed():
    # tiny_kernels with the 100 rounds of 3 kernels captured once in a CUDA graph and replayed.
    x = torch.rand(1024, device=DEV)

    def body():
        y = x
        for _ in range(100):
            y = y.mul(0.999)
            y.add_(0.001)
            y.relu_()
        x.copy_(y)

    if not CUDA:
        def step(i):
            body()

        return step, 20, None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def step(i):
        graph.replay()
        if i % 200 == 0:
            x.sum().item()

    return step, 20, None


def mode_cpu_contention_alone():
    # cpu_contention without the runner's hogs on its CPUs: what removing the neighbours gives.
    return mode_cpu_contention()


def fp32_products(n):
    """n products of 8192 x 8192 FP32 matrices, in the precision PyTorch's settings allow."""
    size = 256 if SMOKE else 8192
    a = torch.randn(size, size, device=DEV)
    b = torch.randn(size, size, device=DEV) / size**0.5

    def step(i):
        c = a
        for _ in range(n):
            c = (c @ b).tanh_()
        if i % 4 == 0:
            sync()

    return step, 2, None


def mode_fp32_matmul():
    # PyTorch's default float32 matmul precision is "highest": no TF32, no tensor cores.
    return fp32_products(1 if SMOKE else 8)


def mode_fp32_matmul_tf32():
    # fp32_matmul fixed as the finding advises: TF32 tensor cores for FP32 matmuls.
    torch.set_float32_matmul_precision("high")
    return fp32_products(1 if SMOKE else 8)


def mlp_training(empty_cache):
    """A bf16 MLP training step (batch 4096, 4096 -> 8192 -> 4096); with empty_cache, the
    caching allocator is emptied after every step, so its blocks go back to the driver and
    are allocated again in the next."""
    width, hidden, batch = (64, 128, 64) if SMOKE else (4096, 8192, 4096)
    model = mlp(width, hidden, width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=DEV)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        if empty_cache and CUDA:
            torch.cuda.empty_cache()
        if i % 50 == 0:
            loss.item()

    return step, 3, None


def mode_alloc_churn():
    return mlp_training(True)


def mode_alloc_churn_fixed():
    return mlp_training(False)


def filled(share):
    """bf16 matrix products after the GPU's memory was filled to `share` of its total (the
    work's own buffers allocated and used first, so that it never needs more)."""
    work = matmul_work(1 if SMOKE else 10)
    work()
    sync()
    filler = None
    if CUDA:
        free, total = torch.cuda.mem_get_info(DEV)
        want = int(free - (1.0 - share) * total)
        if want > 0:
            filler = torch.empty(want, dtype=torch.uint8, device=DEV)

    def step(i):
        work()
        if i % 4 == 0:
            sync()

    step.filler = filler
    return step, 2, None


def mode_memory_full():
    return filled(0.975)


def mode_memory_headroom():
    # memory_full's work with 20 % of the GPU's memory free.
    return filled(0.80)


# ---------------------------------------------------------------------------- main


def main():
    made = globals()["mode_" + MODE]()
    step, warm, cleanup = made[:3]
    stop, state = (made[3], made[4]) if len(made) > 3 else ([False], {})
    for i in range(warm):
        step(i)
    sync()
    log = StepLog()
    t_end = time.time() + SECONDS
    state["t_end"] = t_end
    print(f"ready {os.getpid()}", flush=True)
    # Never outlive the run by much, whatever happens below (a hung collective, a stuck worker).
    watchdog = threading.Timer(SECONDS + 60, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    i = warm
    n = 0
    try:
        # straggler: the ranks stop together, on the flag its step reduces; the others on time.
        while not stop[0] and (MODE == "straggler" or time.time() < t_end):
            step(i)
            log.tick(time.time())
            i += 1
            n += 1
        sync()
    finally:
        log.flush()
    if cleanup:
        cleanup()
    print(f"done {MODE} steps={n} seconds={time.time() - t_end + SECONDS:.1f}", flush=True)
    watchdog.cancel()


if __name__ == "__main__":
    main()
