"""DFlash: losslessness, the cached pass equal to a cache-free reference, and training that
lowers validation loss and raises block acceptance."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import train_block_drafter
from decoding_helpers import (drive_drafter, random_prompts, run_ar, run_spec, tiny_model,
                              to_lists)
from specjax.drafters.dflash import DFlashDrafter, DFlashModel
from specjax.models import default_feature_layers
from specjax.training import block as dflash_training

VOCAB = 61
LAYERS = (1, 2)


@pytest.fixture(scope="module")
def setup():
  g, p = tiny_model(VOCAB, seed=0)
  cfg = nnx.merge(g, p).cfg
  dg, dp = nnx.split(DFlashModel(cfg, 2, len(LAYERS), rngs=nnx.Rngs(5)), nnx.Param)
  return (g, p), (dg, dp)


def drafter(block_size, dg):
  return DFlashDrafter(block_size - 1, graphdef=dg, target_feature_layers=LAYERS)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_dflash_equals_ar(setup, block_size, batch):
  (g, p), (dg, dp) = setup
  prompts = random_prompts(8, VOCAB, seed=block_size + batch)
  for i in range(0, 8, batch):
    chunk = prompts[i:i + batch]
    assert to_lists(run_spec(g, p, drafter(block_size, dg), dp, chunk, 24), 0) == \
        to_lists(run_ar(g, p, chunk, 24), 0)


def test_cached_drafts_equal_reference_without_cache(setup):
  """Reference: rebuild context features with a full target pass over the committed text,
  build the masked block, run the drafter with the full mask and no cache."""
  (g, p), (dg, dp) = setup
  bs = 5

  def reference(target, params, seq_BxS, end_B):
    model = nnx.merge(dg, params)
    b, s = seq_BxS.shape
    out = target(seq_BxS, feature_layers=LAYERS)  # causal: positions < end are exact
    positions = jnp.broadcast_to(jnp.arange(s), (b, s))
    ctx_kv = model.context_kv(model.project(out.features), positions)
    pending = jnp.take_along_axis(seq_BxS, end_B[:, None], axis=1)
    x = model.block_inputs(target, pending, bs)
    block_pos = end_B[:, None] + jnp.arange(bs)
    ctx_mask = jnp.arange(s)[None, None, :] < end_B[:, None, None]
    mask = jnp.concatenate([jnp.broadcast_to(ctx_mask, (b, bs, s)),
                            jnp.ones((b, bs, bs), bool)], axis=-1)
    logits = target.logits(model(x, block_pos, ctx_kv, mask)[:, 1:])
    return jnp.argmax(logits, -1).astype(jnp.int32)

  accepted = drive_drafter(g, p, drafter(bs, dg), dp,
                           random_prompts(3, VOCAB, seed=2, min_len=3), 10, reference,
                           cache_len=80, accept_schedule=[0, 4, 1, 3, 2, 4, 0, 2, 1, 3])
  assert set(accepted.ravel().tolist()) == {0, 1, 2, 3, 4}  # rollback at every position


def test_training_mask_isolates_blocks():
  seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2]])
  anchors = jnp.array([[2, 5]])
  mask = np.asarray(dflash_training.training_mask(seg, anchors, 3))[0]  # [6, 8 + 6]
  assert mask[:3, :8].tolist() == [[True, True, False, False, False, False, False, False]] * 3
  assert mask[3:, :8].tolist() == [[False, False, False, False, True, False, False, False]] * 3
  assert mask[:3, 8:].tolist() == [[True] * 3 + [False] * 3] * 3
  assert mask[3:, 8:].tolist() == [[False] * 3 + [True] * 3] * 3


def test_block_labels_and_weights():
  tokens = jnp.arange(10)[None]
  seg = jnp.array([[1] * 6 + [2] * 4])
  labels, valid = dflash_training.block_targets(tokens, seg, jnp.array([[3, 8]]),
                                                jnp.array([[True, True]]), 4)
  assert labels[0, 0].tolist() == [3, 4, 5, 6]
  assert valid[0, 0].tolist() == [False, True, True, False]  # 6 is another document
  assert valid[0, 1].tolist() == [False, True, False, False]  # past the end
  w = dflash_training.position_weights(4, 2.0)
  np.testing.assert_allclose(w, [0.0, 1.0, np.exp(-0.5), np.exp(-1.0)], rtol=1e-6)
  assert default_feature_layers(36, 5) == (1, 9, 17, 25, 33)
  assert default_feature_layers(4, 3) == (1, 2, 3)


@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  return train_block_drafter(tiny_run, "dflash_tiny.py", tmp_path_factory.mktemp("dflash_run"),
                             template_corpus_dir, tfds_dir, num_steps=120, log_every=20,
                             eval_every=120, save_every=120, block_size=8, gamma=4.0)


def test_training_lowers_val_loss_and_raises_block_acceptance(trained):
  with open(os.path.join(trained, "dflash", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_loss"' in l]
  first, last = rows[0], rows[-1]
  assert first["step"] == 0 and last["step"] == 120
  assert last["val_loss"] < first["val_loss"] - 1.0
  assert last["val_block_tau"] > first["val_block_tau"] + 0.5
  assert os.listdir(os.path.join(trained, "regenerated"))  # the target's continuations, cached


def test_trained_dflash_through_the_harness(trained, tmp_path):
  from specjax import evaluate
  from test_decode import decode_config
  prompts = tmp_path / "template_prompts.jsonl"  # in-distribution for the tiny target
  prompts.write_text("".join(
      json.dumps({"prompt": f"def {n}_{a}{b}(x):\n    return x * {a} + {b}\n\ndef {m}_"}) + "\n"
      for n, m, a, b in [("alpha", "beta", 1, 2), ("gamma", "delta", 3, 4),
                         ("omega", "sigma", 5, 6), ("beta", "alpha", 7, 8)]))
  for block_size in (4, 8):
    cfg = decode_config(trained, tmp_path, methods="dflash", block_size=block_size,
                        prompts=str(prompts), max_new_tokens=24)
    report = evaluate.evaluate(cfg)["methods"]["dflash"]
    assert report["lossless_check"] is True and report["block_size"] == block_size
    assert len(report["acceptance_per_position"]) == block_size - 1
    assert report["tau"] > 1.5  # the drafter learned something real


def test_trained_drafter_weights_are_packed_with_the_target_and_draft_alike(trained, tmp_path):
  """target_weights=kernel packs the drafter's decoder layers for the CPU kernel too (the
  same values): the same prompts then draft the same tokens as with XLA's dot."""
  from specjax import evaluate
  from specjax.kernels import cpu
  from specjax.models import weights
  from test_decode import decode_config
  if not cpu.available():
    pytest.skip("no C++ compiler for the kernel")
  reports = {}
  for mode in ("xla", "kernel"):
    cfg = decode_config(trained, tmp_path, methods="dflash", block_size=8, max_new_tokens=24,
                        target_weights=mode)
    harness = evaluate.Harness(cfg, ["ar", "dflash"])
    _, _, dparams = evaluate.make_decoder("dflash", cfg, harness.target, harness.sampler,
                                          cfg.cache_len, -1, None, harness.weights_mode)
    leaves = jax.tree.leaves(dparams, is_leaf=lambda x: isinstance(x, weights.PackedWeight))
    packed = [x for x in leaves if isinstance(x, weights.PackedWeight)]
    # every layer's q/o and MLP at least (k/v too where their width is a multiple of 32)
    if mode == "xla":
      assert not packed
    else:
      assert len(packed) >= 5 * len(dparams["layers"])
    harness.run("ar", cfg)
    reports[mode] = harness.run("dflash", cfg)
    assert reports[mode]["lossless_check"] is True
  assert reports["kernel"]["accept_histogram"] == reports["xla"]["accept_histogram"]
