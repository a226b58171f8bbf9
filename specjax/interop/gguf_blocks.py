"""A GGUF-imported target's own quantized blocks, as PackedWeights for the CPU kernel.

The imported checkpoint holds each tensor dequantized to float32; this reads the same tensors'
blocks from the GGUF file kept beside it (target/source.gguf) and hands the kernel the codes and
per-block (scale, offset) instead, so it streams 4.5-8.5 bits per weight where float32 takes
32. The kernel rebuilds each weight as one fused multiply-add, d * q + m, which gives exactly
the float32 value gguf-py's dequantization gives (d * q is exact in float32 for these code
widths; the sum is rounded once either way): the packed target is the checkpoint, bit for bit.

Blocks of 32 weights (ggml's layouts; d and m float16):
  Q8_0  d, 32 x int8 q                         w = d * q
  Q4_0  d, 16 bytes of 4-bit q                 w = d * (q - 8)
  Q4_1  d, m, 16 bytes of 4-bit q              w = d * q + m
  Q5_0  d, 4 bytes of 5th bits, 16 bytes of q  w = d * (q - 16)
  Q5_1  d, m, 4 bytes of 5th bits, 16 bytes    w = d * q + m
The kernel takes the codes one byte each (q8) or, for 4-bit types, two per byte (q4: half the
bytes, a little more work per weight). Other types (float tensors, K-quants) stay with the
checkpoint's float32.
"""

from __future__ import annotations

import os

import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import gguf
from specjax.models.weights import PackedWeight

GROUP = 32  # weights per block
# GGUF type -> (bytes per block, has an offset m, code bits)
KERNEL_TYPES = {"Q8_0": (34, False, 8), "Q4_0": (18, False, 4), "Q4_1": (20, True, 4),
                "Q5_0": (22, False, 5), "Q5_1": (24, True, 5)}


def _f16(raw_NxBx2) -> np.ndarray:
  return np.ascontiguousarray(raw_NxBx2).view(np.float16)[..., 0].astype(np.float32)


def block_codes(raw_NxR: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, int]:
  """A tensor's raw bytes [rows, bytes per row] -> (integer codes [rows, K] as int8, (d, m) of
  each block [rows, K / 32, 2] in float32, code bits), with w = d * code + m exactly as gguf-py
  dequantizes (Q4_0 and Q5_0 keep their unsigned codes and take m = -8d, -16d: exact)."""
  size, has_offset, bits = KERNEL_TYPES[kind]
  rows = raw_NxR.shape[0]
  blocks = raw_NxR.reshape(rows, -1, size)
  d = _f16(blocks[..., 0:2])
  head = 4 if has_offset else 2
  m = _f16(blocks[..., 2:4]) if has_offset else None
  if bits == 8:
    codes = np.ascontiguousarray(blocks[..., head:]).view(np.int8)
    return codes.reshape(rows, -1), np.stack([d, np.zeros_like(d)], -1), 8
  nibbles = blocks[..., head + 4:] if bits == 5 else blocks[..., head:]
  q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).astype(np.int16)
  if bits == 5:
    high = np.ascontiguousarray(blocks[..., head:head + 4]).view("<u4")[..., 0]
    q |= (((high[..., None] >> np.arange(GROUP, dtype=np.uint32)) & 1) << 4).astype(np.int16)
  if m is None:
    m = -float(1 << (bits - 1)) * d  # d * (q - 8) = d * q - 8d, every term exact
  return q.astype(np.int8).reshape(rows, -1), np.stack([d, m], -1), bits


def packed_weights(run_dir: str, target, nibbles: bool = False) -> dict[tuple, PackedWeight]:
  """Parameter path -> PackedWeight of the file's own blocks, for every projection weight whose
  GGUF type the kernel reads (see KERNEL_TYPES); the rest are left to the caller. Codes are
  one byte each, or with `nibbles` two 4-bit codes per byte where they fit (the kernel's q4:
  half the bytes, more work per weight)."""
  info = target.config.get("imported_from") or {}
  path = gguf.source_file(run_dir)
  reader, _ = gguf.open_file(path)
  tensors = {t.name: t for t in reader.tensors}
  shapes = {p: var.get_value().shape for p, var in nnx.to_flat_state(target.params)}
  out = {}
  for name, (param_path, n_in, heads) in gguf.tensor_table(target.model_cfg,
                                                           info.get("architecture")).items():
    tensor = tensors.get(name)
    if tensor is None:
      raise SpecjaxError(f"{path} has no tensor '{name}'; re-import the target")
    kind = tensor.tensor_type.name
    if kind not in KERNEL_TYPES or tensor.data.shape[0] % GROUP:  # (outputs per panel)
      continue
    codes, scales, bits = block_codes(np.asarray(tensor.data), kind)
    if heads is not None:  # the same row order as the checkpoint's (un-permuted) matrix
      codes, scales = gguf.unpermute_rows(codes, heads), gguf.unpermute_rows(scales, heads)
    fmt = "q4" if nibbles and bits == 4 else "q8"
    out[param_path] = PackedWeight.from_rows(codes, scales, fmt, shapes[param_path], n_in)
  return out


def is_gguf_target(run_dir: str) -> bool:
  """Whether the run's target was imported from a GGUF file that is still beside it."""
  folder = run_dir_lib.model_dir(run_dir, "target")
  try:
    info = run_dir_lib.load_config(folder).get("imported_from") or {}
  except SpecjaxError:
    return False
  return info.get("format") == "gguf" and os.path.exists(
      os.path.join(folder, info.get("file", gguf.SOURCE_FILE)))
