"""Sampling is lossless: on an 8-token vocabulary, the distribution of each of the first
three generated tokens matches the target's exact marginal, whatever the drafter; a broken
verifier that accepts everything fails the same test.

Tolerance: total variation < 0.04 per position with N = 6000 samples (the expected TV of an
exact sampler is about 0.015 here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from decoding_helpers import run_ar, run_spec, tiny_model
from specjax.decoding import speculative
from specjax.decoding.sampling import Sampler
from specjax.drafters.draft_model import DraftModelDrafter
from specjax.drafters.prompt_lookup import PromptLookupDrafter

V, N, TOL = 8, 6000, 0.04
PROMPT = [3, 5, 3]


@pytest.fixture(scope="module")
def target():
  return tiny_model(V, seed=3)  # marginals with real spread (max prob ~0.3)


def exact_marginals(graphdef, params, sampler, steps=3):
  """P(x_t = v) for t = 1..steps, by enumerating every prefix (V^(steps-1) of them)."""
  model = nnx.merge(graphdef, params)
  marginals = []
  prefix_prob = {(): 1.0}
  for _ in range(steps):
    prefixes = list(prefix_prob)
    tokens = jnp.asarray([PROMPT + list(pre) for pre in prefixes])
    probs = np.asarray(sampler.probs(model(tokens).logits_BxTxV[:, -1]), np.float64)
    marginal = np.zeros(V)
    nxt = {}
    for pre, row in zip(prefixes, probs):
      marginal += prefix_prob[pre] * row
      for v in range(V):
        nxt[pre + (v,)] = prefix_prob[pre] * row[v]
    marginals.append(marginal)
    prefix_prob = nxt
  return marginals


def empirical(result, steps=3):
  tokens = np.asarray(result.tokens_BxN)[:, :steps]
  return [np.bincount(tokens[:, t], minlength=V) / len(tokens) for t in range(steps)]


def tv(a, b):
  return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum()


SAMPLERS = [Sampler(1.0), Sampler(0.8, top_k=5, top_p=0.9)]


def drafters(target):
  g, p = target
  dg, dp = tiny_model(V, seed=1, layers=1, d=16)
  bg, bp = tiny_model(V, seed=2, layers=1, d=16, logit_scale=30.0)  # confident and wrong
  return {
      "draft_model": (DraftModelDrafter(2, graphdef=dg), dp),
      "bad_drafter": (DraftModelDrafter(2, graphdef=bg), bp),
      "target_itself": (DraftModelDrafter(2, graphdef=g), p),
      "prompt_lookup": (PromptLookupDrafter(2), None),  # one-hot proposals
  }


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["t1", "t0.8_k5_p0.9"])
def test_ar_sampling_matches_exact_distribution(target, sampler):
  g, p = target
  exact = exact_marginals(g, p, sampler)
  result = run_ar(g, p, [PROMPT] * N, 3, sampler=sampler, cache_len=16, eos=-1, seed=1)
  for t, (e, x) in enumerate(zip(empirical(result), exact)):
    assert tv(e, x) < TOL, (t, tv(e, x))


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["t1", "t0.8_k5_p0.9"])
def test_speculative_sampling_matches_exact_distribution(target, sampler):
  g, p = target
  exact = exact_marginals(g, p, sampler)
  assert max(m.max() for m in exact) < 0.7  # a spread distribution, not a trivial one
  for name, (drafter, dp) in drafters(target).items():
    result = run_spec(g, p, drafter, dp, [PROMPT] * N, 3, sampler=sampler, cache_len=16,
                      eos=-1, seed=2)
    for t, (e, x) in enumerate(zip(empirical(result), exact)):
      assert tv(e, x) < TOL, (name, t, tv(e, x))


def test_broken_verifier_that_accepts_everything_fails(target, monkeypatch):
  g, p = target
  sampler = SAMPLERS[0]
  exact = exact_marginals(g, p, sampler)

  def accept_all(p_BxK1xV, drafts_BxK, q, rng):
    k = drafts_BxK.shape[1]
    nxt = jax.random.categorical(rng, jnp.log(p_BxK1xV[:, k]), axis=-1)
    return jnp.full(drafts_BxK.shape[:1], k, jnp.int32), nxt.astype(jnp.int32)

  monkeypatch.setattr(speculative, "verify_sampling", accept_all)
  jax.clear_caches()
  drafter, dp = drafters(target)["bad_drafter"]
  result = run_spec(g, p, drafter, dp, [PROMPT] * N, 3, sampler=sampler, cache_len=16,
                    eos=-1, seed=2)
  worst = max(tv(e, x) for e, x in zip(empirical(result), exact))
  jax.clear_caches()
  assert worst > 3 * TOL


STEPS = 5  # > K + 1: steps that accept every draft and add the bonus token are checked too


def sampled_q_drafters():
  """DFlash and parallel MTP drawing each draft from its own q_k (verified with q)."""
  from specjax.drafters.dflash import DFlashDrafter, DFlashModel
  from specjax.drafters.mtp_parallel import MTPParallelDrafter, ParallelHeads
  g, _ = tiny_model(V, seed=3)
  cfg = nnx.merge(g, _).cfg
  dg, dp = nnx.split(DFlashModel(cfg, 1, 2, rngs=nnx.Rngs(1), mask_token_id=V - 1), nnx.Param)
  heads = ParallelHeads(cfg.d_model, 2, rngs=nnx.Rngs(2))
  hg, hp = nnx.split(heads, nnx.Param)
  hp = jax.tree.map(lambda w: 0.3 * jax.random.normal(jax.random.key(7), w.shape), hp)
  return {
      "dflash": (DFlashDrafter(2, graphdef=dg, target_feature_layers=(1, 2),
                               proposal="sample"), dp),
      "mtp_parallel": (MTPParallelDrafter(2, graphdef=hg, proposal="sample"), hp),
  }


@pytest.mark.parametrize("name", ["dflash", "mtp_parallel"])
@pytest.mark.parametrize("sampler", SAMPLERS, ids=["t1", "t0.8_k5_p0.9"])
def test_sampled_q_proposals_match_exact_distribution(target, sampler, name):
  g, p = target
  exact = exact_marginals(g, p, sampler, steps=STEPS)
  drafter, dp = sampled_q_drafters()[name]
  result = run_spec(g, p, drafter, dp, [PROMPT] * N, STEPS, sampler=sampler, cache_len=16,
                    eos=-1, seed=5)
  assert int(result.accept_counts[-1]) > N // 20  # every draft accepted, then the bonus
  for t, (e, x) in enumerate(zip(empirical(result, STEPS), exact)):
    assert tv(e, x) < TOL, (name, t, tv(e, x))
