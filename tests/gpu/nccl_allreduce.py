#!/usr/bin/env python3
"""NCCL all-reduce ground-truth workload for scripts/gpu-check.sh.

Run with: torchrun --standalone --nproc-per-node 2 tests/gpu/nccl_allreduce.py [--gate PATH]

Each rank: init the NCCL process group, one warm-up all_reduce and one barrier (reported
separately, outside the measured window), print `ready rank=R pid=P`, wait for the gate
file (if --gate; the driver script takes ethand's BEFORE snapshots meanwhile), then EXACTLY
S `dist.all_reduce(t)` of a float32 tensor of E elements, synchronize, print one JSON line of
ground truth, then hold H seconds (or until PATH.end exists) so that ethand can snapshot the
live process, and exit.

With fewer than 2 GPUs it prints a note and exits 0.
"""
import argparse
import json
import os
import sys
import time


def log(msg):
    print(f"[nccl_allreduce rank={os.environ.get('RANK', '?')}] {msg}", file=sys.stderr, flush=True)


def wait_file(path, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return False


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
    except Exception as ex:
        return f"unknown ({ex})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", "-s", type=int, default=120, help="measured all_reduce calls")
    ap.add_argument("--elements", "-e", type=int, default=1 << 20, help="float32 elements per all_reduce")
    ap.add_argument("--hold", type=float, default=8.0, help="seconds to stay alive after the work")
    ap.add_argument("--gate", default=None, help="start the measured calls once this file exists; "
                    "end the hold early once PATH.end exists")
    ap.add_argument("--gate-timeout", type=float, default=60.0)
    a = ap.parse_args()

    import torch

    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if ngpu < 2:
        print(json.dumps({"workload": "nccl-allreduce", "skipped": True,
                          "note": f"{ngpu} GPU(s) visible: the NCCL test needs 2"}), flush=True)
        return 0
    if "RANK" not in os.environ or world < 2:
        print(json.dumps({"workload": "nccl-allreduce", "skipped": True,
                          "note": "not started by torchrun with 2 processes "
                                  "(torchrun --standalone --nproc-per-node 2 ...)"}), flush=True)
        return 0
    if world > ngpu:
        print(json.dumps({"workload": "nccl-allreduce", "skipped": True,
                          "note": f"world size {world} > {ngpu} GPUs"}), flush=True)
        return 0

    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    try:
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:  # older torch without device_id
        dist.init_process_group("nccl")
    pid = os.getpid()
    e = a.elements
    t = torch.zeros(e, dtype=torch.float32, device=dev)

    # Warm-up (creates the communicator), then a barrier: both outside the measured window.
    dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.barrier(device_ids=[local_rank])
    torch.cuda.synchronize()

    # One write: print() writes the text and the newline separately, and the two ranks'
    # lines on one pipe interleaved ("ready rank=1 pid=Aready rank=0 pid=B").
    sys.stdout.write(f"ready rank={rank} pid={pid}\n")
    sys.stdout.flush()
    gate_ok = True
    if a.gate:
        gate_ok = wait_file(a.gate, a.gate_timeout)
        if not gate_ok:
            log(f"gate {a.gate} did not appear within {a.gate_timeout}s: starting anyway")

    s = a.steps
    t0 = time.perf_counter()
    for _ in range(s):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    nbytes = s * e * 4
    print(json.dumps({
        "workload": f"nccl-allreduce-rank{rank}",
        "rank": rank,
        "world_size": world,
        "pid": pid,
        "exact_symbols": False,
        "allreduce_calls": s,
        "warmup_allreduce_calls": 1,
        "barrier_calls": 1,
        "bytes": nbytes,
        "elements": e,
        "dtype": "float32",
        "gate_ok": gate_ok,
        "elapsed_ms": round(elapsed * 1e3, 3),
        "busbw_GBps": round(2 * (world - 1) / world * e * 4 * s / max(elapsed, 1e-9) / 1e9, 2),
        "torch": torch.__version__,
        "nccl": nccl_version(torch),
        "expect": {
            "collectives.all_reduce.calls": s,
            "collectives.all_reduce.bytes": nbytes,
            "comm.rank": rank,
            "comm.nranks": world,
            "errors": 0,
        },
        "soft": {
            "symbols.libnccl:ncclAllReduce.calls": s,
            "launches": s,
        },
    }, separators=(",", ":")), flush=True)

    if a.gate:
        wait_file(a.gate + ".end", a.hold)
    else:
        time.sleep(a.hold)
    try:
        dist.destroy_process_group()
    except Exception as ex:  # never fail the run on teardown
        log(f"destroy_process_group: {ex}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
