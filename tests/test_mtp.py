"""MTP drafters: losslessness, cached decoding equal to the training-time computation, training
that leaves the target untouched and raises per-depth accuracy."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_train_config
from decoding_helpers import (drive_drafter, perturbed, random_prompts, run_ar, run_spec,
                              tiny_model, to_lists)
from specjax.methods import builtin
from specjax import run_dir as run_dir_lib
from specjax.sampling import Sampler
from specjax.drafters.mtp_parallel import MTPParallelDrafter, ParallelHeads
from specjax.drafters.mtp_sequential import MTPSequentialDrafter, SequentialModules
from specjax.training import mtp as mtp_training
from specjax.training import registry

VOCAB = 61


@pytest.fixture(scope="module")
def setup():
  g, p = tiny_model(VOCAB, seed=0)
  cfg = nnx.merge(g, p).cfg
  hg, hp = nnx.split(ParallelHeads(cfg.d_model, 4, rngs=nnx.Rngs(1)), nnx.Param)
  sg, sp = nnx.split(SequentialModules(cfg, 4, rngs=nnx.Rngs(2)), nnx.Param)
  return (g, p), (hg, perturbed(hp, 3)), (sg, sp)


def drafter_of(variant, k, setup):
  (g, _), (hg, hp), (sg, sp) = setup
  if variant == "parallel":
    return MTPParallelDrafter(k, graphdef=hg), hp
  return MTPSequentialDrafter(k, graphdef=sg, target_layers=2), sp


@pytest.mark.parametrize("variant", ["parallel", "sequential"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_mtp_equals_ar(setup, variant, batch):
  (g, p), _, _ = setup
  prompts = random_prompts(8, VOCAB, seed=batch)
  for k in (1, 4):
    drafter, dp = drafter_of(variant, k, setup)
    for i in range(0, 8, batch):
      chunk = prompts[i:i + batch]
      assert to_lists(run_spec(g, p, drafter, dp, chunk, 20), 0) == \
          to_lists(run_ar(g, p, chunk, 20), 0)


@pytest.mark.parametrize("variant", ["parallel", "sequential"])
def test_mtp_sampling_runs_and_accepts_something(setup, variant):
  (g, p), _, _ = setup
  drafter, dp = drafter_of(variant, 3, setup)
  r = run_spec(g, p, drafter, dp, random_prompts(4, VOCAB, seed=7), 24, sampler=Sampler(1.0),
               eos=-1)
  assert np.asarray(r.num_tokens_B).tolist() == [24] * 4


def test_sequential_cached_drafts_equal_full_recomputation(setup):
  """Each step's drafts equal a cache-free pass of the modules over the whole committed
  sequence (the training computation), chained through the drafts: the window/caching
  scheme loses nothing, across rejections and acceptances."""
  (g, p), _, (sg, sp) = setup
  k = 3
  drafter = MTPSequentialDrafter(k, graphdef=sg, target_layers=2)

  def reference(target, dp, seq_BxS, end_B):
    mods = nnx.merge(sg, dp)
    b, s = seq_BxS.shape
    drafts = []
    seq = seq_BxS
    for j in range(1, k + 1):
      valid = jnp.arange(s)[None] <= end_B[:, None] + j - 1  # committed + drafts so far
      segs = jnp.where(valid, 1, 2)
      out = target(seq, segment_ids_BxT=segs, feature_layers=(2,))
      logits = mtp_training.depth_logits("sequential", mods, target, seq,
                                         jnp.broadcast_to(jnp.arange(s), (b, s)), segs, out)
      at = jnp.take_along_axis(logits[j - 1], (end_B - 1)[:, None, None], axis=1)[:, 0]
      d = jnp.argmax(at, -1).astype(jnp.int32)
      drafts.append(d)
      seq = jax.vmap(lambda row, e, v: row.at[e + j].set(v))(seq, end_B, d)
    return jnp.stack(drafts, 1)

  accepted = drive_drafter(g, p, drafter, sp, random_prompts(3, VOCAB, seed=11, min_len=4),
                           8, reference, cache_len=64, accept_schedule=[0, 3, 1, 2, 3, 0, 2, 1])
  assert set(accepted.ravel().tolist()) == {0, 1, 2, 3}  # rollback at every position


def test_parallel_heads_state_rolls_back_at_every_position(setup):
  """After any number of accepted drafts the heads read the target's hidden state at the
  last committed position: drafts equal the heads on a cache-free target pass."""
  (g, p), (hg, hp), _ = setup
  k = 3

  def reference(target, dp, seq_BxS, end_B):
    heads = nnx.merge(hg, dp)
    hidden = target(seq_BxS).hidden_BxTxD  # causal: positions < end are exact
    h = jnp.take_along_axis(hidden, (end_B - 1)[:, None, None], axis=1)
    logits = jnp.concatenate([target.logits(x) for x in heads(h, k)], axis=1)
    return jnp.argmax(logits, -1).astype(jnp.int32)

  accepted = drive_drafter(g, p, MTPParallelDrafter(k, graphdef=hg), hp,
                           random_prompts(3, VOCAB, seed=12, min_len=3), 8, reference,
                           cache_len=64, accept_schedule=[3, 0, 1, 2, 2, 3, 0, 1])
  assert set(accepted.ravel().tolist()) == {0, 1, 2, 3}


@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """The tiny run's target with both MTP variants trained (a copy of the run)."""
  import shutil
  run = tmp_path_factory.mktemp("mtp_run")
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  before = run_dir_lib.load_target(str(run)).params
  for variant, steps in (("parallel", 150), ("sequential", 60)):
    registry.train(tiny_train_config(
        "mtp_tiny.py", run, template_corpus_dir, tfds_dir, variant=variant, num_steps=steps,
        log_every=10, eval_every=steps, save_every=steps, learning_rate=1e-2, num_heads=3,
        label_source="data"))
  return str(run), before


def test_mtp_training_leaves_the_target_bit_identical(trained):
  run, before = trained
  after = run_dir_lib.load_target(run).params
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  target = run_dir_lib.load_target(run)
  graphdef, params, _ = builtin.load_mtp_heads(run, "parallel", target)
  n_heads = sum(x.size for x in jax.tree.leaves(params))
  n_target = sum(x.size for x in jax.tree.leaves(target.params))
  assert n_heads == 3 * target.model_cfg.d_model ** 2 < n_target  # only heads were saved
  assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(params))  # trained


@pytest.mark.parametrize("variant", ["parallel", "sequential"])
def test_mtp_per_depth_validation_accuracy_improves(trained, variant):
  run, _ = trained
  with open(os.path.join(run, f"mtp_{variant}", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_acc_d1"' in l]
  first, last = rows[0], rows[-1]
  assert first["step"] == 0 and last["step"] > 0
  for k in (1, 2, 3):
    assert last[f"val_acc_d{k}"] > first[f"val_acc_d{k}"] + 0.02, (k, first, last)


def test_trained_mtp_decodes_losslessly_through_the_harness(trained, tmp_path):
  from specjax import evaluate
  from test_decode import decode_config
  run, _ = trained
  cfg = decode_config(run, tmp_path, methods="mtp_parallel,mtp_sequential",
                      num_draft_tokens=3)
  report = evaluate.evaluate(cfg)["methods"]
  for name in ("mtp_parallel", "mtp_sequential"):
    assert report[name]["lossless_check"] is True
    assert len(report[name]["acceptance_per_position"]) == 3
  cfg.num_draft_tokens = 4
  with pytest.raises(Exception, match="trained with 3 heads"):
    evaluate.Harness(cfg, ["ar"]).run("mtp_parallel", cfg)


def test_joint_training_updates_the_target_and_refuses_a_lossy_comparison(
    tiny_run, template_corpus_dir, tfds_dir, tmp_path):
  import shutil
  from specjax.errors import SpecjaxError
  shutil.copytree(os.path.join(tiny_run, "target"), tmp_path / "target")
  cfg = tiny_train_config("mtp_tiny.py", tmp_path, template_corpus_dir, tfds_dir,
                          num_steps=3, freeze_target=False, num_heads=2)
  params = registry.train(cfg)
  target = run_dir_lib.load_target(str(tmp_path))
  changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(params["target"]), jax.tree.leaves(target.params))]
  assert any(changed)  # the jointly trained target moved; run_dir/target did not
  with pytest.raises(SpecjaxError, match="trained jointly with the target"):
    builtin.load_mtp_heads(str(tmp_path), "parallel", target)
