"""Training the target: next-token cross-entropy on packed documents."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax.data import pipeline
from specjax.models import Transformer
from specjax.training.loop import TrainTask, train


def masked_cross_entropy(logits_BxTxV, targets_BxT, mask_BxT):
  """Mean CE over masked positions, plus accuracy and the weight (token count)."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT)
  weight = mask_BxT.sum()
  denom = jnp.maximum(weight, 1.0)
  loss = (ce * mask_BxT).sum() / denom
  acc = ((jnp.argmax(logits_BxTxV, -1) == targets_BxT) * mask_BxT).sum() / denom
  return loss, {"loss": loss, "accuracy": acc, "weight": weight}


def target_loss(graphdef):
  def loss_fn(params, frozen, batch, rng):
    del frozen, rng
    model = nnx.merge(graphdef, params)
    out = model(batch["tokens"], positions_BxT=batch["positions"],
                segment_ids_BxT=batch["segment_ids"])
    return masked_cross_entropy(out.logits_BxTxV, batch["targets"], batch["loss_mask"])
  return loss_fn


def unigram_entropy(batches: list[dict]) -> float:
  """Entropy (nats) of the token distribution of the given batches: the loss of the best
  unigram model fitted to them, a floor a context-free model cannot beat."""
  tokens = np.concatenate([b["targets"][b["loss_mask"] > 0] for b in batches])
  counts = np.bincount(tokens).astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def data_for(cfg, tok):
  """(train IterDataset, list of validation batches) of whole (global) batches. Every process
  of a multi-process run reads the same stream and feeds only the rows its devices hold
  (loop.place_batch), so the batches, the losses and the saved iterator state do not depend
  on how many processes there are."""
  kw = dict(feature=cfg.data.text_feature, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
            seed=cfg.seed, special=run_dir_lib.load_special_ids(cfg.run_dir))
  train_ds = pipeline.packed_batches(pipeline.open_split(cfg.data, cfg.data.train_split), tok,
                                     train=True, shuffle_window=cfg.data.shuffle_window, **kw)
  val_ds = pipeline.packed_batches(pipeline.open_split(cfg.data, cfg.data.validation_split),
                                   tok, train=False, **kw)
  val = []
  for b in val_ds:
    if len(val) >= cfg.eval_batches:
      break
    val.append(b)
  return train_ds, val


def train_target(cfg):
  workdir = run_dir_lib.model_dir(cfg.run_dir, "target")
  tok = pipeline.get_tokenizer(cfg.data, os.path.join(workdir, "tokenizer.json"))
  model_cfg = run_dir_lib.transformer_config(cfg.model, tok.get_vocab_size())
  run_dir_lib.save_config(cfg, os.path.join(workdir, "config.json"))
  graphdef, _ = run_dir_lib.abstract_transformer(model_cfg)
  train_ds, val = data_for(cfg, tok)

  def init_params(rng):
    return nnx.state(Transformer(model_cfg, rngs=nnx.Rngs(rng)), nnx.Param)

  n_params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(init_params, jax.random.key(0))))
  summary = {"num_params": int(n_params), "vocab_size": model_cfg.vocab_size}
  if val:
    summary["val_unigram_entropy"] = unigram_entropy(val)
  print(f"[target] {n_params / 1e6:.2f}M parameters, vocab {model_cfg.vocab_size}"
        + (f", validation unigram entropy {summary['val_unigram_entropy']:.3f} nats"
           if val else ""), flush=True)
  task = TrainTask(name="target", init_params=init_params, loss_fn=target_loss(graphdef),
                   train_data=train_ds, eval_data=val, summary=summary)
  return train(cfg, task)
