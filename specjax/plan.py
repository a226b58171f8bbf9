"""Planning mode (`--config.plan=true` on train.py and decode.py): what a configuration needs
on each device, before anything is allocated.

Parameters are built abstractly (`nnx.eval_shape`) and laid out with the config's mesh and
logical-axis rules on an abstract mesh of `plan_devices` devices (0 = this machine's count), so
a laptop can plan a TPU slice. Per device:

- parameters: the shard of every array (replicated where a size does not divide);
- training: AdamW's two moments (the parameters' dtype) and the gradients, each one more copy
  of the trainable parameters' shards; a drafter's frozen target counts as parameters;
- activations (an estimate): Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models", eq. 2 with tensor parallelism t): per layer
  s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes at 16 bits (scaled by the compute dtype's bytes / 2),
  b the per-device batch, plus the float32 logits b*s*V*4/t; at decode the verify window's
  logits b*(K+1)*V*4/t;
- decode: the KV caches, the target's [L, 2, B, S, kv_heads, head_dim] and the drafter's
  (DFlash's context cache, the draft model's, sequential MTP's), split over batch and kv_heads.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import config_base
from specjax import methods as methods_lib
from specjax import run_dir as run_dir_lib
from specjax import sharding
from specjax.errors import SpecjaxError

GIB = 2**30


def abstract_mesh(mesh_shape, devices: int):
  """An AbstractMesh of the config's axes over `devices` (one -1 axis fills them)."""
  shape = mesh_shape.to_dict() if hasattr(mesh_shape, "to_dict") else dict(mesh_shape or {})
  shape = sharding.resolve_mesh_shape(shape or {"data": 1}, devices)
  return jax.sharding.AbstractMesh(tuple(shape.values()), tuple(shape))


def shard_bytes(shape, dtype, spec, mesh) -> int:
  """Bytes of one device's shard of an array laid out by `spec` (a PartitionSpec)."""
  dims = list(shape)
  for i, axes in enumerate(tuple(spec) + (None,) * (len(dims) - len(spec))):
    if axes is None:
      continue
    axes = (axes,) if isinstance(axes, str) else axes
    dims[i] = -(-dims[i] // math.prod(mesh.shape[a] for a in axes))
  return math.prod(dims) * jnp.dtype(dtype).itemsize


def state_bytes(abstract_state, mesh, rules) -> int:
  """Per-device bytes of an (abstract) nnx.State laid out by its logical axis names."""
  total = 0
  for v in jax.tree.leaves(abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
    if isinstance(v, nnx.Variable):
      names = v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
      spec = sharding.logical_to_mesh(names, rules, mesh, v.shape)
      total += shard_bytes(v.shape, v.dtype, spec, mesh)
    else:
      total += int(np.prod(v.shape)) * jnp.dtype(v.dtype).itemsize
  return total


def kv_bytes(num_layers, batch, length, kv_heads, head_dim, dtype, mesh, rules) -> int:
  """A KV cache's bytes per device, laid out as the decode loop constrains it."""
  shape = (batch, length, kv_heads, head_dim)
  spec = sharding.logical_to_mesh(("batch", None, "kv_heads", None), rules, mesh, shape)
  return 2 * num_layers * shard_bytes(shape, dtype, spec, mesh)


def abstract_module(build):
  return nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)[1]


def _abstract_target(target_cfg):
  from specjax.models import Transformer
  return abstract_module(lambda r: Transformer(target_cfg, rngs=r))


def target_model_config(cfg):
  """The target's TransformerConfig: a target config's own `model` (vocabulary
  `data.vocab_size`); at decode, `target_config` (a target config file) when set; for a
  drafter, its `target_model` (shape) and `target_vocab_size` when set, else the run
  directory's target."""
  if methods_lib.trains_target(cfg) and "model" in cfg:
    return run_dir_lib.transformer_config(cfg.model, int(cfg.data.vocab_size))
  if cfg.get("target_config", ""):  # decode.py: a target training config file
    return target_model_config(config_base.load_config_file(cfg.target_config))
  folder = run_dir_lib.model_dir(cfg.run_dir, "target")
  if cfg.get("target_model") is not None:
    return run_dir_lib.transformer_config(cfg.target_model, int(cfg.target_vocab_size))
  try:
    return run_dir_lib.transformer_config(
        run_dir_lib.load_config(folder).model, run_dir_lib.vocab_size(cfg.run_dir))
  except SpecjaxError:
    raise SpecjaxError(f"planning {cfg.get('method')} needs the target's shape: train or "
                       f"import the target into {folder}, or set target_model and "
                       "target_vocab_size in the config") from None


def drafter_model(method, target_cfg, cfg):
  """(abstract trainable params, [(layers, kv_heads, head_dim, dtype)] of its KV caches,
  tokens per sequence its layers see in training) of a registered method (methods.Method):
  (None, [], None) when it has no model."""
  if method.plan_model is None:
    return None, [], None
  return method.plan_model(cfg, target_cfg)


def activation_bytes(model_cfg, batch: int, seq: int, tensor: int, layers=None) -> int:
  """Korthikanti et al. 2022, eq. 2 with tensor parallelism, plus float32 logits."""
  s, b, h, a = seq, batch, model_cfg.d_model, model_cfg.num_heads
  per_layer = s * b * h * (10 + 24 / tensor + 5 * a * s / (h * tensor))
  scale = jnp.dtype(model_cfg.compute_dtype).itemsize / 2
  n = model_cfg.num_layers if layers is None else layers
  return int(n * per_layer * scale + b * s * model_cfg.vocab_size * 4 / tensor)


def _tensor(mesh) -> int:
  return int(mesh.shape.get("tensor", 1))


def _per_device_batch(batch: int, mesh) -> int:
  data = math.prod(mesh.shape.get(a, 1) for a in ("data", "fsdp"))
  return batch // data if batch % data == 0 else batch  # replicated when it does not divide


def plan_train(cfg, mesh, rules) -> list[tuple[str, int, str]]:
  target_cfg = target_model_config(cfg)
  b = _per_device_batch(int(cfg.batch_size), mesh)
  rows = []
  target_bytes = state_bytes(_abstract_target(target_cfg), mesh, rules)
  if methods_lib.trains_target(cfg):
    params = target_bytes
    rows.append(("parameters", params, "trainable"))
    acts = activation_bytes(target_cfg, b, int(cfg.seq_len), _tensor(mesh))
  else:
    abstract, _, tokens = drafter_model(methods_lib.for_training(cfg), target_cfg, cfg)
    params = state_bytes(abstract, mesh, rules)
    rows.append(("parameters", params, "trainable (the drafter)"))
    rows.append(("frozen target", target_bytes, "forward only"))
    # the drafter's layers see `tokens` positions per sequence (all of them without anchors);
    # the frozen target's forward keeps one layer's activations at a time
    seq = int(cfg.seq_len) if tokens is None else tokens
    layers = int(cfg.get("num_layers", target_cfg.num_layers))
    acts = (activation_bytes(target_cfg, b, seq, _tensor(mesh), layers=layers)
            + activation_bytes(target_cfg, b, int(cfg.seq_len), _tensor(mesh), layers=1))
  rows.append(("optimizer state", 2 * params, "AdamW mu and nu, the parameters' dtype"))
  rows.append(("gradients", params, "one copy of the trainable parameters"))
  rows.append(("activations", acts, "estimate: Korthikanti et al. 2022 eq. 2 + f32 logits"))
  return rows


def plan_decode(cfg, mesh, rules, methods, target_cfg=None) -> list[tuple[str, int, str]]:
  target_cfg = target_cfg or target_model_config(cfg)
  b, s = int(cfg.batch_size), int(cfg.cache_len)
  rows = [("target parameters", state_bytes(_abstract_target(target_cfg), mesh, rules), "")]
  rows.append(("target KV cache", kv_bytes(target_cfg.num_layers, b, s, target_cfg.num_kv_heads,
                                           target_cfg.head_dim, target_cfg.compute_dtype,
                                           mesh, rules), f"batch {b} x cache_len {s}"))
  k = 0
  for method in methods:
    k = max(k, methods_lib.num_drafts(method, cfg))
    spec = methods_lib.get(method)
    if spec.plan_model is None:
      continue
    abstract, caches, _ = drafter_model(spec, target_cfg, drafter_config(cfg, method))
    if abstract is not None:
      rows.append((f"{method} parameters", state_bytes(abstract, mesh, rules), ""))
    for layers, kv, hd, dtype in caches:
      rows.append((f"{method} KV cache", kv_bytes(layers, b, s, kv, hd, dtype, mesh, rules), ""))
  logits = -(-b * (k + 1) * target_cfg.vocab_size * 4 // _tensor(mesh))
  rows.append(("activations", logits, f"estimate: the verify window's f32 logits, K = {k}"))
  return rows


def drafter_config(cfg, method: str):
  """A drafter's training config: run_dir/<method>/config.json, or --config.drafter_config."""
  path = cfg.get("drafter_config", "")
  if path:
    return config_base.load_config_file(path)
  return run_dir_lib.load_config(run_dir_lib.require_model_dir(cfg.run_dir, method))


def format_plan(rows, mesh, device_memory_gib: float) -> str:
  total = sum(r[1] for r in rows)
  lines = [f"plan per device, mesh {dict(mesh.shape)} ({mesh.size} devices):"]
  width = max(len(r[0]) for r in rows)
  for name, n, note in rows + [("total", total, "")]:
    lines.append(f"  {name.ljust(width)}  {n / GIB:10.3f} GiB  {note}".rstrip())
  if device_memory_gib > 0:
    fits = total <= device_memory_gib * GIB
    lines.append(f"  {'fits' if fits else 'does NOT fit'} in {device_memory_gib:g} GiB per device "
                 f"({total / (device_memory_gib * GIB):.0%} used)")
  return "\n".join(lines)


def run(cfg, kind: str, methods=()) -> dict:
  """Prints the plan and returns {rows, total, mesh, fits}; allocates nothing."""
  devices = int(cfg.get("plan_devices", 0)) or jax.device_count()
  mesh = abstract_mesh(cfg.get("mesh_shape"), devices)
  rules = sharding.rules_from_config(cfg.get("logical_axis_rules"))
  rows = plan_train(cfg, mesh, rules) if kind == "train" else plan_decode(cfg, mesh, rules,
                                                                          methods)
  memory = float(cfg.get("device_memory_gib", 0.0))
  print(format_plan(rows, mesh, memory), flush=True)
  total = sum(r[1] for r in rows)
  return {"rows": rows, "total": total, "mesh": dict(mesh.shape),
          "fits": None if memory <= 0 else total <= memory * GIB}
