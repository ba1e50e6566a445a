#!/bin/bash
# Issue 5's integrations on a real GPU machine: ethand with NVML and real PyTorch/NCCL, scraped by
# Prometheus (the prebuilt binary from Debian's package, carried as .device-bin/prometheus.gz),
# every Grafana panel query evaluated (tests/gpu/dashboards_check.py), the alert rules loaded and
# evaluated, job/rank attribution from torchrun's environment, and the daemon's RSS. Run from the
# repository root as root with .device-bin/ethand built here. Writes ${OUT:-/tmp/gpu-integrations}.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-integrations}
E=${ETHAND:-.device-bin/ethand}
PY=${PY:-/opt/torch/.venv/bin/python}
RUN_S=${RUN_S:-70}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"; exec > >(tee "$OUT/log.txt") 2>&1
W=$(mktemp -d)
gunzip -c .device-bin/prometheus.gz > "$W/prometheus" && chmod +x "$W/prometheus"
cat > "$W/cfg.toml" <<CFG
[daemon]
socket = "$W/ethand.sock"
bpf_stats = "always"
[prometheus]
listen = "127.0.0.1:9477"
[gpu]
rescan_interval_ms = 500
CFG
"$E" --config "$W/cfg.toml" run > "$W/daemon.log" 2>&1 &
DP=$!
for i in $(seq 1 40); do "$E" --config "$W/cfg.toml" status > /dev/null 2>&1 && break; sleep 0.5; done
sed "s#scrape_interval: 15s#scrape_interval: 1s#; s#evaluation_interval: 15s#evaluation_interval: 1s#; s#ethand-alerts.yml#$(pwd)/deploy/prometheus/ethand-alerts.yml#" \
    deploy/prometheus/prometheus.yml > "$W/prometheus.yml"
"$W/prometheus" --config.file="$W/prometheus.yml" --storage.tsdb.path="$W/tsdb" \
    --web.listen-address=127.0.0.1:9090 > "$W/prometheus.log" 2>&1 &
PP=$!
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
NG=$(nvidia-smi -L | wc -l)
echo "== workloads for ${RUN_S}s on $NG GPU(s)"
if [ "$NG" -ge 2 ]; then
    timeout $((RUN_S + 60)) "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/gpu/diag_workloads.py straggler "$RUN_S" > "$W/straggler.out" 2>&1 &
else
    timeout $((RUN_S + 60)) "$PY" tests/gpu/diag_workloads.py item "$RUN_S" > "$W/item.out" 2>&1 &
fi
WP=$!
# One more process with a leak (GPU memory growth) and a DataLoader stall, shorter.
sleep 20
timeout 60 "$PY" tests/gpu/diag_workloads.py leak 30 > "$W/leak.out" 2>&1 &
sleep 35
echo "== ethand status (rss, probes)"
"$E" --config "$W/cfg.toml" status | head -40
echo "== per-process identity series (python)"
curl -s 127.0.0.1:9477/metrics | grep -E '^ethand_process_(workload_info|collective_rank_info|cpu_seconds_total)' | grep -i python | head -12
echo "== dashboards"
"$PY" tests/gpu/dashboards_check.py http://127.0.0.1:9090 deploy/grafana
echo "dashboards_check exit $?"
echo "== alert rules"
curl -s 127.0.0.1:9090/api/v1/rules | "$PY" -c '
import json,sys
d=json.load(sys.stdin)
for g in d["data"]["groups"]:
    for r in g["rules"]:
        print(r["name"], r["health"], r.get("state","-"), (r.get("lastError") or "")[:100])'
echo "== alert expressions evaluated now (their 'for:' durations not waited)"
curl -s 127.0.0.1:9090/api/v1/rules | "$PY" -c '
import json,sys,urllib.parse,urllib.request
d=json.load(sys.stdin)
for g in d["data"]["groups"]:
    for r in g["rules"]:
        q=urllib.parse.urlencode({"query": r["query"]})
        res=json.load(urllib.request.urlopen("http://127.0.0.1:9090/api/v1/query?"+q))["data"]["result"]
        if res:
            print(r["name"], [{k:v for k,v in x["metric"].items() if k in ("pid","rank","job_id","gpu")} for x in res])'
echo "== alerts pending or firing"
curl -s 127.0.0.1:9090/api/v1/alerts | "$PY" -c '
import json,sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    print(a["labels"].get("alertname"), a["state"], {k:v for k,v in a["labels"].items() if k in ("pid","rank","job_id","gpu")})'
curl -s 127.0.0.1:9477/metrics > "$OUT/metrics.txt"
grep '^ethand_self_resident_memory_bytes' "$OUT/metrics.txt"
wait $WP
kill $PP; kill -TERM $DP; wait $DP
cp "$W/daemon.log" "$OUT/daemon.log"
tail -5 "$W/prometheus.log"
