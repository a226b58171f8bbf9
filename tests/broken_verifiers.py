"""Deliberately broken sampling verifiers, each with the signature of `verify_sampling`.

The losslessness tests must fail on every one of them (tests/test_verify.py checks that they
do): a test that a broken verifier passes is not testing verification.
"""

import jax
import jax.numpy as jnp

from specjax.decoding import verify


def bonus_argmax(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
  """After K acceptances, emits argmax p_{K+1} instead of sampling it."""
  m, nxt = verify.verify_sampling(p_BxK1xV, drafts_BxK, q_BxKxV, rng)
  k = drafts_BxK.shape[1]
  return m, jnp.where(m == k, jnp.argmax(p_BxK1xV[:, k], -1).astype(jnp.int32), nxt)


def bonus_from_last_draft_position(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
  """After K acceptances, samples the bonus from p_K (the last draft's) not p_{K+1}."""
  m, nxt = verify.verify_sampling(p_BxK1xV, drafts_BxK, q_BxKxV, rng)
  k = drafts_BxK.shape[1]
  wrong = jax.random.categorical(jax.random.fold_in(rng, 7), jnp.log(p_BxK1xV[:, k - 1]), -1)
  return m, jnp.where(m == k, wrong.astype(jnp.int32), nxt)


def _sample_by_cdf(dist_BxV, rng):
  """Inverse-CDF sampling of a (supposedly non-negative) normalised vector."""
  u = jax.random.uniform(rng, dist_BxV.shape[:1])
  below = jnp.cumsum(dist_BxV, axis=-1) <= u[:, None]
  return jnp.minimum(below.sum(-1), dist_BxV.shape[-1] - 1).astype(jnp.int32)


def _residual_verifier(p_index, q_index, clip: bool):
  def broken(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
    k, v = drafts_BxK.shape[1], p_BxK1xV.shape[-1]
    q = jax.nn.one_hot(drafts_BxK, v) if q_BxKxV is None else q_BxKxV
    accept_rng, resample_rng = jax.random.split(rng)
    u = jax.random.uniform(accept_rng, drafts_BxK.shape)
    m = verify.num_accepted(p_BxK1xV, drafts_BxK, q, u)
    p_at = verify._at(p_BxK1xV, p_index(m, k))
    q_at = jnp.where((m < k)[:, None], verify._at(q, q_index(m, k)), 0.0)
    residual = p_at - q_at
    if clip:
      residual = jnp.maximum(residual, 0.0)
    residual = residual / residual.sum(-1, keepdims=True)
    return m, _sample_by_cdf(residual, resample_rng)
  return broken


# p_m - q_m normalised with its negative entries left in
residual_unclipped = _residual_verifier(lambda m, k: m, lambda m, k: jnp.minimum(m, k - 1),
                                        clip=False)
# the residual of the position after the rejected one: max(p_{m+1} - q_{m+1}, 0)
residual_wrong_position = _residual_verifier(lambda m, k: jnp.minimum(m + 1, k),
                                             lambda m, k: jnp.minimum(m + 1, k - 1), clip=True)


def q_ignored(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
  """Treats every proposal as one-hot, whatever q the drafter returned."""
  return verify.verify_sampling(p_BxK1xV, drafts_BxK, None, rng)


def accept_everything(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
  k = drafts_BxK.shape[1]
  nxt = jax.random.categorical(rng, jnp.log(p_BxK1xV[:, k]), axis=-1)
  return jnp.full(drafts_BxK.shape[:1], k, jnp.int32), nxt.astype(jnp.int32)


BROKEN = {
    "bonus_argmax": bonus_argmax,
    "bonus_from_last_draft_position": bonus_from_last_draft_position,
    "residual_unclipped": residual_unclipped,
    "residual_wrong_position": residual_wrong_position,
    "q_ignored": q_ignored,
    "accept_everything": accept_everything,
}
