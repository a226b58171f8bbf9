"""Lossless verification of K drafts against the target (SPEC section 2), per batch row.

Inputs are the target's logits or processed probabilities at the K+1 window positions
[pending, d_1, ..., d_K] (position i predicts the token after it) and the drafts. Outputs are
the number of accepted drafts m (0..K) and the token the target contributes after them (the
correction at the first rejection, or the bonus after K acceptances).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def accepted_prefix(accept_BxK):
  """Length of the leading run of True: verification stops at the first rejection."""
  return jnp.cumprod(accept_BxK.astype(jnp.int32), axis=-1).sum(-1)


def verify_greedy(target_logits_BxK1xV, drafts_BxK):
  """Accept d_i while it equals argmax p_i; then emit argmax p_m."""
  target_BxK1 = jnp.argmax(target_logits_BxK1xV, axis=-1).astype(jnp.int32)
  k = drafts_BxK.shape[1]
  num_accepted_B = accepted_prefix(drafts_BxK == target_BxK1[:, :k])
  next_B = jnp.take_along_axis(target_BxK1, num_accepted_B[:, None], axis=1)[:, 0]
  return num_accepted_B, next_B


def verify_sampling(p_BxK1xV, drafts_BxK, q_BxKxV, rng):
  """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

  Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from
  normalize(max(p_i - q_i, 0)); after K acceptances sample the bonus from p_{K+1}.
  `q_BxKxV=None` means single-token proposals (q one-hot at the draft): then the rule
  accepts with probability p_i(d_i) and resamples from p_i with d_i removed.
  """
  b, k = drafts_BxK.shape
  v = p_BxK1xV.shape[-1]
  if q_BxKxV is None:
    q_BxKxV = jax.nn.one_hot(drafts_BxK, v, dtype=p_BxK1xV.dtype)
  accept_rng, resample_rng = jax.random.split(rng)
  p_draft = jnp.take_along_axis(p_BxK1xV[:, :k], drafts_BxK[..., None], axis=-1)[..., 0]
  q_draft = jnp.take_along_axis(q_BxKxV, drafts_BxK[..., None], axis=-1)[..., 0]
  u = jax.random.uniform(accept_rng, (b, k))
  num_accepted_B = accepted_prefix(u * q_draft < p_draft)

  p_at_BxV = jnp.take_along_axis(p_BxK1xV, num_accepted_B[:, None, None], axis=1)[:, 0]
  q_padded = jnp.concatenate([q_BxKxV, jnp.zeros((b, 1, v), q_BxKxV.dtype)], axis=1)
  q_at_BxV = jnp.take_along_axis(q_padded, num_accepted_B[:, None, None], axis=1)[:, 0]
  residual = jnp.maximum(p_at_BxV - q_at_BxV, 0.0)
  mass = residual.sum(-1, keepdims=True)
  # p == q exactly leaves no residual; then rejection had probability 0 and p is exact.
  residual = jnp.where(mass > 0, residual, p_at_BxV)
  next_B = jax.random.categorical(resample_rng, jnp.log(residual), axis=-1).astype(jnp.int32)
  return num_accepted_B, next_B
