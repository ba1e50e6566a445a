#!/usr/bin/env python3
"""Pool the per-round paired changes of several training-benchmark runs (scripts/gpu-bench.sh).

One run's verdict rests on 30-70 rounds, each a paired change (a mode's steps/s against the
same round's `none`, in %); on the H200 VM a round's change scatters by ~10 points (the host's
CPU speed), so a 1 % bound needs several hundred rounds, more than one device session gives.
This reads the rounds back from the record, docs/perf-gpu-training.md (each `## Run N` section's
`| MODE |` row of its single-GPU table, or its DDP table with --workload: the list after "; "
in the paired-change column), and from report JSON files (gpu-bench.json), and gives three
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

  python3 tests/gpu/pool_runs.py docs/perf-gpu-training.md --runs 10-22 [--mode calls]
      [--workload "DDP 2 GPUs"] [--json LABEL=gpu-bench.json ...]
"""
import argparse
import json
import math
import re
import statistics
import sys

from train_bench import boot_ci, log_pct  # the per-run report's own rules, on all rounds


def runs_from_markdown(path, mode, workload="single GPU"):
    """{run number: [paired change %, ...]} from the table of one workload ("single GPU" or
    "DDP 2 GPUs") in each `## Run N`."""
    out = {}
    run = None
    section = None
    with open(path) as f:
        for line in f:
            m = re.match(r"^#{2,3} Run (\d+)\b", line)
            if m:
                run, section = int(m.group(1)), None
                continue
            m = re.match(r"^#{3,4} (single GPU|DDP 2 GPUs)", line)
            if m:
                section = m.group(1)
                continue
            if run is None or section != workload or not line.startswith(f"| {mode} |") or run in out:
                continue
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            paired = cols[4] if len(cols) > 4 else ""
            if "; " not in paired:
                continue
            xs = [float(x) for x in paired.split("; ", 1)[1].split()]
            out[run] = xs
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
    ap.add_argument("record", help="docs/perf-gpu-training.md")
    ap.add_argument("--runs", required=True, help="run numbers: 10-21 or 10,12,14")
    ap.add_argument("--mode", default="calls")
    ap.add_argument("--workload", default="single GPU", choices=("single GPU", "DDP 2 GPUs"))
    ap.add_argument("--json", action="append", default=[], help="LABEL=gpu-bench.json (a run not in the record)")
    ap.add_argument("--limit", type=float, default=1.0, help="the target: at most this %% slower")
    a = ap.parse_args()
    found = runs_from_markdown(a.record, a.mode, a.workload)
    want = parse_runs(a.runs)
    missing = sorted(want - set(found))
    if missing:
        print(f"runs not found in {a.record} (no {a.workload} `{a.mode}` row with per-round changes): {missing}",
              file=sys.stderr)
    per = {f"run {r}": found[r] for r in sorted(want & set(found))}
    for spec in a.json:
        label, _, path = spec.partition("=")
        per[label] = runs_from_json(path, a.mode, a.workload)
    allx = [x for xs in per.values() for x in xs]
    if len(allx) < 6:
        print("fewer than 6 rounds: nothing to pool", file=sys.stderr)
        return 2
    print("| run | rounds | median change | mean change | sd |")
    print("|---|---|---|---|---|")  # changes in steps/s: negative = slower with ethand
    for k, xs in per.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        print(f"| {k} | {len(xs)} | {statistics.median(xs):+.2f} % | {statistics.mean(xs):+.2f} % | {sd:.2f} |")
    n = len(allx)
    print()
    print(f"pooled: {n} rounds from {len(per)} runs; sd of a round {statistics.stdev(allx):.2f} points; skew of "
          f"the % changes {skew(allx):+.2f}, of their logs {skew([log_pct(x) for x in allx]):+.2f}")
    print()
    print("| estimate | slower with ethand | 95 % interval, % slower | verdict (<= "
          f"{a.limit:g} % slower) |")
    print("|---|---|---|---|")
    # Changes are signed like steps/s (negative: slower with ethand); printed as % slower.
    med = statistics.median(allx)
    lo, hi = boot_ci(allx, n=20000)
    row("median of the % changes (bootstrap, 20,000 resamples, seed 1)", -med, -hi, -lo, a.limit)
    logs = [log_pct(x) for x in allx]
    m = statistics.mean(logs)
    se = statistics.stdev(logs) / n ** 0.5
    row("mean of the log ratios (t interval)", -m, -(m + 1.96 * se), -(m - 1.96 * se), a.limit)
    hl, (hlo, hhi) = hodges_lehmann(logs)
    row("Hodges-Lehmann of the log ratios (Wilcoxon interval)", -hl, -hhi, -hlo, a.limit)
    mean = statistics.mean(allx)
    se = statistics.stdev(allx) / n ** 0.5
    print()
    print(f"(plain mean of the % changes, biased toward faster: {-mean:+.2f} % slower, t interval "
          f"{-mean - 1.96 * se:+.2f} % to {-mean + 1.96 * se:+.2f} %)")
    return 0


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
    print(f"| {name} | {slow:+.2f} % | {slow_lo:+.2f} % to {slow_hi:+.2f} % | {v} |")


if __name__ == "__main__":
    sys.exit(main())
