"""Measured step costs for the accounting model: T_verify(n) per batch size, T_draft(K).

Each cost is timed the way the decode loop pays it: `inner` back-to-back calls inside one
jitted `lax.fori_loop` (so per-call dispatch from the host is not counted), median of `reps`
such runs, divided by `inner`. The KV cache is filled to `context_len` so attention does
realistic work, and each call's input depends on the previous call's output so that XLA can
neither hoist nor drop it.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.sampling import Sampler
from specjax.drafters.base import Context, Prefill, Verified


def _seconds_per_call(many, arg, inner: int, reps: int) -> float:
  jax.block_until_ready(many(arg))  # compile
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(many(arg))
    times.append(time.perf_counter() - t)
  return float(np.median(times)) / inner


def _context(graphdef, params, batch, context_len, cache_len, feature_layers=()):
  target = nnx.merge(graphdef, params)
  tokens = jnp.full((batch, context_len), 3, jnp.int32)
  out = target(tokens, cache=target.init_cache(batch, cache_len), feature_layers=feature_layers)
  return tokens, out


def verify_costs(graphdef, params, *, batch: int, ns, context_len: int, cache_len: int,
                 reps: int = 5, inner: int = 20) -> dict[int, float]:
  """Seconds for one target pass over n new positions (cache at context_len), for each n."""
  _, pre = _context(graphdef, params, batch, context_len, cache_len)
  out = {}
  for n in ns:

    @jax.jit
    def many(params, cache, n=n):
      target = nnx.merge(graphdef, params)

      def body(_, carry):
        acc, cache = carry
        tokens = jnp.full((batch, n), 3, jnp.int32) + (acc > 1e9).astype(jnp.int32)[:, None]
        out = target(tokens, cache=cache)
        # the write into the cache is part of the pass; the context stays at context_len
        return acc + out.logits_BxTxV[:, -1, 0], out.cache.rollback(cache.end_B)

      return jax.lax.fori_loop(0, inner, body, (jnp.zeros((batch,), jnp.float32), cache))[0]

    out[int(n)] = _seconds_per_call(lambda p: many(p, pre.cache), params, inner, reps)
  return out


def draft_cost(graphdef, params, drafter, drafter_params, *, batch: int, context_len: int,
               cache_len: int, sampler: Sampler, reps: int = 5, inner: int = 20) -> float:
  """Seconds for one step of the drafter's own work at the given context length: `propose`
  (K drafts) and `commit` (keeping half of them), its state carried from step to step as
  in the decode loop."""
  tokens, pre = _context(graphdef, params, batch, context_len, cache_len,
                         drafter.feature_layers)
  lens = jnp.full((batch,), context_len, jnp.int32)
  seq = jnp.zeros((batch, cache_len), jnp.int32).at[:, :context_len + 1].set(3)
  k = drafter.num_draft_tokens

  @jax.jit
  def init(params, drafter_params):
    target = nnx.merge(graphdef, params)
    state = drafter.init(drafter_params, target, Prefill(tokens, lens, pre, cache_len))
    window = jnp.full((batch, k + 1), 3, jnp.int32)
    out = target(window, cache=pre.cache, feature_layers=drafter.feature_layers)
    verified = Verified(window, lens, jnp.full((batch,), k // 2, jnp.int32),
                        jnp.full((batch,), 3, jnp.int32), out, jnp.ones((batch,), bool))
    return state, verified

  @jax.jit
  def many(args):
    params, drafter_params, state, verified = args
    target = nnx.merge(graphdef, params)

    def body(i, carry):
      # the barrier ties every input to the loop carry: nothing can be hoisted out
      acc, st, sq = jax.lax.optimization_barrier((carry[0], carry[1], seq))
      pending = jnp.full((batch,), 3, jnp.int32) + (acc > 10**9).astype(jnp.int32)
      drafts, _, st = drafter.propose(drafter_params, target, st, Context(sq, lens, pending),
                                      sampler, jax.random.fold_in(jax.random.key(0), i))
      st = drafter.commit(drafter_params, target, st, verified)
      return acc + drafts.sum(-1), st

    return jax.lax.fori_loop(0, inner, body, (jnp.zeros((batch,), jnp.int32), state))[0]

  state, verified = init(params, drafter_params)
  return _seconds_per_call(many, (params, drafter_params, state, verified), inner, reps)
