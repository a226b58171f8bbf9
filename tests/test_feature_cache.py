"""The block drafters' feature cache: the cached batch gives the same loss as the target's pass
over the same (shuffled) rows, the cache is really what the loss reads, its build time comes
out of a time budget, and a cached run trains."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from conftest import tiny_train_config
from specjax.errors import SpecjaxError
from specjax.training import budget, dflash, dflash2, dspark, feature_cache

LOSSES = {"dflash_tiny.py": (dflash.build_model, dflash.dflash_loss, False),
          "dspark_tiny.py": (dspark.build_model, dspark.dspark_loss, True),
          "dflash2_tiny.py": (dflash2.build_model, dflash2.dflash2_loss, True)}


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory):
  run = tmp_path_factory.mktemp("feature_cache_run")
  shutil.copytree(os.path.join(tiny_run, "target"), os.path.join(run, "target"))
  return str(run)


def config(name, run, corpus_dir, tfds_dir, **overrides):
  cfg = tiny_train_config(name, run, corpus_dir, tfds_dir, num_anchors=4, feature_cache=True,
                          **overrides)
  cfg.regen.update(dict(num_sequences=24, num_validation=8, prompt_len=8, new_tokens=24,
                        batch_size=24))
  return cfg


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cached_loss_equals_the_target_pass(name, run, template_corpus_dir, tfds_dir):
  build, make_loss, logits = LOSSES[name]
  cfg = config(name, run, template_corpus_dir, tfds_dir)
  setup = dflash.prepare(cfg, build, target_logits=logits)
  batch = next(iter(setup.train_data))
  assert feature_cache.FEATURES in batch and (feature_cache.HIDDEN in batch) == logits
  # the batch's rows are shuffled: a cache read by batch position instead of row would differ
  assert batch[feature_cache.FEATURES].shape[:2] == (cfg.batch_size, len(setup.layers))
  loss_fn = jax.jit(make_loss(setup.graphdef, setup.target.graphdef, cfg, setup.layers))
  params, rng = setup.init_params(jax.random.key(0)), jax.random.key(3)
  online = {k: v for k, v in batch.items() if not k.startswith("cached_")}
  loss_c, m_c = loss_fn(params, setup.target.params, batch, rng)
  loss_o, m_o = loss_fn(params, setup.target.params, online, rng)
  np.testing.assert_allclose(loss_c, loss_o, rtol=1e-5)
  for k in m_o:
    np.testing.assert_allclose(m_c[k], m_o[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # and the loss does read the cache: features of other rows change it
  swapped = dict(batch)
  swapped[feature_cache.FEATURES] = np.roll(batch[feature_cache.FEATURES], 1, axis=0)
  assert abs(float(loss_fn(params, setup.target.params, swapped, rng)[0]) - float(loss_c)) > 1e-3
  val = setup.eval_data[0]
  assert val[feature_cache.FEATURES].shape[0] == cfg.batch_size
  np.testing.assert_allclose(loss_fn(params, setup.target.params, val, rng)[0],
                             loss_fn(params, setup.target.params, {
                                 k: v for k, v in val.items() if not k.startswith("cached_")},
                                     rng)[0], rtol=1e-5)


def test_cache_needs_regenerated_rows(run, template_corpus_dir, tfds_dir):
  cfg = config("dflash_tiny.py", run, template_corpus_dir, tfds_dir, label_source="data")
  with pytest.raises(SpecjaxError, match="feature_cache=True needs label_source='target'"):
    dflash.prepare(cfg, dflash.build_model)


def test_setup_time_comes_out_of_the_budget(tmp_path):
  cfg = tiny_train_config("dflash_tiny.py", tmp_path, "", "", time_budget_s=10.0)
  assert budget.steps_for_budget(cfg, str(tmp_path), lambda: 0.5, setup_seconds=4.0) == 12
  saved = json.load(open(tmp_path / budget.FILE))
  assert saved["setup_seconds"] == 4.0 and saved["num_steps"] == 12
  with pytest.raises(SpecjaxError, match="one-time setup took 12 s"):
    budget.steps_for_budget(cfg, str(tmp_path / "other"), lambda: 0.5, setup_seconds=12.0)


def test_a_cached_run_trains(run, template_corpus_dir, tfds_dir):
  from specjax.training import registry
  cfg = config("dspark_tiny.py", run, template_corpus_dir, tfds_dir, num_steps=8, log_every=4,
               eval_every=8, save_every=8)
  registry.train(cfg)
  with open(os.path.join(run, "dspark", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_loss"' in l]
  assert [r["step"] for r in rows] == [0, 8] and rows[-1]["val_loss"] < rows[0]["val_loss"]
  assert os.path.exists(os.path.join(run, "dspark", "calibration.json"))
