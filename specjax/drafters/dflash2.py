"""DFlash 2 (Z Lab): DFlash's one-pass block, with neighbour-aware slots and a learned reranker.

- Convolution: every drafter layer wraps its attention and its MLP in a grouped dynamic causal
  convolution over the block. `prepare` runs on the normed sublayer input: from it, a kernel
  projection (H -> 2 * taps * H/16, no bias) gives per-position, per-channel-group coefficients
  for both convolutions; the input is convolved with base_kernel[0] + the first set, the
  sublayer runs on that, and `finish` convolves its output with base_kernel[1] + the second
  set (the coefficients of the input, reused). Causal inside the block: slot t sees slots
  t - taps + 1 .. t of its own block, never the context or another block. Initialised as the
  identity (base tap 0 = 1, other taps and the projection 0), so a fresh DFlash 2 is DFlash.
- Candidate selector: per slot, the top-K logits of the target's LM head on the drafter's
  hidden state (output_multiplier and softcap applied) are the unary scores. Walking from the
  verified anchor (the block's first token), candidate c after predecessor p scores
  unary[c] + <pred_codebook[p] * P(h), succ_codebook[c]>. T = 0: the argmax; T > 0: a draw
  from the sampler's processed distribution over the K scores, returned as q over the
  vocabulary (0 outside the K candidates) for the min(1, p/q) rule, so verification is
  lossless. The walk is a lax.scan inside the on-device loop.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters import dflash
from specjax.drafters.base import Context, propose_from_logits
from specjax.drafters.walk import walk
from specjax.errors import SpecjaxError
from specjax.models.layers import TransformerConfig, param


class GroupedDynamicCausalConv(nnx.Module):
  """base_kernel [2, taps, H]; kernel_projection [H, 2 * taps * H/group] (specjax [in, out])."""

  def __init__(self, d: int, taps: int, group: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    if d % group:
      raise SpecjaxError(f"hidden size {d} is not a multiple of conv_group_size {group}")
    self.taps, self.group = taps, group
    base = jnp.zeros((2, taps, d), param_dtype).at[:, 0, :].set(1.0)
    self.base_kernel = nnx.Param(base)
    self.kernel_projection = param(rngs, nnx.initializers.zeros, (d, 2 * taps * (d // group)),
                                   (None, None), param_dtype)

  def _convolve(self, x_BxQxD, dyn_BxQxTxG, base_TxD, block_size):
    b, q, d = x_BxQxD.shape
    g = d // self.group
    x = x_BxQxD.reshape(b, q // block_size, block_size, g, self.group)
    dyn = dyn_BxQxTxG.reshape(b, q // block_size, block_size, self.taps, g)
    out = jnp.zeros_like(x)
    for o in range(self.taps):
      shifted = x if o == 0 else jnp.pad(x[:, :, :-o], ((0, 0), (0, 0), (o, 0), (0, 0), (0, 0)))
      kernel = base_TxD[o].reshape(g, self.group).astype(x.dtype) + dyn[:, :, :, o, :, None]
      out = out + kernel * shifted
    return out.reshape(b, q, d)

  def prepare(self, h_BxQxD, block_size):
    """(the convolved sublayer input, the coefficients `finish` reuses)."""
    b, q, d = h_BxQxD.shape
    dyn = (h_BxQxD @ self.kernel_projection[...].astype(h_BxQxD.dtype)).reshape(
        b, q, 2, self.taps, d // self.group)
    return (self._convolve(h_BxQxD, dyn[:, :, 0], self.base_kernel[0], block_size),
            dyn[:, :, 1])

  def finish(self, y_BxQxD, dyn_BxQxTxG, block_size):
    return self._convolve(y_BxQxD, dyn_BxQxTxG, self.base_kernel[1], block_size)


class DFlash2Layer(dflash.DFlashLayer):
  """A DFlash layer whose attention and MLP sublayers are each wrapped in a convolution."""

  def __init__(self, cfg: TransformerConfig, taps: int, group: int, *, rngs: nnx.Rngs):
    super().__init__(cfg, rngs=rngs)
    self.attention_conv = GroupedDynamicCausalConv(cfg.d_model, taps, group, rngs=rngs,
                                                   param_dtype=cfg.weight_dtype)
    self.mlp_conv = GroupedDynamicCausalConv(cfg.d_model, taps, group, rngs=rngs,
                                             param_dtype=cfg.weight_dtype)

  def sublayers(self, x_BxQxD, attend, block_size):
    bs = block_size or x_BxQxD.shape[1]
    h, dyn = self.attention_conv.prepare(self.attn_norm(x_BxQxD), bs)
    x = x_BxQxD + self.attention_conv.finish(attend(h), dyn, bs)
    h, dyn = self.mlp_conv.prepare(self.mlp_norm(x), bs)
    return x + self.mlp_conv.finish(self.mlp(h), dyn, bs)


class CandidateSelector(nnx.Module):
  """hidden_projection [H, r] (0 at init: the selector starts as the plain top-K argmax),
  predecessor / successor codebooks [V, r]."""

  def __init__(self, d: int, vocab: int, rank: int, top_k: int, *, rngs: nnx.Rngs,
               param_dtype=jnp.float32):
    if not 1 <= top_k <= vocab:
      raise SpecjaxError(f"selector_top_k={top_k} outside 1..{vocab} (the vocabulary)")
    self.top_k = top_k
    self.hidden_projection = param(rngs, nnx.initializers.zeros, (d, rank), (None, None),
                                   param_dtype)
    init = nnx.initializers.normal(1.0)
    self.predecessor_codebook = param(rngs, init, (vocab, rank), (None, None), param_dtype)
    self.successor_codebook = param(rngs, init, (vocab, rank), (None, None), param_dtype)

  def candidates(self, logits_BxKxV):
    """(unary scores, candidate tokens), each [B, K, top_k]."""
    unary, cand = jax.lax.top_k(logits_BxKxV.astype(jnp.float32), self.top_k)
    return unary, cand.astype(jnp.int32)

  def pair_scores(self, hidden_BxKxD, predecessors_BxK, cand_BxKxN):
    """<pred_codebook[p] * P(h), succ_codebook[c]> for each slot's predecessor p: [B, K, N]."""
    h = hidden_BxKxD.astype(jnp.float32) @ self.hidden_projection[...].astype(jnp.float32)
    pred = self.predecessor_codebook[...].astype(jnp.float32)[predecessors_BxK]
    succ = self.successor_codebook[...].astype(jnp.float32)[cand_BxKxN]
    return jnp.einsum("bkr,bknr->bkn", pred * h, succ)

  def select(self, hidden_BxKxD, logits_BxKxV, anchor_B, sampler, rng):
    """The walk from the anchor: (tokens [B, K], candidates [B, K, N], scores [B, K, N] along
    the path, q over the candidates [B, K, N] or None at T = 0)."""
    unary, cand = self.candidates(logits_BxKxV)
    h = hidden_BxKxD.astype(jnp.float32) @ self.hidden_projection[...].astype(jnp.float32)
    pred_cb = self.predecessor_codebook[...].astype(jnp.float32)
    succ = self.successor_codebook[...].astype(jnp.float32)[cand]  # [B, K, N, r]

    def slot(prev_B, x):
      u_BxN, c_BxN, s_BxNxR, h_BxR = x
      return u_BxN + jnp.einsum("br,bnr->bn", pred_cb[prev_B] * h_BxR, s_BxNxR), c_BxN, ()

    tokens, scores, q, _ = walk(slot, (unary, cand, succ, h), anchor_B, sampler, rng,
                                keep_scores=True)
    return tokens, cand, scores, q


def scatter_q(q_BxKxN, cand_BxKxN, vocab: int):
  """q over the K candidates -> [B, K, V], zero outside them."""
  b, k, _ = q_BxKxN.shape
  full = jnp.zeros((b, k, vocab), q_BxKxN.dtype)
  return full.at[jnp.arange(b)[:, None, None], jnp.arange(k)[None, :, None], cand_BxKxN].set(
      q_BxKxN)


def dflash2_model(cfg: TransformerConfig, num_layers: int, num_features: int, *,
                  rngs: nnx.Rngs, conv_kernel_size: int = 2, conv_group_size: int = 16,
                  selector_rank: int = 64, selector_top_k: int = 16,
                  **backbone) -> dflash.DFlashModel:
  """DFlash's block backbone with DFlash 2 layers and the candidate selector as its head."""
  layer_cfg = backbone.get("layer_cfg") or cfg
  selector = lambda rngs: {"candidate_selector": CandidateSelector(
      cfg.d_model, cfg.vocab_size, selector_rank, selector_top_k, rngs=rngs,
      param_dtype=layer_cfg.weight_dtype)}
  return dflash.DFlashModel(
      cfg, num_layers, num_features, rngs=rngs, **backbone,
      make_layer=lambda c, rngs: DFlash2Layer(c, conv_kernel_size, conv_group_size, rngs=rngs),
      heads=selector)


@dataclasses.dataclass(frozen=True)
class DFlash2Drafter(dflash.DFlashDrafter):
  """DFlash's drafter; proposals come from the candidate selector (use_selector=False: DFlash's
  own proposal from the same hidden states, for ablation)."""

  use_selector: bool = True

  def propose(self, params, target, caches, ctx: Context, sampler, rng):
    model = nnx.merge(self.graphdef, params)
    hidden, caches = self.draft_hidden(model, target, caches, ctx)
    logits = model.draft_logits(target, hidden)
    if not self.use_selector:
      return propose_from_logits(logits, sampler, rng, self.proposal) + (caches,)
    tokens, cand, _, q = model.candidate_selector.select(hidden, logits, ctx.pending_B,
                                                         sampler, rng)
    if q is not None:
      q = scatter_q(q, cand, logits.shape[-1])
    return tokens.astype(jnp.int32), q, caches


# Built from its (training or imported) config, like DFlash.

SELECTOR_KEYS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 64,
                 "selector_top_k": 16}


def build_model(cfg, target_cfg, rngs):
  return dflash2_model(
      target_cfg, cfg.num_layers, len(dflash.feature_layers(cfg, target_cfg.num_layers)),
      rngs=rngs, **dflash.backbone_kwargs(cfg, target_cfg),
      **{k: int(cfg.get(k, v)) for k, v in SELECTOR_KEYS.items()})
