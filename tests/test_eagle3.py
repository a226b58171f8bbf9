"""EAGLE-3: losslessness, cached chain drafts equal to the training-time-test computation at
every rollback, a draft vocabulary, and training that raises every TTT step's accuracy."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import tiny_train_config
from decoding_helpers import (drive_drafter, perturbed, random_prompts, run_ar, run_spec,
                              tiny_model, to_lists)
from specjax.drafters.eagle3 import (Eagle3Drafter, Eagle3Model, default_feature_layers_eagle3,
                                     draft_logits, head_rows)
from specjax.errors import SpecjaxError
from specjax.sampling import Sampler
from specjax.training import eagle3 as eagle3_training
from specjax.training import registry

V = 61
LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def setup():
  g, p = tiny_model(V, seed=0, layers=4)
  cfg = nnx.merge(g, p).cfg
  vocab = jnp.asarray(sorted(np.random.default_rng(0).choice(V, 40, replace=False)), jnp.int32)
  models = {}
  for name, kw in {"plain": dict(norm_before_residual=False),
                   "speculators_defaults": dict(norm_before_fc=True, norm_output=True),
                   "fc_norm": dict(fc_norm=True, norm_output=True)}.items():
    mg, mp = nnx.split(Eagle3Model(cfg, 2, 3, rngs=nnx.Rngs(1), **kw), nnx.Param)
    models[name] = (mg, perturbed(mp, 2, 0.2))
  return (g, p), models, vocab


def params_of(mp, vocab, target=None):
  """With a vocabulary and the target: the head rows too, as decode.py loads them."""
  if vocab is None:
    return {"model": mp}
  if target is None:
    return {"model": mp, "vocab": vocab}
  return {"model": mp, "vocab": vocab, "head": head_rows(nnx.merge(*target), vocab)}


@pytest.mark.parametrize("packed", [False, True])
def test_head_rows_give_the_full_heads_logits_at_the_draft_vocabulary(setup, packed):
  (g, p), _, vocab = setup
  from specjax.models import weights
  if packed:
    p = weights.pack_state(p)
  target = nnx.merge(g, p)
  h = jax.random.normal(jax.random.key(0), (2, 3, target.cfg.d_model))
  full = np.asarray(target.logits(h))[..., np.asarray(vocab)]
  np.testing.assert_allclose(np.asarray(target.logits(h, vocab)), full, rtol=1e-5, atol=1e-5)
  rows = head_rows(target, vocab)
  assert rows.shape == (len(vocab), target.cfg.d_model)
  np.testing.assert_allclose(np.asarray(draft_logits(target, h, vocab, rows)), full, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("with_vocab", [False, True])
def test_greedy_eagle3_equals_ar(setup, batch, with_vocab):
  (g, p), models, vocab = setup
  mg, mp = models["speculators_defaults"]
  prompts = random_prompts(8, V, seed=batch)
  for k in (1, 4):
    drafter = Eagle3Drafter(k, graphdef=mg, target_feature_layers=LAYERS)
    for i in range(0, 8, batch):
      chunk = prompts[i:i + batch]
      assert to_lists(run_spec(g, p, drafter,
                               params_of(mp, vocab if with_vocab else None, (g, p)),
                               chunk, 20), 0) == to_lists(run_ar(g, p, chunk, 20), 0)


@pytest.mark.parametrize("variant", ["plain", "speculators_defaults", "fc_norm"])
@pytest.mark.parametrize("with_vocab", [False, True])
def test_cached_chain_equals_training_time_test(setup, variant, with_vocab):
  """Each step's K drafts equal TTT steps 0..K-1 (the training computation) at the last
  committed position over the whole sequence, the drafts fed as teacher tokens: the window
  and cache scheme loses nothing across acceptances and rollbacks at every position."""
  (g, p), models, vocab = setup
  mg, mp = models[variant]
  vocab = vocab if with_vocab else None
  k = 3

  def reference(target, dp, seq_BxS, end_B):
    model = nnx.merge(mg, dp["model"])
    b, s = seq_BxS.shape
    pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    feats = target(seq_BxS, feature_layers=LAYERS).features  # causal: exact before end
    seq, drafts = seq_BxS, []
    for j in range(k):
      logits = eagle3_training.ttt_logits(model, target, feats, seq, pos, jnp.ones_like(seq),
                                          j + 1, dp.get("vocab"))[j]
      at = jnp.take_along_axis(logits, (end_B - 1)[:, None, None], axis=1)[:, 0]
      d = jnp.argmax(at, -1).astype(jnp.int32)
      d = d if vocab is None else dp["vocab"][d]
      drafts.append(d)
      seq = jax.vmap(lambda row, e, v: row.at[e + 1 + j].set(v))(seq, end_B, d)
    return jnp.stack(drafts, 1)

  drafter = Eagle3Drafter(k, graphdef=mg, target_feature_layers=LAYERS)
  accepted = drive_drafter(g, p, drafter, params_of(mp, vocab, (g, p)),
                           random_prompts(3, V, seed=11, min_len=1), 8, reference, cache_len=64,
                           accept_schedule=[0, 3, 1, 2, 3, 0, 2, 1])
  assert set(accepted.ravel().tolist()) == {0, 1, 2, 3}


def test_sampled_drafts_stay_in_the_draft_vocabulary(setup):
  (g, p), models, vocab = setup
  mg, mp = models["speculators_defaults"]
  drafter = Eagle3Drafter(3, graphdef=mg, target_feature_layers=LAYERS)
  prompts = random_prompts(4, V, seed=5)
  target = nnx.merge(g, p)
  from specjax.decoding.common import pad_prompts, prefill
  from specjax.drafters.base import Context, Prefill
  tokens, lens = (jnp.asarray(x) for x in pad_prompts(prompts, 1))
  _, out, last = prefill(target, tokens, lens, 64, LAYERS)
  state = drafter.init(params_of(mp, vocab), target, Prefill(tokens, lens, out, 64))
  seq = jnp.zeros((4, 64), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
  pending = jnp.argmax(last, -1).astype(jnp.int32)
  drafts, q, _ = drafter.propose(params_of(mp, vocab), target, state,
                                 Context(seq, lens, pending), Sampler(1.0), jax.random.key(3))
  assert q.shape == (4, 3, V)
  np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, rtol=1e-5)
  outside = np.ones(V, bool)
  outside[np.asarray(vocab)] = False
  assert np.asarray(q)[..., outside].max() == 0.0
  assert np.isin(np.asarray(drafts), np.asarray(vocab)).all()


def test_default_feature_layers():
  assert default_feature_layers_eagle3(30) == (2, 15, 27)  # speculators' default
  assert default_feature_layers_eagle3(36) == (2, 18, 33)
  assert default_feature_layers_eagle3(4) == (1, 2, 3)  # too shallow: an even spread


def test_draft_vocabulary_is_the_most_frequent_masked_tokens():
  batch = {"targets": np.array([[5, 5, 5, 2, 2, 9, 7, 7, 7, 7]]),
           "loss_mask": np.array([[1, 1, 1, 1, 1, 1, 0, 0, 0, 0]])}
  assert eagle3_training.draft_vocabulary([batch], 2, 12) == [2, 5]  # 7 is never masked in
  assert eagle3_training.draft_vocabulary([batch], 3, 12) == [2, 5, 9]


@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """The tiny run's target with EAGLE-3 trained on a reduced draft vocabulary."""
  run = tmp_path_factory.mktemp("eagle3_run")
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  registry.train(tiny_train_config("eagle3_tiny.py", run, template_corpus_dir, tfds_dir,
                                   num_steps=80, log_every=10, eval_every=80, save_every=80,
                                   learning_rate=1e-2, draft_vocab_size=256, vocab_batches=8))
  return str(run)


def test_eagle3_training_raises_every_ttt_step_accuracy(trained):
  with open(os.path.join(trained, "eagle3", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_acc_s0"' in l]
  first, last = rows[0], rows[-1]
  assert first["step"] == 0 and last["step"] == 80
  for k in range(3):
    assert last[f"val_acc_s{k}"] > first[f"val_acc_s{k}"] + 0.05, (k, first, last)
  vocab = eagle3_training.load_vocab(os.path.join(trained, "eagle3"))
  assert len(vocab) == 256 and vocab == sorted(set(vocab))


def test_trained_eagle3_decodes_losslessly_through_the_harness(trained, tmp_path):
  from specjax import evaluate
  from test_decode import decode_config
  cfg = decode_config(trained, tmp_path, methods="eagle3", num_draft_tokens=3)
  report = evaluate.evaluate(cfg)["methods"]["eagle3"]
  assert report["lossless_check"] is True
  assert len(report["acceptance_per_position"]) == 3
  assert report["acceptance_per_position"][0] > 0.2  # it learned something


def test_bad_feature_layers_are_one_line_errors(tiny_run, template_corpus_dir, tfds_dir,
                                                tmp_path):
  shutil.copytree(os.path.join(tiny_run, "target"), tmp_path / "target")
  cfg = tiny_train_config("eagle3_tiny.py", tmp_path, template_corpus_dir, tfds_dir,
                          num_steps=1, feature_layers=(1, 1, 9))
  with pytest.raises(SpecjaxError, match="must be distinct"):
    registry.train(cfg)
