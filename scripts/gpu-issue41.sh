#!/bin/bash
# Issue 41's checks on the GPU machine, in one call: (1) scripts/gpu-pyframes.sh (the daemon's
# call sites per Python line, live and after exit); (2) `ethand record` of the same PyTorch
# workload, each GPU call's Python frames counted per line (tests/gpu/pyframes_record_check.py);
# (3) the training bench at the default level with and without the walk (scripts/gpu-bench.sh,
# none vs the default level, single GPU, twice: gpu.python_frames true, then false).
# Run from the repository root as root with .device-bin/ethand; writes ${OUT:-/tmp/gpu-issue41}.
# Knobs: PYFRAMES=0 skips (1); BENCH_S, the budget of each bench run (170 s); ROUNDS (4).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-issue41}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
BENCH_S=${BENCH_S:-170}
mkdir -p "$OUT"
log() { echo "[issue41] $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "start; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

if [ "${PYFRAMES:-1}" = 1 ]; then
    OUT=$OUT/pyframes bash scripts/gpu-pyframes.sh > "$OUT/pyframes.out" 2>&1
    log "gpu-pyframes.sh rc=$?"
fi

W=$(mktemp -d)
mkfifo "$W/in"
"$PY" tests/gpu/pyframes_workload.py < "$W/in" > "$W/w.out" 2> "$OUT/record-workload.err" &
WP=$!
exec 7> "$W/in"
for i in $(seq 1 600); do grep -q '^ready' "$W/w.out" && break; sleep 0.2; done
"$E" record --pid "$WP" --duration 120s -o "$OUT/record.json" -o "$OUT/record.pftrace" \
    > "$OUT/record.out" 2> "$OUT/record.err" &
RP=$!
for i in $(seq 1 300); do grep -q 'Python frames of its GPU calls are' "$OUT/record.err" && break; sleep 0.1; done
log "record: $(grep 'Python frames' "$OUT/record.err" | head -1)"
echo go >&7
for i in $(seq 1 1200); do grep -q '^done' "$W/w.out" && break; sleep 0.1; done
sleep 1
echo exit >&7
exec 7>&-
wait "$WP"; log "record workload exit rc=$?"
wait "$RP"; log "record rc=$? $(cat "$OUT/record.out")"
"$PY" tests/gpu/pyframes_record_check.py "$OUT/record.json" tests/gpu/pyframes_workload.py "$WP" 2>&1 | tee "$OUT/record-check.txt"
log "record check rc=${PIPESTATUS[0]}"
ls -l "$OUT/record.json" "$OUT/record.pftrace" >> "$OUT/log.txt"
gzip -f "$OUT/record.json"
rm -rf "$W"

for py in on off; do
    extra=""; [ "$py" = off ] && extra="python_frames = false"
    OUT=$OUT/bench-py-$py GPU_EXTRA="$extra" MODES=none,calls SKIP=ddp BUDGET_S=$BENCH_S ROUNDS=${ROUNDS:-4} \
        bash scripts/gpu-bench.sh > "$OUT/bench-py-$py.out" 2>&1
    log "gpu-bench python_frames $py rc=$?: $(grep -iE 'calls.*%|overhead' "$OUT/bench-py-$py/gpu-bench.md" 2>/dev/null | head -3)"
done
log "end"
