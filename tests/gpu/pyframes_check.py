"""Reads a snapshot of tests/gpu/pyframes_workload.py and prints, per probed call, the calls
per innermost Python line (function, line, the workload's marker), then checks the exact
counts: 3,000 syncs at F_LINE, 1,000 at G_LINE, and the `.item()` storm's 2,000 syncs at
ITEM_LINE. Usage: pyframes_check.py SNAPSHOT.json WORKLOAD.py PID. Exit 1 on a mismatch."""
import json
import sys

snap = json.load(open(sys.argv[1]))
source = open(sys.argv[2]).read().splitlines()
pid = int(sys.argv[3])
marker = {i + 1: l.split("# ")[-1] for i, l in enumerate(source) if "# " in l and "_LINE" in l}
proc = next(p for p in snap["processes"] if p["pid"] == pid)
gpu = proc.get("gpu") or {}
print("python_walk:", gpu.get("python_walk"))
by = {}
for cs in gpu.get("call_sites", []):
    for s in cs["sites"]:
        # The innermost frame in the workload (above PyTorch's own Python frames).
        py = [f for f in s["frames"] if f.get("kind") == "python" and f.get("file", "").endswith("pyframes_workload.py")]
        key = (py[0].get("function"), py[0].get("line")) if py else ("(native)", None)
        m = marker.get(key[1], "") if py else ""
        by.setdefault(cs["call"], []).append((key[0], key[1], m, s["count"]))
    print(f"{cs['call']}: total {cs['total']} other {cs['other']} unattributed {cs.get('unattributed')}")
    for row in sorted(by.get(cs["call"], []), key=lambda r: -r[3]):
        print("   ", row)
ok = True
def count(marker_name, calls=None):
    return sum(r[3] for call, rows in by.items() if calls is None or call in calls for r in rows if r[2] == marker_name)
syncs = {"cuCtxSynchronize", "cuCtxSynchronize_v2", "cuStreamSynchronize", "cuEventSynchronize"}
for name, want in [("F_LINE", 3000), ("G_LINE", 1000), ("ITEM_LINE", 2000)]:
    got = {call: sum(r[3] for r in rows if r[2] == name) for call, rows in by.items()}
    got = {k: v for k, v in got.items() if v}
    sync_got = sum(v for k, v in got.items() if k in syncs)
    good = sync_got == want
    ok &= good
    print(f"{'ok' if good else 'MISMATCH'} {name}: syncs {sync_got} (expected {want}); all calls there: {got}")
sys.exit(0 if ok else 1)
