"""Measured step costs for the accounting model: T_verify(n) per batch size, T_draft(K).

Each cost is the median wall time of a jitted call after a warm-up call, with the KV cache
filled to `context_len` so attention does realistic work.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decoding.sampling import Sampler
from specjax.drafters.base import Context, Prefill


def _median_seconds(fn, reps: int) -> float:
  jax.block_until_ready(fn())  # compile
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _context(graphdef, params, batch, context_len, cache_len, feature_layers=()):
  target = nnx.merge(graphdef, params)
  tokens = jnp.full((batch, context_len), 3, jnp.int32)
  cache = target.init_cache(batch, cache_len)
  out = target(tokens, cache=cache, feature_layers=feature_layers)
  return tokens, out


def verify_costs(graphdef, params, *, batch: int, ns, context_len: int, cache_len: int,
                 reps: int = 5) -> dict[int, float]:
  """Seconds for one target pass over n new positions, for each n in ns."""
  _, pre = _context(graphdef, params, batch, context_len, cache_len)

  @jax.jit
  def step(params, cache, tokens):
    return nnx.merge(graphdef, params)(tokens, cache=cache).logits_BxTxV

  out = {}
  for n in ns:
    tokens = jnp.full((batch, n), 3, jnp.int32)
    out[int(n)] = _median_seconds(lambda: step(params, pre.cache, tokens), reps)
  return out


def draft_cost(graphdef, params, drafter, drafter_params, *, batch: int, context_len: int,
               cache_len: int, sampler: Sampler, reps: int = 5) -> float:
  """Seconds for one `propose` call of the drafter (K drafts) at the given context length."""
  tokens, pre = _context(graphdef, params, batch, context_len, cache_len,
                         drafter.feature_layers)
  lens = jnp.full((batch,), context_len, jnp.int32)

  @jax.jit
  def init(params, drafter_params):
    target = nnx.merge(graphdef, params)
    return drafter.init(drafter_params, target, Prefill(tokens, lens, pre, cache_len))

  state = init(params, drafter_params)
  seq = jnp.zeros((batch, cache_len), jnp.int32).at[:, :context_len + 1].set(3)
  ctx = Context(seq, lens, jnp.full((batch,), 3, jnp.int32))

  @jax.jit
  def propose(params, drafter_params, state, rng):
    target = nnx.merge(graphdef, params)
    return drafter.propose(drafter_params, target, state, ctx, sampler, rng)[0]

  return _median_seconds(lambda: propose(params, drafter_params, state, jax.random.key(0)), reps)
