#!/bin/bash
# What joining kernels to their launch call sites costs a launch-heavy PyTorch loop, and what
# the sites look like on a real job: tests/gpu/cupti_workload.py --kernels-only (small
# matmuls and an add, no sync: the host launches as fast as it can), started with
# libethand_cupti.so, its step rate dormant, inside a snapshot's window and after it, under a
# daemon with diagnosis.launch_sites = true and one with false, ROUNDS times each, one after
# the other (one daemon owns the CUPTI directory at a time). Each window's snapshot is kept
# (JSON and text). Root, repository root, .device-bin/ethand; writes ${OUT:-/tmp/gpu-launch-sites}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-launch-sites}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
ROUNDS=${ROUNDS:-2}
PHASE_S=${PHASE_S:-5}
N=${N:-256}
mkdir -p "$OUT"
log() { echo "[launch-sites] $(date +%T) $*" | tee -a "$OUT/log.txt"; }
log "start; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
D=$(mktemp -d)
phase() { # fd, out file, seconds: one `steps` line
    local n; n=$(grep -c '^steps' "$2")
    echo "run $3" >&"$1"
    for i in $(seq 1 $(( $3 * 20 + 600 ))); do
        [ "$(grep -c '^steps' "$2")" -gt "$n" ] && break; sleep 0.1
    done
    tail -1 "$2"
}
for round in $(seq 1 "$ROUNDS"); do
    for ls in true false; do
        tag="r$round-$ls"
        cat > "$D/c.toml" <<TOML
[daemon]
socket = "$D/s"
[prometheus]
listen = "127.0.0.1:19846"
[gpu]
cupti_dir = "$D/cupti"
[diagnosis]
gpu_activity_ms = $(( PHASE_S * 1000 ))
launch_sites = $ls
TOML
        "$E" run --config "$D/c.toml" > "$OUT/daemon-$tag.log" 2>&1 &
        EP=$!
        for i in $(seq 1 300); do [ -S "$D/s" ] && break; sleep 0.1; done
        sleep 2
        mkfifo "$D/in"
        CUDA_INJECTION64_PATH="$D/cupti/libethand_cupti.so" "$PY" tests/gpu/cupti_workload.py --kernels-only --n "$N" < "$D/in" > "$OUT/$tag.out" 2> "$OUT/$tag.err" &
        WP=$!
        exec {fd}> "$D/in"
        for i in $(seq 1 600); do grep -q '^ready' "$OUT/$tag.out" && break; sleep 0.2; done
        log "$tag dormant: $(phase "$fd" "$OUT/$tag.out" "$PHASE_S")"
        # The window opens at the next collection round: the phase covers it.
        "$E" snapshot --pid "$WP" --json --socket "$D/s" > "$OUT/$tag-snapshot.json" 2> "$OUT/$tag-snapshot.err" &
        SP=$!
        sleep 1
        log "$tag window: $(phase "$fd" "$OUT/$tag.out" "$PHASE_S")"
        wait "$SP"
        log "$tag after: $(phase "$fd" "$OUT/$tag.out" "$PHASE_S")"
        log "$tag sites: $(python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))["gpu_activity"]["processes"][0]
ls = a.get("launch_sites") or {}
print(a["state"], {k: v for k, v in ls.items() if k != "sites"})
for s in ls.get("sites", [])[:5]:
    f = [x for x in s["frames"] if x.get("kind") == "python"][:1] or s["frames"][:1]
    print("   ", s["kernels"], s["gpu_ns"], [(x.get("function"), x.get("file"), x.get("line")) for x in f], s.get("source"), [(k.get("demangled") or k.get("name"))[:60] for k in s["top"]])
' "$OUT/$tag-snapshot.json" 2>&1 | head -c 3000)"
        echo exit >&"$fd"; exec {fd}>&-
        wait "$WP"
        kill "$EP"; wait "$EP"
        rm -f "$D/in"
    done
done
log "end"
rm -rf "$D"
