"""Verification rules (SPEC section 2) on hand-built logits and probabilities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import broken_verifiers

from specjax.decoding.verify import verify_greedy, verify_sampling

V = 6


def logits_for(argmaxes):
  """[B, K+1, V] logits whose argmax at each position is the given token."""
  return jax.nn.one_hot(jnp.asarray(argmaxes), V) * 5.0


def test_greedy_all_accepted_takes_the_bonus_token():
  m, nxt = verify_greedy(logits_for([[1, 2, 3, 4]]), jnp.array([[1, 2, 3]]))
  assert m.tolist() == [3] and nxt.tolist() == [4]


def test_greedy_first_draft_rejected_emits_the_correction():
  m, nxt = verify_greedy(logits_for([[1, 2, 3, 4]]), jnp.array([[5, 2, 3]]))
  assert m.tolist() == [0] and nxt.tolist() == [1]


def test_greedy_rejection_at_the_last_position():
  m, nxt = verify_greedy(logits_for([[1, 2, 3, 4]]), jnp.array([[1, 2, 0]]))
  assert m.tolist() == [2] and nxt.tolist() == [3]


def test_greedy_stops_at_first_mismatch_even_if_later_drafts_match():
  m, nxt = verify_greedy(logits_for([[1, 2, 3, 4]]), jnp.array([[1, 0, 3]]))
  assert m.tolist() == [1] and nxt.tolist() == [2]


def test_greedy_rows_are_independent():
  logits = logits_for([[1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]])
  drafts = jnp.array([[1, 2, 3], [1, 5, 3], [1, 1, 1]])
  m, nxt = verify_greedy(logits, drafts)
  assert m.tolist() == [3, 1, 0] and nxt.tolist() == [4, 2, 0]


def test_sampling_accepts_drafts_the_target_is_certain_of():
  p = jax.nn.one_hot(jnp.array([[1, 2, 3, 4]]), V)
  m, nxt = verify_sampling(p, jnp.array([[1, 2, 3]]), None, jax.random.key(0))
  assert m.tolist() == [3] and nxt.tolist() == [4]
  m, nxt = verify_sampling(p, jnp.array([[1, 0, 3]]), None, jax.random.key(0))
  assert m.tolist() == [1] and nxt.tolist() == [2]


def test_sampling_rejected_one_hot_draft_is_never_emitted():
  """On rejection the residual is p with the draft removed: the draft cannot come back."""
  p = jnp.full((4000, 2, V), 1.0 / V)
  drafts = jnp.full((4000, 1), 2)
  m, nxt = verify_sampling(p, drafts, None, jax.random.key(1))
  m, nxt = np.asarray(m), np.asarray(nxt)
  assert abs(m.mean() - 1 / V) < 0.03  # accepted with probability p(d)
  assert not np.any(nxt[m == 0] == 2)


def test_sampling_full_q_single_position_is_exactly_p():
  """One draft from q, then accept/resample: the committed token is distributed as p."""
  p1 = jnp.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
  q1 = jnp.array([0.05, 0.05, 0.1, 0.1, 0.2, 0.5])
  n = 20000
  k1, k2 = jax.random.split(jax.random.key(2))
  drafts = jax.random.categorical(k1, jnp.log(q1), shape=(n, 1))
  p = jnp.broadcast_to(p1, (n, 2, V))
  q = jnp.broadcast_to(q1, (n, 1, V))
  m, nxt = verify_sampling(p, drafts, q, k2)
  first = np.where(np.asarray(m) == 1, np.asarray(drafts[:, 0]), np.asarray(nxt))
  freq = np.bincount(first, minlength=V) / n
  assert 0.5 * np.abs(freq - np.asarray(p1)).sum() < 0.02


def test_sampling_identical_p_and_q_accepts_everything():
  p = jnp.broadcast_to(jnp.array([0.3, 0.3, 0.2, 0.1, 0.05, 0.05]), (500, 3, V))
  drafts = jax.random.categorical(jax.random.key(3), jnp.log(p[:, :2]), axis=-1)
  m, _ = verify_sampling(p, drafts, p[:, :2], jax.random.key(4))
  assert np.all(np.asarray(m) == 2)


N = 20000
TOL = 0.02  # total variation; an exact sampler's expected TV is about 0.006 at V=6, N=20000
A = jnp.array([0.3, 0.3, 0.2, 0.1, 0.05, 0.05])  # what the first draft comes from (p = q)
P1 = jnp.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])  # the target at the second draft
Q1 = jnp.array([0.1, 0.1, 0.4, 0.2, 0.1, 0.1])  # the drafter at the second draft
BONUS = jnp.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.2])  # the target after both drafts


def frequencies(tokens):
  return np.bincount(np.asarray(tokens), minlength=V) / len(tokens)


def tv(freq, dist):
  return 0.5 * np.abs(np.asarray(freq) - np.asarray(dist)).sum()


def check_bonus_full_q(verify):
  """p = q at both drafts: every draft is accepted, and the bonus is a sample of p_{K+1}
  (not its argmax, not p_K)."""
  drafts = jax.random.categorical(jax.random.key(10), jnp.log(A), shape=(N, 2)).astype(jnp.int32)
  p = jnp.broadcast_to(jnp.stack([A, A, BONUS]), (N, 3, V))
  m, nxt = verify(p, drafts, p[:, :2], jax.random.key(11))
  assert np.all(np.asarray(m) == 2)
  assert tv(frequencies(nxt), BONUS) < TOL


def check_bonus_one_hot(verify):
  """One-hot proposals the target is certain of are all accepted; the bonus is p_{K+1}."""
  drafts = jnp.broadcast_to(jnp.array([1, 3]), (N, 2))
  p = jnp.broadcast_to(jnp.stack([jax.nn.one_hot(1, V), jax.nn.one_hot(3, V), BONUS]), (N, 3, V))
  m, nxt = verify(p, drafts, None, jax.random.key(12))
  assert np.all(np.asarray(m) == 2)
  assert tv(frequencies(nxt), BONUS) < TOL


def check_acceptance_and_residual(verify):
  """First draft certain (p = q), second drawn from Q1 against P1. Exactly: the second is
  accepted with probability sum(min(P1, Q1)) = 0.5; after its rejection the target's token
  is normalize(max(P1 - Q1, 0)) = [0.6, 0.4, 0, ...]; after its acceptance the bonus is
  BONUS; and the token committed second is distributed as P1."""
  k1, k2, k3 = jax.random.split(jax.random.key(13), 3)
  d1 = jax.random.categorical(k1, jnp.log(A), shape=(N,))
  d2 = jax.random.categorical(k2, jnp.log(Q1), shape=(N,))
  drafts = jnp.stack([d1, d2], 1).astype(jnp.int32)
  p = jnp.broadcast_to(jnp.stack([A, P1, BONUS]), (N, 3, V))
  q = jnp.broadcast_to(jnp.stack([A, Q1]), (N, 2, V))
  m, nxt = verify(p, drafts, q, k3)
  m, nxt, d2 = np.asarray(m), np.asarray(nxt), np.asarray(d2)
  assert np.all(m >= 1)
  assert abs((m == 2).mean() - float(jnp.minimum(P1, Q1).sum())) < 0.015
  residual = np.maximum(np.asarray(P1 - Q1), 0)
  assert tv(frequencies(nxt[m == 1]), residual / residual.sum()) < TOL
  assert tv(frequencies(nxt[m == 2]), BONUS) < 1.5 * TOL  # about half the samples
  second = np.where(m == 2, d2, nxt)
  assert tv(frequencies(second), P1) < TOL


def check_one_hot_residual(verify):
  """A one-hot draft is accepted with probability p(d); after a rejection the target's token
  is p with d removed and renormalised."""
  p = jnp.broadcast_to(jnp.stack([P1, BONUS]), (N, 2, V))
  drafts = jnp.full((N, 1), 0, jnp.int32)
  m, nxt = verify(p, drafts, None, jax.random.key(14))
  m, nxt = np.asarray(m), np.asarray(nxt)
  assert abs(m.mean() - float(P1[0])) < 0.015
  rest = np.asarray(P1).copy()
  rest[0] = 0
  assert tv(frequencies(nxt[m == 0]), rest / rest.sum()) < TOL


CHECKS = [check_bonus_full_q, check_bonus_one_hot, check_acceptance_and_residual,
          check_one_hot_residual]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_verify_sampling_is_exact(check):
  check(verify_sampling)


# which checks each broken verifier must fail
CAUGHT_BY = {
    "bonus_argmax": [check_bonus_full_q, check_bonus_one_hot, check_acceptance_and_residual],
    "bonus_from_last_draft_position": [check_bonus_full_q, check_bonus_one_hot,
                                       check_acceptance_and_residual],
    "residual_unclipped": [check_acceptance_and_residual],
    "residual_wrong_position": [check_acceptance_and_residual, check_one_hot_residual],
    "q_ignored": [check_acceptance_and_residual],
    "accept_everything": [check_acceptance_and_residual, check_one_hot_residual],
}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_broken_verifier_fails_the_checks(name):
  for check in CAUGHT_BY[name]:
    with pytest.raises(AssertionError):
      check(broken_verifiers.BROKEN[name])


def test_commit_stops_rows_at_eos_and_max_new_and_leaves_finished_rows_alone():
  from specjax.decoding.common import commit_tokens
  eos = 0
  out = jnp.zeros((4, 12), jnp.int32)  # the loops size it max_new + K + 1
  count = jnp.array([1, 1, 6, 3])
  done = jnp.array([False, False, False, True])  # row 3 finished earlier (padding row)
  new = jnp.array([[5, 0, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [9, 9, 9, 9]])
  num_new = jnp.array([4, 3, 4, 4])  # m + 1 committed tokens per row
  max_new = jnp.full((4,), 7)
  out, count, done = commit_tokens(out, count, done, new, num_new, max_new, eos)
  assert count.tolist() == [3, 4, 7, 3]
  assert done.tolist() == [True, False, True, True]
  assert out[0, 1:3].tolist() == [5, 0]  # EOS kept, nothing after it
  assert out[1, 1:4].tolist() == [5, 6, 7]  # only the committed m + 1 tokens count
  assert out[2, 6].tolist() == 5  # truncated at max_new_tokens
  assert out[3].tolist() == [0] * 12  # a finished row is not written


def test_commit_stops_on_any_of_several_eos_ids():
  from specjax.decoding.common import commit_tokens
  out = jnp.zeros((2, 8), jnp.int32)
  count, done = jnp.array([1, 1]), jnp.array([False, False])
  new = jnp.array([[4, 7, 5, 6], [4, 9, 9, 9]])
  out, count, done = commit_tokens(out, count, done, new, jnp.array([4, 4]),
                                   jnp.full((2,), 7), (7, 9))
  assert count.tolist() == [3, 3] and done.tolist() == [True, True]
