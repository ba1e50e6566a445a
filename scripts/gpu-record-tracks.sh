#!/bin/bash
# `ethand record`'s GPU tracks on a real job: tests/gpu/cupti_workload.py (per step an fp32 and
# a bf16 matmul, an add, a 16 MiB pageable and a 16 MiB pinned copy, a sync) started with
# libethand_cupti.so (installed by a daemon that is then stopped: the recording owns the
# CUPTI directory), recorded for RECORD_S while it runs one phase of PHASE_S; the trace must
# hold exactly 2 copies a step (one pageable, one pinned, 16 MiB each) and a whole number of
# kernels a step, each kernel with a flow from its launch call. Root, repository root, .device-bin/ethand; writes ${OUT:-/tmp/gpu-record-tracks}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-record-tracks}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
PHASE_S=${PHASE_S:-3}
RECORD_S=${RECORD_S:-20}
mkdir -p "$OUT"
log() { echo "[record-tracks] $(date +%T) $*" | tee -a "$OUT/log.txt"; }
D=$(mktemp -d)
printf '[daemon]\nsocket = "%s/s"\n[prometheus]\nlisten = "127.0.0.1:19847"\n[gpu]\ncupti_dir = "%s/cupti"\n' "$D" "$D" > "$D/c.toml"
"$E" run --config "$D/c.toml" > "$OUT/daemon.log" 2>&1 &
EP=$!
for i in $(seq 1 300); do [ -S "$D/s" ] && break; sleep 0.1; done
kill "$EP"; wait "$EP"
mkfifo "$D/in"
CUDA_INJECTION64_PATH="$D/cupti/libethand_cupti.so" "$PY" tests/gpu/cupti_workload.py < "$D/in" > "$OUT/job.out" 2> "$OUT/job.err" &
WP=$!
exec {fd}> "$D/in"
for i in $(seq 1 600); do grep -q '^ready' "$OUT/job.out" && break; sleep 0.2; done
log "job $WP ready"
"$E" record --config "$D/c.toml" --pid "$WP" --duration "${RECORD_S}s" -o "$OUT/rec.json" -o "$OUT/rec.pftrace" > "$OUT/record.out" 2> "$OUT/record.err" &
RP=$!
# The library maps the recording's control file within 5 s; the window opens then.
sleep 7
echo "run $PHASE_S" >&"$fd"
for i in $(seq 1 $(( PHASE_S * 20 + 600 ))); do grep -q '^steps' "$OUT/job.out" && break; sleep 0.1; done
log "phase: $(grep '^steps' "$OUT/job.out" | tail -1)"
kill -INT "$RP"; wait "$RP"
log "record: $(cat "$OUT/record.out") rc $?"
echo exit >&"$fd"; exec {fd}>&-
wait "$WP"
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/log.txt"
import collections, json, sys
out = sys.argv[1]
steps = int(open(out + "/job.out").read().split("steps")[1].split()[0])
t = json.load(open(out + "/rec.json"))
print("gpu_activity:", json.dumps(t["metadata"].get("gpu_activity")))
print("warnings:", t["metadata"].get("warnings"))
flows = sum(1 for e in t["traceEvents"] if e.get("cat") == "gpu_flow" and e.get("ph") == "s")
ev = [e for e in t["traceEvents"] if e.get("cat") in ("gpu_kernel", "gpu_memcpy", "gpu_memset")]
cats = collections.Counter(e["cat"] for e in ev)
copies = collections.Counter((e["args"].get("src"), e["args"].get("dst"), e["args"].get("bytes")) for e in ev if e["cat"] == "gpu_memcpy")
kernels = collections.Counter(e["name"][:90] for e in ev if e["cat"] == "gpu_kernel")
tracks = {e["tid"] for e in ev}
print(f"steps {steps}; slices {dict(cats)}; tracks {len(tracks)}; flows from launches {flows}")
print("copies:", dict(copies))
print(f"kernels per step {cats['gpu_kernel'] / max(steps, 1):.3f}; top:")
for k, n in kernels.most_common(8):
    print(f"  {n:7d} {k}")
print("copies per step", cats["gpu_memcpy"] / max(steps, 1))
PY
rm -rf "$D"
