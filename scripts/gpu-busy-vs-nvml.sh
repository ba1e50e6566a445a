#!/bin/bash
# Issue 42 on the GPU machine, in one call: GPU busy from the union of kernel intervals (a
# snapshot's gpu_activity) against NVML's utilization.gpu sampled every 100 ms over the same
# window (tests/gpu/busy_vs_nvml.py), for PyTorch kernels only at three host duty cycles,
# PyTorch with copies, and a JAX training step; torch.profiler holding CUPTI before a window
# (the library must say `refused`); the dormant library's cost on the step rate, in rounds
# against the same loop without it, the order alternating: the training bench's model
# (tests/gpu/dormant_train.py, DORMANT=train, the default) or the issue's loop (DORMANT=loop).
# Run from the repository root as root with .device-bin/ethand; writes ${OUT:-/tmp/gpu-busy}.
# VARIANTS=none skips the busy windows; PROF=0 the profiler case.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-busy}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
WINDOW_MS=${WINDOW_MS:-3000}
VARIANTS=${VARIANTS:-k0 k2 k8 c0 jax}
ROUNDS=${ROUNDS:-6}
ROUND_S=${ROUND_S:-4}
DORMANT=${DORMANT:-train}
PROF=${PROF:-1}
case $DORMANT in
    train) DORMANT_CMD="tests/gpu/dormant_train.py" ;;
    *) DORMANT_CMD="tests/gpu/cupti_workload.py" ;;
esac
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
log "start: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); lib $(ls -l "$LIB" 2>&1)"
nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader -lms 100 > "$OUT/nvml-util.csv" 2>&1 &
NP=$!

# One workload process driven through a fifo: ready, `run S` -> `steps ...`, exit.
start() { # name, env, command...
    local n=$1 env=$2; shift 2
    mkfifo "$D/$n.in"
    env $env "$@" < "$D/$n.in" > "$OUT/$n.out" 2> "$OUT/$n.err" &
    echo $! > "$D/$n.pid"
    exec {fd}> "$D/$n.in"
    echo "$fd" > "$D/$n.fd"
    for i in $(seq 1 900); do grep -q '^ready' "$OUT/$n.out" && break; sleep 0.2; done
}
phase() { # name, seconds: runs the phase and waits for its steps line
    local fd n; fd=$(cat "$D/$1.fd"); n=$(grep -c '^steps' "$OUT/$1.out")
    echo "run $2" >&"$fd"
    for i in $(seq 1 $((${2%.*} * 10 + 300))); do
        [ "$(grep -c '^steps' "$OUT/$1.out")" -gt "$n" ] && break; sleep 0.1
    done
    tail -1 "$OUT/$1.out"
}
stop() { local fd; fd=$(cat "$D/$1.fd"); echo exit >&"$fd"; eval "exec $fd>&-"; wait "$(cat "$D/$1.pid")"; }
window() { # name: a snapshot inside a running phase, then busy against NVML
    local fd; fd=$(cat "$D/$1.fd")
    local n; n=$(grep -c '^steps' "$OUT/$1.out")
    echo "run $(( WINDOW_MS / 1000 + 5 ))" >&"$fd"
    sleep 1
    "$E" snapshot --pid "$(cat "$D/$1.pid")" --json --socket "$D/ethand.sock" > "$OUT/$1-snapshot.json" 2> "$OUT/$1-snapshot.err"
    "$E" diagnose "$OUT/$1-snapshot.json" > "$OUT/$1-snapshot.txt" 2>&1
    for i in $(seq 1 400); do [ "$(grep -c '^steps' "$OUT/$1.out")" -gt "$n" ] && break; sleep 0.1; done
    log "$1: $(tail -1 "$OUT/$1.out")"
    log "$1: $("$PY" tests/gpu/busy_vs_nvml.py "$OUT/$1-snapshot.json" "$OUT/nvml-util.csv" "$1" | tee -a "$OUT/busy.jsonl")"
}

for v in $VARIANTS; do
    case $v in
        k*) start "$v" "CUDA_INJECTION64_PATH=$LIB" "$PY" tests/gpu/cupti_workload.py --kernels-only --sleep-ms "${v#k}" ;;
        c*) start "$v" "CUDA_INJECTION64_PATH=$LIB" "$PY" tests/gpu/cupti_workload.py --sleep-ms "${v#c}" ;;
        jax) start "$v" "CUDA_INJECTION64_PATH=$LIB" "$PY" tests/gpu/jax_workload.py ;;
        *) continue ;;
    esac
    window "$v"
    stop "$v"
done

# torch.profiler first, then a window: the library steps aside and says so.
if [ "$PROF" = 1 ]; then
start prof "CUDA_INJECTION64_PATH=$LIB" "$PY" tests/gpu/cupti_workload.py --profile
echo "run $(( WINDOW_MS / 1000 + 6 ))" >&"$(cat "$D/prof.fd")"
for i in $(seq 1 300); do grep -q '^profiling' "$OUT/prof.out" && break; sleep 0.1; done
sleep 1
"$E" snapshot --pid "$(cat "$D/prof.pid")" --json --socket "$D/ethand.sock" > "$OUT/prof-snapshot.json" 2> "$OUT/prof-snapshot.err"
for i in $(seq 1 300); do grep -q '^steps' "$OUT/prof.out" && break; sleep 0.1; done
log "prof: $(tail -1 "$OUT/prof.out") $("$PY" -c 'import json,sys; a=json.load(open(sys.argv[1]))["gpu_activity"]; p=a["processes"][0]; print(p["state"], p.get("detail"), p.get("records"))' "$OUT/prof-snapshot.json")"
stop prof
fi

# The dormant library's cost: the same loop with and without it, in alternating rounds.
log "dormant cost: $DORMANT_CMD, $ROUNDS rounds of ${ROUND_S}s per process"
start plain "" "$PY" $DORMANT_CMD
start dormant "CUDA_INJECTION64_PATH=$LIB" "$PY" $DORMANT_CMD
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="plain dormant"; else order="dormant plain"; fi
    for n in $order; do
        log "round $r $n: $(phase "$n" "$ROUND_S")"
    done
done
stop plain; stop dormant
kill "$NP"
"$PY" - "$OUT/log.txt" <<'PY' | tee -a "$OUT/log.txt"
import re, statistics, sys
rate = {"plain": [], "dormant": []}
for line in open(sys.argv[1]):
    m = re.search(r"round (\d+) (plain|dormant): steps (\d+) seconds ([\d.]+)", line)
    if m:
        rate[m.group(2)].append(int(m.group(3)) / float(m.group(4)))
if rate["plain"] and rate["dormant"]:
    ratios = [d / p for p, d in zip(rate["plain"], rate["dormant"])]
    print(f"[busy] dormant/plain steps/s per round: {[round(r, 4) for r in ratios]}; "
          f"mean {statistics.mean(ratios):.4f}, sd {statistics.stdev(ratios) if len(ratios) > 1 else 0:.4f}; "
          f"plain {statistics.mean(rate['plain']):.1f} steps/s (sd {statistics.stdev(rate['plain']):.1f}), "
          f"dormant {statistics.mean(rate['dormant']):.1f} (sd {statistics.stdev(rate['dormant']):.1f})")
PY
kill "$EP"; wait "$EP"
rm -rf "$D"
log end
