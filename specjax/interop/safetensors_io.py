"""Safetensors files read one tensor at a time and written one tensor at a time.

The format is an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}} and the raw
little-endian bytes. Reading it directly (rather than through a framework) keeps host memory
at one tensor, and gives bfloat16 as `ml_dtypes.bfloat16` numpy arrays.

  with open_tensors(folder) as reader:        # model.safetensors or a sharded index
    for name in reader.names(): x = reader.read(name)
  write_tensors(path, {name: (shape, dtype)}, read_fn)   # read_fn(name) -> np.ndarray
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

from specjax.errors import SpecjaxError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
CODES = {v: k for k, v in DTYPES.items()}


def _read_header(path: str) -> tuple[dict, int]:
  """(header without metadata, byte offset of the data section)."""
  try:
    with open(path, "rb") as f:
      (n,) = struct.unpack("<Q", f.read(8))
      header = json.loads(f.read(n))
  except (OSError, struct.error, ValueError) as e:
    raise SpecjaxError(f"{path} is not a readable safetensors file ({e})") from None
  header.pop("__metadata__", None)
  return header, 8 + n


class TensorReader:
  """Tensors of one checkpoint, read lazily by name. Use as a context manager."""

  def __init__(self, files: Mapping[str, str]):
    """files: tensor name -> path of the safetensors file that holds it."""
    self._entries = {}
    headers = {}
    for name, path in files.items():
      if path not in headers:
        headers[path] = _read_header(path)
      header, start = headers[path]
      if name not in header:
        raise SpecjaxError(f"{path} has no tensor '{name}' (the index lists it there)")
      self._entries[name] = (path, start, header[name])
    self._handles = {}

  def names(self) -> list[str]:
    return list(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._entry(name)[2]["shape"])

  def dtype(self, name: str) -> np.dtype:
    code = self._entry(name)[2]["dtype"]
    if code not in DTYPES:
      raise SpecjaxError(f"tensor '{name}' has unsupported dtype {code}")
    return DTYPES[code]

  def read(self, name: str) -> np.ndarray:
    """The whole tensor as a fresh numpy array (the only host copy made)."""
    path, start, info = self._entry(name)
    begin, end = info["data_offsets"]
    shape, dtype = self.shape(name), self.dtype(name)
    if end - begin != int(np.prod(shape)) * dtype.itemsize:
      raise SpecjaxError(f"{path}: tensor '{name}' has {end - begin} bytes, expected "
                         f"{int(np.prod(shape)) * dtype.itemsize} for {shape} {dtype}")
    f = self._handles.get(path)
    if f is None:
      f = self._handles[path] = open(path, "rb")
    f.seek(start + begin)
    out = np.empty(shape, dtype)
    if f.readinto(memoryview(out.reshape(-1).view(np.uint8))) != end - begin:
      raise SpecjaxError(f"{path} is truncated (tensor '{name}')")
    return out

  def _entry(self, name: str):
    if name not in self._entries:
      raise SpecjaxError(f"the checkpoint has no tensor '{name}'")
    return self._entries[name]

  def close(self):
    for f in self._handles.values():
      f.close()
    self._handles = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def open_tensors(folder: str) -> TensorReader:
  """The tensors of `folder/model.safetensors`, or of the shards that
  `folder/model.safetensors.index.json` maps them to."""
  index = os.path.join(folder, INDEX_FILE)
  single = os.path.join(folder, SINGLE_FILE)
  if os.path.exists(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as e:
      raise SpecjaxError(f"{index} has no readable 'weight_map' ({e})") from None
    files = {}
    for name, shard in weight_map.items():
      path = os.path.join(folder, shard)
      if not os.path.exists(path):
        raise SpecjaxError(f"{index} names shard {shard}, which is missing from {folder}")
      files[name] = path
    return TensorReader(files)
  if os.path.exists(single):
    header, _ = _read_header(single)
    return TensorReader({name: single for name in header})
  raise SpecjaxError(f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def write_tensors(path: str, specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
                  read_fn: Callable[[str], np.ndarray], metadata: Mapping[str, str] | None = None):
  """Writes one safetensors file, asking `read_fn(name)` for one tensor at a time (in the
  order of `specs`), so that only one tensor is ever on the host."""
  header, offset = {}, 0
  for name, (shape, dtype) in specs.items():
    dtype = np.dtype(dtype)
    if dtype not in CODES:
      raise SpecjaxError(f"tensor '{name}': dtype {dtype} cannot be written to safetensors")
    size = int(np.prod(shape)) * dtype.itemsize
    header[name] = {"dtype": CODES[dtype], "shape": [int(s) for s in shape],
                    "data_offsets": [offset, offset + size]}
    offset += size
  if metadata:
    header["__metadata__"] = dict(metadata)
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # data section 8-byte aligned, as the reference writer does
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for name, (shape, dtype) in specs.items():
      x = np.ascontiguousarray(read_fn(name))
      if x.shape != tuple(shape) or x.dtype != np.dtype(dtype):
        raise SpecjaxError(f"tensor '{name}' is {x.shape} {x.dtype}, declared {shape} {dtype}")
      f.write(memoryview(x.reshape(-1).view(np.uint8)))
      del x
  os.replace(tmp, path)
