#!/bin/bash
# What the on-demand launch sample of `ethand snapshot` costs the job, in the worst case: the
# launch-bound eager loop of tests/gpu/scenarios.py (tiny_kernels, ~300 tiny kernels per step,
# every launch on the critical path). The daemon runs with its defaults; every ~10 s a
# snapshot samples the loop's launches (~3 s). Per sample: steps/s inside the sample against
# the mean of the 3 s before and the 3 s after it (drift cancels). Run from the repository root
# as root. Writes ${OUT:-/tmp/gpu-sample-cost}/{log.txt,cost.json,steps.txt,snap-*.json}.
# SNAP_ARGS: more `ethand snapshot` flags (e.g. --no-stack-sample: the launch sample alone, to
# tell its cost from the stack sample's, which runs at the same time by default).
# DAEMON_TOML: more lines of the daemon's config (e.g. "[diagnosis]\ncpu_profile_hz = 0": the
# snapshot without its native CPU profile, to tell the profile's cost from the samples').
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-sample-cost}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
SAMPLES=${SAMPLES:-10}
SNAP_ARGS=${SNAP_ARGS:-}
mkdir -p "$OUT"; exec > >(tee "$OUT/log.txt") 2>&1
W=$(mktemp -d)
printf '[daemon]\nsocket = "%s/ethand.sock"\n[prometheus]\nlisten = "127.0.0.1:9482"\n%b\n' "$W" "${DAEMON_TOML:-}" > "$W/cfg.toml"
"$E" --config "$W/cfg.toml" run > "$W/daemon.log" 2>&1 &
DP=$!
for i in $(seq 1 60); do "$E" --config "$W/cfg.toml" status > /dev/null 2>&1 && break; sleep 0.25; done
RUN_S=$((SAMPLES * 10 + 20))
STEP_LOG=$OUT/steps.txt timeout $((RUN_S + 120)) "$PY" tests/gpu/scenarios.py tiny_kernels "$RUN_S" > "$W/w.out" 2> "$W/w.err" &
TP=$!
for i in $(seq 1 600); do grep -q '^ready' "$W/w.out" 2>/dev/null && break; sleep 0.2; done
WP=$(grep -m1 -oE '^ready [0-9]+' "$W/w.out" | awk '{print $2}')
echo "worker $WP"
sleep 8
for i in $(seq 1 "$SAMPLES"); do
    sleep 3
    # shellcheck disable=SC2086 # SNAP_ARGS is a list of flags
    timeout 30 "$E" --config "$W/cfg.toml" snapshot --pid "$WP" --window 3 --json $SNAP_ARGS > "$OUT/snap-$i.json"
    sleep 3.5
done
wait $TP
kill $DP; wait $DP
python3 - "$OUT" "$SAMPLES" <<'PYX'
import json, sys, statistics, random
out, n = sys.argv[1], int(sys.argv[2])
steps = sorted(float(l.split()[1]) for l in open(f"{out}/steps.txt") if l.startswith("step "))
def rate(a, b):
    k = sum(1 for t in steps if a <= t < b)
    return k / (b - a)
rows = []
for i in range(1, n + 1):
    try:
        s = json.load(open(f"{out}/snap-{i}.json"))["launch_sample"]
    except Exception as e:
        print(f"sample {i}: none ({e})"); continue
    a = s["started_unix_ms"] / 1000.0; b = a + s["duration_ms"] / 1000.0
    inside = rate(a, b); before = rate(a - 3.2, a - 0.2); after = rate(b + 0.2, b + 3.2)
    ch = inside / ((before + after) / 2) - 1
    rows.append({"sample": i, "launches_per_second": s.get("launches_per_second"), "duration_ms": s["duration_ms"],
                 "steps_per_s_inside": inside, "before": before, "after": after, "change": ch})
    print(f"sample {i}: {s.get('launches_per_second', 0):,.0f} launches/s over {s['duration_ms']} ms; steps/s inside {inside:.1f}, before {before:.1f}, after {after:.1f}: {100*ch:+.1f} %")
chs = [r["change"] for r in rows]
if chs:
    random.seed(1)
    boots = sorted(statistics.mean(random.choices(chs, k=len(chs))) for _ in range(10000))
    res = {"samples": rows, "mean_change": statistics.mean(chs), "median_change": statistics.median(chs),
           "ci95": [boots[249], boots[9749]]}
    print(f"mean {100*res['mean_change']:+.2f} %, median {100*res['median_change']:+.2f} %, 95 % interval of the mean {100*boots[249]:+.2f} % to {100*boots[9749]:+.2f} % ({len(chs)} samples)")
    json.dump(res, open(f"{out}/cost.json", "w"), indent=1)
PYX
rm -rf "$W"
