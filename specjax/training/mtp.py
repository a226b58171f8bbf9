"""Training MTP drafters (parallel heads or sequential modules) against the frozen target.

The target runs once per batch, outside the gradient: only the heads / modules are in the
optimizer state. Depth k predicts token i+k+1 at position i; its loss is the cross-entropy
over positions whose label lies in the same document, weighted by depth_weights[k-1].
Labels are the data (`label_source=data`) or the target's own greedy predictions
(`label_source=target`), which is what verification will compare against.
With freeze_target=False the target trains jointly (its own next-token loss is added).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.drafters.mtp_sequential import shift_left
from specjax.errors import SpecjaxError
from specjax.models.layers import causal_segment_mask
from specjax.training.loop import TrainTask, train
from specjax.training import feature_cache, regenerate
from specjax.training.target import masked_cross_entropy

VARIANTS = ("parallel", "sequential")


def method_name(variant: str) -> str:
  return f"mtp_{variant}"


def depth_weights(cfg) -> list[float]:
  w = list(cfg.depth_weights) if cfg.depth_weights else [1.0] * cfg.num_heads
  if len(w) != cfg.num_heads:
    raise SpecjaxError(f"depth_weights has {len(w)} entries but num_heads={cfg.num_heads}")
  return [float(x) for x in w]


def build_heads(variant: str, target_cfg, cfg, rngs):
  from specjax.methods.builtin import mtp_builder
  return mtp_builder(variant)(cfg, target_cfg, rngs)


def depth_logits(variant, heads, target, tokens, positions, segments, out):
  """Logits of each depth k = 1..K at every position, from the target's pass `out`."""
  if variant == "parallel":
    return [target.logits(h) for h in heads(out.hidden_BxTxD)]
  mask = causal_segment_mask(segments)
  h, logits = out.features[-1], []
  for k, mod in enumerate(heads.stack, start=1):
    h, _ = mod(h, target.embed(shift_left(tokens, k)), positions, mask)
    logits.append(target.logits(mod.norm_out(h)))
  return logits


def mtp_loss(variant, heads_graphdef, target_graphdef, cfg):
  weights = depth_weights(cfg)
  label_source, joint = cfg.label_source, not cfg.freeze_target
  if label_source not in ("data", "target"):
    raise SpecjaxError(f"label_source must be 'data' or 'target', got '{label_source}'")

  def loss_fn(params, frozen, batch, rng):
    del rng
    target_params = params["target"] if joint else frozen
    heads_params = params["heads"] if joint else params
    target = nnx.merge(target_graphdef, target_params)
    heads = nnx.merge(heads_graphdef, heads_params)
    tokens, seg, pos = batch["tokens"], batch["segment_ids"], batch["positions"]
    out = feature_cache.target_output(target, batch, (target.cfg.num_layers,))
    if not joint:
      out = jax.lax.stop_gradient(out)
    source = tokens if label_source == "data" else jnp.argmax(
        jax.lax.stop_gradient(out.logits_BxTxV), -1).astype(tokens.dtype)
    total, metrics = 0.0, {}
    weight = None
    for k, logits in enumerate(depth_logits(variant, heads, target, tokens, pos, seg, out), 1):
      # label t_{i+k+1} (the target's prediction of it from position i+k, for "target")
      labels = shift_left(source, k + (label_source == "data"))
      valid = (seg > 0) & (shift_left(seg, k + 1, fill=-1) == seg)
      loss_k, m = masked_cross_entropy(logits, labels, valid.astype(jnp.float32))
      total = total + weights[k - 1] * loss_k
      metrics[f"loss_d{k}"], metrics[f"acc_d{k}"] = loss_k, m["accuracy"]
      weight = m["weight"] if weight is None else weight
    if joint:
      lm_loss, _ = masked_cross_entropy(out.logits_BxTxV, batch["targets"], batch["loss_mask"])
      total = total + lm_loss
      metrics["lm_loss"] = lm_loss
    return total, {"loss": total, **metrics, "weight": weight}

  return loss_fn


def train_mtp(cfg):
  variant = cfg.variant
  if variant not in VARIANTS:
    raise SpecjaxError(f"variant must be one of {VARIANTS}, got '{variant}'")
  name = method_name(variant)
  target = run_dir_lib.load_target(cfg.run_dir)
  tok = run_dir_lib.load_tokenizer(cfg.run_dir)
  run_dir_lib.save_config(cfg, os.path.join(run_dir_lib.model_dir(cfg.run_dir, name),
                                            "config.json"))
  heads_graphdef, _ = nnx.split(
      nnx.eval_shape(lambda: build_heads(variant, target.model_cfg, cfg, nnx.Rngs(0))),
      nnx.Param)
  feature_cache.check(cfg, cfg.get("train_on", "corpus") == "regenerated")
  cache = feature_cache.builder(cfg, target, (target.model_cfg.num_layers,), with_hidden=True,
                                name=name)
  train_ds, val = regenerate.drafter_data(cfg, target, tok, cache)

  def init_heads(rng):
    return nnx.state(build_heads(variant, target.model_cfg, cfg, nnx.Rngs(rng)), nnx.Param)

  if cfg.freeze_target:
    init_params, frozen = init_heads, target.params
  else:
    target_params = target.params
    init_params = lambda rng: {"heads": init_heads(rng), "target": target_params}
    frozen = None
  n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(init_heads, jax.random.key(0))))
  print(f"[{name}] {n / 1e6:.2f}M parameters in {cfg.num_heads} "
        f"{'heads' if variant == 'parallel' else 'modules'}; labels from {cfg.label_source}; "
        f"target {'frozen' if cfg.freeze_target else 'trained jointly'}", flush=True)
  task = TrainTask(name=name, init_params=init_params,
                   loss_fn=mtp_loss(variant, heads_graphdef, target.graphdef, cfg),
                   train_data=train_ds, eval_data=val, frozen=frozen,
                   summary={"num_params": int(n)},
                   setup_seconds=feature_cache.report(name, cache))
  return train(cfg, task)
