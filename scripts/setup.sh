#!/usr/bin/env bash
# Idempotent set-up for building and testing ethand on Debian 12 (x86_64).
# Installs only what is missing: apt packages, the pinned Rust toolchains,
# bpf-linker built against LLVM 22, and the tools the tests use.
# Usage: scripts/setup.sh [--tests]
set -euo pipefail

NIGHTLY=nightly-2026-06-25
STABLE=1.99.1
BPF_LINKER_VERSION=0.13.0
WANT_TESTS=0
[[ "${1:-}" == "--tests" ]] && WANT_TESTS=1

log() { printf '[setup] %s\n' "$*" >&2; }
need_root() { [[ $(id -u) -eq 0 ]] || { log "run as root (apt-get, BPF)"; exit 1; }; }

apt_pkgs=(build-essential pkg-config llvm-22-dev libzstd-dev zlib1g-dev curl ca-certificates)
if (( WANT_TESTS )); then
  # prometheus: promtool checks /metrics; bpftrace: the bench's reference; util-linux: setpriv;
  # chromium: headless screenshot of the HTML report (tests/tests/e2e/html.rs); python3: the
  # training benchmark's statistics (tests/tests/gpu_bench_stats.rs).
  apt_pkgs+=(prometheus bpftrace util-linux chromium python3)
fi
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  need_root
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The prometheus package starts a server on :9090; the tests start their own when needed.
  if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true
  fi
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v rustup >/dev/null; then
  log "installing rustup"
  tmp=$(mktemp -d)
  curl -sSf -o "$tmp/rustup-init" https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init
  chmod +x "$tmp/rustup-init"
  "$tmp/rustup-init" -y --profile minimal --default-toolchain none --no-modify-path
  rm -rf "$tmp"
fi
have_tc() { rustup toolchain list | grep -q "^$1"; }
have_tc "$NIGHTLY" || { log "rustup $NIGHTLY"; rustup toolchain install "$NIGHTLY" --profile minimal --component rust-src; }
rustup component list --toolchain "$NIGHTLY" --installed 2>/dev/null | grep -q rust-src \
  || rustup component add rust-src --toolchain "$NIGHTLY"
have_tc "$STABLE" || { log "rustup $STABLE"; rustup toolchain install "$STABLE" --profile minimal --component rustfmt,clippy --target x86_64-unknown-linux-musl; }
rustup target list --toolchain "$STABLE" --installed | grep -q musl \
  || rustup target add x86_64-unknown-linux-musl --toolchain "$STABLE"

if ! bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
  log "cargo install bpf-linker $BPF_LINKER_VERSION (llvm-22), about 90 s"
  LLVM_PREFIX=/usr/lib/llvm-22 cargo "+$STABLE" install bpf-linker --version "$BPF_LINKER_VERSION" \
    --locked --no-default-features --features llvm-22
fi

# Test tools: cargo-fuzz (scripts/fuzz.sh, run with $NIGHTLY) and cargo-deny (licenses, bans,
# sources: deny.toml). Pinned like bpf-linker; skipped when that version is already there.
CARGO_FUZZ_VERSION=0.13.2
CARGO_DENY_VERSION=0.20.2
if (( WANT_TESTS )); then
  if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    log "cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo "+$STABLE" install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
  fi
  if ! cargo deny --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
    log "cargo install cargo-deny $CARGO_DENY_VERSION, about 3 min"
    cargo "+$STABLE" install cargo-deny --version "$CARGO_DENY_VERSION" --locked
  fi
fi

# Kernel filesystems the daemon needs.
if [[ -z "$(ls -A /sys/kernel/tracing 2>/dev/null)" ]]; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || log "could not mount tracefs"
fi
log "ready"
