"""Markdown report of a GPU scenario suite run (scripts/gpu-scenarios.sh).

python3 scenarios_report.py OUT_DIR > OUT_DIR/report.md

Reads the expected outcomes (OUT_DIR/scenarios.json, the copy the run used, else
tests/gpu/scenarios.json beside this file) and each OUT_DIR/runs/<scenario>/
{daemon,standalone}-{worker,launcher}.json (TreeSnapshot JSON). The top finding of a snapshot is
its first finding of severity warning or critical (findings come sorted by impact); "none" when
there is none. Prints: the table of top findings against the expected ones, the key evidence per
scenario, "N of M right", the cost of the launch sample to tiny_kernels (steps/s inside the
sample against the 4 s before it, from runs/tiny_kernels/steps.txt), and nvidia-smi GPM against
ethand's /metrics per second (gpm-nvidia-smi.txt, gpm-ethand.txt). Standard library only; a
missing or broken file is reported, never fatal.
"""
import json
import os
import re
import sys

KINDS = [
    ("daemon", "worker"),
    ("daemon", "launcher"),
    ("standalone", "worker"),
    ("standalone", "launcher"),
]
SEVERE = ("warning", "critical")


def load_expected(out):
    for p in (
        os.path.join(out, "scenarios.json"),
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios.json"),
    ):
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)["scenarios"]
    sys.exit("scenarios.json not found")


def load_snapshot(path):
    """(snapshot or None, status): status is ok, missing, or error: why."""
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path) as f:
            text = f.read()
        if not text.strip():
            return None, "error: empty"
        t = json.loads(text)
        if not isinstance(t, dict):
            return None, "error: not an object"
        return t, "ok"
    except (OSError, ValueError) as e:
        return None, f"error: {type(e).__name__}"


def findings(t):
    fs = t.get("findings") or []
    return [f for f in fs if isinstance(f, dict)]


def top_finding(t):
    for f in findings(t):
        if f.get("severity") in SEVERE:
            return f
    return None


def num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.3g}"


def evidence(f):
    out = []
    for e in f.get("evidence") or []:
        if isinstance(e, dict):
            unit = e.get("unit")
            out.append(f"{e.get('signal')}={num(e.get('value'))}{' ' + unit if unit else ''}")
    return ", ".join(out)


def compact(x, limit=200):
    if isinstance(x, dict):
        key = x.get("id") or x.get("rule") or x.get("signal")
        rest = {k: v for k, v in x.items() if k not in ("id", "rule")}
        s = f"{key}: {json.dumps(rest, sort_keys=True)}" if key else json.dumps(x, sort_keys=True)
    else:
        s = str(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def read_file(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


# ---------------------------------------------------------------------------- the table


def section_table(out, scenarios):
    print("| scenario | launcher | expected | daemon worker | daemon launcher | standalone worker | standalone launcher |")
    print("|---|---|---|---|---|---|---|")
    right = total = 0
    per_kind = {k: [0, 0] for k in KINDS}
    skipped = []
    for s in scenarios:
        name, exp = s["name"], s.get("expected")
        d = os.path.join(out, "runs", name)
        exp_s = exp or "none"
        skip = read_file(os.path.join(d, "skipped.txt"))
        if skip is not None and not any(
            os.path.exists(os.path.join(d, f"{a}-{b}.json")) for a, b in KINDS
        ):
            skipped.append(f"{name} ({skip.strip()})")
            print(f"| {name} | {s.get('launcher')} | {exp_s} | skipped: {skip.strip()} | | | |")
            continue
        if not os.path.isdir(d):
            print(f"| {name} | {s.get('launcher')} | {exp_s} | not run | | | |")
            skipped.append(f"{name} (not run)")
            continue
        cells = []
        for kind in KINDS:
            t, st = load_snapshot(os.path.join(d, f"{kind[0]}-{kind[1]}.json"))
            if t is None:
                cells.append(st)
                continue
            top = top_finding(t)
            got = top.get("id") if top else None
            ok = got == exp
            total += 1
            right += ok
            per_kind[kind][0] += ok
            per_kind[kind][1] += 1
            cells.append(f"{got or 'none'} {'✔' if ok else '✘'}")
        print(f"| {name} | {s.get('launcher')} | {exp_s} | " + " | ".join(cells) + " |")
    print()
    print(f"**{right} of {total} right** (snapshots taken, top finding = expected)")
    print()
    print(
        "by kind: "
        + "; ".join(f"{a} {b}: {r} of {n}" for (a, b), (r, n) in per_kind.items())
    )
    if skipped:
        print()
        print("not run: " + "; ".join(skipped))
    print()


# ---------------------------------------------------------------------------- evidence


def activity_line(ga):
    """What the GPU ran (CUPTI, a job started with libethand_cupti.so), per process: state,
    and per device kernel busy, the idle split, kernels per second and their mean length,
    the top kernel class."""
    parts = []
    for p in ga.get("processes") or []:
        head = f"pid {p.get('pid')} {p.get('state')}"
        w = p.get("window_ns") or 0
        if p.get("state") != "recorded" or not w:
            parts.append(head + (f" ({compact(p.get('detail'), 120)})" if p.get("detail") else ""))
            continue
        for d in p.get("devices") or []:
            idle = d.get("idle") or {}
            k = d.get("kernels") or 0
            mean = (d.get("kernel_ns") or 0) / k / 1e3 if k else 0
            head += (f"; GPU {d.get('device')}: busy {d.get('busy_ns', 0) / w:.3f}, host wait "
                     f"{idle.get('host_wait_ns', 0) / w:.3f}, kernel wait {idle.get('kernel_wait_ns', 0) / w:.3f}, "
                     f"copies {idle.get('copy_ns', 0) / w:.3f}, unattributed {idle.get('unattributed_ns', 0) / w:.3f}; "
                     f"{k * 1e9 / w:.0f} kernels/s of {mean:.1f} us")
        classes = p.get("kernel_classes") or []
        if classes:
            head += f"; top class {classes[0].get('class')}"
        if p.get("incomplete"):
            head += f"; INCOMPLETE: {compact(p.get('incomplete'), 120)}"
        parts.append(head)
    notes = ga.get("notes") or []
    return "; ".join(parts + [compact(n, 160) for n in notes]) or "no process"


def section_evidence(out, scenarios):
    print("## Evidence per scenario")
    print()
    for s in scenarios:
        name, exp = s["name"], s.get("expected")
        d = os.path.join(out, "runs", name)
        if not os.path.isdir(d):
            continue
        print(f"### {name} (expected {exp or 'none'})")
        print()
        skip = read_file(os.path.join(d, "skipped.txt"))
        if skip is not None:
            print(f"- skipped: {skip.strip()}")
            print()
            continue
        pids = read_file(os.path.join(d, "pids.txt"))
        if pids:
            print(f"- run: `{' '.join(pids.split())}`")
        for kind in KINDS:
            label = f"{kind[0]} {kind[1]}"
            t, st = load_snapshot(os.path.join(d, f"{kind[0]}-{kind[1]}.json"))
            if t is None:
                err = read_file(os.path.join(d, f"{kind[0]}-{kind[1]}.err"), "").strip()
                print(f"- {label}: {st}" + (f" ({compact(err, 160)})" if err else ""))
                continue
            fs = findings(t)
            top = top_finding(t)
            extra = []
            if t.get("gpu_level"):
                extra.append(f"gpu_level {t['gpu_level']}")
            if t.get("source"):
                extra.append(f"source {t['source']}")
            if t.get("measured_ms"):
                extra.append(f"measured {t['measured_ms']} ms")
            head = f"- {label} ({', '.join(extra)}): " if extra else f"- {label}: "
            if top:
                imp = top.get("impact")
                sp = top.get("estimated_speedup")
                print(
                    head
                    + f"**{top.get('id')}** ({top.get('severity')}, impact {num(imp)}"
                    + (f", speed-up {num(sp)}" if sp is not None else "")
                    + f"): {evidence(top)}"
                )
            else:
                print(head + "no warning/critical finding")
            for line in (top or {}).get("detail") or []:
                if line.startswith("where "):
                    print(f"  - {compact(line, 400)}")
            others = [f"{f.get('id')}/{f.get('severity')}/{num(f.get('impact'))}" for f in fs if f is not top]
            if others:
                print(f"  - other findings: {', '.join(others)}")
            ids = [f.get("id") for f in fs]
            if exp and exp in ids and (top is None or top.get("id") != exp):
                f = fs[ids.index(exp)]
                print(
                    f"  - expected {exp} found at position {ids.index(exp) + 1} "
                    f"({f.get('severity')}, impact {num(f.get('impact'))}): {evidence(f)}"
                )
            ne = t.get("not_evaluated")
            if ne:
                print(f"  - not evaluated: {'; '.join(compact(x) for x in ne)}")
            ss = t.get("stack_sample")
            if isinstance(ss, dict):
                print(
                    f"  - stack_sample: {len(ss.get('threads') or [])} threads, "
                    f"{len(ss.get('call_sites') or [])} call sites, {ss.get('duration_ms')} ms"
                    + (f", notes {compact(ss.get('notes'), 200)}" if ss.get("notes") else "")
                )
            if isinstance(t.get("launch_sample"), dict):
                print(f"  - launch_sample: {compact(t['launch_sample'], 300)}")
            ga = t.get("gpu_activity")
            if isinstance(ga, dict):
                print(f"  - gpu_activity: {activity_line(ga)}")
            drops = t.get("dropped_events")
            if drops:
                print(f"  - dropped events: {compact(drops, 200)}")
        print()


# ---------------------------------------------------------------------------- launch sample cost


def read_steps(path):
    text = read_file(path)
    if text is None:
        return None
    steps = []
    for line in text.splitlines():
        p = line.split()
        if len(p) == 2 and p[0] == "step":
            try:
                steps.append(float(p[1]))
            except ValueError:
                pass
    return sorted(steps)


def section_launch_cost(out):
    d = os.path.join(out, "runs", "tiny_kernels")
    if not os.path.isdir(d):
        return
    print("## Cost of the launch sample to the job (tiny_kernels)")
    print()
    steps = read_steps(os.path.join(d, "steps.txt"))
    if not steps:
        print("no steps.txt (or it is empty)")
        print()
        return
    found = False
    for kind in KINDS:
        t, _ = load_snapshot(os.path.join(d, f"{kind[0]}-{kind[1]}.json"))
        ls = t.get("launch_sample") if t else None
        if not isinstance(ls, dict):
            continue
        try:
            start = float(ls["started_unix_ms"]) / 1000.0
            dur = float(ls["duration_ms"]) / 1000.0
        except (KeyError, TypeError, ValueError):
            print(f"- {kind[0]} {kind[1]}: launch_sample without started_unix_ms/duration_ms: {compact(ls)}")
            continue
        found = True
        if dur <= 0:
            print(f"- {kind[0]} {kind[1]}: launch_sample of {dur:.3f} s")
            continue
        # The steps logged inside the sample, and in the 4 s before it (those of them that the
        # log covers: it starts at the ready line).
        end = min(start + dur, steps[-1])
        b0 = max(start - 4.0, steps[0])
        if end - start < 0.2 or start - b0 < 1.0:
            print(
                f"- {kind[0]} {kind[1]}: sample {dur:.2f} s from {start:.3f} is not covered by "
                f"steps.txt ({steps[0]:.3f}..{steps[-1]:.3f}) with 1 s before it"
            )
            continue
        inside = sum(1 for x in steps if start <= x < end) / (end - start)
        before = sum(1 for x in steps if b0 <= x < start) / (start - b0)
        change = f"{(inside / before - 1) * 100:+.1f} %" if before > 0 else "n/a (no steps before)"
        print(
            f"- {kind[0]} {kind[1]}: sample {dur:.2f} s from {start:.3f}: {inside:.1f} steps/s inside, "
            f"{before:.1f} steps/s in the {start - b0:.1f} s before: **{change}** "
            f"(steps.txt spans {steps[0]:.3f}..{steps[-1]:.3f}, {len(steps)} steps)"
        )
    if not found:
        print("no launch_sample in the tiny_kernels snapshots")
    print()


# ---------------------------------------------------------------------------- GPM


def parse_dmon(text):
    """The last nvidia-smi dmon block with data: (columns, rows as dicts). Lines the runner
    writes start with "##"; dmon's own header lines with a single "#"."""
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("##") or cur is None:
            cur = {"header": None, "rows": []}
            blocks.append(cur)
            if line.startswith("##"):
                continue
        if line.startswith("#"):
            if cur["header"] is None:
                cur["header"] = line.lstrip("#").split()
            continue
        toks = line.split()
        if toks and cur["header"] and re.match(r"^[0-9:]", toks[0]):
            cur["rows"].append(dict(zip(cur["header"], toks)))
    for b in reversed(blocks):
        if b["rows"]:
            return b["header"], b["rows"]
    return None, []


def parse_ethand(text):
    """{time: {metric: value}} for GPU 0 (or series without a gpu label)."""
    by_t = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+) (ethand_gpu_[a-z_]+)(\{[^}]*\})? (\S+)", line)
        if not m:
            continue
        ts, name, labels, val = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        g = re.search(r'\bgpu="([^"]*)"', labels)
        if g and g.group(1) != "0":
            continue
        by_t.setdefault(ts, {})[name[len("ethand_gpu_"):]] = val
    return by_t


def section_gpm(out, scenarios):
    shown = False
    for s in scenarios:
        d = os.path.join(out, "runs", s["name"])
        smi = read_file(os.path.join(d, "gpm-nvidia-smi.txt"))
        eth = read_file(os.path.join(d, "gpm-ethand.txt"))
        if smi is None and eth is None:
            continue
        if not shown:
            print("## GPM cross-check: nvidia-smi dmon against ethand /metrics (GPU 0, per second)")
            print()
            shown = True
        print(f"### {s['name']}")
        print()
        try:
            cols, rows = parse_dmon(smi or "")
            eby = parse_ethand(eth or "")
            tcol = next((c for c in (cols or []) if c.lower() == "time"), None)
            gcol = next((c for c in (cols or []) if c.lower() in ("gpu", "idx")), None)
            if gcol:
                rows = [r for r in rows if r.get(gcol) == "0"]
            scols = [c for c in (cols or []) if c not in (tcol, gcol)]
            ecols = sorted({k for v in eby.values() for k in v})
            if tcol:
                sby = {r.get(tcol): r for r in rows}
                times = sorted(set(sby) | set(eby))
            else:
                # No time column: the rows in order, ethand's seconds beside them in order.
                sby = {str(i): r for i, r in enumerate(rows)}
                et = sorted(eby)
                eby = {str(i): eby[t] for i, t in enumerate(et)}
                times = [str(i) for i in range(max(len(rows), len(et)))]
            if not times:
                raise ValueError("no data")
            print("| " + " | ".join(["time"] + [f"smi {c}" for c in scols] + [f"ethand {c}" for c in ecols]) + " |")
            print("|" + "---|" * (1 + len(scols) + len(ecols)))
            for t in times:
                r, e = sby.get(t, {}), eby.get(t, {})
                print("| " + " | ".join([t] + [r.get(c, "") for c in scols] + [e.get(c, "") for c in ecols]) + " |")
            notes = [ln for ln in (smi or "").splitlines() if ln.startswith("##")]
            if len(notes) > 1 or any("refused" in n for n in notes):
                print()
                print("nvidia-smi: " + " / ".join(n.lstrip("# ") for n in notes))
        except Exception as ex:  # keep the report going whatever the files hold
            print(f"(could not line them up: {type(ex).__name__}: {ex}; raw files below)")
            for label, text in (("nvidia-smi", smi), ("ethand", eth)):
                print()
                print(f"{label}:")
                print("```")
                print((text or "(none)")[:4000].rstrip())
                print("```")
        print()


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    out = sys.argv[1]
    scenarios = load_expected(out)
    print("# GPU scenario suite: ethand at its default settings")
    print()
    env = read_file(os.path.join(out, "env.txt"))
    if env:
        print("```")
        print(env.strip()[:3000])
        print("```")
        print()
    section_table(out, scenarios)
    section_evidence(out, scenarios)
    section_launch_cost(out)
    section_gpm(out, scenarios)


if __name__ == "__main__":
    main()
