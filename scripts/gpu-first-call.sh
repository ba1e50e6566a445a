#!/bin/bash
# The first GPU process after the daemon starts is counted from its first call: ethand starts
# with its defaults (driver libraries probed at start-up), a CuPy process starts right away,
# makes 100 host-to-device copies of 4 KiB within its first second and lingers 4 s; its
# snapshot must show the 100 copies. Run from the repository root as root.
# Writes ${OUT:-/tmp/gpu-first-call}/{log.txt,snapshot.json,status.json}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-first-call}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
mkdir -p "$OUT"; exec > >(tee "$OUT/log.txt") 2>&1
W=$(mktemp -d)
printf '[daemon]\nsocket = "%s/ethand.sock"\n[prometheus]\nlisten = "127.0.0.1:9481"\n' "$W" > "$W/cfg.toml"
"$E" --config "$W/cfg.toml" run > "$W/daemon.log" 2>&1 &
DP=$!
for i in $(seq 1 60); do "$E" --config "$W/cfg.toml" status > /dev/null 2>&1 && break; sleep 0.25; done
"$E" --config "$W/cfg.toml" status --json > "$OUT/status.json"
python3 -c "import json;s=json.load(open('$OUT/status.json'));[print('library', l['path'], l['state'], l['detail'][:80]) for l in s['gpu_libraries']]"
T0=$(date +%s.%N)
timeout 60 "$PY" -c '
import os, sys, time, numpy, cupy
print(os.getpid(), flush=True)
h = numpy.ones(1024, dtype=numpy.float32)
for _ in range(100):
    d = cupy.asarray(h)
cupy.cuda.Device().synchronize()
print("copies done", flush=True)
time.sleep(4)
' > "$W/py.out" 2> "$W/py.err" &
PP=$!
for i in $(seq 1 100); do [ -s "$W/py.out" ] && grep -q "copies done" "$W/py.out" && break; sleep 0.1; done
python3 -c "import time; print('copies done %.2f s after the daemon was ready' % (time.time() - $T0))"
PID=$(head -1 "$W/py.out")
sleep 1.5
"$E" --config "$W/cfg.toml" snapshot --pid "$PID" --json --no-launch-sample > "$OUT/snapshot.json"
python3 - "$OUT/snapshot.json" <<'PYX'
import json, sys
t = json.load(open(sys.argv[1]))
p = t["processes"][0]
g = p.get("gpu") or {}
h2d = [s for s in g.get("symbols", []) if s["category"] == "copy" and s["direction"] == "host_to_device"]
n = sum(s["calls"] for s in h2d)
print("h2d copies counted:", n, [(s["symbol"], s["calls"], s["bytes"]) for s in h2d])
print("FIRST CALL:", "PASS" if n >= 100 else "FAIL")
PYX
wait $PP; cat "$W/py.err" | tail -3
kill $DP; wait $DP
grep -E "WARN|ERROR|start-up" "$W/daemon.log" | tail -5
