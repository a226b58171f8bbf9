"""Named meshes and logical-axis rules: how parameters and batches are laid out on devices.

Parameters carry logical names (`embed`, `mlp`, ...). A config's `logical_axis_rules` maps
each to a mesh axis (or None = replicated); `mesh_shape` names the mesh axes and sizes,
with -1 filling the remaining devices. Everything is placed by `jax.jit` in/out shardings.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from specjax.errors import SpecjaxError

# Data parallel over `data` and `fsdp`; parameters fully sharded over `fsdp` on `embed`,
# tensor parallel over `tensor` on heads / MLP / vocab.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "tensor"),
    ("head_dim", None),
    ("norm", None),
)

_warned: set[str] = set()


def make_mesh(mesh_shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over the devices; one axis may be -1 (fill with all remaining devices).
  Without -1 the mesh may use fewer devices than there are (the first ones)."""
  devices = list(jax.devices() if devices is None else devices)
  names = tuple(mesh_shape.keys())
  sizes = [int(mesh_shape[n]) for n in names]
  if sizes.count(-1) > 1:
    raise SpecjaxError(f"mesh_shape {dict(mesh_shape)}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise SpecjaxError(
          f"mesh_shape {dict(mesh_shape)} does not divide {len(devices)} devices; "
          "change --config.mesh_shape")
    sizes[sizes.index(-1)] = len(devices) // known
  if -1 not in [int(mesh_shape[n]) for n in names] and math.prod(sizes) < len(devices):
    devices = devices[:math.prod(sizes)]
  if math.prod(sizes) != len(devices):
    raise SpecjaxError(
        f"mesh_shape {dict(zip(names, sizes))} needs {math.prod(sizes)} devices but "
        f"{len(devices)} are available; change --config.mesh_shape")
  grid = np.asarray(devices).reshape(sizes)
  return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


def _mesh_axes(logical_name, rules, mesh: Mesh, dim_size: int | None):
  if logical_name is None:
    return None
  table = dict(rules)
  if logical_name not in table:
    raise SpecjaxError(f"no logical_axis_rules entry for axis '{logical_name}'")
  axes = table[logical_name]
  if axes is None:
    return None
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
  if not axes:
    return None
  size = math.prod(mesh.shape[a] for a in axes)
  if dim_size is not None and dim_size % size:
    key = f"{logical_name}:{dim_size}:{size}"
    if key not in _warned:
      _warned.add(key)
      logging.warning("axis '%s' of size %d does not divide over mesh axes %s (%d); replicated",
                      logical_name, dim_size, axes, size)
    return None
  return axes[0] if len(axes) == 1 else axes


def logical_to_mesh(spec: Sequence, rules, mesh: Mesh, shape: Sequence[int] | None = None) -> P:
  """Maps a tuple of logical axis names to a mesh PartitionSpec."""
  sizes = list(shape) if shape is not None else [None] * len(spec)
  return P(*(_mesh_axes(name, rules, mesh, size) for name, size in zip(spec, sizes)))


def state_shardings(abstract_state, mesh: Mesh, rules=DEFAULT_RULES):
  """NamedShardings for an nnx.State (or any pytree of nnx.Variables / arrays)."""

  def one(x):
    if isinstance(x, nnx.Variable):
      names = x.get_metadata().get("out_sharding") or (None,) * len(x.shape)
      spec = logical_to_mesh(names, rules, mesh, x.shape)
      return x.replace(NamedSharding(mesh, spec))
    return NamedSharding(mesh, P())

  return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules=DEFAULT_RULES, ndim: int = 2) -> NamedSharding:
  """Leading axis over the data axes, the rest replicated."""
  return NamedSharding(mesh, logical_to_mesh(("batch",) + (None,) * (ndim - 1), rules, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def rules_from_config(rules_cfg) -> tuple:
  """Config rules are a list of [logical, mesh_axis | [axes] | None] pairs."""
  if not rules_cfg:
    return DEFAULT_RULES
  out = []
  for item in rules_cfg:
    name, axes = item
    out.append((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(out)


def maybe_initialize_distributed():
  """Calls jax.distributed.initialize() when launched as one of several processes."""
  markers = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
             "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
  multi = any(os.environ.get(m) for m in markers)
  if os.environ.get("SLURM_NTASKS") == "1" or os.environ.get("OMPI_COMM_WORLD_SIZE") == "1":
    multi = False
  if multi and not jax.distributed.is_initialized():
    jax.distributed.initialize()
