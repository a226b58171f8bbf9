"""Greedy speculative decoding equals AR, token for token; the caches roll back exactly."""

import jax.numpy as jnp
import numpy as np
import pytest

from decoding_helpers import random_prompts, run_ar, run_spec, tiny_model, to_lists
from specjax.drafters.draft_model import DraftModelDrafter
from specjax.drafters.prompt_lookup import PromptLookupDrafter

VOCAB = 61


@pytest.fixture(scope="module")
def models():
  target = tiny_model(VOCAB, seed=0)
  draft = tiny_model(VOCAB, seed=1, layers=1, d=16)
  return target, draft


def drafters(k, models):
  (g, p), (dg, dp) = models
  return {
      "prompt_lookup": (PromptLookupDrafter(k), None),
      "draft": (DraftModelDrafter(k, graphdef=dg), dp),
      "self_draft": (DraftModelDrafter(k, graphdef=g), p),  # the target drafting for itself
  }


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_equals_ar(models, k, batch):
  (g, p), _ = models
  prompts = random_prompts(8, VOCAB, seed=k + batch)
  # repeated phrases give prompt lookup something to accept
  prompts[1] = prompts[1][:3] * 4
  for name, (drafter, dp) in drafters(k, models).items():
    for i in range(0, len(prompts), batch):
      chunk = prompts[i:i + batch]
      ar = to_lists(run_ar(g, p, chunk, 20), 0)
      spec = run_spec(g, p, drafter, dp, chunk, 20)
      assert to_lists(spec, 0) == ar, (name, i)


def test_self_drafting_accepts_every_draft(models):
  (g, p), _ = models
  k = 4
  drafter, dp = drafters(k, models)["self_draft"]
  result = run_spec(g, p, drafter, dp, random_prompts(4, VOCAB, seed=3), 21, eos=-1)
  counts = np.asarray(result.accept_counts)
  assert counts[:k].sum() == 0 and counts[k] > 0  # every step accepted all K drafts
  assert int(result.target_calls) == 1 + 20 // (k + 1)


def test_random_drafter_is_mostly_rejected_but_still_exact(models):
  (g, p), (dg, dp) = models
  prompts = random_prompts(4, VOCAB, seed=9)
  result = run_spec(g, p, DraftModelDrafter(4, graphdef=dg), dp, prompts, 16)
  counts = np.asarray(result.accept_counts)
  assert counts[0] > counts[1:].sum()  # rejections dominate
  assert to_lists(result, 0) == to_lists(run_ar(g, p, prompts, 16), 0)


def test_target_cache_after_rejections_equals_ar_cache(models):
  (g, p), (dg, dp) = models
  prompts = random_prompts(4, VOCAB, seed=5, min_len=3)
  ar = run_ar(g, p, prompts, 16, eos=-1, keep_cache=True)
  spec = run_spec(g, p, DraftModelDrafter(4, graphdef=dg), dp, prompts, 16, eos=-1,
                  keep_cache=True)
  assert np.asarray(spec.accept_counts)[0] > 0  # there were rejected blocks
  end_ar, end_spec = np.asarray(ar.cache.end_B), np.asarray(spec.cache.end_B)
  np.testing.assert_array_equal(end_spec, end_ar)  # only what was committed is kept
  for layer_ar, layer_spec in zip(ar.cache.layers, spec.cache.layers):
    for a, s in ((layer_ar.k_BxSxKVxH, layer_spec.k_BxSxKVxH),
                 (layer_ar.v_BxSxKVxH, layer_spec.v_BxSxKVxH)):
      for b, end in enumerate(end_ar):
        np.testing.assert_allclose(np.asarray(s[b, :end]), np.asarray(a[b, :end]), atol=2e-5)


def test_prompt_lookup_copies_the_continuation_of_a_repeated_ngram():
  import jax.numpy as jnp
  from specjax.drafters.base import Context
  seq = jnp.array([[5, 6, 7, 8, 9, 5, 6, 0, 0, 0],
                   [1, 2, 3, 4, 5, 6, 7, 0, 0, 0]])
  end = jnp.array([6, 6])  # committed: seq[:7]; pending = seq[6]
  drafter = PromptLookupDrafter(3)
  drafts, q, budget = drafter.propose(None, None, (), Context(seq, end, seq[:, 6]), None, None)
  assert q is None
  assert drafts[0].tolist() == [7, 8, 9]  # "5 6" occurred before, followed by 7 8 9
  assert drafts[1].tolist() == [7, 7, 7]  # no earlier occurrence: repeat pending
  # only real continuations are verified: all 3 drafts of row 0, none of row 1
  assert budget.tolist() == [3, 0]
  assert drafter.verify_budget(None, budget, None).tolist() == [3, 0]
  # a continuation shorter than K: "4" recurs at 0, followed by 9 4 only
  seq = jnp.array([[4, 9, 4, 0, 0]])
  drafts, _, budget = drafter.propose(None, None, (), Context(seq, jnp.array([2]), seq[:, 2]),
                                      None, None)
  assert drafts[0].tolist()[:2] == [9, 4] and budget.tolist() == [2]


@pytest.mark.parametrize("batch", [1, 3])
def test_prompt_lookup_verifies_one_token_when_nothing_recurs(models, batch):
  """Steps with no recurring n-gram run the one-token pass (width 0), the others width K, and
  the output still equals AR's."""
  (g, p), _ = models
  k = 4
  prompts = random_prompts(6, VOCAB, seed=11)
  prompts[0] = prompts[0][:3] * 4
  widths = np.zeros(k + 1, int)
  for i in range(0, len(prompts), batch):
    chunk = prompts[i:i + batch]
    spec = run_spec(g, p, PromptLookupDrafter(k), None, chunk, 24)
    assert to_lists(spec, 0) == to_lists(run_ar(g, p, chunk, 24), 0)
    widths += np.asarray(spec.width_counts)
    # every step ran exactly one verify pass, at one of the compiled widths (0, 1, 2, 4)
    assert np.asarray(spec.width_counts).sum() == int(spec.target_calls) - 1
  assert widths[0] > 0 and widths[k] > 0, widths
  assert widths[3] == 0  # 3 is not compiled: a budget of 3 runs width 4


def test_verify_at_width_is_the_plain_pass_at_that_width(models):
  """Each compiled width gives the logits and cache of a plain pass over its w + 1 positions
  (the budget picks the smallest width that holds it); the cache of the other widths is not
  touched."""
  import jax
  from flax import nnx
  from specjax.decoding.schedule import verify_at_width
  (g, p), _ = models
  target = nnx.merge(g, p)
  prompt = jnp.array([[3, 5, 7, 9, 11, 13]], jnp.int32)
  pre = target(prompt, cache=target.init_cache(1, 32))
  window = jnp.array([[4, 8, 15, 16, 23]], jnp.int32)
  widths = (0, 1, 2, 4)
  run = jax.jit(lambda need: verify_at_width(target, window, pre.cache, widths, need))
  for need, expect in ((0, 0), (1, 1), (2, 2), (3, 4), (4, 4)):
    out, w = run(jnp.int32(need))
    assert int(w) == expect
    plain = target(window[:, :expect + 1], cache=pre.cache)
    np.testing.assert_allclose(np.asarray(out.logits_BxTxV[:, :expect + 1]),
                               np.asarray(plain.logits_BxTxV), atol=1e-5)
    assert int(out.cache.end_B[0]) == 6 + expect + 1
    for a, b in zip(out.cache.layers, plain.cache.layers):
      np.testing.assert_allclose(np.asarray(a.k_BxSxKVxH), np.asarray(b.k_BxSxKVxH), atol=1e-5)


def test_draft_model_cache_rolls_back_at_every_position(models):
  """Proposals after rejections at every position 0..K equal the draft model's own greedy
  continuation of the committed text, recomputed without a cache."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from decoding_helpers import drive_drafter
  (g, p), (dg, dp) = models
  k = 3

  def reference(target, params, seq_BxS, end_B):
    draft = nnx.merge(dg, params)
    seq, drafts = seq_BxS, []
    for j in range(k):
      logits = draft(seq).logits_BxTxV  # causal: positions <= end + j are exact
      d = jnp.argmax(jnp.take_along_axis(logits, (end_B + j)[:, None, None], 1)[:, 0], -1)
      drafts.append(d.astype(jnp.int32))
      seq = jax.vmap(lambda row, e, v: row.at[e + j + 1].set(v))(seq, end_B, drafts[-1])
    return jnp.stack(drafts, 1)

  accepted = drive_drafter(g, p, DraftModelDrafter(k, graphdef=dg), dp,
                           random_prompts(3, VOCAB, seed=4, min_len=2), 10, reference,
                           cache_len=64, accept_schedule=[0, 1, 2, 3, 2, 0, 3, 1, 1, 0])
  assert set(accepted.ravel().tolist()) == {0, 1, 2, 3}


class RowOracleDrafter(DraftModelDrafter):
  """Drafts the target's own tokens for row 0 and garbage for the other rows (greedy), so
  row 0 races ahead and finishes while the others are still decoding."""

  def propose(self, params, target, state, ctx, sampler, rng):
    import jax.numpy as jnp
    drafts, q, state = super().propose(params, target, state, ctx, sampler, rng)
    garbage = (drafts + 1) % VOCAB
    return jnp.where(jnp.arange(drafts.shape[0])[:, None] == 0, drafts, garbage), q, state


@pytest.mark.parametrize("eos", [-1, "early"])
def test_rows_that_finish_early_keep_exactly_their_committed_cache(models, eos):
  """Row 0 (the longest prompt, in a cache sized exactly to fit it) commits K + 1 tokens a
  step and is cut short by max_new_tokens (or EOS); the other rows go on. Its cache must end
  where AR's does and hold the same K/V: a finished row never writes past the cache."""
  (g, p), _ = models
  k, max_new = 4, 8
  prompts = random_prompts(3, VOCAB, seed=21, min_len=5, max_len=5)
  prompts[0] = prompts[0] + [7, 9]  # the longest row
  cache_len = len(prompts[0]) + max_new + k + 1
  if eos == "early":  # row 0 stops on a token it generates mid-step
    eos = to_lists(run_ar(g, p, prompts, max_new, eos=-1), -1)[0][3]
  ar = run_ar(g, p, prompts, max_new, eos=eos, keep_cache=True, cache_len=cache_len)
  spec = run_spec(g, p, RowOracleDrafter(k, graphdef=g), p, prompts, max_new, eos=eos,
                  keep_cache=True, cache_len=cache_len)
  assert to_lists(spec, eos) == to_lists(ar, eos)
  np.testing.assert_array_equal(np.asarray(spec.cache.end_B), np.asarray(ar.cache.end_B))
  for layer_ar, layer_spec in zip(ar.cache.layers, spec.cache.layers):
    for b, end in enumerate(np.asarray(ar.cache.end_B)):
      np.testing.assert_allclose(np.asarray(layer_spec.k_BxSxKVxH[b, :end]),
                                 np.asarray(layer_ar.k_BxSxKVxH[b, :end]), atol=2e-5)


def test_decoders_refuse_rows_that_do_not_fit_the_cache(models):
  from specjax.errors import SpecjaxError
  (g, p), (dg, dp) = models
  prompts = [[5] * 10]
  with pytest.raises(SpecjaxError, match="raise --config.cache_len"):
    run_ar(g, p, prompts, 20, cache_len=30)  # 10 + 20 + 1 > 30
  run_ar(g, p, prompts, 19, cache_len=30)
  with pytest.raises(SpecjaxError, match="with max_new_tokens=16 and 4 draft tokens"):
    run_spec(g, p, DraftModelDrafter(4, graphdef=dg), dp, prompts, 16, cache_len=30)
  with pytest.raises(SpecjaxError, match="padded to 16 tokens do not fit cache_len=12"):
    run_ar(g, p, [[5]], 2, cache_len=12)


def test_zero_draft_tokens_is_a_clear_error(models):
  from specjax.errors import SpecjaxError
  _, (dg, _) = models
  with pytest.raises(SpecjaxError, match="num_draft_tokens must be >= 1, got 0"):
    DraftModelDrafter(0, graphdef=dg)
  with pytest.raises(SpecjaxError, match="num_draft_tokens must be >= 1"):
    PromptLookupDrafter(0)


def test_bf16_speculative_decoding_equals_bf16_ar():
  """Parameters and activations in bfloat16 (logits accumulated in float32): the draft
  model's greedy output equals the bf16 AR baseline's."""
  import dataclasses

  from flax import nnx

  from specjax.models import Transformer

  def bf16(seed, layers, d):
    g, params = tiny_model(VOCAB, seed=seed, layers=layers, d=d)
    cfg = dataclasses.replace(nnx.merge(g, params).cfg, dtype="bfloat16",
                              param_dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    return nnx.split(model, nnx.Param)

  g, p = bf16(0, 2, 32)
  dg, dp = bf16(0, 2, 32)  # the target drafting for itself: long accepted runs
  rg, rp = bf16(1, 1, 16)  # a random drafter: rejections everywhere
  assert nnx.merge(g, p).embedding[...].dtype == jnp.bfloat16
  prompts = random_prompts(8, VOCAB, seed=31)
  ar = to_lists(run_ar(g, p, prompts, 24), 0)
  for drafter, dparams in ((DraftModelDrafter(4, graphdef=dg), dp),
                           (DraftModelDrafter(4, graphdef=rg), rp)):
    spec = run_spec(g, p, drafter, dparams, prompts, 24)
    assert to_lists(spec, 0) == ar
