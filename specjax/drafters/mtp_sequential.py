"""MTP with sequential modules (DeepSeek-V3): module k computes, at every position i,

    h^k_i = Block_k( W_k [RMSNorm(h^{k-1}_i) ; RMSNorm(Emb(t_{i+k}))] )

with h^0 the target's last residual stream, one transformer block of the target's shape, and
the target's (frozen) embedding and LM head: RMSNorm(h^k_i) -> LM head predicts t_{i+k+1}.

Decoding. Module k's output at the last cached position (end - 1) drafts d_k, consuming
d_{k-1} (the token module k-1 chose) as t_{end-1+k}. Each module attends over its own KV
cache, whose entry at position i is exact once t_{i+k} is committed (i <= end - k). Each step
module k recomputes the window [end - k - K, end - 1]: the positions that became exact since
the last step, plus the k - 1 speculative ones ending at end - 1. Training and decoding thus
see identical inputs at every committed position. Outputs h^k are kept per position too,
since module k + 1 reads them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.drafters.base import Context, Drafter, Prefill, Verified
from specjax.models import LayerKV, read_rows, write_rows
from specjax.models.layers import Block, RMSNorm, TransformerConfig, fan_in_init, param


class MTPModule(nnx.Module):

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    kw = dict(eps=cfg.norm_eps, param_dtype=cfg.weight_dtype, rngs=rngs)
    self.cfg = cfg
    self.norm_hidden = RMSNorm(cfg.d_model, **kw)
    self.norm_embed = RMSNorm(cfg.d_model, **kw)
    self.proj = param(rngs, fan_in_init(0, 1), (2 * cfg.d_model, cfg.d_model), (None, "embed"),
                      cfg.weight_dtype)
    self.block = Block(cfg, rngs=rngs)
    self.norm_out = RMSNorm(cfg.d_model, **kw)

  def __call__(self, h_prev_BxTxD, emb_BxTxD, positions_BxT, mask_BxTxS=None, cache=None,
               write_start_B=None):
    """Training: under `mask`. Decoding: the T positions are written into `cache` at
    write_start, and each sees the cache up to its own position."""
    x = jnp.concatenate([self.norm_hidden(h_prev_BxTxD), self.norm_embed(emb_BxTxD)], -1)
    x = x @ self.proj[...].astype(self.cfg.compute_dtype)
    num_keys = None if cache is None else jnp.max(positions_BxT) + 1
    return self.block(x, positions_BxT, mask_BxTxS, cache, write_start_B, num_keys)


class SequentialModules(nnx.Module):

  def __init__(self, cfg: TransformerConfig, num_modules: int, *, rngs: nnx.Rngs):
    self.stack = nnx.List([MTPModule(cfg, rngs=rngs) for _ in range(num_modules)])


def modules_from_config(cfg, target_cfg, rngs) -> SequentialModules:
  """The modules a training config (`num_heads` = depths) describes."""
  return SequentialModules(target_cfg, cfg.num_heads, rngs=rngs)


def shift_left(x_BxT, k: int, fill=0):
  """x[:, i + k] at position i (fill past the end)."""
  return jnp.pad(x_BxT[:, k:], ((0, 0), (0, k)), constant_values=fill)


@struct.dataclass
class SequentialState:
  h0_BxSxD: jax.Array  # the target's last residual stream, by position
  hidden: tuple  # per module: its outputs h^k by position, [B, S, D]
  caches: tuple  # per module: LayerKV over positions


@dataclasses.dataclass(frozen=True)
class MTPSequentialDrafter(Drafter):
  graphdef: nnx.GraphDef = None
  target_layers: int = 0  # the target's depth L: its residual after block L feeds module 1

  @property
  def feature_layers(self):
    return (self.target_layers,)

  def init(self, params, target, prefill: Prefill) -> SequentialState:
    mods = list(nnx.merge(self.graphdef, params).stack)[:self.num_draft_tokens]
    tokens, (h0,) = prefill.tokens_BxP, prefill.output.features
    b, p = tokens.shape
    s = prefill.cache_len
    positions = jnp.broadcast_to(jnp.arange(p), (b, p))
    zeros_b = jnp.zeros((b,), jnp.int32)
    cfg = target.cfg
    h0_buf = write_rows(jnp.zeros((b, s, cfg.d_model), h0.dtype), h0, zeros_b)
    # Entries whose inputs reach past the prompt are wrong here, and are recomputed by the
    # first draft step's windows before anything reads them.
    hidden, caches, h = [], [], h0
    for k, mod in enumerate(mods, start=1):
      kv_shape = (b, s, cfg.num_kv_heads, cfg.head_dim)
      cache = LayerKV(jnp.zeros(kv_shape, cfg.compute_dtype), jnp.zeros(kv_shape, cfg.compute_dtype))
      h, cache = mod(h, target.embed(shift_left(tokens, k)), positions, None, cache, zeros_b)
      hidden.append(write_rows(jnp.zeros((b, s, cfg.d_model), h.dtype), h, zeros_b))
      caches.append(cache)
    return SequentialState(h0_buf, tuple(hidden), tuple(caches))

  def propose(self, params, target, state: SequentialState, ctx: Context, sampler, rng):
    mods = list(nnx.merge(self.graphdef, params).stack)[:self.num_draft_tokens]
    big_k = self.num_draft_tokens
    end = ctx.end_B
    seq = ctx.seq_BxS
    rngs = jax.random.split(rng, big_k)
    prev_hidden = state.h0_BxSxD
    hidden, caches, drafts, qs = [], [], [], []
    for k, mod in enumerate(mods, start=1):
      width = big_k + k
      start = jnp.maximum(end - k - big_k, 0)
      positions = start[:, None] + jnp.arange(width)[None, :]
      tokens_in = read_rows(seq, start + k, width)  # t_{i+k}; drafts already written in seq
      h, cache = mod(read_rows(prev_hidden, start, width), target.embed(tokens_in), positions,
                     None, state.caches[k - 1], start)
      buf = write_rows(state.hidden[k - 1], h, start)
      last = jnp.take_along_axis(h, (end - 1 - start)[:, None, None], axis=1)
      logits = target.logits(mod.norm_out(last))[:, 0]
      d_k = sampler.sample(logits, rngs[k - 1])
      if not sampler.greedy:
        qs.append(sampler.probs(logits))
      seq = write_rows(seq, d_k[:, None], end + k)
      drafts.append(d_k)
      hidden.append(buf)
      caches.append(cache)
      prev_hidden = buf
    q = None if sampler.greedy else jnp.stack(qs, axis=1)
    state = SequentialState(state.h0_BxSxD, tuple(hidden), tuple(caches))
    return jnp.stack(drafts, axis=1), q, state

  def commit(self, params, target, state: SequentialState, verified: Verified):
    (h_window,) = verified.output.features
    h0 = write_rows(state.h0_BxSxD, h_window, verified.start_B)
    return state.replace(h0_BxSxD=h0)
