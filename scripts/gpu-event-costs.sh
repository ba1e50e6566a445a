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
# Writes OUT/events.md (the bench's report), OUT/events.log and OUT/event-costs.json:
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
    --ethand "$ETHAND" --bpftrace /nonexistent/bpftrace --out "$OUT/events.md" > "$OUT/events.log" 2>&1
rc=$?
echo "xtask bench exited $rc"
python3 - "$OUT/events.md" "$OUT/event-costs.json" "$ROUNDS" <<'PY'
import json, re, sys, time
md, out, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
rows = {}
try:
    for line in open(md):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6:
            rows.setdefault(cells[0], cells)  # the first table (Results) wins
except OSError as e:
    print(f"no report: {e}")
def added(prefix):
    """The `ethand added` column (the 6th) of the first row whose name starts with prefix:
    (added ns, its ± noise or None)."""
    num = r"([+-]?[\d,]+(?:\.\d+)?)"
    for name, cells in rows.items():
        if name.startswith(prefix):
            m = re.match(num + r"(?:\s*±\s*" + num + ")?", cells[5])
            if not m:
                return None, None
            f = lambda x: float(x.replace(",", "")) if x else None  # noqa: E731
            return f(m.group(1)), f(m.group(2))
    return None, None
costs = {}
for key, prefix in (("syscall", "getpid loop"), ("switch", "context switch (direct"), ("uprobe", "uprobe:")):
    costs[f"{key}_ns"], costs[f"{key}_noise_ns"] = added(prefix)
costs.update({
         "source": f"`scripts/gpu-event-costs.sh` on this machine ({rounds} rounds, "
                   f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): getpid loop, ping-pong with "
                   "scheduler probes only (per switch, its wakeup included), stand-in cuLaunchKernel"})
json.dump(costs, open(out, "w"), indent=1)
print(json.dumps(costs))
PY
