"""Verification rules (SPEC section 2) on hand-built logits and probabilities."""

import jax
import jax.numpy as jnp
import numpy as np

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
