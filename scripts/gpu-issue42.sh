#!/bin/bash
# Issue 42's check of libethand_cupti.so on the GPU machine, in one call (PyTorch):
# (1) the step rate of tests/gpu/cupti_workload.py without the library, with it dormant, during
#     a snapshot's window and after it (CUPTI finalized), side by side in one process each;
# (2) the snapshot's gpu_activity against the workload's own counts (kernels per step, copies
#     pageable and pinned, bytes) and GPU busy against NVML's utilization over the same window;
# (3) with torch.profiler holding CUPTI: the snapshot must say `refused`, the job carries on.
# Run from the repository root as root with .device-bin/ethand; writes ${OUT:-/tmp/gpu-issue42}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-issue42}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
RUN_S=${RUN_S:-8}
WINDOW_MS=${WINDOW_MS:-5000}
mkdir -p "$OUT"
log() { echo "[issue42] $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "start; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
D=$(mktemp -d)
cat > "$D/ethand.toml" <<TOML
[daemon]
socket = "$D/ethand.sock"
[prometheus]
listen = "127.0.0.1:19842"
[gpu]
cupti_dir = "$D/cupti"
[diagnosis]
gpu_activity_ms = $WINDOW_MS
TOML
"$E" run --config "$D/ethand.toml" > "$OUT/daemon.log" 2>&1 &
EP=$!
for i in $(seq 1 300); do [ -S "$D/ethand.sock" ] && break; sleep 0.1; done
sleep 2
LIB="$D/cupti/libethand_cupti.so"
log "daemon up: $(ls -l "$LIB")"

# One workload process: phases driven through a fifo; prints one `steps` line per phase.
start() { # name, extra env, extra args
    mkfifo "$D/$1.in"
    env $2 "$PY" tests/gpu/cupti_workload.py $3 < "$D/$1.in" > "$OUT/$1.out" 2> "$OUT/$1.err" &
    echo $! > "$D/$1.pid"
    exec {fd}> "$D/$1.in"
    echo "$fd" > "$D/$1.fd"
    for i in $(seq 1 600); do grep -q '^ready' "$OUT/$1.out" && break; sleep 0.2; done
}
phase() { # name, seconds
    local fd; fd=$(cat "$D/$1.fd")
    echo "run $2" >&"$fd"
    local n; n=$(grep -c '^steps' "$OUT/$1.out")
    for i in $(seq 1 $((${2%.*} * 20 + 600))); do
        [ "$(grep -c '^steps' "$OUT/$1.out")" -gt "$n" ] && break; sleep 0.1
    done
    tail -1 "$OUT/$1.out"
}
stop() { local fd; fd=$(cat "$D/$1.fd"); echo exit >&"$fd"; eval "exec $fd>&-"; wait "$(cat "$D/$1.pid")"; }
snapshot() { # name
    "$E" snapshot --pid "$(cat "$D/$1.pid")" --json --socket "$D/ethand.sock" > "$OUT/$1-snapshot.json" 2> "$OUT/$1-snapshot.err"
    "$E" snapshot --pid "$(cat "$D/$1.pid")" --socket "$D/ethand.sock" > "$OUT/$1-snapshot.txt" 2>&1
}

# (1) + (2): the same process dormant, in a window, after it; and one without the library.
start plain "" ""
log "plain: $(phase plain "$RUN_S")"
start injected "CUDA_INJECTION64_PATH=$LIB" ""
log "injected dormant: $(phase injected "$RUN_S")"
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100 > "$OUT/nvml-util.csv" 2>&1 &
NP=$!
# The snapshot's window opens at the next round; the phase covers it.
snapshot injected &
SP=$!
sleep 0.5
log "injected in window: $(phase injected "$(( WINDOW_MS / 1000 ))")"
wait "$SP"
kill "$NP" 2>/dev/null
log "snapshot: $(python3 -c 'import json,sys; a=json.load(open(sys.argv[1])).get("gpu_activity"); print(json.dumps(a)[:1500])' "$OUT/injected-snapshot.json")"
log "injected after the window: $(phase injected "$RUN_S")"
log "plain again: $(phase plain "$RUN_S")"
log "injected dormant again: $(phase injected "$RUN_S")"
stop injected; stop plain

# (3) torch.profiler holds CUPTI.
start profiled "CUDA_INJECTION64_PATH=$LIB" "--profile"
echo "run $(( WINDOW_MS / 1000 + 4 ))" >&"$(cat "$D/profiled.fd")"
sleep 2
snapshot profiled
log "profiled snapshot: $(python3 -c 'import json,sys; a=json.load(open(sys.argv[1])).get("gpu_activity"); print(json.dumps(a)[:600])' "$OUT/profiled-snapshot.json")"
for i in $(seq 1 200); do grep -q '^steps' "$OUT/profiled.out" && break; sleep 0.1; done
log "profiled: $(tail -1 "$OUT/profiled.out")"
stop profiled

kill "$EP"; wait "$EP"
cp "$D/ethand.toml" "$OUT/"
log "end"
rm -rf "$D"
