"""Prompt lookup: a training-free drafter, the floor every trained drafter must clear.

Proposes the K tokens that followed the most recent earlier occurrence of the last n
committed tokens (n from `max_ngram` down to 1) in the prompt and generated text.

Only the tokens that really follow the match are verified: a per-row budget (the loop's
verify-width mechanism, decoding/schedule.py) of 0 when no n-gram recurs, else the
continuation's length up to K. A row with nothing to propose then pays a one-token pass,
not a K+1-token one, as transformers' prompt lookup does. The budget is a function of the
committed tokens alone, fixed before verification: lossless at any temperature.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.decoding.schedule import default_widths
from specjax.drafters.base import Context, Drafter


def lookup_start(seq_BxS, length_B, ngram: int):
  """Position right after the latest earlier occurrence of the last `ngram` tokens, or -1."""
  s = seq_BxS.shape[1]
  j = jnp.arange(s)[None, :]
  match = jnp.ones(seq_BxS.shape, bool)
  for i in range(ngram):
    tail_B = jnp.take_along_axis(seq_BxS, jnp.clip(length_B - ngram + i, 0, s - 1)[:, None], 1)
    match &= jnp.roll(seq_BxS, -i, axis=1) == tail_B
  # the occurrence must end before the tail itself ends, so a continuation exists
  valid = (j + ngram <= length_B[:, None] - 1) & (length_B[:, None] >= ngram)
  found = jnp.max(jnp.where(match & valid, j, -1), axis=1)
  return jnp.where(found >= 0, found + ngram, -1)


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(Drafter):
  max_ngram: int = 3

  @property
  def verify_widths(self):
    return default_widths(self.num_draft_tokens)

  def init(self, params, target, prefill):
    return jnp.zeros(prefill.lens_B.shape, jnp.int32)  # the state: this step's budget

  def verify_budget(self, params, state, active_B):
    return state

  def propose(self, params, target, state, ctx: Context, sampler, rng):
    length_B = ctx.end_B + 1
    start_B = jnp.full_like(length_B, -1)
    for n in range(self.max_ngram, 0, -1):
      start_B = jnp.where(start_B < 0, lookup_start(ctx.seq_BxS, length_B, n), start_B)
    index = start_B[:, None] + jnp.arange(self.num_draft_tokens)[None, :]
    index = jnp.minimum(index, length_B[:, None] - 1)
    drafts = jnp.take_along_axis(ctx.seq_BxS, jnp.maximum(index, 0), axis=1)
    drafts = jnp.where(start_B[:, None] >= 0, drafts, ctx.pending_B[:, None])
    budget_B = jnp.where(start_B >= 0, jnp.clip(length_B - start_B, 0, self.num_draft_tokens), 0)
    return drafts.astype(jnp.int32), None, budget_B.astype(jnp.int32)

  def commit(self, params, target, state, verified):
    return state
