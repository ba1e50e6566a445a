#!/usr/bin/env bash
# Sets up what is missing, builds, and runs every test (unit, BPF and end-to-end).
# Needs root: the end-to-end tests load ethand's BPF programs for real.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
export PATH="$HOME/.cargo/bin:$PATH"
echo "[test] building ethand (release)" >&2
cargo build --release --locked -p ethand
echo "[test] building the .deb (tests/tests/package.rs installs it)" >&2
cargo xtask deb --binary target/release/ethand
echo "[test] cargo test (release)" >&2
cargo test --release --locked --no-fail-fast
