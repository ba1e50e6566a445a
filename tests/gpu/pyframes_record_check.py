"""Reads an `ethand record` JSON trace of tests/gpu/pyframes_workload.py (issue 41) and counts
the recorded GPU calls per workload line: the innermost frame of each call's `python`
argument that is in the workload. Expects exactly 3,000 syncs at F_LINE, 1,000 at G_LINE and
2,000 at ITEM_LINE (the `.item()` storm). Usage: pyframes_record_check.py TRACE.json
WORKLOAD.py PID. Exit 1 on a mismatch."""
import collections
import json
import re
import sys

trace = json.load(open(sys.argv[1]))
source = open(sys.argv[2]).read().splitlines()
pid = int(sys.argv[3])
marker = {i + 1: l.split("# ")[-1] for i, l in enumerate(source) if "# " in l and "_LINE" in l}
frame = re.compile(r"^pyframes_workload\.py:(\d+) in ")
by = collections.Counter()
with_frames = without = 0
for e in trace["traceEvents"]:
    if e.get("cat") != "gpu" or e.get("pid") != pid:
        continue
    py = (e.get("args") or {}).get("python") or []
    if py:
        with_frames += 1
    else:
        without += 1
    line = next((int(m.group(1)) for m in map(frame.match, py) if m), None)
    by[(e["name"], marker.get(line, "(no workload frame)" if line is None else f"line {line}"))] += 1
meta = trace.get("metadata", {})
print("python_walks:", meta.get("python_walks"))
print("with frames", with_frames, "without", without, "partly read", meta.get("gpu_calls_with_python_frames_partly_read"))
for k, n in sorted(by.items(), key=lambda kv: -kv[1]):
    print("   ", k, n)
syncs = {"cuCtxSynchronize", "cuCtxSynchronize_v2", "cuStreamSynchronize", "cuEventSynchronize"}
ok = True
for name, want in [("F_LINE", 3000), ("G_LINE", 1000), ("ITEM_LINE", 2000)]:
    got = sum(n for (call, m), n in by.items() if m == name and call in syncs)
    print(f"{name}: {got} syncs (want {want})", "ok" if got == want else "MISMATCH")
    ok &= got == want
sys.exit(0 if ok else 1)
