"""The left-to-right walk shared by drafters whose slot j depends on the token drafted at j-1
(DSpark's Markov head, DFlash 2's selector): one `lax.scan` over the block's slots inside the
on-device loop, argmax at T = 0, a draw from the processed distribution otherwise."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def walk(slot_scores, xs_BxK, anchor_B, sampler, rng, keep_scores: bool = False):
  """slot_scores(prev_B, x) -> (scores [B, N], tokens [B, N] or None, aux) for one slot,
  given the token before it and that slot's slice of `xs_BxK` (a pytree of [B, K, ...]);
  tokens None means the scores are over the vocabulary itself. Returns (drafts [B, K],
  scores [B, K, N] if keep_scores else None, q [B, K, N] or None at T = 0, aux [B, K, ...])."""
  k = jax.tree.leaves(xs_BxK)[0].shape[1]
  keys = jax.random.split(rng, k)
  swap = lambda a: jnp.swapaxes(a, 0, 1)

  def step(prev_B, x):
    x, key = x
    scores, tokens, aux = slot_scores(prev_B, x)
    if sampler.greedy:
      index, q = jnp.argmax(scores, -1), jnp.zeros((0,), jnp.float32)
    else:
      log_q = sampler.log_probs(scores)
      index, q = jax.random.categorical(key, log_q, axis=-1), jnp.exp(log_q)
    token = index if tokens is None else jnp.take_along_axis(tokens, index[:, None], 1)[:, 0]
    token = token.astype(jnp.int32)
    return token, (token, scores if keep_scores else jnp.zeros((0,)), q, aux)

  _, (drafts, scores, q, aux) = jax.lax.scan(
      step, anchor_B.astype(jnp.int32), (jax.tree.map(swap, xs_BxK), keys))
  return (swap(drafts), swap(scores) if keep_scores else None,
          None if sampler.greedy else swap(q), jax.tree.map(swap, aux))
