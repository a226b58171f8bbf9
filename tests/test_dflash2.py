"""DFlash 2: a fresh one equals DFlash, greedy decoding equals AR, the imported reference
drafter computes Z Lab's hidden states, logits, greedy candidate paths and q at T > 0, and
import -> export round trips."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from decoding_helpers import (perturbed, random_prompts, run_ar, run_spec, tiny_model,
                              to_lists)
from specjax.drafters.dflash import DFlashDrafter, DFlashModel
from specjax.drafters.dflash2 import DFlash2Drafter, dflash2_model
from specjax.interop import zlab
from specjax.interop.safetensors_io import open_tensors
from specjax.sampling import Sampler

VOCAB = 61
LAYERS = (1, 2)


def graft(src_params, dst_params):
  """dst with every parameter it shares with src (by path) taken from src."""
  src = dict(nnx.to_flat_state(src_params))
  return nnx.from_flat_state([(path, src[path] if path in src else var)
                              for path, var in nnx.to_flat_state(dst_params)])


@pytest.fixture(scope="module")
def setup():
  g, p = tiny_model(VOCAB, seed=0)
  cfg = nnx.merge(g, p).cfg
  fg, fp = nnx.split(DFlashModel(cfg, 2, len(LAYERS), rngs=nnx.Rngs(5)), nnx.Param)
  dg, dp = nnx.split(dflash2_model(cfg, 2, len(LAYERS), rngs=nnx.Rngs(5), selector_rank=8),
                     nnx.Param)
  return (g, p), (fg, fp), (dg, graft(fp, dp))


def test_fresh_dflash2_equals_dflash(setup):
  (g, p), (fg, fp), (dg, dp) = setup
  target = nnx.merge(g, p)
  one, two = nnx.merge(fg, fp), nnx.merge(dg, dp)
  b, t, bs = 2, 7, 4
  tokens = jax.random.randint(jax.random.key(0), (b, t + 1), 1, VOCAB)
  out = target(tokens[:, :t], feature_layers=LAYERS)
  positions = jnp.broadcast_to(jnp.arange(t + bs), (b, t + bs))
  hidden = []
  for m in (one, two):
    ctx_kv = m.context_kv(m.project(out.features), positions[:, :t])
    x = m.block_inputs(target, tokens[:, t:], bs)
    hidden.append(np.asarray(m(x, positions[:, t:], ctx_kv, jnp.ones((b, bs, t + bs), bool))))
  np.testing.assert_array_equal(hidden[0], hidden[1])
  prompts = random_prompts(4, VOCAB, seed=3)
  a = run_spec(g, p, DFlashDrafter(3, graphdef=fg, target_feature_layers=LAYERS), fp, prompts,
               16)
  c = run_spec(g, p, DFlash2Drafter(3, graphdef=dg, target_feature_layers=LAYERS), dp,
               prompts, 16)
  assert to_lists(a, 0) == to_lists(c, 0)
  np.testing.assert_array_equal(np.asarray(a.accept_counts), np.asarray(c.accept_counts))


@pytest.mark.parametrize("use_selector", [True, False])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_dflash2_equals_ar(setup, batch, use_selector):
  """With the selector, and without it (--config.selector=false: the unary logits)."""
  (g, p), _, (dg, dp) = setup
  dp = perturbed(dp, 11)
  drafter = DFlash2Drafter(3, graphdef=dg, target_feature_layers=LAYERS,
                           use_selector=use_selector)
  prompts = random_prompts(4, VOCAB, seed=batch)
  for i in range(0, 4, batch):
    chunk = prompts[i:i + batch]
    assert to_lists(run_spec(g, p, drafter, dp, chunk, 20), 0) == \
        to_lists(run_ar(g, p, chunk, 20), 0)


def test_selector_switch_changes_the_proposals(setup):
  """The same checkpoint proposes differently with and without the (perturbed) selector: the
  first proposals after the prefill of 8 prompts differ somewhere (the decoded counts, a
  weaker proxy, can coincide)."""
  from specjax.decoding.common import pad_prompts, prefill
  from specjax.drafters.base import Context, Prefill
  (g, p), _, (dg, dp) = setup
  dp = perturbed(dp, 11)
  target = nnx.merge(g, p)
  tokens, lens = (jnp.asarray(x) for x in pad_prompts(random_prompts(8, VOCAB, seed=7), 1))
  _, out, last = prefill(target, tokens, lens, 64, LAYERS)
  seq = jnp.zeros((8, 64), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
  ctx = Context(seq, lens, jnp.argmax(last, -1).astype(jnp.int32))
  drafts = {}
  for flag in (True, False):
    drafter = DFlash2Drafter(3, graphdef=dg, target_feature_layers=LAYERS, use_selector=flag)
    state = drafter.init(dp, target, Prefill(tokens, lens, out, 64))
    drafts[flag] = np.asarray(drafter.propose(dp, target, state, ctx, Sampler(),
                                              jax.random.key(0))[0])
  assert (drafts[True] != drafts[False]).any()


def test_conv_stays_inside_each_block(setup):
  """Several blocks in one training pass equal each block drafted alone."""
  (g, p), _, (dg, dp) = setup
  target, model = nnx.merge(g, p), nnx.merge(dg, perturbed(dp, 3))
  b, t, bs = 1, 6, 4
  tokens = jax.random.randint(jax.random.key(2), (b, t), 1, VOCAB)
  out = target(tokens, feature_layers=LAYERS)
  ctx_kv = model.context_kv(model.project(out.features), jnp.arange(t)[None])
  firsts = tokens[:, 2:5]  # three blocks, each seeing the whole context
  x = model.block_inputs(target, firsts, bs)
  pos = jnp.tile(t + jnp.arange(bs), 3)[None]
  block_id = jnp.repeat(jnp.arange(3), bs)
  own = (block_id[:, None] == block_id[None, :])[None]
  mask = jnp.concatenate([jnp.ones((b, 3 * bs, t), bool), own], -1)
  run = nnx.jit(lambda m, x, pos, mask, block: m(x, pos, ctx_kv, mask, block_size=block),
                static_argnums=4)
  together = run(model, x, pos, mask, bs)
  for j in range(3):
    alone = run(model, x[:, j * bs:(j + 1) * bs], pos[:, :bs], jnp.ones((b, bs, t + bs), bool),
                None)
    np.testing.assert_allclose(np.asarray(together[:, j * bs:(j + 1) * bs]), np.asarray(alone),
                               atol=1e-5)


# ---- Z Lab's reference DFlash2DraftModel (torch, CPU) ----

dflash_model = pytest.importorskip("dflash.model")
from zlab_models import block_passes, save_target_run, zlab_drafter  # noqa: E402

ZVOCAB = 320
SELECTOR = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=16,
                output_multiplier=0.8, final_logit_softcapping=6.0)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  root = tmp_path_factory.mktemp("zlab2")
  target = save_target_run(str(root / "run"))
  model = zlab_drafter(architecture="DFlash2DraftModel", block_size=5, **SELECTOR)
  model.save_pretrained(str(root / "zlab"))
  zlab.import_dflash(str(root / "zlab"), str(root / "run"))
  return model, str(root / "zlab"), str(root / "run"), target


def both_passes(imported):
  """(ours: model, hidden, logits, pending; reference: hidden, logits, head)."""
  model, _, run, target = imported
  return block_passes(model, run, "dflash2", target, ZVOCAB)


def test_hidden_logits_and_paths_equal_reference(imported):
  (drafter, hidden, logits, pending), (ref_hidden, ref_logits, head) = both_passes(imported)
  model = imported[0]
  dh = float(np.abs(np.asarray(hidden) - ref_hidden.numpy()).max())
  dl = float(np.abs(np.asarray(logits) - ref_logits.numpy()).max())
  print(f"max difference vs reference: hidden {dh:.2e}, logits {dl:.2e}")
  assert dh < 1e-4 and dl < 1e-4, (dh, dl)
  sel = drafter.candidate_selector
  tokens, cand, _, _ = sel.select(hidden, logits, pending, Sampler(), jax.random.key(0))
  with torch.no_grad():
    ref_path, ref_cand, _ = model.propose(ref_hidden, torch.from_numpy(np.array(pending)),
                                          head, 0.0)
  assert np.array_equal(np.sort(np.asarray(cand), -1), np.sort(ref_cand.numpy(), -1))
  assert np.array_equal(np.asarray(tokens), ref_path.numpy()), (tokens, ref_path)


def test_q_over_candidates_equals_reference(imported):
  """At T > 0 along the reference's sampled path: the same q over the same K candidates, and
  our own walk's q is the processed distribution of its scores along its own path."""
  (drafter, hidden, logits, pending), (ref_hidden, _, head) = both_passes(imported)
  model, temperature = imported[0], 0.7
  sel, sampler = drafter.candidate_selector, Sampler(temperature)
  torch.manual_seed(0)
  with torch.no_grad():
    ref_path, ref_cand, ref_q = model.propose(ref_hidden, torch.from_numpy(np.array(pending)),
                                              head, temperature)
  path = jnp.asarray(ref_path.numpy())
  unary, cand = sel.candidates(logits)
  preds = jnp.concatenate([pending[:, None], path[:, :-1]], axis=1)
  q = sampler.probs(unary + sel.pair_scores(hidden, preds, cand))

  def over_vocab(q, c):
    out = np.zeros(q.shape[:2] + (ZVOCAB,))
    np.put_along_axis(out, np.asarray(c), np.asarray(q), axis=-1)
    return out

  dq = float(np.abs(over_vocab(q, cand) - over_vocab(ref_q.numpy(), ref_cand.numpy())).max())
  print(f"max q difference vs reference at T={temperature}: {dq:.2e}")
  assert dq < 1e-5, dq
  tokens, cand2, _, own_q = sel.select(hidden, logits, pending, sampler, jax.random.key(4))
  own_preds = jnp.concatenate([pending[:, None], tokens[:, :-1]], axis=1)
  expected = sampler.probs(unary + sel.pair_scores(hidden, own_preds, cand2))
  np.testing.assert_allclose(np.asarray(own_q), np.asarray(expected), atol=1e-6)
  assert (np.asarray(tokens)[..., None] == np.asarray(cand2)).any(-1).all()


def test_import_then_export_is_exact(imported, tmp_path):
  model, src, run, _ = imported
  zlab.export_dflash2(run, str(tmp_path))
  strip = lambda n: n[:-len(".weight")] if n.endswith("_codebook.weight") else n  # noqa: E731
  with open_tensors(src) as a, open_tensors(str(tmp_path)) as b:
    assert sorted(strip(n) for n in a.names()) == sorted(b.names())
    for name in a.names():
      x, y = a.read(name), b.read(strip(name))
      assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
  config = json.load(open(os.path.join(tmp_path, "config.json")))
  assert config["architectures"] == ["DFlash2DraftModel"]
  assert config["dflash_config"]["selector_top_k"] == 16
  for key, value in SELECTOR.items():
    assert config["dflash_config"][key] == value, key
  reloaded = dflash_model.DFlash2DraftModel.from_pretrained(str(tmp_path))  # theirs loads it
  ours, theirs = reloaded.state_dict(), model.state_dict()
  for name, x in theirs.items():
    assert torch.equal(ours[name], x), name


# ---- training on the template corpus ----

@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  from conftest import train_block_drafter
  return train_block_drafter(tiny_run, "dflash2_tiny.py", tmp_path_factory.mktemp("dflash2_run"),
                             template_corpus_dir, tfds_dir, regen_sequences=96, num_steps=80,
                             log_every=20, eval_every=80, save_every=80, block_size=4,
                             selector_rank=16)


def test_training_lowers_selector_loss_and_raises_block_acceptance(trained):
  with open(os.path.join(trained, "dflash2", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if '"val_loss"' in l]
  first, last = rows[0], rows[-1]
  print({k: (round(first[k], 3), round(last[k], 3)) for k in first if k.startswith("val_")})
  assert first["step"] == 0 and last["step"] == 80
  assert last["val_selector_loss"] < first["val_selector_loss"] - 0.5
  assert last["val_kl"] < first["val_kl"]
  assert last["val_block_tau"] > first["val_block_tau"] + 0.5
  assert last["val_topk"] >= last["val_top1"]


def test_trained_dflash2_through_the_harness(trained, tmp_path):
  from specjax import evaluate
  from test_decode import decode_config
  prompts = tmp_path / "template_prompts.jsonl"  # in-distribution for the tiny target
  prompts.write_text("".join(
      json.dumps({"prompt": f"def {n}_{a}{b}(x):\n    return x * {a} + {b}\n\ndef {m}_"}) + "\n"
      for n, m, a, b in [("alpha", "beta", 1, 2), ("omega", "sigma", 5, 6)]))
  cfg = decode_config(trained, tmp_path, methods="dflash2", block_size=4, prompts=str(prompts),
                      max_new_tokens=24)
  report = evaluate.evaluate(cfg)["methods"]["dflash2"]
  assert report["lossless_check"] is True and report["block_size"] == 4
  print(f"dflash2 through the harness: tau {report['tau']:.2f}")
  assert report["tau"] > 1.5
