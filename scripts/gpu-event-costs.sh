#!/usr/bin/env bash
# ethand's added cost per event on the machine it runs on, for the bottom-up estimate of
# scripts/gpu-bench.sh (EVENT_COSTS=OUT/event-costs.json): the bench's per-event suite
# (`xtask bench --suites events`) under ethand's default probes and under its scheduler probes
# only, against nothing attached, interleaved in ROUNDS rounds. Run from the repository root,
# as root:
#
#   OUT=/tmp/gpu-event-costs bash scripts/gpu-event-costs.sh
#
# Needs .device-bin/xtask (`cargo build --release -p xtask`, copied; it runs its own
# workloads) and .device-bin/ethand; bpftrace is not used. The uprobe row needs a C compiler
# (`cc`) for the stand-in library; without one it is left out and so is its cost.
# Writes OUT/events.md and OUT/events.json (the bench's report and its table as data),
# OUT/events.log and OUT/event-costs.json:
# {syscall_ns (getpid loop), switch_ns (ping-pong, scheduler probes only, per switch),
#  uprobe_ns (stand-in cuLaunchKernel, or null), each with its ± as *_noise_ns, source}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-event-costs}
ROUNDS=${ROUNDS:-3}
XTASK=${XTASK:-.device-bin/xtask}
ETHAND=${ETHAND:-.device-bin/ethand}
mkdir -p "$OUT" || exit 2
for f in "$XTASK" "$ETHAND"; do
    [ -x "$f" ] || { echo "missing $f (build it here and copy it into .device-bin/)" >&2; exit 2; }
done
timeout 400 "$XTASK" bench --modes none,ethand,ethand-sched --suites events --rounds "$ROUNDS" \
    --ethand "$ETHAND" --bpftrace /nonexistent/bpftrace --out "$OUT/events.md" --json "$OUT/events.json" \
    > "$OUT/events.log" 2>&1
rc=$?
echo "xtask bench exited $rc"
python3 - "$OUT/events.json" "$OUT/event-costs.json" "$ROUNDS" <<'PY'
import json, sys, time
src, out, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    with open(src) as f:
        bench = json.load(f)
except (OSError, ValueError) as e:
    print(f"no bench JSON: {e}")
    bench = {}
def cost(entry):
    """(added ns, its noise) of one bench entry, (None, None) if it did not run."""
    entry = entry or {}
    return entry.get("added_ns"), entry.get("added_noise_ns")
modes = lambda w: ((bench.get("workloads") or {}).get(w) or {}).get("modes") or {}  # noqa: E731
costs = {}
costs["syscall_ns"], costs["syscall_noise_ns"] = cost(modes("getpid").get("ethand"))
costs["switch_ns"], costs["switch_noise_ns"] = cost((bench.get("per_switch") or {}).get("ethand-sched"))
costs["uprobe_ns"], costs["uprobe_noise_ns"] = cost(modes("uprobe").get("ethand"))
costs["source"] = (f"`scripts/gpu-event-costs.sh` on this machine ({rounds} rounds, "
                   f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): getpid loop, ping-pong with "
                   "scheduler probes only (per switch, its wakeup included), stand-in cuLaunchKernel")
with open(out, "w") as f:
    json.dump(costs, f, indent=1)
print(json.dumps(costs))
PY
