#!/bin/bash
# GPU scenario suite: training-like workloads with one known bottleneck each
# (tests/gpu/scenarios.py, expected findings in tests/gpu/scenarios.json), diagnosed by ethand AT
# ITS DEFAULT SETTINGS: the daemon runs with the embedded defaults, only its socket and /metrics
# address moved. Per scenario: daemon snapshots of the worker and of its launcher (bash -c or
# torchrun, which stays the parent), standalone snapshots of both (`snapshot --standalone`), the
# text snapshot and its HTML report, the scenario's output; nvidia-smi GPM vs ethand /metrics for healthy_resnet and
# sync_storm; launch-sample cost from tiny_kernels' per-step log. Then report.md
# (tests/gpu/scenarios_report.py) and $OUT.tgz.
#
# Run from the repository root as root, with .device-bin/ethand built. Knobs (env):
#   OUT=/tmp/gpu-scenarios  ETHAND=.device-bin/ethand  PY=/opt/torch/.venv/bin/python
#   ONLY="name ..."   subset of scenarios.json
#   RUN_S=30          scenario run length after its ready line (raised to what the snapshots
#                     need: WARM_S + 22 s, + 7 s where the GPM cross-check runs)
#   WARM_S=10         seconds after ready before the snapshots
#   BUDGET_S=520      global deadline: a scenario that would end after it is skipped (and listed)
#   READY_S=120       longest wait for a scenario's ready line
#   NGPU              GPUs (default: nvidia-smi -L); scenarios needing more are skipped
#   INJECT=1          start every scenario with CUDA_INJECTION64_PATH set to the daemon's
#                     libethand_cupti.so (gpu.cupti_dir, default /var/lib/ethand/cupti), as a
#                     cluster's job template would: the daemon snapshots then hold what the
#                     GPU ran (gpu_activity); the standalone ones say the daemon owns it
#   LAUNCH_SITES=1    diagnosis.launch_sites = true (kernels joined to their launch call
#                     sites; off at the defaults)
# Every command runs under a timeout; a failing scenario is logged and the run goes on.
set -u
cd "$(dirname "$0")/.." || exit 2
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu-scenarios}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
TORCHRUN=${TORCHRUN:-$(dirname "$PY")/torchrun}
ONLY=${ONLY:-}
INJECT=${INJECT:-}
INJECT_LIB=${INJECT_LIB:-/var/lib/ethand/cupti/libethand_cupti.so}
RUN_S=${RUN_S:-30}
WARM_S=${WARM_S:-10}
BUDGET_S=${BUDGET_S:-520}
READY_S=${READY_S:-120}
PY3=$(command -v python3 || echo "$PY")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
exec 3>&1 4>&2
exec > >(tee "$OUT/log.txt") 2>&1
TEE_PID=$!

log() { printf '[%4ds] %s\n' $(($(date +%s) - T0)) "$*"; }
elapsed() { echo $(($(date +%s) - T0)); }

W=$(mktemp -d /tmp/gpu-scenarios.XXXXXX)
CFG=$W/cfg.toml
DP=""
LIVE_GROUPS=""
DATA_FILE=""
SKIPPED=""
FAILED=""

# Stop a process group: TERM, up to 2 s, then KILL.
kill_group() {
    local g=$1 i
    kill -TERM -- "-$g" 2>/dev/null || return 0
    for i in $(seq 1 20); do
        kill -0 -- "-$g" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$g" 2>/dev/null
    return 0
}
forget_group() { LIVE_GROUPS=$(echo " $LIVE_GROUPS " | sed "s/ $1 / /g"); }
cleanup() {
    local g
    for g in $LIVE_GROUPS; do kill -KILL -- "-$g" 2>/dev/null; done
    if [ -n "$DP" ]; then
        kill "$DP" 2>/dev/null
        [ -f "$OUT/daemon.log" ] || cp "$W/daemon.log" "$OUT/daemon.log" 2>/dev/null
    fi
    [ -n "$DATA_FILE" ] && rm -f "$DATA_FILE"
    rm -rf "$W"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ------------------------------------------------------------------ environment and daemon
log "gpu-scenarios: OUT=$OUT ETHAND=$E PY=$PY RUN_S=$RUN_S WARM_S=$WARM_S BUDGET_S=$BUDGET_S ONLY='${ONLY}' INJECT='${INJECT}'"
{
    echo "inject: ${INJECT:+CUDA_INJECTION64_PATH=$INJECT_LIB}"
    echo "launch_sites: ${LAUNCH_SITES:+true}"
    echo "date: $(date -u +%FT%TZ)"
    echo "uname: $(uname -a)"
    echo "cpus: $(nproc)"
    echo "git: $(git rev-parse HEAD 2>/dev/null)"
    echo "ethand: $(timeout 10 "$E" --version 2>&1)"
    echo "nvidia-smi -L:"; timeout 20 nvidia-smi -L 2>&1
    echo "torch: $(timeout 60 "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tail -1)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
NGPU=${NGPU:-$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
cp tests/gpu/scenarios.json "$OUT/scenarios.json"

# The embedded defaults, but for where the socket and /metrics are.
cat > "$CFG" <<CFG
[daemon]
socket = "$W/ethand.sock"
[prometheus]
listen = "127.0.0.1:9479"
CFG
[ -n "${LAUNCH_SITES:-}" ] && printf '[diagnosis]\nlaunch_sites = true\n' >> "$CFG"
"$E" --config "$CFG" run > "$W/daemon.log" 2>&1 &
DP=$!
DAEMON_OK=0
for i in $(seq 1 120); do
    if timeout 5 "$E" --config "$CFG" status > /dev/null 2>&1; then DAEMON_OK=1; break; fi
    kill -0 "$DP" 2>/dev/null || break
    sleep 0.5
done
if [ $DAEMON_OK = 1 ]; then
    log "daemon up (pid $DP)"
    timeout 30 "$E" --config "$CFG" status --json > "$OUT/status-start.json" 2> "$OUT/status-start.err"
    [ -s "$OUT/status-start.err" ] || rm -f "$OUT/status-start.err"
else
    log "DAEMON DID NOT START: no daemon snapshots (standalone ones still run)"
    tail -20 "$W/daemon.log"
fi

# ------------------------------------------------------------------ helpers per scenario

# A 2 GiB file on a disk (not tmpfs, where O_DIRECT is refused) for disk_bound.
# disk_dir: a writable disk-backed directory (not tmpfs) with 3 GiB free, or nothing.
disk_dir() {
    local c avail
    for c in "$W" /var/tmp "$PWD"; do
        [ -d "$c" ] && [ -w "$c" ] || continue
        case $(stat -f -c %T "$c" 2>/dev/null) in tmpfs | ramfs) continue ;; esac
        avail=$(df -Pk "$c" 2>/dev/null | awk 'NR == 2 { print $4 }')
        [ "${avail:-0}" -gt $((3 * 1024 * 1024)) ] || continue
        echo "$c"
        return 0
    done
    return 1
}

make_data_file() {
    [ -n "$DATA_FILE" ] && [ -f "$DATA_FILE" ] && return 0
    local dir
    if ! dir=$(disk_dir); then
        log "disk_bound: no disk-backed directory with 3 GiB free"
        return 1
    fi
    DATA_FILE=$dir/ethand-scenario-data.bin
    log "disk_bound: writing 2 GiB to $DATA_FILE ($(stat -f -c %T "$dir"))"
    # Random blocks (a backend that skips zero blocks cannot short-cut the reads), fsync'ed.
    if ! timeout 180 "$PY3" - "$DATA_FILE" <<'PYX'; then
import os, sys
blk = os.urandom(8 << 20)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for i in range(256):
    os.write(fd, blk[i % 7:] + blk[:i % 7])
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
PYX
        log "disk_bound: could not write the data file"
        rm -f "$DATA_FILE"
        DATA_FILE=""
        return 1
    fi
    log "disk_bound: data file ready"
}

# snap FILE ARGS...: one `ethand snapshot` into the scenario dir ($D), under a timeout.
snap() {
    local f=$1 t rc
    shift
    t=$(date +%s.%N)
    timeout 60 "$E" --config "$CFG" snapshot "$@" > "$D/$f" 2> "$D/${f%.*}.err"
    rc=$?
    echo "$f rc=$rc start=$t end=$(date +%s.%N) args: $*" >> "$D/commands.txt"
    [ -s "$D/${f%.*}.err" ] || rm -f "$D/${f%.*}.err"
    [ $rc = 0 ] || log "  snapshot $f: rc=$rc $(head -c 300 "$D/${f%.*}.err" 2>/dev/null | tr '\n' ' ')"
}

# nvidia-smi GPM (falling back to utilization) and ethand's /metrics, once a second for ~7 s.
gpm_crosscheck() {
    local f=$D/gpm-nvidia-smi.txt gp i ts
    (
        for args in "--gpm-metrics 2,3,5,10 -o T" "-s u -o T" "-s u"; do
            echo "## $(date +%T) nvidia-smi dmon $args -d 1 -c 6"
            # shellcheck disable=SC2086
            timeout 20 nvidia-smi dmon $args -d 1 -c 6 > "$W/dmon.out" 2>&1
            rc=$?
            cat "$W/dmon.out"
            if [ $rc = 0 ] && grep -qE '^ *[0-9]' "$W/dmon.out"; then break; fi
            echo "## refused or no data (rc=$rc); next fallback"
        done
    ) > "$f" 2>&1 &
    gp=$!
    for i in 1 2 3 4 5 6 7; do
        ts=$(date +%T)
        timeout 2 curl -s -m 1 http://127.0.0.1:9479/metrics 2>/dev/null |
            grep -E '^ethand_gpu_(sm_activity|sm_occupancy|tensor_activity|dram_bandwidth|utilization)' |
            sed "s/^/$ts /" >> "$D/gpm-ethand.txt"
        sleep 1
    done
    wait "$gp"
}

# Top findings of each JSON snapshot of the scenario, one line each.
brief() {
    timeout 20 "$PY3" - "$D" "$1" <<'PYX'
import json, os, sys
d, exp = sys.argv[1], sys.argv[2]
for f in ("daemon-worker", "daemon-launcher", "standalone-worker", "standalone-launcher"):
    try:
        t = json.load(open(os.path.join(d, f + ".json")))
    except Exception as e:
        print(f"  {f:20} no snapshot ({type(e).__name__})")
        continue
    fs = [(x.get("id"), x.get("severity"), round(x.get("impact") or 0, 2)) for x in t.get("findings") or []]
    top = next((x[0] for x in fs if x[1] in ("warning", "critical")), None)
    ok = "OK " if (top or "none") == exp else "BAD"
    print(f"  {f:20} {ok} top={top or 'none'} expected={exp} findings={fs}")
PYX
}

# run_one NAME LAUNCHER GPUS EXPECTED
run_one() {
    local name=$1 launcher=$2 gpus=$3 expected=$4
    D=$OUT/runs/$name
    mkdir -p "$D"
    local extra=0 run_s lp wp="" hp="" t_ready ready_by end_by rc now
    case $name in healthy_resnet | sync_storm) extra=7 ;; esac
    run_s=$RUN_S
    [ "$run_s" -ge $((WARM_S + extra + 22)) ] || run_s=$((WARM_S + extra + 22))
    echo
    log "######## $name (launcher $launcher, $gpus GPU, expected ${expected})"
    if [ "$gpus" -gt "$NGPU" ]; then
        log "$name: skipped (needs $gpus GPUs, $NGPU here)"
        echo "needs $gpus GPUs, $NGPU here" > "$D/skipped.txt"
        SKIPPED="$SKIPPED $name(gpus)"
        return
    fi
    # Start-up, run, teardown: skip what would end after the deadline.
    now=$(elapsed)
    if [ $((now + run_s + 25)) -gt "$BUDGET_S" ]; then
        log "$name: skipped (budget: ${now}s used, needs ~$((run_s + 25))s of $BUDGET_S)"
        echo "budget: ${now}s used of ${BUDGET_S}s, needs ~$((run_s + 25))s" > "$D/skipped.txt"
        SKIPPED="$SKIPPED $name(budget)"
        return
    fi
    local envs=()
    # Every scenario logs its steps: the step rate of a problem and of its fix is the measured
    # speed-up an estimate is checked against (tests/gpu/scenarios_report.py).
    envs+=("STEP_LOG=$D/steps.txt")
    [ -n "$INJECT" ] && envs+=("CUDA_INJECTION64_PATH=$INJECT_LIB")
    case $name in *checkpoint) envs+=("CKPT_DIR=$(disk_dir || echo /tmp)") ;; esac
    if [ "$name" = disk_bound ]; then
        if ! make_data_file; then
            echo "no data file" > "$D/skipped.txt"
            FAILED="$FAILED $name"
            return
        fi
        envs+=("DATA_FILE=$DATA_FILE")
    fi
    # setsid: the launcher leads its own process group (killed whole at the end) and $! is its
    # pid (setsid execs, it does not fork, in a background job).
    if [ "$launcher" = torchrun ]; then
        env ${envs[@]+"${envs[@]}"} setsid "$TORCHRUN" --standalone --nproc-per-node "$gpus" \
            tests/gpu/scenarios.py "$name" "$run_s" > "$D/stdout.txt" 2> "$D/stderr.txt" &
    else
        # The trailing echo keeps bash from exec'ing python: bash stays the parent.
        env ${envs[@]+"${envs[@]}"} setsid bash -c "$PY tests/gpu/scenarios.py $name $run_s; echo exit=\$?" \
            > "$D/stdout.txt" 2> "$D/stderr.txt" &
    fi
    lp=$!
    LIVE_GROUPS="$LIVE_GROUPS $lp"
    ready_by=$(($(date +%s) + READY_S))
    [ $ready_by -le $((T0 + BUDGET_S)) ] || ready_by=$((T0 + BUDGET_S))
    while :; do
        wp=$(grep -m1 -oE '^ready [0-9]+' "$D/stdout.txt" 2>/dev/null | awk '{ print $2 }')
        [ -n "$wp" ] && break
        kill -0 "$lp" 2>/dev/null || break
        [ "$(date +%s)" -lt $ready_by ] || break
        sleep 0.5
    done
    if [ -z "$wp" ]; then
        log "$name: FAILED, no ready line ($(kill -0 "$lp" 2>/dev/null && echo "still starting after ${READY_S}s" || echo "exited"))"
        tail -15 "$D/stderr.txt"
        kill_group "$lp"
        wait "$lp" 2>/dev/null
        forget_group "$lp"
        FAILED="$FAILED $name"
        return
    fi
    t_ready=$(date +%s)
    log "$name: ready: launcher $lp, worker $wp (run ${run_s}s)"
    echo "launcher=$lp worker=$wp ready_unix=$(date +%s.%N) run_s=$run_s warm_s=$WARM_S" > "$D/pids.txt"
    if [ "$name" = cpu_contention ]; then
        # Six busy loops outside the snapshotted tree (children of this script), three bound
        # to each of the worker's CPUs 0 and 1: with all six free to use both, the kernel once
        # put all six on CPU 0 and left the worker CPU 1 to itself (no contention to find).
        setsid bash -c 'for i in 0 1 2 3 4 5; do "$0" -c "import os
os.sched_setaffinity(0, {$((i % 2))})
while True: pass" & done; wait' "$PY3" > /dev/null 2>&1 &
        hp=$!
        LIVE_GROUPS="$LIVE_GROUPS $hp"
        log "$name: 6 hogs, 3 bound to each of CPUs 0 and 1 (group $hp)"
    fi
    sleep "$WARM_S"
    kill -0 "$lp" 2>/dev/null || log "$name: the launcher exited before the snapshots"
    ps -e -o pid,ppid,pgid,psr,pcpu,stat,comm,args --sort=pgid 2>/dev/null |
        awk -v g="$lp" -v h="${hp:-x}" 'NR == 1 || $3 == g || $3 == h' > "$D/ps.txt"
    [ $extra -gt 0 ] && gpm_crosscheck
    if [ $DAEMON_OK = 1 ]; then
        snap daemon-worker.json --pid "$wp" --window 8 --json
        snap daemon-launcher.json --pid "$lp" --window 8 --json
        snap daemon-worker.txt --pid "$wp" --window 8 --html "$D/daemon-worker.html"
    fi
    local s1 s2
    snap standalone-worker.json --standalone --pid "$wp" --duration 8 --json &
    s1=$!
    snap standalone-launcher.json --standalone --pid "$lp" --duration 8 --json &
    s2=$!
    wait "$s1" "$s2"
    log "$name: snapshots taken ($(($(date +%s) - t_ready))s after ready)"
    brief "$expected"
    end_by=$((t_ready + run_s + 30))
    while kill -0 "$lp" 2>/dev/null && [ "$(date +%s)" -lt $end_by ]; do sleep 0.5; done
    kill -0 "$lp" 2>/dev/null && log "$name: still running ${run_s}s + 30s after ready: killed"
    kill_group "$lp"
    wait "$lp" 2>/dev/null
    rc=$?
    forget_group "$lp"
    if [ -n "$hp" ]; then
        kill_group "$hp"
        wait "$hp" 2>/dev/null
        forget_group "$hp"
    fi
    # bash -c always ends with the echo's 0: the worker's own status is its exit= line.
    local wexit
    wexit=$(grep -m1 -oE '^exit=[0-9]+' "$D/stdout.txt" | cut -d= -f2)
    echo "launcher_rc=$rc${wexit:+ worker_exit=$wexit}" >> "$D/pids.txt"
    log "$name: ended, launcher rc=$rc${wexit:+ worker exit=$wexit} $(grep -m1 '^done ' "$D/stdout.txt")"
    [ $rc = 0 ] && [ "${wexit:-0}" = 0 ] || FAILED="$FAILED $name(rc=$rc${wexit:+/exit=$wexit})"
    if [ "$name" = disk_bound ] && [ -n "$DATA_FILE" ]; then
        rm -f "$DATA_FILE"
        DATA_FILE=""
    fi
}

# ------------------------------------------------------------------ the scenarios
mapfile -t SCEN < <("$PY3" -c '
import json
for s in json.load(open("tests/gpu/scenarios.json"))["scenarios"]:
    print(s["name"], s["launcher"], s.get("gpus", 1), s["expected"] or "none")
')
log "${#SCEN[@]} scenarios in tests/gpu/scenarios.json, $NGPU GPU(s)"
for line in "${SCEN[@]}"; do
    read -r name launcher gpus expected <<< "$line"
    if [ -n "$ONLY" ]; then
        case " $ONLY " in *" $name "*) ;; *) continue ;; esac
    fi
    if [ $DAEMON_OK = 1 ] && ! kill -0 "$DP" 2>/dev/null; then
        log "DAEMON EXITED: no more daemon snapshots"
        tail -20 "$W/daemon.log"
        DAEMON_OK=0
    fi
    run_one "$name" "$launcher" "$gpus" "$expected"
done

# ------------------------------------------------------------------ the end
echo
if [ $DAEMON_OK = 1 ]; then
    timeout 30 "$E" --config "$CFG" status --json > "$OUT/status-end.json" 2> "$OUT/status-end.err"
    [ -s "$OUT/status-end.err" ] || rm -f "$OUT/status-end.err"
fi
kill "$DP" 2>/dev/null
for i in $(seq 1 150); do kill -0 "$DP" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$DP" 2>/dev/null
wait "$DP" 2>/dev/null
log "daemon stopped, rc=$?"
DP=""
cp "$W/daemon.log" "$OUT/daemon.log"
echo "daemon log, last warnings/errors:"
grep -E "WARN|ERROR" "$OUT/daemon.log" | tail -10
timeout 60 "$PY3" tests/gpu/scenarios_report.py "$OUT" > "$OUT/report.md" 2> "$OUT/report.err"
[ -s "$OUT/report.err" ] && cat "$OUT/report.err"
[ -s "$OUT/report.err" ] || rm -f "$OUT/report.err"
echo
cat "$OUT/report.md"
echo
[ -n "$SKIPPED" ] && log "skipped:$SKIPPED"
[ -n "$FAILED" ] && log "failed:$FAILED"
log "done in $(elapsed)s; archive $OUT.tgz"
# Let tee finish the log before it is archived.
exec 1>&3 2>&4
for i in $(seq 1 50); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo "$OUT.tgz"
