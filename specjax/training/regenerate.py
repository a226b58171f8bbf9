"""Training data from the target itself: its greedy continuations of corpus prompts.

Drafters learn the distribution they must match (DFlash's recipe). Prompts are windows of
`prompt_len` tokens cut from corpus documents at seeded positions; the target continues each
for `new_tokens` tokens with the on-device AR loop. The result is cached in
run_dir/regenerated/, keyed by everything that determines it, so every drafter reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os

import grain
import jax
import numpy as np

from specjax import run_dir as run_dir_lib
from specjax.data import pipeline, tokenizer as tokenizer_lib
from specjax.decoding.ar import ARDecoder
from specjax.sampling import Sampler
from specjax.errors import SpecjaxError


def _prompts(source, tok, feature: str, count: int, prompt_len: int, seed: int,
             special=tokenizer_lib.DEFAULT_SPECIAL_IDS):
  rng = np.random.default_rng(seed)
  out = []
  order = rng.permutation(len(source))
  i = 0
  while len(out) < count:
    ids = tokenizer_lib.encode(tok, pipeline.record_text(source[int(order[i % len(order)])],
                                                         feature), special)
    i += 1
    if len(ids) > prompt_len:
      start = int(rng.integers(0, len(ids) - prompt_len))
      out.append(ids[start:start + prompt_len])
    if i > 50 * count:
      raise SpecjaxError(f"the corpus has too few documents longer than prompt_len={prompt_len}")
  return np.asarray(out, np.int32)


def generate(target, prompts, new_tokens: int, batch_size: int,
             special=tokenizer_lib.DEFAULT_SPECIAL_IDS) -> np.ndarray:
  """[N, prompt_len + new_tokens]: prompt then greedy continuation, PAD after any EOS."""
  n, p = prompts.shape
  dec = ARDecoder(target.graphdef, Sampler(), new_tokens, p + new_tokens + 1, special.eos_id)
  rows = []
  for start in range(0, n, batch_size):
    chunk = prompts[start:start + batch_size]
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
    r = dec(target.params, chunk, np.full((batch_size,), p, np.int32), jax.random.key(0))
    toks, counts = np.asarray(r.tokens_BxN), np.asarray(r.num_tokens_B)
    toks = np.where(np.arange(new_tokens)[None] < counts[:, None], toks, special.pad_id)
    rows.append(np.concatenate([chunk, toks], 1)[:real])
  return np.concatenate(rows)


def regenerated(cfg, target, tok, split: str, count: int) -> np.ndarray:
  r = cfg.regen
  key = json.dumps({"split": split, "count": count, "prompt_len": r.prompt_len,
                    "new_tokens": r.new_tokens, "seed": cfg.seed, "data": cfg.data.to_dict(),
                    "target_step": target.step}, sort_keys=True)
  path = os.path.join(os.path.abspath(os.path.expanduser(cfg.run_dir)), "regenerated",
                      hashlib.md5(key.encode()).hexdigest()[:12] + ".npy")
  if os.path.exists(path):
    return np.load(path)
  print(f"[regenerate] {count} greedy continuations of {split} prompts "
        f"({r.prompt_len} + {r.new_tokens} tokens) -> {path}", flush=True)
  source = pipeline.open_split(cfg.data, split)
  special = run_dir_lib.load_special_ids(cfg.run_dir)
  prompts = _prompts(source, tok, cfg.data.text_feature, count, r.prompt_len,
                     cfg.seed + (split == cfg.data.validation_split), special)
  rows = generate(target, prompts, r.new_tokens, r.batch_size, special)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if jax.process_index() == 0:  # one writer; the key beside the data says what made it
    with open(path[:-len(".npy")] + ".json", "w") as f:
      f.write(key)
    np.save(path + ".tmp.npy", rows)
    os.replace(path + ".tmp.npy", path)
  return rows


def as_batch(rows: np.ndarray, pad_id: int = tokenizer_lib.PAD_ID, prompt_len: int = 0) -> dict:
  """Regenerated rows as training batches (one document per row; PAD after EOS is dropped).
  Where a tokenizer has no pad token, pad_id is the EOS id and the EOS itself is dropped too.
  Labels only on generated tokens: `loss_mask` is 0 where the next token is part of the
  corpus prompt (its first `prompt_len` tokens), which stays visible as context."""
  tokens = rows.astype(np.int32)
  b, t = tokens.shape
  is_pad = tokens == pad_id
  seg = np.where(np.cumsum(is_pad, axis=1) > 0, 0, 1).astype(np.int32)
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
  batch = pipeline.with_loss_mask({"tokens": tokens, "tokens_positions": positions,
                                   "tokens_segment_ids": seg})
  batch["loss_mask"][:, :max(prompt_len - 1, 0)] = 0.0
  return batch


def regenerated_data(cfg, target, tok, per_row=None):
  """(train IterDataset of batches, validation batches) over the target's continuations.

  per_row(batches) -> {name: [N, ...] array}: inputs computed once per row (from the rows in
  order, as batches) that every batch then carries for its own rows under those names (the
  feature cache; every process computes them for all rows)."""
  r = cfg.regen
  if r.prompt_len + r.new_tokens != cfg.seq_len:
    raise SpecjaxError(f"regen.prompt_len + regen.new_tokens = {r.prompt_len + r.new_tokens} "
                       f"must equal seq_len = {cfg.seq_len}")
  train_rows = regenerated(cfg, target, tok, cfg.data.train_split, r.num_sequences)
  val_rows = regenerated(cfg, target, tok, cfg.data.validation_split, r.num_validation)
  pad_id = run_dir_lib.load_special_ids(cfg.run_dir).pad_id
  local = cfg.batch_size // jax.process_count()

  def extras(rows):
    if per_row is None:
      return {}
    chunk = max(local, 32)
    return per_row([as_batch(rows[i:i + chunk], pad_id, r.prompt_len)
                    for i in range(0, len(rows), chunk)])

  def batch_of(rows, extra, idx):
    idx = np.asarray(idx, np.int64)
    b = as_batch(rows[idx], pad_id, r.prompt_len)
    b.update({k: v[idx] for k, v in extra.items()})
    return b

  train_extra, val_extra = extras(train_rows), extras(val_rows)
  ds = grain.MapDataset.source(list(range(len(train_rows))))
  if jax.process_count() > 1:
    ds = ds[jax.process_index()::jax.process_count()]
  ds = ds.shuffle(seed=cfg.seed).repeat().batch(local, drop_remainder=True)
  ds = ds.map(lambda idx: batch_of(train_rows, train_extra, idx))
  val = [batch_of(val_rows, val_extra, np.arange(i, i + local))
         for i in range(0, len(val_rows) - local + 1, local)]
  return ds.to_iter_dataset(), val[:cfg.eval_batches]


TRAIN_ON = ("corpus", "regenerated")


def drafter_data(cfg, target, tok, per_row=None):
  """A token drafter's (train, validation) data: corpus text, or with
  `train_on="regenerated"` the same regenerated continuations the block drafters use (so that
  every drafter of an experiment sees the same text; needs cfg.regen)."""
  from specjax.training.target import data_for
  train_on = cfg.get("train_on", "corpus")
  if train_on not in TRAIN_ON:
    raise SpecjaxError(f"train_on must be one of {', '.join(TRAIN_ON)}, got '{train_on}'")
  if train_on == "corpus":
    return data_for(cfg, tok)
  if "regen" not in cfg:
    raise SpecjaxError("train_on='regenerated' needs the regen settings of the block drafters "
                       "(config_base.block_drafter_defaults().regen)")
  return regenerated_data(cfg, target, tok, per_row)
