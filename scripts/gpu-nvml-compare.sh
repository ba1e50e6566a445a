#!/bin/bash
# Every native GPU series and dcgm-exporter alias of ethand's /metrics next to nvidia-smi's
# reading of the same moment, on a GPU kept busy by a PyTorch job (matrix products plus
# host-to-device copies, RANK/TORCHELASTIC_RUN_ID set so that it has a job and a rank).
# The daemon runs with its embedded defaults plus dcgm_aliases and workload_labels on (and its
# socket and /metrics address moved). Three rounds, 5 s apart, each one /metrics scrape and one
# `nvidia-smi --query-gpu` of every field this nvidia-smi knows; once: `nvidia-smi -q`, a GPM
# `nvidia-smi dmon`, `ethand status --json` and a snapshot of the job. Then
# tests/gpu/nvml_compare.py writes $OUT/report.md (the table in docs/gpu.md).
#
# Run from the repository root as root, with .device-bin/ethand built. Knobs (env):
#   OUT=/tmp/gpu-nvml-compare  ETHAND=.device-bin/ethand  PY=/opt/torch/.venv/bin/python
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-nvml-compare}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
PY3=$(command -v python3 || echo "$PY")
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/gpu-nvml-compare.XXXXXX)
DP="" JP=""
cleanup() {
    [ -n "$JP" ] && kill -KILL -- "-$JP" 2>/dev/null
    [ -n "$DP" ] && kill "$DP" 2>/dev/null
    sleep 0.5
    cp "$W/daemon.log" "$OUT/daemon.log" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
log() { echo "[$(date +%T)] $*"; }

{
    echo "date: $(date -u +%FT%TZ)"
    echo "git: $(git rev-parse HEAD 2>/dev/null)"
    echo "ethand: $(timeout 10 "$E" --version 2>&1)"
    timeout 20 nvidia-smi -L 2>&1
    timeout 20 nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>&1
} > "$OUT/env.txt"
cat "$OUT/env.txt"

cat > "$W/cfg.toml" <<CFG
[daemon]
socket = "$W/ethand.sock"
[prometheus]
listen = "127.0.0.1:9479"
[devices]
dcgm_aliases = true
workload_labels = true
CFG
cp "$W/cfg.toml" "$OUT/config.toml"
"$E" --config "$W/cfg.toml" run > "$W/daemon.log" 2>&1 &
DP=$!
for _ in $(seq 1 120); do
    timeout 5 "$E" --config "$W/cfg.toml" status > /dev/null 2>&1 && break
    kill -0 "$DP" 2>/dev/null || { log "daemon died"; tail -20 "$W/daemon.log"; exit 1; }
    sleep 0.5
done
log "daemon up (pid $DP)"

# The job: bf16 matrix products and a 64 MiB pinned host-to-device copy every 50 ms.
cat > "$W/job.py" <<'PYX'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
h = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
d = torch.empty_like(h, device="cuda")
print("ready", flush=True)
end = time.time() + 75
last = 0.0
while time.time() < end:
    for _ in range(20):
        b = a @ a
    if time.time() - last > 0.05:
        d.copy_(h, non_blocking=True)
        last = time.time()
    torch.cuda.synchronize()
PYX
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=nvml-compare-job \
    setsid "$PY" "$W/job.py" > "$OUT/job.log" 2>&1 &
JP=$!
for _ in $(seq 1 120); do
    grep -q ready "$OUT/job.log" 2>/dev/null && break
    sleep 0.5
done
log "job up (pid $JP); warming 22 s (GPM needs two samples, energy/PCIe/NVLink a 10 s counters read)"
sleep 22

# Every --query-gpu field this nvidia-smi knows, of the ones compared.
WANT="driver_version utilization.gpu utilization.memory utilization.encoder utilization.decoder
memory.total memory.reserved memory.used memory.free temperature.gpu temperature.memory
power.draw power.draw.instant enforced.power.limit clocks.sm clocks.mem pcie.link.gen.current
pcie.link.gen.gpucurrent pcie.link.gen.max pcie.link.gen.gpumax pcie.link.width.current
pcie.link.width.max retired_pages.single_bit_ecc.count retired_pages.double_bit.count
retired_pages.pending remapped_rows.correctable remapped_rows.uncorrectable
remapped_rows.pending remapped_rows.failure clocks_event_reasons.active
clocks_throttle_reasons.active ecc.errors.corrected.volatile.total
ecc.errors.uncorrected.volatile.total"
timeout 20 nvidia-smi --help-query-gpu > "$W/help.txt" 2>&1
FIELDS=""
for f in $WANT; do
    # A field is listed as "name" or as an alias of another ("clocks.current.sm" or "clocks.sm").
    grep -q "\"$f\"" "$W/help.txt" && FIELDS="$FIELDS${FIELDS:+,}$f"
done
echo "$FIELDS" > "$OUT/smi-fields.txt"

timeout 30 nvidia-smi dmon --gpm-metrics 1,2,3,5,10,20,21 -d 1 -c 12 > "$OUT/smi-gpm-dmon.txt" 2>&1 &
GP=$!
for r in 1 2 3; do
    t0=$(date +%s.%N)
    timeout 5 curl -s -m 4 http://127.0.0.1:9479/metrics > "$OUT/metrics-$r.txt"
    t1=$(date +%s.%N)
    timeout 10 nvidia-smi --query-gpu="$FIELDS" --format=csv > "$OUT/smi-$r.csv" 2>&1
    t2=$(date +%s.%N)
    echo "round $r: metrics $t0-$t1 nvidia-smi $t1-$t2" >> "$OUT/rounds.txt"
    [ $r = 2 ] && timeout 30 nvidia-smi -q > "$OUT/smi-q.txt" 2>&1
    sleep 4
done
wait "$GP"
timeout 30 "$E" --config "$W/cfg.toml" status > "$OUT/status.txt" 2>&1
timeout 30 "$E" --config "$W/cfg.toml" status --json > "$OUT/status.json" 2>&1
timeout 60 "$E" --config "$W/cfg.toml" snapshot --pid "$JP" --json > "$OUT/snapshot-job.json" 2> "$OUT/snapshot-job.err"
cat "$OUT/rounds.txt"
timeout 60 "$PY3" tests/gpu/nvml_compare.py "$OUT" > "$OUT/report.md" 2> "$OUT/compare.err"
cat "$OUT/report.md"
