"""GPU busy from a snapshot's kernel records against NVML's utilization.gpu over the same
window (issue 42; scripts/gpu-busy-vs-nvml.sh).

python busy_vs_nvml.py SNAPSHOT.json NVML.csv [LABEL]

NVML.csv: `nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100`
(its timestamps are the machine's local time, UTC there). Prints one JSON line: the window,
the kernels' busy share (union of kernel intervals), the copy-only share (copies with no
kernel running, from the idle split), their sum, and the mean and number of NVML samples
whose time falls inside the window.
"""
import datetime
import json
import sys


def nvml_samples(path):
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[1].endswith("%"):
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            continue
        t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
        out.append((t, float(parts[1].rstrip("%").strip()) / 100.0))
    return out


def main():
    snap = json.load(open(sys.argv[1]))
    label = sys.argv[3] if len(sys.argv) > 3 else sys.argv[1]
    act = snap.get("gpu_activity") or {}
    procs = act.get("processes") or []
    row = {"label": label}
    if not procs:
        row["error"] = "no gpu_activity process"
        print(json.dumps(row))
        return
    p = procs[0]
    row["state"] = p.get("state")
    window_ns = p.get("window_ns")
    devs = p.get("devices") or []
    if not window_ns or not devs:
        row["error"] = "no window or no device"
        print(json.dumps(row))
        return
    d = devs[0]
    start = act["started_unix_ms"] / 1000.0
    end = start + window_ns / 1e9
    idle = d.get("idle") or {}
    row.update(
        window_s=round(window_ns / 1e9, 3),
        kernels=d.get("kernels"),
        busy=d.get("busy_fraction"),
        copy_only=idle.get("copy_ns", 0) / window_ns if idle else None,
        host_wait=idle.get("host_wait_ns", 0) / window_ns if idle else None,
        kernel_wait=idle.get("kernel_wait_ns", 0) / window_ns if idle else None,
    )
    if row["busy"] is not None and row["copy_only"] is not None:
        row["busy_or_copy"] = row["busy"] + row["copy_only"]
    inside = [u for t, u in nvml_samples(sys.argv[2]) if start <= t <= end]
    row["nvml_samples"] = len(inside)
    row["nvml_mean"] = sum(inside) / len(inside) if inside else None
    if row["nvml_mean"] is not None and row["busy"] is not None:
        row["busy_minus_nvml"] = row["busy"] - row["nvml_mean"]
    print(json.dumps(row))


if __name__ == "__main__":
    main()
