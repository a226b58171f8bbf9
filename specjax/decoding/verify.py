"""Lossless verification of K drafts against the target (SPEC section 2), per batch row.

Inputs are the target's logits or processed probabilities at the K+1 window positions
[pending, d_1, ..., d_K] (position i predicts the token after it) and the drafts. Outputs are
the number of accepted drafts m (0..K) and the token the target contributes after them (the
correction at the first rejection, or the bonus after K acceptances).

Sampling is split in two steps that tests (and deliberately broken variants of them) use
separately: `num_accepted` (how many drafts pass the min(1, p/q) test) and
`correction_distribution` (what the target's own token is drawn from, given m).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def accepted_prefix(accept_BxK):
  """Length of the leading run of True: verification stops at the first rejection."""
  return jnp.cumprod(accept_BxK.astype(jnp.int32), axis=-1).sum(-1)


def admitted(accept_BxK, budget_B):
  """Drafts at index >= budget_B[b] count as absent (budget None: all K are verified)."""
  if budget_B is None:
    return accept_BxK
  return accept_BxK & (jnp.arange(accept_BxK.shape[1])[None, :] < budget_B[:, None])


def verify_greedy(target_logits_BxK1xV, drafts_BxK, budget_B=None):
  """Accept d_i while it equals argmax p_i; then emit argmax p_m. With a per-row budget only
  the first budget_B[b] drafts are verified (m <= budget)."""
  target_BxK1 = jnp.argmax(target_logits_BxK1xV, axis=-1).astype(jnp.int32)
  k = drafts_BxK.shape[1]
  num_accepted_B = accepted_prefix(admitted(drafts_BxK == target_BxK1[:, :k], budget_B))
  next_B = jnp.take_along_axis(target_BxK1, num_accepted_B[:, None], axis=1)[:, 0]
  return num_accepted_B, next_B


def _at(x_BxTx, index_B):
  """x[b, index[b]] for every row."""
  return jnp.take_along_axis(x_BxTx, index_B[:, None, None], axis=1)[:, 0]


def num_accepted(p_BxK1xV, drafts_BxK, q_BxKxV, u_BxK, budget_B=None):
  """m: the leading run of drafts with u * q(d) < p(d), i.e. accepted with probability
  min(1, p/q). q None = one-hot proposals: accepted with probability p(d). A budget caps m."""
  k = drafts_BxK.shape[1]
  p_draft = jnp.take_along_axis(p_BxK1xV[:, :k], drafts_BxK[..., None], axis=-1)[..., 0]
  if q_BxKxV is None:
    return accepted_prefix(admitted(u_BxK < p_draft, budget_B))
  q_draft = jnp.take_along_axis(q_BxKxV, drafts_BxK[..., None], axis=-1)[..., 0]
  return accepted_prefix(admitted(u_BxK * q_draft < p_draft, budget_B))


def correction_distribution(p_BxK1xV, drafts_BxK, q_BxKxV, m_B, budget_B=None):
  """The (unnormalised) distribution of the target's token after m accepted drafts:
  max(p_m - q_m, 0) after a rejection at draft m+1, p_{K+1} (the bonus) when m = K.
  q None = one-hot proposals: p_m with the rejected draft removed. With a budget, m = budget
  is the bonus: p at that position with nothing subtracted (lossless as long as the budget
  was fixed before verification saw the drafts)."""
  k = drafts_BxK.shape[1]
  p_at_BxV = _at(p_BxK1xV, m_B)
  rejected = m_B < (k if budget_B is None else jnp.minimum(budget_B, k))
  if q_BxKxV is None:
    d_at_B = jnp.take_along_axis(drafts_BxK, jnp.minimum(m_B, k - 1)[:, None], axis=1)[:, 0]
    drop = (jnp.arange(p_at_BxV.shape[-1])[None, :] == d_at_B[:, None]) & rejected[:, None]
    residual = jnp.where(drop, 0.0, p_at_BxV)
  else:
    q_at_BxV = _at(q_BxKxV, jnp.minimum(m_B, k - 1))
    residual = jnp.where(rejected[:, None], jnp.maximum(p_at_BxV - q_at_BxV, 0.0), p_at_BxV)
  # p == q exactly leaves no residual; then rejection had probability 0 and p is exact.
  return jnp.where(residual.sum(-1, keepdims=True) > 0, residual, p_at_BxV)


def verify_sampling(p_BxK1xV, drafts_BxK, q_BxKxV, rng, budget_B=None):
  """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

  Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from
  normalize(max(p_i - q_i, 0)); after K acceptances sample the bonus from p_{K+1}.
  `q_BxKxV=None` means single-token proposals (q one-hot at the draft): then the rule
  accepts with probability p_i(d_i) and resamples from p_i with d_i removed, without ever
  building a [B, K, V] one-hot q. `budget_B` (optional, per row): only the first budget
  drafts are verified.
  """
  accept_rng, resample_rng = jax.random.split(rng)
  u = jax.random.uniform(accept_rng, drafts_BxK.shape)
  m_B = num_accepted(p_BxK1xV, drafts_BxK, q_BxKxV, u, budget_B)
  dist = correction_distribution(p_BxK1xV, drafts_BxK, q_BxKxV, m_B, budget_B)
  next_B = jax.random.categorical(resample_rng, jnp.log(dist), axis=-1).astype(jnp.int32)
  return m_B, next_B
