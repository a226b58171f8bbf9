"""Measured step costs for the accounting model: T_verify(n) per batch size, T_draft(K).

Each cost is timed the way the decode loop pays it: back-to-back calls inside one jitted
`lax.fori_loop`, as the slope of wall time against the number of calls: (fastest run of
2 x `inner` calls - fastest run of `inner` calls) / `inner`, over `reps` runs of each. The
slope leaves out what every launch of a program pays once (host dispatch, waking the thread
pool, caches cold from the previous program: on this 2-core machine ten 0.5 ms passes timed
right after another program came out 0.13 ms per pass slower than ten timed back to back),
which a decode loop pays once per call, not once per step. The fastest of several runs because
noise only ever adds time (a 0.5 ms pass measured with 5 runs came out anywhere in 0.49-0.93
ms, with 20 runs in 0.43-0.52 ms: hence 15 by default).

T_draft is the drafter's marginal cost in a loop that also runs the target's pass (see
`draft_cost`): what a step pays, where the two models share the processor's caches. The KV
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


def _wall(fn, *args) -> float:
  t = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t


# a timing stops taking runs once it has spent this long (after MIN_REPS): at a large batch
# one run of a verify loop takes seconds, and 15 of them per width made start-up take minutes
BUDGET_SECONDS = 30.0
MIN_REPS = 3


def slopes(calls, inner: int, reps: int, budget: float | None = None) -> list[float]:
  """For each (many, args) in calls, the slope of `many(*args, trips)`'s wall time in trips
  between inner and 2 x inner: fastest of `reps` runs each (fewer, but at least MIN_REPS,
  once `budget` seconds are spent; default BUDGET_SECONDS), every call's runs interleaved
  with the others' (so that figures meant to be compared see the same moments)."""
  budget = BUDGET_SECONDS if budget is None else budget
  for many, args in calls:
    jax.block_until_ready(many(*args, inner))  # compile (once per shape)
  short, long = np.full((2, len(calls), reps), np.inf)
  start = time.perf_counter()
  for r in range(reps):
    for i, (many, args) in enumerate(calls):
      short[i, r] = _wall(many, *args, inner)
      long[i, r] = _wall(many, *args, 2 * inner)
    if r + 1 >= MIN_REPS and time.perf_counter() - start > budget:
      break
  out = []
  for s, l in zip(short.min(1), long.min(1)):
    # a slope this noisy is no measurement; the intercept-inclusive figure bounds it above
    out.append(float((l - s) / inner) if l > s else float(l / (2 * inner)))
  return out


def seconds_per_call(many, args, inner: int, reps: int) -> float:
  """`slopes` of one call."""
  return slopes([(many, args)], inner, reps)[0]


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


def context_cache(graphdef, params, *, batch: int, context_len: int, cache_len: int):
  """A target KV cache filled to context_len (what `verify_loop`'s calls start from)."""
  prefill = _prefill(graphdef, batch, cache_len)
  return prefill(params, jnp.full((batch, int(context_len)), 3, jnp.int32)).cache


def verify_loop(graphdef, *, batch: int, n: int, sampler: Sampler | None = None):
  """Jitted (params, cache, trips) -> `trips` target passes over n new positions, back to
  back, each written into the cache at its context length (what one verify step pays). With
  a sampling `sampler` (T > 0), each pass also draws one token from its last position's
  logits: what an AR step pays per token, and a verify step for its residual or bonus token
  (a draw over the vocabulary costs a fifth of a pass on the reference target)."""
  draws = sampler is not None and not sampler.greedy

  @jax.jit
  def many(params, cache, trips):
    target = nnx.merge(graphdef, params)

    def body(i, carry):
      acc, cache = carry
      tokens = jnp.full((batch, n), 3, jnp.int32) + (acc > 1e9).astype(jnp.int32)[:, None]
      out = target(tokens, cache=cache)
      last = out.logits_BxTxV[:, -1]
      if draws:
        last = sampler.sample(last, jax.random.fold_in(jax.random.key(0), i))[:, None]
      # the write into the cache is part of the pass; the context stays where it was
      return acc + last[:, 0], out.cache.rollback(cache.end_B)

    return jax.lax.fori_loop(0, trips, body, (jnp.zeros((batch,), jnp.float32), cache))[0]

  return many


def verify_costs(graphdef, params, *, batch: int, ns, context_len, cache_len: int,
                 reps: int = 15, inner: int = 20,
                 sampler: Sampler | None = None) -> dict[int, float]:
  """Seconds for one target pass over n new positions (cache at context_len; the mean over
  context lengths if several are given), for each n; with a sampling `sampler`, the pass and
  one draw from its logits (see `verify_loop`)."""
  caches = [context_cache(graphdef, params, batch=batch, context_len=c, cache_len=cache_len)
            for c in _contexts(context_len)]
  out = {}
  for n in ns:
    many = verify_loop(graphdef, batch=batch, n=int(n), sampler=sampler)
    out[int(n)] = float(np.mean([seconds_per_call(many, (params, cache), inner, reps)
                                 for cache in caches]))
  return out


def draft_loop(graphdef, drafter, *, batch: int, cache_len: int, sampler: Sampler):
  """(init, many), both jitted: init(params, drafter_params, tokens) -> (drafter state after a
  prefill over tokens, a verified step keeping half the drafts); many(params, drafter_params,
  state, verified, trips) -> `trips` drafter steps, `propose` (K drafts) then `commit`, its state
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
  def many(params, drafter_params, state, verified, trips):
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

    return jax.lax.fori_loop(0, trips, body, (jnp.zeros((batch,), jnp.int32), state))[0]

  return init, many


def step_loop(graphdef, drafter, *, batch: int, cache_len: int, sampler: Sampler):
  """Jitted many(params, drafter_params, state, verified, trips) (state and verified from
  `draft_loop`'s init) -> `trips` steps of both passes the accounting model prices, together
  in one loop as the decode loop runs them: `propose`, the target's pass over the window, and
  `commit` of that pass (half the drafts kept), with none of the loop's verification and
  bookkeeping. Against T_draft + T_verify timed apart it shows what the two models cost each
  other (caches, memory traffic); against the decode loop's step, what its bookkeeping costs."""

  @jax.jit
  def many(params, drafter_params, state, verified, trips):
    target = nnx.merge(graphdef, params)
    lens = verified.start_B
    seq = jnp.where(jnp.arange(cache_len)[None, :] <= lens[:, None], 3, 0)
    cache = verified.output.cache.rollback(lens)

    def body(i, carry):
      acc, st, cache = carry
      pending = jnp.full((batch,), 3, jnp.int32) + (acc > 10**9).astype(jnp.int32)
      drafts, _, st = drafter.propose(drafter_params, target, st, Context(seq, lens, pending),
                                      sampler, jax.random.fold_in(jax.random.key(0), i))
      window = jnp.concatenate([pending[:, None], drafts], axis=1)
      out = target(window, cache=cache, feature_layers=drafter.feature_layers)
      st = drafter.commit(drafter_params, target, st,
                          verified.replace(window_BxK1=window, output=out))
      acc = acc + drafts.sum(-1) + (out.logits_BxTxV[:, -1, 0] > 1e9)
      return acc, st, out.cache.rollback(lens)

    return jax.lax.fori_loop(0, trips, body, (jnp.zeros((batch,), jnp.int32), state, cache))[0]

  return many


def draft_cost(graphdef, params, drafter, drafter_params, *, batch: int, context_len,
               cache_len: int, sampler: Sampler, reps: int = 15, inner: int = 20,
               in_loop: bool = True) -> float:
  """Seconds the drafter adds to one decode step at the given context length (the mean over
  several): `propose` (K drafts) and `commit` (keeping half of them).

  in_loop (the default): the drafter's marginal cost next to the target's pass, (T of a loop
  running propose, the target's pass over K + 1 and commit) - T_verify(K + 1), both timed
  interleaved. A drafter timed in a loop of its own keeps its weights and caches warm, as
  the target does when timed alone; in the decode loop the two models evict each other (on a
  CPU whose last-level cache holds one model but not both, apart timing under-prices a step
  by 25-35%: bench/loop_efficiency.py). in_loop=False: the drafter's own loop."""
  init, many = draft_loop(graphdef, drafter, batch=batch, cache_len=cache_len,
                          sampler=sampler)
  together = step_loop(graphdef, drafter, batch=batch, cache_len=cache_len, sampler=sampler)
  verify = verify_loop(graphdef, batch=batch, n=drafter.num_draft_tokens + 1)
  times = []
  for c in _contexts(context_len):
    state, verified = init(params, drafter_params, jnp.full((batch, c), 3, jnp.int32))
    args = (params, drafter_params, state, verified)
    if not in_loop:
      times.append(seconds_per_call(many, args, inner, reps))
      continue
    cache = verified.output.cache.rollback(verified.start_B)
    both, alone = slopes([(together, args), (verify, (params, cache))], inner, reps)
    times.append(max(both - alone, 0.0))
  return float(np.mean(times))
