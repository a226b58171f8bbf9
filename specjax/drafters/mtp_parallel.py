"""MTP with parallel heads (Medusa; Gloeckle et al. 2024): head k reads the target's last
hidden state at position t and predicts token t+k+1 through the target's own LM head.

Head k is a stack of zero-initialised residual blocks h + SiLU(h W), so training starts from
the identity (every head first predicts the next token). All heads run at once on the hidden
state the target already produced while verifying: drafting needs no extra target pass.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters.base import Context, Drafter, Prefill, Verified, propose_from_logits
from specjax.models.layers import param


class ResidualBlock(nnx.Module):

  def __init__(self, d_model: int, *, param_dtype, rngs: nnx.Rngs):
    self.w = param(rngs, nnx.initializers.zeros, (d_model, d_model), ("embed", "mlp"),
                   param_dtype)

  def __call__(self, h):
    return h + jax.nn.silu(h @ self.w[...].astype(h.dtype))


class ParallelHeads(nnx.Module):

  def __init__(self, d_model: int, num_heads: int, *, layers_per_head: int = 1,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.heads = nnx.List([
        nnx.List([ResidualBlock(d_model, param_dtype=param_dtype, rngs=rngs)
                  for _ in range(layers_per_head)])
        for _ in range(num_heads)])

  @property
  def num_heads(self) -> int:
    return len(self.heads)

  def __call__(self, hidden_BxTxD, count: int | None = None):
    """Hidden states of the first `count` heads: a tuple of [B, T, D]."""
    out = []
    for head in list(self.heads)[:self.num_heads if count is None else count]:
      h = hidden_BxTxD
      for block in head:
        h = block(h)
      out.append(h)
    return tuple(out)


def heads_from_config(cfg, target_cfg, rngs) -> ParallelHeads:
  """The heads a training config (`num_heads`, `layers_per_head`) describes."""
  return ParallelHeads(target_cfg.d_model, cfg.num_heads, layers_per_head=cfg.layers_per_head,
                       param_dtype=target_cfg.weight_dtype, rngs=rngs)


@dataclasses.dataclass(frozen=True)
class MTPParallelDrafter(Drafter):
  """State: the target's final hidden state at the last cached position, [B, D]."""

  graphdef: nnx.GraphDef = None
  proposal: str = "sample"  # at T > 0: "sample" from q_k (verified with q) | "argmax"

  def init(self, params, target, prefill: Prefill):
    hidden = prefill.output.hidden_BxTxD
    return jnp.take_along_axis(hidden, (prefill.lens_B - 1)[:, None, None], axis=1)[:, 0]

  def propose(self, params, target, h_BxD, ctx: Context, sampler, rng):
    heads = nnx.merge(self.graphdef, params)
    hidden = heads(h_BxD[:, None], self.num_draft_tokens)
    logits_BxKxV = jnp.concatenate([target.logits(h) for h in hidden], axis=1)
    return propose_from_logits(logits_BxKxV, sampler, rng, self.proposal) + (h_BxD,)

  def commit(self, params, target, h_BxD, verified: Verified):
    last = jnp.take_along_axis(verified.output.hidden_BxTxD,
                               verified.num_kept_B[:, None, None], axis=1)[:, 0]
    return jnp.where(verified.active_B[:, None], last, h_BxD)
