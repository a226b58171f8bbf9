"""The AR baseline: the target alone, one token per pass, in one on-device while loop."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.decoding.common import DecodeLoop, DecodeResult, LoopState, commit_tokens


@dataclasses.dataclass(frozen=True)
class ARDecoder(DecodeLoop):

  @functools.partial(jax.jit, static_argnums=0)
  def decode(self, params, tokens_BxP, lens_B, rng) -> DecodeResult:
    state = self.init_state(params, tokens_BxP, lens_B, rng)
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B),
                               lambda s: self.step(params, s), state)
    return self.finish(final)

  def init_state(self, params, tokens_BxP, lens_B, rng) -> LoopState:
    """The prefill and the first token: the loop's carry before its first step."""
    target = nnx.merge(self.graphdef, params)
    cache, _, rng, first_B, out, count, done = self.start(target, tokens_BxP, lens_B, rng)
    return self.shard(LoopState(cache, first_B, out, count, done, rng, jnp.int32(1),
                                jnp.zeros_like(count)))

  def step(self, params, s: LoopState) -> LoopState:
    """One target pass: every active row commits one token."""
    target = nnx.merge(self.graphdef, params)
    step_out = target(s.pending_B[:, None], cache=s.cache)
    rng, step_rng = jax.random.split(s.rng)
    next_B = self.sampler.sample(step_out.logits_BxTxV[:, 0], step_rng)
    active = ~s.done_B
    out, count, done = commit_tokens(s.out_BxN, s.count_B, s.done_B, next_B[:, None],
                                     jnp.ones_like(s.count_B), self.max_new_B(s.count_B),
                                     self.eos_id)
    cache = step_out.cache.rollback(jnp.where(active, s.cache.end_B + 1, s.cache.end_B))
    return self.shard(LoopState(cache, jnp.where(active, next_B, s.pending_B), out, count,
                                done, rng, s.target_calls + 1, s.steps_B + active))

  def finish(self, final: LoopState) -> DecodeResult:
    return self.result(final, jnp.stack([final.steps_B.sum()]))
