#!/bin/bash
# `ethand record` and a standalone snapshot of a real training loop (tests/gpu/scenarios.py,
# default healthy_resnet and input_main), at the defaults: the Perfetto trace with its CPU
# samples (native and Python), the snapshot's JSON, text and HTML (the native CPU profile and its flame graph).
# Run from the repository root as root, with .device-bin/ethand built. Writes
# ${OUT:-/tmp/gpu-record}/<scenario>/{trace.json.gz,snap.json,snap.txt,snap.html,summary.txt}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-record}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
SCENARIOS=${SCENARIOS:-"healthy_resnet input_main"}
REC_S=${REC_S:-5}
mkdir -p "$OUT"
for s in $SCENARIOS; do
    D=$OUT/$s
    mkdir -p "$D"
    W=$(mktemp -d)
    timeout 120 "$PY" tests/gpu/scenarios.py "$s" 60 > "$W/w.out" 2> "$W/w.err" &
    TP=$!
    for i in $(seq 1 600); do grep -q '^ready' "$W/w.out" 2>/dev/null && break; sleep 0.2; done
    WP=$(grep -m1 -oE '^ready [0-9]+' "$W/w.out" | awk '{print $2}')
    if [ -z "$WP" ]; then
        echo "$s: no ready line"; tail -5 "$W/w.err"; kill "$TP" 2>/dev/null; continue
    fi
    sleep 5
    timeout 60 "$E" record --pid "$WP" --duration "${REC_S}s" -o "$D/trace.json" > "$D/record.out" 2> "$D/record.err"
    echo "$s: record rc=$? $(cat "$D/record.out")"
    timeout 60 "$E" snapshot --pid "$WP" --standalone --duration 5 --json > "$D/snap.json" 2> "$D/snap.err"
    echo "$s: snapshot rc=$?"
    "$E" snapshot --pid "$WP" --standalone --duration 4 --html "$D/snap.html" > "$D/snap.txt" 2>> "$D/snap.err"
    kill "$TP" 2>/dev/null; wait "$TP" 2>/dev/null
    python3 - "$D" > "$D/summary.txt" <<'PY'
import collections, json, sys
d = sys.argv[1]
t = json.load(open(f"{d}/trace.json"))
s = [e for e in t["traceEvents"] if e.get("cat") == "cpu_sample"]
m = t["metadata"]
print("record:", {k: m[k] for k in m if k.startswith("cpu") or k in ("events", "dropped", "duration_s")})
by_tid = collections.Counter(e["tid"] for e in s)
print("samples by thread (top 5):", by_tid.most_common(5))
print("innermost frames (top 10):", collections.Counter(e["name"] for e in s).most_common(10))
py = [e for e in t["traceEvents"] if e.get("cat") == "python_sample"]
print("python:", {k: m[k] for k in m if k.startswith("python")})
print("python samples by thread (top 5):", collections.Counter(e["tid"] for e in py).most_common(5))
print("python innermost lines, running (top 8):", collections.Counter(e["name"] for e in py if e["args"]["active"]).most_common(8))
print("python innermost lines, idle (top 5):", collections.Counter(e["name"] for e in py if not e["args"]["active"]).most_common(5))
snap = json.load(open(f"{d}/snap.json"))
p = snap.get("cpu_profile") or {}
print("profile:", p.get("duration_ms"), p.get("rate_hz"), p.get("lost_stacks"), p.get("lost_samples"), p.get("notes"))
for th in p.get("threads", [])[:6]:
    print(f"  {th['tid']} {th['name']} main={th['main_thread']} samples={th['samples']} kernel={th['kernel_samples']} waits={th['waits']} wait_ms={th['wait_ns']/1e6:.0f}")
    print("    by file:", [(x["name"], x["samples"]) for x in th["by_module"][:5]])
    print("    by function:", [((x["frame"].get("function") or x["frame"].get("module")), x["samples"]) for x in th["top_functions"][:5]])
    for w in th["wait_sites"][:2]:
        print("    wait:", w["count"], w.get("time_ns"), [f.get("function") or f.get("module") for f in w["frames"]][:10])
print("findings:", [(f["id"], f.get("detail", [])) for f in snap.get("findings", [])][:3])
PY
    cat "$D/summary.txt"
    gzip -f "$D/trace.json"
    rm -rf "$W"
done
