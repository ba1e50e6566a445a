#!/usr/bin/env bash
# Sets up what is missing, builds, and runs every test (unit, BPF and end-to-end).
# Needs root: the end-to-end tests load ethand's BPF programs for real.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
export PATH="$HOME/.cargo/bin:$PATH"
echo "[test] building ethand (release)" >&2
cargo build --release --locked -p ethand
# Licenses, banned/duplicate crates and sources (deny.toml); offline after `cargo fetch`, which
# also brings the other platforms' crates (cargo build fetches only this one's) that cargo deny's
# metadata needs. The advisories check needs GitHub (RustSec), unreachable from CI: scripts/audit.sh.
cargo fetch --locked
echo "[test] cargo deny (bans, licenses, sources)" >&2
cargo deny --locked --offline check bans licenses sources
echo "[test] building the .deb (tests/tests/package.rs installs it)" >&2
cargo xtask deb --binary target/release/ethand
# Both tiers run even when the first fails, so that one CI run reports every failure.
failed=""
echo "[test] cargo test (release): the tests that need no privilege" >&2
cargo test --release --locked --no-fail-fast || failed="$failed cargo-test"
echo "[test] the same test binaries as an unprivileged user (uid 65534)" >&2
bash scripts/unprivileged-tests.sh || failed="$failed unprivileged"
echo "[test] cargo xtask e2e: root, BPF, a running daemon" >&2
cargo xtask e2e || failed="$failed e2e"
# Every parser fuzzed for a bounded time (10 s per target, seed 1 by default: a crash CI finds
# reproduces with the same seed; FUZZ_SECONDS and FUZZ_SEED override).
echo "[test] fuzzing (scripts/fuzz.sh)" >&2
bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}" || failed="$failed fuzz"
if [ -n "$failed" ]; then
    echo "[test] FAILED:$failed" >&2
    exit 1
fi
