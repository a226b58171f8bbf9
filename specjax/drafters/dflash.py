"""DFlash (Chen, Liang, Liu 2026): a block-diffusion drafter that drafts a whole block in one
forward pass, conditioned on the target's hidden states.

- Target features: the residual stream of a few target layers at each context position,
  concatenated, projected by one linear map (L_f * H -> H, no bias) and RMS-normalised.
- KV injection: in every drafter layer, keys and values come from [context features ; block],
  queries from the block only; context features skip the query, output projection and MLP.
  Attention inside the block is non-causal; the block sees every context position.
- Block: [last committed token, MASK x (B-1)] at positions continuing the context; the
  committed token uses the target's embedding; the mask slots use either the target's
  embedding of a dedicated `mask_token_id` (Z Lab's design; what imported and exportable
  drafters use) or a learned mask vector. One pass gives B-1 drafts through the target's
  frozen LM head (optionally scaled by `output_multiplier`, then soft-capped).
- Layers: the drafter's own heads / head_dim / MLP width (`layer_cfg`); the hidden size is the
  target's.
- Proposals at T > 0: `proposal="sample"` draws each slot from its own processed
  distribution q_k and verification uses that q (lossless, as the reference does);
  `"argmax"` proposes the argmax (one-hot q).
- Cache: per layer, the K/V of the projected context features at committed positions. The
  block's K/V are written in place at the block's positions while drafting, and the commit
  overwrites them with the context K/V of the verified window; entries past the committed
  length are never read (the next block overwrites them first).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters.base import Context, Drafter, Prefill, Verified, propose_from_logits
from specjax.errors import SpecjaxError
from specjax.models import LayerKV, default_feature_layers, write_rows
from specjax.models.layers import Block, RMSNorm, TransformerConfig, fan_in_init, param


class DFlashLayer(Block):
  """The target's block shape; attention gets its keys and values from [context ; block]."""

  def context_kv(self, ctx_BxTxD, positions_BxT) -> LayerKV:
    return LayerKV(*self.attn.keys_values(ctx_BxTxD, positions_BxT))

  def __call__(self, x_BxQxD, positions_BxQ, ctx: LayerKV, mask_BxQxC, block_size=None):
    """mask covers keys [context ; block]: C = context length + Q."""
    def attend(h):
      q = self.attn.queries(h, positions_BxQ)
      k, v = self.attn.keys_values(h, positions_BxQ)
      k = jnp.concatenate([ctx.k_BxSxKVxH.astype(k.dtype), k], axis=1)
      v = jnp.concatenate([ctx.v_BxSxKVxH.astype(v.dtype), v], axis=1)
      return self.attn.attend(q, k, v, mask_BxQxC)
    return self.sublayers(x_BxQxD, attend, block_size)

  def sublayers(self, x_BxQxD, attend, block_size):
    """x + attention, then + MLP; `attend` is attention on the normed input. The hook DFlash 2
    wraps (block_size: the length of each block in x, which DFlash ignores)."""
    x = x_BxQxD + attend(self.attn_norm(x_BxQxD))
    return x + self.mlp(self.mlp_norm(x))

  def decode(self, x_BxQxD, positions_BxQ, cache: LayerKV, num_keys):
    """The same layer at decode time: the block's K/V are written into the context cache in
    place, at the block's positions (slots the next commit overwrites with context K/V),
    and every block query sees the cache up to the block's last position."""
    written = []

    def attend(h):
      q = self.attn.queries(h, positions_BxQ)
      k, v = self.attn.keys_values(h, positions_BxQ)
      start = positions_BxQ[:, 0]
      new = LayerKV(write_rows(cache.k_BxSxKVxH, k, start), write_rows(cache.v_BxSxKVxH, v, start))
      written.append(new)
      limit = jnp.broadcast_to(positions_BxQ[:, -1:], positions_BxQ.shape)  # non-causal block
      return self.attn.attend_prefix(q, new.k_BxSxKVxH, new.v_BxSxKVxH, limit, num_keys)
    x = self.sublayers(x_BxQxD, attend, x_BxQxD.shape[1])
    return x, written[0]


class DFlashModel(nnx.Module):
  """The block backbone's parameters (feature projection, mask embedding, layers, final norm)
  and the method's heads. DFlash, DSpark and DFlash 2 are this module with other layers or
  heads (`dspark.dspark_model`, `dflash2.dflash2_model`)."""

  def __init__(self, cfg: TransformerConfig, num_layers: int, num_features: int, *,
               rngs: nnx.Rngs, layer_cfg: TransformerConfig | None = None,
               mask_token_id: int | None = None, output_multiplier: float = 1.0,
               logit_softcap: float = 0.0, embedding_scale: float = 1.0, make_layer=None,
               heads=None):
    """cfg: the target's shape. layer_cfg: the drafter layers' shape (d_model = the target's;
    default: the target's own). mask_token_id: mask slots are the target's embedding of this
    token (None: a learned mask vector). embedding_scale multiplies the block's embeddings.
    make_layer(layer_cfg, rngs): one block layer (default DFlashLayer; DFlash 2 passes its
    convolution-wrapped layer). heads(rngs) -> {attribute name: module}: the method's modules
    on top of the backbone, made after it (DFlash: none, it reads the target's LM head; DSpark:
    the Markov and confidence heads; DFlash 2: the candidate selector); the drafter calls
    them."""
    layer_cfg = layer_cfg or cfg
    if layer_cfg.d_model != cfg.d_model:
      raise ValueError(f"drafter d_model {layer_cfg.d_model} != target d_model {cfg.d_model}")
    d, pd = cfg.d_model, layer_cfg.weight_dtype
    self.cfg = cfg
    self.layer_cfg = layer_cfg
    self.mask_token_id = mask_token_id
    self.output_multiplier = float(output_multiplier)
    self.logit_softcap = float(logit_softcap)
    self.embedding_scale = float(embedding_scale)
    eps = layer_cfg.norm_eps
    self.fc = param(rngs, fan_in_init(0, 1), (num_features * d, d), (None, "embed"), pd)
    self.fc_norm = RMSNorm(d, eps=eps, param_dtype=pd, rngs=rngs)
    if mask_token_id is None:
      self.mask_embedding = param(rngs, nnx.initializers.normal(d**-0.5), (d,), ("embed",), pd)
    make_layer = make_layer or (lambda c, rngs: DFlashLayer(c, rngs=rngs))
    self.layers = nnx.List([make_layer(layer_cfg, rngs) for _ in range(num_layers)])
    self.final_norm = RMSNorm(d, eps=eps, param_dtype=pd, rngs=rngs)
    for name, head in (heads(rngs) if heads else {}).items():
      if hasattr(self, name):
        raise ValueError(f"head name {name!r} is taken by the backbone")
      setattr(self, name, head)

  def project(self, features) -> jax.Array:
    """Target features (a tuple of [B, T, D]) -> context features [B, T, D]."""
    x = jnp.concatenate(features, axis=-1).astype(self.cfg.compute_dtype)
    return self.fc_norm(x @ self.fc[...].astype(self.cfg.compute_dtype))

  def context_kv(self, ctx_BxTxD, positions_BxT) -> tuple[LayerKV, ...]:
    return tuple(layer.context_kv(ctx_BxTxD, positions_BxT) for layer in self.layers)

  def block_inputs(self, target, first_tokens_BxA, block_size: int):
    """Embedded blocks [token, MASK x (B-1)]: [B, A * block_size, D]."""
    b, a = first_tokens_BxA.shape
    first = target.embed(first_tokens_BxA)[:, :, None, :]
    if self.mask_token_id is None:
      mask_D = self.mask_embedding[...].astype(first.dtype)
    else:
      mask_D = target.embed(jnp.asarray(self.mask_token_id, jnp.int32))
    masks = jnp.broadcast_to(mask_D, (b, a, block_size - 1, first.shape[-1]))
    x = jnp.concatenate([first, masks], axis=2).reshape(b, a * block_size, -1)
    return x * self.embedding_scale if self.embedding_scale != 1.0 else x

  def draft_logits(self, target, hidden_BxTxD):
    """The target's LM head on drafter hidden states, then output_multiplier and softcap."""
    logits = target.logits(hidden_BxTxD)
    if self.output_multiplier != 1.0:
      logits = logits * self.output_multiplier
    if self.logit_softcap > 0:
      logits = jnp.tanh(logits / self.logit_softcap) * self.logit_softcap
    return logits

  def __call__(self, x_BxQxD, positions_BxQ, ctx_kv, mask_BxQxC, block_size=None):
    """block_size: the length of each block in x (None: x is one block)."""
    for layer, kv in zip(self.layers, ctx_kv):
      x_BxQxD = layer(x_BxQxD, positions_BxQ, kv, mask_BxQxC, block_size)
    return self.final_norm(x_BxQxD)

  def decode_block(self, x_BxQxD, positions_BxQ, caches):
    """One block at positions [end, end + Q) against the cached context [0, end). Returns
    the final hidden states and the caches with the block's K/V written in place."""
    num_keys = jnp.max(positions_BxQ) + 1
    new = []
    for layer, cache in zip(self.layers, caches):
      x_BxQxD, cache = layer.decode(x_BxQxD, positions_BxQ, cache, num_keys)
      new.append(cache)
    return self.final_norm(x_BxQxD), tuple(new)


@dataclasses.dataclass(frozen=True)
class DFlashDrafter(Drafter):
  """num_draft_tokens = block_size - 1. State: per-layer context K/V over positions."""

  graphdef: nnx.GraphDef = None
  target_feature_layers: tuple[int, ...] = ()
  proposal: str = "sample"  # at T > 0: "sample" from q_k (verified with q) | "argmax"

  @property
  def feature_layers(self):
    return self.target_feature_layers

  @property
  def block_len(self) -> int:
    """Inputs of one drafted block: the pending token and K mask slots (DSpark: K)."""
    return self.num_draft_tokens + 1

  def _write_context(self, model, caches, features, start_B):
    ctx = model.project(features)
    positions = start_B[:, None] + jnp.arange(ctx.shape[1])[None, :]
    new = model.context_kv(ctx, positions)
    return tuple(LayerKV(write_rows(c.k_BxSxKVxH, n.k_BxSxKVxH, start_B),
                         write_rows(c.v_BxSxKVxH, n.v_BxSxKVxH, start_B))
                 for c, n in zip(caches, new))

  def init(self, params, target, prefill: Prefill):
    model = nnx.merge(self.graphdef, params)
    cfg = model.layer_cfg
    b = prefill.tokens_BxP.shape[0]
    shape = (b, prefill.cache_len, cfg.num_kv_heads, cfg.head_dim)
    empty = tuple(LayerKV(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))
                  for _ in model.layers)
    return self._write_context(model, empty, prefill.output.features,
                               jnp.zeros((b,), jnp.int32))

  def propose(self, params, target, caches, ctx: Context, sampler, rng):
    model = nnx.merge(self.graphdef, params)
    hidden, caches = self.draft_hidden(model, target, caches, ctx)
    logits = model.draft_logits(target, hidden)
    return propose_from_logits(logits, sampler, rng, self.proposal) + (caches,)

  def draft_hidden(self, model, target, caches, ctx: Context):
    """The drafter's final hidden states at the block's mask slots [B, K, D], and the caches."""
    bs = self.block_len
    x = model.block_inputs(target, ctx.pending_B[:, None], bs)
    positions = ctx.end_B[:, None] + jnp.arange(bs)[None, :]
    hidden, caches = model.decode_block(x, positions, caches)
    return hidden[:, 1:], caches

  def commit(self, params, target, caches, verified: Verified):
    model = nnx.merge(self.graphdef, params)
    # all window positions are written; those past the new end are masked until rewritten
    return self._write_context(model, caches, verified.output.features, verified.start_B)


# The drafter built from its (training or imported) config: what training, loading and the
# interop code share.

def feature_layers(cfg, num_target_layers: int) -> tuple[int, ...]:
  layers = tuple(int(l) for l in cfg.feature_layers) or default_feature_layers(
      num_target_layers, cfg.num_feature_layers)
  bad = [l for l in layers if not 0 <= l <= num_target_layers]
  if bad:
    raise SpecjaxError(f"feature_layers {bad} outside 0..{num_target_layers} (target depth)")
  return layers


LAYER_SHAPE_KEYS = ("num_heads", "num_kv_heads", "head_dim", "mlp_dim", "rope_theta",
                    "norm_eps", "rope_llama3_scaling", "qk_norm")


def layer_config(cfg, target_cfg):
  """The drafter layers' shape: the target's, with `layer_shape` overrides (d_model stays)."""
  overrides = dict(cfg.get("layer_shape", None) or {})
  unknown = set(overrides) - set(LAYER_SHAPE_KEYS)
  if unknown:
    raise SpecjaxError(f"unknown layer_shape keys {sorted(unknown)}; known: "
                       f"{list(LAYER_SHAPE_KEYS)}")
  try:
    return dataclasses.replace(target_cfg, num_layers=cfg.num_layers, **overrides)
  except (TypeError, ValueError) as e:
    raise SpecjaxError(f"bad layer_shape: {e}") from None


def mask_token_id(cfg, vocab_size: int):
  """The target token whose embedding fills mask slots, or None for a learned mask vector."""
  token = int(cfg.get("mask_token_id", -1))
  if token < 0:
    return None
  if token >= vocab_size:
    raise SpecjaxError(f"mask_token_id={token} outside the target's vocabulary "
                       f"(size {vocab_size})")
  return token


def backbone_kwargs(cfg, target_cfg) -> dict:
  """The block backbone's settings from a (training or imported) config, shared by DFlash,
  DSpark and DFlash 2: layer shape, mask token, output scaling."""
  return dict(layer_cfg=layer_config(cfg, target_cfg),
              mask_token_id=mask_token_id(cfg, target_cfg.vocab_size),
              output_multiplier=float(cfg.get("output_multiplier", 1.0)),
              logit_softcap=float(cfg.get("final_logit_softcapping", 0.0)),
              embedding_scale=float(cfg.get("embedding_scale", 1.0)))


def build_model(cfg, target_cfg, rngs):
  return DFlashModel(target_cfg, cfg.num_layers, len(feature_layers(cfg, target_cfg.num_layers)),
                     rngs=rngs, **backbone_kwargs(cfg, target_cfg))
