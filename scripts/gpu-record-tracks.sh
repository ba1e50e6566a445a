#!/bin/bash
# `ethand record`'s GPU tracks on real jobs, one case each of CASES (default: all three):
#   torch-own     tests/gpu/cupti_workload.py (per step an fp32 and a bf16 matmul, an add, a
#                 16 MiB pageable and a 16 MiB pinned copy, a sync); the daemon installed the
#                 library and was stopped: the recording owns the CUPTI directory
#   torch-daemon  the same job with the daemon running: the daemon opens the window and
#                 streams its entries to the recording (API gpu_trace)
#   jax-daemon    tests/gpu/jax_workload.py (a pageable 16 MiB batch put on the GPU and a
#                 jitted bf16 MLP step) with the daemon running
#   graph-daemon  tests/gpu/graph_loop.py (a CUDA graph of 300 kernels replayed), recorded for
#                 5 s through the daemon: whether its kernels carry a queued time and join
#                 their cuGraphLaunch (not in CASES by default)
# Each job, started with libethand_cupti.so, runs one phase of PHASE_S inside a recording of
# up to RECORD_S; the log gives, per case, the summary's gpu_activity, the slices per step
# (a whole number of kernels, the copies the job makes), the copies by kind and size, and
# the flows from launch calls. Root, repository root, .device-bin/ethand; writes
# ${OUT:-/tmp/gpu-record-tracks}/CASE/.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-record-tracks}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
JAXPY=${JAXPY:-$PY}
PHASE_S=${PHASE_S:-3}
RECORD_S=${RECORD_S:-20}
CASES=${CASES:-torch-own torch-daemon jax-daemon}
. scripts/gpu-common.sh
mkdir -p "$OUT"
log() { echo "[record-tracks] $(date +%T) $*" | tee -a "$OUT/log.txt"; }

one() { # case
    local c=$1 o="$OUT/$1" D EP="" WP RP fd job
    mkdir -p "$o"
    D=$(mktemp -d)
    start_daemon "$D" 19847 "$o/daemon.log"
    case $c in *-own) kill "$EP"; wait "$EP"; EP="" ;; esac
    case $c in
        jax-*) job=(tests/gpu/jax_workload.py); py=$JAXPY ;;
        graph-*) job=(tests/gpu/graph_loop.py 15); py=$PY ;;
        *) job=(tests/gpu/cupti_workload.py); py=$PY ;;
    esac
    mkfifo "$D/in"
    CUDA_INJECTION64_PATH="$D/cupti/libethand_cupti.so" "$py" "${job[@]}" < "$D/in" > "$o/job.out" 2> "$o/job.err" &
    WP=$!
    exec {fd}> "$D/in"
    for i in $(seq 1 900); do grep -q '^ready' "$o/job.out" && break; sleep 0.2; done
    log "$c: job $WP ready"
    case $c in graph-*)
        "$E" record --config "$D/c.toml" --pid "$WP" --duration 5s -o "$o/rec.json" > "$o/record.out" 2> "$o/record.err"
        log "$c: record rc $?: $(cat "$o/record.out")"
        exec {fd}>&-; wait "$WP"; kill "$EP"; wait "$EP"
        python3 - "$o" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import collections, json, sys
t = json.load(open(sys.argv[1] + "/rec.json"))
print("[graph] gpu_activity:", json.dumps(t["metadata"].get("gpu_activity")))
ev = [e for e in t["traceEvents"] if e.get("cat") == "gpu_kernel"]
print("[graph] kernels", len(ev), "graph launches", sum(1 for e in t["traceEvents"] if str(e.get("name", "")).startswith(("cuGraphLaunch", "cudaGraphLaunch"))))
PY
        rm -rf "$D"; return ;;
    esac
    "$E" record --config "$D/c.toml" --pid "$WP" --duration "${RECORD_S}s" -o "$o/rec.json" -o "$o/rec.pftrace" > "$o/record.out" 2> "$o/record.err" &
    RP=$!
    # Its own directory: the library maps the recording's control file within 5 s. Through
    # the daemon: the window opens at the daemon's next round.
    case $c in *-own) sleep 7 ;; *) sleep 3 ;; esac
    echo "run $PHASE_S" >&"$fd"
    for i in $(seq 1 $(( PHASE_S * 20 + 600 ))); do grep -q '^steps' "$o/job.out" && break; sleep 0.1; done
    log "$c: phase: $(grep '^steps' "$o/job.out" | tail -1)"
    kill -INT "$RP"; wait "$RP"
    log "$c: record rc $?: $(cat "$o/record.out") / $(grep -v '^$' "$o/record.err" | tr '\n' ' ' | cut -c1-400)"
    echo exit >&"$fd"; exec {fd}>&-
    wait "$WP"
    [ -n "$EP" ] && { kill "$EP"; wait "$EP"; }
    python3 - "$o" "$c" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import collections, json, statistics, sys
out, case = sys.argv[1], sys.argv[2]
steps = int(open(out + "/job.out").read().split("steps")[1].split()[0])
t = json.load(open(out + "/rec.json"))
print(f"[{case}] gpu_activity:", json.dumps(t["metadata"].get("gpu_activity")))
print(f"[{case}] warnings:", t["metadata"].get("warnings"))
flows = sum(1 for e in t["traceEvents"] if e.get("cat") == "gpu_flow" and e.get("ph") == "s")
ev = [e for e in t["traceEvents"] if e.get("cat") in ("gpu_kernel", "gpu_memcpy", "gpu_memset")]
cats = collections.Counter(e["cat"] for e in ev)
copies = collections.Counter((e["name"], e["args"].get("src"), e["args"].get("dst"), e["args"].get("bytes")) for e in ev if e["cat"] == "gpu_memcpy")
kernels = collections.Counter(e["name"][:90] for e in ev if e["cat"] == "gpu_kernel")
tracks = collections.Counter(e["tid"] for e in ev)
names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
print(f"[{case}] steps {steps}; slices {dict(cats)}; tracks {[(names.get(k), n) for k, n in tracks.items()]}; flows from launches {flows}")
print(f"[{case}] copies:", {str(k): n for k, n in copies.items()})
big = [e for e in ev if e["cat"] == "gpu_memcpy" and (e["args"].get("bytes") or 0) >= 1 << 20 and e["dur"] > 0]
for kind in sorted({e["args"].get("src") for e in big}, key=str):
    bw = [e["args"]["bytes"] / (e["dur"] * 1e3) for e in big if e["args"].get("src") == kind]
    print(f"[{case}] {kind} copies >= 1 MiB: {len(bw)}, median {statistics.median(bw):.1f} GB/s")
print(f"[{case}] kernels per step {cats['gpu_kernel'] / max(steps, 1):.3f}, copies per step {cats['gpu_memcpy'] / max(steps, 1):.3f}; top kernels:")
for k, n in kernels.most_common(8):
    print(f"[{case}]   {n:7d} {k}")
PY
    rm -rf "$D"
}

for c in $CASES; do one "$c"; done
