"""Offline target features for the block drafters (`--config.feature_cache=True`).

The block drafters train on a fixed set of regenerated rows against a frozen target, so the
target's pass over a batch gives the same features every epoch. With the cache, the target
runs once over every row before training, the features (and, for DSpark and DFlash 2, whose
losses read the target's logits, the final hidden states the LM head reads) are kept in host
memory, and each batch carries its rows' slices; the training step then skips the target's
pass (on the reference target, 59% of a DFlash step). The time spent building the cache comes
out of a wall-clock budget (budget.json records it), so equal budgets stay equal.

Memory: rows x seq_len x (len(feature_layers) [+ 1]) x d_model x 4 bytes (3.3 GB for the
reference experiment's DFlash). Only for regenerated data (`label_source="target"`).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from specjax.errors import SpecjaxError

FEATURES, HIDDEN = "cached_features", "cached_hidden"


def check(cfg):
  if cfg.get("feature_cache", False) and cfg.label_source != "target":
    raise SpecjaxError("feature_cache=True needs label_source='target' (a fixed set of "
                       "regenerated rows); corpus batches are packed afresh every epoch")


def per_row(target, layers: tuple[int, ...], with_hidden: bool):
  """A function batches -> {FEATURES: [N, L, T, D], HIDDEN: [N, T, D]} over batches of rows
  (dicts with tokens / positions / segment_ids, as training sees them), from one jitted pass
  of the frozen target per batch."""

  @jax.jit
  def run(params, tokens, positions, seg):
    out = nnx.merge(target.graphdef, params)(tokens, positions_BxT=positions,
                                             segment_ids_BxT=seg, feature_layers=layers,
                                             compute_logits=False)
    return jax.numpy.stack(out.features, axis=1), out.hidden_BxTxD

  def compute(batches) -> dict:
    feats, hidden = [], []
    for b in batches:
      f, h = run(target.params, b["tokens"], b["positions"], b["segment_ids"])
      feats.append(np.asarray(f))
      if with_hidden:
        hidden.append(np.asarray(h))
    out = {FEATURES: np.concatenate(feats)}
    if with_hidden:
      out[HIDDEN] = np.concatenate(hidden)
    return out

  return compute


def cached_output(target, batch, compute_logits: bool):
  """What target_and_anchors would get from the target's pass, read from the batch's cached
  slices: (features, hidden, logits or None)."""
  feats = batch[FEATURES]
  features = tuple(feats[:, i] for i in range(feats.shape[1]))
  hidden = batch.get(HIDDEN)
  if compute_logits and hidden is None:
    raise SpecjaxError("this loss needs the target's logits: build the cache with the hidden "
                       "states (per_row(..., with_hidden=True))")
  logits = target.logits(hidden) if compute_logits else None
  return features, hidden, logits
