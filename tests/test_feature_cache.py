"""The feature cache: for every drafter that reads the frozen target (DFlash, DSpark, DFlash 2,
the distilled draft model, both MTP variants) the cached batch gives the same loss as the
target's pass over the same (shuffled) rows, the cache is really what the loss reads, its
build time comes out of a time budget, bad settings are one-line errors, and cached runs
train."""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from flax import nnx

from conftest import tiny_train_config
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.training import block, budget, dflash, dflash2, draft, dspark, feature_cache, mtp
from specjax.training import regenerate

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
  regen = dict(num_sequences=24, num_validation=8, prompt_len=8, new_tokens=24, batch_size=24)
  if "regen" in cfg:
    cfg.regen.update(regen)
  else:  # the token drafters: the block drafters' regenerated rows (configs/reference.py)
    cfg.regen = ml_collections.ConfigDict(regen)
  return cfg


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cached_loss_equals_the_target_pass(name, run, template_corpus_dir, tfds_dir):
  build, make_loss, logits = LOSSES[name]
  cfg = config(name, run, template_corpus_dir, tfds_dir)
  setup = block.prepare(cfg, build, target_logits=logits)
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


def token_drafter_setup(name, run, corpus_dir, tfds_dir, variant=None):
  """(cfg, loss_fn, params, frozen, cached train batch, cached validation batch)."""
  cfg = config(name, run, corpus_dir, tfds_dir, train_on="regenerated", seq_len=32,
               **({"variant": variant} if variant else {}))
  target = run_dir_lib.load_target(run)
  tok = run_dir_lib.load_tokenizer(run)
  if variant is None:
    cache = feature_cache.builder(cfg, target, (), with_hidden=True, name="draft")
    graphdef, params = nnx.split(_init_draft(cfg, run), nnx.Param)
    loss_fn = draft.draft_loss(graphdef, target.graphdef, True)
  else:
    cache = feature_cache.builder(cfg, target, (target.model_cfg.num_layers,), True,
                                  name=mtp.method_name(variant))
    heads = mtp.build_heads(variant, target.model_cfg, cfg, nnx.Rngs(0))
    graphdef, params = nnx.split(heads, nnx.Param)
    loss_fn = mtp.mtp_loss(variant, graphdef, target.graphdef, cfg)
  train_ds, val = regenerate.drafter_data(cfg, target, tok, cache)
  assert cache.seconds > 0
  return cfg, jax.jit(loss_fn), params, target.params, next(iter(train_ds)), val[0]


def _init_draft(cfg, run):
  from specjax.models import Transformer
  return Transformer(run_dir_lib.transformer_config(cfg.model, run_dir_lib.vocab_size(run)),
                     rngs=nnx.Rngs(0))


@pytest.mark.parametrize("variant", [None, "parallel", "sequential"])
def test_token_drafters_cached_loss_equals_the_target_pass(variant, run, template_corpus_dir,
                                                            tfds_dir):
  name = "draft_tiny.py" if variant is None else "mtp_tiny.py"
  cfg, loss_fn, params, frozen, batch, val = token_drafter_setup(
      name, run, template_corpus_dir, tfds_dir, variant)
  assert feature_cache.HIDDEN in batch
  rng = jax.random.key(0)
  for b in (batch, val):
    online = {k: v for k, v in b.items() if not k.startswith("cached_")}
    loss_c, m_c = loss_fn(params, frozen, b, rng)
    loss_o, m_o = loss_fn(params, frozen, online, rng)
    for k in m_o:
      np.testing.assert_allclose(m_c[k], m_o[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # and the loss does read the cache (noise, not a permutation of rows: the parallel heads'
  # inputs and labels both come from the hidden states, so permuted rows keep the mean loss)
  noise = np.random.default_rng(0).normal(size=batch[feature_cache.HIDDEN].shape)
  swapped = {**batch, feature_cache.HIDDEN: batch[feature_cache.HIDDEN] + noise}
  if variant == "sequential":  # its modules read the residual stream, its labels the logits
    swapped[feature_cache.FEATURES] = np.roll(batch[feature_cache.FEATURES], 1, axis=0)
  assert abs(float(loss_fn(params, frozen, swapped, rng)[0]) -
             float(loss_fn(params, frozen, batch, rng)[0])) > 1e-3


def test_cache_needs_regenerated_rows_and_a_frozen_target(run, template_corpus_dir, tfds_dir):
  from specjax.training import registry
  cfg = config("dflash_tiny.py", run, template_corpus_dir, tfds_dir, label_source="data")
  with pytest.raises(SpecjaxError, match="feature_cache=True needs the regenerated rows"):
    block.prepare(cfg, dflash.build_model)
  cfg = config("mtp_tiny.py", run, template_corpus_dir, tfds_dir)  # train_on: corpus
  with pytest.raises(SpecjaxError, match="feature_cache=True needs the regenerated rows"):
    registry.train(cfg)
  cfg = config("mtp_tiny.py", run, template_corpus_dir, tfds_dir, train_on="regenerated",
               freeze_target=False, seq_len=32)
  with pytest.raises(SpecjaxError, match="needs a frozen target"):
    registry.train(cfg)
  cfg = config("draft_tiny.py", run, template_corpus_dir, tfds_dir, train_on="regenerated",
               distill=False, seq_len=32)
  with pytest.raises(SpecjaxError, match="only with distill=True"):
    registry.train(cfg)


def test_setup_time_comes_out_of_the_budget(tmp_path):
  cfg = tiny_train_config("dflash_tiny.py", tmp_path, "", "", time_budget_s=10.0)
  assert budget.steps_for_budget(cfg, str(tmp_path), lambda: 0.5, setup_seconds=4.0) == 12
  saved = json.load(open(tmp_path / budget.FILE))
  assert saved["setup_seconds"] == 4.0 and saved["num_steps"] == 12
  with pytest.raises(SpecjaxError, match="one-time setup took 12 s"):
    budget.steps_for_budget(cfg, str(tmp_path / "other"), lambda: 0.5, setup_seconds=12.0)


def test_builder_fills_each_chunk_in_place(run):
  # chunks of unequal sizes: each row's slice must be its own batch's target pass
  target = run_dir_lib.load_target(run)
  rows = np.random.default_rng(0).integers(3, 60, size=(9, 12)).astype(np.int32)
  chunks = [regenerate.as_batch(rows[a:b]) for a, b in ((0, 2), (2, 7), (7, 9))]
  out = feature_cache.Builder(target, (1, 2), with_hidden=True)(chunks)
  assert out[feature_cache.FEATURES].shape[:2] == (9, 2)
  for (a, b), chunk in zip(((0, 2), (2, 7), (7, 9)), chunks):
    ref = target.module()(chunk["tokens"], positions_BxT=chunk["positions"],
                          segment_ids_BxT=chunk["segment_ids"], feature_layers=(1, 2))
    np.testing.assert_allclose(out[feature_cache.FEATURES][a:b, 1], ref.features[1], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(out[feature_cache.HIDDEN][a:b], ref.hidden_BxTxD, rtol=1e-5,
                               atol=1e-5)


def test_finished_reads_the_budget_and_the_last_checkpoint(tmp_path):
  cfg = tiny_train_config("dflash_tiny.py", tmp_path, "", "", time_budget_s=10.0, num_steps=5)
  assert not budget.finished(cfg, str(tmp_path))  # nothing decided, nothing saved
  budget.steps_for_budget(cfg, str(tmp_path), lambda: 0.5)  # 20 steps
  os.makedirs(tmp_path / "checkpoints" / "10")
  os.makedirs(tmp_path / "checkpoints" / "20.orbax-checkpoint-tmp-1")  # an unfinished save
  assert not budget.finished(cfg, str(tmp_path))
  os.makedirs(tmp_path / "checkpoints" / "20")
  assert budget.finished(cfg, str(tmp_path))
  cfg.time_budget_s = 0.0  # without a budget, num_steps decides
  assert budget.finished(cfg, str(tmp_path))
  cfg.num_steps = 30
  assert not budget.finished(cfg, str(tmp_path))


@pytest.mark.parametrize("name,folder,extra", [
    ("dspark_tiny.py", "dspark", {}),
    ("mtp_tiny.py", "mtp_sequential", {"variant": "sequential", "train_on": "regenerated"})])
def test_a_cached_run_trains(name, folder, extra, run, template_corpus_dir, tfds_dir,
                             capsys):
  from specjax.training import registry
  # a 10-second budget: the steps it buys are what the cache's build leaves of it
  cfg = config(name, run, template_corpus_dir, tfds_dir, log_every=50, eval_every=10**6,
               save_every=10**6, time_budget_s=10.0, **extra)
  trained = registry.train(cfg)
  with open(os.path.join(run, folder, "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_loss"' in l]
  assert rows[0]["step"] == 0 and rows[-1]["val_loss"] < rows[0]["val_loss"]
  decided = json.load(open(os.path.join(run, folder, budget.FILE)))
  assert 0 < decided["setup_seconds"] < 10
  assert decided["num_steps"] == int((10 - decided["setup_seconds"])
                                     / decided["seconds_per_step"])
  assert rows[-1]["step"] == decided["num_steps"]
  if folder == "dspark":
    assert os.path.exists(os.path.join(run, folder, "calibration.json"))
  # run again (as scripts/reference.sh does): it is finished, so no cache is built and
  # nothing trains
  assert "feature cache: the target's pass" in capsys.readouterr().out
  again = registry.train(cfg)
  out = capsys.readouterr().out
  assert "no feature cache to build" in out and "feature cache: the target's pass" not in out
  with open(os.path.join(run, folder, "metrics.jsonl")) as f:
    assert [json.loads(l)["step"] for l in f if '"val_loss"' in l][-1] == decided["num_steps"]
  assert json.load(open(os.path.join(run, folder, budget.FILE))) == decided
  for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_stored_cache_is_built_once_and_shared(run, tmp_path):
  # DFlash (no hidden states), then DSpark (hidden states) on the same rows and layers: the
  # second reads the first's store; other layers or other rows build their own
  target = run_dir_lib.load_target(run)
  rows = np.random.default_rng(1).integers(3, 60, size=(6, 12)).astype(np.int32)
  batches = [regenerate.as_batch(rows[:4]), regenerate.as_batch(rows[4:])]
  first = feature_cache.Builder(target, (1, 2), with_hidden=False, folder=str(tmp_path))
  built = first(batches)
  assert first.loaded == [] and first.seconds > 0 and feature_cache.HIDDEN in built
  second = feature_cache.Builder(target, (1, 2), with_hidden=True, folder=str(tmp_path))
  read = second(batches)
  assert len(second.loaded) == 1 and second.seconds == 0.0
  for name in (feature_cache.FEATURES, feature_cache.HIDDEN):
    np.testing.assert_array_equal(np.asarray(read[name]), built[name])
  assert feature_cache.report("dspark", second) == 0.0  # shared: out of the budget
  other = feature_cache.Builder(target, (2,), with_hidden=True, folder=str(tmp_path))
  other(batches)
  assert other.loaded == []
  rows[5, 3] += 1  # one token changed: another store
  changed = feature_cache.Builder(target, (1, 2), with_hidden=True, folder=str(tmp_path))
  changed([regenerate.as_batch(rows[:4]), regenerate.as_batch(rows[4:])])
  assert changed.loaded == [] and len(os.listdir(tmp_path)) == 3
