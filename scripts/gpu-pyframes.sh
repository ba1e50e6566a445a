#!/bin/bash
# Issue 41 on the GPU machine, at the daemon's embedded defaults: tests/gpu/pyframes_workload.py
# (PyTorch on real CUDA) makes 3,000 syncs from f(), 1,000 from g() and a storm of 2,000
# `.item()` from storm(), then waits. Snapshots after the calls (the storm over) and after the
# process exited must count each line exactly (tests/gpu/pyframes_check.py). Also checks the
# walk's offsets in each Python found (tests/gpu/python_frames_check.py). Run from the
# repository root as root with .device-bin/ethand built; writes ${OUT:-/tmp/gpu-pyframes}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-pyframes}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
mkdir -p "$OUT"
W=$(mktemp -d)
log() { echo "[pyframes] $*" | tee -a "$OUT/log.txt"; }
for py in /opt/*/.venv/bin/python /usr/bin/python3; do
    [ -x "$py" ] || continue
    n=$(echo "$py" | tr / _)
    timeout 60 "$py" tests/gpu/python_frames_check.py > "$OUT/frames-check$n.json" 2>&1
    log "python_frames_check $py: rc=$? $(head -c 300 "$OUT/frames-check$n.json")"
done
CFG=$W/ethand.toml
cat > "$CFG" <<CFG
[daemon]
socket = "$W/ethand.sock"
[prometheus]
listen = "127.0.0.1:9479"
CFG
"$E" --config "$CFG" run > "$OUT/daemon.log" 2>&1 &
DP=$!
for i in $(seq 1 120); do timeout 5 "$E" --config "$CFG" status > /dev/null 2>&1 && break; sleep 0.5; done
mkfifo "$W/in"
"$PY" tests/gpu/pyframes_workload.py < "$W/in" > "$W/w.out" 2> "$OUT/workload.err" &
WP=$!
exec 7> "$W/in"
for i in $(seq 1 600); do grep -q '^ready' "$W/w.out" && break; sleep 0.2; done
log "workload pid $WP: $(cat "$W/w.out")"
walked=0
for i in $(seq 1 100); do
    timeout 20 "$E" --config "$CFG" snapshot --pid "$WP" --json > "$W/s.json" 2>/dev/null
    if grep -q '"state": *"walked"' "$W/s.json"; then walked=1; break; fi
    sleep 0.3
done
log "walked=$walked after $i polls: $(grep -o '"python_walk":{[^}]*}' "$W/s.json" | head -1)"
echo go >&7
for i in $(seq 1 1200); do grep -q '^done' "$W/w.out" && break; sleep 0.1; done
log "workload: $(tail -1 "$W/w.out")"
sleep 3
timeout 60 "$E" --config "$CFG" snapshot --pid "$WP" --json > "$OUT/snapshot-live.json" 2> "$OUT/snapshot-live.err"
timeout 60 "$E" --config "$CFG" snapshot --pid "$WP" > "$OUT/snapshot-live.txt" 2>&1
"$PY" tests/gpu/pyframes_check.py "$OUT/snapshot-live.json" tests/gpu/pyframes_workload.py "$WP" 2>&1 | tee "$OUT/check-live.txt"
log "check live rc=${PIPESTATUS[0]}"
echo exit >&7
exec 7>&-
wait "$WP"; log "workload exit rc=$?"
sleep 2
timeout 60 "$E" --config "$CFG" snapshot --pid "$WP" --json > "$OUT/snapshot-exited.json" 2> "$OUT/snapshot-exited.err"
"$PY" tests/gpu/pyframes_check.py "$OUT/snapshot-exited.json" tests/gpu/pyframes_workload.py "$WP" 2>&1 | tee "$OUT/check-exited.txt"
log "check exited rc=${PIPESTATUS[0]}"
timeout 30 "$E" --config "$CFG" status --json > "$OUT/status.json" 2>&1
kill "$DP"; wait "$DP" 2>/dev/null
rm -rf "$W"
