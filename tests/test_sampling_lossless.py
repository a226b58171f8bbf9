"""Sampling is lossless: on an 8-token vocabulary, the distribution of each of the first
five generated tokens matches the target's exact marginal, whatever the drafter. With K = 2
drafts and 5 tokens, steps that accept every draft (and so emit the bonus token) are part of
what is checked. Broken verifiers fail the same test.

Tolerance: total variation < 0.04 per position with N = 6000 samples (the expected TV of an
exact sampler is about 0.015 here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import broken_verifiers
from decoding_helpers import perturbed, run_ar, run_spec, tiny_model
from specjax.sampling import Sampler
from specjax.drafters.dflash import DFlashDrafter, DFlashModel
from specjax.drafters.dflash2 import DFlash2Drafter, dflash2_model
from specjax.drafters.draft_model import DraftModelDrafter
from specjax.drafters.eagle3 import Eagle3Drafter, Eagle3Model
from specjax.drafters.dspark import DSparkDrafter, dspark_model
from specjax.drafters.mtp_parallel import MTPParallelDrafter, ParallelHeads
from specjax.drafters.mtp_sequential import MTPSequentialDrafter, SequentialModules
from specjax.drafters.prompt_lookup import PromptLookupDrafter

V, N, TOL = 8, 6000, 0.04
K, STEPS = 2, 5  # STEPS > K + 1: all-accepted steps and their bonus tokens are checked
PROMPT = [3, 5, 3]


@pytest.fixture(scope="module")
def target():
  return tiny_model(V, seed=3)  # marginals with real spread (max prob ~0.3)


def exact_marginals(graphdef, params, sampler, steps=STEPS):
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


def empirical(result, steps=STEPS):
  tokens = np.asarray(result.tokens_BxN)[:, :steps]
  return [np.bincount(tokens[:, t], minlength=V) / len(tokens) for t in range(steps)]


def tv(a, b):
  return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum()


SAMPLERS = [Sampler(1.0), Sampler(0.8, top_k=5, top_p=0.9)]
WITH_TOP_K_TOP_P = ("draft_model", "target_itself", "mtp_sequential", "dflash_sample",
                    "dflash2", "prompt_lookup", "eagle3_draft_vocab")


def drafters(target):
  """Every drafter kind at K = 2: full-q proposals (draft model, sequential MTP, whose q
  depends on the drafts before it; parallel MTP and DFlash drawing each draft from its own
  q_k) and one-hot proposals (prompt lookup; parallel MTP and DFlash proposing argmax)."""
  g, p = target
  cfg = nnx.merge(g, p).cfg
  dg, dp = tiny_model(V, seed=1, layers=1, d=16)
  bg, bp = tiny_model(V, seed=2, layers=1, d=16, logit_scale=30.0)  # confident and wrong
  hg, hp = nnx.split(ParallelHeads(cfg.d_model, K, rngs=nnx.Rngs(4)), nnx.Param)
  sg, sp = nnx.split(SequentialModules(cfg, K, rngs=nnx.Rngs(5)), nnx.Param)
  fg, fp = nnx.split(DFlashModel(cfg, 1, 2, rngs=nnx.Rngs(6)), nnx.Param)
  mg, mp = nnx.split(DFlashModel(cfg, 1, 2, rngs=nnx.Rngs(6), mask_token_id=V - 1), nnx.Param)
  # DFlash 2: q is the selector's distribution over its top-3 candidates (0 elsewhere)
  tg, tp = nnx.split(dflash2_model(cfg, 1, 2, rngs=nnx.Rngs(8), mask_token_id=V - 1,
                                   selector_rank=4, selector_top_k=3), nnx.Param)
  # DSpark: Markov walk with a non-zero transition (q_j depends on draft j-1) and confidences
  # that vary, so the threshold schedule verifies 0, 1 or 2 drafts
  kg, kp = nnx.split(dspark_model(cfg, 1, 2, 4, rngs=nnx.Rngs(8)), nnx.Param)
  kp = perturbed(kp, 9, 0.5)
  # EAGLE-3 on a 6-token draft vocabulary: q is zero on the 2 tokens outside it, and each
  # chained draft's q depends on the draft before it
  eg, ep = nnx.split(Eagle3Model(cfg, 1, 2, rngs=nnx.Rngs(10), norm_before_fc=True,
                                 norm_output=True), nnx.Param)
  ep = {"model": perturbed(ep, 11, 0.3), "vocab": jnp.asarray([0, 1, 3, 4, 6, 7], jnp.int32)}
  return {
      "draft_model": (DraftModelDrafter(K, graphdef=dg), dp),
      "bad_drafter": (DraftModelDrafter(K, graphdef=bg), bp),
      "target_itself": (DraftModelDrafter(K, graphdef=g), p),  # accepts all: bonus every step
      "prompt_lookup": (PromptLookupDrafter(K), None),
      "mtp_parallel_argmax": (MTPParallelDrafter(K, graphdef=hg, proposal="argmax"),
                              perturbed(hp, 7, 0.3)),
      "mtp_parallel_sample": (MTPParallelDrafter(K, graphdef=hg, proposal="sample"),
                              perturbed(hp, 7, 0.3)),
      "mtp_sequential": (MTPSequentialDrafter(K, graphdef=sg, target_layers=cfg.num_layers),
                         sp),
      "dflash_argmax": (DFlashDrafter(K, graphdef=fg, target_feature_layers=(1, 2),
                                      proposal="argmax"), fp),
      "dflash_sample": (DFlashDrafter(K, graphdef=mg, target_feature_layers=(1, 2),
                                      proposal="sample"), mp),  # mask = a token's embedding
      "dflash2": (DFlash2Drafter(K, graphdef=tg, target_feature_layers=(1, 2)),
                  perturbed(tp, 9, 0.3)),
      "dspark": (DSparkDrafter(K, graphdef=kg, target_feature_layers=(1, 2)), kp),
      "eagle3_draft_vocab": (Eagle3Drafter(K, graphdef=eg, target_feature_layers=(1, 2)), ep),
      "dspark_threshold": (DSparkDrafter(K, graphdef=kg, target_feature_layers=(1, 2),
                                         schedule="threshold", threshold=0.35), kp),
  }


def worst_tv(target, drafter, dp, sampler, exact, seed=2, sampling_verifier=None):
  g, p = target
  result = run_spec(g, p, drafter, dp, [PROMPT] * N, STEPS, sampler=sampler, cache_len=16,
                    eos=-1, seed=seed, sampling_verifier=sampling_verifier)
  return max(tv(e, x) for e, x in zip(empirical(result), exact)), result


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["t1", "t0.8_k5_p0.9"])
def test_ar_sampling_matches_exact_distribution(target, sampler):
  g, p = target
  exact = exact_marginals(g, p, sampler)
  result = run_ar(g, p, [PROMPT] * N, STEPS, sampler=sampler, cache_len=16, eos=-1, seed=1)
  for t, (e, x) in enumerate(zip(empirical(result), exact)):
    assert tv(e, x) < TOL, (t, tv(e, x))


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["t1", "t0.8_k5_p0.9"])
def test_speculative_sampling_matches_exact_distribution(target, sampler):
  g, p = target
  exact = exact_marginals(g, p, sampler)
  assert max(m.max() for m in exact) < 0.7  # a spread distribution, not a trivial one
  for name, (drafter, dp) in drafters(target).items():
    if sampler is not SAMPLERS[0] and name not in WITH_TOP_K_TOP_P:
      continue  # the processed-p path is the same for every drafter: a few check it
    worst, result = worst_tv(target, drafter, dp, sampler, exact)
    assert worst < TOL, (name, worst)
    counts = np.asarray(result.accept_counts)
    if name == "target_itself":  # every step accepted both drafts and emitted a bonus
      assert counts[:K].sum() == 0 and counts[K] > 0
    if name == "dflash2":  # steps that accept every draft (the bonus token) are covered
      assert counts[K] > 0, counts
    if name == "dspark":  # steps that accepted the whole Markov walk emitted the bonus
      assert counts[K] > 0, counts
    if name == "dspark_threshold":  # budgets below K were used: their bonus is checked too
      budgets = np.asarray(result.budget_counts)
      assert budgets[:K].sum() > 0 and budgets[K] > 0, budgets


@pytest.mark.parametrize("broken, drafter_name", [
    ("accept_everything", "bad_drafter"),
    ("bonus_argmax", "target_itself"),
    ("residual_unclipped", "draft_model"),
])  # q ignored is not here: the one-hot rule is lossless for any proposal (it only accepts
#     less), so only the acceptance-rate check of tests/test_verify.py can catch it
def test_broken_verifier_fails_the_end_to_end_test(target, broken, drafter_name):
  sampler = SAMPLERS[0]
  exact = exact_marginals(*target, sampler)
  drafter, dp = drafters(target)[drafter_name]
  worst, _ = worst_tv(target, drafter, dp, sampler, exact,
                      sampling_verifier=broken_verifiers.BROKEN[broken])
  assert worst > 2 * TOL, (broken, worst)
