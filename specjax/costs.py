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

from specjax.decoding.sampling import Sampler
from specjax.drafters.base import Context, Prefill


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
    def many(params, n=n):
      target = nnx.merge(graphdef, params)

      def body(_, acc):
        tokens = jnp.full((batch, n), 3, jnp.int32) + (acc > 1e9).astype(jnp.int32)[:, None]
        logits = target(tokens, cache=pre.cache).logits_BxTxV
        return acc + logits[:, -1, 0]

      return jax.lax.fori_loop(0, inner, body, jnp.zeros((batch,), jnp.float32))

    out[int(n)] = _seconds_per_call(many, params, inner, reps)
  return out


def draft_cost(graphdef, params, drafter, drafter_params, *, batch: int, context_len: int,
               cache_len: int, sampler: Sampler, reps: int = 5, inner: int = 20) -> float:
  """Seconds for one `propose` call of the drafter (K drafts) at the given context length."""
  tokens, pre = _context(graphdef, params, batch, context_len, cache_len,
                         drafter.feature_layers)
  lens = jnp.full((batch,), context_len, jnp.int32)
  seq = jnp.zeros((batch, cache_len), jnp.int32).at[:, :context_len + 1].set(3)

  @jax.jit
  def init(params, drafter_params):
    target = nnx.merge(graphdef, params)
    return drafter.init(drafter_params, target, Prefill(tokens, lens, pre, cache_len))

  @jax.jit
  def many(args):
    params, drafter_params, state = args
    target = nnx.merge(graphdef, params)

    def body(i, acc):
      # the barrier ties every input to the loop carry: nothing can be hoisted out
      acc, st, sq = jax.lax.optimization_barrier((acc, state, seq))
      pending = jnp.full((batch,), 3, jnp.int32) + (acc > 10**9).astype(jnp.int32)
      drafts = drafter.propose(drafter_params, target, st, Context(sq, lens, pending),
                               sampler, jax.random.fold_in(jax.random.key(0), i))[0]
      return acc + drafts.sum(-1)

    return jax.lax.fori_loop(0, inner, body, jnp.zeros((batch,), jnp.int32))

  state = init(params, drafter_params)
  return _seconds_per_call(many, (params, drafter_params, state), inner, reps)
