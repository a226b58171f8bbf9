"""EAGLE-3 (Li et al. 2025): a small decoder that drafts a chain of K tokens, one pass per
draft, from the target's own hidden states; the papers' common baseline. The layout follows
vLLM's `speculators` (models/eagle3), whose checkpoints interop/speculators.py reads and writes.

- Features: the residual stream of 3 target layers (HF `hidden_states` indices = specjax
  feature layers) at each position, concatenated, optionally RMS-normed (`norm_before_fc`: one
  norm over the concatenation; `fc_norm`: one per layer), projected by `fc` [3H -> H].
- Entries: entry j pairs the token at position j + 1 with the feature g_j at position j and
  predicts the token at j + 2. The first layer reads [RMSNorm(embed(token)) ;
  hidden_norm(g_j)] (queries, keys and values project from 2H); its residual is g_j
  (hidden_norm(g_j) with `norm_before_residual`); later layers are standard decoder layers.
  Logits: the target's frozen LM head on RMSNorm(h), restricted to a draft vocabulary when one
  is given (draft index i is target token `vocab_ids[i]`; speculators' d2t holds the offsets
  vocab_ids[i] - i).
- Chain: draft k + 1 is the entry at the next position that pairs draft d_k with the previous
  entry's output h (RMSNorm(h) with `norm_output`) in place of a target feature. Training-time
  test (training/eagle3.py) trains exactly these chained entries.
- Decoding cache: per layer, K/V of entries by slot j (rope position j: a uniform shift of
  speculators' j + 1, which rotary attention does not see). After a step that committed up to
  `end`, entries j <= end - 1 are exact; each proposal recomputes the K + 1 entries ending at
  end - 1 (those that became exact since the last step, plus the unchanged ones before them),
  then writes the K - 1 chained entries after them, which the next proposal overwrites.
- Proposals at T > 0: each draft is sampled from the draft's processed distribution over the
  draft vocabulary, and q (zero outside it) goes to the min(1, p/q) verifier: lossless.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.drafters.base import Context, Drafter, Prefill, Verified
from specjax.models import LayerKV, default_feature_layers, read_rows, write_rows
from specjax.models import weights
from specjax.models.layers import (MLP, Attention, RMSNorm, TransformerConfig, fan_in_init,
                                   param)


def default_feature_layers_eagle3(num_layers: int) -> tuple[int, ...]:
  """speculators' default [2, L // 2, L - 3]; a target too shallow for three distinct layers
  there gets specjax's even spread."""
  ids = (2, num_layers // 2, num_layers - 3)
  if len(set(ids)) == 3 and min(ids) >= 1:
    return ids
  return default_feature_layers(num_layers, 3)


def feature_layers(cfg, num_target_layers: int) -> tuple[int, ...]:
  """The target layers a config's drafter reads (config `feature_layers`, else the default)."""
  ids = tuple(int(i) for i in (cfg.get("feature_layers") or ()))
  return ids or default_feature_layers_eagle3(num_target_layers)


class Eagle3Layer(nnx.Module):
  """A decoder layer; the first reads [embedding ; hidden] (2H) into attention."""

  def __init__(self, cfg: TransformerConfig, first: bool, norm_before_residual: bool, *,
               rngs: nnx.Rngs):
    kw = dict(eps=cfg.norm_eps, param_dtype=cfg.weight_dtype, rngs=rngs)
    self.first = first
    self.norm_before_residual = norm_before_residual
    self.attn_norm = RMSNorm(cfg.d_model, **kw)  # the first layer: the embedding's norm
    if first:
      self.hidden_norm = RMSNorm(cfg.d_model, **kw)
    self.attn = Attention(cfg, rngs=rngs, in_dim=2 * cfg.d_model if first else None)
    self.mlp_norm = RMSNorm(cfg.d_model, **kw)
    self.mlp = MLP(cfg, rngs=rngs)

  def attention_input(self, x_BxTxD, emb_BxTxD):
    """(what attention projects from, the residual)."""
    if not self.first:
      return self.attn_norm(x_BxTxD), x_BxTxD
    h = self.hidden_norm(x_BxTxD)
    residual = h if self.norm_before_residual else x_BxTxD
    return jnp.concatenate([self.attn_norm(emb_BxTxD), h], -1), residual

  def finish(self, residual_BxTxD, attn_BxTxD):
    x = residual_BxTxD + attn_BxTxD
    return x + self.mlp(self.mlp_norm(x))


class Eagle3Model(nnx.Module):

  def __init__(self, cfg: TransformerConfig, num_layers: int = 1, num_features: int = 3, *,
               rngs: nnx.Rngs, norm_before_fc: bool = False, fc_norm: bool = False,
               norm_before_residual: bool = True, norm_output: bool = False):
    """cfg: the target's shape (the drafter's layers have it too, as in speculators)."""
    d, pd, eps = cfg.d_model, cfg.weight_dtype, cfg.norm_eps
    if norm_before_fc and fc_norm:
      raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
    self.cfg = cfg
    self.norm_output = norm_output
    self.fc = param(rngs, fan_in_init(0, 1), (num_features * d, d), (None, "embed"), pd)
    if norm_before_fc:
      self.input_norm = RMSNorm(num_features * d, eps=eps, param_dtype=pd, rngs=rngs)
    if fc_norm:
      self.fc_norms = nnx.List([RMSNorm(d, eps=eps, param_dtype=pd, rngs=rngs)
                                for _ in range(num_features)])
    self.layers = nnx.List([Eagle3Layer(cfg, i == 0, norm_before_residual, rngs=rngs)
                            for i in range(num_layers)])
    self.final_norm = RMSNorm(d, eps=eps, param_dtype=pd, rngs=rngs)

  def project(self, features) -> jax.Array:
    """Target features (a tuple of [B, T, D]) -> g [B, T, D]."""
    dt = self.cfg.compute_dtype
    xs = [f.astype(dt) for f in features]
    if hasattr(self, "fc_norms"):
      xs = [norm(x) for norm, x in zip(self.fc_norms, xs)]
    x = jnp.concatenate(xs, -1)
    if hasattr(self, "input_norm"):
      x = self.input_norm(x)
    return x @ self.fc[...].astype(dt)

  def output(self, h_BxTxD):
    """(normed hidden for the LM head, the hidden the next chained entry reads)."""
    normed = self.final_norm(h_BxTxD)
    return normed, (normed if self.norm_output else h_BxTxD)

  def decode(self, hidden_BxTxD, emb_BxTxD, slots_BxT, caches, num_keys):
    """Entries at `slots` (consecutive per row), written into the per-layer caches; each sees
    the cache up to its own slot. Returns (output h, new caches)."""
    x, new = hidden_BxTxD, []
    for layer, cache in zip(self.layers, caches):
      inp, residual = layer.attention_input(x, emb_BxTxD)
      out, cache = layer.attn(inp, slots_BxT, None, cache, slots_BxT[:, 0], num_keys)
      x = layer.finish(residual, out)
      new.append(cache)
    return x, tuple(new)


def build_model(cfg, target_cfg: TransformerConfig, rngs: nnx.Rngs) -> Eagle3Model:
  """The drafter a training (or imported) config describes."""
  return Eagle3Model(target_cfg, int(cfg.num_layers), len(feature_layers(cfg, target_cfg.num_layers)),
                     rngs=rngs, norm_before_fc=bool(cfg.get("norm_before_fc", False)),
                     fc_norm=bool(cfg.get("fc_norm", False)),
                     norm_before_residual=bool(cfg.get("norm_before_residual", True)),
                     norm_output=bool(cfg.get("norm_output", False)))


def draft_logits(target, normed_BxTxD, vocab_ids_V=None, head_VxD=None):
  """The target's LM head on the drafter's normed hidden, over the draft vocabulary: from the
  head's rows `head_VxD` when given (`head_rows`, computed once at load), else the target's."""
  if head_VxD is None:
    return target.logits(normed_BxTxD, vocab_ids_V)
  return jnp.einsum("btd,vd->btv", normed_BxTxD, head_VxD.astype(normed_BxTxD.dtype),
                    preferred_element_type=jnp.float32)


def head_rows(target, vocab_ids_V):
  """[Vd, D] float32: the target's LM head rows of the draft vocabulary (its `logits` over
  them are hidden . rows): a decode step then reads Vd rows, not the whole head."""
  tied = target.cfg.tie_embeddings
  w = weights.value(target.embedding if tied else target.lm_head)
  if isinstance(w, weights.PackedWeight):
    return w.rows(vocab_ids_V)
  w = w.astype(jnp.float32)
  return jnp.take(w, vocab_ids_V, axis=0) if tied else jnp.take(w, vocab_ids_V, axis=1).T


@struct.dataclass
class Eagle3State:
  g_BxSxD: jax.Array  # projected target features by position
  caches: tuple  # per drafter layer: LayerKV by entry slot


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter(Drafter):
  """params: {"model": the Eagle3Model state, "vocab": int32 [Vd] target ids (optional), and
  with it "head": float32 [Vd, D], the target's head rows of those ids (optional)}."""
  graphdef: nnx.GraphDef = None
  target_feature_layers: tuple[int, ...] = ()

  @property
  def feature_layers(self):
    return self.target_feature_layers

  def init(self, params, target, prefill: Prefill) -> Eagle3State:
    model = nnx.merge(self.graphdef, params["model"])
    tokens = prefill.tokens_BxP
    b, p = tokens.shape
    s = prefill.cache_len
    zeros_b = jnp.zeros((b,), jnp.int32)
    g = model.project(prefill.output.features)
    g_buf = write_rows(jnp.zeros((b, s, g.shape[-1]), g.dtype), g, zeros_b)
    cfg = target.cfg
    kv_shape = (b, s, cfg.num_kv_heads, cfg.head_dim)
    caches = tuple(LayerKV(jnp.zeros(kv_shape, cfg.compute_dtype),
                           jnp.zeros(kv_shape, cfg.compute_dtype)) for _ in model.layers)
    # entries 0..P-2 (token j + 1 with g_j); those reaching past a row's prompt are garbage
    # that the first proposal's window recomputes before anything reads them
    slots = jnp.broadcast_to(jnp.arange(p - 1), (b, p - 1)) if p > 1 else None
    if slots is not None:
      _, caches = model.decode(g[:, :-1], target.embed(tokens[:, 1:]), slots, caches, p - 1)
    return Eagle3State(g_buf, caches)

  def propose(self, params, target, state: Eagle3State, ctx: Context, sampler, rng):
    model = nnx.merge(self.graphdef, params["model"])
    vocab, head = params.get("vocab"), params.get("head")
    big_k, end = self.num_draft_tokens, ctx.end_B
    width = big_k + 1
    start = jnp.maximum(end - width, 0)
    slots = start[:, None] + jnp.arange(width)[None, :]
    emb = target.embed(read_rows(ctx.seq_BxS, start + 1, width))
    num_keys = jnp.max(start) + width
    h, caches = model.decode(read_rows(state.g_BxSxD, start, width), emb, slots, state.caches,
                             num_keys)
    h = jnp.take_along_axis(h, (end - 1 - start)[:, None, None], axis=1)
    rngs = jax.random.split(rng, big_k)
    drafts, qs = [], []
    for k in range(big_k):
      normed, feedback = model.output(h)
      logits = draft_logits(target, normed, vocab, head)[:, 0]
      d = sampler.sample(logits, rngs[k])
      if not sampler.greedy:
        q = sampler.probs(logits)
        if vocab is not None:  # zero outside the draft vocabulary
          q = jnp.zeros(q.shape[:-1] + (target.cfg.vocab_size,), q.dtype).at[:, vocab].set(q)
        qs.append(q)
      d = d if vocab is None else vocab[d]
      drafts.append(d)
      if k + 1 < big_k:  # the chained entry at slot end + k: d_{k+1} with this output
        slot = (end + k)[:, None]
        h, caches = model.decode(feedback, target.embed(d[:, None]), slot, caches,
                                 jnp.max(end) + k + 1)
    q = None if sampler.greedy else jnp.stack(qs, axis=1)
    return jnp.stack(drafts, axis=1).astype(jnp.int32), q, Eagle3State(state.g_BxSxD, caches)

  def commit(self, params, target, state: Eagle3State, verified: Verified):
    model = nnx.merge(self.graphdef, params["model"])
    g = model.project(verified.output.features)
    return state.replace(g_BxSxD=write_rows(state.g_BxSxD, g.astype(state.g_BxSxD.dtype),
                                            verified.start_B))
