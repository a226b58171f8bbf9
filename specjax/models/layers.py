"""Transformer pieces shared by the target and every drafter: RMSNorm, RoPE, GQA attention, SwiGLU.

Parameters carry logical axis names (`embed`, `heads`, `kv_heads`, `head_dim`, `mlp`,
`vocab`, `norm`); `specjax.sharding` maps them onto mesh axes.

Array names end in their shape, one letter (or KV) per axis, as in `k_BxSxKVxH`: B rows, T new
positions, S cached positions, D model width, N query heads, KV key/value heads, H head
width, F MLP width, V vocabulary; in the drafters K is the drafts per step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.kv_cache import LayerKV, write_rows
from specjax.models import weights
from specjax.models.weights import project

NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Llama/Qwen3-style decoder shape. Hashable, so it can be a static jit argument."""

  vocab_size: int
  num_layers: int
  d_model: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  # Llama-3 RoPE scaling (factor, low_freq_factor, high_freq_factor,
  # original_max_position_embeddings); None = plain RoPE
  rope_llama3_scaling: tuple | None = None
  qk_norm: bool = True
  tie_embeddings: bool = True
  norm_eps: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.rope_llama3_scaling is not None:  # JSON gives a list; keep the config hashable
      object.__setattr__(self, "rope_llama3_scaling", tuple(self.rope_llama3_scaling))
      if len(self.rope_llama3_scaling) != 4:
        raise ValueError("rope_llama3_scaling must be (factor, low_freq_factor, "
                         "high_freq_factor, original_max_position_embeddings)")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)


def param(rngs: nnx.Rngs, init, shape, names, dtype) -> nnx.Param:
  """A parameter with logical axis names as metadata (placement happens under jit)."""
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=names, eager_sharding=False)


def fan_in_init(in_axis, out_axis):
  return nnx.initializers.variance_scaling(
      1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis
  )


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, *, eps: float, param_dtype, rngs: nnx.Rngs):
    del rngs
    self.eps = eps
    self.scale = nnx.Param(
        jnp.ones((dim,), param_dtype), out_sharding=("norm",), eager_sharding=False
    )

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(half: int, theta: float, llama3_scaling: tuple | None = None):
  """Inverse frequencies theta^(-i/half). Llama-3 scaling divides the frequencies whose
  wavelength exceeds original_max / low_freq_factor by `factor`, keeps those shorter than
  original_max / high_freq_factor, and interpolates linearly (in original_max / wavelength)
  in between."""
  inv_freq_F = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if llama3_scaling is None:
    return inv_freq_F
  factor, low, high, original = (float(v) for v in llama3_scaling)
  ratio_F = original * inv_freq_F / (2 * jnp.pi)  # original_max / wavelength
  smooth_F = jnp.clip((ratio_F - low) / (high - low), 0.0, 1.0)
  return (1.0 - smooth_F) * inv_freq_F / factor + smooth_F * inv_freq_F


def apply_rope(x_BxTxNxH, positions_BxT, theta: float,
               llama3_scaling: tuple | None = None):
  """Rotary embedding, half-split convention (Llama/Qwen checkpoints use it)."""
  half = x_BxTxNxH.shape[-1] // 2
  inv_freq_F = rope_inv_freq(half, theta, llama3_scaling)
  angles_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_F
  sin = jnp.sin(angles_BxTxF)[:, :, None, :]
  cos = jnp.cos(angles_BxTxF)[:, :, None, :]
  x = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with optional Qwen3 q/k norm.

  Exposes its parts (`queries`, `keys_values`, `attend`) so that drafters can compute keys
  and values from other inputs (DFlash's KV injection) with the same weights layout.
  """

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs, in_dim: int | None = None):
    """in_dim: the width queries, keys and values project from (default d_model; EAGLE-3's
    first layer reads [embedding ; hidden], 2 d_model); the output is d_model."""
    self.cfg = cfg
    d, h, k, hd, pd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.weight_dtype
    i = in_dim or d
    self.wq = param(rngs, fan_in_init(0, (1, 2)), (i, h, hd), ("embed", "heads", "head_dim"), pd)
    self.wk = param(rngs, fan_in_init(0, (1, 2)), (i, k, hd), ("embed", "kv_heads", "head_dim"), pd)
    self.wv = param(rngs, fan_in_init(0, (1, 2)), (i, k, hd), ("embed", "kv_heads", "head_dim"), pd)
    self.wo = param(rngs, fan_in_init((0, 1), 2), (h, hd, d), ("heads", "head_dim", "embed"), pd)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, eps=cfg.norm_eps, param_dtype=pd, rngs=rngs)
      self.k_norm = RMSNorm(hd, eps=cfg.norm_eps, param_dtype=pd, rngs=rngs)

  def _proj(self, x, p, equation, weight_shape=None):
    return project(x, p, equation, self.cfg.compute_dtype, weight_shape)

  def queries(self, x_BxTxD, positions_BxT):
    q = self._proj(x_BxTxD, self.wq, "btd,dnh->btnh")
    if self.cfg.qk_norm:
      q = self.q_norm(q)
    return apply_rope(q, positions_BxT, self.cfg.rope_theta,
                      self.cfg.rope_llama3_scaling)

  def keys_values(self, x_BxTxD, positions_BxT):
    k = self._proj(x_BxTxD, self.wk, "btd,dnh->btnh")
    v = self._proj(x_BxTxD, self.wv, "btd,dnh->btnh")
    if self.cfg.qk_norm:
      k = self.k_norm(k)
    return apply_rope(k, positions_BxT, self.cfg.rope_theta,
                      self.cfg.rope_llama3_scaling), v

  def _heads(self, q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, mask_BxTxS):
    """Softmax attention per head (scores and their sum in float32), before `wo`."""
    b, t, n, hd = q_BxTxNxH.shape
    kv = k_BxSxKVxH.shape[2]
    q = q_BxTxNxH.reshape(b, t, kv, n // kv, hd)
    scores = jnp.einsum("btkgh,bskh->bkgts", q, k_BxSxKVxH, preferred_element_type=jnp.float32)
    scores = scores * (hd**-0.5)
    scores = jnp.where(mask_BxTxS[:, None, None, :, :], scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxSxKVxH.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v_BxSxKVxH).reshape(b, t, n, hd)

  def _out(self, heads_BxTxNxH):
    # one contraction over the merged (head, head_dim) axis: contracting two axes let XLA:CPU
    # transpose the [N, H, D] weight on every call (inside a decode loop: every step)
    b, t, n, hd = heads_BxTxNxH.shape
    return self._proj(heads_BxTxNxH.reshape(b, t, n * hd), self.wo, "btf,fd->btd",
                      (n * hd, -1))

  def attend(self, q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, mask_BxTxS):
    """Attention under an explicit mask over all S keys (training, reference passes)."""
    return self._out(self._heads(q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, mask_BxTxS))

  def attend_prefix(self, q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, limit_BxT, num_keys):
    """Attention over cache slots j <= limit[b, t] (slot j holds position j). Only the
    shortest bucket prefix of the cache holding `num_keys` slots is read (`num_keys` >= every
    limit + 1, a traced scalar), so the cost follows the committed length, not cache_len."""

    def branch(length):
      def run(q, k, v, limit):
        mask = jnp.arange(length)[None, None, :] <= limit[:, :, None]
        return self._heads(q, k[:, :length], v[:, :length], mask)
      return run

    if weights.is_packed(self.wq) and q_BxTxNxH.shape[-1] % 16 == 0:
      # the CPU kernels hold this layer's weights (decode_weights): their attention reads
      # exactly the slots each query sees, with no buckets
      from specjax.kernels import cpu
      out = cpu.attention(q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, limit_BxT)
      return self._out(out.astype(q_BxTxNxH.dtype))
    buckets = key_buckets(k_BxSxKVxH.shape[1])
    operands = (q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, limit_BxT)
    if len(buckets) == 1:
      return self._out(branch(buckets[0])(*operands))
    # the first bucket holding num_keys slots (a compare and a sum: searchsorted is a loop)
    index = jnp.minimum(jnp.sum(jnp.asarray(buckets[:-1]) < num_keys), len(buckets) - 1)
    return self._out(jax.lax.switch(index, [branch(n) for n in buckets], *operands))

  def __call__(self, x_BxTxD, positions_BxT, mask_BxTxS=None, cache: LayerKV | None = None,
               write_start_B=None, num_keys=None):
    """Without a cache: attention under `mask`. With one: the T new keys/values are written
    at write_start, and each query sees the cache slots up to its own position."""
    q = self.queries(x_BxTxD, positions_BxT)
    k, v = self.keys_values(x_BxTxD, positions_BxT)
    if cache is None:
      return self.attend(q, k, v, mask_BxTxS), None
    cache = LayerKV(
        write_rows(cache.k_BxSxKVxH, k, write_start_B),
        write_rows(cache.v_BxSxKVxH, v, write_start_B),
    )
    return self.attend_prefix(q, cache.k_BxSxKVxH, cache.v_BxSxKVxH, positions_BxT,
                              num_keys), cache


def key_buckets(cache_len: int, smallest: int = 64) -> tuple[int, ...]:
  """The static key-prefix lengths a cached pass chooses among: powers of two from
  `smallest`, then cache_len. Reading at most twice the keys needed, with one compiled
  attention per bucket."""
  out, n = [], smallest
  while n < cache_len:
    out.append(n)
    n *= 2
  return tuple(out) + (cache_len,)


class MLP(nnx.Module):
  """SwiGLU feed-forward."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f, pd = cfg.d_model, cfg.mlp_dim, cfg.weight_dtype
    self.w_gate = param(rngs, fan_in_init(0, 1), (d, f), ("embed", "mlp"), pd)
    self.w_up = param(rngs, fan_in_init(0, 1), (d, f), ("embed", "mlp"), pd)
    self.w_down = param(rngs, fan_in_init(0, 1), (f, d), ("mlp", "embed"), pd)

  def __call__(self, x_BxTxD):
    dt = self.cfg.compute_dtype
    gate = jax.nn.silu(project(x_BxTxD, self.w_gate, "...d,df->...f", dt))
    return project(gate * project(x_BxTxD, self.w_up, "...d,df->...f", dt), self.w_down,
                   "...f,fd->...d", dt)


class Block(nnx.Module):
  """Pre-norm decoder block: x + Attn(norm(x)), then + MLP(norm(x))."""

  def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
    kw = dict(eps=cfg.norm_eps, param_dtype=cfg.weight_dtype, rngs=rngs)
    self.attn_norm = RMSNorm(cfg.d_model, **kw)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.d_model, **kw)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BxTxD, positions_BxT, mask_BxTxS=None, cache=None, write_start_B=None,
               num_keys=None):
    attn_out, cache = self.attn(self.attn_norm(x_BxTxD), positions_BxT, mask_BxTxS, cache,
                                write_start_B, num_keys)
    x_BxTxD = x_BxTxD + attn_out
    return x_BxTxD + self.mlp(self.mlp_norm(x_BxTxD)), cache


def causal_segment_mask(segment_ids_BxT):
  """Training mask: causal by index, and only within the same packed document."""
  t = segment_ids_BxT.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  same = segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  return causal[None] & same

