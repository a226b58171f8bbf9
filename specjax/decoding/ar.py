"""The AR baseline: the target alone, one token per pass, in one on-device while loop."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.decoding.common import DecodeResult, commit_tokens, prefill
from specjax.decoding.sampling import Sampler
from specjax.models import KVCache


@struct.dataclass
class ARState:
  cache: KVCache
  pending_B: jax.Array  # last committed token, not yet in the cache
  out_BxN: jax.Array
  count_B: jax.Array
  done_B: jax.Array
  rng: jax.Array
  target_calls: jax.Array
  steps_B: jax.Array


@dataclasses.dataclass(frozen=True)
class ARDecoder:
  """Static description of the loop (hashable: a static jit argument)."""

  graphdef: nnx.GraphDef
  sampler: Sampler
  max_new_tokens: int
  cache_len: int
  eos_id: int
  keep_cache: bool = False  # return the final target cache (tests inspect it)

  @functools.partial(jax.jit, static_argnums=0)
  def __call__(self, params, tokens_BxP, lens_B, rng) -> DecodeResult:
    target = nnx.merge(self.graphdef, params)
    b = tokens_BxP.shape[0]
    max_new_B = jnp.full((b,), self.max_new_tokens, jnp.int32)
    cache, _, last_logits = prefill(target, tokens_BxP, lens_B, self.cache_len)
    rng, first_rng = jax.random.split(rng)
    first_B = self.sampler.sample(last_logits, first_rng)
    out = jnp.zeros((b, self.max_new_tokens + 1), jnp.int32)
    zeros = jnp.zeros((b,), jnp.int32)
    out, count, done = commit_tokens(out, zeros, zeros.astype(bool), first_B[:, None],
                                     zeros + 1, max_new_B, self.eos_id)
    state = ARState(cache, first_B, out, count, done, rng, jnp.int32(1), zeros)

    def body(s: ARState) -> ARState:
      step_out = target(s.pending_B[:, None], cache=s.cache)
      rng, step_rng = jax.random.split(s.rng)
      next_B = self.sampler.sample(step_out.logits_BxTxV[:, 0], step_rng)
      active = ~s.done_B
      out, count, done = commit_tokens(s.out_BxN, s.count_B, s.done_B, next_B[:, None],
                                       jnp.ones_like(s.count_B), max_new_B, self.eos_id)
      cache = step_out.cache.rollback(jnp.where(active, s.cache.end_B + 1, s.cache.end_B))
      return ARState(cache, jnp.where(active, next_B, s.pending_B), out, count, done, rng,
                     s.target_calls + 1, s.steps_B + active)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done_B), body, state)
    return DecodeResult(
        tokens_BxN=final.out_BxN[:, :self.max_new_tokens], num_tokens_B=final.count_B,
        target_calls=final.target_calls, verify_steps_B=final.steps_B,
        accept_counts=jnp.stack([final.steps_B.sum()]),
        cache=final.cache if self.keep_cache else None)
