# Sourced by the scripts/gpu-*.sh that run a daemon of their own on the GPU machine.
# start_daemon DIR PORT LOG [TOML LINE...]: writes DIR/c.toml (socket DIR/s, the CUPTI
# directory DIR/cupti, /metrics on 127.0.0.1:PORT, then the lines given), starts "$E run"
# with it, logging to LOG, and waits up to 30 s for its socket; EP is its pid.
start_daemon() {
    local dir=$1 port=$2 log=$3
    shift 3
    {
        printf '[daemon]\nsocket = "%s/s"\n[prometheus]\nlisten = "127.0.0.1:%s"\n' "$dir" "$port"
        printf '[gpu]\ncupti_dir = "%s/cupti"\n' "$dir"
        [ $# -gt 0 ] && printf '%s\n' "$@"
    } > "$dir/c.toml"
    "$E" run --config "$dir/c.toml" > "$log" 2>&1 &
    EP=$!
    for _ in $(seq 1 300); do [ -S "$dir/s" ] && break; sleep 0.1; done
}
