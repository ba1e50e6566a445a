#!/usr/bin/env python3
"""Training-throughput benchmark for scripts/gpu-bench.sh: what ethand costs a real training job.

One process (or one per rank under torchrun) builds the model and its DataLoader ONCE, then runs
rounds x modes timed segments, the order of the modes rotated each round so that machine drift
hits every mode alike. Between segments it switches the mode itself:

  none      the ethand daemon is not running (stopped with SIGTERM and waited for);
  system    ethand running at gpu level system  (started with that config, or `ethand level`);
  calls     ethand at level calls (the default level: the one the 1 % target applies to; every
            probed call but kernel launches);
  process   ethand at level process (also kernel launches);
  op        ethand at level op;
  profiler  no ethand; torch.profiler.profile(activities=[CPU, CUDA]) around the timed steps.

Entering an ethand mode waits (polling `ethand status --json`) until every libcuda/libnccl
file this process maps, identified by (dev, inode) as in /proc/self/maps, is listed in
`gpu_libraries` with state "attached" and `gpu_level` is the wanted level (level system: only
the level). A segment: W warm-up steps (not timed), then N timed steps and
torch.cuda.synchronize(); steps/s = N / elapsed. The daemon's RSS and CPU seconds (from /proc)
are read at the end of each ethand segment.

Subcommands:
  run     the benchmark (single process; or DDP under torchrun: --workload ddp, rank 0 drives
          the daemon between segments, dist.barrier() before and after every switch).
  report  Markdown + JSON from the run files (scripts/gpu-bench.sh calls it).

Testing without a GPU: `run --device cpu --dry-run` (a small model on the CPU, short segments;
the daemon is really started, switched and stopped; waiting for libcuda times out with a
message and the segment is kept), or `--fake` (no torch at all: a busy loop stands in for a
training step).
"""
import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time

MODES_ALL = ("none", "system", "calls", "process", "op", "profiler")
ETHAND_MODES = ("system", "calls", "process", "op")
T_START = time.monotonic()
RANK = int(os.environ.get("RANK", "0"))


def host_steal_s():
    """CPU time the hypervisor gave other guests while this VM's CPUs wanted to run (the
    `steal` column of /proc/stat's cpu line, all CPUs summed), in seconds; None if unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


STEP_TIME_KEYS = ("step_ms_median", "step_ms_p90", "step_ms_p99", "step_ms_max", "stall_ms")


def step_time_stats(times):
    """A segment's per-step wall times (seconds) summed up in ms: the median step (robust to
    stalls), its tail, and the stall time: what steps longer than twice the median took beyond
    the median. The raw times are kept (rounded to µs) for analysis after the run."""
    if not times:
        return {}
    ms = sorted(t * 1000 for t in times)
    n = len(ms)
    q = lambda p: ms[min(n - 1, int(p * n))]  # noqa: E731 -- nearest-rank quantile
    m = statistics.median(ms)
    return {"step_ms_median": m, "step_ms_p90": q(0.90), "step_ms_p99": q(0.99), "step_ms_max": ms[-1],
            "stall_ms": sum(t - m for t in ms if t > 2 * m),
            "step_ms": [round(t * 1000, 3) for t in times]}


def log(msg):
    print(f"[train_bench rank={RANK} +{time.monotonic() - T_START:.1f}s] {msg}", file=sys.stderr, flush=True)


def write_json_atomic(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------- host speed reference
# A fixed unit of interpreter work (dict, list and int operations, like the Python side of a
# launch path), run in a loop by each reference process; it makes no system call, so no probe
# of ethand's fires in it. It counts units into a shared 8-byte page and dies with its parent.
SPEED_REF_CHILD = r"""
import ctypes, mmap, os, signal, struct, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[3]):
    sys.exit(0)
os.sched_setaffinity(0, {int(sys.argv[2])})
mm = mmap.mmap(int(sys.argv[1]), 8)
os.close(int(sys.argv[1]))
pack = struct.pack_into
n = 0
d = {}
while True:
    for i in range(64):
        k = i & 31
        d[k] = d.get(k, 0) + i * 3
    xs = [x * 2 for x in range(32)]
    d[33] = len(xs) + xs[-1]
    n += 1
    pack("<Q", mm, 0, n)
"""


class SpeedRef:
    """The host's CPU speed, measured beside the training.

    In this VM a step's time follows the speed the host gives its CPUs, which moves by 5-20 %
    within seconds (other guests; no steal is reported) and swamps a 1 % effect. N reference
    processes, each pinned to a CPU of its own that the training, its DataLoader workers and
    the daemon are kept off (this process's affinity, inherited), count units of fixed
    interpreter work; units/s over a timed segment is the speed the host gave then. A paired
    round's change in steps/s can then be regressed on its change in reference speed: the
    intercept is ethand's effect at unchanged host speed. ethand should not move the reference
    itself (it makes no system call, nothing else runs on its CPU); the report checks that.
    On the H200 VM it narrowed nothing (runs 20-22, bench/results/gpu-training/): each vCPU's
    speed moves on its own, so a reference on another vCPU tracks the slow drift that pairing
    already removes, not the training thread's speed within a round.
    """

    def __init__(self, n, spawn):
        self.cpus = []
        self.procs = []
        self.maps = []
        self.note = ""
        if n <= 0:
            return
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except OSError as e:
            self.note = f"speed reference off: {e}"
            return
        if len(cpus) <= n:
            self.note = f"speed reference off: {len(cpus)} CPUs leave none to the training beside {n} references"
            return
        self.cpus = cpus[-n:]
        # This thread's affinity, before torch starts threads or workers: all of them, and
        # the daemon this process starts, inherit it.
        os.sched_setaffinity(0, cpus[:-n])
        if not spawn:  # other DDP ranks: keep off the CPUs, rank 0 runs the references
            return
        import mmap
        for i, cpu in enumerate(self.cpus):
            path = f"/dev/shm/ethand-speedref-{os.getpid()}-{i}"
            with open(path, "wb") as f:
                f.write(b"\0" * 8)
            fd = os.open(path, os.O_RDWR)
            os.unlink(path)  # the mappings stay; nothing is left in /dev/shm
            self.maps.append(mmap.mmap(fd, 8))
            self.procs.append(subprocess.Popen([sys.executable, "-c", SPEED_REF_CHILD, str(fd), str(cpu),
                                                str(os.getpid())], stdin=subprocess.DEVNULL, pass_fds=(fd,)))
            os.close(fd)
        time.sleep(0.5)
        dead = [p.pid for p in self.procs if p.poll() is not None]
        if dead or not all(self.counts()):
            self.note = f"speed reference failed to start (exited: {dead})"
            self.close()
        else:
            self.note = f"speed reference: {n} processes on CPUs {self.cpus}; training and daemon on the others"

    @property
    def active(self):
        return bool(self.maps)

    def counts(self):
        import struct
        return [struct.unpack_from("<Q", m, 0)[0] for m in self.maps]

    def close(self):
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()
                p.wait(timeout=5)
        self.procs, self.maps = [], []


# ----------------------------------------------------------------------------------- ethand
def mapped_runtime_files(pid="self"):
    """{(dev, inode): path} of the libcuda/libnccl files mapped by pid (as ethand identifies
    them: /proc/PID/maps columns dev and inode; same file-name rule as userspace-probes)."""
    out = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or line.rstrip().endswith(" (deleted)"):
                    continue
                path = parts[5].strip()
                name = path.rsplit("/", 1)[-1]
                if ".so" not in name or name.split(".so")[0] not in ("libcuda", "libnccl"):
                    continue
                try:
                    out[(parts[3], int(parts[4]))] = path
                except ValueError:
                    pass
    except OSError:
        pass
    return out


class Daemon:
    """Starts, switches and stops one ethand daemon (our child) with a private config."""

    def __init__(self, args):
        self.ethand = args.ethand
        self.prefix = args.config_prefix
        self.listen = args.listen
        self.log_path = args.daemon_log
        self.pidfile = args.pidfile
        self.proc = None
        self.level = None
        self.live_level = True  # False after a live switch failed: restart instead

    def config(self, level):
        return f"{self.prefix}-{level}.toml"

    def cli(self, *a, timeout=20):
        cmd = [self.ethand, "--config", self.config("process"), *a]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, NO_COLOR="1"))
            return r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired:
            return 124, "", f"timeout after {timeout}s: {' '.join(cmd)}"
        except OSError as e:
            return 127, "", str(e)

    def status(self, timeout=10):
        rc, out, err = self.cli("status", "--json", timeout=timeout)
        if rc != 0:
            return None, (err or out).strip()[:300]
        try:
            return json.loads(out), ""
        except ValueError as e:
            return None, f"bad JSON from ethand status: {e}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, level, label=None, cfg=None):
        cfg = cfg or self.config(level)
        with open(self.log_path, "a") as lf:
            lf.write(f"\n===== daemon start ({label or 'gpu.level = ' + level}) "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} config {cfg} =====\n")
        lf = open(self.log_path, "a")
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen([self.ethand, "--config", cfg, "run", "--listen", self.listen],
                                         stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=dict(os.environ, NO_COLOR="1"))
        except OSError as e:
            lf.close()
            return False, f"cannot start {self.ethand}: {e}"
        lf.close()
        if self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write(f"{self.proc.pid}\n")
        while time.monotonic() - t0 < 30:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                return False, f"daemon exited during start-up (exit {rc}); see daemon.log"
            st, _ = self.status(timeout=5)
            if st is not None:
                self.level = level
                log(f"daemon pid {self.proc.pid} answers after {time.monotonic() - t0:.1f}s (level {level})")
                return True, ""
            time.sleep(0.25)
        self.stop()
        return False, "daemon does not answer after 30 s"

    def stop(self):
        if self.proc is None:
            return None
        p, self.proc, self.level = self.proc, None, None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"daemon pid {p.pid} ignored SIGTERM for 10 s: SIGKILL")
                p.kill()
                p.wait(timeout=10)
        if self.pidfile:
            with contextlib.suppress(OSError):
                os.unlink(self.pidfile)
        log(f"daemon pid {p.pid} stopped (exit {p.returncode})")
        return p.returncode

    def set_level(self, level):
        t0 = time.monotonic()
        rc, out, err = self.cli("level", level, timeout=60)
        ms = (time.monotonic() - t0) * 1000
        if rc == 0:
            self.level = level
            log(f"ethand level {level} ({ms:.0f} ms): {out.strip()}")
            return True, ""
        return False, f"ethand level {level} failed after {ms:.0f} ms (exit {rc}): {(err or out).strip()[:300]}"

    def ensure(self, level):
        """The daemon running at level: started, switched live, or restarted. (ok, note)."""
        if self.alive() and self.level == level:
            return True, ""
        note = ""
        if self.alive() and self.live_level:
            ok, msg = self.set_level(level)
            if ok:
                return True, ""
            self.live_level = False
            note = msg + "; restarting the daemon with gpu.level = " + level + " (and for every later switch)"
            log(note)
        if self.alive():
            self.stop()
        elif self.proc is not None:  # died on its own
            note += f" daemon had exited (exit {self.proc.returncode});"
            self.proc = None
        ok, msg = self.start(level)
        return ok, (note + " " + msg).strip()

    def proc_stats(self):
        """{'pid', 'rss_bytes', 'cpu_s'} of the daemon from /proc (None when not running)."""
        if not self.alive():
            return None
        pid = self.proc.pid
        d = {"pid": pid}
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        d["rss_bytes"] = int(line.split()[1]) * 1024
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            tck = os.sysconf("SC_CLK_TCK")
            d["cpu_s"] = (int(rest[11]) + int(rest[12])) / tck  # utime, stime (fields 14, 15)
        except (OSError, ValueError, IndexError):
            pass
        return d


def wait_attached(daemon, level, timeout):
    """Poll `ethand status --json` until this process's runtime files are attached at level.
    Returns a dict: ok, waited_s, detail, libraries (what status listed for our files)."""
    want = mapped_runtime_files()
    t0 = time.monotonic()
    last = ""
    while True:
        st, err = daemon.status(timeout=5)
        waited = time.monotonic() - t0
        if st is None:
            last = f"status failed: {err}"
        else:
            libs = st.get("gpu_libraries") or []
            by_key = {(l.get("dev"), l.get("inode")): l for l in libs}
            cur = st.get("gpu_level")
            if cur != level:
                last = f"gpu_level is {cur!r}, want {level!r}"
            elif level == "system":
                return {"ok": True, "waited_s": round(waited, 2), "detail": "level system (no uprobes)"}
            elif want:
                pend = [f"{p} ({by_key.get(k, {}).get('state', 'not found yet')})"
                        for k, p in want.items() if by_key.get(k, {}).get("state") != "attached"]
                if not pend:
                    return {"ok": True, "waited_s": round(waited, 2),
                            "detail": f"{len(want)} runtime file(s) attached",
                            "libraries": [{"path": p, "symbols_attached": len(by_key[k].get("symbols_attached") or [])}
                                          for k, p in want.items()]}
                last = "not attached yet: " + ", ".join(pend)
            else:
                cuda = [l for l in libs if l.get("runtime") == "cuda" and l.get("state") == "attached"]
                if cuda:
                    return {"ok": True, "waited_s": round(waited, 2),
                            "detail": "this process maps no libcuda; ethand has attached " + cuda[0].get("path", "?")}
                last = ("this process maps no libcuda/libnccl (CPU run?) and ethand lists no attached "
                        f"libcuda ({len(libs)} runtime file(s) known)")
        if waited >= timeout:
            return {"ok": False, "waited_s": round(waited, 2), "detail": f"timeout after {timeout:.0f}s: {last}"}
        time.sleep(0.2)


# ----------------------------------------------------------------------------------- training
class FakeTrainer:
    """No torch: a busy loop stands in for a step (tests the control flow only)."""

    desc = {"model": "fake (busy loop, ~2 ms per step)", "precision": "-", "batch": 0}

    def __init__(self, args):
        self.dev = "cpu"
        self.data_wait = 0.0

    def step(self):
        t = time.perf_counter() + 0.002
        x = 0
        while time.perf_counter() < t:
            x += 1

    def sync(self):
        pass

    def loss(self):
        return 0.0

    def profiler(self):
        return contextlib.nullcontext()

    def close(self):
        pass


class TorchTrainer:
    def __init__(self, args, device, distributed):
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, Dataset

        self.torch = torch
        self.dev = device
        self.cuda = device.type == "cuda"
        self.data_wait = 0.0
        torch.manual_seed(1234 + RANK)
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.amp_dtype = torch.bfloat16 if (args.precision == "bf16") else None
        base_seed = 1_000_003 * (RANK + 1)
        work = args.sample_work

        if args.model == "transformer":
            V, S = args.vocab, args.seq

            class Tokens(Dataset):
                """Map-style synthetic corpus: per sample, a seeded generator draws S+1 tokens
                from a skewed distribution (CPU work in the DataLoader workers)."""

                def __len__(self):
                    return 1 << 22

                def __getitem__(self, i):
                    g = torch.Generator().manual_seed(base_seed + i)
                    t = torch.randint(0, V, (S + 1,), generator=g)
                    for _ in range(work):  # a little tokenizer-like shuffling of ids
                        t = (t * 1103515245 + 12345) % V
                    t = torch.minimum(t, (t * t) % V)  # skew toward small ids (Zipf-like)
                    return t

            class TinyLM(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.emb = nn.Embedding(V, args.d_model)
                    self.pos = nn.Parameter(torch.zeros(1, S, args.d_model))
                    layer = nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model, dropout=0.1,
                                                       activation="gelu", batch_first=True, norm_first=True)
                    self.enc = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
                    self.norm = nn.LayerNorm(args.d_model)
                    self.head = nn.Linear(args.d_model, V)
                    self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(S), persistent=False)

                def forward(self, x):
                    h = self.emb(x) + self.pos[:, : x.size(1)]
                    h = self.enc(h, mask=self.mask, is_causal=True)
                    return self.head(self.norm(h))

            ds, model = Tokens(), TinyLM()
            self.desc = {"model": f"TransformerEncoder LM: d_model {args.d_model}, {args.layers} layers, "
                                  f"{args.heads} heads, ffn {4 * args.d_model}, seq {S}, vocab {V}, "
                                  f"pre-norm, GELU, dropout 0.1, causal mask",
                         "batch": args.batch}

            def loss_fn(out, batch):
                return nn.functional.cross_entropy(out.reshape(-1, V).float(), batch[1].reshape(-1))

            def split(b):
                return b[:, :-1], b[:, 1:]
        else:
            R, C = args.image, args.classes

            class Images(Dataset):
                def __len__(self):
                    return 1 << 22

                def __getitem__(self, i):
                    g = torch.Generator().manual_seed(base_seed + i)
                    img = torch.randint(0, 256, (3, R, R), dtype=torch.uint8, generator=g)
                    if i % 2:
                        img = img.flip(2)  # a random-flip style augmentation
                    x = (img.float() / 255.0 - 0.45) / 0.225
                    return x, int(torch.randint(0, C, (1,), generator=g))

            class Block(nn.Module):
                def __init__(self, cin, cout, stride):
                    super().__init__()
                    self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                    self.b1 = nn.BatchNorm2d(cout)
                    self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                    self.b2 = nn.BatchNorm2d(cout)
                    self.sc = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else nn.Identity())

                def forward(self, x):
                    y = torch.relu(self.b1(self.c1(x)))
                    return torch.relu(self.b2(self.c2(y)) + self.sc(x))

            w = args.width
            layers = [nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            cin = w
            for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
                layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
                cin = cout
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, C)]
            ds, model = Images(), nn.Sequential(*layers)
            self.desc = {"model": f"ResNet-18-style conv net: width {w}, 8 basic blocks, BatchNorm, "
                                  f"{R}x{R} images, {C} classes" + (", channels_last" if self.cuda else ""),
                         "batch": args.batch}

            def loss_fn(out, batch):
                return nn.functional.cross_entropy(out.float(), batch[1])

            def split(b):
                return b[0], b[1]

        model = model.to(device)
        if self.cuda and args.model == "resnet":
            model = model.to(memory_format=torch.channels_last)
        self.nparams = sum(p.numel() for p in model.parameters())
        if distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[device.index] if self.cuda else None)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        self.loss_fn, self.split = loss_fn, split
        nw = args.workers
        self.loader = DataLoader(ds, batch_size=args.batch, shuffle=False, num_workers=nw,
                                 pin_memory=self.cuda, drop_last=True, persistent_workers=nw > 0,
                                 prefetch_factor=4 if nw > 0 else None)
        self.it = iter(self.loader)
        self.last_loss = None
        self.desc.update({"parameters": self.nparams,
                          "precision": "bf16 autocast (fp32 master weights)" if self.amp_dtype else "fp32 (TF32 matmuls)" if self.cuda else "fp32",
                          "optimizer": "AdamW (default foreach implementation), lr 3e-4",
                          "data": f"DataLoader num_workers={nw}, pin_memory={self.cuda}, persistent_workers, "
                                  f"prefetch_factor 4, non_blocking copies; synthetic map-style dataset "
                                  f"(per-sample CPU work: seeded generator + {work} id transforms)" if args.model == "transformer"
                                  else f"DataLoader num_workers={nw}, pin_memory={self.cuda}, persistent_workers, "
                                       f"synthetic map-style dataset (per-sample random uint8 image, flip, normalize)",
                          "eager": "eager mode (no torch.compile)"})

    def next_batch(self):
        t0 = time.perf_counter()
        try:
            b = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            b = next(self.it)
        self.data_wait += time.perf_counter() - t0
        return b

    def step(self):
        torch = self.torch
        b = self.next_batch()
        # The whole pinned batch is copied (non-blocking), then split on the device: slicing
        # first would copy non-contiguous views, which are staged through pageable memory.
        if isinstance(b, (list, tuple)):
            b = [t.to(self.dev, non_blocking=True) for t in b]
        else:
            b = b.to(self.dev, non_blocking=True)
        x, y = self.split(b)
        if self.cuda and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        ctx = (torch.autocast(device_type=self.dev.type, dtype=self.amp_dtype) if self.amp_dtype
               else contextlib.nullcontext())
        with ctx:
            out = self.model(x)
        loss = self.loss_fn(out, (x, y))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.last_loss = loss.detach()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def loss(self):
        return float(self.last_loss) if self.last_loss is not None else None

    def profiler(self):
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        return profile(activities=acts)

    def close(self):
        with contextlib.suppress(Exception):
            del self.it
        with contextlib.suppress(Exception):
            self.loader._iterator = None


# ----------------------------------------------------------------------------------- the run
class Bench:
    def __init__(self, args):
        self.a = args
        self.ddp = args.workload == "ddp"
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.is0 = RANK == 0
        self.daemon = Daemon(args)
        self.ref = SpeedRef(0, False)  # cmd_run sets the real one, before torch starts threads
        self.dist = None
        self.res = {"workload": args.workload, "rank": RANK, "meta": {}, "plan": {}, "segments": [],
                    "skipped": [], "notes": [], "errors": []}

    # -- collective helpers (no-ops for one process)
    def barrier(self):
        if self.dist:
            self.dist.barrier()

    # Small objects travel as JSON in uint8 tensors (no pickle/numpy needed): tuples come
    # back as lists.
    def _enc(self, obj):
        torch = self.torch
        data = list(json.dumps(obj).encode())
        return torch.tensor(data or [32], dtype=torch.uint8, device=self.cdev), len(data)

    def _dec(self, t, n):
        return json.loads(bytes(t[:n].cpu().tolist()).decode())

    def bcast(self, obj):
        if not self.dist:
            return obj
        torch = self.torch
        n = torch.zeros(1, dtype=torch.int64, device=self.cdev)
        if self.is0:
            t, ln = self._enc(obj)
            n[0] = ln
        self.dist.broadcast(n, src=0)
        if not self.is0:
            t = torch.zeros(max(1, int(n[0])), dtype=torch.uint8, device=self.cdev)
        self.dist.broadcast(t, src=0)
        return self._dec(t, int(n[0]))

    def gather(self, obj):
        if not self.dist:
            return [obj]
        torch = self.torch
        t, ln = self._enc(obj)
        ns = [torch.zeros(1, dtype=torch.int64, device=self.cdev) for _ in range(self.world)]
        self.dist.all_gather(ns, torch.tensor([ln], dtype=torch.int64, device=self.cdev))
        lens = [int(x[0]) for x in ns]
        m = max(1, max(lens))
        buf = torch.zeros(m, dtype=torch.uint8, device=self.cdev)
        buf[: t.numel()] = t
        outs = [torch.zeros(m, dtype=torch.uint8, device=self.cdev) for _ in range(self.world)]
        self.dist.all_gather(outs, buf)
        return [self._dec(o, k) for o, k in zip(outs, lens)]

    def save(self):
        if self.is0:
            write_json_atomic(self.a.out_json, self.res)

    def note(self, msg, key="notes"):
        log(msg)
        self.res[key].append(msg)
        self.save()

    # -- set-up
    def setup(self):
        a = self.a
        meta = self.res["meta"]
        meta.update({"python": sys.version.split()[0], "argv": sys.argv, "pid": os.getpid(),
                     "world_size": self.world, "dry_run": a.dry_run, "fake": a.fake})
        meta["default_level"] = default_level(a.ethand)
        if a.fake:
            self.trainer = FakeTrainer(a)
            meta.update(FakeTrainer.desc)
            return True
        import torch
        meta["torch"] = torch.__version__
        meta["torch_cuda"] = torch.version.cuda
        if a.device == "cuda":
            if not torch.cuda.is_available():
                self.note("CUDA is not available", "errors")
                return False
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            dev = torch.device("cuda", local)
            meta["gpu"] = torch.cuda.get_device_name(dev)
            try:
                v = torch.cuda.nccl.version()
                meta["nccl"] = ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
            except Exception as e:  # noqa: BLE001
                meta["nccl"] = f"unknown ({e})"
        else:
            dev = torch.device("cpu")
            torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        if self.ddp:
            import torch.distributed as dist
            if self.world < 2:
                self.note("--workload ddp needs WORLD_SIZE >= 2 (run it under torch.distributed.run)", "errors")
                return False
            backend = "nccl" if dev.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
            self.dist = dist
            self.torch = torch
            self.cdev = dev
            meta["backend"] = backend
        t0 = time.monotonic()
        self.trainer = TorchTrainer(a, dev, self.ddp)
        meta.update(self.trainer.desc)
        meta["setup_s"] = round(time.monotonic() - t0, 1)
        meta["mapped_runtime_files"] = sorted(mapped_runtime_files().values())
        return True

    # -- a timed segment
    def steps(self, n, times=None):
        if times is None:
            for _ in range(n):
                self.trainer.step()
            return
        # Per-step wall time as the host sees it (launches are asynchronous: in a launch-bound
        # loop this is the step's CPU side plus any wait for the GPU's queue to drain).
        clock = time.perf_counter
        t = clock()
        for _ in range(n):
            self.trainer.step()
            t1 = clock()
            times.append(t1 - t)
            t = t1

    def timed(self, n, warmup, profiler=False):
        tr = self.trainer
        prof = tr.profiler() if profiler else contextlib.nullcontext()
        d = {}
        prof.__enter__()
        try:
            self.steps(warmup)
            tr.sync()
            dstats0 = self.daemon.proc_stats() if self.is0 else None
            tr.data_wait = 0.0
            t0 = time.perf_counter()
            # CPU time of this process (all its threads, not the DataLoader workers): what
            # ethand's probes add in the process's own context (traps, hooks) shows here,
            # free of the host's CPU steal and of run-queue luck that make steps/s noisy.
            c0 = time.process_time()
            steal0 = host_steal_s()
            ref0 = self.ref.counts() if self.ref.active else None
            times = []
            self.steps(n, times)
            tr.sync()
            el = time.perf_counter() - t0
            ref1 = self.ref.counts() if self.ref.active else None
            cpu = time.process_time() - c0
            steal1 = host_steal_s()
            dstats1 = self.daemon.proc_stats() if self.is0 else None
        finally:
            tx = time.perf_counter()
            prof.__exit__(None, None, None)
            if profiler:
                d["profiler_exit_s"] = round(time.perf_counter() - tx, 3)
        d.update({"steps": n, "elapsed_s": round(el, 4), "steps_per_s": n / el,
                  "cpu_ms_per_step": cpu * 1000 / n, **step_time_stats(times),
                  "data_wait_s": round(tr.data_wait, 4), "loss": tr.loss()})
        if ref0 and ref1:
            d["ref_units_per_s"] = [round((b - a) / el, 1) for a, b in zip(ref0, ref1)]
        if steal0 is not None and steal1 is not None:
            d["host_steal_pct"] = round((steal1 - steal0) / (el * (os.cpu_count() or 1)) * 100, 3)
        if dstats1:
            d["daemon"] = dict(dstats1)
            if dstats0 and "cpu_s" in dstats0 and "cpu_s" in dstats1:
                d["daemon"]["cpu_s_segment"] = round(dstats1["cpu_s"] - dstats0["cpu_s"], 3)
        return d

    # -- mode switch (rank 0), then the attach wait on every rank
    def enter_mode(self, mode):
        """Rank 0: stop/start/switch the daemon. Returns (ok, note)."""
        if mode in ("none", "profiler"):
            if self.daemon.alive() or self.daemon.proc is not None:
                rc = self.daemon.stop()
                return True, ("" if rc in (0, None) else f"daemon stopped with exit {rc}")
            return True, ""
        return self.daemon.ensure(mode)

    def segment(self, rnd, idx, mode, prev, n, warmup):
        t0 = time.monotonic()
        self.barrier()
        sw = self.enter_mode(mode) if self.is0 else None
        sw = self.bcast(sw)
        seg = {"round": rnd, "index": idx, "mode": mode, "prev_mode": prev, "ok": bool(sw[0])}
        if sw[1]:
            seg["switch_note"] = sw[1]
        if not sw[0]:
            seg["error"] = "mode switch failed: " + sw[1]
            log(f"round {rnd} {mode}: {seg['error']}")
            seg["wall_s"] = round(time.monotonic() - t0, 2)
            return seg
        attach = None
        if mode in ETHAND_MODES:
            attach = wait_attached(self.daemon, mode, self.a.attach_timeout)
            if attach["ok"]:
                time.sleep(self.a.settle)
        attaches = self.gather(attach)
        if mode in ETHAND_MODES:
            seg["attach"] = attaches if self.ddp else attaches[0]
            bad = [x for x in attaches if not (x or {}).get("ok")]
            if bad:
                msg = bad[0]["detail"]
                if self.a.dry_run or self.a.fake:
                    seg["attach_note"] = "dry run: timed anyway: " + msg
                else:
                    seg["ok"] = False
                    seg["error"] = "not attached: " + msg
                log(f"round {rnd} {mode}: attach wait: {msg}")
        seg["switch_s"] = round(time.monotonic() - t0, 2)
        self.barrier()
        try:
            r = self.timed(n, warmup, profiler=(mode == "profiler"))
        except Exception as e:  # noqa: BLE001 -- a failing mode is recorded, the run goes on
            r = {"error": f"{type(e).__name__}: {e}"}
            log(f"round {rnd} {mode}: training failed: {r['error']}")
        rs = self.gather(r)
        if any("error" in x for x in rs):
            seg["ok"] = False
            seg["error"] = "; ".join(x["error"] for x in rs if "error" in x)
        else:
            sps = [x["steps_per_s"] for x in rs]
            seg.update({"steps": n, "warmup": warmup, "steps_per_s": min(sps),
                        "steps_per_s_ranks": [round(s, 3) for s in sps],
                        "elapsed_s": max(x["elapsed_s"] for x in rs),
                        "cpu_ms_per_step": max(x.get("cpu_ms_per_step", 0) for x in rs),
                        # The slowest rank's typical step bounds a DDP step, as min(steps/s) does.
                        **{k: max(x.get(k, 0) for x in rs) for k in STEP_TIME_KEYS},
                        "step_ms": rs[0].get("step_ms", []),
                        "data_wait_s": max(x["data_wait_s"] for x in rs),
                        "loss": rs[0]["loss"]})
            for k in ("daemon", "profiler_exit_s", "host_steal_pct", "ref_units_per_s"):
                if k in rs[0]:
                    seg[k] = rs[0][k]
        seg["wall_s"] = round(time.monotonic() - t0, 2)
        if self.is0:
            log(f"round {rnd} [{mode}] " + (f"{seg['steps_per_s']:.2f} steps/s ranks {seg['steps_per_s_ranks']} "
                                            f"data wait {seg['data_wait_s']:.3f}s" if "steps_per_s" in seg else seg.get("error", "")))
        return seg

    # -- the plan
    def plan(self):
        """Rank 0: calibrate N (steps per segment) and size rounds to the deadline."""
        a = self.a
        modes = [m for m in a.modes.split(",") if m]
        for m in modes:
            if m not in MODES_ALL:
                raise SystemExit(f"unknown mode {m!r} (known: {', '.join(MODES_ALL)})")
        # Calibration in the starting state (no daemon): long warm-up (cuDNN autotune, allocator,
        # DataLoader workers), then ~a.calib_s of steps.
        self.barrier()
        t0 = time.monotonic()
        self.steps(a.first_warmup)
        self.trainer.sync()
        n = 0
        tc = time.perf_counter()
        while True:
            self.steps(5)
            n += 5
            self.trainer.sync()
            # every rank must run the same number of steps (DDP): rank 0 decides when to stop
            done = self.bcast((time.perf_counter() - tc) >= a.calib_s or n >= 100000)
            if done:
                break
        rate = n / (time.perf_counter() - tc)
        warm_s = time.monotonic() - t0
        p = {"modes": modes, "calibration_steps_per_s": round(rate, 2), "first_warmup_s": round(warm_s, 1)}
        if self.is0:
            # The final segment (BPF statistics, event counts) runs after the rounds.
            left = a.deadline - time.time() - a.reserve_s - (a.stats_need_s if a.stats_config else 0)
            seg_s, rounds = a.seg_s, a.rounds

            def est(seg_s, rounds):
                # Overheads measured on the H200 machine (run 17, medians): a segment took
                # 0.75 s beyond its warm-up and timed steps with the daemon stopped, 1.35 s
                # when the daemon was started and its attach awaited (the settle time
                # included). The loop below still stops at the deadline if they grow.
                per = sum(seg_s + a.warmup / rate
                          + (12 if m == "profiler" else 0.8 + (a.settle + 0.1 if m in ETHAND_MODES else 0))
                          for m in modes)
                return rounds * per

            while est(seg_s, rounds) > left and seg_s > a.min_seg_s:
                seg_s = max(a.min_seg_s, seg_s * 0.8)
            while est(seg_s, rounds) > left and rounds > 2:
                rounds -= 1
            n_steps = max(a.min_steps, int(round(rate * seg_s)))
            p.update({"rounds_wanted": a.rounds, "rounds": rounds, "seg_s_wanted": a.seg_s,
                      "seg_s": round(seg_s, 2), "steps_per_segment": n_steps, "warmup_steps": a.warmup,
                      "time_left_s": round(left, 1), "estimate_s": round(est(seg_s, rounds), 1)})
            if seg_s < a.seg_s or rounds < a.rounds:
                what = ([f"segment {a.seg_s:.1f}s -> {seg_s:.1f}s"] if seg_s < a.seg_s else []) + \
                    ([f"rounds {a.rounds} -> {rounds}"] if rounds < a.rounds else [])
                self.res["notes"].append(f"scaled down to fit the time budget ({left:.0f}s left after set-up): "
                                         + ", ".join(what))
        p = self.bcast(p)
        self.res["plan"] = p
        self.save()
        log(f"plan: {json.dumps(p)}")
        return p

    def run(self):
        a = self.a
        if not self.setup():
            self.save()
            return 1
        self.save()
        if self.is0 and self.daemon.alive():
            self.daemon.stop()
        p = self.plan()
        modes, rounds, n = p["modes"], p["rounds"], p["steps_per_segment"]
        cost = self.cost = {}  # measured wall time per mode (switch + warm-up + timed + profiler exit)
        prev = "none"
        stop = False
        for r in range(rounds):
            k = r % len(modes)
            order = modes[k:] + modes[:k]
            for i, m in enumerate(order):
                if self.is0:
                    seen = statistics.mean(cost.values()) if cost else 0
                    need = cost.get(m, max(p["seg_s"] + 5, seen) + (15 if m == "profiler" else 0))
                    left = a.deadline - time.time() - a.reserve_s - (a.stats_need_s if a.stats_config else 0)
                    go = left >= need
                    if not go:
                        rest = [f"round {r} {x}" for x in order[i:]] + [f"round {rr} (all)" for rr in range(r + 1, rounds)]
                        self.res["skipped"].append(f"time budget ({left:.0f}s left, next segment needs ~{need:.0f}s): "
                                                   + ", ".join(rest))
                else:
                    go = None
                if not self.bcast(go):
                    stop = True
                    break
                seg = self.segment(r, i, m, prev, n, a.warmup)
                cost[m] = seg["wall_s"]
                prev = m
                self.res["segments"].append(seg)
                self.save()
            if stop:
                break
        self.final_status()
        self.save()
        return 0

    def tree_snapshot(self):
        return tree_snapshot_of(self.daemon, os.getpid())

    def final_status(self):
        """Status at the end: one more segment at the default level with the kernel's BPF
        statistics on (not part of the comparison: they cost ~100 ns per probe run), so that
        status.json shows the probes' run counts and ns per run during this training loop."""
        a = self.a
        lv = self.res["meta"].get("default_level") or "process"
        go = None
        if self.is0:
            left = a.deadline - time.time()
            cost = getattr(self, "cost", None) or {}
            need = max(a.stats_need_s, cost.get(lv, statistics.mean(cost.values()) if cost else 0) + 5)
            go = bool(a.stats_config) and left > need
            if not go and a.stats_config:
                self.res["skipped"].append(f"final segment with BPF statistics ({left:.0f}s left, needs ~{need:.0f}s)")
        go = self.bcast(go)
        st = None
        if go:
            ok = None
            if self.is0:
                self.daemon.stop()
                ok, msg = self.daemon.start(lv, label=f"BPF statistics on, gpu.level = {lv}", cfg=a.stats_config)
                if not ok:
                    self.note(f"stats daemon: {msg}", "errors")
            ok = self.bcast(ok)
            if ok:
                att = wait_attached(self.daemon, lv, a.attach_timeout)
                self.gather(att)
                self.barrier()
                # What ethand saw this process tree do over the segment (warm-up included):
                # the events per step that the report's cost estimate multiplies out.
                snap0 = self.tree_snapshot() if self.is0 else None
                try:
                    r = self.timed(max(1, p_steps(self.res)), a.warmup)
                except Exception as e:  # noqa: BLE001
                    r = {"error": repr(e)}
                snap1 = self.tree_snapshot() if self.is0 else None
                rs = self.gather(r)
                if self.is0:
                    seg = {"mode": f"{lv}+bpf_stats", "extra": True, "attach": att,
                           "steps_per_s_ranks": [round(x.get("steps_per_s", 0), 3) for x in rs]}
                    seg.update({k: rs[0][k] for k in ("daemon", "error", "step_ms_median") if k in rs[0]})
                    if "error" not in rs[0]:
                        ev = event_counts(snap0, snap1, os.getpid(), max(1, p_steps(self.res)) + a.warmup)
                        if ev:
                            seg["events_per_step"] = ev
                        else:
                            self.note("final segment: no ethand snapshot of this process tree for the event counts")
                    self.res["final_segment"] = seg
        if self.is0:
            if self.daemon.alive():
                st, err = self.daemon.status()
                if st is None:
                    self.note(f"final ethand status failed: {err}", "errors")
                self.daemon.stop()
            if st is not None and a.status_out:
                write_json_atomic(a.status_out, st)
        self.barrier()


def tree_snapshot_of(daemon, pid):
    rc, out, err = daemon.cli("snapshot", "--pid", str(pid), "--json", timeout=20)
    if rc != 0:
        log(f"ethand snapshot failed ({rc}): {(err or out).strip()[:200]}")
        return None
    try:
        return json.loads(out)
    except ValueError:
        return None


def tree_counts(snap, pid):
    """Cumulative counts of the training process (`proc`: all its threads) and of its tree
    (`tree`: the DataLoader workers too) from `ethand snapshot --json`."""
    procs = snap.get("processes") or []
    root = next((p for p in procs if p.get("pid") == pid), None)
    if root is None:
        return None

    def of(p):
        sc, sch, gpu = p.get("syscalls") or {}, p.get("sched") or {}, p.get("gpu") or {}
        return {"syscalls": sc.get("count", 0),
                "switches": sch.get("voluntary_switches", 0) + sch.get("involuntary_switches", 0),
                "uprobe_calls": sum(x.get("calls", 0) for x in gpu.get("symbols") or [])}

    main = next((t for t in root.get("threads") or [] if t.get("tid") == pid), {})
    ms = main.get("sched") or {}
    tree = {"syscalls": 0, "switches": 0, "uprobe_calls": 0}
    for p in procs:
        for k, v in of(p).items():
            tree[k] += v
    return {"proc": of(root), "tree": tree,
            "main_thread_switches": ms.get("voluntary_switches", 0) + ms.get("involuntary_switches", 0)}


def event_counts(s0, s1, pid, steps):
    """Per step, between two snapshots: syscalls, switches and probed GPU calls (uprobe
    hits) of the training process and of its whole tree; None without both snapshots."""
    c0 = tree_counts(s0, pid) if s0 else None
    c1 = tree_counts(s1, pid) if s1 else None
    if not c0 or not c1:
        return None
    d = lambda a, b: {k: (b[k] - a[k]) / steps for k in a}  # noqa: E731
    return {"steps": steps, "proc": d(c0["proc"], c1["proc"]), "tree": d(c0["tree"], c1["tree"]),
            "main_thread_switches": (c1["main_thread_switches"] - c0["main_thread_switches"]) / steps}


def p_steps(res):
    return (res.get("plan") or {}).get("steps_per_segment") or 1


def default_level(ethand):
    """gpu.level of the embedded default configuration (`ethand config default`)."""
    try:
        r = subprocess.run([ethand, "config", "default"], capture_output=True, text=True, timeout=20)
        sect = None
        for line in r.stdout.splitlines():
            s = line.strip()
            if s.startswith("["):
                sect = s.strip("[]")
            m = re.match(r'level\s*=\s*"(\w+)"', s)
            if sect == "gpu" and m:
                return m.group(1)
    except (OSError, subprocess.SubprocessError):
        pass
    return "process"


def cmd_run(argv):
    ap = argparse.ArgumentParser(prog="train_bench.py run")
    ap.add_argument("--workload", choices=("single", "ddp"), default="single")
    ap.add_argument("--model", choices=("transformer", "resnet"), default="transformer")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="small model, short segments, attach timeouts not fatal")
    ap.add_argument("--fake", action="store_true", help="no torch: a busy loop per step (control flow only)")
    ap.add_argument("--modes", default=",".join(MODES_ALL))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seg-s", type=float, default=6.0, help="wanted timed seconds per segment (N from calibration)")
    ap.add_argument("--min-seg-s", type=float, default=2.0)
    ap.add_argument("--min-steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps at the start of every segment")
    ap.add_argument("--first-warmup", type=int, default=40)
    ap.add_argument("--calib-s", type=float, default=2.0)
    ap.add_argument("--deadline", type=float, default=0, help="unix time by which the run must be done")
    ap.add_argument("--budget-s", type=float, default=240, help="used when --deadline is not given")
    ap.add_argument("--reserve-s", type=float, default=15, help="kept free before the deadline for the end")
    ap.add_argument("--stats-need-s", type=float, default=20)
    ap.add_argument("--attach-timeout", type=float, default=20)
    ap.add_argument("--settle", type=float, default=0.5, help="seconds after the attach before warm-up")
    ap.add_argument("--speed-ref", type=int, default=0, help="reference processes measuring the host's CPU "
                    "speed, each on a CPU of its own (the last N); 0: none")
    # model
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--batch", type=int, default=0, help="0: 32 (transformer) / 64 (resnet); 8 in a dry run")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)  # 2 in a dry run
    ap.add_argument("--sample-work", type=int, default=4)
    # ethand
    ap.add_argument("--ethand", default=".device-bin/ethand")
    ap.add_argument("--config-prefix", required=True, help="PREFIX-LEVEL.toml: one config per level")
    ap.add_argument("--stats-config", default="", help="config with bpf_stats = always (final segment)")
    ap.add_argument("--listen", default="127.0.0.1:9479")
    ap.add_argument("--daemon-log", default="daemon.log")
    ap.add_argument("--pidfile", default="")
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--status-out", default="")
    a = ap.parse_args(argv)
    if not a.deadline:
        a.deadline = time.time() + a.budget_s
    if a.fake:
        a.device = "cpu"
    if a.dry_run:  # CPU-sized defaults unless given explicitly
        given = set(x.split("=")[0] for x in argv if x.startswith("--"))
        for k, v in (("--d-model", 64), ("--layers", 2), ("--heads", 4), ("--seq", 32), ("--vocab", 512),
                     ("--image", 32), ("--width", 16), ("--workers", 2), ("--seg-s", 1.5), ("--min-seg-s", 0.5),
                     ("--warmup", 3), ("--first-warmup", 5), ("--calib-s", 1.0), ("--attach-timeout", 4),
                     ("--min-steps", 5), ("--stats-need-s", 8), ("--reserve-s", 5)):
            if k not in given:
                setattr(a, k[2:].replace("-", "_"), v)
        if a.device == "cpu":
            a.precision = "fp32"  # bf16 autocast on a CPU is slow and proves nothing here
    if not a.batch:
        a.batch = (8 if a.dry_run else 32) if a.model == "transformer" else (8 if a.dry_run else 64)
    a.ethand = os.path.abspath(a.ethand)
    b = Bench(a)
    b.ref = SpeedRef(a.speed_ref, spawn=b.is0)
    b.res["meta"]["speed_ref_cpus"] = b.ref.cpus if b.ref.active or not b.is0 else []
    if b.ref.note:
        b.note(b.ref.note)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    rc = 1
    try:
        rc = b.run()
    except BaseException as e:  # noqa: BLE001 -- record, stop the daemon, re-raise nothing
        b.res["errors"].append(f"run aborted: {type(e).__name__}: {e}")
        log(f"run aborted: {type(e).__name__}: {e}")
        rc = 1 if not isinstance(e, SystemExit) else (e.code if isinstance(e.code, int) else 1)
    finally:
        if b.is0:
            with contextlib.suppress(Exception):
                b.daemon.stop()
            b.res["meta"]["run_s"] = round(time.monotonic() - T_START, 1)
            b.save()
        with contextlib.suppress(Exception):
            b.trainer.close()
        b.ref.close()
        if b.dist:
            with contextlib.suppress(Exception):
                b.dist.destroy_process_group()
    return rc


# ----------------------------------------------------------------------------------- report
def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=1):
    return "—" if x is None else f"{x:,.{nd}f}"


def pct(x):
    return "—" if x is None else f"{x:+.2f} %"


# Paired rounds needed before the verdict uses the bootstrap interval: with fewer, resampling
# says little and the half-range rule stands.
CI_MIN_ROUNDS = 6


def log_pct(x):
    """A % change of steps/s as 100 ln(ratio): symmetric, so means do not drift with scatter
    (a plain mean of % changes leans toward "faster": x/y - 1 averages above 0 when y scatters)."""
    return 100 * math.log(1 + x / 100)


def boot_ci(xs, n=10000, alpha=0.05, seed=1):
    """95 % percentile-bootstrap interval of the median of xs (rounds resampled with
    replacement; fixed seed, so the report is reproducible from its JSON)."""
    rng = random.Random(seed)
    k = len(xs)
    bs = sorted(statistics.median(rng.choices(xs, k=k)) for _ in range(n))
    return bs[int(n * alpha / 2)], bs[int(n * (1 - alpha / 2)) - 1]


def ols(pairs):
    """Least squares y = a + b x: (a, b); b = 0 when x does not vary."""
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    b = sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def corr(pairs):
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0


def boot_ci_intercept(pairs, n=10000, alpha=0.05, seed=1):
    """95 % percentile-bootstrap interval of the least-squares intercept (rounds resampled
    with replacement, as whole (x, y) pairs; fixed seed)."""
    rng = random.Random(seed)
    k = len(pairs)
    bs = sorted(ols(rng.choices(pairs, k=k))[0] for _ in range(n))
    return bs[int(n * alpha / 2)], bs[int(n * (1 - alpha / 2)) - 1]


def speed_adjusted(sm, none_segs, paired_by_round):
    """Per round: x = the reference's change in units/s (mode vs that round's none), y = the
    paired change in steps/s. The intercept of y on x is the change at unchanged host speed."""
    def rate(seg):
        v = seg.get("ref_units_per_s")
        return sum(v) / len(v) if v else None
    out = {}
    xs = {}
    for r in sorted(paired_by_round):
        a, b = rate(sm[r]), rate(none_segs[r])
        if a and b:
            xs[r] = (a / b - 1) * 100
    if not xs:
        return out
    pairs = [(xs[r], paired_by_round[r]) for r in sorted(xs)]
    out["ref_paired_pct"] = [x for x, _ in pairs]
    out["ref_paired_median_pct"] = med(out["ref_paired_pct"])
    if len(pairs) >= CI_MIN_ROUNDS:
        out["ref_paired_ci_pct"] = boot_ci(out["ref_paired_pct"])
        a, b = ols(pairs)
        out.update({"adj_pct": a, "adj_slope": b, "adj_r": corr(pairs), "adj_ci_pct": boot_ci_intercept(pairs),
                    "adj_rounds": len(pairs)})
    return out


def analyse(run):
    """Per mode: samples by round, medians, change vs none, paired per-round changes."""
    segs = [s for s in run.get("segments") or [] if not s.get("extra")]
    modes = (run.get("plan") or {}).get("modes") or []
    by = {m: {} for m in modes}
    failed = {m: [] for m in modes}
    for s in segs:
        m = s.get("mode")
        by.setdefault(m, {})
        failed.setdefault(m, [])
        if s.get("ok") and s.get("steps_per_s"):
            by[m][s["round"]] = s
        else:
            failed[m].append(f"round {s.get('round')}: {s.get('error', 'failed')}")
    none = {r: s["steps_per_s"] for r, s in by.get("none", {}).items()}
    none_med = med(list(none.values()))
    noise = None
    if len(none) >= 2 and none_med:
        noise = (max(none.values()) - min(none.values())) / none_med * 100 / 2  # half-range, %
    rows = []
    for m in by:
        sm = by[m]
        vals = [sm[r]["steps_per_s"] for r in sorted(sm)]
        mm = med(vals)
        row = {"mode": m, "samples": {r: sm[r]["steps_per_s"] for r in sorted(sm)}, "median": mm,
               "failed": failed.get(m, [])}
        if none_med and mm is not None:
            row["change_pct"] = (mm - none_med) / none_med * 100  # negative: slower than none
        paired_by_round = {r: (sm[r]["steps_per_s"] - none[r]) / none[r] * 100 for r in sorted(sm) if r in none}
        paired = list(paired_by_round.values())
        if paired and m != "none":
            row["paired_pct"] = paired
            row["paired_median_pct"] = med(paired)
            if len(paired) >= CI_MIN_ROUNDS:
                row["paired_ci_pct"] = boot_ci(paired)
                # The throughput ratio's geometric mean (see log_pct).
                logs = [log_pct(x) for x in paired]
                lm = statistics.mean(logs)
                se = statistics.stdev(logs) / len(logs) ** 0.5
                row["paired_logmean_pct"] = lm
                row["paired_logmean_ci_pct"] = (lm - 1.96 * se, lm + 1.96 * se)
            row.update(speed_adjusted(sm, by.get("none", {}), paired_by_round))
        refs = [sum(v) / len(v) for v in (sm[r].get("ref_units_per_s") for r in sm) if v]
        if refs:
            row["ref_units_per_s"] = med(refs)
        cpu = {r: sm[r]["cpu_ms_per_step"] for r in sm if sm[r].get("cpu_ms_per_step")}
        if cpu:
            row["cpu_ms_per_step"] = med(list(cpu.values()))
            none_cpu = {r: s["cpu_ms_per_step"] for r, s in by.get("none", {}).items() if s.get("cpu_ms_per_step")}
            cp = [(cpu[r] - none_cpu[r]) / none_cpu[r] * 100 for r in sorted(cpu) if r in none_cpu]
            if cp and m != "none":
                row["cpu_paired_median_pct"] = med(cp)
                if len(cp) >= CI_MIN_ROUNDS:
                    row["cpu_paired_ci_pct"] = boot_ci(cp)
        # The typical step: each segment's median step time, paired like steps/s and signed
        # like it (negative: slower). Stalls (a long step now and then, whatever their cause)
        # move a segment's mean, not its median; the primary verdict stays the mean's (steps/s).
        stm = {r: sm[r]["step_ms_median"] for r in sm if sm[r].get("step_ms_median")}
        if stm:
            row["step_ms_median"] = med(list(stm.values()))
            none_stm = {r: s["step_ms_median"] for r, s in by.get("none", {}).items() if s.get("step_ms_median")}
            sp = [(none_stm[r] / stm[r] - 1) * 100 for r in sorted(stm) if r in none_stm]
            if sp and m != "none":
                row["step_paired_pct"] = sp
                row["step_paired_median_pct"] = med(sp)
                if len(sp) >= CI_MIN_ROUNDS:
                    row["step_paired_ci_pct"] = boot_ci(sp)
            row["step_ms_p99"] = med([sm[r]["step_ms_p99"] for r in sm if "step_ms_p99" in sm[r]])
            row["stall_pct"] = med([sm[r].get("stall_ms", 0) / 10 / sm[r]["elapsed_s"] for r in sm
                                    if "stall_ms" in sm[r] and sm[r].get("elapsed_s")])
        stl = [sm[r]["host_steal_pct"] for r in sm if "host_steal_pct" in sm[r]]
        if stl:
            row["host_steal_pct"] = med(stl)
        dw = [sm[r].get("data_wait_s", 0) / sm[r]["elapsed_s"] * 100 for r in sm if sm[r].get("elapsed_s")]
        row["data_wait_pct"] = med(dw)
        ds = [sm[r]["daemon"] for r in sorted(sm) if sm[r].get("daemon")]
        if ds:
            row["daemon_rss_mib_max"] = max(d.get("rss_bytes", 0) for d in ds) / 2**20
            cs = [d["cpu_s_segment"] / sm[r]["elapsed_s"] * 100 for r, d in
                  ((r, sm[r]["daemon"]) for r in sorted(sm) if sm[r].get("daemon")) if "cpu_s_segment" in d]
            row["daemon_cpu_pct"] = med(cs)
        pe = [sm[r]["profiler_exit_s"] for r in sm if "profiler_exit_s" in sm[r]]
        if pe:
            row["profiler_exit_s"] = med(pe)
        rows.append(row)
    # none samples right after a profiler segment vs the others (CUPTI left behind?)
    after_prof = [s["steps_per_s"] for s in by.get("none", {}).values() if s.get("prev_mode") == "profiler"]
    other = [s["steps_per_s"] for s in by.get("none", {}).values() if s.get("prev_mode") != "profiler"]
    return {"rows": rows, "none_median": none_med, "noise_pct": noise, "none_after_profiler": after_prof,
            "none_other": other}


def verdict(an, level, limit=1.0):
    row = next((r for r in an["rows"] if r["mode"] == level), None)
    noise = an["noise_pct"]
    if row is None or row.get("median") is None or an["none_median"] is None:
        return f"inconclusive (no {level} or none samples)", None
    slow = -row.get("paired_median_pct", row.get("change_pct"))  # % slower than none (paired, median)
    if "paired_ci_pct" in row:
        lo, hi = row["paired_ci_pct"]  # changes: negative is slower
        slow_hi, slow_lo = -lo, -hi
        if slow_hi <= limit:
            v = "PASS"
        elif slow_lo > limit:
            v = "FAIL"
        else:
            v = "inconclusive"
        return (f"{v} ({level} is {abs(slow):.2f} % {'slower' if slow >= 0 else 'faster'} than none "
                f"(median of {len(row['paired_pct'])} per-round paired changes); 95 % bootstrap interval of "
                f"that median: {slow_lo:+.2f} % to {slow_hi:+.2f} % slower; PASS needs the whole interval "
                f"<= {limit:g} %, FAIL all of it > {limit:g} %; half the spread of the none rounds, the rule "
                f"for fewer than {CI_MIN_ROUNDS} rounds, is ±{noise:.2f} %)"), slow
    if noise is None:
        return (f"inconclusive (one none round: no noise estimate; {level} is {abs(slow):.2f} % "
                f"{'slower' if slow >= 0 else 'faster'})"), slow
    if slow + noise <= limit:
        v = "PASS"
    elif slow - noise > limit:
        v = "FAIL"
    else:
        v = "inconclusive"
    return (f"{v} ({level} is {abs(slow):.2f} % {'slower' if slow >= 0 else 'faster'} than none "
            f"(median of the per-round paired changes); "
            f"noise ±{noise:.2f} % (half the spread of the none rounds); PASS needs slowdown + noise <= {limit:g} %, "
            f"FAIL slowdown - noise > {limit:g} %)"), slow


def adjusted_verdict(an, level, limit=1.0):
    """The verdict rule applied to the speed-adjusted change (the intercept), with the check
    that ethand did not move the reference itself."""
    row = next((r for r in an["rows"] if r["mode"] == level), None)
    if row is None or "adj_ci_pct" not in row:
        return None, None
    slow = -row["adj_pct"]
    lo, hi = row["adj_ci_pct"]
    slow_hi, slow_lo = -lo, -hi
    v = "PASS" if slow_hi <= limit else "FAIL" if slow_lo > limit else "inconclusive"
    rlo, rhi = row["ref_paired_ci_pct"]
    # ethand slowing the reference would make the adjustment credit ethand with a slower host.
    bias = rhi < 0
    text = (f"{v} ({level} is {abs(slow):.2f} % {'slower' if slow >= 0 else 'faster'} than none at unchanged "
            f"host speed: intercept of the per-round paired change in steps/s on the reference's paired change "
            f"in units/s, {row['adj_rounds']} rounds, slope {row['adj_slope']:.2f}, correlation "
            f"{row['adj_r']:.2f}; 95 % bootstrap interval {slow_lo:+.2f} % to {slow_hi:+.2f} % slower. "
            f"Reference speed in {level} vs none: {row['ref_paired_median_pct']:+.2f} % (95 % CI {rlo:+.2f} to "
            f"{rhi:+.2f})"
            + ("; ethand slowed the reference, so this adjustment is not trusted)" if bias else
               ": ethand did not measurably slow the reference)"))
    return text, (None if bias else v)


def typical_step_line(an, level, limit=1.0):
    """The verdict rule applied to the typical step (median step time), for information."""
    row = next((r for r in an["rows"] if r["mode"] == level), None)
    if row is None or "step_paired_ci_pct" not in row:
        return None
    slow = -row["step_paired_median_pct"]
    lo, hi = row["step_paired_ci_pct"]
    slow_hi, slow_lo = -lo, -hi
    v = "PASS" if slow_hi <= limit else "FAIL" if slow_lo > limit else "inconclusive"
    return (f"Typical step, for information (not the target's verdict): {level}'s median step time is "
            f"{abs(slow):.2f} % {'slower' if slow >= 0 else 'faster'} than none's (median of "
            f"{len(row['step_paired_pct'])} per-round paired changes; 95 % bootstrap interval {slow_lo:+.2f} % to "
            f"{slow_hi:+.2f} % slower): by the same rule, {v}. Stalls move a segment's steps/s, not its median "
            f"step; a cost of ethand's that came as stalls would show in steps/s and in the stall column, not here.")


def event_cost_lines(fs, costs, an):
    """The bottom-up estimate: the events ethand saw the training process make per step (final
    segment), times ethand's added cost per event measured on the same machine, against the
    step time. Counted as if every event of the process, on any of its threads, lay on the
    step's critical path: an upper bound for its own events (most are in other threads)."""
    ev = fs["events_per_step"]
    pr, tr = ev["proc"], ev["tree"]
    L = [f"- events per step (final segment, {ev['steps']} steps, from `ethand snapshot --pid`): training process "
         f"{pr['syscalls']:.1f} syscalls, {pr['switches']:.1f} context switches ({ev['main_thread_switches']:.1f} "
         f"of its main thread), {pr['uprobe_calls']:.2f} probed GPU calls (uprobe hits); with its DataLoader "
         f"workers {tr['syscalls']:.1f} syscalls, {tr['switches']:.1f} switches"]
    if not costs:
        return L + ["- bottom-up estimate: no per-event costs given (`--event-costs`)", ""]
    if "error" in costs:
        return L + [f"- bottom-up estimate: per-event costs unreadable: {costs['error']}", ""]
    none = next((r for r in an["rows"] if r["mode"] == "none"), {}) if an else {}
    step_ms = none.get("step_ms_median") or fs.get("step_ms_median")
    def bound(key):
        # Each cost at the top of its noise, never below 0: a cost measured as negative
        # (noise larger than the effect) must not make the estimate smaller.
        c = costs.get(f"{key}_ns")
        return None if c is None else max(0.0, c + (costs.get(f"{key}_noise_ns") or 0.0))

    parts = {"syscalls": (pr["syscalls"], bound("syscall"), costs.get("syscall_ns")),
             "switches": (pr["switches"], bound("switch"), costs.get("switch_ns")),
             "uprobe hits": (pr["uprobe_calls"], bound("uprobe"), costs.get("uprobe_ns"))}
    if not step_ms or any(c is None for _, c, _ in parts.values()):
        return L + [f"- bottom-up estimate: missing a step time or a cost ({costs})", ""]
    total_ms = sum(n * c for n, c, _ in parts.values()) / 1e6
    pct_ = total_ms / step_ms * 100
    detail = ", ".join(f"{k} {n:.1f} x {c:,.0f} ns (measured {m:+,.0f}"
                       + (f" ±{costs.get(k2 + '_noise_ns'):,.0f}" if costs.get(k2 + "_noise_ns") is not None else "")
                       + f") = {n * c / 1e3:,.1f} µs"
                       for (k, (n, c, m)), k2 in zip(parts.items(), ("syscall", "switch", "uprobe")))
    L.append(f"- **bottom-up estimate at the default level: {total_ms * 1e3:,.1f} µs of added work per step = "
             f"{pct_:.2f} % of the {step_ms:.2f} ms median step** ({detail}; each cost taken at the top of its "
             f"noise, never below 0; per-event costs: {costs.get('source', '?')}). "
             "An upper bound for the training process's own events: it counts every one of them as if it lay on "
             "the step's critical path, though most are made by threads other than the one that launches "
             "the step's work. It leaves out what the daemon's own CPU use takes from the machine (its "
             "column above) and cache effects.")
    an_est = {"events_per_step": ev, "costs": costs, "added_us_per_step": total_ms * 1e3, "pct_of_step": pct_}
    if an is not None:
        an["bottom_up"] = an_est
    return L + [""]


def cmd_report(argv):
    ap = argparse.ArgumentParser(prog="train_bench.py report")
    ap.add_argument("--run", action="append", default=[], help="LABEL=FILE (run JSON)")
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--gpus", default="")
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE lines for the header")
    ap.add_argument("--event-costs", default="", help="JSON {syscall_ns, switch_ns, uprobe_ns, source}: "
                    "ethand's added cost per event measured on this machine (xtask bench)")
    a = ap.parse_args(argv)
    costs = None
    if a.event_costs:
        try:
            with open(a.event_costs) as f:
                costs = json.load(f)
        except (OSError, ValueError) as e:
            costs = {"error": f"{a.event_costs}: {e}"}
    runs = {}
    for spec in a.run:
        label, _, path = spec.partition("=")
        try:
            with open(path) as f:
                runs[label] = json.load(f)
        except (OSError, ValueError) as e:
            runs[label] = {"workload": label, "errors": [f"no result file {path}: {e}"], "segments": []}
    L = ["# ethand training benchmark", ""]
    L.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.")
    L.append("")
    if a.command:
        L += ["Command:", "", "```", a.command, "```", ""]
    if a.gpus:
        L += ["GPUs (nvidia-smi):", "", "```", a.gpus.strip(), "```", ""]
    for e in a.extra:
        k, _, v = e.partition("=")
        L.append(f"- {k}: {v}")
    if a.extra:
        L.append("")
    L += ["Modes: `none` (no ethand), `system` / `calls` / `process` / `op` (ethand at that GPU level, switched live "
          "with `ethand level`, timed only once `ethand status --json` lists this process's libcuda/libnccl "
          "files attached), `profiler` (no ethand; `torch.profiler.profile(activities=[CPU, CUDA])` around "
          "the timed steps). Modes interleaved: rounds x modes, order rotated every round; one training process "
          "for all rounds. Change vs none: from the medians; paired: per round, mode vs that round's none, "
          "then the median (drift cancels). Verdict: with at least 6 paired rounds, from the 95 % percentile-"
          "bootstrap interval of that median (PASS: the whole interval is at most 1 % slower); with fewer, "
          "from the noise, half the range of the none rounds relative to their median.", ""]
    out = {"generated_unix": time.time(), "command": a.command, "gpus": a.gpus, "runs": runs, "analysis": {}}
    for label, run in runs.items():
        meta, plan = run.get("meta") or {}, run.get("plan") or {}
        L += [f"## {label}", ""]
        if meta:
            L.append(f"- model: {meta.get('model', '?')}; {meta.get('parameters', 0):,} parameters; "
                     f"{meta.get('precision', '?')}; {meta.get('eager', '')}")
            L.append(f"- batch {meta.get('batch', '?')} per rank; world size {meta.get('world_size', 1)}"
                     + (f" ({meta.get('backend')})" if meta.get("backend") else ""))
            L.append(f"- data: {meta.get('data', '?')}")
            L.append(f"- optimizer: {meta.get('optimizer', '?')}")
            L.append(f"- torch {meta.get('torch', '?')} (CUDA {meta.get('torch_cuda', '?')}), NCCL {meta.get('nccl', '?')}, "
                     f"Python {meta.get('python', '?')}; GPU {meta.get('gpu', '?')}"
                     + ("; DRY RUN (CPU)" if meta.get("dry_run") else "") + ("; FAKE trainer" if meta.get("fake") else ""))
            L.append(f"- libraries mapped: {', '.join(meta.get('mapped_runtime_files') or []) or 'none'}")
        if plan:
            L.append(f"- plan: modes {', '.join(plan.get('modes', []))}; {plan.get('rounds')} rounds "
                     f"(wanted {plan.get('rounds_wanted')}); {plan.get('steps_per_segment')} timed steps per "
                     f"segment (~{plan.get('seg_s')} s; calibration {plan.get('calibration_steps_per_s')} steps/s "
                     f"without ethand) after {plan.get('warmup_steps')} warm-up steps; first warm-up "
                     f"{plan.get('first_warmup_s')} s")
        L.append("")
        an = analyse(run) if run.get("segments") else None
        if an:
            out["analysis"][label] = an
            rounds = sorted({r for row in an["rows"] for r in row["samples"]})
            L.append("| mode | median steps/s | per round (" + ", ".join(f"r{r}" for r in rounds) + ") | change vs none "
                     "| paired change (median; per round) | process CPU per step (paired change) | data wait "
                     "| typical step: median step time (paired change) / p99 / stalls | host steal / speed reference "
                     "| daemon RSS max / CPU | failed |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for row in an["rows"]:
                samp = " / ".join(fmt(row["samples"].get(r), 2) for r in rounds)
                paired = ("—" if "paired_pct" not in row else
                          f"{pct(row['paired_median_pct'])}"
                          + (" (95 % CI {:+.2f} to {:+.2f})".format(*row["paired_ci_pct"]) if "paired_ci_pct" in row else "")
                          + "; " + " ".join(f"{x:+.1f}" for x in row["paired_pct"]))
                dmn = ("—" if "daemon_rss_mib_max" not in row else
                       f"{row['daemon_rss_mib_max']:.0f} MiB / {fmt(row.get('daemon_cpu_pct'), 1)} % of a core")
                extra = f" (profiler exit {row['profiler_exit_s']:.1f} s)" if "profiler_exit_s" in row else ""
                cpu = ("—" if "cpu_ms_per_step" not in row else
                       f"{row['cpu_ms_per_step']:.2f} ms"
                       + (f" ({pct(row['cpu_paired_median_pct'])}" if "cpu_paired_median_pct" in row else "")
                       + (", 95 % CI {:+.2f} to {:+.2f}".format(*row["cpu_paired_ci_pct"]) if "cpu_paired_ci_pct" in row else "")
                       + (")" if "cpu_paired_median_pct" in row else ""))
                step = ("—" if "step_ms_median" not in row else
                        f"{row['step_ms_median']:.2f} ms"
                        + (f" ({pct(row['step_paired_median_pct'])}" if "step_paired_median_pct" in row else "")
                        + (", 95 % CI {:+.2f} to {:+.2f}".format(*row["step_paired_ci_pct"])
                           if "step_paired_ci_pct" in row else "")
                        + (")" if "step_paired_median_pct" in row else "")
                        + f" / p99 {fmt(row.get('step_ms_p99'), 2)} ms / stalls {fmt(row.get('stall_pct'), 1)} % of the time")
                steal = "—" if "host_steal_pct" not in row else f"{row['host_steal_pct']:.2f} %"
                if "ref_units_per_s" in row:
                    steal += (f" / ref {row['ref_units_per_s']:,.0f} units/s"
                              + (f" ({pct(row['ref_paired_median_pct'])})" if "ref_paired_median_pct" in row else ""))
                L.append(f"| {row['mode']} | {fmt(row['median'], 2)} | {samp} | "
                         f"{'—' if row['mode'] == 'none' else pct(row.get('change_pct'))} | {paired} | {cpu} | "
                         f"{fmt(row.get('data_wait_pct'), 1)} % | {step} | {steal} | {dmn}{extra} | {len(row['failed']) or ''} |")
            L.append("")
            lv = meta.get("default_level") or "process"
            v, slow = verdict(an, lv)
            an["target"] = {"level": lv, "slowdown_pct": slow, "noise_pct": an["noise_pct"], "verdict": v}
            L.append(f"**Target: default level ({lv}) <= 1% slower: {v}**")
            L.append("")
            av, av_v = adjusted_verdict(an, lv)
            if av:
                an["target"]["speed_adjusted"] = {"verdict": av_v, "text": av}
                L += [f"**Same target, host speed factored out (speed reference): {av}**", ""]
            lrow = next((r for r in an["rows"] if r["mode"] == lv), {})
            if "paired_logmean_ci_pct" in lrow:
                lo, hi = lrow["paired_logmean_ci_pct"]
                L += [f"- Mean of the per-round log ratios of steps/s, for information: {lv} is "
                      f"{-lrow['paired_logmean_pct']:+.2f} % slower (95 % t interval {-hi:+.2f} % to {-lo:+.2f} %); "
                      "`tests/gpu/pool_runs.py` pools these rounds with other runs'.", ""]
            ts = typical_step_line(an, lv)
            if ts:
                an["typical_step"] = ts
                L += [f"- {ts}", ""]
            if an["none_after_profiler"]:
                L.append(f"- none right after a profiler segment: {', '.join(fmt(x, 2) for x in an['none_after_profiler'])} "
                         f"steps/s; other none rounds: {', '.join(fmt(x, 2) for x in an['none_other'])} "
                         "(a difference would mean the profiler leaves a cost behind).")
            dws = [r for r in an["rows"] if (r.get("data_wait_pct") or 0) > 5]
            if dws:
                L.append("- WARNING: the DataLoader made the loop wait > 5 % of the time in "
                         + ", ".join(r["mode"] for r in dws) + ": data loading, not launches, bounds those segments.")
            for row in an["rows"]:
                for f in row["failed"]:
                    L.append(f"- failed: {row['mode']} {f}")
        fs = run.get("final_segment")
        if fs:
            L.append(f"- final segment ({fs.get('mode')}, not in the table; for status.json's per-program BPF cost): "
                     f"{', '.join(fmt(x, 2) for x in fs.get('steps_per_s_ranks') or [])} steps/s"
                     + (f"; daemon RSS {fs['daemon'].get('rss_bytes', 0) / 2**20:.0f} MiB" if fs.get("daemon") else ""))
        if fs and fs.get("events_per_step"):
            L += event_cost_lines(fs, costs, an)
        notes = []
        for s in run.get("segments") or []:
            for k in ("switch_note", "attach_note"):
                if s.get(k):
                    notes.append(f"round {s.get('round')} {s.get('mode')}: {s[k]}")
        for n in (run.get("notes") or []) + notes:
            L.append(f"- note: {n}")
        for n in run.get("skipped") or []:
            L.append(f"- skipped: {n}")
        for n in run.get("errors") or []:
            L.append(f"- error: {n}")
        if run.get("meta", {}).get("run_s"):
            L.append(f"- run time {run['meta']['run_s']} s")
        L.append("")
    with open(a.md, "w") as f:
        f.write("\n".join(L) + "\n")
    write_json_atomic(a.json, out)
    print("\n".join(L))
    return 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "report"):
        print(__doc__, file=sys.stderr)
        print("usage: train_bench.py run|report ...", file=sys.stderr)
        return 2
    return cmd_run(sys.argv[2:]) if sys.argv[1] == "run" else cmd_report(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
