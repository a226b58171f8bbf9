"""The accounting model: prefix products, closed form, and agreement with measurement."""

import math

import numpy as np
import pytest

from specjax import accounting
from decoding_helpers import random_prompts, run_spec, tiny_model
from specjax.drafters.draft_model import DraftModelDrafter


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 0.99, 1.0])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_closed_form_matches_prefix_product_sum(a, k):
  assert accounting.expected_tokens_constant(a, k) == pytest.approx(
      accounting.expected_tokens([a] * k))


def test_late_positions_are_worth_little_when_early_ones_are_weak():
  # the same per-position errors cost more early than late (suffix decay is cheap)
  early_weak = accounting.expected_tokens([0.5, 0.9, 0.9, 0.9])
  late_weak = accounting.expected_tokens([0.9, 0.9, 0.9, 0.5])
  assert late_weak > early_weak + 0.5


def test_acceptance_from_histogram():
  # 10 steps: m = 0 (x2), 1 (x3), 2 (x5) with K = 2
  a = accounting.acceptance_from_counts([2, 3, 5])
  assert a == pytest.approx([8 / 10, 5 / 8])
  assert accounting.measured_tau([2, 3, 5]) == pytest.approx((2 * 1 + 3 * 2 + 5 * 3) / 10)
  assert math.isnan(accounting.acceptance_from_counts([4, 0, 0])[1])


def test_simulated_verification_agrees_with_formula():
  """Steps whose drafts pass independently with known a_k: measured tau -> formula."""
  rng = np.random.default_rng(0)
  a_true = [0.9, 0.7, 0.6, 0.4]
  passes = rng.random((200_000, 4)) < np.asarray(a_true)
  m = np.cumprod(passes, axis=1).sum(1)
  counts = np.bincount(m, minlength=5)
  assert accounting.measured_tau(counts) == pytest.approx(accounting.expected_tokens(a_true),
                                                          abs=0.01)
  assert accounting.acceptance_from_counts(counts) == pytest.approx(a_true, abs=0.01)


def test_decode_run_tau_agrees_with_tau_from_measured_acceptance():
  g, p = tiny_model(61, seed=0)
  dg, dp = tiny_model(61, seed=0, layers=2, d=32)
  # a drafter equal to the target but with perturbed weights: partial acceptance
  import jax
  dp = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), dp)
  result = run_spec(g, p, DraftModelDrafter(4, graphdef=dg), dp,
                    random_prompts(16, 61, seed=4), 40, eos=-1)
  counts = np.asarray(result.accept_counts)
  a = accounting.acceptance_from_counts(counts)
  assert 0.05 < a[0] < 0.999
  assert accounting.measured_tau(counts) == pytest.approx(accounting.expected_tokens(a))
  steps = int(np.asarray(result.verify_steps_B).sum())
  assert counts.sum() == steps


def test_predicted_speedup_and_best_k():
  assert accounting.predicted_speedup(3.0, 1.0, 0.5, 1.0) == pytest.approx(2.0)
  # verify cost flat to n = 5 then steep: the best K stops there
  t_verify = [1.0] * 6 + [5.0] * 10
  k, s = accounting.best_num_drafts([0.8] * 12, 1.0, 0.05, t_verify)
  assert k == 5 and s > 1
