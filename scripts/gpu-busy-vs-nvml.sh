#!/bin/bash
# Issue 42: GPU busy from the union of kernel intervals (a snapshot's gpu_activity) against
# NVML's utilization.gpu sampled every 100 ms over the same window, on workloads with no
# copies (tests/gpu/cupti_workload.py --kernels-only) at several host duty cycles; then
# torch.profiler started before a window (the library must say `refused`).
# Run from the repository root as root with .device-bin/ethand; writes ${OUT:-/tmp/gpu-busy}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-busy}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
WINDOW_MS=${WINDOW_MS:-3000}
SLEEPS=${SLEEPS:-0 2 8}
mkdir -p "$OUT"
log() { echo "[busy] $(date +%T) $*" | tee -a "$OUT/log.txt"; }
D=$(mktemp -d)
cat > "$D/ethand.toml" <<TOML
[daemon]
socket = "$D/ethand.sock"
[prometheus]
listen = "127.0.0.1:19843"
[gpu]
cupti_dir = "$D/cupti"
[diagnosis]
gpu_activity_ms = $WINDOW_MS
TOML
"$E" run --config "$D/ethand.toml" > "$OUT/daemon.log" 2>&1 &
EP=$!
for i in $(seq 1 300); do [ -S "$D/ethand.sock" ] && break; sleep 0.1; done
sleep 1
LIB="$D/cupti/libethand_cupti.so"
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100 > "$OUT/nvml-util.csv" 2>&1 &
NP=$!
for ms in $SLEEPS; do
    n=k$ms
    mkfifo "$D/$n.in"
    CUDA_INJECTION64_PATH=$LIB "$PY" tests/gpu/cupti_workload.py --kernels-only --sleep-ms "$ms" \
        < "$D/$n.in" > "$OUT/$n.out" 2> "$OUT/$n.err" &
    WP=$!
    exec 7> "$D/$n.in"
    for i in $(seq 1 600); do grep -q '^ready' "$OUT/$n.out" && break; sleep 0.2; done
    echo "run $(( WINDOW_MS / 1000 + 5 ))" >&7
    sleep 1
    "$E" snapshot --pid "$WP" --json --socket "$D/ethand.sock" > "$OUT/$n-snapshot.json" 2> "$OUT/$n-snapshot.err"
    for i in $(seq 1 300); do grep -q '^steps' "$OUT/$n.out" && break; sleep 0.1; done
    echo exit >&7; exec 7>&-; wait "$WP"
    log "$n: $(tail -1 "$OUT/$n.out") $(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["gpu_activity"]; p=a["processes"][0]; print(a["started_unix_ms"], p["state"], p.get("window_ns"), json.dumps(p.get("devices")))' "$OUT/$n-snapshot.json")"
done
kill "$NP"
# torch.profiler first, then a window.
mkfifo "$D/prof.in"
CUDA_INJECTION64_PATH=$LIB "$PY" tests/gpu/cupti_workload.py --profile < "$D/prof.in" > "$OUT/prof.out" 2> "$OUT/prof.err" &
WP=$!
exec 7> "$D/prof.in"
for i in $(seq 1 600); do grep -q '^ready' "$OUT/prof.out" && break; sleep 0.2; done
echo "run $(( WINDOW_MS / 1000 + 6 ))" >&7
for i in $(seq 1 300); do grep -q '^profiling' "$OUT/prof.out" && break; sleep 0.1; done
sleep 1
"$E" snapshot --pid "$WP" --json --socket "$D/ethand.sock" > "$OUT/prof-snapshot.json" 2> "$OUT/prof-snapshot.err"
for i in $(seq 1 300); do grep -q '^steps' "$OUT/prof.out" && break; sleep 0.1; done
echo exit >&7; exec 7>&-; wait "$WP"
log "prof: $(tail -1 "$OUT/prof.out") $(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["gpu_activity"]; p=a["processes"][0]; print(p["state"], p.get("detail"), p.get("records"))' "$OUT/prof-snapshot.json")"
log "prof stderr: $(grep -ci cupti "$OUT/prof.err") CUPTI lines"
kill "$EP"; wait "$EP"
rm -rf "$D"
log end
