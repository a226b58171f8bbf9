"""Orbax checkpoints behind one small class.

Each step saves three items: `params` (what decoding loads), `train` (optimizer state and
step) and `data` (the Grain iterator state, JSON), so a killed run resumes exactly where its
last checkpoint left it.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from specjax.errors import SpecjaxError


def _abstract(tree, default_sharding=None):
  """ShapeDtypeStructs carrying each leaf's sharding, the restore target orbax wants. Leaves
  without one get `default_sharding` (None: orbax uses the sharding they were saved with)."""
  def one(x):
    sharding = getattr(x, "sharding", None) or default_sharding
    if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is sharding:
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(one, tree)


def _shape_error(directory, step, err) -> SpecjaxError:
  first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
  return SpecjaxError(
      f"checkpoint {directory} step {step} does not match the model config ({first[:300]}); "
      "use the config the checkpoint was trained with, or a fresh run_dir")


class Checkpoints:

  def __init__(self, directory: str, *, keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("params", "train", "data"),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, params, train_state, data_state: dict | None = None):
    self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        train=ocp.args.StandardSave(train_state),
        data=ocp.args.JsonSave(data_state or {}),
    ))

  def restore(self, step: int, params_like, train_like):
    """Restores all three items into the shapes/shardings of the given (abstract) trees."""
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(_abstract(params_like)),
          train=ocp.args.StandardRestore(_abstract(train_like)),
          data=ocp.args.JsonRestore(),
      ))
    except (ValueError, TypeError, KeyError) as e:
      raise _shape_error(self.directory, step, e) from None
    return out["params"], out["train"], out["data"]

  def restore_params(self, params_like, step: int | None = None):
    step = self.latest_step() if step is None else step
    if step is None:
      raise SpecjaxError(f"no checkpoint in {self.directory}; train the model first")
    def restore(default_sharding=None):
      return self.manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(_abstract(params_like, default_sharding))))["params"]
    if jax.process_count() > 1 and any(
        getattr(x, "sharding", None) is None for x in jax.tree.leaves(params_like)):
      # several processes: every one must restore the same way (a fallback taken by one
      # alone would leave the others waiting in orbax's barriers), so leaves without a
      # sharding are restored replicated over all devices; the caller then places them
      everything = jax.sharding.Mesh(np.asarray(jax.devices()), ("all",))
      try:
        return restore(jax.sharding.NamedSharding(everything, jax.sharding.PartitionSpec()))
      except (ValueError, TypeError, KeyError) as e:
        raise _shape_error(self.directory, step, e) from None
    try:
      return restore()
    except (ValueError, TypeError, KeyError) as e:
      if "topology" not in str(e).lower():
        raise _shape_error(self.directory, step, e) from None
    # saved on other devices (e.g. imported over 8 devices, decoded on 1): the first device
    try:
      return restore(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    except (ValueError, TypeError, KeyError) as e:
      raise _shape_error(self.directory, step, e) from None

  def restore_params_as_saved(self, step: int | None = None):
    """The newest parameters as they were saved (nested dicts of arrays, no target tree)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise SpecjaxError(f"no checkpoint in {self.directory}; train the model first")
    return self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore()))["params"]

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()


def save_params_only(directory: str, step: int, params, host_bytes: int):
  """Writes `params` as step `step` of a checkpoint that `Checkpoints.restore_params` reads,
  moving at most about `host_bytes` from device to host at a time (a large imported model is
  never copied to the host whole)."""
  handler = ocp.PyTreeCheckpointHandler(save_device_host_concurrent_gb=host_bytes / 1e9,
                                        save_concurrent_gb=host_bytes / 1e9)
  manager = ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False),
      item_names=("params",), item_handlers={"params": handler})
  try:
    manager.save(step, args=ocp.args.Composite(params=ocp.args.PyTreeSave(params)))
    manager.wait_until_finished()
  finally:
    manager.close()
