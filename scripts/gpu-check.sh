#!/usr/bin/env bash
# ethand on a real GPU machine, against ground truth. Run from the repository root as root:
#
#   bash scripts/gpu-check.sh
#
# Needs the prebuilt binaries .device-bin/ethand (the daemon) and
# .device-bin/ethand-gpu-workload (tests/gpu-workload), the Python of /opt/torch/.venv (torch,
# cupy) and nvidia-smi. Writes at most 8 files, no folders, to ${OUT:-/tmp/gpu-check}:
#   log.txt        everything printed (this script's whole output)
#   results.json   per-step status, every ground-truth comparison, NVML check, cost per level
#   snapshots.json every `ethand snapshot --json` taken (BEFORE/AFTER per workload)
#   status.json    `ethand status --json` at start, after the workloads, after the level
#                  round trip and at the end
#   metrics.txt    /metrics at idle, then a sample taken while the GPU was busy
#   daemon.log     the daemon's own log (every start)
# Steps: (a) environment, (b) daemon start, (c) workloads vs ground truth at level process
# (CUDA driver API, PyTorch, CuPy), (d) NCCL all-reduce on 2 GPUs, (e) status, /metrics and
# NVML vs nvidia-smi, (c2) the CUDA driver workload at levels op and system (live `ethand
# level`; a failed switch is recorded and replaced by a daemon restart at that level), (f) cost
# per level (none/process/op/system, interleaved), (g) daemon stop. Each step is time-bounded;
# a failing step is recorded and the run goes on.
# The whole run stays under BUDGET_S seconds (default 520): later steps are skipped past it.
# Exit status: 0 when every hard comparison passed, 1 otherwise.
set -u
umask 022
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

OUT=${OUT:-/tmp/gpu-check}
ETHAND=${ETHAND:-$ROOT/.device-bin/ethand}
WORKLOAD=${WORKLOAD:-$ROOT/.device-bin/ethand-gpu-workload}
PY=${PY:-/opt/torch/.venv/bin/python}
LISTEN=${LISTEN:-127.0.0.1:9477}
BUDGET_S=${BUDGET_S:-520}
BENCH_S=${BENCH_S:-8}
RUST_BENCH_S=${RUST_BENCH_S:-5}
RESCAN_WAIT=${RESCAN_WAIT:-1.5}   # after `ready`: the daemon rescans maps every 500 ms
SETTLE_WAIT=${SETTLE_WAIT:-2}     # after the work: the daemon reads its maps every 500 ms
KEEP_WORK=${KEEP_WORK:-0}
# RUN_AS: how the daemon runs: "unit" (the default: as systemd/ethand.service runs it, user
# ethand with the unit's capabilities as ambient ones, no_new_privs), "user" (started as root
# with daemon.user = "ethand": it switches after start-up), "root" (started as root, stays uid 0).
RUN_AS=${RUN_AS:-unit}
# SKIP: comma-separated steps to leave out (survey, levels, nccl); BENCH_STATES: the
# interleaved order of the cost runs.
SKIP=${SKIP:-}
BENCH_STATES=${BENCH_STATES:-none process op system none process op}
skipped() { case ",$SKIP," in *",$1,"*) return 0 ;; esac; return 1; }
# ANCHOR=1: an idle process maps libcuda.so.1 before the daemon starts and lives until the end,
# so that the daemon finds libcuda first in a process that never exits (for a daemon that
# re-attaches through /proc/<found_in_pid>/root/ on `ethand level`). Off by default: the
# level round trip in (c2) checks that re-attaching works once the finding process is gone.
ANCHOR=${ANCHOR:-0}
# Keep NVLink SHARP / multicast off (these machines do not allow it); never unset.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
export PYTHONUNBUFFERED=1

[ -x "$PY" ] || PY=$(command -v python3 || echo python3)
CMP="$ROOT/tests/gpu/compare.py"
T0=$(date +%s)

mkdir -p "$OUT" || exit 2
rm -f "$OUT/log.txt" "$OUT/results.json" "$OUT/snapshots.json" "$OUT/status.json" \
    "$OUT/metrics.txt" "$OUT/daemon.log"
WORK=$(mktemp -d /tmp/gpu-check-work.XXXXXX) || exit 2
mkdir -p "$WORK/snap" "$WORK/cmp" "$WORK/run"
# The daemon's user reads the configs and creates the socket in $WORK/run.
if [ "$RUN_AS" != root ]; then
    id ethand > /dev/null 2>&1 ||
        useradd --system --no-create-home --home-dir / --shell /usr/sbin/nologin ethand || exit 2
    chmod 0711 "$WORK"
    chown ethand: "$WORK/run"
fi
# The unit's capabilities, as setpriv takes them: ",+bpf,+perfmon,...".
UNIT_CAPS=$(sed -n 's/^CapabilityBoundingSet=//p' systemd/ethand.service |
    tr ' ' '\n' | sed -n 's/^CAP_\(.*\)/,+\L\1/p' | tr -d '\n')
case "$RUN_AS" in
unit) AS_UNIT=(setpriv --reuid=ethand --regid=ethand --init-groups "--bounding-set=-all$UNIT_CAPS"
    "--inh-caps=-all$UNIT_CAPS" "--ambient-caps=-all$UNIT_CAPS" --no-new-privs
    --securebits=+noroot,+noroot_locked) ;;
*) AS_UNIT=() ;;
esac
: > "$WORK/steps.jsonl"
: > "$WORK/bench.jsonl"
: > "$OUT/daemon.log"

exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!

# ------------------------------------------------------------------------------ helpers
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET_S - $(elapsed))); }
section() { printf '\n######## [%ss] %s ########\n' "$(elapsed)" "$*"; }
note() { printf '[%ss] %s\n' "$(elapsed)" "$*"; }
json_escape() { printf '%s' "$1" | tr '\n\t\r' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g'; }
# record STEP ok|fail|skip DETAIL
record() {
    printf '{"step":"%s","status":"%s","detail":"%s","t_s":%s}\n' \
        "$(json_escape "$1")" "$2" "$(json_escape "${3:-}")" "$(elapsed)" >> "$WORK/steps.jsonl"
    note "STEP $1: $2${3:+ ($3)}"
}
# need SECONDS STEP: false (and records a skip) when the time budget has less left.
need() {
    if [ "$(left)" -lt "$1" ]; then
        record "$2" skip "time budget: $(left)s left of ${BUDGET_S}s, step needs ~$1s"
        return 1
    fi
    return 0
}
# wait_line FILE ERE SECONDS [PID]: prints the first line of FILE matching ERE; 1 on timeout,
# 2 when PID ended without it.
wait_line() {
    local f=$1 re=$2 n=$(($3 * 10)) pid=${4:-} i=0 line
    while [ "$i" -lt "$n" ]; do
        if line=$(grep -m1 -E "$re" "$f" 2>/dev/null); then
            printf '%s\n' "$line"
            return 0
        fi
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            if line=$(grep -m1 -E "$re" "$f" 2>/dev/null); then
                printf '%s\n' "$line"
                return 0
            fi
            return 2
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# wait_count FILE ERE COUNT SECONDS [PID]: until FILE has COUNT lines matching ERE.
wait_count() {
    local f=$1 re=$2 want=$3 n=$(($4 * 10)) pid=${5:-} i=0 c
    while [ "$i" -lt "$n" ]; do
        # Occurrences, not lines: two ranks writing one pipe can share a line.
        c=$(grep -o -E "$re" "$f" 2>/dev/null | wc -l)
        [ "${c:-0}" -ge "$want" ] && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            c=$(grep -o -E "$re" "$f" 2>/dev/null | wc -l)
            [ "${c:-0}" -ge "$want" ] && return 0
            return 2
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# end_proc PID SECONDS: wait up to SECONDS for PID (our child) to exit, then TERM, then KILL.
end_proc() {
    local pid=$1 n=$(($2 * 10)) i=0
    [ -n "$pid" ] || return 0
    while [ "$i" -lt "$n" ] && kill -0 "$pid" 2>/dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        note "pid $pid still running after ${2}s: SIGTERM"
        kill -TERM "$pid" 2>/dev/null
        i=0
        while [ "$i" -lt 50 ] && kill -0 "$pid" 2>/dev/null; do
            sleep 0.1
            i=$((i + 1))
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
}
show_tail() { # FILE LABEL
    [ -s "$1" ] || return 0
    echo "---- $2 (last 15 lines) ----"
    tail -n 15 "$1" | cut -c1-400
}
py_cmp() { timeout 60 "$PY" "$CMP" "$@"; }

# ------------------------------------------------------------------------------ daemon
# Configurations: ethand-<level>.toml for the correctness runs (exact BPF program statistics),
# ethand-bench-<level>.toml for the cost runs (BPF statistics off: they cost ~100 ns a run).
# All share the socket, so `ethand --config $CFG ...` reaches whichever daemon runs.
write_config() { # FILE BPF_STATS LEVEL
    cat > "$1" <<EOF
# Written by scripts/gpu-check.sh
[daemon]
socket = "$WORK/run/ethand.sock"
interval_ms = 500
log = "info"
bpf_stats = "$2"
user = "$([ "$RUN_AS" = user ] && echo ethand)"

[prometheus]
listen = "$LISTEN"

[gpu]
level = "$3"
rescan_interval_ms = 500

[devices]
nvml = true
dcmi = false
interval_ms = 1000
EOF
}
for lv in process op system; do
    write_config "$WORK/ethand-$lv.toml" always "$lv"
    write_config "$WORK/ethand-bench-$lv.toml" off "$lv"
done
CFG=$WORK/ethand-process.toml

DPID=
E() { timeout "${ETO:-20}" "$ETHAND" --config "$CFG" "$@"; }
daemon_alive() { [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; }
start_daemon() { # CONFIG LABEL LEVEL
    printf '\n===== [%ss] daemon start (%s) %s =====\n' "$(elapsed)" "$2" "$(date -u +%FT%TZ)" >> "$OUT/daemon.log"
    NO_COLOR=1 "${AS_UNIT[@]}" "$ETHAND" --config "$1" run --listen "$LISTEN" >> "$OUT/daemon.log" 2>&1 < /dev/null &
    DPID=$!
    local i=0
    while [ "$i" -lt 60 ]; do
        if ! kill -0 "$DPID" 2>/dev/null; then
            wait "$DPID" 2>/dev/null
            note "daemon exited during start-up (exit $?); its log:"
            tail -n 20 "$OUT/daemon.log"
            DPID=
            return 1
        fi
        if timeout 5 "$ETHAND" --config "$1" status --json > "$WORK/tmp-status.json" 2>/dev/null; then
            note "daemon pid $DPID answers (after $((i / 2)).$((i % 2 * 5))s)"
            CUR_LEVEL=${3:-process}
            return 0
        fi
        sleep 0.5
        i=$((i + 1))
    done
    note "daemon does not answer after 30 s"
    return 1
}
stop_daemon() {
    [ -n "$DPID" ] || return 0
    kill -TERM "$DPID" 2>/dev/null
    local i=0
    while [ "$i" -lt 100 ] && kill -0 "$DPID" 2>/dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
    if kill -0 "$DPID" 2>/dev/null; then
        note "daemon ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "$DPID" 2>/dev/null
    fi
    wait "$DPID" 2>/dev/null
    note "daemon stopped (exit $?)"
    DPID=
}
# ensure_level LEVEL CONFIG_PREFIX: the daemon at LEVEL: live (`ethand level`), or, when the
# live switch fails, by restarting the daemon with gpu.level = LEVEL (recorded as a failure of
# the step level-switch-LEVEL).
LIVE_LEVEL=1  # 0 after a live switch failed: later switches restart the daemon directly
ensure_level() {
    if daemon_alive && [ "$CUR_LEVEL" = "$1" ]; then
        return 0
    fi
    if daemon_alive && [ "$LIVE_LEVEL" = 1 ]; then
        if set_level "$1"; then
            # Probes must be attached again at the new level, or the run would measure nothing.
            if [ "$1" = system ] || ! save_status tmp-level \
                || py_cmp status "$WORK/status-tmp-level.json" --require-attached > /dev/null; then
                rm -f "$WORK/status-tmp-level.json"
                return 0
            fi
            py_cmp status "$WORK/status-tmp-level.json" --require-attached | grep 'NOT ATTACHED'
            cp "$WORK/status-tmp-level.json" "$WORK/status-level-$1-not-attached.json"
            rm -f "$WORK/status-tmp-level.json"
            LIVE_LEVEL=0
            record "level-switch-$1" fail "after ethand level $1 a library is not attached: restarting the daemon with gpu.level = $1 (and for every later level change)"
        else
            LIVE_LEVEL=0
            record "level-switch-$1" fail "ethand level $1 failed: restarting the daemon with gpu.level = $1 (and for every later level change)"
        fi
    fi
    if daemon_alive; then
        stop_daemon
    fi
    if start_daemon "$2-$1.toml" "gpu.level = $1" "$1"; then
        sleep "$RESCAN_WAIT"
        return 0
    fi
    return 1
}
save_status() { # LABEL
    if daemon_alive && E status --json > "$WORK/status-$1.json" 2> "$WORK/tmp-err.txt"; then
        return 0
    fi
    note "ethand status failed: $(head -c 300 "$WORK/tmp-err.txt" 2>/dev/null)"
    rm -f "$WORK/status-$1.json"
    return 1
}
CUR_LEVEL=
set_level() { # LEVEL
    local m t1 rc
    t1=$(date +%s%N)
    m=$(ETO=60 E level "$1" 2>&1)
    rc=$?
    t1=$((($(date +%s%N) - t1) / 1000000))
    if [ "$rc" -eq 0 ]; then
        note "ethand level $1 (${t1} ms): $m"
        CUR_LEVEL=$1
        sleep 1  # the daemon attaches newly found libraries in its next ticks
        return 0
    fi
    note "ethand level $1 failed after ${t1} ms (exit $rc): $m"
    return 1
}
fetch_metrics() { # FILE
    if command -v curl > /dev/null 2>&1; then
        curl -s --max-time 10 "http://$LISTEN/metrics" > "$1" && return 0
    fi
    timeout 15 "$PY" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=10).read().decode())' \
        "$LISTEN" > "$1"
}
smi_query() { # FILE
    timeout 20 nvidia-smi --query-gpu=index,memory.used,utilization.gpu,temperature.gpu,power.draw \
        --format=csv,noheader,nounits > "$1" 2>&1
}

ANCHOR_PID=
start_anchor() {
    [ "$ANCHOR" = 1 ] || return 0
    timeout -k 5 900 "$PY" -c 'import ctypes, sys, time
ctypes.CDLL("libcuda.so.1")
print("anchor ready", flush=True)
time.sleep(890)' > "$WORK/anchor.out" 2>&1 < /dev/null &
    ANCHOR_PID=$!
    CHILDREN="$CHILDREN $ANCHOR_PID"
    if wait_line "$WORK/anchor.out" '^anchor ready' 30 "$ANCHOR_PID" > /dev/null; then
        note "anchor: pid $ANCHOR_PID (timeout wrapper) maps libcuda.so.1 and sleeps"
        record anchor ok "pid $ANCHOR_PID"
    else
        record anchor fail "$(tail -n 3 "$WORK/anchor.out" | tr '\n' ' ')"
        end_proc "$ANCHOR_PID" 1
        ANCHOR_PID=
    fi
}
stop_anchor() {
    [ -n "$ANCHOR_PID" ] || return 0
    kill -TERM "$ANCHOR_PID" 2>/dev/null
    end_proc "$ANCHOR_PID" 5
    ANCHOR_PID=
}

# write_outputs [--quiet]: metrics.txt, results.json, snapshots.json, status.json from what
# the run has so far (called after the main steps too, so that a killed run leaves results).
write_outputs() {
    {
        [ -s "$WORK/metrics-idle.txt" ] && cat "$WORK/metrics-idle.txt"
        if [ -s "$WORK/metrics-busy.txt" ]; then
            printf '\n# ===== busy sample (during the torch benchmark at level process) =====\n'
            cat "$WORK/metrics-busy.txt"
        fi
    } > "$OUT/metrics.txt"
    timeout 60 "$PY" "$CMP" bundle --work "$WORK" --out "$OUT" "$@"
}

# Our background children (workloads): ended on exit.
CHILDREN=""
cleanup() {
    local p
    for p in $CHILDREN; do
        kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null
    done
    stop_daemon
}
trap cleanup EXIT
trap 'note "interrupted: writing what the run has"; cleanup; write_outputs --quiet; trap - EXIT; exit 130' INT TERM

# snapshot PID NAME: `ethand snapshot --pid PID --json` into snap/NAME.json
snapshot() {
    local f="$WORK/snap/$2.json" rc
    if ! daemon_alive; then
        note "snapshot $2: daemon not running"
        return 1
    fi
    ETO=20 E snapshot --pid "$1" --json --window 1 --duration 1 > "$f" 2> "$WORK/tmp-err.txt"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        note "snapshot $2 of pid $1 failed (exit $rc): $(head -c 300 "$WORK/tmp-err.txt")"
        return "$rc"
    fi
    return 0
}

# compare_one NAME PID LEVEL OUTFILE: ground truth from OUTFILE vs snap/NAME.{before,after}
FAILED_CMP=""
compare_one() {
    local name=$1 pid=$2 level=$3 out=$4 rc
    if ! py_cmp truth --from "$out" --pid "$pid" --out "$WORK/truth-$name.json"; then
        note "$name: no ground-truth JSON line from the workload"
    fi
    py_cmp compare "$name" --truth "$WORK/truth-$name.json" --before "$WORK/snap/$name.before.json" \
        --after "$WORK/snap/$name.after.json" --pid "$pid" --level "$level" --out "$WORK/cmp/$name.json"
    rc=$?
    case $rc in
        0) record "$name" ok "all hard fields match" ;;
        1) record "$name" fail "ethand differs from the ground truth (see the table)"
           FAILED_CMP="$FAILED_CMP $name" ;;
        *) record "$name" fail "comparison impossible (exit $rc: missing truth or snapshot)"
           FAILED_CMP="$FAILED_CMP $name" ;;
    esac
}

# run_workload NAME LEVEL TIMEOUT CMD...: ready -> BEFORE -> line -> truth -> AFTER -> line.
run_workload() {
    local name=$1 level=$2 to=$3
    shift 3
    section "(c) workload $name (gpu level $level)"
    need $((to / 3 + 10)) "$name" || return 1
    if ! daemon_alive; then
        record "$name" fail "daemon not running"
        return 1
    fi
    local fifo="$WORK/$name.fifo" out="$WORK/$name.out" err="$WORK/$name.err" ready pid tpid rc
    rm -f "$fifo"
    if ! mkfifo "$fifo"; then
        record "$name" fail "mkfifo failed"
        return 1
    fi
    note "command: $*"
    exec 7<> "$fifo"
    timeout -k 5 "$to" "$@" < "$fifo" > "$out" 2> "$err" 7>&- &
    tpid=$!
    CHILDREN="$CHILDREN $tpid"
    ready=$(wait_line "$out" '^ready [0-9]+' "$to" "$tpid")
    rc=$?
    if [ "$rc" -ne 0 ]; then
        record "$name" fail "no 'ready <pid>' line ($([ $rc -eq 2 ] && echo "the workload exited" || echo timeout))"
        exec 7>&-
        end_proc "$tpid" 2
        show_tail "$out" "$name stdout"
        show_tail "$err" "$name stderr"
        return 1
    fi
    pid=$(printf '%s' "$ready" | awk '{print $2}')
    note "$name ready: pid $pid"
    sleep "$RESCAN_WAIT"
    snapshot "$pid" "$name.before"
    echo go >&7
    if ! wait_line "$out" '^\{' "$to" "$tpid" > /dev/null; then
        note "$name: no ground-truth line"
    fi
    sleep "$SETTLE_WAIT"
    snapshot "$pid" "$name.after"
    echo done >&7
    exec 7>&-
    end_proc "$tpid" 20
    note "$name exited"
    grep -v '^{' "$out" | head -n 5
    show_tail "$err" "$name stderr"
    compare_one "$name" "$pid" "$level" "$out"
}

# ============================================================================== (a)
section "(a) environment"
date -u +%FT%TZ
echo "host: $(hostname)  kernel: $(uname -r)  arch: $(uname -m)"
grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null
echo "OUT=$OUT WORK=$WORK BUDGET_S=$BUDGET_S PY=$PY"
env | grep -E '^(NCCL_|TORCH_|NVSHMEM_|CUDA_|LD_LIBRARY_PATH)' | sort
for b in "$ETHAND" "$WORKLOAD"; do
    if [ -f "$b" ] && [ ! -x "$b" ]; then chmod +x "$b" 2>/dev/null; fi
    if [ -x "$b" ]; then
        echo "binary $b: $(stat -c %s "$b") bytes, $(sha256sum "$b" | cut -c1-16)"
    else
        echo "binary $b: MISSING"
    fi
done
timeout 10 "$ETHAND" --version 2>&1
echo "--- uprobe support: $(grep -h -E '^CONFIG_UPROBE_EVENTS=' "/boot/config-$(uname -r)" 2>/dev/null || echo 'kernel config not readable'); BTF: $([ -r /sys/kernel/btf/vmlinux ] && echo yes || echo no)"
echo "--- nvidia-smi"
timeout 30 nvidia-smi 2>&1 | head -n 40
timeout 20 nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id --format=csv 2>&1
timeout 20 nvidia-smi topo -m 2>&1 | head -n 12
NGPU=$(timeout 20 nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c '^[0-9]')
NGPU=${NGPU:-0}
echo "GPUs: $NGPU"
echo "--- python / torch / cupy / libraries"
timeout 120 "$PY" - > "$WORK/env.json" 2> "$WORK/env.err" <<'EOF'
import json, os, sys
info = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    torch.cuda.init()
    info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
    except Exception as e:
        info["nccl"] = "error: %r" % (e,)
except Exception as e:
    info["torch_error"] = repr(e)
try:
    import cupy
    info["cupy"] = cupy.__version__
    info["cupy_cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    cupy.zeros(1)
except Exception as e:
    info["cupy_error"] = repr(e)
libs = {}
keys = ("libcuda.so", "libnccl", "libcudart", "libnvidia-ml", "libcupti", "libnvrtc")
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split()
        if len(parts) >= 6 and "/" in parts[5]:
            base = os.path.basename(parts[5])
            if any(base.startswith(k) for k in keys):
                libs[parts[5]] = os.path.realpath(parts[5])
info["libraries_mapped"] = libs
print(json.dumps(info))
EOF
rc=$?
if [ "$rc" -eq 0 ]; then
    timeout 20 "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k, v in d.items():
    if k != "libraries_mapped": print(f"{k}: {v}")
for p, r in d.get("libraries_mapped", {}).items(): print(f"mapped: {p} -> {r}")' "$WORK/env.json"
    record env ok
else
    record env fail "python probe exited $rc"
fi
show_tail "$WORK/env.err" "python probe stderr"

# ============================================================================== (b)
section "(b) daemon start"
echo "--- config ($CFG)"
cat "$CFG"
start_anchor
if [ ! -x "$ETHAND" ]; then
    record daemon-start fail "$ETHAND missing"
elif start_daemon "$CFG" main process; then
    record daemon-start ok "pid $DPID"
    save_status start
    py_cmp status "$WORK/status-start.json"
else
    record daemon-start fail "see daemon.log"
fi

# ============================================================================== (c)
W=$WORKLOAD
if [ -x "$W" ]; then
    run_workload rust-driver process 60 "$W"
    run_workload rust-driver-large process 90 "$W" --launches 100000 --allocs 200 --alloc-bytes 65536 \
        --copies 200 --copy-bytes 65536 --syncs 500 --pageable
else
    record rust-driver fail "$W missing: build tests/gpu-workload and copy it into .device-bin/"
fi
run_workload torch-launches process 150 "$PY" tests/gpu/torch_launches.py --n 2000
run_workload torch-copies process 150 "$PY" tests/gpu/torch_launches.py --copies --n 500 --bytes 1048576
run_workload cupy process 150 "$PY" tests/gpu/cupy_launches.py

# ============================================================================== (d)
section "(d) NCCL all-reduce, 2 ranks (torchrun)"
nccl_step() {
    skipped nccl && { record nccl skip "SKIP"; return 0; }
    if [ "$NGPU" -lt 2 ]; then
        record nccl skip "$NGPU GPU(s): needs 2"
        return 0
    fi
    need 90 nccl || return 0
    if ! daemon_alive; then
        record nccl fail "daemon not running"
        return 1
    fi
    local gate="$WORK/nccl.gate" out="$WORK/nccl.out" err="$WORK/nccl.err" tpid pids p r rc
    rm -f "$gate" "$gate.end"
    timeout -k 10 200 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/gpu/nccl_allreduce.py --steps 120 --elements 1048576 --gate "$gate" --hold 60 \
        > "$out" 2> "$err" < /dev/null &
    tpid=$!
    CHILDREN="$CHILDREN $tpid"
    wait_count "$out" 'ready rank=[0-9]+ pid=[0-9]+' 2 150 "$tpid"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        record nccl fail "the 2 ranks did not both print ready ($([ $rc -eq 2 ] && echo exited || echo timeout))"
        touch "$gate" "$gate.end"
        end_proc "$tpid" 15
        show_tail "$out" "torchrun stdout"
        show_tail "$err" "torchrun stderr"
        return 1
    fi
    pids=$(grep -oE 'ready rank=[0-9]+ pid=[0-9]+' "$out" | sort -u)
    note "nccl ranks: $(printf '%s' "$pids" | tr '\n' ';')"
    sleep "$RESCAN_WAIT"
    for r in 0 1; do
        p=$(printf '%s\n' "$pids" | sed -n "s/^ready rank=$r pid=\([0-9]*\)$/\1/p" | head -n1)
        [ -n "$p" ] && snapshot "$p" "nccl-rank$r.before"
    done
    touch "$gate"
    wait_count "$out" '"expect"' 2 120 "$tpid" || note "nccl: not every rank printed its ground truth"
    sleep "$SETTLE_WAIT"
    for r in 0 1; do
        p=$(printf '%s\n' "$pids" | sed -n "s/^ready rank=$r pid=\([0-9]*\)$/\1/p" | head -n1)
        [ -n "$p" ] && snapshot "$p" "nccl-rank$r.after"
    done
    touch "$gate.end"
    end_proc "$tpid" 60
    grep -vE '^\{|"expect"' "$out" | head -n 5
    show_tail "$err" "torchrun stderr"
    for r in 0 1; do
        p=$(printf '%s\n' "$pids" | sed -n "s/^ready rank=$r pid=\([0-9]*\)$/\1/p" | head -n1)
        [ -n "$p" ] && compare_one "nccl-rank$r" "$p" process "$out"
    done
}
nccl_step

# ============================================================================== (e)
section "(e) ethand status, /metrics, NVML vs nvidia-smi"
# Devices are sampled every second ([devices] interval_ms): wait two samples so that the idle
# reading is not one taken while the last workload's CUDA context (~530 MiB) still existed.
sleep 2
if daemon_alive; then
    save_status after-workloads && py_cmp status "$WORK/status-after-workloads.json"
    if fetch_metrics "$WORK/metrics-idle.txt"; then
        smi_query "$WORK/smi-idle.csv"
        record metrics ok "$(wc -l < "$WORK/metrics-idle.txt") lines"
        echo "--- /metrics: ethand_gpu_* and per-process GPU series"
        grep -E '^ethand_(gpu_(memory_used|utilization_ratio|temperature|power)|process_gpu_launches|process_gpu_api_calls)' \
            "$WORK/metrics-idle.txt" | head -n 40
        echo "--- nvidia-smi"
        cat "$WORK/smi-idle.csv"
        py_cmp nvml --metrics "$WORK/metrics-idle.txt" --smi "$WORK/smi-idle.csv" --label idle \
            --out "$WORK/nvml-idle.json"
    else
        record metrics fail "GET http://$LISTEN/metrics failed"
    fi
else
    record status fail "daemon not running"
fi

# After start-up the daemon keeps only its runtime capabilities, in every thread: NVML's and
# the device collectors' threads included (an earlier build failed to drop them in an NVML
# thread: "dropping capabilities failed ... Operation not permitted").
if daemon_alive; then
    echo "--- capabilities of every daemon thread (CapEff, CapPrm, CapBnd)"
    caps_seen=$(for t in /proc/"$DPID"/task/*; do
        printf '%s %s %s %s %s\n' "$(basename "$t")" "$(tr -d '\n' < "$t/comm")" \
            "$(awk '/^CapEff/{print $2}' "$t/status")" "$(awk '/^CapPrm/{print $2}' "$t/status")" \
            "$(awk '/^CapBnd/{print $2}' "$t/status")"
    done)
    echo "$caps_seen"
    distinct=$(echo "$caps_seen" | awk '{print $3}' | sort -u)
    kept=$("$PY" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1])).get("capabilities", [])))' \
        "$WORK/status-after-workloads.json" 2>/dev/null)
    echo "status says kept: $kept"
    if grep -qi "dropping capabilities failed\|could not drop its capabilities" "$OUT/daemon.log"; then
        record capabilities fail "the daemon log reports a failed capability drop"
    elif [ "$(echo "$distinct" | wc -l)" -ne 1 ]; then
        record capabilities fail "threads differ in CapEff: $(echo $distinct)"
    elif [ "$distinct" = "000001ffffffffff" ] || [ "$distinct" = "000003ffffffffff" ]; then
        record capabilities fail "CapEff still full ($distinct)"
    else
        record capabilities ok "$(echo "$caps_seen" | wc -l) threads, CapEff $distinct ($kept)"
    fi
    # Who it runs as (RUN_AS), every thread; and the BPF statistics helper, if one runs.
    uids=$(for t in /proc/"$DPID"/task/*; do awk '/^Uid/{print $2"/"$3"/"$4"/"$5}' "$t/status"; done | sort -u)
    user=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("user", "?"))' \
        "$WORK/status-after-workloads.json" 2>/dev/null)
    echo "daemon uids: $uids; status says user: $user"
    helper=$(pgrep -P "$DPID" -x ethand-stats | head -n 1)
    [ -n "$helper" ] && echo "helper $helper: $(grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs)' /proc/"$helper"/status | tr '\n\t' '  ')"
    want_uid=0
    [ "$RUN_AS" != root ] && want_uid=$(id -u ethand)
    if [ "$(echo "$uids" | wc -l)" -ne 1 ] || [ "$uids" != "$want_uid/$want_uid/$want_uid/$want_uid" ]; then
        record user fail "RUN_AS=$RUN_AS: thread uids $(echo $uids), want $want_uid"
    else
        record user ok "RUN_AS=$RUN_AS: every thread uid $want_uid ($user)"
    fi
fi

write_outputs --quiet

# ============================================================================== (c2)
section "(c2) levels: the CUDA driver workload at level op and at level system"
# A level switch detaches and re-attaches every library file found so far; the libraries
# found only in processes that have exited since (libnccl of the torch runs) show whether
# re-attaching works without a live process (the check after the round trip).
if skipped levels; then
    record levels skip "SKIP"
elif [ -x "$W" ] && daemon_alive && need 60 levels; then
    if ensure_level op "$WORK/ethand"; then
        run_workload rust-driver-op op 60 "$W"
    else
        record rust-driver-op fail "no daemon at level op"
    fi
    if ensure_level system "$WORK/ethand"; then
        run_workload rust-driver-system system 60 "$W"
    else
        record rust-driver-system fail "no daemon at level system"
    fi
    if ensure_level process "$WORK/ethand"; then
        sleep 1
        if [ "$LIVE_LEVEL" != 1 ]; then
            save_status after-level-roundtrip
            record level-reattach skip "the level changes were daemon restarts, not live switches"
        elif save_status after-level-roundtrip; then
            LVL_OUT=$(py_cmp status "$WORK/status-after-level-roundtrip.json" --require-attached)
            LVL_RC=$?
            printf '%s\n' "$LVL_OUT" | grep -E 'NOT ATTACHED|^  library'
            if [ "$LVL_RC" -eq 0 ]; then
                record level-reattach ok "every library file found is attached after op -> system -> process"
            else
                record level-reattach fail "a library file is not attached after the level round trip (see NOT ATTACHED)"
            fi
        fi
    else
        record level-reattach fail "no daemon at level process"
    fi
fi

write_outputs --quiet

# ============================================================================== (s)
section "(s) survey: every exported cu* function of libcuda, under PyTorch and CuPy"
# Which functions real frameworks call, beyond ethand's catalog (the variants question).
survey_step() {
    skipped survey && { record survey skip "SKIP"; return 0; }
    need 60 survey || return 0
    local lib
    lib=$("$PY" - <<'PYEOF' 2>/dev/null
import re
for line in open("/proc/self/maps"):
    pass
import ctypes
ctypes.CDLL("libcuda.so.1")
for line in open("/proc/self/maps"):
    m = re.search(r"(/\S*libcuda\.so[.\d]*)$", line.strip())
    if m:
        print(m.group(1)); break
PYEOF
)
    if [ -z "$lib" ]; then
        record survey fail "could not locate libcuda.so.1"
        return 1
    fi
    note "survey of $lib"
    timeout -k 5 60 "$ETHAND" --config "$CFG" survey --library "$lib" --prefix cu --duration 25 \
        > "$WORK/survey.txt" 2> "$WORK/survey.err" &
    local spid=$!
    sleep 6
    printf '\n\n\n' | timeout 40 "$PY" tests/gpu/torch_launches.py --n 500 > /dev/null 2>&1
    printf '\n\n\n' | timeout 40 "$PY" tests/gpu/torch_launches.py --copies --n 100 --bytes 65536 > /dev/null 2>&1
    printf '\n\n\n' | timeout 40 "$PY" tests/gpu/cupy_launches.py --n 500 --copies 50 --syncs 10 > /dev/null 2>&1
    wait "$spid"
    echo "--- survey: symbol calls per process (torch launches 500, torch copies 100 each way, cupy)"
    head -n 60 "$WORK/survey.txt"
    show_tail "$WORK/survey.err" "survey stderr"
    if [ -s "$WORK/survey.txt" ]; then record survey ok "$(wc -l < "$WORK/survey.txt") rows"; else record survey fail "no output"; fi
}
survey_step

# ============================================================================== (f)
section "(f) cost per level: launch-bound loops, interleaved"
# bench_run STATE RUN: torch (20 adds + sync per step) and the CUDA driver loop.
BUSY_SAMPLED=0
bench_run() {
    local st=$1 run=$2 o line sampler=""
    o="$WORK/bench-torch-$run.out"
    if [ "$st" = process ] && [ "$BUSY_SAMPLED" -eq 0 ]; then
        BUSY_SAMPLED=1
        (sleep $((BENCH_S / 2 + 4)); fetch_metrics "$WORK/metrics-busy.txt"; smi_query "$WORK/smi-busy.csv") &
        sampler=$!
    fi
    timeout -k 5 $((BENCH_S + 90)) "$PY" tests/gpu/torch_launches.py --bench "$BENCH_S" > "$o" 2> "$o.err" < /dev/null
    line=$(grep -m1 '^{' "$o")
    [ -n "$line" ] || show_tail "$o.err" "torch bench stderr"
    printf '{"bench":"torch","state":"%s","run":%s,"result":%s}\n' "$st" "$run" "${line:-null}" >> "$WORK/bench.jsonl"
    note "bench torch  [$st] ${line:-FAILED}"
    [ -n "$sampler" ] && wait "$sampler" 2>/dev/null
    if [ -x "$WORKLOAD" ]; then
        o="$WORK/bench-rust-$run.out"
        timeout -k 5 $((RUST_BENCH_S + 30)) "$WORKLOAD" --bench "$RUST_BENCH_S" > "$o" 2> "$o.err" < /dev/null
        line=$(grep -m1 '^{' "$o")
        [ -n "$line" ] || show_tail "$o.err" "driver bench stderr"
        printf '{"bench":"cuda-driver","state":"%s","run":%s,"result":%s}\n' "$st" "$run" "${line:-null}" >> "$WORK/bench.jsonl"
        note "bench driver [$st] ${line:-FAILED}"
    fi
}
STATES=$BENCH_STATES
run=0
for st in $STATES; do
    run=$((run + 1))
    need $((BENCH_S + RUST_BENCH_S + 45)) "bench-$run-$st" || continue
    case $st in
        none)
            stop_daemon
            ;;
        *)
            ensure_level "$st" "$WORK/ethand-bench" || { record "bench-$run-$st" fail "no daemon at level $st"; continue; }
            ;;
    esac
    bench_run "$st" "$run"
done
py_cmp bench --in "$WORK/bench.jsonl" --out "$WORK/bench-summary.json"
if [ -s "$WORK/metrics-busy.txt" ]; then
    echo "--- NVML vs nvidia-smi while the GPU was busy"
    cat "$WORK/smi-busy.csv" 2>/dev/null
    py_cmp nvml --metrics "$WORK/metrics-busy.txt" --smi "$WORK/smi-busy.csv" --label busy \
        --out "$WORK/nvml-busy.json"
fi

# ============================================================================== (g)
section "(g) daemon stop"
if daemon_alive; then
    save_status end && py_cmp status "$WORK/status-end.json" > /dev/null
    stop_daemon
    record daemon-stop ok
fi
stop_anchor
echo "--- daemon.log: warnings and errors"
grep -E 'WARN|ERROR|panick' "$OUT/daemon.log" | tail -n 30 | cut -c1-400

# ------------------------------------------------------------------------------ bundle
section "results"
write_outputs
echo "elapsed: $(elapsed)s; files in $OUT:"
ls -la "$OUT"
if [ "$KEEP_WORK" = 1 ]; then
    echo "work directory kept: $WORK"
else
    rm -rf "$WORK"
fi
RC=0
[ -n "$FAILED_CMP" ] && RC=1
echo "hard comparison failures:${FAILED_CMP:- none}"
trap - EXIT
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit "$RC"
