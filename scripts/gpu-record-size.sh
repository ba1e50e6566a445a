#!/bin/bash
# `ethand record` of a real training loop at the defaults (tests/gpu/scenarios.py sync_storm:
# a synchronize after every kernel, the busiest recording), the same 5 s three ways: to
# trace.pftrace (Perfetto, the default), to trace.json, and to both at once. Per run: the
# events, drops, bytes on disk and bytes per event, and the recorder's peak RSS (VmHWM,
# polled until it exits). The run with both outputs is checked with `xtask trace-compare`
# (the Perfetto trace decoded with Perfetto's own definitions, import rules checked, the same
# events as the JSON to the ns). A fourth run keeps only the last 2 s (`--ring 2s`). Run from the repository root as root, with .device-bin/ethand
# and .device-bin/xtask built. Writes ${OUT:-/tmp/gpu-record-size}/summary.txt.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-record-size}
E=${ETHAND:-.device-bin/ethand}
X=${XTASK:-.device-bin/xtask}
PY=${PY:-/opt/torch/.venv/bin/python}
SCENARIO=${SCENARIO:-sync_storm}
REC_S=${REC_S:-5}
mkdir -p "$OUT"
T=$(mktemp -d)
S=$OUT/summary.txt
: > "$S"
timeout 300 "$PY" tests/gpu/scenarios.py "$SCENARIO" 240 > "$T/w.out" 2> "$T/w.err" &
TP=$!
for i in $(seq 1 600); do grep -q '^ready' "$T/w.out" 2>/dev/null && break; sleep 0.2; done
WP=$(grep -m1 -oE '^ready [0-9]+' "$T/w.out" | awk '{print $2}')
if [ -z "$WP" ]; then
    echo "$SCENARIO: no ready line" | tee -a "$S"; tail -5 "$T/w.err" | tee -a "$S"; kill "$TP"; exit 1
fi
sleep 5

# rec NAME OUTPUT... : one recording; prints events, drops, sizes and peak RSS.
rec() {
    local name=$1; shift
    local args=()
    for o in "$@"; do args+=(-o "$T/$o"); done
    "$E" record --pid "$WP" --duration "${REC_S}s" ${REC_ARGS:-} "${args[@]}" > "$T/$name.out" 2> "$T/$name.err" &
    local rp=$! hwm=0 v
    while kill -0 "$rp" 2>/dev/null; do
        v=$(awk '/^VmHWM/{print $2}' "/proc/$rp/status" 2>/dev/null)
        [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
        sleep 0.05
    done
    wait "$rp"; local rc=$?
    local line events
    line=$(cat "$T/$name.out")
    events=$(echo "$line" | awk '/^recorded/{print $2}')
    {
        echo "$name: rc=$rc $line; peak RSS ${hwm} kB"
        for o in "$@"; do
            local b; b=$(stat -c %s "$T/$o" 2>/dev/null || echo 0)
            echo "  $o: $b bytes, $(awk -v b="$b" -v e="${events:-0}" 'BEGIN{if (e>0) printf "%.1f", b/e; else print "-"}') B/event"
        done
        grep -v '^ethand: recording' "$T/$name.err" | head -5 | sed 's/^/  stderr: /'
    } | tee -a "$S"
}

rec perfetto trace.pftrace
cp "$T/trace.pftrace" "$OUT/perfetto-only.pftrace" 2>/dev/null
rm -f "$T/trace.pftrace"
rec json trace.json
rm -f "$T/trace.json"
rec both both.pftrace both.json
# Ring mode: the same 5 s kept as its last 2 s, within the default byte budget.
REC_ARGS="--ring 2s" rec ring ring.pftrace
cp "$T/ring.pftrace" "$OUT/ring.pftrace" 2>/dev/null
echo "trace-compare of the run with both outputs:" | tee -a "$S"
"$X" trace-compare "$T/both.pftrace" "$T/both.json" 2>&1 | tee -a "$S"
echo "trace-compare rc=${PIPESTATUS[0]}" | tee -a "$S"
kill "$TP" 2>/dev/null; wait "$TP" 2>/dev/null
rm -rf "$T"
