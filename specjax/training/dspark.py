"""Training DSpark against the frozen target, then calibrating its confidence head.

Blocks as in DFlash (`training/block.py`: anchors, block mask, context), aligned as in
DeepSpec: block [t_a, MASK x (B-1)], slot j predicts t_{a+j+1}, with the Markov head reading
the true previous token x_{j-1} = t_{a+j} (teacher forcing). Per slot:
  CE(label), TV = 0.5 ||p_draft - p_target||_1 (p_target: the target at position a+j),
  BCE(c_j, 1 - TV) for the confidence head (the soft label is the slot's acceptance
  probability; no gradient through it),
combined as 0.1 CE + 0.9 TV + 1.0 BCE, each weighted by exp(-j/gamma) (j from 0). Labels only
on generated tokens (regenerated data masks the corpus prompt).

After training, `calibrate` fits one temperature per position to the logit of the survival
prod_{i<=j} c_i on held-out data and writes `calibration.json` beside the checkpoints.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.drafters.dspark import build_model
from specjax.errors import SpecjaxError
from specjax.methods.builtin import DSPARK_CALIBRATION
from specjax.training import block as block_training
from specjax.training.block import block_hidden, block_targets, target_and_anchors


def block_outputs(model, target, target_out, batch, anchors, real, bs: int):
  """Draft logits, target probabilities, confidence logits [B, A, bs(, V)], the labels and
  their validity for the blocks at `anchors`."""
  tokens, seg = batch["tokens"], batch["segment_ids"]
  b, t = tokens.shape
  a = anchors.shape[1]
  labels, valid = block_targets(tokens, seg, anchors, real, bs + 1)
  labels, valid = labels[..., 1:], valid[..., 1:]  # slot j -> t_{a+j+1}
  prev, _ = block_targets(tokens, seg, anchors, real, bs)  # slot j reads t_{a+j}
  hidden = block_hidden(model, target, target_out, batch, anchors, bs)
  e = model.markov_head.embed(prev)
  logits = target.logits(hidden).reshape(b, a, bs, -1) + model.markov_head(e)
  hidden = hidden.reshape(b, a, bs, -1)
  idx = jnp.minimum(anchors[..., None] + jnp.arange(bs), t - 1).reshape(b, -1)
  p_target = jax.nn.softmax(jnp.take_along_axis(target_out.logits_BxTxV, idx[..., None], axis=1
                                                ).reshape(b, a, bs, -1), axis=-1)
  return logits, p_target, model.confidence_head(hidden, e), labels, valid


def dspark_loss(model_graphdef, target_graphdef, cfg, layers):
  bs, gamma = cfg.block_size, cfg.gamma
  late = bs // 2  # slots j >= late are the "late positions" the Markov head is judged on

  def loss_fn(params, target_params, batch, rng):
    target = nnx.merge(target_graphdef, target_params)
    model = nnx.merge(model_graphdef, params)
    out, anchors, real = target_and_anchors(target, batch, layers, rng, cfg.num_anchors)
    logits, p_target, conf_logit, labels, valid = block_outputs(model, target, out, batch,
                                                                anchors, real, bs)
    p_draft = jax.nn.softmax(logits, axis=-1)
    tv = 0.5 * jnp.abs(p_draft - p_target).sum(-1)
    accept = jax.lax.stop_gradient(1.0 - tv)  # acceptance probability of the slot
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    bce = optax.sigmoid_binary_cross_entropy(conf_logit, accept)
    w = jnp.exp(-jnp.arange(bs) / gamma) * valid
    norm = jnp.maximum(w.sum(), 1e-6)
    ce_l, tv_l, bce_l = (ce * w).sum() / norm, (tv * w).sum() / norm, (bce * w).sum() / norm
    loss = cfg.ce_weight * ce_l + cfg.tv_weight * tv_l + cfg.confidence_weight * bce_l
    v = valid.astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == labels) & valid
    tau = block_training.block_tau(correct, valid)
    # calibration of the survival prod c against the survival of the soft labels
    conf = jax.nn.sigmoid(conf_logit)
    surv_err = jnp.abs(jnp.cumprod(conf, -1) - jnp.cumprod(accept, -1))
    late_v = v[..., late:]
    return loss, {"loss": loss, "ce": ce_l, "tv": tv_l, "bce": bce_l,
                  "acc_k1": correct[..., 0].sum() / jnp.maximum(v[..., 0].sum(), 1),
                  "block_tau": tau,
                  "accept_late": (accept[..., late:] * late_v).sum() / jnp.maximum(
                      late_v.sum(), 1),
                  "acc_late": correct[..., late:].sum() / jnp.maximum(late_v.sum(), 1),
                  "confidence_error": (jnp.abs(conf - accept) * v).sum() / jnp.maximum(
                      v.sum(), 1),
                  "survival_error": (surv_err * v).sum() / jnp.maximum(v.sum(), 1),
                  "weight": v.sum()}

  return loss_fn


def _check(cfg):
  if cfg.block_size < 1:
    raise SpecjaxError(f"block_size must be >= 1, got {cfg.block_size}")
  if cfg.markov_rank < 0:
    raise SpecjaxError(f"markov_rank must be >= 0 (0 = no Markov head), got {cfg.markov_rank}")
  if cfg.num_anchors > cfg.seq_len:
    raise SpecjaxError(f"num_anchors={cfg.num_anchors} exceeds seq_len={cfg.seq_len}")
  if cfg.label_source != "target":
    raise SpecjaxError("DSpark trains on the target's regenerated continuations only "
                       f"(label_source='target'), got '{cfg.label_source}'")


def train_dspark(cfg):
  _check(cfg)
  setup = block_training.prepare(cfg, build_model, target_logits=True)
  print(f"[{cfg.method}] {setup.num_params / 1e6:.2f}M parameters, {cfg.num_layers} layers, "
        f"features from layers {setup.layers}, block {cfg.block_size} (every slot predicts), "
        f"Markov rank {cfg.markov_rank}, gamma {cfg.gamma}", flush=True)
  params = block_training.run(cfg, setup, dspark_loss)
  graphdef, target, layers, val = setup.graphdef, setup.target, setup.layers, setup.eval_data
  folder = run_dir_lib.model_dir(cfg.run_dir, cfg.method)
  report = calibrate(cfg, graphdef, target, layers, params, val)
  if jax.process_index() == 0:
    with open(os.path.join(folder, DSPARK_CALIBRATION), "w") as f:
      json.dump(report, f, indent=1)
  print(f"[{cfg.method}] survival calibration error (ECE) {report['ece_before']:.4f} -> "
        f"{report['ece_after']:.4f} after per-position temperature scaling", flush=True)
  return params


def calibration_error(pred, label, bins: int = 10) -> float:
  """Expected calibration error: |mean prediction - mean label| per equal-width bin of the
  prediction, weighted by the bin's share."""
  pred, label = np.asarray(pred, np.float64), np.asarray(label, np.float64)
  if pred.size == 0:
    return float("nan")
  which = np.minimum((pred * bins).astype(int), bins - 1)
  err = 0.0
  for i in range(bins):
    sel = which == i
    if sel.any():
      err += sel.mean() * abs(pred[sel].mean() - label[sel].mean())
  return float(err)


def _scaled(a, t):
  a = np.clip(a, 1e-6, 1 - 1e-6)
  return 1.0 / (1.0 + np.exp(-(np.log(a) - np.log1p(-a)) / t))


def survival_pairs(cfg, graphdef, target, layers, params, batches):
  """(predicted survival prod c, soft-label survival prod c*, valid), [N, bs] each."""
  bs = cfg.block_size

  @jax.jit
  def one(params, target_params, batch):
    t = nnx.merge(target.graphdef, target_params)
    model = nnx.merge(graphdef, params)
    out, anchors, real = target_and_anchors(t, batch, layers, jax.random.key(1),
                                            cfg.num_anchors)
    logits, p_target, conf_logit, _, valid = block_outputs(model, t, out, batch, anchors,
                                                           real, bs)
    accept = 1.0 - 0.5 * jnp.abs(jax.nn.softmax(logits, -1) - p_target).sum(-1)
    return (jnp.cumprod(jax.nn.sigmoid(conf_logit), -1), jnp.cumprod(accept, -1),
            jnp.cumprod(valid, -1).astype(bool))

  outs = [jax.device_get(one(params, target.params, {k: jnp.asarray(v) for k, v in b.items()}))
          for b in batches]
  return [np.concatenate([o[i].reshape(-1, bs) for o in outs]) for i in range(3)]


def calibrate(cfg, graphdef, target, layers, params, batches) -> dict:
  """Per-position temperatures T_j for sigmoid(logit(prod_{i<=j} c_i) / T_j), fitted by
  binary cross-entropy against the soft-label survival on held-out blocks (grid search), and
  the calibration error (ECE) of the survival before and after."""
  pred, label, valid = survival_pairs(cfg, graphdef, target, layers, params, batches)
  grid = np.exp(np.linspace(np.log(0.1), np.log(10.0), 121))
  temps, before, after = [], [], []
  for j in range(cfg.block_size):
    a, s = pred[valid[:, j], j], label[valid[:, j], j]
    if a.size == 0:
      temps.append(1.0)
      before.append(float("nan"))
      after.append(float("nan"))
      continue
    def bce(t):
      c = np.clip(_scaled(a, t), 1e-7, 1 - 1e-7)
      return -(s * np.log(c) + (1 - s) * np.log1p(-c)).mean()
    best = float(grid[np.argmin([bce(t) for t in grid])])
    temps.append(best)
    before.append(calibration_error(a, s))
    after.append(calibration_error(_scaled(a, best), s))
  mean = lambda x: float(np.nanmean(x))
  return {"temperatures": temps, "ece_before": mean(before), "ece_after": mean(after),
          "ece_before_per_position": before, "ece_after_per_position": after,
          "num_blocks": int(valid[:, 0].sum())}
