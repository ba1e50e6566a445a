#!/usr/bin/env python3
"""What each NVML call ethand's collector makes costs on this machine (CPU time and wall time).

Run on the GPU machine: python3 tests/gpu/nvml_cost.py [REPS]. Prints one line per call:
mean wall µs, mean CPU µs of this thread, calls per collection per GPU. The collector's
calls are those of userspace-probes/src/devices/nvml.rs (read_gpu).
"""
import ctypes as C
import sys
import time

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
nv = C.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
n = C.c_uint()
nv.nvmlDeviceGetCount_v2(C.byref(n))
print(f"GPUs: {n.value}")
h = C.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h))

buf = C.create_string_buffer(4096)
u = C.c_uint()
ull = C.c_ulonglong()


class FieldValue(C.Structure):
    _fields_ = [("fieldId", C.c_uint), ("scopeId", C.c_uint), ("timestamp", C.c_longlong),
                ("latencyUsec", C.c_longlong), ("valueType", C.c_uint), ("nvmlReturn", C.c_uint),
                ("value", C.c_ulonglong)]


fv = (FieldValue * 64)()
NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX
procs = (C.c_ubyte * (64 * 1024))()

calls = [
    ("utilization", 1, lambda: nv.nvmlDeviceGetUtilizationRates(h, buf)),
    ("memory_info_v2", 1, lambda: nv.nvmlDeviceGetMemoryInfo(h, buf)),
    ("power", 1, lambda: nv.nvmlDeviceGetPowerUsage(h, C.byref(u))),
    ("energy", 1, lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h, C.byref(ull))),
    ("temperature", 1, lambda: nv.nvmlDeviceGetTemperature(h, 0, C.byref(u))),
    ("clock_sm", 2, lambda: nv.nvmlDeviceGetClockInfo(h, 1, C.byref(u))),
    ("pcie_throughput_tx", 1, lambda: nv.nvmlDeviceGetPcieThroughput(h, 0, C.byref(u))),
    ("pcie_throughput_rx", 1, lambda: nv.nvmlDeviceGetPcieThroughput(h, 1, C.byref(u))),
    ("ecc_volatile", 2, lambda: nv.nvmlDeviceGetTotalEccErrors(h, 0, 0, C.byref(ull))),
    ("throttle_reasons", 1, lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h, C.byref(ull))),
    ("nvlink_state (per link)", 18, lambda: nv.nvmlDeviceGetNvLinkState(h, 0, C.byref(u))),
    ("field_values nvlink tx/rx (per link)", 18, lambda: nv.nvmlDeviceGetFieldValues(h, 2, fv)),
    ("nvlink_error_counter (4 per link)", 72, lambda: nv.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0, C.byref(ull))),
    ("running_compute_processes_v3", 1, lambda: nv.nvmlDeviceGetComputeRunningProcesses_v3(h, C.byref(u), procs)),
    ("process_utilization", 1, lambda: nv.nvmlDeviceGetProcessUtilization(h, procs, C.byref(u), C.c_ulonglong(0))),
]
for i in range(18):
    fv[2 * i].fieldId, fv[2 * i].scopeId = NVLINK_TX, i
    fv[2 * i + 1].fieldId, fv[2 * i + 1].scopeId = NVLINK_RX, i
calls.append(("field_values all 18 links tx/rx in ONE call", 0, lambda: nv.nvmlDeviceGetFieldValues(h, 36, fv)))

total_cpu = 0.0
print(f"{'call':45s} {'rc':>4s} {'wall µs':>10s} {'cpu µs':>10s} {'per GPU/s':>9s} {'cpu ms/s/GPU':>12s}")
for name, per, fn in calls:
    if name.startswith("process_utilization") or name.startswith("running"):
        u.value = 0
    rc = fn()
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(REPS):
        if name.startswith("running"):
            u.value = 256
        if name.startswith("process_utilization"):
            u.value = 256
        fn()
    w = (time.perf_counter() - w0) / REPS * 1e6
    c = (time.thread_time() - c0) / REPS * 1e6
    total_cpu += c * per
    print(f"{name:45s} {rc:4d} {w:10.1f} {c:10.1f} {per:9d} {c * per / 1000:12.2f}")
print(f"total CPU per collection per GPU: {total_cpu / 1000:.1f} ms")
