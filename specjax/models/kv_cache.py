"""Preallocated per-row KV cache, written at each row's end index and rolled back by resetting it.

A row's cache holds positions [0, end). A pass over n new positions writes them at
[end, end + n) and advances `end` by n; speculative decoding then calls `rollback` with
the committed length, so rejected entries are simply left behind and overwritten later.
Stale entries past `end` are never read: attention masks keys by position (key j is visible
to a query at position p iff j <= p).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def write_rows(buffer_BxSx, update_BxTx, start_B, where_B=None):
  """Writes update[b] into buffer[b, start[b]:start[b] + T] for every row b (only the rows
  where `where_B` holds, if given: the others are rewritten with what they hold, so the
  write stays an in-place update of T slots rather than a select over the whole buffer)."""
  if where_B is not None:
    current = read_rows(buffer_BxSx, start_B, update_BxTx.shape[1])
    mask = where_B.reshape(where_B.shape + (1,) * (update_BxTx.ndim - 1))
    update_BxTx = jnp.where(mask, update_BxTx.astype(buffer_BxSx.dtype), current)

  def write_one(buf, upd, start):
    index = (start,) + (0,) * (buf.ndim - 1)
    return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), index)

  return jax.vmap(write_one)(buffer_BxSx, update_BxTx, start_B)


def read_rows(buffer_BxSx, start_B, length):
  """Reads buffer[b, start[b]:start[b] + length] for every row b (length is static)."""

  def read_one(buf, start):
    index = (start,) + (0,) * (buf.ndim - 1)
    return jax.lax.dynamic_slice(buf, index, (length,) + buf.shape[1:])

  return jax.vmap(read_one)(buffer_BxSx, start_B)


@struct.dataclass
class LayerKV:
  k_BxSxKVxH: jax.Array
  v_BxSxKVxH: jax.Array


@struct.dataclass
class KVCache:
  layers: tuple[LayerKV, ...]
  end_B: jax.Array  # int32: valid positions per row

  @classmethod
  def create(cls, *, num_layers, batch, length, num_kv_heads, head_dim, dtype):
    shape = (batch, length, num_kv_heads, head_dim)
    layers = tuple(
        LayerKV(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(num_layers)
    )
    return cls(layers=layers, end_B=jnp.zeros((batch,), jnp.int32))

  @property
  def length(self) -> int:
    return self.layers[0].k_BxSxKVxH.shape[1]

  def rollback(self, end_B) -> KVCache:
    """Keeps positions [0, end_B) of each row; everything after is dead."""
    return self.replace(end_B=jnp.asarray(end_B, jnp.int32))
