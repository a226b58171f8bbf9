"""Offline target features (`--config.feature_cache=True`): the frozen target's pass over the
regenerated rows, computed once instead of every training step.

Drafters trained on the fixed set of regenerated rows against a frozen target get the same
target outputs for a row every epoch. With the cache, the target runs once over every row
before training; what the drafter's loss reads from it (the residual stream of some layers,
and the final hidden states the LM head reads, from which logits are recomputed) is kept in
host memory, and each batch carries its own rows' slices, so the training step skips the
target's pass (on the reference target, 59% of a DFlash step). The time spent building the
cache comes out of a wall-clock budget (budget.json records it), so equal budgets stay equal.

Memory: rows x seq_len x (feature layers [+ 1 for the hidden states]) x d_model x 4 bytes
(3.3 GB for the reference experiment's DFlash). Only for regenerated rows and a frozen target.

`--config.feature_cache_store=True` keeps the cache in run_dir/feature_cache/ (with the hidden
states, read back memory-mapped), keyed by the rows' tokens, the layers and the target's
step: every later drafter reading the same layers of the same rows (DFlash, DSpark and
DFlash 2) loads it instead of rebuilding it. The build is then a shared one-time cost, like the
regenerated rows themselves, and comes out of no drafter's budget (each run prints it).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.models.transformer import TransformerOutput
from specjax.training import budget

FEATURES, HIDDEN = "cached_features", "cached_hidden"


def check(cfg, regenerated: bool):
  """regenerated: the run trains on the fixed regenerated rows."""
  if cfg.get("feature_cache", False) and not regenerated:
    raise SpecjaxError("feature_cache=True needs the regenerated rows (block drafters: "
                       "label_source='target'; draft / MTP: train_on='regenerated'); corpus "
                       "batches are packed afresh every epoch")
  if cfg.get("feature_cache", False) and not cfg.get("freeze_target", True):
    raise SpecjaxError("feature_cache=True needs a frozen target (freeze_target=True)")


class Builder:
  """per_row(batches) for regenerate.regenerated_data: {FEATURES: [N, L, T, D], HIDDEN:
  [N, T, D]} from one jitted pass of the frozen target per batch of rows; `seconds` is the
  time those passes took."""

  def __init__(self, target, layers: tuple[int, ...], with_hidden: bool, folder: str = ""):
    self.target, self.layers, self.with_hidden = target, tuple(layers), with_hidden or bool(folder)
    self.folder = folder  # stored there (shared; not counted in a budget) when set
    self.seconds = 0.0
    self.loaded = []  # the stored caches read instead of built
    with_hidden = self.with_hidden

    @jax.jit
    def run(params, tokens, positions, seg):
      out = nnx.merge(target.graphdef, params)(tokens, positions_BxT=positions,
                                               segment_ids_BxT=seg, feature_layers=self.layers,
                                               compute_logits=False)
      feats = jax.numpy.stack(out.features, axis=1) if self.layers else None
      return feats, out.hidden_BxTxD if with_hidden else None
    self._run = run

  def key(self, batches) -> str:
    h = hashlib.md5(json.dumps({"layers": self.layers, "hidden": self.with_hidden,
                                "target_step": self.target.step}).encode())
    for b in batches:
      for name in ("tokens", "positions", "segment_ids"):
        h.update(np.ascontiguousarray(b[name], np.int32).tobytes())
    return h.hexdigest()[:16]

  def __call__(self, batches) -> dict:
    if not self.folder:
      return self._build(batches)
    path = os.path.join(self.folder, self.key(batches))
    if not os.path.exists(os.path.join(path, "done")):
      out = self._build(batches)
      if jax.process_index() == 0:  # written whole, then marked done: a killed write is redone
        os.makedirs(path, exist_ok=True)
        for name, value in out.items():
          np.save(os.path.join(path, name + ".npy"), value)
        open(os.path.join(path, "done"), "w").close()
      return out
    self.loaded.append(path)
    return {name: np.load(os.path.join(path, name + ".npy"), mmap_mode="r")
            for name in (FEATURES, HIDDEN) if os.path.exists(os.path.join(path, name + ".npy"))}

  def _build(self, batches) -> dict:
    t0 = time.perf_counter()
    total = sum(len(b["tokens"]) for b in batches)
    out, start = {}, 0
    for b in batches:
      got = self._run(self.target.params, b["tokens"], b["positions"], b["segment_ids"])
      for name, value in zip((FEATURES, HIDDEN), got):
        if value is None:
          continue
        if name not in out:  # filled in place: the cache is the largest thing in memory
          out[name] = np.empty((total,) + value.shape[1:], value.dtype)
        out[name][start:start + len(value)] = np.asarray(value)
      start += len(b["tokens"])
    self.seconds += time.perf_counter() - t0
    return out


def builder(cfg, target, layers, with_hidden: bool, name: str):
  """The cache builder for the run of model `name`, or None when cfg.feature_cache is off or
  the run is already trained to its last step (resuming it trains nothing)."""
  if not cfg.get("feature_cache", False):
    return None
  if budget.finished(cfg, run_dir_lib.model_dir(cfg.run_dir, name)):
    print(f"[{name}] trained to its last step: no feature cache to build", flush=True)
    return None
  folder = ""
  if cfg.get("feature_cache_store", False):
    folder = os.path.join(run_dir_lib.resolve(cfg.run_dir), "feature_cache")
  return Builder(target, layers, with_hidden, folder)


def report(name: str, cache) -> float:
  """Prints the cache's build time and returns what comes out of the budget: the build, or 0
  without a cache or with a stored (shared) one."""
  if cache is None:
    return 0.0
  if cache.folder:
    print(f"[{name}] feature cache in {cache.folder}: built in {cache.seconds:.0f} s"
          f"{', read back for ' + str(len(cache.loaded)) + ' split(s)' if cache.loaded else ''}"
          "; shared, so out of the budget", flush=True)
    return 0.0
  print(f"[{name}] feature cache: the target's pass over every regenerated row in "
        f"{cache.seconds:.0f} s", flush=True)
  return cache.seconds


def target_output(target, batch, layers=(), compute_logits: bool = True) -> TransformerOutput:
  """The frozen target's outputs on the batch: read from its cached slices when it carries
  them, else from the target's pass. Features come from `layers`."""
  if FEATURES not in batch and HIDDEN not in batch:
    return target(batch["tokens"], positions_BxT=batch["positions"],
                  segment_ids_BxT=batch["segment_ids"], feature_layers=tuple(layers),
                  compute_logits=compute_logits)
  feats = batch.get(FEATURES)
  features = () if feats is None else tuple(feats[:, i] for i in range(feats.shape[1]))
  if len(features) != len(layers):
    raise SpecjaxError(f"the feature cache holds {len(features)} layers, the loss reads "
                       f"{len(layers)}")
  hidden = batch.get(HIDDEN)
  if compute_logits and hidden is None:
    raise SpecjaxError("this loss reads the target's logits: build the cache with the "
                       "hidden states (with_hidden=True)")
  logits = target.logits(hidden) if compute_logits else None
  return TransformerOutput(logits, hidden, features, None)
