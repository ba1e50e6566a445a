#!/bin/bash
# Issue 42's checks still to run on the GPU machine, in one call each (PART=1 or PART=2, each
# under ten minutes), results in $OUT (the device tool's folder) as one archive:
#   PART=1  record through the running daemon (PyTorch, JAX, a CUDA graph's kernels:
#           scripts/gpu-record-tracks.sh), then the injected scenarios not yet run
#           (scripts/gpu-scenarios.sh with INJECT=1) within what is left of ~570 s
#   PART=2  the dormant library's cost on the training bench's model, 24 alternating rounds
#           (scripts/gpu-busy-vs-nvml.sh), and the CUDA-graph second-window check with four
#           windows each as it is and with ETHAND_CUPTI_KEEP=1 (scripts/gpu-graph-windows.sh)
# Root, repository root, .device-bin/ethand (gunzipped from .device-bin/ethand.gz first).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:?the device tool sets OUT}
PART=${PART:-1}
[ -x .device-bin/ethand ] || { gunzip -c .device-bin/ethand.gz > .device-bin/ethand && chmod +x .device-bin/ethand; } || exit 2
W=$(mktemp -d)
case $PART in
1)
    OUT=$W/rec CASES="torch-daemon jax-daemon graph-daemon" timeout 200 bash scripts/gpu-record-tracks.sh > "$W/rec.log" 2>&1
    OUT=$W/suite INJECT=1 BUDGET_S=$((570 - SECONDS)) \
        ONLY="pageable_copies_fixed bulk_copy sync_checkpoint cpu_contention cpu_contention_alone disk_bound" \
        bash scripts/gpu-scenarios.sh > "$W/suite.log" 2>&1
    ;;
2)
    OUT=$W/dormant VARIANTS=none PROF=0 ROUNDS=24 ROUND_S=4 timeout 330 bash scripts/gpu-busy-vs-nvml.sh > "$W/dormant.log" 2>&1
    rm -f "$W"/dormant/nvml-util.csv
    OUT=$W/graph VARIANTS="plain keep" ROUNDS=4 RUN_S=60 timeout 200 bash scripts/gpu-graph-windows.sh > "$W/graph.log" 2>&1
    ;;
esac
find "$W" -name '*.pftrace' -delete
find "$W" -name 'rec.json' -exec gzip -q {} +
rm -f "$W"/*.tgz
tar czf "$OUT/issue42-part$PART.tgz" -C "$W" .
grep -h -v '^$' "$W"/*/log.txt 2>/dev/null | cut -c1-600 | tail -60
rm -rf "$W"
