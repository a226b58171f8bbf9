"""Training DFlash 2 against the frozen target: DFlash's blocks, anchors and masks, with

- a KL loss of the drafter's (unary) logits against the target's distribution at each label
  position, weighted by exp(-(k-1)/gamma) over block position k, and
- a top-K-way cross-entropy for the candidate selector on the target's token, teacher-forced
  (slot k's predecessor is the token before it: the anchor for k = 1), skipping slots whose
  token is not among the K candidates; same weights.

Greedy block acceptance with the selector (`block_tau`) is exact under teacher forcing: a slot
only counts when every slot before it was right, and then its predecessor is the true one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.drafters.dflash2 import build_model
from specjax.training import block as block_training


def dflash2_loss(model_graphdef, target_graphdef, cfg, layers):
  bs, gamma = cfg.block_size, cfg.gamma
  kl_weight, selector_weight = float(cfg.kl_weight), float(cfg.selector_weight)

  def loss_fn(params, target_params, batch, rng):
    target = nnx.merge(target_graphdef, target_params)
    model = nnx.merge(model_graphdef, params)
    a = cfg.num_anchors
    out, anchors, real = block_training.target_and_anchors(target, batch, layers, rng, a)
    tokens = batch["tokens"]
    b, t = tokens.shape
    labels, valid = block_training.block_targets(tokens, batch["segment_ids"], anchors, real,
                                                  bs)
    hidden = block_training.block_hidden(model, target, out, batch, anchors, bs, block_size=bs)
    logits = model.draft_logits(target, hidden).reshape(b, a, bs, -1)  # slot 0: the anchor
    hidden = hidden.reshape(b, a, bs, -1)
    # the target's distribution for t_{a+k}: its logits at position a+k-1
    src = jnp.minimum(anchors[..., None] + jnp.arange(bs) - 1, t - 1).clip(0)
    p_logits = out.logits_BxTxV[jnp.arange(b)[:, None, None], src].astype(jnp.float32)
    p_log = jax.nn.log_softmax(p_logits, -1)
    q_log = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    kl = (jnp.exp(p_log) * (p_log - q_log)).sum(-1)
    w = block_training.position_weights(bs, gamma) * valid
    kl_loss = (kl * w).sum() / jnp.maximum(w.sum(), 1e-6)

    # selector: slot k's predecessor is labels[k-1] (labels[0] is the anchor token itself)
    sel = model.candidate_selector
    n = b * a
    unary, cand = sel.candidates(logits[:, :, 1:].reshape(n, bs - 1, -1))
    preds = labels[:, :, :-1].reshape(n, bs - 1)
    scores = unary + sel.pair_scores(hidden[:, :, 1:].reshape(n, bs - 1, -1), preds, cand)
    hit = cand == labels[:, :, 1:].reshape(n, bs - 1)[..., None]
    inside = hit.any(-1).reshape(b, a, bs - 1)
    ce = -(jax.nn.log_softmax(scores, -1) * hit).sum(-1).reshape(b, a, bs - 1)
    ws = w[:, :, 1:] * inside
    selector_loss = (ce * ws).sum() / jnp.maximum(ws.sum(), 1e-6)
    loss = kl_weight * kl_loss + selector_weight * selector_loss

    v = valid[:, :, 1:]
    top1 = (jnp.argmax(logits[:, :, 1:], -1) == labels[:, :, 1:]) & v
    chosen = (jnp.argmax(scores, -1).reshape(b, a, bs - 1) == jnp.argmax(
        hit, -1).reshape(b, a, bs - 1)) & inside & v
    tau = lambda correct: block_training.block_tau(correct, v)
    count = jnp.maximum(v.sum(), 1)
    return loss, {"loss": loss, "kl": kl_loss, "selector_loss": selector_loss,
                  "top1": top1.sum() / count, "topk": (inside & v).sum() / count,
                  "block_tau": tau(chosen), "block_tau_unary": tau(top1),
                  "weight": valid.sum().astype(jnp.float32)}

  return loss_fn


def train_dflash2(cfg):
  return block_training.train_block(cfg, build_model, dflash2_loss, target_logits=True)
