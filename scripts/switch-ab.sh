#!/usr/bin/env bash
# Paired A/B of two ethand builds on the context-switch path: the bench's pipe ping-pong
# (`xtask workload pingpong`, pinned to one CPU: 2 switches + 2 wakeups per round trip) under
# no tracer, build A and build B, each with only the scheduler probes attached (the bench's
# `ethand-sched` mode). Modes alternate in cycles, their order rotated every cycle; each cycle
# runs RUNS ping-pongs per mode. The estimate is paired per cycle (medians), so drift across
# the run cancels; the 95 % interval is a percentile bootstrap of the median over cycles.
#
#   scripts/switch-ab.sh BIN_A BIN_B [CYCLES=15] [RUNS=5] [ITERS=100000]
#
# Needs root, python3, and `cargo build --release -p xtask` (uses target/release/xtask).
# Prints each run as "MODE NS_PER_ROUND_TRIP" and the summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
A=$(realpath "$1") B=$(realpath "$2") CYCLES=${3:-15} RUNS=${4:-5} ITERS=${5:-100000}
XTASK=target/release/xtask
[ -x "$XTASK" ] || { echo "build it first: cargo build --release -p xtask" >&2; exit 2; }
DIR=$(mktemp -d /tmp/switch-ab.XXXXXX)
PORT=$((20000 + RANDOM % 20000))
# The probes of the bench's `ethand-sched` mode (ETHAND_SCHED_ONLY in xtask/src/bench/modes.rs).
cat >"$DIR/ethand.toml" <<EOF
[daemon]
socket = "$DIR/ethand.sock"
[prometheus]
listen = "127.0.0.1:$PORT"
[probes]
syscalls = false
block = false
net = false
lifecycle = false
EOF

# run_mode NAME BIN|none: RUNS ping-pongs with that build attached (or nothing).
run_mode() {
  local pid=""
  if [ "$2" != none ]; then
    "$2" run --config "$DIR/ethand.toml" >"$DIR/$1.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
      "$2" status --socket "$DIR/ethand.sock" >/dev/null 2>&1 && break
      kill -0 "$pid" 2>/dev/null || { cat "$DIR/$1.log" >&2; exit 1; }
      sleep 0.1
    done
  fi
  for _ in $(seq "$RUNS"); do
    line=$("$XTASK" workload pingpong --iters "$ITERS" | grep '^elapsed_ns=')
    elapsed=$(sed 's/.*elapsed_ns=\([0-9]*\).*/\1/' <<<"$line")
    events=$(sed 's/.*events=\([0-9]*\).*/\1/' <<<"$line")
    echo "$1 $((elapsed / events))"
  done | tee -a "$DIR/runs.txt"
  if [ -n "$pid" ]; then kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; fi
  sleep 0.5
}

for c in $(seq "$CYCLES"); do
  echo "cycle $c" >>"$DIR/runs.txt"
  case $((c % 3)) in
    0) run_mode none none; run_mode A "$A"; run_mode B "$B" ;;
    1) run_mode A "$A"; run_mode B "$B"; run_mode none none ;;
    2) run_mode B "$B"; run_mode none none; run_mode A "$A" ;;
  esac
done

python3 - "$DIR/runs.txt" <<'EOF'
import random, statistics as st, sys
cycles, cur = [], None
for line in open(sys.argv[1]):
    k, v = line.split()
    if k == "cycle":
        cur = {}
        cycles.append(cur)
    else:
        cur.setdefault(k, []).append(float(v))
def per_switch(c, k):  # added ns per switch (with its wakeup): half a round trip
    return (st.median(c[k]) - st.median(c["none"])) / 2
a = [per_switch(c, "A") for c in cycles]
b = [per_switch(c, "B") for c in cycles]
d = [y - x for x, y in zip(a, b)]
random.seed(1)
def ci(x):
    m = sorted(st.median(random.choices(x, k=len(x))) for _ in range(10000))
    return f"{st.median(x):+.1f} ns (95 % CI {m[250]:+.1f} to {m[-251]:+.1f})"
print(f"cycles {len(cycles)}, runs per mode per cycle {len(cycles[0]['none'])}")
print(f"none: median round trip {st.median(sum((c['none'] for c in cycles), [])):.1f} ns")
print(f"A added per switch: {ci(a)}")
print(f"B added per switch: {ci(b)}")
print(f"B - A per switch:   {ci(d)}")
EOF
rm -rf "$DIR"
