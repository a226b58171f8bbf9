"""The drafter interface: what every method implements and the decode loop calls.

A drafter is a frozen, hashable dataclass (its static configuration; a static jit argument)
with three pure methods over its parameters and its state (pytrees). The loop never looks
inside them, so adding a method never touches the loop.

Positions: after the prefill the target cache holds the prompt, and `pending` (the first
generated token, at position end_B) is committed but not yet cached. Each step the drafter
proposes d_1..d_K to follow `pending`; the target scores the window [pending, d_1..d_K] at
positions end_B..end_B+K; m drafts are accepted and the target adds one token y, so the
committed length grows by m + 1 and `pending` becomes y.
"""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.sampling import Sampler
from specjax.errors import SpecjaxError
from specjax.models import TransformerOutput


@struct.dataclass
class Prefill:
  tokens_BxP: jax.Array  # right-padded prompts
  lens_B: jax.Array
  output: TransformerOutput  # the target's pass over the prompts (features as requested)
  cache_len: int = struct.field(pytree_node=False)


@struct.dataclass
class Context:
  seq_BxS: jax.Array  # committed tokens by position (prompt, then generated)
  end_B: jax.Array  # position of `pending` = number of target-cached positions
  pending_B: jax.Array


@struct.dataclass
class Verified:
  window_BxK1: jax.Array  # [pending, d_1..d_K] as scored by the target
  start_B: jax.Array  # position of window[:, 0] (the end_B of the Context)
  num_kept_B: jax.Array  # m in 0..K: drafts kept (fewer than verification accepted
  # only when EOS or max_new_tokens ended the row in this step)
  next_B: jax.Array  # the target's token after the accepted drafts (the new pending)
  output: TransformerOutput  # the target's verify pass over the window
  active_B: jax.Array  # rows that were still generating this step


@dataclasses.dataclass(frozen=True)
class Drafter(abc.ABC):
  num_draft_tokens: int  # K

  def __post_init__(self):
    if self.num_draft_tokens < 1:
      raise SpecjaxError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens} "
                         "(use --config.methods=ar for no drafting)")

  @property
  def feature_layers(self) -> tuple[int, ...]:
    """Target residual-stream layers this drafter reads from the prefill and verify passes."""
    return ()

  @abc.abstractmethod
  def init(self, params, target, prefill: Prefill):
    """Drafter state after the target's prefill."""

  @abc.abstractmethod
  def propose(self, params, target, state, ctx: Context, sampler: Sampler, rng):
    """Returns (drafts_BxK int32, q_BxKxV or None, state). q None means single-token
    proposals (one-hot q); otherwise q is the processed distribution each draft came from."""

  @abc.abstractmethod
  def commit(self, params, target, state, verified: Verified):
    """State after verification: keep what the accepted tokens justify, drop the rest."""

  # Optional: a per-row verify budget (see decoding/schedule.py). A drafter that returns one
  # names the verify widths the loop compiles; the budget must be fixed from what the drafter
  # knows before verification (never from the target's view of the drafts).
  @property
  def verify_widths(self) -> tuple[int, ...] | None:
    """Draft counts the loop compiles a verify pass for (it runs the smallest that holds the
    largest budget); None = the drafter gives no budget."""
    return None

  def verify_budget(self, params, state, active_B):
    """budget_B int32 in 0..K (drafts at index >= budget are not verified), or None = all K;
    called right after `propose`."""
    return None

  def step_statistics(self, state, active_B) -> dict:
    """Per-step sums over active rows that the loop accumulates (e.g. confidences)."""
    return {}

  def summary(self) -> dict:
    """The drafter's own settings worth recording beside its metrics (host side, JSON)."""
    return {}

PROPOSALS = ("sample", "argmax")


def propose_from_logits(logits_BxKxV, sampler, rng, proposal: str):
  """(drafts, q): at T > 0 with proposal "sample", each position drawn from its own processed
  distribution q_k, returned for the general min(1, p/q) rule; otherwise argmax, q None."""
  if proposal not in PROPOSALS:
    raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
  if sampler.greedy or proposal == "argmax":
    return jnp.argmax(logits_BxKxV, -1).astype(jnp.int32), None
  return sampler.sample(logits_BxKxV, rng), sampler.probs(logits_BxKxV)
