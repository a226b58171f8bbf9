"""Greedy speculative decoding equals AR, token for token; the caches roll back exactly."""

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
  assert np.all(end_spec >= end_ar)  # spec may commit past max_new before truncating
  for layer_ar, layer_spec in zip(ar.cache.layers, spec.cache.layers):
    for a, s in ((layer_ar.k_BxSxKxH, layer_spec.k_BxSxKxH),
                 (layer_ar.v_BxSxKxH, layer_spec.v_BxSxKxH)):
      for b, end in enumerate(end_ar):
        np.testing.assert_allclose(np.asarray(s[b, :end]), np.asarray(a[b, :end]), atol=2e-5)


def test_prompt_lookup_copies_the_continuation_of_a_repeated_ngram():
  import jax.numpy as jnp
  from specjax.drafters.base import Context
  seq = jnp.array([[5, 6, 7, 8, 9, 5, 6, 0, 0, 0],
                   [1, 2, 3, 4, 5, 6, 7, 0, 0, 0]])
  end = jnp.array([6, 6])  # committed: seq[:7]; pending = seq[6]
  drafter = PromptLookupDrafter(3)
  drafts, q, _ = drafter.propose(None, None, (), Context(seq, end, seq[:, 6]), None, None)
  assert q is None
  assert drafts[0].tolist() == [7, 8, 9]  # "5 6" occurred before, followed by 7 8 9
  assert drafts[1].tolist() == [7, 7, 7]  # no earlier occurrence: repeat pending
