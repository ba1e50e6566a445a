#!/usr/bin/env bash
# What a 2-rank DDP training job does per second, as ethand sees it: ethand at its defaults
# watches tests/gpu/train_bench.py (modes none: the bench leaves this daemon alone); /metrics
# is read twice, 10 s apart, mid-run. Run from the repository root, as root, on a 2-GPU machine:
#
#   OUT=/tmp/ddp-syscalls bash scripts/gpu-ddp-syscalls.sh
#
# Writes to $OUT: sys1.txt / sys2.txt (ethand_process_syscalls_total), gpu1.txt / gpu2.txt
# (ethand_process_gpu_api_calls_total), info.txt (pids and thread names), snap.txt
# (`ethand snapshot` of each), train.log, daemon.log. Needs .device-bin/ethand (ETHAND) and
# the Python of /opt/torch/.venv (PY). Found with it (docs/performance-analysis.md): DDP's
# per-gradient cuMemcpyDtoDAsync_v2 calls and CUDA's sched_yield wait loops.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ddp-syscalls}
ETHAND=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
W=$(mktemp -d)
cat > $W/e.toml <<EOT
[daemon]
socket = "$W/e.sock"
[prometheus]
listen = "127.0.0.1:9479"
EOT
"$ETHAND" run --config $W/e.toml > $OUT/daemon.log 2>&1 &
D=$!
sleep 4
"$PY" -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/train_bench.py run \
  --workload ddp --ethand "$ETHAND" --model transformer --device cuda --modes none --rounds 3 --seg-s 10 \
  --config-prefix $W/x --listen 127.0.0.1:9480 --out-json $W/ddp.json > $OUT/train.log 2>&1 &
T=$!
sleep 35
P=$(pgrep -f "workload ddp" | tr '\n' ' ')
echo "pids: $P" > $OUT/info.txt
for p in $P; do echo "== $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"; ls /proc/$p/task | while read t; do echo "  $t $(cat /proc/$p/task/$t/comm)"; done; done >> $OUT/info.txt
curl -s 127.0.0.1:9479/metrics > $W/m1.txt; sleep 10; curl -s 127.0.0.1:9479/metrics > $W/m2.txt
grep -E '^ethand_process_syscalls_total' $W/m1.txt > $OUT/sys1.txt; grep -E '^ethand_process_syscalls_total' $W/m2.txt > $OUT/sys2.txt
grep -E '^ethand_process_gpu_api_calls_total' $W/m1.txt > $OUT/gpu1.txt; grep -E '^ethand_process_gpu_api_calls_total' $W/m2.txt > $OUT/gpu2.txt
for p in $P; do "$ETHAND" --config $W/e.toml snapshot --pid $p; done > $OUT/snap.txt 2>&1
wait $T; echo "train rc=$?" >> $OUT/info.txt
kill $D; wait $D
