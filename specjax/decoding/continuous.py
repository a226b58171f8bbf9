"""Continuous batching: C slots, a request queue, and a finished row refilled while the others
keep going.

The loop stays on device. `Slots.run` runs the decode loop's own step (AR or draft-verify,
any drafter) in a jitted `while_loop` until some row finishes or a step bound is reached;
the host then reads which slots finished, takes their tokens, and prefills the next queued
request into each free slot with one jitted call (`Slots.insert`): the request's own prefill,
first token and drafter state, written into that slot of every per-row array (target KV
cache, drafter state, counters) while the other rows keep theirs. Which axis of a leaf is the
batch is found once by tracing the loop's initial state at batch 1 and 2, so any drafter's
state works without the drafter knowing about slots.

Host round trips per run: one `run` call per finishing event (a step bound adds more when
requests arrive over time) and one `insert` per request.

Lossless: a row's computation reads only its own row of every per-row array (attention,
verification, drafter state), so a request's tokens do not depend on its slot or on who
shares the batch; tests check each request against its own batch-1 decode.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.common import DecodeLoop, check_fits, pad_prompts, row_ids
from specjax.errors import SpecjaxError

NO_AXIS = -1


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)


@dataclasses.dataclass(frozen=True)
class Slots:
  """Continuous batching over a decode loop (ARDecoder or SpeculativeDecoder). `params` in
  every call is the tuple of the loop's parameters: (target,) or (target, drafter)."""

  loop: DecodeLoop
  num_slots: int

  def batch_axes(self, params):
    """Per leaf of the loop state: the axis that grows with the batch (NO_AXIS: shared by
    the whole batch, such as the accept histograms, which keep accumulating)."""
    key = jax.random.key(0)

    def shapes(b):
      tokens = jax.ShapeDtypeStruct((b, 16), jnp.int32)
      lens = jax.ShapeDtypeStruct((b,), jnp.int32)
      return jax.eval_shape(self.loop.init_state, *_abstract(params), tokens, lens, key)

    def axis(one, two):
      diff = [i for i, (x, y) in enumerate(zip(one.shape, two.shape)) if x != y]
      return diff[0] if diff else NO_AXIS

    return jax.tree.map(axis, shapes(1), shapes(2))

  @functools.partial(jax.jit, static_argnums=0)
  def empty(self, params, rng):
    """C free slots: a one-token prefill per slot, every row marked done (`rng` drives the
    loop's steps; each request's first token uses the key given to its insert)."""
    tokens = jnp.ones((self.num_slots, 16), jnp.int32)
    lens = jnp.ones((self.num_slots,), jnp.int32)
    state = self.loop.init_state(*params, tokens, lens, rng)
    return state.replace(done_B=jnp.ones_like(state.done_B))

  # the state is donated: a refill writes one row in place instead of copying every cache
  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def insert(self, params, state, slot, tokens_1xP, lens_1, rng):
    """The request's prefill, first token and drafter state written into `slot`."""
    one = self.loop.init_state(*params, tokens_1xP, lens_1, rng)

    def put(axis, big, small):
      if axis == NO_AXIS:
        return big
      if small.shape[axis] != 1 or small.ndim != big.ndim:
        raise SpecjaxError(f"a loop state leaf of shape {small.shape} does not follow the "
                           "batch; continuous batching needs per-row state")
      return jax.lax.dynamic_update_slice_in_dim(big, small.astype(big.dtype), slot, axis)

    new = jax.tree.map(put, self.batch_axes(params), state, one)
    return self.loop.shard(new.replace(target_calls=state.target_calls + 1))

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def run(self, params, state, max_steps, stop_on_finish):
    """Decode steps until every row is done, `max_steps` were taken, or (stop_on_finish) a
    row that was running has finished. Returns (state, steps taken)."""
    running = ~state.done_B

    def cond(carry):
      s, n = carry
      finished = jnp.any(s.done_B & running)
      return ~jnp.all(s.done_B) & (n < max_steps) & ~(stop_on_finish & finished)

    return jax.lax.while_loop(cond, lambda c: (self.loop.step(*params, c[0]), c[1] + 1),
                              (state, jnp.int32(0)))


@dataclasses.dataclass
class Served:
  """One request's tokens (EOS dropped) and its times, in seconds from the run's start."""
  index: int
  tokens: list[int]
  slot: int
  arrival: float
  first_token: float  # its prefill (and first token) done
  finish: float
  steps: int  # loop steps in which it was active
  committed: list[int] | None = None  # tokens per step (the loop's record_steps)

  @property
  def ttft(self) -> float:
    return self.first_token - self.arrival

  @property
  def tpot(self) -> float:
    """Time per output token after the first."""
    return (self.finish - self.first_token) / max(1, len(self.tokens))


def serve(slots: Slots, params, prompts: list[list[int]], rng, *, pad_id: int,
          arrivals=None, step_bound: int = 8, prompt_width: int = 0,
          prompt_bucket: int = 16, clock=time.perf_counter):
  """Decodes every prompt through the C slots, in order of arrival (seconds from the start;
  None: all queued at once). Returns (list of Served by request, stats): stats counts the
  host round trips (`run` and `insert` calls), loop steps and row-steps spent on requests.
  While requests are still to arrive a `run` call stops after `step_bound` steps, so an
  arrival waits at most that long for a free slot's refill. `prompt_width` pads every prompt
  to one width (one compiled insert; 0: each to a multiple of `prompt_bucket`, one compiled
  insert per width)."""
  loop = slots.loop
  n = len(prompts)
  arrivals = np.zeros(n) if arrivals is None else np.asarray(arrivals, float)
  if arrivals.shape != (n,):
    raise SpecjaxError(f"{arrivals.shape[0]} arrival times for {n} prompts")
  def padded(p):
    tokens, lens = pad_prompts([p], pad_id, prompt_bucket or 16)
    if prompt_width > tokens.shape[1]:
      tokens = np.pad(tokens, ((0, 0), (0, prompt_width - tokens.shape[1])),
                      constant_values=pad_id)
    return tokens, lens

  requests = [padded(p) for p in prompts]  # padded once: the fit check, then the insert
  for tokens, lens in requests:
    check_fits(lens, loop.max_new_tokens, loop.lookahead, loop.cache_len, tokens.shape[1])
  queue = collections.deque(sorted(range(n), key=lambda i: arrivals[i]))
  owner = [None] * slots.num_slots
  first = {}
  served = [None] * n
  stats = collections.Counter()

  def collect(state, t):
    """Frees every slot whose request is done (one transfer: the per-row counters and every
    row's tokens, C x N int32). Returns how many it freed."""
    done, count, row_steps, out, committed = jax.device_get(
        (state.done_B, state.count_B, state.steps_B, state.out_BxN,
         getattr(state, "committed_BxN", None)))
    freed = 0
    for slot, i in enumerate(owner):
      if i is None or not done[slot]:
        continue
      ids = row_ids(out[slot], int(count[slot]), loop.eos_id)
      per_step = None if committed is None else [int(c) for c in committed[slot] if c >= 0]
      served[i] = Served(i, ids, slot, float(arrivals[i]), first[i], t, int(row_steps[slot]),
                         per_step)
      stats["row_steps"] += int(row_steps[slot])
      owner[slot] = None
      freed += 1
    return freed

  state = jax.block_until_ready(slots.empty(params, jax.random.fold_in(rng, n)))
  start = clock()
  while queue or any(o is not None for o in owner):
    now = clock() - start
    admitted = []
    for slot in range(slots.num_slots):
      if owner[slot] is None and queue and arrivals[queue[0]] <= now:
        i = queue.popleft()
        tokens, lens = requests[i]
        state = slots.insert(params, state, jnp.int32(slot), tokens, lens,
                             jax.random.fold_in(rng, i))
        owner[slot] = i
        admitted.append(slot)
        stats["inserts"] += 1
    if admitted:
      # one transfer waits for the inserts (their outputs are ready together) and says
      # whether a request's first token already ended it (EOS, or max_new_tokens = 1)
      done_now = np.asarray(jax.device_get(state.done_B))
      t = clock() - start
      for slot in admitted:
        first[owner[slot]] = t
      if done_now[admitted].any() and collect(state, t):  # such a request leaves at once
        continue
    if all(o is None for o in owner):  # nothing running: wait for the next arrival
      time.sleep(max(0.0, arrivals[queue[0]] - (clock() - start)))
      continue
    # a free slot waiting for a later arrival: come back within step_bound steps
    waiting = queue and any(o is None for o in owner)
    bound = step_bound if waiting else np.iinfo(np.int32).max
    state, steps = slots.run(params, state, jnp.int32(bound), jnp.bool_(True))
    stats["runs"] += 1
    stats["loop_steps"] += int(steps)
    stats["slot_steps"] += int(steps) * slots.num_slots
    collect(state, clock() - start)
  stats["wall"] = clock() - start
  stats["target_calls"] = int(state.target_calls)
  return served, dict(stats), state
