#!/usr/bin/env python3
"""Helpers of scripts/gpu-check.sh: compare ethand's per-process GPU counters with a
workload's ground truth, compare NVML device metrics with nvidia-smi, summarise the cost
benchmark, and bundle everything into a few output files. Standard library only.

Subcommands:
  truth    --from STDOUT_FILE [--pid P] --out TRUTH.json
           the workload's ground-truth JSON line (the one with "expect"; for torchrun output,
           the line of process P), written as a file.
  compare  NAME --truth T --before B --after A --pid P [--level process|op|system] --out R
           per-field delta AFTER - BEFORE of the process's `gpu` object in two
           `ethand snapshot --pid P --json` outputs against the truth; prints a table with
           PASS/FAIL per field and the symbols that fired; exit 1 on a FAIL.
  nvml     --metrics METRICS.txt --smi SMI.csv --label L --out R
           ethand_gpu_* series of /metrics against
           `nvidia-smi --query-gpu=index,memory.used,utilization.gpu,temperature.gpu,power.draw
           --format=csv,noheader,nounits`.
  bench    --in BENCH.jsonl --out R      steps/s per ethand state and slowdown vs no ethand.
  bundle   --work DIR --out OUTDIR       results.json, snapshots.json, status.json.
  status   STATUS.json [--require-attached]
           human summary of `ethand status --json` (GPU part); with --require-attached exit 1
           when a runtime library file found is not attached.
  get      FILE KEY.PATH                 print one value of a JSON file ("" when absent).
  selftest                                 the above on synthetic snapshots.

Ground truth (one JSON line printed by each workload):
  {"workload": NAME, "pid": P, "exact_symbols": bool, "expect": {FIELD: N}, "soft": {FIELD: N}}
  memory.<kind>.peak_bytes is the rise of live memory in the window (a high-water mark:
  AFTER's peak must equal max(BEFORE's peak, BEFORE's live + X)).
  FIELD names: launches, graph_launches, errors, untracked_frees, comm_inits,
  sync.{calls,timed_calls,time_ns}, groups.{calls,...}, copies.<direction|total>.{calls,bytes},
  memory.<kind>.{allocs,alloc_bytes,frees,freed_bytes,live_bytes,peak_bytes},
  collectives.<operation>.{calls,bytes,time_ns,timed_calls}, comm.{rank,nranks} (absolute
  values of AFTER, not deltas), symbols.<library>:<symbol>.{calls,errors,bytes,time_ns,timed_calls}.
  `expect` fields are checked exactly (FAIL counts); `soft` ones depend on how a framework
  reaches the driver and are reported as "same"/"DIFF" without failing.
"""
import glob
import json
import os
import re
import sys

COPY_DIRS = ["host_to_device", "device_to_host", "device_to_device", "peer", "default", "host_to_host"]
MEM_FIELDS = ["allocs", "alloc_bytes", "frees", "freed_bytes", "live_bytes", "peak_bytes"]


# ----------------------------------------------------------------------------- loading

def load_json(path):
    """JSON of a file, or None when missing/empty/invalid."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        # A file with log lines around the JSON document: take the outermost {...}.
        i, j = text.find("{"), text.rfind("}")
        if 0 <= i < j:
            try:
                return json.loads(text[i:j + 1])
            except ValueError:
                return None
        return None


def json_lines(path):
    """Every JSON object found on a line of a text file (prefixes such as '[rank0]:' allowed)."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                i = line.find("{")
                if i < 0:
                    continue
                try:
                    obj = json.loads(line[i:].strip())
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    except OSError:
        pass
    return out


def process_of(snapshot, pid):
    """The ProcessSnapshot of pid in a TreeSnapshot (root first), or None."""
    if not isinstance(snapshot, dict):
        return None
    procs = snapshot.get("processes") or []
    for p in procs:
        if isinstance(p, dict) and p.get("pid") == pid:
            return p
    return None


def flatten(gpu):
    """A GpuProcessStats object as {FIELD: number} (see the module doc)."""
    f = {}
    if not isinstance(gpu, dict):
        return f
    for k in ("launches", "graph_launches", "untracked_frees", "comm_inits", "errors"):
        f[k] = int(gpu.get(k) or 0)
    for k in ("sync", "groups"):
        t = gpu.get(k) or {}
        for sub in ("calls", "time_ns", "timed_calls"):
            f[f"{k}.{sub}"] = int(t.get(sub) or 0)
    tc = tb = 0
    for c in gpu.get("copies") or []:
        d = c.get("direction") or "default"
        f[f"copies.{d}.calls"] = f.get(f"copies.{d}.calls", 0) + int(c.get("calls") or 0)
        f[f"copies.{d}.bytes"] = f.get(f"copies.{d}.bytes", 0) + int(c.get("bytes") or 0)
        tc += int(c.get("calls") or 0)
        tb += int(c.get("bytes") or 0)
    f["copies.total.calls"] = tc
    f["copies.total.bytes"] = tb
    for m in gpu.get("memory") or []:
        kind = m.get("kind") or "?"
        for k in MEM_FIELDS:
            f[f"memory.{kind}.{k}"] = int(m.get(k) or 0)
    for c in gpu.get("collectives") or []:
        op = c.get("operation") or "?"
        for k in ("calls", "bytes", "time_ns", "timed_calls"):
            key = f"collectives.{op}.{k}"
            f[key] = f.get(key, 0) + int(c.get(k) or 0)
    comm = gpu.get("comm")
    if isinstance(comm, dict):
        f["comm.rank"] = comm.get("rank") if comm.get("rank") is not None else -1
        f["comm.nranks"] = int(comm.get("nranks") or 0)
    for s in gpu.get("symbols") or []:
        name = f"symbols.{s.get('library', '?')}:{s.get('symbol', '?')}"
        for k in ("calls", "errors", "bytes", "time_ns", "timed_calls"):
            f[f"{name}.{k}"] = f.get(f"{name}.{k}", 0) + int(s.get(k) or 0)
    return f


def is_absolute(field):
    return field.startswith("comm.")


def delta(before, after):
    d = {}
    for k in set(before) | set(after):
        if is_absolute(k):
            if k in after:
                d[k] = after[k]
        else:
            d[k] = int(after.get(k, 0)) - int(before.get(k, 0))
    return d


def symbol_rows(gpu_before, gpu_after):
    """Per symbol (and copy direction): delta and absolute values, most calls first."""
    def index(gpu):
        out = {}
        for s in (gpu or {}).get("symbols") or []:
            key = (s.get("library", ""), s.get("symbol", ""), s.get("direction", ""))
            out[key] = s
        return out
    b, a = index(gpu_before), index(gpu_after)
    rows = []
    for key in set(a) | set(b):
        sa, sb = a.get(key, {}), b.get(key, {})
        r = {"library": key[0], "symbol": key[1], "direction": key[2],
             "category": sa.get("category") or sb.get("category") or ""}
        for k in ("calls", "errors", "bytes", "time_ns", "timed_calls"):
            r[k] = int(sa.get(k) or 0) - int(sb.get(k) or 0)
            r[f"total_{k}"] = int(sa.get(k) or 0)
        rows.append(r)
    rows.sort(key=lambda r: (-r["calls"], -r["total_calls"], r["symbol"]))
    return rows


# ----------------------------------------------------------------------------- compare

def expectations(truth, level):
    """(hard, soft) {field: value} for a level."""
    hard = dict(truth.get("expect") or {})
    soft = dict(truth.get("soft") or {})
    if level == "system":
        # No uprobes at level system: nothing may change (comm is absolute: not checked).
        hard = {k: 0 for k in list(hard) + list(soft) if not is_absolute(k)}
        return hard, {}
    if "sync.calls" in hard and "sync.timed_calls" not in hard:
        hard["sync.timed_calls"] = hard["sync.calls"]  # synchronization is always timed
    if level == "op":
        for k, v in list(hard.items()):
            if k.startswith("symbols.") and k.endswith(".calls"):
                hard.setdefault(k[:-len(".calls")] + ".timed_calls", v)
        for k, v in list(soft.items()):
            if k.startswith("symbols.") and k.endswith(".calls"):
                soft.setdefault(k[:-len(".calls")] + ".timed_calls", v)
    return hard, soft


def check(field, want, d, fb, fa):
    """(value shown as ethand's, equal?) for one expected field.

    `memory.<kind>.peak_bytes` is a high-water mark, not a counter: the truth is the rise of
    live memory within the window (X), so AFTER's peak must be max(BEFORE's peak, BEFORE's
    live + X); shown: AFTER's peak - BEFORE's live."""
    if field.startswith("memory.") and field.endswith(".peak_bytes"):
        live_key = field[:-len("peak_bytes")] + "live_bytes"
        lb, pb, pa = fb.get(live_key, 0), fb.get(field, 0), fa.get(field, 0)
        return pa - lb, pa == max(pb, lb + want)
    got = d.get(field, 0 if not is_absolute(field) else None)
    return got, got == want


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}".replace(",", "_")
    return str(v)


def cmd_compare(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="compare.py compare")
    ap.add_argument("name")
    ap.add_argument("--truth", required=True)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--level", default="process")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = compare(a.name, load_json(a.truth), load_json(a.before), load_json(a.after), a.pid, a.level)
    print_result(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else (2 if res.get("error") else 1)


def compare(name, truth, before, after, pid, level="process"):
    res = {"name": name, "pid": pid, "level": level, "ok": False, "error": "",
           "pass": 0, "fail": 0, "soft_diff": 0, "rows": [], "soft_rows": [], "unexpected": [],
           "symbols": [], "nonzero_delta": {}, "truth": truth}
    if not isinstance(truth, dict) or "expect" not in truth:
        res["error"] = "no ground truth (the workload printed no JSON line with \"expect\")"
        return res
    if not pid:
        pid = int(truth.get("pid") or 0)
        res["pid"] = pid
    if not isinstance(before, dict) or not isinstance(after, dict):
        res["error"] = "missing snapshot: " + ", ".join(
            n for n, s in (("before", before), ("after", after)) if not isinstance(s, dict))
        return res
    pb, pa = process_of(before, pid), process_of(after, pid)
    if pa is None:
        res["error"] = f"pid {pid} is not in the AFTER snapshot"
        return res
    gb = (pb or {}).get("gpu") or {}
    ga = pa.get("gpu") or {}
    res["gpu_null"] = {"before": not (pb or {}).get("gpu"), "after": not pa.get("gpu")}
    fb, fa = flatten(gb), flatten(ga)
    d = delta(fb, fa)
    hard, soft = expectations(truth, level)
    for k in sorted(hard):
        got, ok = check(k, hard[k], d, fb, fa)
        res["rows"].append({"field": k, "truth": hard[k], "ethand": got, "before": fb.get(k),
                            "after": fa.get(k), "result": "PASS" if ok else "FAIL"})
        res["pass" if ok else "fail"] += 1
    for k in sorted(soft):
        if k in hard:
            continue
        got, same = check(k, soft[k], d, fb, fa)
        res["soft_rows"].append({"field": k, "truth": soft[k], "ethand": got, "before": fb.get(k),
                                 "after": fa.get(k), "result": "same" if same else "DIFF"})
        if not same:
            res["soft_diff"] += 1
    exact = bool(truth.get("exact_symbols")) or level == "system"
    for k in sorted(d):
        if is_absolute(k) or not d[k]:
            continue
        res["nonzero_delta"][k] = d[k]
        if exact and k.startswith("symbols.") and k.endswith(".calls") and k not in hard:
            res["unexpected"].append({"field": k, "ethand": d[k]})
            res["fail"] += 1
    res["symbols"] = symbol_rows(gb, ga)
    res["ok"] = res["fail"] == 0 and res["pass"] > 0
    return res


def print_result(res):
    name = res["name"]
    print(f"==== compare {name} (pid {res['pid']}, level {res['level']}) ====")
    if res.get("error"):
        print(f"  ERROR: {res['error']}")
        print(f"  RESULT {name}: ERROR")
        return
    if res.get("gpu_null", {}).get("after"):
        print("  note: the AFTER snapshot has gpu = null (ethand saw no probed call of this process)")
    w = max([len(r["field"]) for r in res["rows"] + res["soft_rows"]] + [5])
    head = f"  {'field':<{w}} {'truth':>16} {'ethand delta':>16} {'before':>16} {'after':>16}  result"
    print(head)
    for r in res["rows"]:
        print(f"  {r['field']:<{w}} {fmt(r['truth']):>16} {fmt(r['ethand']):>16} "
              f"{fmt(r['before']):>16} {fmt(r['after']):>16}  {r['result']}")
    if res["soft_rows"]:
        print("  -- soft (depends on how the framework reaches the driver; not a failure):")
        for r in res["soft_rows"]:
            print(f"  {r['field']:<{w}} {fmt(r['truth']):>16} {fmt(r['ethand']):>16} "
                  f"{fmt(r['before']):>16} {fmt(r['after']):>16}  {r['result']}")
    for u in res["unexpected"]:
        print(f"  UNEXPECTED symbol call in the window: {u['field']} = {u['ethand']}  FAIL")
    print("  symbols (delta in window | total since attach):")
    if not res["symbols"]:
        print("    (none)")
    for s in res["symbols"]:
        dirn = f" [{s['direction']}]" if s["direction"] else ""
        print(f"    {s['library']}:{s['symbol']}{dirn} ({s['category']}): calls {fmt(s['calls'])} "
              f"bytes {fmt(s['bytes'])} timed {fmt(s['timed_calls'])} errors {fmt(s['errors'])} | "
              f"total calls {fmt(s['total_calls'])}")
    verdict = "PASS" if res["ok"] else "FAIL"
    print(f"  RESULT {name}: {verdict} ({res['pass']} pass, {res['fail']} fail, "
          f"{res['soft_diff']} soft diff)")


# ----------------------------------------------------------------------------- truth

def cmd_truth(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="compare.py truth")
    ap.add_argument("--from", dest="src", required=True)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for obj in json_lines(a.src):
        if "expect" not in obj:
            continue
        if a.pid and obj.get("pid") != a.pid:
            continue
        with open(a.out, "w") as f:
            json.dump(obj, f)
        return 0
    return 1


# ----------------------------------------------------------------------------- nvml

METRIC_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def parse_metrics(text):
    """{(name, gpu label): value} of the ethand_gpu_* samples."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("ethand_gpu_"):
            continue
        m = METRIC_RE.match(line)
        if not m:
            continue
        labels = m.group(2) or ""
        g = re.search(r'gpu="([^"]*)"', labels)
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[(m.group(1), g.group(1) if g else "")] = v
    return out


def parse_smi(text):
    """{gpu index: {memory_used_mib, util_pct, temp_c, power_w}} of nvidia-smi csv."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue

        def num(s):
            try:
                return float(s)
            except ValueError:
                return None
        out[int(parts[0])] = {"memory_used_mib": num(parts[1]), "util_pct": num(parts[2]),
                              "temp_c": num(parts[3]), "power_w": num(parts[4])}
    return out


def nvml_compare(metrics_text, smi_text, label):
    m = parse_metrics(metrics_text)
    s = parse_smi(smi_text)
    rows = []
    for idx, v in sorted(s.items()):
        g = f"gpu{idx}"

        def row(field, metric, ethand, smi, tol, unit):
            if ethand is None or smi is None:
                res = "MISSING" if smi is not None else "n/a"
                diff = None
            else:
                diff = ethand - smi
                res = "PASS" if abs(diff) <= tol else "WARN"
            rows.append({"gpu": g, "field": field, "metric": metric, "ethand": ethand, "nvidia_smi": smi,
                         "diff": diff, "tolerance": tol, "unit": unit, "result": res})
        mem = m.get(("ethand_gpu_memory_used_bytes", g))
        row("memory_used", "ethand_gpu_memory_used_bytes",
            None if mem is None else mem / 2**20, v["memory_used_mib"],
            max(512.0, 0.05 * (v["memory_used_mib"] or 0)), "MiB")
        ut = m.get(("ethand_gpu_utilization_ratio", g))
        row("utilization", "ethand_gpu_utilization_ratio", None if ut is None else ut * 100,
            v["util_pct"], 25.0, "%")
        te = m.get(("ethand_gpu_temperature_celsius", g))
        row("temperature", "ethand_gpu_temperature_celsius", te, v["temp_c"], 3.0, "C")
        pw = m.get(("ethand_gpu_power_watts", g))
        row("power", "ethand_gpu_power_watts", pw, v["power_w"],
            max(30.0, 0.2 * (v["power_w"] or 0)), "W")
    return {"label": label, "rows": rows, "gpus_in_smi": len(s),
            "gpus_in_metrics": len({k[1] for k in m if k[0] == "ethand_gpu_memory_used_bytes"})}


def cmd_nvml(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="compare.py nvml")
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--smi", required=True)
    ap.add_argument("--label", default="idle")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    def read(p):
        try:
            with open(p, errors="replace") as f:
                return f.read()
        except OSError:
            return ""
    res = nvml_compare(read(a.metrics), read(a.smi), a.label)
    print(f"==== NVML vs nvidia-smi ({a.label}) ====")
    print(f"  GPUs: nvidia-smi {res['gpus_in_smi']}, ethand /metrics {res['gpus_in_metrics']}")
    for r in res["rows"]:
        e = "-" if r["ethand"] is None else f"{r['ethand']:.1f}"
        n = "-" if r["nvidia_smi"] is None else f"{r['nvidia_smi']:.1f}"
        print(f"  {r['gpu']:<5} {r['field']:<12} ethand {e:>10} {r['unit']:<3} nvidia-smi {n:>10} "
              f"{r['unit']:<3} (tolerance {r['tolerance']:.0f})  {r['result']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


# ----------------------------------------------------------------------------- bench

def bench_summary(entries):
    """entries: [{"bench", "state", "run", "result": {...}|None}] -> summary."""
    out = {}
    for e in entries:
        r = e.get("result") or {}
        v = r.get("median_steps_per_s") or r.get("steps_per_s")
        b = out.setdefault(e.get("bench", "?"), {})
        s = b.setdefault(e.get("state", "?"), {"runs": [], "failed": 0})
        if v:
            s["runs"].append(float(v))
        else:
            s["failed"] += 1
    for b, states in out.items():
        none = states.get("none", {}).get("runs") or []
        base = sum(none) / len(none) if none else None
        for st, s in states.items():
            runs = s["runs"]
            s["mean_steps_per_s"] = round(sum(runs) / len(runs), 2) if runs else None
            s["slowdown_vs_none_pct"] = (round((base - s["mean_steps_per_s"]) / base * 100, 2)
                                         if base and runs else None)
            if len(runs) > 1:
                mu = sum(runs) / len(runs)
                s["spread_pct"] = round((max(runs) - min(runs)) / mu * 100, 2)
    return out


def cmd_bench(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="compare.py bench")
    ap.add_argument("--in", dest="src", required=True)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    entries = json_lines(a.src)
    res = bench_summary(entries)
    print("==== cost per level (steps/s; median of 0.5 s slices per run; slowdown vs no ethand) ====")
    order = ["none", "process", "op", "system"]
    for b, states in res.items():
        print(f"  {b}:")
        for st in sorted(states, key=lambda x: order.index(x) if x in order else 9):
            s = states[st]
            runs = ", ".join(f"{x:.1f}" for x in s["runs"]) or "-"
            sl = s["slowdown_vs_none_pct"]
            sl = "-" if sl is None else f"{sl:+.2f}%"
            print(f"    {st:<8} mean {s['mean_steps_per_s'] or '-':>10}  slowdown {sl:>8}  "
                  f"runs [{runs}]  failed {s['failed']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"entries": entries, "summary": res}, f, indent=1)
    return 0


# ----------------------------------------------------------------------------- bundle

def cmd_bundle(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="compare.py bundle")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet", action="store_true", help="no summary on stdout")
    a = ap.parse_args(argv)
    w = a.work
    snaps = {}
    for p in sorted(glob.glob(os.path.join(w, "snap", "*.json"))):
        base = os.path.basename(p)[:-5]  # NAME.before / NAME.after
        name, _, which = base.rpartition(".")
        snaps.setdefault(name, {})[which] = load_json(p)
    with open(os.path.join(a.out, "snapshots.json"), "w") as f:
        json.dump(snaps, f, indent=1)
    status = {}
    for p in sorted(glob.glob(os.path.join(w, "status-*.json"))):
        status[os.path.basename(p)[len("status-"):-5]] = load_json(p)
    with open(os.path.join(a.out, "status.json"), "w") as f:
        json.dump(status, f, indent=1)
    results = {"steps": json_lines(os.path.join(w, "steps.jsonl")), "compare": {}, "nvml": [],
               "bench": load_json(os.path.join(w, "bench-summary.json")),
               "env": load_json(os.path.join(w, "env.json")), "symbols_seen": {}}
    for p in sorted(glob.glob(os.path.join(w, "cmp", "*.json"))):
        r = load_json(p)
        if isinstance(r, dict):
            results["compare"][r.get("name") or os.path.basename(p)] = r
            results["symbols_seen"][r.get("name")] = [
                {k: s[k] for k in ("library", "symbol", "direction", "category", "calls", "bytes",
                                   "total_calls")}
                for s in r.get("symbols") or []]
    for p in sorted(glob.glob(os.path.join(w, "nvml-*.json"))):
        r = load_json(p)
        if r:
            results["nvml"].append(r)
    summary = {"compare": {n: ("ERROR: " + r["error"]) if r.get("error") else
                           ("PASS" if r.get("ok") else f"FAIL ({r.get('fail')} fields)")
                           for n, r in results["compare"].items()},
               "steps_failed": [s.get("step") for s in results["steps"] if s.get("status") == "fail"],
               "nvml_warn": [f"{r['label']}:{row['gpu']}:{row['field']}" for r in results["nvml"]
                             for row in r.get("rows", []) if row.get("result") not in ("PASS", "n/a")]}
    results["summary"] = summary
    tmp = os.path.join(a.out, ".results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, os.path.join(a.out, "results.json"))
    if a.quiet:
        return 0
    print("==== summary ====")
    for n, v in summary["compare"].items():
        print(f"  {n:<28} {v}")
    print(f"  failed steps: {', '.join(summary['steps_failed']) or 'none'}")
    print(f"  NVML differences beyond tolerance: {', '.join(summary['nvml_warn']) or 'none'}")
    return 0


def cmd_status(argv):
    """Human summary of `ethand status --json`: GPU level, runtime libraries, probes, cost."""
    require = "--require-attached" in argv
    argv = [a for a in argv if a != "--require-attached"]
    s = load_json(argv[0]) if argv else None
    if not isinstance(s, dict):
        print("  (no status)")
        return 1
    print(f"  ethand {s.get('version')} pid {s.get('pid')}: gpu_level {s.get('gpu_level')}, "
          f"cpu {s.get('cpu_seconds')} s, rss {int(s.get('rss_bytes') or 0) >> 20} MiB, "
          f"tracked processes {s.get('tracked_processes')}, bpf_stats {s.get('bpf_stats')}")
    for p in s.get("probes") or []:
        if p.get("state") != "attached" or p.get("name", "").startswith("uprobe_") \
                or p.get("name", "") in ("nvml", "dcmi"):
            print(f"  probe {p.get('name')}: {p.get('state')} {p.get('detail') or ''}".rstrip())
    libs = s.get("gpu_libraries") or []
    if not libs:
        print("  gpu libraries: none found yet")
    for lib in libs:
        print(f"  library [{lib.get('runtime')}] {lib.get('path')} (found in pid {lib.get('found_in_pid')}): "
              f"{lib.get('state')} {lib.get('detail') or ''}")
        print(f"    attached {len(lib.get('symbols_attached') or [])}: "
              f"{', '.join(lib.get('symbols_attached') or [])}")
        for m in lib.get("symbols_missing") or []:
            print(f"    missing: {m}")
    for p in s.get("programs") or []:
        n, ns = int(p.get("run_count") or 0), int(p.get("run_time_ns") or 0)
        if n:
            print(f"  program {p.get('name')}: {n} runs, {ns / n:.0f} ns/run")
    for d in s.get("dropped") or []:
        if d.get("count"):
            print(f"  dropped {d.get('reason')}: {d.get('count')} (loss: {d.get('loss')})")
    if require:
        bad = [lib for lib in libs if lib.get("state") != "attached"]
        for lib in bad:
            print(f"  NOT ATTACHED: [{lib.get('runtime')}] {lib.get('path')} (found in pid "
                  f"{lib.get('found_in_pid')}, host path {lib.get('host_path')}): {lib.get('detail')}")
        if bad:
            return 1
    return 0


def cmd_get(argv):
    if len(argv) != 2:
        print("usage: compare.py get FILE KEY.PATH", file=sys.stderr)
        return 2
    v = load_json(argv[0])
    for part in argv[1].split("."):
        if isinstance(v, dict):
            v = v.get(part)
        elif isinstance(v, list) and part.isdigit() and int(part) < len(v):
            v = v[int(part)]
        else:
            v = None
    if v is None:
        print("")
    elif isinstance(v, (dict, list)):
        print(json.dumps(v))
    else:
        print(v)
    return 0


# ----------------------------------------------------------------------------- selftest

def _snap(pid, gpu):
    return {"schema_version": 1, "source": "daemon", "root_pid": pid, "taken_at_unix_ms": 0,
            "measured_ms": 0, "processes": [{"pid": pid, "comm": "w", "gpu": gpu, "devices": []}],
            "total": {}, "probes": []}


def _gpu(launches, h2d, d2h, syncs, allocs, live, peak, syms, coll=None, comm=None, timed=None):
    return {"launches": launches, "graph_launches": 0,
            "copies": [{"direction": "host_to_device", "calls": h2d[0], "bytes": h2d[1]},
                       {"direction": "device_to_host", "calls": d2h[0], "bytes": d2h[1]}],
            "sync": {"calls": syncs, "time_ns": 1000 * syncs, "timed_calls": syncs if timed is None else timed},
            "memory": [{"kind": "device", "allocs": allocs[0], "alloc_bytes": allocs[1], "frees": allocs[2],
                        "freed_bytes": allocs[3], "live_bytes": live, "peak_bytes": peak}],
            "untracked_frees": 0, "collectives": coll or [], "groups": {"calls": 0, "time_ns": 0, "timed_calls": 0},
            "comm_inits": 1 if comm else 0, "comm": comm, "errors": 0,
            "symbols": [{"library": "libcuda", "symbol": s, "category": "x", "direction": "", "calls": c,
                         "errors": 0, "bytes": b, "time_ns": 0, "timed_calls": 0} for s, c, b in syms]}


def cmd_selftest(argv):
    import tempfile
    N, A, S, C, B, K = 1000, 10, 1 << 20, 20, 4 << 20, 50
    truth = {"workload": "rust-driver", "pid": 42, "exact_symbols": True, "expect": {
        "launches": N, "graph_launches": 0, "copies.host_to_device.calls": 2 * C,
        "copies.host_to_device.bytes": 2 * C * B, "copies.device_to_host.calls": C,
        "copies.device_to_host.bytes": C * B, "copies.total.calls": 3 * C, "copies.total.bytes": 3 * C * B,
        "sync.calls": 2 * K, "memory.device.allocs": A, "memory.device.alloc_bytes": A * S,
        "memory.device.frees": A, "memory.device.freed_bytes": A * S, "memory.device.live_bytes": 0,
        "memory.device.peak_bytes": A * S, "errors": 0,
        "symbols.libcuda:cuLaunchKernel.calls": N, "symbols.libcuda:cuMemAlloc_v2.calls": A,
        "symbols.libcuda:cuMemAlloc_v2.bytes": A * S}}
    pre = 4 + B  # counter + copy buffer allocated before the window
    before = _snap(42, _gpu(1, (2, 2 * B), (1, B), 1, (3, pre + S, 1, S), pre, pre + S,
                            [("cuLaunchKernel", 1, 0), ("cuMemAlloc_v2", 3, pre + S)]))
    after = _snap(42, _gpu(1 + N, (2 + 2 * C, 2 * B + 2 * C * B), (1 + C, B + C * B), 1 + 2 * K,
                           (3 + A, pre + S + A * S, 1 + A, S + A * S), pre, pre + A * S,
                           [("cuLaunchKernel", 1 + N, 0), ("cuMemAlloc_v2", 3 + A, pre + S + A * S)]))
    failures = []
    r = compare("rust-driver", truth, before, after, 42)
    print_result(r)
    if not r["ok"]:
        failures.append("good pair did not pass")
    # Missing launches, an unexpected symbol, and system level.
    after_bad = json.loads(json.dumps(after))
    g = after_bad["processes"][0]["gpu"]
    g["launches"] -= 3
    g["symbols"].append({"library": "libcuda", "symbol": "cuMemcpyAsync", "category": "copy",
                         "direction": "default", "calls": 5, "errors": 0, "bytes": 5, "time_ns": 0,
                         "timed_calls": 0})
    r = compare("rust-driver-bad", truth, before, after_bad, 42)
    print_result(r)
    if r["ok"] or r["fail"] != 2:
        failures.append(f"bad pair: expected 2 failures, got {r['fail']}")
    r = compare("rust-driver-system", truth, before, before, 42, "system")
    print_result(r)
    if not r["ok"]:
        failures.append("system level with no change did not pass")
    r = compare("rust-driver-op", truth, before, after, 42, "op")
    if r["ok"]:
        failures.append("op level without timed symbol calls passed")
    # gpu null before the window (probes attached after the process's set-up).
    b0 = _snap(42, None)
    a0 = _snap(42, _gpu(N, (2 * C, 2 * C * B), (C, C * B), 2 * K, (A, A * S, A, A * S), 0, A * S,
                        [("cuLaunchKernel", N, 0), ("cuMemAlloc_v2", A, A * S)]))
    r = compare("rust-driver-null-before", truth, b0, a0, 42)
    if not r["ok"]:
        print_result(r)
        failures.append("gpu null before did not pass")
    # NCCL: comm is absolute.
    t2 = {"workload": "nccl", "pid": 7, "expect": {"collectives.all_reduce.calls": 120,
                                                    "collectives.all_reduce.bytes": 120 * 4 << 20,
                                                    "comm.rank": 1, "comm.nranks": 2}}
    cb = [{"library": "nccl", "operation": "all_reduce", "calls": 2, "bytes": 8 << 20, "time_ns": 5, "timed_calls": 2}]
    ca = [{"library": "nccl", "operation": "all_reduce", "calls": 122, "bytes": 122 * 4 << 20, "time_ns": 9, "timed_calls": 122}]
    comm = {"library": "nccl", "rank": 1, "nranks": 2}
    r = compare("nccl", t2, _snap(7, _gpu(0, (0, 0), (0, 0), 0, (0, 0, 0, 0), 0, 0, [], cb, comm)),
                _snap(7, _gpu(0, (0, 0), (0, 0), 0, (0, 0, 0, 0), 0, 0, [], ca, comm)), 7)
    print_result(r)
    if not r["ok"]:
        failures.append("nccl pair did not pass")
    r = compare("missing", None, before, after, 42)
    if r["ok"] or not r["error"]:
        failures.append("missing truth not reported")
    # NVML parsing.
    metrics = ('# HELP ethand_gpu_memory_used_bytes x\nethand_gpu_memory_used_bytes{gpu="gpu0",uuid="GPU-1"} 1073741824\n'
               'ethand_gpu_utilization_ratio{gpu="gpu0",uuid="GPU-1"} 0.5\n'
               'ethand_gpu_temperature_celsius{gpu="gpu0",uuid="GPU-1"} 40\n'
               'ethand_gpu_power_watts{gpu="gpu0",uuid="GPU-1"} 120.5\n')
    n = nvml_compare(metrics, "0, 1030, 48, 41, 118.20\n1, 0, 0, 30, 70.0\n", "t")
    res = {(x["gpu"], x["field"]): x["result"] for x in n["rows"]}
    if res.get(("gpu0", "memory_used")) != "PASS" or res.get(("gpu0", "temperature")) != "PASS" \
            or res.get(("gpu1", "power")) != "MISSING":
        failures.append(f"nvml: {res}")
    # Bench summary.
    bs = bench_summary([{"bench": "torch", "state": "none", "result": {"median_steps_per_s": 100}},
                        {"bench": "torch", "state": "process", "result": {"median_steps_per_s": 95}},
                        {"bench": "torch", "state": "op", "result": None}])
    if bs["torch"]["process"]["slowdown_vs_none_pct"] != 5.0 or bs["torch"]["op"]["failed"] != 1:
        failures.append(f"bench: {bs}")
    # truth extraction from a torchrun-style log, and the bundle.
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "out.txt")
        with open(log, "w") as f:
            f.write("ready rank=0 pid=7\n[rank1]: {\"pid\": 8, \"expect\": {}}\n{\"pid\": 7, \"expect\": {\"launches\": 1}}\n")
        if cmd_truth(["--from", log, "--pid", "7", "--out", os.path.join(d, "t.json")]) != 0 or \
                load_json(os.path.join(d, "t.json")).get("pid") != 7:
            failures.append("truth extraction")
        os.makedirs(os.path.join(d, "snap"))
        os.makedirs(os.path.join(d, "cmp"))
        os.makedirs(os.path.join(d, "out"))
        for nm, s in (("w.before", before), ("w.after", after)):
            with open(os.path.join(d, "snap", nm + ".json"), "w") as f:
                json.dump(s, f)
        with open(os.path.join(d, "cmp", "w.json"), "w") as f:
            json.dump(compare("w", truth, before, after, 42), f)
        with open(os.path.join(d, "steps.jsonl"), "w") as f:
            f.write('{"step": "a", "status": "ok"}\n{"step": "b", "status": "fail"}\n')
        cmd_bundle(["--work", d, "--out", os.path.join(d, "out")])
        sn = load_json(os.path.join(d, "out", "snapshots.json"))
        rs = load_json(os.path.join(d, "out", "results.json"))
        if set(sn.get("w", {})) != {"before", "after"} or rs["summary"]["compare"].get("w") != "PASS" \
                or rs["summary"]["steps_failed"] != ["b"]:
            failures.append("bundle")
    print("selftest:", "OK" if not failures else "FAILED: " + "; ".join(failures))
    return 0 if not failures else 1


def main():
    cmds = {"compare": cmd_compare, "truth": cmd_truth, "nvml": cmd_nvml, "bench": cmd_bench,
            "bundle": cmd_bundle, "get": cmd_get, "status": cmd_status, "selftest": cmd_selftest}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(__doc__)
        return 2
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
