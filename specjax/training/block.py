"""The block drafters' shared training harness (DFlash, DSpark, DFlash 2).

The target runs once per batch (no gradient) and gives the features. Each sequence opens
`num_anchors` blocks at random anchor positions a (sampled without replacement where a label
exists); block j = [t_a, MASK x (B-1)] at positions a..a+B-1, and its k-th position predicts
t_{a+k}. All blocks of a sequence train in one pass: a block sees the context features
strictly before its anchor (same document) and its own block, never another block. A method
brings its model builder and its loss; `train_block` does the rest.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.drafters.dflash import feature_layers
from specjax.errors import SpecjaxError
from specjax.training import feature_cache, regenerate
from specjax.training.loop import TrainTask, train
from specjax.training.target import data_for


def sample_anchors(rng, valid_BxT, count: int):
  """`count` distinct anchors per row where valid (Gumbel top-k), and whether each is real
  (rows with fewer valid positions repeat invalid ones, masked out)."""
  scores = jnp.where(valid_BxT, jax.random.gumbel(rng, valid_BxT.shape), -jnp.inf)
  _, anchors = jax.lax.top_k(scores, count)
  return anchors, jnp.take_along_axis(valid_BxT, anchors, axis=1)


def block_targets(tokens_BxT, seg_BxT, anchors_BxA, real_BxA, block_size: int):
  """Labels t_{a+k} and their validity, [B, A, block_size] (k = 0 is never a label)."""
  t = tokens_BxT.shape[1]
  idx = anchors_BxA[..., None] + jnp.arange(block_size)
  inside = idx < t
  idx = jnp.minimum(idx, t - 1)
  labels = jnp.take_along_axis(tokens_BxT[:, None, :], idx, axis=2)
  seg_a = jnp.take_along_axis(seg_BxT, anchors_BxA, axis=1)
  same = jnp.take_along_axis(seg_BxT[:, None, :], idx, axis=2) == seg_a[..., None]
  valid = inside & same & real_BxA[..., None] & (jnp.arange(block_size) > 0)
  return labels, valid


def training_mask(seg_BxT, anchors_BxA, block_size: int):
  """[B, A*bs, T + A*bs]: a block's tokens see context p < anchor (same document) and their own
  block (non-causal), nothing else."""
  b, t = seg_BxT.shape
  a = anchors_BxA.shape[1]
  anchor_q = jnp.repeat(anchors_BxA, block_size, axis=1)  # [B, Q]
  seg_q = jnp.take_along_axis(seg_BxT, anchor_q, axis=1)
  ctx = (jnp.arange(t)[None, None, :] < anchor_q[:, :, None]) & (
      seg_BxT[:, None, :] == seg_q[:, :, None])
  block_id = jnp.repeat(jnp.arange(a), block_size)
  own = jnp.broadcast_to(block_id[:, None] == block_id[None, :], (b, a * block_size,
                                                                   a * block_size))
  return jnp.concatenate([ctx, own], axis=-1)


def position_weights(block_size: int, gamma: float):
  k = jnp.arange(block_size)
  return jnp.where(k > 0, jnp.exp(-(k - 1) / gamma), 0.0)


def target_and_anchors(target, batch, layers, rng, num_anchors: int, compute_logits=True):
  """The frozen target's outputs (features from `layers`) on the batch, and `num_anchors`
  anchors per row among positions whose next token carries a label."""
  seg = batch["segment_ids"]
  out = jax.lax.stop_gradient(feature_cache.target_output(target, batch, layers, compute_logits))
  valid_anchor = (seg > 0) & (batch["loss_mask"] > 0)  # the next token is a label
  anchors, real = sample_anchors(rng, valid_anchor, num_anchors)
  return out, anchors, real


def block_hidden(model, target, target_out, batch, anchors, bs: int, **kwargs):
  """The drafter's hidden states [B, A*bs, D] for blocks [anchor token, MASK...] at `anchors`,
  each seeing its document's context before the anchor (training_mask)."""
  tokens, seg, pos = batch["tokens"], batch["segment_ids"], batch["positions"]
  b = tokens.shape[0]
  ctx_kv = model.context_kv(model.project(target_out.features), pos)
  x = model.block_inputs(target, jnp.take_along_axis(tokens, anchors, axis=1), bs)
  block_pos = (jnp.take_along_axis(pos, anchors, axis=1)[..., None]
               + jnp.arange(bs)).reshape(b, -1)
  return model(x, block_pos, ctx_kv, training_mask(seg, anchors, bs), **kwargs)


def block_tau(correct, valid):
  """Greedy block acceptance under teacher forcing: committed tokens per step if these blocks
  were verified here (1 + the leading run of correct drafts, over blocks whose draft slots
  are all real). correct, valid: [..., drafts]."""
  full = valid.all(-1)
  return 1.0 + (jnp.cumprod(correct, axis=-1).sum(-1) * full).sum() / jnp.maximum(full.sum(), 1)


@dataclasses.dataclass
class Setup:
  """What every block drafter's training needs: the frozen target, the drafter's graphdef and
  initialiser, the feature layers and the data."""
  target: object
  graphdef: object
  init_params: object
  layers: tuple
  train_data: object
  eval_data: object
  num_params: int
  setup_seconds: float = 0.0  # building the feature cache: comes out of a time budget


def prepare(cfg, build, target_logits: bool = True) -> Setup:
  """Checks, saves the config, loads the target and the data (regenerated or corpus) for a
  block drafter built by build(cfg, target_cfg, rngs). target_logits: the loss reads the
  target's logits (a feature cache then keeps the final hidden states too)."""
  feature_cache.check(cfg, cfg.label_source == "target")
  if cfg.num_anchors > cfg.seq_len:
    raise SpecjaxError(f"num_anchors={cfg.num_anchors} exceeds seq_len={cfg.seq_len}")
  if cfg.label_source not in ("data", "target"):
    raise SpecjaxError(f"label_source must be 'data' or 'target', got '{cfg.label_source}'")
  target = run_dir_lib.load_target(cfg.run_dir)
  tok = run_dir_lib.load_tokenizer(cfg.run_dir)
  layers = feature_layers(cfg, target.model_cfg.num_layers)
  run_dir_lib.save_config(cfg, os.path.join(run_dir_lib.model_dir(cfg.run_dir, cfg.method),
                                            "config.json"))
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(cfg, target.model_cfg, nnx.Rngs(0))),
                          nnx.Param)
  cache = feature_cache.builder(cfg, target, layers, with_hidden=target_logits,
                                name=cfg.method)
  if cfg.label_source == "target":
    train_ds, val = regenerate.regenerated_data(cfg, target, tok, cache)
  else:
    train_ds, val = data_for(cfg, tok)
  setup_seconds = feature_cache.report(cfg.method, cache)

  def init_params(rng):
    return nnx.state(build(cfg, target.model_cfg, nnx.Rngs(rng)), nnx.Param)

  n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(init_params, jax.random.key(0))))
  return Setup(target, graphdef, init_params, tuple(layers), train_ds, val, int(n),
               setup_seconds)


def run(cfg, setup: Setup, make_loss):
  """Trains (or resumes) with make_loss(model graphdef, target graphdef, cfg, layers)."""
  task = TrainTask(name=cfg.method, init_params=setup.init_params,
                   loss_fn=make_loss(setup.graphdef, setup.target.graphdef, cfg, setup.layers),
                   train_data=setup.train_data, eval_data=setup.eval_data,
                   frozen=setup.target.params,
                   summary={"num_params": setup.num_params,
                            "feature_layers": list(setup.layers)},
                   setup_seconds=setup.setup_seconds)
  return train(cfg, task)


def train_block(cfg, build, make_loss, target_logits: bool):
  """build(cfg, target_cfg, rngs) and make_loss(model graphdef, target graphdef, cfg, layers):
  the method's model and loss; target_logits: the loss reads the target's logits."""
  if cfg.block_size < 2:
    raise SpecjaxError(f"block_size must be >= 2, got {cfg.block_size}")
  setup = prepare(cfg, build, target_logits)
  print(f"[{cfg.method}] {setup.num_params / 1e6:.2f}M parameters, {cfg.num_layers} layers, "
        f"target features from layers {setup.layers}, block {cfg.block_size}, gamma "
        f"{cfg.get('gamma', '-')}, labels from {cfg.label_source}", flush=True)
  return run(cfg, setup, make_loss)
