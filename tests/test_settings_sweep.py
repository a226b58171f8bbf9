"""The drafter settings sweep: variants train next to the shared target, are scored by their
validation figures, and a rerun trains only what is missing."""

import json
import os

import pytest

from specjax.errors import SpecjaxError
from specjax.training import settings_sweep
from conftest import ROOT, load_config, tiny_train_config


def test_teacher_forced_tau_of_each_drafter_kind():
  assert settings_sweep.teacher_forced_tau({"val_block_tau": 3.25}) == 3.25
  # MTP: prefix products of the per-depth accuracies
  row = {"val_acc_d1": 0.5, "val_acc_d2": 0.4, "val_acc_d3": 0.5}
  assert settings_sweep.teacher_forced_tau(row) == pytest.approx(1 + 0.5 + 0.2 + 0.1)
  # the draft model: its per-token agreement a over TOKEN_DEPTH drafts
  a = 0.5
  assert settings_sweep.teacher_forced_tau({"val_accuracy": a}) == pytest.approx(
      1 + a + a**2 + a**3 + a**4)
  with pytest.raises(SpecjaxError, match="no validation accuracy"):
    settings_sweep.teacher_forced_tau({"val_loss": 1.0})


def test_settings_are_parsed_and_cast_to_the_configs_types():
  cfg = load_config("dflash_tiny.py")
  grid = settings_sweep.parse_assignments(["num_anchors=16,32", "learning_rate=1e-3"], many=True)
  assert grid == {"num_anchors": [16, 32], "learning_rate": [1e-3]}
  combos = settings_sweep.variants(grid)
  assert combos == [{"num_anchors": 16, "learning_rate": 1e-3},
                    {"num_anchors": 32, "learning_rate": 1e-3}]
  # names sort their keys, so the same settings given in another order are the same variant
  assert settings_sweep.variant_name(combos[0]) == settings_sweep.variant_name(
      {"learning_rate": 1e-3, "num_anchors": 16}) == "learning_rate=0.001,num_anchors=16"
  settings_sweep.set_key(cfg, "learning_rate", 1)  # an int where the config holds a float
  assert isinstance(cfg.learning_rate, float) and cfg.learning_rate == 1.0
  settings_sweep.set_key(cfg, "regen.batch_size", 8)
  assert cfg.regen.batch_size == 8
  with pytest.raises(SpecjaxError, match="no key 'num_anchor'"):
    settings_sweep.set_key(cfg, "num_anchor", 8)
  with pytest.raises(SpecjaxError, match="integer"):
    settings_sweep.set_key(cfg, "num_anchors", 2.5)
  with pytest.raises(SpecjaxError, match="expected key=value"):
    settings_sweep.parse_assignments(["num_anchors"], many=True)
  # tuple values: commas inside brackets belong to the value
  grid = settings_sweep.parse_assignments(["feature_layers=(1,2,3),(4,),[2, 4]"], many=True)
  assert grid == {"feature_layers": [(1, 2, 3), (4,), [2, 4]]}
  assert settings_sweep.variant_name({"feature_layers": (1, 2, 3)}) == "feature_layers=(1,2,3)"
  settings_sweep.set_key(cfg, "feature_layers", (2, 4))
  assert tuple(cfg.feature_layers) == (2, 4)


def test_sweep_trains_each_variant_once_and_ranks_them(tiny_run, template_corpus_dir, tfds_dir,
                                                       tmp_path, capsys):
  from specjax.training import registry
  base = tmp_path / "base"
  os.makedirs(base)
  os.symlink(os.path.join(tiny_run, "target"), base / "target")
  cfg = tiny_train_config("draft_tiny.py", base, template_corpus_dir, tfds_dir, num_steps=4,
                          eval_every=4, **{"model.num_layers": 1})
  cfg.feature_cache_store = True
  trained = []

  def train(c):
    trained.append(c.learning_rate)
    return registry.train(c)

  rows = settings_sweep.sweep(cfg, str(base), {"learning_rate": [1e-4, 1e-2]}, train_fn=train)
  assert sorted(trained) == [1e-4, 1e-2]
  assert len(rows) == 2
  keys = [(-round(r["teacher_forced_tau"], 2), r["val_loss"]) for r in rows]
  assert keys == sorted(keys)  # best first: tau to 2 decimals, then validation loss
  for r in rows:
    variant = base / "sweeps" / "draft" / r["variant"]
    assert os.path.islink(variant / "target")  # the shared target, not a copy
    for shared in ("regenerated", "feature_cache"):  # one set of rows and features for all
      assert os.path.realpath(variant / shared) == os.path.realpath(base / shared)
    saved = json.load(open(variant / "draft" / "config.json"))
    assert saved["learning_rate"] == r["settings"]["learning_rate"]
    last = settings_sweep.final_metrics(str(variant / "draft"))
    assert r["steps"] == last["step"] == 4
    assert r["teacher_forced_tau"] == pytest.approx(
        sum(last["val_accuracy"] ** k for k in range(5)))
  # the two learning rates train different models
  assert rows[0]["val_loss"] != rows[1]["val_loss"]
  assert json.load(open(base / "sweeps" / "draft" / "sweep.json"))["rows"] == rows

  # a rerun trains only the new variant and reports all three
  rows = settings_sweep.sweep(cfg, str(base), {"learning_rate": [1e-2, 1e-3]}, train_fn=train)
  assert sorted(trained) == [1e-4, 1e-3, 1e-2]
  assert len(rows) == 3

  # the report of the base folder shows the sweep, best first
  from specjax import report
  md = open(report.build(str(base), str(tmp_path / "report"))).read()
  section = md[md.index("## Settings sweeps"):]
  assert section.index(rows[0]["variant"] + " (best)") < section.index(rows[1]["variant"])

  config_path = os.path.join(ROOT, "configs", "draft_tiny.py")
  settings_sweep.main([f"--config={config_path}", f"--run_dir={base}", "--show"])
  out = capsys.readouterr().out
  assert out.count("| learning_rate=") == 3 and "(best)" in out
  # --best: at the config's own budget (here none: num_steps) the best rate, as the script reads it
  settings_sweep.main([f"--config={config_path}", f"--run_dir={base}", "--best=learning_rate",
                       "--budget_s=0"])
  assert capsys.readouterr().out.strip() == str(rows[0]["settings"]["learning_rate"])
  with pytest.raises(SystemExit):
    settings_sweep.main([f"--config={config_path}", f"--run_dir={tmp_path}", "--show"])
  assert "no sweep of draft" in capsys.readouterr().err


def test_variants_rank_within_their_budget():
  def row(variant, budget_s, tau, loss, **settings):
    return {"variant": variant, "settings": settings, "budget_s": budget_s, "steps": 1,
            "seconds_per_step": 0.1, "val_loss": loss, "teacher_forced_tau": tau}
  rows = settings_sweep.rank([
      row("long", 480.0, 5.3, 1.0, feature_cache=True),  # best overall, but a longer budget
      row("a", 120.0, 3.0, 2.0, learning_rate=1e-3),
      row("b", 120.0, 3.004, 1.5, learning_rate=2e-3),  # a tie at 2 decimals: lower loss wins
      row("c", 120.0, 2.5, 1.0, num_anchors=8)])
  assert [r["variant"] for r in rows] == ["b", "a", "c", "long"]
  assert settings_sweep.best(rows, 120.0, "learning_rate") == 2e-3
  assert settings_sweep.best(rows, 120.0, "num_anchors") == 8
  assert settings_sweep.best(rows, 480.0, "feature_cache") is True
  with pytest.raises(SpecjaxError, match="no variant at budget 480 s sets learning_rate"):
    settings_sweep.best(rows, 480.0, "learning_rate")
  marked = [l.split(" |")[0] for l in settings_sweep.table(rows).splitlines()[2:]]
  assert marked == ["| b (best)", "| a", "| c", "| long (best)"]
