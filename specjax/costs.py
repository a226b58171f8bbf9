"""Measured step costs for the accounting model: T_verify(n) per batch size, T_draft(K).

Each cost is timed the way the decode loop pays it: `inner` back-to-back calls inside one
jitted `lax.fori_loop` (so per-call dispatch from the host is not counted), fastest of `reps`
such runs, divided by `inner` (on a shared 2-core machine one 0.5 ms pass measured with 5 runs
came out anywhere in 0.49-0.93 ms, with 20 runs in 0.43-0.52 ms: hence 15 by default). The KV
cache is filled to the context length so attention does realistic work, and each call's input
depends on the previous call's output so that XLA can neither hoist nor drop it. Attention
reads only the cache prefix the context needs, so a step costs more as the text grows: given
several context lengths (those a decode run passes through), each cost is their mean.
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
  jax.block_until_ready(many(*arg))  # compile (once: every context has the same shapes)
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(many(*arg))
    times.append(time.perf_counter() - t)
  return float(np.min(times)) / inner  # noise only ever adds time, as in the decode timing


def _contexts(context_len) -> tuple[int, ...]:
  return tuple(int(c) for c in (context_len if isinstance(context_len, (list, tuple))
                                else (context_len,)))


def _prefill(graphdef, batch, cache_len, feature_layers=()):
  """Jitted (params, tokens) -> the target's pass over a full-width context, written into a
  fresh cache: the state each timed call starts from."""

  @jax.jit
  def run(params, tokens):
    target = nnx.merge(graphdef, params)
    return target(tokens, cache=target.init_cache(batch, cache_len),
                  feature_layers=feature_layers)

  return run


def verify_loop(graphdef, *, batch: int, n: int, inner: int = 20):
  """Jitted (params, cache) -> `inner` target passes over n new positions, back to back, each
  written into the cache at its context length (what one verify step pays)."""

  @jax.jit
  def many(params, cache):
    target = nnx.merge(graphdef, params)

    def body(_, carry):
      acc, cache = carry
      tokens = jnp.full((batch, n), 3, jnp.int32) + (acc > 1e9).astype(jnp.int32)[:, None]
      out = target(tokens, cache=cache)
      # the write into the cache is part of the pass; the context stays where it was
      return acc + out.logits_BxTxV[:, -1, 0], out.cache.rollback(cache.end_B)

    return jax.lax.fori_loop(0, inner, body, (jnp.zeros((batch,), jnp.float32), cache))[0]

  return many


def verify_costs(graphdef, params, *, batch: int, ns, context_len, cache_len: int,
                 reps: int = 15, inner: int = 20) -> dict[int, float]:
  """Seconds for one target pass over n new positions (cache at context_len; the mean over
  context lengths if several are given), for each n."""
  prefill = _prefill(graphdef, batch, cache_len)
  caches = [prefill(params, jnp.full((batch, c), 3, jnp.int32)).cache
            for c in _contexts(context_len)]
  out = {}
  for n in ns:
    many = verify_loop(graphdef, batch=batch, n=int(n), inner=inner)
    out[int(n)] = float(np.mean([_seconds_per_call(many, (params, cache), inner, reps)
                                 for cache in caches]))
  return out


def draft_loop(graphdef, drafter, *, batch: int, cache_len: int, sampler: Sampler,
               inner: int = 20):
  """(init, many), both jitted: init(params, drafter_params, tokens) -> (drafter state after a
  prefill over tokens, a verified step keeping half the drafts); many(params, drafter_params,
  state, verified) -> `inner` drafter steps, `propose` (K drafts) then `commit`, its state
  carried from step to step as in the decode loop."""
  k = drafter.num_draft_tokens

  @jax.jit
  def init(params, drafter_params, tokens):
    target = nnx.merge(graphdef, params)
    pre = target(tokens, cache=target.init_cache(batch, cache_len),
                 feature_layers=drafter.feature_layers)
    lens = jnp.full((batch,), tokens.shape[1], jnp.int32)
    state = drafter.init(drafter_params, target, Prefill(tokens, lens, pre, cache_len))
    window = jnp.full((batch, k + 1), 3, jnp.int32)
    out = target(window, cache=pre.cache, feature_layers=drafter.feature_layers)
    verified = Verified(window, lens, jnp.full((batch,), k // 2, jnp.int32),
                        jnp.full((batch,), 3, jnp.int32), out, jnp.ones((batch,), bool))
    return state, verified

  @jax.jit
  def many(params, drafter_params, state, verified):
    target = nnx.merge(graphdef, params)
    lens = verified.start_B
    seq = jnp.where(jnp.arange(cache_len)[None, :] <= lens[:, None], 3, 0)

    def body(i, carry):
      # the barrier ties every input to the loop carry: nothing can be hoisted out (the
      # verified pass too: the commit's work on the target's output is paid every step)
      acc, st, sq, ver = jax.lax.optimization_barrier((carry[0], carry[1], seq, verified))
      pending = jnp.full((batch,), 3, jnp.int32) + (acc > 10**9).astype(jnp.int32)
      drafts, _, st = drafter.propose(drafter_params, target, st, Context(sq, lens, pending),
                                      sampler, jax.random.fold_in(jax.random.key(0), i))
      st = drafter.commit(drafter_params, target, st, ver)
      return acc + drafts.sum(-1), st

    return jax.lax.fori_loop(0, inner, body, (jnp.zeros((batch,), jnp.int32), state))[0]

  return init, many


def draft_cost(graphdef, params, drafter, drafter_params, *, batch: int, context_len,
               cache_len: int, sampler: Sampler, reps: int = 15, inner: int = 20) -> float:
  """Seconds for one step of the drafter's own work at the given context length (the mean
  over several): `propose` (K drafts) and `commit` (keeping half of them)."""
  init, many = draft_loop(graphdef, drafter, batch=batch, cache_len=cache_len,
                          sampler=sampler, inner=inner)
  times = []
  for c in _contexts(context_len):
    state, verified = init(params, drafter_params, jnp.full((batch, c), 3, jnp.int32))
    times.append(_seconds_per_call(many, (params, drafter_params, state, verified), inner,
                                   reps))
  return float(np.mean(times))
