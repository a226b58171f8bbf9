"""Training the draft model: a small autoregressive LM with the target's tokenizer.

Plain next-token cross-entropy on the data, or (distill=True) KL(p_target || p_draft) against
the frozen target's logits, so the drafter learns the distribution it must match.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.models import Transformer
from specjax.training.loop import TrainTask, train
from specjax.training import feature_cache, regenerate
from specjax.training.target import masked_cross_entropy


def distill_kl(student_logits, teacher_logits, mask_BxT):
  """Mean over masked positions of KL(teacher || student), both float32."""
  t_logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits), -1)
  s_logp = jax.nn.log_softmax(student_logits, -1)
  kl = (jnp.exp(t_logp) * (t_logp - s_logp)).sum(-1)
  return (kl * mask_BxT).sum() / jnp.maximum(mask_BxT.sum(), 1.0)


def draft_loss(graphdef, target_graphdef, distill: bool):
  def loss_fn(params, target_params, batch, rng):
    del rng
    kw = dict(positions_BxT=batch["positions"], segment_ids_BxT=batch["segment_ids"])
    logits = nnx.merge(graphdef, params)(batch["tokens"], **kw).logits_BxTxV
    loss, metrics = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
    if distill:
      teacher = feature_cache.target_output(nnx.merge(target_graphdef, target_params),
                                            batch).logits_BxTxV
      loss = distill_kl(logits, teacher, batch["loss_mask"])
      metrics = {**metrics, "kl": loss}
    return loss, metrics
  return loss_fn


def _truncated_target_config(cfg, target_cfg, layer_ids):
  """init_from_target: the draft model is the target's shape with only the listed layers (the
  truncated, layer-skipping start of self-speculative decoding); cfg.model is rewritten to it,
  so the saved config reloads the same shape."""
  bad = [i for i in layer_ids if not 0 <= int(i) < target_cfg.num_layers]
  if bad or len(set(layer_ids)) != len(layer_ids):
    raise SpecjaxError(f"init_from_target={list(layer_ids)}: distinct target layer ids in "
                       f"0..{target_cfg.num_layers - 1} expected")
  model_cfg = dataclasses.replace(target_cfg, num_layers=len(layer_ids))
  with cfg.unlocked():
    for f in dataclasses.fields(model_cfg):
      if f.name != "vocab_size":
        value = getattr(model_cfg, f.name)
        cfg.model[f.name] = list(value) if isinstance(value, tuple) else value
  return model_cfg


def copy_target_layers(params, target_params, layer_ids):
  """The draft's parameters with the target's embedding (and untied head), final norm and, as
  its layer j, the target's layer layer_ids[j]."""
  d, t = nnx.to_pure_dict(params), nnx.to_pure_dict(target_params)
  for k in d:
    if k != "blocks":
      d[k] = t[k]
  d["blocks"] = {j: t["blocks"][int(i)] for j, i in enumerate(layer_ids)}
  nnx.replace_by_pure_dict(params, d)
  return params


def train_draft(cfg):
  target = run_dir_lib.load_target(cfg.run_dir)
  tok = run_dir_lib.load_tokenizer(cfg.run_dir)
  model_cfg = run_dir_lib.transformer_config(cfg.model, run_dir_lib.vocab_size(cfg.run_dir))
  layer_ids = tuple(cfg.get("init_from_target", None) or ())
  if layer_ids:
    model_cfg = _truncated_target_config(cfg, target.model_cfg, layer_ids)
  run_dir_lib.save_config(cfg, os.path.join(run_dir_lib.model_dir(cfg.run_dir, "draft"),
                                            "config.json"))
  graphdef, _ = run_dir_lib.abstract_transformer(model_cfg)
  feature_cache.check(cfg, cfg.get("train_on", "corpus") == "regenerated")
  if cfg.get("feature_cache", False) and not cfg.distill:
    raise SpecjaxError("feature_cache=True: the draft model reads the target only with "
                       "distill=True")
  cache = feature_cache.builder(cfg, target, (), with_hidden=True, name="draft")
  train_ds, val = regenerate.drafter_data(cfg, target, tok, cache)

  def init_params(rng):
    params = nnx.state(Transformer(model_cfg, rngs=nnx.Rngs(rng)), nnx.Param)
    return copy_target_layers(params, target.params, layer_ids) if layer_ids else params

  n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(init_params, jax.random.key(0))))
  init = f"target layers {list(layer_ids)}, embedding and norm" if layer_ids else "random"
  print(f"[draft] {n / 1e6:.2f}M parameters, initialised from {init} "
        f"({'distilled from the target' if cfg.distill else 'next-token loss'})", flush=True)
  task = TrainTask(name="draft", init_params=init_params,
                   loss_fn=draft_loss(graphdef, target.graphdef, cfg.distill),
                   train_data=train_ds, eval_data=val,
                   frozen=target.params if cfg.distill else None,
                   summary={"num_params": int(n)},
                   setup_seconds=feature_cache.report("draft", cache))
  return train(cfg, task)
