#!/usr/bin/env python3
"""Pool the per-round paired changes of several training-benchmark runs (scripts/gpu-bench.sh).

One run's verdict rests on 30-70 rounds, each a paired change (a mode's steps/s against the
same round's `none`, in %); on the H200 VM a round's change scatters by ~10 points (the host's
CPU speed), so a 1 % bound needs several hundred rounds, more than one device session gives.
This reads the rounds back from the stored records, bench/results/gpu-training/run-N.json
(bench/results/README.md: each run's `workloads[].rows[].paired_pct`, of the single-GPU part or
of the DDP part with --workload), and from report JSON files (gpu-bench.json), and gives three
pooled estimates with 95 % intervals:

  median      the verdict rule of train_bench.py (percentile bootstrap of the median), on all
              rounds; robust, but with ~64 % of the mean's efficiency on near-normal scatter;
  log mean    the mean of ln(steps/s ratio) with a t interval: the throughput ratio's geometric
              mean. A plain mean of the % changes is biased toward "faster": x/y - 1 averages
              above 0 when y scatters (Jensen; ~+cv^2, +0.5 % at a segment's ~7 % scatter), which
              shows as right skew in the changes; the log removes it;
  HL          the Hodges-Lehmann estimate on the log ratios (median of the pairwise means) with
              its Wilcoxon signed-rank interval: robust and nearly as efficient as the mean.

Rounds are pooled as they are: every run compares the same training loop with and without
ethand at the default level, under the binary of its day.

  python3 tests/gpu/pool_runs.py --runs 10-22 [--mode calls] [--workload "DDP 2 GPUs"]
      [--results bench/results/gpu-training] [--json LABEL=gpu-bench.json ...]
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

from train_bench import boot_ci, log_pct  # the per-run report's own rules, on all rounds


RESULTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "results", "gpu-training"))


def runs_from_records(folder, mode, workload="single GPU"):
    """{run number: [paired change %, ...]} from the stored records (run-N.json) of one workload
    ("single GPU" or "DDP 2 GPUs"): the `mode` row's per-round paired changes."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not re.fullmatch(r"run-\d+\.json", name):
            continue
        with open(os.path.join(folder, name)) as f:
            rec = json.load(f)
        if rec.get("default_config") is False:
            continue  # ethand not at its defaults (a counterpart run): not the product's cost
        part = next((w for w in rec["workloads"] if w["workload"] == workload), None)
        row = next((r for r in (part or {}).get("rows", []) if r["mode"] == mode), None)
        if row and row.get("paired_pct"):
            out[rec["run"]] = row["paired_pct"]
    return out


def runs_from_json(path, mode, workload="single GPU"):
    with open(path) as f:
        d = json.load(f)
    an = (d.get("analysis") or {}).get(workload) or {}
    row = next((r for r in an.get("rows", []) if r.get("mode") == mode), None)
    return row.get("paired_pct", []) if row else []


def parse_runs(spec):
    want = set()
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            want.update(range(int(a), int(b) + 1))
        elif part:
            want.add(int(part))
    return want


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=RESULTS, help="folder of run-N.json records [bench/results/gpu-training]")
    ap.add_argument("--runs", required=True, help="run numbers: 10-21 or 10,12,14")
    ap.add_argument("--mode", default="calls")
    ap.add_argument("--workload", default="single GPU", choices=("single GPU", "DDP 2 GPUs"))
    ap.add_argument("--json", action="append", default=[], help="LABEL=gpu-bench.json (a run not in the records)")
    ap.add_argument("--limit", type=float, default=1.0, help="the target: at most this %% slower")
    a = ap.parse_args()
    found = runs_from_records(a.results, a.mode, a.workload)
    want = parse_runs(a.runs)
    missing = sorted(want - set(found))
    if missing:
        print(f"runs not found in {a.results} (no {a.workload} `{a.mode}` row with per-round changes): {missing}",
              file=sys.stderr)
    per = {f"run {r}": found[r] for r in sorted(want & set(found))}
    for spec in a.json:
        label, _, path = spec.partition("=")
        per[label] = runs_from_json(path, a.mode, a.workload)
    if sum(len(xs) for xs in per.values()) < 6:
        print("fewer than 6 rounds: nothing to pool", file=sys.stderr)
        return 2
    print("\n".join(report(per, a.limit)))
    return 0


def estimates(allx, median=True):
    """[(estimate, % slower, interval's low end, high end)] of the pooled rounds: the median
    (bootstrap; left out with median=False, it takes seconds), the mean of the log ratios, the
    Hodges-Lehmann estimate. Changes are signed like steps/s (negative: slower with ethand);
    these are % slower."""
    out = []
    n = len(allx)
    if median:
        med = statistics.median(allx)
        lo, hi = boot_ci(allx, n=20000)
        out.append(("median of the % changes (bootstrap, 20,000 resamples, seed 1)", -med, -hi, -lo))
    logs = [log_pct(x) for x in allx]
    m = statistics.mean(logs)
    se = statistics.stdev(logs) / n ** 0.5
    out.append(("mean of the log ratios (t interval)", -m, -(m + 1.96 * se), -(m - 1.96 * se)))
    hl, (hlo, hhi) = hodges_lehmann(logs)
    out.append(("Hodges-Lehmann of the log ratios (Wilcoxon interval)", -hl, -hhi, -hlo))
    return out


def report(per, limit=1.0, est=None):
    """The printed report, as lines: per-run table, pooled spread, the three estimates (est:
    estimates() of the same rounds, when the caller has them already)."""
    allx = [x for xs in per.values() for x in xs]
    lines = ["| run | rounds | median change | mean change | sd |",
             "|---|---|---|---|---|"]  # changes in steps/s: negative = slower with ethand
    for k, xs in per.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        lines.append(f"| {k} | {len(xs)} | {statistics.median(xs):+.2f} % | {statistics.mean(xs):+.2f} % | {sd:.2f} |")
    n = len(allx)
    lines += ["", f"pooled: {n} rounds from {len(per)} runs; sd of a round {statistics.stdev(allx):.2f} points; skew of "
              f"the % changes {skew(allx):+.2f}, of their logs {skew([log_pct(x) for x in allx]):+.2f}", ""]
    lines.append("| estimate | slower with ethand | 95 % interval, % slower | verdict (<= "
                 f"{limit:g} % slower) |")
    lines.append("|---|---|---|---|")
    for name, slow, lo, hi in est or estimates(allx):
        lines.append(row(name, slow, lo, hi, limit))
    mean = statistics.mean(allx)
    se = statistics.stdev(allx) / n ** 0.5
    lines += ["", f"(plain mean of the % changes, biased toward faster: {-mean:+.2f} % slower, t interval "
              f"{-mean - 1.96 * se:+.2f} % to {-mean + 1.96 * se:+.2f} %)"]
    return lines


def skew(xs):
    m = statistics.mean(xs)
    sd = statistics.pstdev(xs)
    return sum((x - m) ** 3 for x in xs) / len(xs) / sd ** 3 if sd > 0 else 0.0


def hodges_lehmann(xs):
    """Median of the Walsh averages and its 95 % Wilcoxon signed-rank interval (normal
    approximation of the rank statistic; exact enough past ~30 rounds)."""
    n = len(xs)
    w = sorted((xs[i] + xs[j]) / 2 for i in range(n) for j in range(i, n))
    k = int(n * (n + 1) / 4 - 1.96 * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    return statistics.median(w), (w[max(0, k)], w[len(w) - 1 - max(0, k)])


def row(name, slow, slow_lo, slow_hi, limit):
    v = "PASS" if slow_hi <= limit else "FAIL" if slow_lo > limit else "inconclusive"
    return f"| {name} | {slow:+.2f} % | {slow_lo:+.2f} % to {slow_hi:+.2f} % | {v} |"


if __name__ == "__main__":
    sys.exit(main())
