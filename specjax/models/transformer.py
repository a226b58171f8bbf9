"""The target: a Llama/Qwen3-style decoder-only transformer in Flax NNX.

One `__call__` serves training (full sequences, packed documents) and decoding (a pass over
n >= 1 new positions appended to a KV cache). It can also return the residual stream after
any listed layers, which drafters condition on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.models import weights
from specjax.models.kv_cache import KVCache
from specjax.models.layers import (
    Block,
    RMSNorm,
    TransformerConfig,
    causal_segment_mask,
    fan_in_init,
    param,
)


@struct.dataclass
class TransformerOutput:
  logits_BxTxV: jax.Array | None
  hidden_BxTxD: jax.Array  # after the final norm: what the LM head reads
  features: tuple[jax.Array, ...]  # residual stream after each requested layer
  cache: KVCache | None


class Transformer(nnx.Module):

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.weight_dtype
    self.embedding = param(
        rngs, nnx.initializers.normal(cfg.d_model**-0.5), (cfg.vocab_size, cfg.d_model),
        ("vocab", "embed"), pd
    )
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pd, rngs=rngs)
    if not cfg.tie_embeddings:
      self.lm_head = param(
          rngs, fan_in_init(0, 1), (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), pd
      )

  def embed(self, tokens_BxT):
    return weights.embed(self.embedding, tokens_BxT, self.cfg.compute_dtype)

  def logits(self, hidden_BxTxD, vocab_ids_V=None):
    """LM head (tied or not); logits are accumulated and returned in float32, whatever the
    compute dtype, so bf16 models do not round the logits that sampling compares. With
    vocab_ids_V: only those entries' logits (a reduced draft vocabulary), in that order."""
    tied = self.cfg.tie_embeddings
    return weights.lm_head(hidden_BxTxD, self.embedding if tied else self.lm_head, tied,
                           self.cfg.compute_dtype, vocab_ids_V)

  def init_cache(self, batch: int, length: int) -> KVCache:
    cfg = self.cfg
    return KVCache.create(
        num_layers=cfg.num_layers, batch=batch, length=length, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, dtype=cfg.compute_dtype,
    )

  def __call__(
      self,
      tokens_BxT,
      *,
      positions_BxT=None,
      segment_ids_BxT=None,
      cache: KVCache | None = None,
      feature_layers: tuple[int, ...] = (),
      compute_logits: bool = True,
  ) -> TransformerOutput:
    """Runs the decoder.

    Without `cache`: a training pass; `segment_ids` (packed documents) restrict attention to
    the same document and `positions` restart per document. With `cache`: the T tokens
    are positions [end, end + T) of each row; they are written into the cache, whose `end`
    advances by T (call `cache.rollback` to keep fewer).

    `feature_layers`: indices into the residual stream, 0 = embeddings, l = after block l.
    """
    b, t = tokens_BxT.shape
    if cache is None:
      if positions_BxT is None:
        positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      if segment_ids_BxT is None:
        segment_ids_BxT = jnp.ones((b, t), jnp.int32)
      mask = causal_segment_mask(segment_ids_BxT)
      write_start = num_keys = None
    else:
      write_start = cache.end_B
      positions_BxT = write_start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      mask = None
      num_keys = jnp.max(write_start) + t  # every row's keys lie in [0, num_keys)

    x = self.embed(tokens_BxT)
    residuals = [x]
    new_layers = []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else cache.layers[i]
      x, layer_cache = block(x, positions_BxT, mask, layer_cache, write_start, num_keys)
      new_layers.append(layer_cache)
      residuals.append(x)
    hidden = self.final_norm(x)
    if cache is not None:
      cache = KVCache(layers=tuple(new_layers), end_B=cache.end_B + t)
    return TransformerOutput(
        logits_BxTxV=self.logits(hidden) if compute_logits else None,
        hidden_BxTxD=hidden,
        features=tuple(residuals[i] for i in feature_layers),
        cache=cache,
    )


def default_feature_layers(num_layers: int, count: int) -> tuple[int, ...]:
  """`count` layers spread evenly from layer 1 to L-3 (DFlash: 5 of 36 layers, 1..33).
  A target too shallow for that range (L-3 < count) spreads them from 1 to L-1 instead."""
  if count < 1:
    return ()
  last = num_layers - 3 if num_layers - 3 >= count else num_layers - 1
  last = max(1, last)
  if count == 1:
    return (last,)
  return tuple(sorted({1 + round(i * (last - 1) / (count - 1)) for i in range(count)}))
