#!/usr/bin/env bash
# Sets up what is missing, builds ethand, and runs the daemon in the foreground with its
# embedded default configuration (/metrics on 127.0.0.1:9477). Extra arguments go to `ethand run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p ethand
exec ./target/release/ethand run "$@"
