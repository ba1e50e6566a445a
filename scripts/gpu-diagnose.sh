#!/bin/bash
# Diagnosis on a real GPU machine: workloads with a known bottleneck (tests/gpu/diag_workloads.py),
# `ethand snapshot` of each while it runs, the findings printed and saved. Run from the repository
# root as root, with .device-bin/ethand built here. Writes ${OUT:-/tmp/gpu-diagnose}/{log.txt,snapshots.json}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-diagnose}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
RUN_S=${RUN_S:-20}
MODES=${MODES:-healthy dataloader item leak straggler}
want() { case " $MODES " in *" $1 "*) return 0 ;; esac; return 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"; exec > >(tee "$OUT/log.txt") 2>&1
W=$(mktemp -d)
cat > "$W/cfg.toml" <<CFG
[daemon]
socket = "$W/ethand.sock"
interval_ms = 500
[prometheus]
listen = "127.0.0.1:9479"
[gpu]
rescan_interval_ms = 500
CFG
"$E" --config "$W/cfg.toml" run > "$W/daemon.log" 2>&1 &
DP=$!
for i in $(seq 1 40); do "$E" --config "$W/cfg.toml" status > /dev/null 2>&1 && break; sleep 0.5; done
echo "[" > "$OUT/snapshots.json"
first=1
# run LABEL SNAP_DELAY COMMAND...: start, wait for "ready PID", snapshot the tree after SNAP_DELAY s.
run() {
    local label=$1 delay=$2; shift 2
    echo; echo "######## $label: $*"
    timeout $((RUN_S + 60)) "$@" > "$W/$label.out" 2> "$W/$label.err" &
    local tp=$! pid=""
    for i in $(seq 1 240); do
        pid=$(grep -m1 -oE '^ready [0-9]+' "$W/$label.out" | awk '{print $2}')
        [ -n "$pid" ] && break
        kill -0 $tp 2>/dev/null || break
        sleep 0.5
    done
    if [ -z "$pid" ]; then echo "no ready line"; tail -5 "$W/$label.err"; wait $tp; return; fi
    local root=$pid
    [ "$label" = straggler ] && root=$tp
    sleep "$delay"
    "$E" --config "$W/cfg.toml" snapshot --pid "$root" --window 8 | sed -n '/^DIAGNOSIS/,/^TOTAL/p' | head -40
    "$E" --config "$W/cfg.toml" snapshot --pid "$root" --window 8 --json > "$W/$label.json"
    python3 - "$W/$label.json" "$label" <<'PYX'
import json, sys
t = json.load(open(sys.argv[1]))
print("findings:", [f["id"] for f in t["findings"]])
for f in t["findings"]:
    print("  ", f["id"], {e["signal"]: round(e["value"], 3) for e in f["evidence"]}, "speedup", f["estimated_speedup"])
d = (t["total"].get("gpu_derived") or {})
print("  derived:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items() if k != "copy_bytes_per_second"})
PYX
    [ $first = 1 ] || echo "," >> "$OUT/snapshots.json"; first=0
    printf '{"label":"%s","snapshot":' "$label" >> "$OUT/snapshots.json"; cat "$W/$label.json" >> "$OUT/snapshots.json"; echo "}" >> "$OUT/snapshots.json"
    wait $tp
}
for m in healthy dataloader item leak; do
    want $m && run $m 12 "$PY" tests/gpu/diag_workloads.py $m "$RUN_S"
done
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if ! want straggler; then
    :
elif [ "$NGPU" -ge 2 ]; then
    run straggler 14 /opt/torch/.venv/bin/torchrun --standalone --nproc-per-node 2 tests/gpu/diag_workloads.py straggler "$RUN_S"
else
    echo "straggler: skipped ($NGPU GPU)"
fi
echo "]" >> "$OUT/snapshots.json"
kill $DP; wait $DP
grep -E "WARN|ERROR" "$W/daemon.log" | tail -5
