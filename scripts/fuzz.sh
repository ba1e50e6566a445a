#!/usr/bin/env bash
# Builds and runs every cargo-fuzz target (fuzz/fuzz_targets/) for a bounded time each, from
# the committed seed corpus (copied to a temporary directory, so runs never write into
# fuzz/corpus). Prints the executions per target; fails on any crash, timeout, memory blow-up
# or build failure, and then keeps the reproducer in fuzz/artifacts/TARGET/ (git-ignored).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20; needs scripts/setup.sh --tests)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

SECONDS_PER_TARGET=${1:-20}
# The nightly pinned for the eBPF crate (scripts/setup.sh installs it): cargo-fuzz needs a
# nightly for -Zsanitizer, and one toolchain fewer to install.
NIGHTLY=$(sed -n 's/^NIGHTLY=//p' scripts/setup.sh)
# The parsers are safe Rust: what fuzzing finds here is panics, overflows (overflow checks are
# on) and runaway recursion, none of which needs AddressSanitizer, and the build is much
# faster without it. FUZZ_SANITIZER=address scripts/fuzz.sh for the full check.
SANITIZER=${FUZZ_SANITIZER:-none}

log() { printf '[fuzz] %s\n' "$*" >&2; }
command -v cargo-fuzz >/dev/null || { log "cargo-fuzz missing: run scripts/setup.sh --tests"; exit 1; }

t0=$(date +%s)
log "building the fuzz targets with +$NIGHTLY (sanitizer: $SANITIZER)"
cargo "+$NIGHTLY" fuzz build --sanitizer "$SANITIZER" --debug-assertions
log "built in $(($(date +%s) - t0)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
total=0
for target in $(cargo "+$NIGHTLY" fuzz list); do
  mkdir -p "$work/$target/corpus" "$work/$target/artifacts"
  cp -r "fuzz/corpus/$target/." "$work/$target/corpus/" 2>/dev/null || true
  log "$target: ${SECONDS_PER_TARGET} s"
  # -rss_limit_mb: a parser that balloons on a small input is a finding too.
  if cargo "+$NIGHTLY" fuzz run --sanitizer "$SANITIZER" --debug-assertions "$target" \
      "$work/$target/corpus" -- \
      -max_total_time="$SECONDS_PER_TARGET" -seed="${FUZZ_SEED:-1}" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$work/$target/artifacts/" \
      >"$work/$target/log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$target")
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target/log" | tail -n1)
  [[ -n "$runs" ]] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/$target/log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "$work/$target/log" | tail -n1 || true)
  printf '[fuzz] %-16s %-6s executions=%-10s %s corpus=%s\n' "$target" "$status" "${runs:-0}" \
    "$cov" "$(ls "$work/$target/corpus" | wc -l)" >&2
  total=$((total + ${runs:-0}))
  if [[ $status == FAILED ]]; then
    # The panic message first (the stack under it can be long), then the log's end and the
    # reproducer's path.
    grep -A2 -m1 'panicked at' "$work/$target/log" >&2 || true
    grep -v '^#[0-9]' "$work/$target/log" | grep -v '^ *[0-9]*: \|^ *at ' | tail -n 25 >&2
    for a in "$work/$target/artifacts"/*; do
      [[ -e "$a" ]] || continue
      mkdir -p fuzz/artifacts/"$target"
      cp "$a" fuzz/artifacts/"$target"/
      log "reproducer kept: fuzz/artifacts/$target/$(basename "$a") (cargo +$NIGHTLY fuzz run $target THAT_FILE)"
    done
  fi
done
log "total: $total executions, $(($(date +%s) - t0)) s including the build"
if (( ${#failed[@]} )); then
  log "FAILED: ${failed[*]}"
  exit 1
fi
