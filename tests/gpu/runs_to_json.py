#!/usr/bin/env python3
"""One-shot conversion of the training-benchmark record from Markdown to JSON.

Until 2026-12-03, docs/perf-gpu-training.md held every run of scripts/gpu-bench.sh as a
`## Run N` section: a few lines of prose by whoever ran it, then that run's gpu-bench.md as
written on the device (headings one level down). This splits such a file into one JSON record
per run under bench/results/gpu-training/ (run-N.json, earlier.json), the layout described in
bench/results/README.md. Nothing is computed: every table cell is kept as written, and the
numbers the pooling needs (steps/s per round, paired change per round, its median and interval)
are parsed from those cells. Reproduce the conversion from the last Markdown record:

  git show e8bf0d7:docs/perf-gpu-training.md > /tmp/record.md   # its last Markdown version
  python3 tests/gpu/runs_to_json.py /tmp/record.md --out bench/results/gpu-training --check

--check compares every run's round count with the ones its heading and its `plan:` line state.

A new run: its gpu-bench.md (from the device) and the heading and notes of the record:

  python3 tests/gpu/runs_to_json.py --add /tmp/gpu-bench/gpu-bench.md \
      --title "Run 23 (report 09:10 UTC 2026-12-04, 1 x H200): \`none\` against \`calls\`, single GPU, 60 rounds" \
      --notes "Command: ... What the run showed." --check
  python3 tests/gpu/results_summary.py   # the run table in docs/perf-gpu-training.md
"""
import argparse
import json
import os
import re
import sys

NUM = r"[+-]?\d+(?:\.\d+)?"
WORKLOADS = ("single GPU", "DDP 2 GPUs")


def num(s):
    """The first number of a cell ("49.52", "+0.73 %", "20.62 ms") or None ("—", "")."""
    m = re.search(NUM, s.replace(",", ""))
    return float(m.group(0)) if m else None


def split_row(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_row(columns, cells):
    row = {"mode": cells[0], "cells": dict(zip(columns, cells))}
    for col, cell in zip(columns, cells):
        if col == "median steps/s":
            row["median_steps_per_s"] = num(cell)
        elif col.startswith("per round ("):
            row["per_round_steps_per_s"] = [num(x) for x in cell.split(" / ")] if num(cell) is not None else []
        elif col == "change vs none":
            row["change_vs_none_pct"] = num(cell)
        elif col.startswith("paired change"):
            head, _, rounds = cell.partition("; ")
            ci = re.search(rf"95 % CI ({NUM}) to ({NUM})", head)
            row["paired_median_pct"] = num(head)
            row["paired_ci95_pct"] = [float(ci.group(1)), float(ci.group(2))] if ci else None
            row["paired_pct"] = [float(x) for x in rounds.split()]
    return row


def parse_generated(lines):
    """The part of a run written by gpu-bench.sh: the common header, then one part per workload."""
    out = {"generated_utc": None, "commands": [], "gpus": [], "setup": [], "method": None, "workloads": []}
    cur = None  # the workload being read
    code, block = None, []
    for line in lines:
        if code is not None:
            if line.startswith("```"):
                (out["commands"] if code == "command" else out["gpus"]).extend(block)
                code, block = None, []
            else:
                block.append(line)
            continue
        if line.startswith("```"):
            code = "gpus" if out["commands"] else "command"
            continue
        m = re.match(r"^#{3,4} (single GPU|DDP 2 GPUs)\s*$", line)
        if m:
            cur = {"workload": m.group(1), "setup": [], "columns": [], "rows": [], "verdicts": [], "notes": []}
            out["workloads"].append(cur)
            continue
        m = re.match(r"^Generated (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\.", line)
        if m and out["generated_utc"] is None:
            out["generated_utc"] = m.group(1)
            continue
        if not line.strip() or line in ("Command:", "GPUs (nvidia-smi):"):
            continue
        if cur is None:
            if line.startswith("- "):
                out["setup"].append(line[2:])
            elif line.startswith("Modes: "):
                out["method"] = line
            else:
                raise ValueError(f"unexpected line in a run's header: {line[:80]}")
        elif line.startswith("| mode |"):
            cur["columns"] = split_row(line)
        elif line.startswith("|---"):
            pass
        elif line.startswith("| "):
            cur["rows"].append(parse_row(cur["columns"], split_row(line)))
        elif line.startswith("**"):
            cur["verdicts"].append(line.strip("*"))
        elif line.startswith("- "):
            (cur["notes"] if cur["rows"] else cur["setup"]).append(line[2:])
        else:
            raise ValueError(f"unexpected line in {cur['workload']}: {line[:80]}")
    for w in out["workloads"]:
        v = next((t for t in w["verdicts"] if t.startswith("Target: ")), "")
        m = re.match(r"Target: [^:]*: (PASS|FAIL|inconclusive)", v)
        w["verdict"] = m.group(1) if m else None
        plan = next((s for s in w["setup"] if s.startswith("plan: ")), "")
        m = re.search(r"; (\d+) rounds \(wanted (\d+)\); (\d+) timed steps per segment \(~(" + NUM + ") s", plan)
        w["rounds"], w["rounds_wanted"], w["steps_per_segment"], w["segment_s"] = (
            (int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))) if m else (None,) * 4)
    sha = next((s for s in out["setup"] if s.startswith("ethand: ")), "")
    m = re.search(r"sha256 ([0-9a-f]+)", sha)
    out["ethand_sha256"] = m.group(1) if m else None
    return out


def parse_heading(title):
    m = re.match(r"^(?:Run (\d+)|Earlier run) \(report ([^,]+), ([^)]+)\): (.*)$", title)
    if not m:
        raise ValueError(f"unexpected run heading: {title}")
    rest = m.group(4)
    rounds = re.search(r"(\d+) rounds", rest)
    seg = re.search(r"(\d+) s segments", rest)
    commit = re.search(r"\bbinary (?:[^,(]*\()?([0-9a-f]{7,40})\b", rest) or re.search(r"\(([0-9a-f]{7,40})\)", rest)
    same = re.search(r"same binary (?:and machine )?as run (\d+)", rest)
    return {
        "run": int(m.group(1)) if m.group(1) else None,
        "report_time": m.group(2),
        "machine": m.group(3),
        "summary": rest,
        "stated_rounds": int(rounds.group(1)) if rounds else None,
        "stated_segment_s": int(seg.group(1)) if seg else None,
        "binary_commit": commit.group(1) if commit else None,
        "binary_same_as_run": int(same.group(1)) if same else None,
    }


def split_runs(path):
    """[(heading, [prose lines], [generated lines])] for every `## Run N` / `## Earlier run`."""
    runs = []
    with open(path) as f:
        lines = f.read().split("\n")
    for line in lines:
        m = re.match(r"^## ((?:Run \d+|Earlier run) \(report .*)$", line)
        if m:
            runs.append((m.group(1), [], []))
        elif re.match(r"^#{1,2} ", line):
            runs.append((None, [], []))  # some other section: skipped
        elif runs and runs[-1][0] is not None:
            _, prose, gen = runs[-1]
            if gen or line.startswith("Generated "):
                gen.append(line)
            else:
                prose.append(line)
    return [r for r in runs if r[0] is not None]


def record(title, prose, gen):
    rec = {"schema": "ethand-gpu-training-run/1"}
    rec.update(parse_heading(title))
    rec["title"] = title
    rec["notes"] = "\n".join(prose).strip()
    rec.update(parse_generated(gen))
    rec["gpu_count"] = len(rec["gpus"])
    rec["workload_names"] = [w["workload"] for w in rec["workloads"]]
    return rec


def check(rec):
    """Round counts: the heading's, the plan line's and the paired changes' must agree."""
    errs = []
    for w in rec["workloads"]:
        for row in w["rows"]:
            n = len(row.get("paired_pct") or [])
            if row["mode"] != "none" and n != w["rounds"]:
                errs.append(f"{w['workload']} {row['mode']}: {n} paired changes, plan says {w['rounds']}")
            if row.get("per_round_steps_per_s") is not None and len(row["per_round_steps_per_s"]) != w["rounds"]:
                errs.append(f"{w['workload']} {row['mode']}: {len(row['per_round_steps_per_s'])} steps/s values")
    if rec["stated_rounds"] is not None:
        counted = {w["rounds"] for w in rec["workloads"]}
        if counted != {rec["stated_rounds"]}:
            errs.append(f"heading says {rec['stated_rounds']} rounds, plan lines say {sorted(counted)}")
    return errs


def name(rec):
    return f"run-{rec['run']}.json" if rec["run"] is not None else "earlier.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("record", nargs="?", help="the Markdown record (docs/perf-gpu-training.md before the move)")
    ap.add_argument("--add", metavar="GPU_BENCH_MD", help="one new run: gpu-bench.md as scripts/gpu-bench.sh wrote it")
    ap.add_argument("--title", help="with --add: `Run N (report HH:MM UTC YYYY-MM-DD, MACHINE): what was run`")
    ap.add_argument("--notes", default="", help="with --add: what the run showed, for the record")
    ap.add_argument("--out", default="bench/results/gpu-training")
    ap.add_argument("--check", action="store_true", help="fail unless every run's round counts agree")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    if a.add:
        if not a.title:
            ap.error("--add needs --title")
        with open(a.add) as f:  # its own title dropped, its headings one level down, as in the record
            gen = ["#" + l if l.startswith("##") else l for l in f.read().split("\n") if not l.startswith("# ")]
        runs = [(a.title, [a.notes], gen)]
    elif a.record:
        runs = split_runs(a.record)
    else:
        ap.error("give the Markdown record or --add")
    for title, prose, gen in runs:
        rec = record(title, prose, gen)
        errs = check(rec)
        bad += len(errs)
        path = os.path.join(a.out, name(rec))
        with open(path, "w") as f:
            json.dump(rec, f, indent=1, ensure_ascii=False)
            f.write("\n")
        counts = ", ".join(f"{w['workload']} {w['rounds']}" for w in rec["workloads"])
        print(f"{path}: heading {rec['stated_rounds']} rounds; plan {counts}; "
              f"paired changes {[len(r.get('paired_pct') or []) for w in rec['workloads'] for r in w['rows'] if r['mode'] != 'none']}"
              + ("".join(f"\n  MISMATCH {e}" for e in errs)))
    return 1 if a.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
