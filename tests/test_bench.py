"""The benchmarks run end to end (their numbers are printed, never asserted)."""

import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import ar_decode  # noqa: E402
import step_costs  # noqa: E402


def test_ar_bench_loops_agree_and_print_ratios(tiny_run, capsys):
  ar_decode.main([f"--run_dir={tiny_run}", "--new_tokens=8", "--repeats=1"])
  out = capsys.readouterr().out
  assert "trained target" in out and out.count("x\n") == 2  # batch 1 and 8 ratio rows


def test_step_cost_curve_is_written(tiny_run, tmp_path):
  out = tmp_path / "costs.json"
  step_costs.main([f"--run_dir={tiny_run}", "--batches=1,2", "--max_n=5", "--context_len=8",
                   "--reps=1", f"--out={out}"])
  curve = json.loads(out.read_text())["seconds"]
  assert set(curve) == {"1", "2"} and {"1", "5"} <= set(curve["1"])
  assert all(v > 0 for row in curve.values() for v in row.values())
