"""Training EAGLE-3 against the frozen target with training-time test (TTT), as speculators'
Eagle3DraftModel.forward does.

Step 0 runs the drafter over every position i: entry i reads token t_{i+1} and the target
feature g_i. Step k > 0 runs it again at every position on the teacher token t_{i+1+k} and
step k-1's output (normed with `norm_output`), at rope position + k. Attention at step k sees
step 0's entries causally within the document plus position i's own entries of steps 1..k:
exactly the keys a chained draft at depth k sees in decoding. Step k's loss is the KL from the
target's distribution at position i+1+k (over the draft vocabulary) to the draft's, averaged
over the loss-masked positions whose chain stays in the document, times decay^k; the steps'
losses are summed.

The draft vocabulary (`draft_vocab_size` > 0, < V) is the most frequent loss-masked tokens of
the first `vocab_batches` training batches, in ascending id order, written to
run_dir/eagle3/draft_vocab.json before training (kept on resume).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.drafters import eagle3
from specjax.drafters.mtp_sequential import shift_left
from specjax.errors import SpecjaxError
from specjax.models.layers import causal_segment_mask
from specjax.training import feature_cache, regenerate
from specjax.training.loop import TrainTask, train

NAME = "eagle3"
VOCAB_FILE = "draft_vocab.json"


def ttt_logits(model, target, features, tokens_BxT, positions_BxT, segments_BxT, steps: int,
               vocab_V=None):
  """Per TTT step k = 0..steps-1: the draft's logits [B, T, Vd] at every position i (the
  prediction of t_{i+2+k}), with teacher tokens and self-fed hidden states."""
  t = tokens_BxT.shape[1]
  causal = causal_segment_mask(segments_BxT)
  diag = jnp.broadcast_to(jnp.eye(t, dtype=bool)[None], causal.shape)
  x = model.project(features)
  kv = [[] for _ in model.layers]
  out = []
  for k in range(steps):
    emb = target.embed(shift_left(tokens_BxT, 1 + k))
    pos = positions_BxT + k
    mask = jnp.concatenate([causal] + [diag] * k, axis=-1)
    for layer, cache in zip(model.layers, kv):
      inp, residual = layer.attention_input(x, emb)
      q = layer.attn.queries(inp, pos)
      cache.append(layer.attn.keys_values(inp, pos))
      keys = jnp.concatenate([c[0] for c in cache], axis=1)
      values = jnp.concatenate([c[1] for c in cache], axis=1)
      x = layer.finish(residual, layer.attn.attend(q, keys, values, mask))
    normed, x = model.output(x)
    out.append(eagle3.draft_logits(target, normed, vocab_V))
  return out


def step_weights(segments_BxT, loss_mask_BxT, k: int):
  """Which positions step k trains: the chain from i to i+1+k stays in the document and the
  target's prediction at i+1+k is loss-masked."""
  ahead = 1 + k
  same = (segments_BxT > 0) & (shift_left(segments_BxT, ahead, fill=-1) == segments_BxT)
  return same.astype(jnp.float32) * shift_left(loss_mask_BxT, ahead).astype(jnp.float32)


def eagle3_loss(graphdef, target_graphdef, cfg, layers, vocab):
  steps, decay = int(cfg.ttt_steps), float(cfg.ttt_step_loss_decay)
  vocab_V = None if vocab is None else jnp.asarray(vocab, jnp.int32)

  def loss_fn(params, frozen, batch, rng):
    del rng
    target = nnx.merge(target_graphdef, frozen)
    model = nnx.merge(graphdef, params)
    tokens, seg, pos = batch["tokens"], batch["segment_ids"], batch["positions"]
    out = jax.lax.stop_gradient(feature_cache.target_output(target, batch, layers,
                                                            compute_logits=vocab_V is None))
    p_logits = out.logits_BxTxV if vocab_V is None else target.logits(out.hidden_BxTxD, vocab_V)
    total, metrics, weight = 0.0, {}, None
    for k, logits in enumerate(ttt_logits(model, target, out.features, tokens, pos, seg, steps,
                                          vocab_V)):
      w = step_weights(seg, batch["loss_mask"], k)
      p = jnp.pad(p_logits[:, 1 + k:], ((0, 0), (0, 1 + k), (0, 0)))  # the target at i+1+k
      log_p, log_q = jax.nn.log_softmax(p, -1), jax.nn.log_softmax(logits, -1)
      kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)
      denom = w.sum()
      loss_k = (kl * w).sum() / (denom + 1e-5) * decay**k
      acc = ((jnp.argmax(logits, -1) == jnp.argmax(p, -1)) * w).sum() / jnp.maximum(denom, 1)
      total = total + loss_k
      metrics[f"loss_s{k}"], metrics[f"acc_s{k}"] = loss_k, acc
      weight = denom if weight is None else weight
    return total, {"loss": total, **metrics, "weight": weight}

  return loss_fn


def draft_vocabulary(batches, size: int, vocab_size: int) -> list[int]:
  """The `size` most frequent loss-masked tokens (ties: lower id first), ascending."""
  counts = np.zeros(vocab_size, np.int64)
  for b in batches:
    labels = np.asarray(b["targets"])[np.asarray(b["loss_mask"]) > 0]
    counts += np.bincount(labels.ravel(), minlength=vocab_size)[:vocab_size]
  order = np.lexsort((np.arange(vocab_size), -counts))
  return sorted(int(i) for i in order[:size])


def load_vocab(folder: str):
  """The saved draft vocabulary (a list of target ids), or None for the full vocabulary."""
  path = os.path.join(folder, VOCAB_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return [int(i) for i in json.load(f)["target_ids"]]


def save_vocab(folder: str, ids):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, VOCAB_FILE), "w") as f:
    json.dump({"target_ids": [int(i) for i in ids]}, f)


def _vocab_for(cfg, folder, train_ds, vocab_size):
  size = int(cfg.get("draft_vocab_size", 0))
  if not size or size >= vocab_size:
    return None
  vocab = load_vocab(folder)
  if vocab is None or len(vocab) != size:
    it, batches = iter(train_ds), []
    for _ in range(int(cfg.get("vocab_batches", 64))):
      try:
        batches.append(next(it))
      except StopIteration:
        break
    vocab = draft_vocabulary(batches, size, vocab_size)
    save_vocab(folder, vocab)
  return vocab


def train_eagle3(cfg):
  if int(cfg.ttt_steps) < 1:
    raise SpecjaxError(f"ttt_steps must be >= 1, got {cfg.ttt_steps}")
  target = run_dir_lib.load_target(cfg.run_dir)
  tok = run_dir_lib.load_tokenizer(cfg.run_dir)
  folder = run_dir_lib.model_dir(cfg.run_dir, NAME)
  layers = eagle3.feature_layers(cfg, target.model_cfg.num_layers)
  bad = [i for i in layers if not 0 <= i <= target.model_cfg.num_layers]
  if bad or len(set(layers)) != len(layers):
    raise SpecjaxError(f"feature_layers {list(layers)} must be distinct, in 0.."
                       f"{target.model_cfg.num_layers}")
  run_dir_lib.save_config(cfg, os.path.join(folder, "config.json"))
  build = lambda rngs: eagle3.build_model(cfg, target.model_cfg, rngs)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)
  feature_cache.check(cfg, cfg.get("train_on", "corpus") == "regenerated")
  cache = feature_cache.builder(cfg, target, layers, with_hidden=True, name=NAME)
  train_ds, val = regenerate.drafter_data(cfg, target, tok, cache)
  vocab = _vocab_for(cfg, folder, train_ds, target.model_cfg.vocab_size)
  init = lambda rng: nnx.state(build(nnx.Rngs(rng)), nnx.Param)
  n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(init, jax.random.key(0))))
  print(f"[{NAME}] {n / 1e6:.2f}M parameters, {cfg.num_layers} layer(s), target features "
        f"from layers {list(layers)}, {cfg.ttt_steps} TTT steps, draft vocabulary "
        f"{len(vocab) if vocab else target.model_cfg.vocab_size}", flush=True)
  task = TrainTask(name=NAME, init_params=init,
                   loss_fn=eagle3_loss(graphdef, target.graphdef, cfg, layers, vocab),
                   train_data=train_ds, eval_data=val, frozen=target.params,
                   summary={"num_params": int(n)},
                   setup_seconds=feature_cache.report(NAME, cache))
  return train(cfg, task)
