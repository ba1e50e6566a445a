#!/usr/bin/env bash
# What ethand costs a real PyTorch training loop (issue 6, item 1). Run from the repository
# root as root on the GPU machine:
#
#   bash scripts/gpu-bench.sh
#
# Needs .device-bin/ethand (the daemon), the Python of /opt/torch/.venv (torch) and nvidia-smi.
# One training process per workload (tests/gpu/train_bench.py) builds its model once and runs
# rounds x modes timed segments, the mode order rotated every round; between segments it
# starts, stops or switches the daemon itself (modes: none, system, process, op, profiler).
#   1. single GPU: TransformerEncoder LM (d_model 512, 6 layers, 8 heads, seq 128, batch 32,
#      vocab 8192, bf16 autocast, AdamW) fed by a DataLoader (4 workers, pinned memory);
#      default 4 rounds x 5 modes;
#   2. DDP over 2 GPUs (NCCL, torch.distributed.run), same model per rank; rank 0 switches
#      the daemon between dist.barrier()s; default 3 rounds x 4 modes (no profiler). Skipped
#      with a note on a machine with fewer than 2 GPUs.
# Writes to ${OUT:-/tmp/gpu-bench}: gpu-bench.md (tables, target verdict), gpu-bench.json (raw
# samples and analysis), log.txt (everything printed), daemon.log, status.json (`ethand status
# --json` at the end of each workload, after a last segment with BPF statistics on).
# The whole run stays under BUDGET_S seconds (default 540): each workload gets a deadline and
# scales its segments / rounds down to fit; what was skipped is recorded.
# Knobs (environment): MODEL=transformer|resnet, PRECISION=bf16|fp32, BATCH, ROUNDS (single),
# DDP_ROUNDS, SEG_S, DDP_SEG_S, MODES, DDP_MODES, WORKERS, SKIP=single,ddp, BPF_STATS
# (daemon.bpf_stats during the timed segments, default off), SINGLE_SHARE (fraction of the
# budget for the single-GPU run when DDP follows, default 0.55), EXTRA_ARGS (more flags for
# train_bench.py run), GPU_EXTRA (lines added to the configs' [gpu] section), SPEED_REF (host speed reference processes, default 0), DRY_RUN=1
# (no GPU: CPU model, short segments; for testing the script),
# EVENT_COSTS (event-costs.json of scripts/gpu-event-costs.sh, made on this machine: the
# report then estimates the default level's cost bottom-up from the events per step).
set -u
umask 022
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

OUT=${OUT:-/tmp/gpu-bench}
ETHAND=${ETHAND:-$ROOT/.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
LISTEN=${LISTEN:-127.0.0.1:9479}
BUDGET_S=${BUDGET_S:-540}
SINGLE_SHARE=${SINGLE_SHARE:-0.55}
REPORT_RESERVE_S=${REPORT_RESERVE_S:-15}
MODEL=${MODEL:-transformer}
PRECISION=${PRECISION:-}   # empty: train_bench.py's default (bf16 autocast; fp32 on the CPU)
BATCH=${BATCH:-}           # empty: 32 (transformer) / 64 (resnet)
WORKERS=${WORKERS:-}       # empty: 4 DataLoader workers per process
ROUNDS=${ROUNDS:-4}
DDP_ROUNDS=${DDP_ROUNDS:-3}
SEG_S=${SEG_S:-6}
DDP_SEG_S=${DDP_SEG_S:-5}
MODES=${MODES:-none,system,calls,process,op,profiler}
DDP_MODES=${DDP_MODES:-none,system,calls,process,op}
BPF_STATS=${BPF_STATS:-off}
SKIP=${SKIP:-}
DRY_RUN=${DRY_RUN:-0}
EXTRA_ARGS=${EXTRA_ARGS:-}
# More lines for the configs' [gpu] section (e.g. "python_frames = false": the cost of a
# default measured against a run without it).
GPU_EXTRA=${GPU_EXTRA:-}
# Reference processes that measure the host's CPU speed beside the training, each pinned to
# a CPU of its own (the last N; the training and the daemon are kept off them). The report
# then also gives the change at unchanged host speed. Off by default: on the H200 VM each
# vCPU's speed moves on its own, and a round's paired change correlated only 0.09-0.28 with
# the reference's (runs 20-22, bench/results/gpu-training/), too little to narrow the interval.
SPEED_REF=${SPEED_REF:-0}
EVENT_COSTS=${EVENT_COSTS:-}
KEEP_WORK=${KEEP_WORK:-0}
# Keep NVLink SHARP / multicast off (these machines do not allow it); never unset.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

[ -x "$PY" ] || PY=$(command -v python3 || echo python3)
BENCH="$ROOT/tests/gpu/train_bench.py"
T0=$(date +%s)
skipped() { case ",$SKIP," in *",$1,"*) return 0 ;; esac; return 1; }

mkdir -p "$OUT" || exit 2
rm -f "$OUT/log.txt" "$OUT/gpu-bench.md" "$OUT/gpu-bench.json" "$OUT/status.json" "$OUT/daemon.log"
WORK=$(mktemp -d /tmp/gpu-bench-work.XXXXXX) || exit 2
: > "$OUT/daemon.log"
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!

elapsed() { echo $(($(date +%s) - T0)); }
section() { printf '\n######## [%ss] %s ########\n' "$(elapsed)" "$*"; }
note() { printf '[%ss] %s\n' "$(elapsed)" "$*"; }

# A daemon our Python started and left behind (killed run): only the pid in our pidfile, and
# only while its command line names our work directory.
kill_leftover_daemon() {
    local f=$WORK/daemon.pid p
    [ -s "$f" ] || return 0
    p=$(head -n1 "$f")
    if [ -n "$p" ] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "$WORK/"; then
        note "daemon pid $p left running: SIGTERM"
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    fi
    rm -f "$f"
}
CHILD=
cleanup() {
    [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null && kill -TERM "$CHILD" 2>/dev/null && sleep 2
    kill_leftover_daemon
}
trap cleanup EXIT
trap 'note "interrupted"; cleanup; trap - EXIT; exit 130' INT TERM

# ------------------------------------------------------------------------------ (a) environment
section "(a) environment"
date -u +%FT%TZ
echo "host: $(hostname)  kernel: $(uname -r)  cpus: $(nproc)"
echo "OUT=$OUT WORK=$WORK BUDGET_S=$BUDGET_S PY=$PY ETHAND=$ETHAND DRY_RUN=$DRY_RUN"
env | grep -E '^(NCCL_|TORCH_|NVSHMEM_|CUDA_|OMP_)' | sort
if [ -f "$ETHAND" ] && [ ! -x "$ETHAND" ]; then chmod +x "$ETHAND" 2>/dev/null; fi
if [ ! -x "$ETHAND" ]; then
    note "FATAL: $ETHAND missing (build it and copy it into .device-bin/)"
    exit 2
fi
echo "binary $ETHAND: $(stat -c %s "$ETHAND") bytes, sha256 $(sha256sum "$ETHAND" | cut -c1-16)"
timeout 10 "$ETHAND" --version 2>&1
OTHERS=$(pgrep -a -x ethand 2>/dev/null)
if [ -n "$OTHERS" ]; then
    note "WARNING: other ethand processes run on this machine (mode none is then not 'no ethand'):"
    echo "$OTHERS"
fi
GPUS=$(timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1)
echo "--- nvidia-smi"
echo "$GPUS"
timeout 20 nvidia-smi topo -m 2>&1 | head -n 6
NGPU=$(printf '%s\n' "$GPUS" | grep -c '^[0-9]')
if [ "$DRY_RUN" = 1 ]; then
    DEVICE_ARGS="--device cpu --dry-run"
    NGPU_DDP=${NGPU_DDP:-2}   # CPU (gloo) DDP in a dry run
    GPUS="(dry run on the CPU) $GPUS"
else
    DEVICE_ARGS="--device cuda"
    NGPU_DDP=$NGPU
fi
echo "GPUs: $NGPU"

# ------------------------------------------------------------------------------ (b) configs
# One config per level (all share the socket, so `ethand --config ANY ...` reaches whichever
# daemon runs); the rest are the defaults (interval 1 s, rescan 2 s, NVML on). BPF run-time
# statistics are off in the timed segments (they cost ~100 ns per probe run); the last segment
# of each workload runs with ethand-stats-LEVEL.toml (bpf_stats = always) for status.json.
write_config() { # FILE BPF_STATS LEVEL
    cat > "$1" <<EOF
# Written by scripts/gpu-bench.sh
[daemon]
socket = "$WORK/ethand.sock"
log = "info"
bpf_stats = "$2"

[prometheus]
listen = "$LISTEN"

[gpu]
level = "$3"
$GPU_EXTRA
EOF
}
for lv in system calls process op; do
    write_config "$WORK/ethand-bench-$lv.toml" "$BPF_STATS" "$lv"
    write_config "$WORK/ethand-stats-$lv.toml" always "$lv"
done
DEFAULT_LEVEL=$("$ETHAND" config default 2>/dev/null | awk '/^\[/{s=$0} s=="[gpu]" && /^level *=/{gsub(/[" ]/,"",$0); sub(/level=/,"",$0); print; exit}')
DEFAULT_LEVEL=${DEFAULT_LEVEL:-process}
echo "--- config (level process; the others differ only in gpu.level)"
cat "$WORK/ethand-bench-process.toml"
echo "default gpu level (ethand config default): $DEFAULT_LEVEL"

COMMON=(--ethand "$ETHAND" --config-prefix "$WORK/ethand-bench" --stats-config "$WORK/ethand-stats-$DEFAULT_LEVEL.toml"
    --listen "$LISTEN" --daemon-log "$OUT/daemon.log" --pidfile "$WORK/daemon.pid" --model "$MODEL"
    --speed-ref "$SPEED_REF")
[ -n "$PRECISION" ] && COMMON+=(--precision "$PRECISION")
[ -n "$BATCH" ] && COMMON+=(--batch "$BATCH")
[ -n "$WORKERS" ] && COMMON+=(--workers "$WORKERS")
# shellcheck disable=SC2206
DEVARGS=($DEVICE_ARGS $EXTRA_ARGS)
CMDS="OUT=$OUT BUDGET_S=$BUDGET_S MODEL=$MODEL BPF_STATS=$BPF_STATS DRY_RUN=$DRY_RUN SPEED_REF=$SPEED_REF bash scripts/gpu-bench.sh"
RUNS=()

# run_single / run_ddp: each under `timeout` a little past its deadline (the Python stops by
# itself before it; the timeout only guards against a hang).
run_bench() { # LABEL DEADLINE CMD...
    local label=$1 dl=$2 rc
    shift 2
    local to=$((dl - $(date +%s) + 30))
    [ "$to" -lt 30 ] && to=30
    note "command: $*"
    CMDS="$CMDS
$*"
    timeout -k 10 "$to" "$@" < /dev/null &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=
    note "$label exited $rc"
    kill_leftover_daemon
    return "$rc"
}

# ------------------------------------------------------------------------------ (c) single GPU
section "(c) single GPU: rounds x modes ($MODES)"
if skipped single; then
    note "single: skipped (SKIP)"
elif [ "$NGPU" -lt 1 ] && [ "$DRY_RUN" != 1 ]; then
    note "single: no GPU found by nvidia-smi: skipped"
else
    if [ "$NGPU_DDP" -ge 2 ] && ! skipped ddp; then
        DL=$(awk -v t="$T0" -v b="$BUDGET_S" -v s="$SINGLE_SHARE" 'BEGIN{printf "%d", t + b * s}')
    else
        DL=$((T0 + BUDGET_S - REPORT_RESERVE_S))
    fi
    RUNS+=(--run "single GPU=$WORK/single.json")
    run_bench single "$DL" "$PY" "$BENCH" run --workload single "${COMMON[@]}" "${DEVARGS[@]}" \
        --modes "$MODES" --rounds "$ROUNDS" --seg-s "$SEG_S" --deadline "$DL" \
        --out-json "$WORK/single.json" --status-out "$WORK/status-single.json"
fi

# ------------------------------------------------------------------------------ (d) DDP 2 GPUs
section "(d) DDP over 2 GPUs (NCCL): rounds x modes ($DDP_MODES)"
if skipped ddp; then
    note "ddp: skipped (SKIP)"
elif [ "$NGPU_DDP" -lt 2 ]; then
    note "ddp: skipped: $NGPU GPU(s), needs 2"
    printf '{"workload":"ddp","segments":[],"skipped":["%s GPU(s) on this machine: DDP needs 2"],"errors":[],"notes":[]}\n' \
        "$NGPU" > "$WORK/ddp.json"
    RUNS+=(--run "DDP 2 GPUs=$WORK/ddp.json")
else
    DL=$((T0 + BUDGET_S - REPORT_RESERVE_S))
    LEFT=$((DL - $(date +%s)))
    RUNS+=(--run "DDP 2 GPUs=$WORK/ddp.json")
    if [ "$LEFT" -lt 60 ]; then
        note "ddp: skipped: ${LEFT}s left of the budget"
        printf '{"workload":"ddp","segments":[],"skipped":["time budget: %ss left"],"errors":[],"notes":[]}\n' \
            "$LEFT" > "$WORK/ddp.json"
    else
        run_bench ddp "$DL" "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
            "$BENCH" run --workload ddp "${COMMON[@]}" "${DEVARGS[@]}" \
            --modes "$DDP_MODES" --rounds "$DDP_ROUNDS" --seg-s "$DDP_SEG_S" --deadline "$DL" \
            --out-json "$WORK/ddp.json" --status-out "$WORK/status-ddp.json"
    fi
fi

# ------------------------------------------------------------------------------ (e) report
section "(e) report"
"$PY" - "$WORK" "$OUT/status.json" <<'EOF'
import json, os, sys
work, out = sys.argv[1], sys.argv[2]
d = {}
for k in ("single", "ddp"):
    p = os.path.join(work, f"status-{k}.json")
    if os.path.exists(p):
        with open(p) as f:
            d[f"{k}-end"] = json.load(f)
with open(out, "w") as f:
    json.dump(d, f, indent=1)
print("status.json:", ", ".join(d) or "no status saved")
EOF
COST_ARGS=()
[ -n "$EVENT_COSTS" ] && COST_ARGS=(--event-costs "$EVENT_COSTS")
timeout 60 "$PY" "$BENCH" report "${RUNS[@]}" --md "$OUT/gpu-bench.md" --json "$OUT/gpu-bench.json" \
    --command "$CMDS" --gpus "$GPUS" "${COST_ARGS[@]}" \
    --extra "host=$(hostname), kernel $(uname -r), $(getconf _NPROCESSORS_ONLN) CPUs online (OMP_NUM_THREADS=$OMP_NUM_THREADS)" \
    --extra "ethand=$("$ETHAND" --version 2>&1 | head -n1), sha256 $(sha256sum "$ETHAND" | cut -c1-16)" \
    --extra "daemon config=defaults except socket, listen, bpf_stats = $BPF_STATS (timed segments), gpu.level per mode; default level: $DEFAULT_LEVEL" \
    --extra "NCCL env=NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS" \
    --extra "budget=${BUDGET_S}s, used $(elapsed)s before the report"
echo "--- daemon.log: warnings and errors"
grep -E 'WARN|ERROR|panick' "$OUT/daemon.log" | tail -n 20 | cut -c1-300
echo "elapsed: $(elapsed)s; files in $OUT:"
ls -la "$OUT"
if [ "$KEEP_WORK" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
trap - EXIT
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit 0
