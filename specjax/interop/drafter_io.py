"""What every drafter-checkpoint format shares: its tensors read into a drafter's parameters by
a name table, its parameters written back by the same table, and the imported drafter stored
as run_dir/<method>/ (config.json + an Orbax checkpoint).

A table maps a torch tensor name -> (specjax parameter path, n_in) (interop/layer_map.py).
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.checkpoint import Checkpoints
from specjax.errors import SpecjaxError
from specjax.interop import layer_map
from specjax.interop.safetensors_io import SINGLE_FILE, write_tensors


def flat(state) -> dict:
  return {tuple(k): v for k, v in nnx.to_flat_state(state)}


def abstract_params(build, cfg, target_cfg):
  """The drafter's abstract parameters (nothing initialised)."""
  return nnx.split(nnx.eval_shape(lambda: build(cfg, target_cfg, nnx.Rngs(0))), nnx.Param)[1]


def read_params(reader, src: str, table: dict, abstract, what: str, extra_ok=()):
  """(params, the set of dtypes read): every tensor of `table` from `reader` into the shapes of
  `abstract`; tensors outside the table (but `extra_ok`) or missing are a one-line error."""
  slots = flat(abstract)
  names = set(reader.names())
  extra = sorted(names - set(table) - set(extra_ok))
  missing = sorted(set(table) - names)
  if extra or missing:
    raise SpecjaxError(f"{src}: tensors {missing[:3]} missing, {extra[:3]} unexpected for {what}")
  values, dtypes = {}, set()
  for name, (path, n_in) in table.items():
    shape = tuple(slots[path].get_value().shape)
    x = reader.read(name)
    if x.size != int(np.prod(shape)):
      raise SpecjaxError(f"{src}: tensor '{name}' has shape {x.shape}, which does not fit "
                         f"{shape} (the config's layer shape)")
    dtypes.add(x.dtype.name)
    values[path] = jnp.asarray(layer_map.to_specjax(x.astype(np.float32), shape, n_in))
  params = nnx.from_flat_state([(path, var.replace(values[tuple(path)]))
                                for path, var in nnx.to_flat_state(abstract)])
  return params, dtypes


def save_imported(run_dir: str, name: str, cfg, params) -> str:
  """run_dir/<name>/: the config and the parameters as step 0 of an Orbax checkpoint."""
  folder = run_dir_lib.model_dir(run_dir, name)
  os.makedirs(folder, exist_ok=True)
  run_dir_lib.save_config(cfg, os.path.join(folder, "config.json"))
  ckpt = Checkpoints(os.path.join(folder, "checkpoints"))
  try:
    ckpt.save(0, params, {"step": jnp.int32(0)}, {"imported_from": cfg.imported_from})
    ckpt.wait()
  finally:
    ckpt.close()
  return folder


def write_params(out_dir: str, table: dict, params, dtype, extra=None) -> int:
  """model.safetensors in out_dir: every tensor of `table` from the (flat) params in `dtype`,
  then `extra` {name: array} as given. A scalar parameter is a torch [1] tensor (a bias).
  Returns the tensor count."""
  dtype = np.dtype(dtype)

  def shape_of(path, n_in):
    shape = params[path].get_value().shape
    return (1,) if not shape else layer_map.torch_shape(shape, n_in)

  def tensor(name):
    if name in (extra or {}):
      return extra[name]
    path, n_in = table[name]
    x = np.asarray(params[path].get_value(), np.float32)
    return np.ascontiguousarray(layer_map.to_torch(x, n_in).astype(dtype)).reshape(
        shape_of(path, n_in))

  specs = {name: (shape_of(path, n_in), dtype) for name, (path, n_in) in table.items()}
  specs.update({name: (x.shape, x.dtype) for name, x in (extra or {}).items()})
  os.makedirs(out_dir, exist_ok=True)
  write_tensors(os.path.join(out_dir, SINGLE_FILE), specs, tensor, {"format": "pt"})
  return len(specs)
