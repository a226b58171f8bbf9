"""One mapping of a Llama/Qwen3 decoder layer between torch checkpoints (Hugging Face, Z Lab,
speculators: all name a layer's tensors the same way) and specjax's `Block` parameters, and the
layout change between them.

n_in: 0 = the same array; n_in > 0 = a torch linear weight [out, in] whose specjax parameter
is [in..., out...] with the first n_in axes the input (wq [D, N, H] <- q_proj [N*H, D];
wo [N, H, D] <- o_proj [D, N*H]).
"""

from __future__ import annotations

import math

import numpy as np

DECODER_LAYER = {
    "input_layernorm.weight": (("attn_norm", "scale"), 0),
    "self_attn.q_proj.weight": (("attn", "wq"), 1),
    "self_attn.k_proj.weight": (("attn", "wk"), 1),
    "self_attn.v_proj.weight": (("attn", "wv"), 1),
    "self_attn.o_proj.weight": (("attn", "wo"), 2),
    "post_attention_layernorm.weight": (("mlp_norm", "scale"), 0),
    "mlp.gate_proj.weight": (("mlp", "w_gate"), 1),
    "mlp.up_proj.weight": (("mlp", "w_up"), 1),
    "mlp.down_proj.weight": (("mlp", "w_down"), 1),
}
QK_NORM = {
    "self_attn.q_norm.weight": (("attn", "q_norm", "scale"), 0),
    "self_attn.k_norm.weight": (("attn", "k_norm", "scale"), 0),
}


def decoder_layer(prefix: str, path: tuple, qk_norm: bool) -> dict[str, tuple[tuple, int]]:
  """torch name -> (specjax path, n_in) for one decoder layer: `prefix` + the torch suffix,
  `path` + the Block's parameter path."""
  table = dict(DECODER_LAYER, **(QK_NORM if qk_norm else {}))
  return {prefix + name: (path + sub, n_in) for name, (sub, n_in) in table.items()}


def torch_shape(shape, n_in: int) -> tuple[int, ...]:
  if n_in == 0:
    return tuple(shape)
  return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def to_specjax(x_torch: np.ndarray, shape, n_in: int) -> np.ndarray:
  """torch layout -> specjax layout (a view: no copy)."""
  return x_torch.reshape(shape) if n_in == 0 else x_torch.T.reshape(shape)


def to_torch(x: np.ndarray, n_in: int) -> np.ndarray:
  """specjax layout -> torch layout (a view: no copy)."""
  if n_in == 0:
    return x
  return x.reshape(math.prod(x.shape[:n_in]), -1).T
