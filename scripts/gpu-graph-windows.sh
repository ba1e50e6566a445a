#!/bin/bash
# Does a CUDA-graph job survive a GPU activity window? Three processes replaying a CUDA graph
# (tests/gpu/graph_loop.py), started with libethand_cupti.so as it is, with ETHAND_CUPTI_KEEP=1
# (CUPTI never detached after a window) and with ETHAND_CUPTI_NO_QUEUED=1 (no latency
# timestamps); two snapshots (two windows) of each, one after the other; then which are
# alive, their exit and the kernel log's Xid lines; per window the busy fraction, kernel time
# and the longest kernel (a kernel CUPTI timed from before its window shows there). VARIANTS
# picks the processes (default all three), ROUNDS the windows (2). Root, repository root,
# .device-bin/ethand.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-graph}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
RUN_S=${RUN_S:-45}
VARIANTS=${VARIANTS:-plain keep noqueued}
ROUNDS=${ROUNDS:-2}
. scripts/gpu-common.sh
mkdir -p "$OUT"
D=$(mktemp -d)
start_daemon "$D" 19844 "$OUT/daemon.log"
sleep 1
LIB=$D/cupti/libethand_cupti.so
dmesg | grep -ci xid > "$D/xid0" 2>/dev/null
for v in $VARIANTS; do
    case $v in plain) env="" ;; keep) env="ETHAND_CUPTI_KEEP=1" ;; noqueued) env="ETHAND_CUPTI_NO_QUEUED=1" ;; esac
    env $env CUDA_INJECTION64_PATH="$LIB" "$PY" tests/gpu/graph_loop.py "$RUN_S" > "$OUT/$v.out" 2> "$OUT/$v.err" &
    echo $! > "$D/$v.pid"
done
for v in $VARIANTS; do
    for i in $(seq 1 600); do grep -q '^ready' "$OUT/$v.out" && break; sleep 0.1; done
done
for round in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
        p=$(cat "$D/$v.pid")
        kill -0 "$p" 2>/dev/null || { echo "round $round $v: already dead" | tee -a "$OUT/log.txt"; continue; }
        timeout 30 "$E" snapshot --pid "$p" --json --socket "$D/s" > "$OUT/$v-$round.json" 2> "$OUT/$v-$round.err"
        sleep 2
        alive=$(kill -0 "$p" 2>/dev/null && echo alive || echo DEAD)
        echo "round $round $v: $alive $(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["gpu_activity"]["processes"][0]; d=(a.get("devices") or [{}])[0]; k=a.get("kernels") or []; print(a["state"], a.get("records"), a.get("detail"), "busy", d.get("busy_fraction"), "kernel_ns", d.get("kernel_ns"), "longest", max((x.get("max_ns") or 0 for x in k), default=None))' "$OUT/$v-$round.json" 2>&1 | head -c 300)" | tee -a "$OUT/log.txt"
    done
done
for v in $VARIANTS; do
    wait "$(cat "$D/$v.pid")"; rc=$?
    echo "$v: exit $rc, $(tail -1 "$OUT/$v.out"), $(grep -m1 -i error "$OUT/$v.err")" | tee -a "$OUT/log.txt"
done
dmesg | grep -i xid | tail -5 | tee -a "$OUT/log.txt"
kill "$EP"; wait "$EP"; rm -rf "$D"
