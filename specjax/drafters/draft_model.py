"""Classic speculative sampling with a small autoregressive drafter (its own KV cache).

Invariant: at `propose` time the drafter cache holds positions [0, end - 1), i.e. all
committed tokens but the last two. Proposing feeds [token at end - 1, pending] and then
each draft, so after K drafts it holds up to d_{K-1}; `commit` rolls back to end + m, which
is exactly what the accepted drafts justify (even for m = K).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters.base import Context, Drafter, Prefill, Verified
from specjax.models import KVCache


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter(Drafter):
  graphdef: nnx.GraphDef = None

  def init(self, params, target, prefill: Prefill) -> KVCache:
    model = nnx.merge(self.graphdef, params)
    cache = model.init_cache(prefill.tokens_BxP.shape[0], prefill.cache_len)
    out = model(prefill.tokens_BxP, cache=cache, compute_logits=False)
    return out.cache.rollback(prefill.lens_B - 1)

  def propose(self, params, target, cache: KVCache, ctx: Context, sampler, rng):
    model = nnx.merge(self.graphdef, params)
    prev_B = jnp.take_along_axis(ctx.seq_BxS, (ctx.end_B - 1)[:, None], axis=1)[:, 0]
    out = model(jnp.stack([prev_B, ctx.pending_B], axis=1), cache=cache)
    rngs = jax.random.split(rng, self.num_draft_tokens)

    def draw(logits_BxV, key):
      token = sampler.sample(logits_BxV, key)
      return token, (None if sampler.greedy else sampler.probs(logits_BxV))

    first, q_first = draw(out.logits_BxTxV[:, -1], rngs[0])

    def step(carry, key):
      cache, token = carry
      o = model(token[:, None], cache=cache)
      nxt, q = draw(o.logits_BxTxV[:, 0], key)
      return (o.cache, nxt), (nxt, q)

    (cache, _), (rest, q_rest) = jax.lax.scan(step, (out.cache, first), rngs[1:])
    drafts = jnp.concatenate([first[:, None], rest.T], axis=1)
    q = None if sampler.greedy else jnp.concatenate(
        [q_first[:, None], jnp.swapaxes(q_rest, 0, 1)], axis=1)
    return drafts, q, cache

  def commit(self, params, target, cache: KVCache, verified: Verified) -> KVCache:
    start = verified.start_B
    return cache.rollback(jnp.where(verified.active_B, start + verified.num_kept_B,
                                    start - 1))
