"""Training DFlash against the frozen target (the block harness: training/block.py).

Cross-entropy is weighted by exp(-(k-1)/gamma) over block position k.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax
from flax import nnx

from specjax.drafters.dflash import build_model
from specjax.training.block import (block_hidden, block_targets, block_tau, position_weights,
                                    target_and_anchors, train_block)


def dflash_loss(model_graphdef, target_graphdef, cfg, layers):
  bs, gamma = cfg.block_size, cfg.gamma

  def loss_fn(params, target_params, batch, rng):
    target = nnx.merge(target_graphdef, target_params)
    model = nnx.merge(model_graphdef, params)
    out, anchors, real = target_and_anchors(target, batch, layers, rng, cfg.num_anchors,
                                            compute_logits=False)
    tokens = batch["tokens"]
    b = tokens.shape[0]
    labels, valid = block_targets(tokens, batch["segment_ids"], anchors, real, bs)
    hidden = block_hidden(model, target, out, batch, anchors, bs)
    logits = model.draft_logits(target, hidden).reshape(b, cfg.num_anchors, bs, -1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    w = position_weights(bs, gamma) * valid
    loss = (ce * w).sum() / jnp.maximum(w.sum(), 1e-6)
    correct = (jnp.argmax(logits, -1) == labels) & valid
    tau = block_tau(correct[:, :, 1:], valid[:, :, 1:])
    acc1 = (correct[:, :, 1].sum()) / jnp.maximum(valid[:, :, 1].sum(), 1)
    return loss, {"loss": loss, "acc_k1": acc1, "block_tau": tau,
                  "weight": valid.sum().astype(jnp.float32)}

  return loss_fn


def train_dflash(cfg):
  return train_block(cfg, build_model, dflash_loss, target_logits=False)
