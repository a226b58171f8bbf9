"""Named meshes and logical-axis rules: how parameters and batches are laid out on devices.

Parameters carry logical names (`embed`, `mlp`, ...). A config's `logical_axis_rules` maps
each to a mesh axis (or None = replicated); `mesh_shape` names the mesh axes and sizes,
with -1 filling the remaining devices. Everything is placed by `jax.jit` in/out shardings.
"""

from __future__ import annotations

import dataclasses
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


def resolve_mesh_shape(mesh_shape: Mapping[str, int], devices: int) -> dict[str, int]:
  """The axis sizes of a mesh_shape over `devices` devices: one axis may be -1 (filled with
  all remaining devices)."""
  names = tuple(mesh_shape.keys())
  sizes = [int(mesh_shape[n]) for n in names]
  if sizes.count(-1) > 1:
    raise SpecjaxError(f"mesh_shape {dict(mesh_shape)}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if devices % known:
      raise SpecjaxError(
          f"mesh_shape {dict(mesh_shape)} does not divide {devices} devices; "
          "change --config.mesh_shape")
    sizes[sizes.index(-1)] = devices // known
  return dict(zip(names, sizes))


def make_mesh(mesh_shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over the devices; one axis may be -1 (fill with all remaining devices).
  Without -1 the mesh may use fewer devices than there are (the first ones)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  names, sizes = tuple(shape), list(shape.values())
  if -1 not in [int(mesh_shape[n]) for n in names] and math.prod(sizes) < len(devices):
    devices = devices[:math.prod(sizes)]
  if math.prod(sizes) != len(devices):
    raise SpecjaxError(
        f"mesh_shape {shape} needs {math.prod(sizes)} devices but "
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


# A hand-made multi-process launch (several processes on one machine, or hosts outside a
# managed cluster) sets all three; jax.distributed.initialize reads the first itself.
LAUNCH_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
# Managed clusters, where jax.distributed.initialize() finds everything on its own.
_CLUSTER_MARKERS = ("TPU_WORKER_HOSTNAMES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def distributed_launch_args() -> dict | None:
  """The jax.distributed.initialize() arguments of this process's launch, or None for a
  single-process run. A hand-made launch sets JAX_COORDINATOR_ADDRESS (host:port of process
  0), JAX_NUM_PROCESSES and JAX_PROCESS_ID on every process; on a TPU pod slice, under Slurm
  or Open MPI none is needed (JAX finds them). A partial or inconsistent setting is an error."""
  env = {k: os.environ.get(k, "").strip() for k in LAUNCH_ENV}
  given = [k for k, v in env.items() if v]
  if given:
    if len(given) < len(LAUNCH_ENV):
      missing = [k for k in LAUNCH_ENV if k not in given]
      cluster = any(os.environ.get(m) for m in _CLUSTER_MARKERS)
      if not (cluster and given == ["JAX_COORDINATOR_ADDRESS"]):
        raise SpecjaxError(
            f"multi-process launch: {', '.join(given)} set but {', '.join(missing)} not; "
            "set all of JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES=N and "
            "JAX_PROCESS_ID=0..N-1 on every process")
      return {}
    addr = env["JAX_COORDINATOR_ADDRESS"]
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
      raise SpecjaxError(f"JAX_COORDINATOR_ADDRESS={addr!r} is not host:port (e.g. "
                         "localhost:12355, or process 0's hostname and a free port)")
    try:
      n, i = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
    except ValueError:
      raise SpecjaxError(f"JAX_NUM_PROCESSES={env['JAX_NUM_PROCESSES']!r} and JAX_PROCESS_ID="
                         f"{env['JAX_PROCESS_ID']!r} must be integers") from None
    if n < 1 or not 0 <= i < n:
      raise SpecjaxError(f"JAX_PROCESS_ID={i} must be in 0..{n - 1} "
                         f"(JAX_NUM_PROCESSES={n})")
    if n == 1:
      return None
    return {"coordinator_address": addr, "num_processes": n, "process_id": i}
  if os.environ.get("SLURM_NTASKS", "1") != "1" or os.environ.get("OMPI_COMM_WORLD_SIZE",
                                                                  "1") != "1":
    return {}
  if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:  # a multi-host TPU slice
    return {}
  return None


def maybe_initialize_distributed():
  """Calls jax.distributed.initialize() when launched as one of several processes (see
  distributed_launch_args). On CPU, cross-process collectives go through gloo."""
  args = distributed_launch_args()
  if args is None or jax.distributed.is_initialized():
    return
  if args.get("coordinator_address"):
    # CPU devices talk across processes only with a collectives implementation (gloo is
    # jax 0.10's default; set it in case an environment turned it off)
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(**args)
  except (RuntimeError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise SpecjaxError(f"jax.distributed.initialize failed ({first[:300]}); check "
                       "JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID") from None


KV_LEAVES = ("k_BxSxKVxH", "v_BxSxKVxH")  # models.kv_cache.LayerKV: [batch, seq, kv_heads, dim]


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a decode run's arrays live: a mesh and the logical-axis rules (training's). Rows go
  over the batch axes, parameters by their logical names (heads, MLP and vocabulary over
  `tensor`), KV caches over batch and kv_heads. Hashable: the decode loops hold it as a static
  field and constrain their carried state with it, so the loop runs under this sharding."""

  mesh: Mesh
  rules: tuple = DEFAULT_RULES

  def sharding(self, logical, shape) -> NamedSharding:
    return NamedSharding(self.mesh, logical_to_mesh(logical, self.rules, self.mesh, shape))

  def params(self, state):
    """Parameters placed by their logical axis names (replicated where a size does not
    divide, with a warning)."""
    return jax.device_put(state, state_shardings(state, self.mesh, self.rules))

  def rows(self, x):
    """A host array of whole rows ([B, ...], the same on every process) as a global array
    split over the batch axes; each process feeds only the rows its devices hold."""
    x = np.asarray(x)
    sharding = self.sharding(("batch",) + (None,) * (x.ndim - 1), x.shape)
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    index = sharding.addressable_devices_indices_map(x.shape)
    starts = sorted({(sl[0].start or 0, sl[0].stop or x.shape[0]) for sl in index.values()})
    local = np.concatenate([x[a:b] for a, b in starts])
    return jax.make_array_from_process_local_data(sharding, local, x.shape)

  def gather(self, tree):
    """Host copies of (possibly multi-process) global arrays."""
    if jax.process_count() == 1:
      return jax.device_get(tree)
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)

  def constrain(self, tree, batch: int):
    """Pins the layout of a decode loop's state (inside jit): KV caches over batch and
    kv_heads, per-row arrays (leading axis `batch`) over the batch axes, the rest replicated."""

    def one(path, x):
      if not hasattr(x, "ndim") or x.ndim == 0 or jax.dtypes.issubdtype(x.dtype,
                                                                        jax.dtypes.prng_key):
        return x
      name = getattr(path[-1], "name", None) if path else None
      if name in KV_LEAVES and x.ndim == 4:
        logical = ("batch", None, "kv_heads", None)
      elif x.shape[0] == batch:
        logical = ("batch",) + (None,) * (x.ndim - 1)
      else:
        logical = (None,) * x.ndim
      return jax.lax.with_sharding_constraint(x, self.sharding(logical, x.shape))

    return jax.tree_util.tree_map_with_path(one, tree)


def decode_layout(cfg) -> Layout | None:
  """The decode config's mesh (`mesh_shape`, `logical_axis_rules`), or None for one device
  (an empty mesh_shape, or a mesh of one device)."""
  shape = cfg.get("mesh_shape")
  shape = shape.to_dict() if hasattr(shape, "to_dict") else dict(shape or {})
  if not shape:
    return None
  mesh = make_mesh(shape)
  if mesh.size == 1:
    return None
  return Layout(mesh, rules_from_config(cfg.get("logical_axis_rules")))
