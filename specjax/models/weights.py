"""How a projection's weight is held at decode time: the parameter array itself (XLA's dot), or
a `PackedWeight` that the CPU kernel streams (specjax/kernels/cpu.py).

Parameters keep specjax's layout, input axes first (wq [D, N, H], wo [N, H, D], w_gate [D, F],
lm_head [D, V]); the embedding [V, D] is read as the tied LM head. A PackedWeight holds the same
[N_out, K_in] matrix in the kernel's panel layout, in one of its formats: f32, bf16, or
llama.cpp's 32-weight blocks (`q8`, `q4`: codes q with a scale d and an offset m per block,
w = d * q + m). Packing an f32 or bf16 checkpoint changes no value; the block formats carry a
GGUF file's own quantized weights (specjax/interop/gguf_blocks.py).

  params = pack_state(target.params, "kernel")   # then nnx.merge(graphdef, params) as usual
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.kernels import cpu

GROUP = cpu.GROUP  # outputs per panel, and inputs per (d, m) block

# parameter name -> number of leading input axes (0: [out, in], the embedding as LM head)
PROJECTIONS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1,
               "lm_head": 1, "embedding": 0}


@struct.dataclass
class PackedWeight:
  """A projection weight as the CPU kernel reads it: the [N_out, K_in] matrix in panels of 32
  outputs, input by input (data [N / 32, K, 32]; 4-bit codes [N / 32, K, 16], the low nibble
  outputs 0-15 of the panel and the high one 16-31), the block formats' (d, m) per 32 inputs
  as scales [N / 32, K / 32, 2, 32]."""
  data: jax.Array
  scales: jax.Array | None  # None for f32 / bf16
  fmt: str = struct.field(pytree_node=False)
  shape: tuple = struct.field(pytree_node=False)  # the parameter's own shape
  n_in: int = struct.field(pytree_node=False)

  @classmethod
  def from_rows(cls, rows_NxK, scales_NxBx2, fmt: str, shape, n_in: int) -> PackedWeight:
    """From the [N, K] row matrix: values (f32 / bf16) or integer codes (q8: int8; q4: 0..15),
    and for the block formats the (d, m) of each row's 32-input blocks."""
    n, k = rows_NxK.shape
    data = jnp.asarray(rows_NxK).reshape(n // GROUP, GROUP, k).transpose(0, 2, 1)
    if fmt == "q4":
      data = data.astype(jnp.uint8)
      data = data[..., :GROUP // 2] | (data[..., GROUP // 2:] << 4)
    elif fmt == "q8":
      data = data.astype(jnp.int8)
    scales = None
    if scales_NxBx2 is not None:
      scales = jnp.asarray(scales_NxBx2, jnp.float32).reshape(n // GROUP, GROUP, k // GROUP, 2)
      scales = scales.transpose(0, 2, 3, 1)
    return cls(jnp.asarray(data).copy(), None if scales is None else scales.copy(), fmt,
               tuple(shape), n_in)

  @property
  def out_shape(self) -> tuple:
    return self.shape[:1] if self.n_in == 0 else self.shape[self.n_in:]

  def rows(self, index=None):
    """Rows of the [N_out, K_in] matrix (all, or the outputs at `index`) as float32, dequantized
    in XLA. Equal to the kernel's fused d * q + m wherever d * q is exact in float32, as with
    the float16 scales of GGUF blocks."""
    data, scales = self.data, self.scales
    if self.fmt == "q4":
      data = jnp.concatenate([data & 15, data >> 4], axis=-1)
    if index is None:
      values = data.transpose(0, 2, 1).reshape(-1, data.shape[1])  # [N, K]
    else:
      values = jnp.take(data, index // GROUP, axis=0)  # [..., K, 32]
      values = jnp.take_along_axis(values, (index % GROUP)[..., None, None], axis=-1)[..., 0]
    values = values.astype(jnp.float32)
    if self.fmt in ("f32", "bf16"):
      return values
    if index is None:
      dm = scales.transpose(0, 3, 1, 2).reshape(-1, scales.shape[1], 2)  # [N, K/32, 2]
    else:
      dm = jnp.take(scales, index // GROUP, axis=0)  # [..., K/32, 2, 32]
      dm = jnp.take_along_axis(dm, (index % GROUP)[..., None, None, None], axis=-1)[..., 0]
    blocks = values.reshape(values.shape[:-1] + (-1, GROUP))
    w = blocks * dm[..., :1] + dm[..., 1:]
    return w.reshape(values.shape)

  def dense(self):
    """The parameter in its own layout, float32."""
    m = self.rows()
    if self.n_in == 0:
      return m
    return m.T.reshape(self.shape)


def value(param):
  """The array (or PackedWeight) an nnx parameter holds."""
  return param.get_value() if isinstance(param, nnx.Variable) else param


def is_packed(param) -> bool:
  return isinstance(value(param), PackedWeight)


def project(x_BxTxK, param, equation: str, dtype, weight_shape=None):
  """x times a projection weight: `jnp.einsum(equation, x, w)` for a plain parameter (viewed
  as `weight_shape` if given); the CPU kernel over x's last axis for a PackedWeight."""
  w = value(param)
  if isinstance(w, PackedWeight):
    lead = x_BxTxK.shape[:-1]
    y = cpu.matmul(x_BxTxK.reshape(-1, x_BxTxK.shape[-1]), w)
    return y.reshape(lead + w.out_shape).astype(dtype)
  w = w.astype(dtype)
  if weight_shape is not None:
    w = w.reshape(weight_shape)
  return jnp.einsum(equation, x_BxTxK, w)


def lm_head(h_BxTxD, param, transposed: bool, dtype, vocab_ids_V=None):
  """Logits in float32: h times the embedding's transpose (`transposed`, tied) or lm_head;
  with vocab_ids_V, only those vocabulary entries' columns (a reduced draft vocabulary)."""
  w = value(param)
  if vocab_ids_V is not None:
    if isinstance(w, PackedWeight):
      w_VxD = w.rows(vocab_ids_V)
    else:
      w_VxD = jnp.take(w, vocab_ids_V, axis=0) if transposed else jnp.take(w, vocab_ids_V, 1).T
    return jnp.einsum("btd,vd->btv", h_BxTxD, w_VxD.astype(dtype),
                      preferred_element_type=jnp.float32)
  if isinstance(w, PackedWeight):
    lead = h_BxTxD.shape[:-1]
    y = cpu.matmul(h_BxTxD.reshape(-1, h_BxTxD.shape[-1]), w)
    return y.reshape(lead + (-1,))
  w_DxV = w.T if transposed else w
  return jnp.einsum("btd,dv->btv", h_BxTxD, w_DxV.astype(dtype),
                    preferred_element_type=jnp.float32)


def embed(param, tokens_BxT, dtype):
  """Embedding rows of `tokens`."""
  w = value(param)
  if isinstance(w, PackedWeight):
    return w.rows(tokens_BxT).astype(dtype)
  return jnp.take(w, tokens_BxT, axis=0).astype(dtype)


def rows_matrix(x, n_in: int):
  """A parameter in specjax's layout as the [N_out, K_in] row matrix the kernel reads."""
  if n_in == 0:
    return x
  k = math.prod(x.shape[:n_in])
  return x.reshape(k, -1).T


def pack_param(x, n_in: int) -> PackedWeight | None:
  """An f32 or bf16 parameter as a PackedWeight of the same values, or None where the kernel
  cannot take it (outputs or inputs not a multiple of 32, another dtype)."""
  fmt = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}.get(jnp.dtype(x.dtype))
  rows = rows_matrix(x, n_in)
  if fmt is None or rows.shape[0] % GROUP or rows.shape[1] % GROUP:
    return None
  return PackedWeight.from_rows(rows, None, fmt, x.shape, n_in)


def pack_state(params: nnx.State, mode: str = "kernel", packed: dict | None = None) -> nnx.State:
  """The parameters with every projection weight packed for the CPU kernel: `packed` (path ->
  PackedWeight, e.g. a GGUF file's own blocks) where given, else the parameter's own values.
  Norm scales and anything the kernel cannot take stay as they are."""
  if mode != "kernel":
    raise ValueError(f"unknown packing mode {mode!r}")
  cpu.require()
  packed = packed or {}
  flat = dict(nnx.to_flat_state(params))
  for path, var in flat.items():
    n_in = PROJECTIONS.get(path[-1])
    x = var.get_value()
    if n_in is None or isinstance(x, PackedWeight) or x.ndim < 2:
      continue
    w = packed.get(path) or pack_param(x, n_in)
    if w is not None:
      flat[path] = var.replace(w)
  return nnx.from_flat_state(flat)
