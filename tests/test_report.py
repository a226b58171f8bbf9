"""The reference experiment's tools: wall-clock training budgets, the K and batch sweeps, the
report and its verdicts on the seed's claims, and multi-tree corpora."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import ROOT, tiny_train_config
from specjax import report, sweep
from specjax.data import python_source
from specjax.errors import SpecjaxError
from specjax.training import budget, registry


# ----------------------------------------------------------------------------- budgets


def test_budget_is_measured_once_and_kept_for_resume(tmp_path):
  cfg = tiny_train_config("target_tiny.py", tmp_path, "", str(tmp_path))
  cfg.time_budget_s = 3.0
  calls = []
  steps = budget.steps_for_budget(cfg, str(tmp_path), lambda: calls.append(1) or 0.01)
  assert steps == 300 and calls == [1]
  # a resume reads the decision back (a busier machine must not change the schedule)
  assert budget.steps_for_budget(cfg, str(tmp_path), lambda: 1 / 0) == 300
  cfg.time_budget_s = 5.0
  with pytest.raises(SpecjaxError, match="time_budget_s=3.0"):
    budget.steps_for_budget(cfg, str(tmp_path), lambda: 0.01)


def test_training_under_a_budget_runs_the_measured_steps(tmp_path, template_corpus_dir,
                                                         tfds_dir):
  cfg = tiny_train_config("target_tiny.py", tmp_path, template_corpus_dir, tfds_dir,
                          num_steps=10_000, time_budget_s=2.0, save_every=10_000,
                          log_every=10_000, eval_every=10_000)
  registry.train(cfg)
  with open(tmp_path / "target" / "budget.json") as f:
    decided = json.load(f)
  assert decided["num_steps"] == int(2.0 / decided["seconds_per_step"]) < 10_000
  with open(tmp_path / "target" / "metrics.jsonl") as f:
    last = [json.loads(l) for l in f][-1]
  assert last["step"] == decided["num_steps"]  # trained exactly the budget's steps, then saved


# ----------------------------------------------------------------------------- corpus


def test_several_source_trees_make_one_corpus(tmp_path):
  for name in ("a", "b"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "same.py").write_text(f"x = '{name}'\n")
  cfg = python_source.source_config(f"{tmp_path / 'a'},{tmp_path / 'b'}", validation_percent=0)
  builder = python_source.PythonSource(config=cfg, data_dir=str(tmp_path / "tfds"))
  splits = builder._split_generators(None)
  docs = {k: v["text"] for split in splits.values() for k, v in split}
  assert docs == {"a/same.py": "x = 'a'\n", "b/same.py": "x = 'b'\n"}  # same path, both kept
  assert python_source.resolve_roots("stdlib,pkg:absl")[0] == python_source.stdlib_dir()
  assert python_source.resolve_roots("pkg:absl")[0].endswith("absl")
  # one tree keeps the dataset name it had before trees could be listed
  assert python_source.source_config("").name == python_source.source_config("stdlib").name
  with pytest.raises(SpecjaxError, match="no installed package 'nosuchpkg'"):
    python_source.resolve_roots("stdlib,pkg:nosuchpkg")


# ----------------------------------------------------------------------------- sweeps + report


@pytest.fixture(scope="module")
def swept_run(tiny_run, tmp_path_factory):
  """A copy of tiny_run (target + draft model) with a greedy table, a K sweep and a batch
  sweep in decode/."""
  from specjax import evaluate
  from conftest import load_config
  run = str(tmp_path_factory.mktemp("swept"))
  for sub in ("target", "draft"):
    shutil.copytree(os.path.join(tiny_run, sub), os.path.join(run, sub))
  os.makedirs(os.path.join(run, "decode"))
  cfg = load_config("decode.py")
  cfg.update(dict(run_dir=run, methods="prompt_lookup,draft", num_prompts=3, max_new_tokens=10,
                  batch_size=1, cache_len=160, timing_repeats=1, plot=False))
  evaluate.main(cfg)
  for kind, values in (("drafts", [1, 3]), ("batch", [1, 2])):
    out = sweep.run(run, kind, values, 0.0, num_prompts=3, max_new_tokens=10, repeats=1)
    with open(sweep.output_path(run, kind, 0.0), "w") as f:
      json.dump(out, f)
  return run


def test_sweeps_run_every_trained_method_at_every_setting(swept_run):
  assert sweep.trained_methods(swept_run) == ["prompt_lookup", "draft"]
  with open(sweep.output_path(swept_run, "drafts", 0.0)) as f:
    drafts = json.load(f)
  got = {(r["method"], r["K"]) for r in drafts["rows"]}
  assert got == {(m, k) for m in ("ar", "prompt_lookup", "draft") for k in (1, 3)}
  for r in drafts["rows"]:
    assert r["lossless_check"] is True and r["speedup_predicted"] > 0
    if r["method"] != "ar":
      assert len(r["acceptance_per_position"]) == r["K"]
  with open(sweep.output_path(swept_run, "batch", 0.0)) as f:
    batch = json.load(f)
  assert sorted({r["batch"] for r in batch["rows"]}) == [1, 2]
  assert all(r["speedup_vs_ar"] == 1.0 for r in batch["rows"] if r["method"] == "ar")


def test_report_builds_from_what_the_folder_holds(swept_run, tmp_path):
  path = report.build(swept_run, str(tmp_path))
  text = open(path).read()
  for section in ("## Training", "## Side by side, greedy", "against K", "against batch size",
                  "## The claims"):
    assert section in text, section
  for png in ("training.png", "acceptance_t0.png", "sweep_drafts_t0.png", "sweep_batch_t0.png"):
    assert os.path.getsize(tmp_path / png) > 1000 and f"({png})" in text
  # the draft model's accounting claim has data: tau at K=1 from a_k at K=3
  row = next(l for l in text.splitlines() if l.startswith("| the accounting model"))
  assert "tau at smaller K" in row and ("| holds |" in row or "| does not hold here |" in row)
  # claims without their methods in the folder say so instead of guessing
  assert "| DSpark raises tau over DFlash | no data |" in text


def test_report_has_tables_and_claims_per_benchmark(swept_run, tmp_path):
  # scripts/smollm2_drafters.sh writes decode/<benchmark>_t<T>.json only
  run = tmp_path / "run"
  os.makedirs(run / "decode")
  table = next(p for p in os.listdir(os.path.join(swept_run, "decode"))
               if p.startswith("t") and p.endswith(".json"))
  shutil.copy(os.path.join(swept_run, "decode", table), run / "decode" / "humaneval_t0.0.json")
  shutil.copy(os.path.join(swept_run, "decode", table), run / "decode" / "mtbench_t1.0.json")
  text = open(report.build(str(run), str(tmp_path / "out"))).read()
  for section in ("## Side by side, humaneval, greedy", "## Side by side, mtbench, sampling, T=1",
                  "## The claims on humaneval", "## The claims on mtbench"):
    assert section in text, section
  assert "## Side by side, greedy" not in text and "## The claims\n" not in text
  assert "3 humaneval prompts x 10 new tokens" in text
  assert os.path.getsize(tmp_path / "out" / "acceptance_humaneval_t0.png") > 1000


def test_report_of_an_empty_folder_is_a_clear_error(tmp_path):
  with pytest.raises(SpecjaxError, match="holds no decode results"):
    report.build(str(tmp_path))


def _table(**acceptance):
  from specjax import accounting
  out = {"ar": {"tau": 1.0, "acceptance_per_position": []}}
  for m, a in acceptance.items():
    out[m] = {"tau": accounting.expected_tokens(a), "acceptance_per_position": a,
              "t_draft": 1e-3}
  return out


def test_claim_verdicts_follow_the_figures():
  collapse = {0.0: _table(mtp_parallel=[0.8, 0.5, 0.3, 0.1])}
  flat = {0.0: _table(mtp_parallel=[0.6, 0.6, 0.55, 0.6])}
  assert report.claim_mtp_depth(collapse)[0] == "holds"
  assert report.claim_mtp_depth(flat)[0] == "does not hold here"
  assert report.claim_mtp_depth({})[0] == "no data"

  decaying = {0.0: _table(dflash=[0.9, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4], draft=[0.5] * 4,
                          mtp_sequential=[0.6] * 4)}
  assert report.claim_dflash(decaying)[0] == "holds"
  beaten = {0.0: _table(dflash=[0.5, 0.4, 0.3, 0.2], draft=[0.9] * 4)}
  assert report.claim_dflash(beaten)[0] == "does not hold here"

  tables = {0.0: _table(dflash=[0.5] * 4, dspark=[0.6] * 4),
            1.0: _table(dflash=[0.5] * 4, dspark=[0.4] * 4)}
  verdict, why = report.claim_gain(tables, "dspark")
  assert verdict == "does not hold here" and "T=0: +" in why and "T=1: -" in why
  # a gain within noise (tau 1.2029 against 1.2013) shows nothing
  tied = {0.0: {"dflash": {"tau": 1.2013}, "dflash2": {"tau": 1.2029}}}
  assert report.claim_gain(tied, "dflash2")[0] == "not shown"
  assert report.claim_gain({0.0: {"dflash": {"tau": 1.2}, "dspark": {"tau": 1.25}}},
                           "dspark")[0] == "holds"

  further = {0.0: _table(dflash=[0.9, 0.8, 0.7], eagle3=[0.6, 0.4, 0.2]),
             1.0: _table(dflash=[0.5, 0.4, 0.3], eagle3=[0.6, 0.5, 0.4])}
  verdict, why = report.claim_dflash_over_eagle3(further)
  assert verdict == "does not hold here" and "T=0: 1." in why and "T=1: 0." in why
  assert report.claim_dflash_over_eagle3({0.0: further[0.0]})[0] == "holds"
  assert report.claim_dflash_over_eagle3({})[0] == "no data"

  def batch_sweep(budgets, load_aware_speedup):
    rows = []
    for b, budget_b, s in zip((1, 8), budgets, load_aware_speedup):
      rows += [{"method": "dspark", "variant": "", "batch": b, "speedup_vs_ar": 1.0},
               {"method": "dspark", "variant": "load_aware", "batch": b, "speedup_vs_ar": s,
                "mean_budget": budget_b}]
    return {("batch", 0.0): {"values": [1, 8], "rows": rows}}
  assert report.claim_concurrency(batch_sweep([6.0, 2.0], [1.0, 1.2]))[0] == "holds"
  assert report.claim_concurrency(batch_sweep([6.0, 6.0], [1.0, 1.0]))[0] == \
      "does not hold here"

  a = [0.8, 0.6, 0.5]
  rows = [{"method": "draft", "K": k, "tau": report.accounting.expected_tokens(a[:k]),
           "acceptance_per_position": a[:k]} for k in (1, 2, 3)]
  exact = {("drafts", 0.0): {"rows": rows}}
  assert report.claim_accounting({}, exact)[0] == "holds"
  off = {("drafts", 0.0): {"rows": [dict(r, tau=r["tau"] * 1.3) if r["K"] == 1 else r
                                    for r in rows]}}
  assert report.claim_accounting({}, off)[0] == "does not hold here"
  # speedups: right on the median but scattered, against short of the prediction
  table = lambda *ratios: {0.0: {f"m{i}": {"speedup_vs_ar": r, "speedup_predicted": 1.0}
                                 for i, r in enumerate(ratios)}}
  verdict, text = report.claim_accounting(table(0.7, 1.0, 1.3), {})
  assert verdict == "does not hold here" and "right on the median" in text
  verdict, text = report.claim_accounting(table(0.6, 0.7, 0.8), {})
  assert verdict == "does not hold here" and "misses what the loop pays" in text
  assert report.claim_accounting(table(0.9, 1.0, 1.1), {})[0] == "holds"


def test_token_drafters_train_on_the_block_drafters_regenerated_text(tiny_run, tmp_path,
                                                                     template_corpus_dir,
                                                                     tfds_dir):
  import ml_collections
  from specjax import run_dir as run_dir_lib
  from specjax.training import regenerate
  shutil.copytree(os.path.join(tiny_run, "target"), tmp_path / "target")
  cfgs = {}
  for name, extra in (("draft_tiny.py", {"model.num_layers": 1}), ("mtp_tiny.py", {})):
    cfg = tiny_train_config(name, tmp_path, template_corpus_dir, tfds_dir, num_steps=4,
                            train_on="regenerated", **extra)
    cfg.regen = ml_collections.ConfigDict({"num_sequences": 32, "num_validation": 8,
                                           "prompt_len": 8, "new_tokens": 24,
                                           "batch_size": 16})
    registry.train(cfg)
    cfgs[name] = cfg
  # one cache of continuations (train and validation rows), made by the first drafter and
  # read by the second: both trained on the same text
  cached = [np.load(tmp_path / "regenerated" / f)
            for f in sorted(os.listdir(tmp_path / "regenerated")) if f.endswith(".npy")]
  assert sorted(len(c) for c in cached) == [8, 32]
  target = run_dir_lib.load_target(str(tmp_path))
  tok = run_dir_lib.load_tokenizer(str(tmp_path))
  train, _ = regenerate.drafter_data(cfgs["mtp_tiny.py"], target, tok)
  batch = next(iter(train))
  rows = {tuple(r) for c in cached for r in c}
  assert all(tuple(r) in rows for r in batch["tokens"])
  assert batch["loss_mask"][:, :7].sum() == 0  # no labels on the corpus prompt
  bad = cfgs["mtp_tiny.py"].copy_and_resolve_references()
  bad.train_on = "somewhere"
  with pytest.raises(SpecjaxError, match="train_on must be one of corpus, regenerated"):
    regenerate.drafter_data(bad, target, tok)


def test_goals_read_the_tables_and_the_batch_sweep():
  t0 = _table(dflash=[0.9] * 7, draft=[0.5] * 4, mtp_sequential=[0.6] * 4)
  t0["dflash"]["block_size"] = 8
  t1 = _table(dflash=[0.5] * 7, draft=[0.6] * 4)
  t1["dflash"]["block_size"] = 8
  sweep = {("batch", 0.0): {"rows": [
      {"method": "ar", "batch": 1, "speedup_vs_ar": 1.0},
      {"method": "dflash", "batch": 1, "speedup_vs_ar": 1.42},
      {"method": "draft", "batch": 1, "speedup_vs_ar": 1.1},
      {"method": "dflash", "batch": 8, "speedup_vs_ar": 2.0}]}}
  rows = {r[0]: (r[1], r[2]) for r in report.goals({0.0: t0, 1.0: t1}, sweep)[1:]}
  tau0 = report.accounting.expected_tokens([0.9] * 7)
  assert rows["DFlash tau >= 3 at T=0 (B=8)"] == (f"{tau0:.2f} (B=8)", "yes")
  assert rows["DFlash tau >= 2 at T=1 (B=8)"][1] == "no"  # 1.99
  assert rows["DFlash tau above draft model and sequential MTP at T=1"][1] == "no"
  # the best method at batch 1 (not the batch-8 row)
  assert rows["best wall-clock speedup at batch 1, greedy, >= 1.3x"] == ("1.42x (dflash)", "yes")


def test_goals_say_what_limits_them():
  t0 = _table(dflash=[0.9, 0.5])
  for m, e in t0.items():
    e.update(batch_size=1, t_ar=1e-3, speedup_vs_ar=1.0)
  t0["dflash"].update(num_draft_tokens=7, t_draft=0.5e-3, t_verify=1.5e-3, tau=2.0,
                      prefix_acceptance=[0.9, 0.45], speedup_vs_ar=0.9, speedup_predicted=1.0,
                      block_size=8)
  limits = {r[0]: r[3] for r in report.goals({0.0: t0}, {})[1:]}
  assert limits["DFlash tau >= 3 at T=0 (B=8)"] == (
      "acceptance: a_1 0.90, a_2 0.50, all 2 accepted 0.45 of steps")
  # step = (0.5 + 1.5) ms = 2 T_ar: 1.3x needs tau 2.6; tau 8 would give 8 / 2 = 4x;
  # measured 0.9x against the predicted 1.0x
  assert limits["best wall-clock speedup at batch 1, greedy, >= 1.3x"] == (
      "step = 2.00 T_ar: 1.3x needs tau 2.60 (has 2.00); ceiling at tau = 8: 4.00x; "
      "measured / predicted 0.90")


def test_heldout_prompts_are_the_regenerated_validation_prefixes(tiny_run, tmp_path):
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "heldout_prompts", os.path.join(ROOT, "scripts", "heldout_prompts.py"))
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  from specjax import run_dir as run_dir_lib
  from specjax.data import tokenizer as tokenizer_lib
  run = tmp_path / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  with pytest.raises(SpecjaxError, match="no validation rows"):
    script.heldout_prompts(str(run), 4)
  tok = run_dir_lib.load_tokenizer(str(run))
  ids = tok.encode("def add(a, b):\n    return a + b\n").ids
  rows = np.asarray([ids[:6] + [7] * 4, ids[2:8] + [9] * 4], np.int32)
  (run / "regenerated").mkdir()
  np.save(run / "regenerated" / "x.npy", rows)
  (run / "regenerated" / "x.json").write_text(json.dumps({"split": "validation",
                                                          "prompt_len": 6}))
  out = tmp_path / "p.jsonl"
  script.main([str(run), str(out), "--count", "2"])
  got = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
  assert got == [tokenizer_lib.decode(tok, ids[:6]), tokenizer_lib.decode(tok, ids[2:8])]


def test_benchmark_goals_and_peers_follow_the_figures(tmp_path):
  def table(temp, **taus):
    out = {}
    for m, (tau, speed) in taus.items():
      out[m] = {"tau": tau, "speedup_vs_ar": speed, "batch_size": 1, "block_size": 8,
                "mismatched_outputs": 0, "acceptance_per_position": [], "temperature": temp}
    return out
  t0 = table(0.0, ar=(1.0, 1.0), dflash=(3.6, 2.1), dspark=(4.2, 2.3), dflash2=(4.0, 1.9),
             eagle3=(3.7, 1.8))
  t0["dflash2"]["mismatched_outputs"] = 1
  t1 = table(1.0, ar=(1.0, 1.0), dflash=(2.0, 1.4))
  rows = {r[0]: (r[1], r[2], r[3]) for r in report.benchmark_goals({0.0: t0, 1.0: t1})[1:]}
  assert rows["DFlash tau >= 3.5 at B=8, greedy"][:2] == ("3.60 (B=8)", "yes")
  assert rows["dspark tau >= 15% above DFlash's, greedy"][:2] == ("+16.7%", "yes")
  assert rows["dflash2 tau >= 15% above DFlash's, greedy"][:2] == ("+11.1%", "no")
  assert rows["DFlash tau above EAGLE-3's, greedy"][1] == "no"
  assert rows["best method >= 2x AR in wall clock, T=0"][:2] == ("2.30x (dspark)", "yes")
  assert rows["best method >= 1.5x AR in wall clock, T=1"][:2] == ("1.40x (dflash)", "no")
  assert rows["every method lossless (greedy: outputs equal AR's)"] == (
      "3/4 methods token-equal", "no", "dflash2")
  with open(tmp_path / "peers.json", "w") as f:
    json.dump({"benchmarks": {"humaneval": {"rows": [
        {"decoder": "specjax (gguf)", "method": "dflash", "tokens_per_second": 50.0,
         "speedup_vs_own_ar": 0.5, "tau": 1.5, "agreement": 1.0},
        {"decoder": "dflash (Z Lab)", "method": "dflash", "tokens_per_second": 20.0,
         "speedup_vs_own_ar": 0.4, "tau": 1.5, "agreement": 0.75,
         "acceptance_equal": "3/4"}]}}}, f)
  [(name, _, peers)] = report.load_peers(str(tmp_path))
  assert name == "peers.json"
  text = report.peers_table(peers["humaneval"])
  assert "| dflash (Z Lab) | dflash | 20.0 | 0.40x | 1.50 | 75% | 3/4 |" in text
