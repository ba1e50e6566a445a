#!/usr/bin/env python3
"""Unit tests for the training benchmark's statistics (train_bench.py's analysis and verdicts,
pool_runs.py's pooling), on synthetic runs whose answer is known by construction, and a check
that the docs pages show the pooled figure the stored runs give (results_summary.py). No torch,
no GPU: run by tests/tests/gpu_bench_stats.rs in CI, or `python3 tests/gpu/test_bench_stats.py`.
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pool_runs  # noqa: E402
import results_summary  # noqa: E402
import train_bench as tb  # noqa: E402


def synthetic_run(rounds, effect, noise, seed=3, ref_slope=None):
    """none/calls segments: steps/s = base (drifting) x host speed x (1 + effect) for calls.
    With ref_slope, each segment's host speed is also what a speed reference sees, and steps/s
    follows it with that slope (the reference explains the noise)."""
    rng = random.Random(seed)
    segs = []
    for r in range(rounds):
        base = 60 + 10 * math.sin(r / 7)  # slow drift: pairing must cancel it
        for i, m in enumerate(("none", "calls") if r % 2 == 0 else ("calls", "none")):
            speed = 1 + rng.gauss(0, noise)
            sps = base * (1 + effect if m == "calls" else 1) * (1 + (ref_slope or 1) * (speed - 1))
            seg = {"round": r, "index": i, "mode": m, "ok": True, "steps_per_s": sps, "elapsed_s": 2.0,
                   "cpu_ms_per_step": 1000 / sps, "step_ms_median": 1000 / sps, "step_ms_p99": 1200 / sps,
                   "stall_ms": 0, "data_wait_s": 0.0}
            if ref_slope is not None:
                seg["ref_units_per_s"] = [50000 * speed, 50000 * speed]
            segs.append(seg)
    return {"plan": {"modes": ["none", "calls"]}, "segments": segs}


def row(an, mode):
    return next(r for r in an["rows"] if r["mode"] == mode)


class Verdicts(unittest.TestCase):
    def test_exact_two_percent_slowdown_fails(self):
        an = tb.analyse(synthetic_run(20, -0.02, 0.0))
        r = row(an, "calls")
        self.assertEqual(len(r["paired_pct"]), 20)
        for x in r["paired_pct"]:
            self.assertAlmostEqual(x, -2.0, places=9)
        text, slow = tb.verdict(an, "calls")
        self.assertTrue(text.startswith("FAIL"), text)
        self.assertAlmostEqual(slow, 2.0, places=9)
        lo, hi = r["paired_logmean_ci_pct"]
        self.assertAlmostEqual(r["paired_logmean_pct"], 100 * math.log(0.98), places=9)
        self.assertAlmostEqual(lo, hi, places=9)

    def test_no_effect_with_little_noise_passes(self):
        an = tb.analyse(synthetic_run(40, 0.0, 0.002))
        text, slow = tb.verdict(an, "calls")
        self.assertTrue(text.startswith("PASS"), text)
        self.assertLess(abs(slow), 0.5)

    def test_no_effect_with_large_noise_is_inconclusive(self):
        an = tb.analyse(synthetic_run(12, 0.0, 0.08))
        text, _ = tb.verdict(an, "calls")
        self.assertTrue(text.startswith("inconclusive"), text)

    def test_fewer_than_six_rounds_use_the_spread_rule(self):
        an = tb.analyse(synthetic_run(4, -0.05, 0.001))
        self.assertNotIn("paired_ci_pct", row(an, "calls"))
        text, _ = tb.verdict(an, "calls")
        self.assertTrue(text.startswith("FAIL"), text)
        self.assertIn("half the spread", text)


class SpeedReference(unittest.TestCase):
    def test_ols_recovers_a_line(self):
        pairs = [(x, 2.0 + 0.5 * x) for x in (-3.0, -1.0, 0.0, 2.0, 5.0)]
        a, b = tb.ols(pairs)
        self.assertAlmostEqual(a, 2.0, places=12)
        self.assertAlmostEqual(b, 0.5, places=12)
        self.assertAlmostEqual(tb.corr(pairs), 1.0, places=12)
        self.assertEqual(tb.ols([(1.0, 3.0), (1.0, 5.0)]), (4.0, 0.0))  # x constant: slope 0

    def test_a_reference_that_explains_the_noise_narrows_the_interval(self):
        # Host speed scatters 8 % per segment and steps/s follows it exactly: the median of
        # the raw paired changes is noisy, the intercept at unchanged speed is the effect.
        run = synthetic_run(30, -0.003, 0.08, ref_slope=1.0)
        an = tb.analyse(run)
        r = row(an, "calls")
        self.assertGreater(r["adj_r"], 0.99)
        self.assertAlmostEqual(r["adj_slope"], 1.0, delta=0.05)
        lo, hi = r["adj_ci_pct"]
        self.assertLess(hi - lo, 0.2)
        self.assertLess(lo, -0.3 + 0.1)
        self.assertGreater(hi, -0.3 - 0.1)
        plo, phi = r["paired_ci_pct"]
        self.assertGreater(phi - plo, 10 * (hi - lo))
        text, v = tb.adjusted_verdict(an, "calls")
        self.assertEqual(v, "PASS", text)

    def test_a_slowed_reference_is_not_trusted(self):
        run = synthetic_run(30, -0.003, 0.01, ref_slope=1.0)
        for s in run["segments"]:
            if s["mode"] == "calls":  # ethand would be slowing the reference by 5 %
                s["ref_units_per_s"] = [u * 0.95 for u in s["ref_units_per_s"]]
        text, v = tb.adjusted_verdict(tb.analyse(run), "calls")
        self.assertIsNone(v)
        self.assertIn("not trusted", text)


class Pooling(unittest.TestCase):
    @staticmethod
    def record(run, workload, rows):
        return {"run": run, "workloads": [{"workload": workload, "rows": rows}]}

    def test_reads_each_workloads_rows_from_the_records(self):
        calls = {"mode": "calls", "paired_pct": [-1.0, 0.5, -2.0]}
        records = {
            "run-7.json": self.record(7, "DDP 2 GPUs", [{"mode": "calls", "paired_pct": [-9.0, -9.0]}]),
            "run-8.json": self.record(8, "single GPU", [{"mode": "none", "paired_pct": []}, calls]),
            "run-9.json": self.record(9, "single GPU", [{"mode": "op", "paired_pct": [0.1, 0.3]}]),
            "earlier.json": self.record(None, "single GPU", [calls]),  # not a numbered run
        }
        with tempfile.TemporaryDirectory() as d:
            for name, rec in records.items():
                with open(os.path.join(d, name), "w") as f:
                    json.dump(rec, f)
            self.assertEqual(pool_runs.runs_from_records(d, "calls"), {8: [-1.0, 0.5, -2.0]})
            self.assertEqual(pool_runs.runs_from_records(d, "calls", "DDP 2 GPUs"), {7: [-9.0, -9.0]})
            self.assertEqual(pool_runs.runs_from_records(d, "op"), {9: [0.1, 0.3]})

    def test_the_stored_runs_pool_to_the_documented_figures(self):
        # The pooled figure of runs 10-22 (`calls`, single GPU, 597 rounds) as first documented;
        # later runs add to the records, never change these.
        runs = pool_runs.runs_from_records(pool_runs.RESULTS, "calls")
        self.assertLessEqual(set([1, 6] + list(range(10, 23))), set(runs))
        allx = [x for r in range(10, 23) for x in runs[r]]
        self.assertEqual(len(allx), 597)
        got = [(round(s, 2), round(lo, 2), round(hi, 2)) for _, s, lo, hi in pool_runs.estimates(allx)]
        self.assertEqual(got, [(0.30, -0.60, 1.00), (-0.07, -0.85, 0.70), (0.07, -0.69, 0.82)])


    def test_hodges_lehmann_of_a_symmetric_sample(self):
        xs = [-3.0, -1.0, 0.0, 1.0, 3.0, 10.0, -10.0]
        hl, (lo, hi) = pool_runs.hodges_lehmann(xs)
        self.assertEqual(hl, 0.0)
        self.assertLess(lo, 0.0)
        self.assertGreater(hi, 0.0)

    def test_log_ratios_undo_the_skew_of_percent_changes(self):
        # steps/s halved and doubled: -50 % and +100 % average +25 %; their logs average 0.
        self.assertAlmostEqual(pool_runs.log_pct(-50.0) + pool_runs.log_pct(100.0), 0.0, places=12)


class DocsAgreeWithTheRecords(unittest.TestCase):
    """Every page that quotes the pooled training figure shows what the stored runs give."""

    blocks = None

    @classmethod
    def setUpClass(cls):
        cls.blocks = results_summary.pooled()
        cls.blocks["gpu-training-runs"] = results_summary.runs_table(results_summary.records())

    def test_every_generated_block_of_the_docs_is_up_to_date(self):
        quoting = []
        for name in sorted(os.listdir(results_summary.DOCS)):
            if not name.endswith(".md"):
                continue
            with open(os.path.join(results_summary.DOCS, name)) as f:
                text = f.read()
            new, found = results_summary.update(text, self.blocks)
            self.assertEqual(new, text, f"docs/{name} is stale: run python3 tests/gpu/results_summary.py")
            if "gpu-training-current" in found:
                quoting.append(name)
        # The measurement's own page, and the pages that quote its figure, all from one block.
        self.assertLessEqual({"perf-gpu-training.md", "performance.md", "performance-analysis.md"}, set(quoting))

    def test_a_page_with_another_figure_fails_the_check(self):
        begin, end = results_summary.markers("gpu-training-current")
        with tempfile.TemporaryDirectory() as d:
            for name in ("perf-gpu-training.md", "performance.md"):
                with open(os.path.join(results_summary.DOCS, name)) as f:
                    text = f.read()
                if name == "performance.md":  # a figure of the first 13 runs, as it once was
                    i, j = text.index(begin) + len(begin), text.index(end)
                    text = text[:i] + "Runs 10-22 pooled (597 paired rounds): **-0.07 %**." + text[j:]
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_summary.py")
            out = subprocess.run([sys.executable, script, "--check", "--docs", d], capture_output=True, text=True)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("performance.md", out.stderr)
            self.assertNotIn("perf-gpu-training.md", out.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
