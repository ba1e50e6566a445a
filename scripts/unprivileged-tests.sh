#!/bin/bash
# Runs the test binaries of plain `cargo test` (the workspace's default members: every crate
# but `tests`) as an unprivileged user with no capabilities, as a developer without root runs
# them: a test there that needs root fails here. Run as root after `cargo test --release`
# (reuses its build). USER_ID (default 65534, nobody) picks the user.
set -euo pipefail
cd "$(dirname "$0")/.."
uid=${USER_ID:-65534}
if [ "$(id -u)" != 0 ]; then
    echo "unprivileged-tests: needs root to switch to uid $uid; as a normal user just run cargo test" >&2
    exit 2
fi
# Test executables and the package directory each runs in (as cargo test runs them).
list=$(cargo test --release --locked --no-run --message-format=json 2>/dev/null |
    grep '"profile":{[^}]*"test":true' |
    sed -n 's/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"executable":"\([^"]*\)".*/\1 \2/p')
[ -n "$list" ] || { echo "unprivileged-tests: no test executables found" >&2; exit 1; }
failed=""
n=0
while read -r dir exe; do
    n=$((n + 1))
    echo "== $exe (as uid $uid, in $dir)" >&2
    if ! (cd "$dir" && HOME=/tmp setpriv --reuid="$uid" --regid="$uid" --clear-groups \
        --inh-caps=-all --bounding-set=-all -- "$exe" -q); then
        failed="$failed $(basename "$exe")"
    fi
done <<< "$list"
if [ -n "$failed" ]; then
    echo "unprivileged-tests: failed as uid $uid:$failed" >&2
    exit 1
fi
echo "unprivileged-tests: $n test binaries passed as uid $uid" >&2
