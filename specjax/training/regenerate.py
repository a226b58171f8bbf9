"""Training data from the target itself: its greedy continuations of prompts.

Drafters learn the distribution they must match (DFlash's recipe). `regen.prompts` says which:
  corpus        windows of `prompt_len` tokens cut from corpus documents at seeded positions
  instructions  for a chat target: instructions made from the corpus's Python files
                (specjax/data/instructions.py, disjoint from HumanEval and MT-Bench), each one
                user message under the target's chat template, at most `prompt_len` tokens
The target continues each for up to `new_tokens` tokens with the on-device AR loop (greedy; a
row ends at EOS), its weights held as `regen.weights` says (decode.py's target_weights; `auto`
is the fastest on this machine). A row is the prompt, left-aligned, its answer, then PAD.
The rows and each row's prompt length are cached in run_dir/regenerated/, keyed by everything
that determines them, so every drafter reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

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
             special=tokenizer_lib.DEFAULT_SPECIAL_IDS, lens=None) -> np.ndarray:
  """[N, P + new_tokens]: each prompt (its first lens[i] of P tokens; all P by default), its
  greedy continuation right after it, PAD after any EOS and to the end."""
  n, p = prompts.shape
  lens = np.full((n,), p, np.int32) if lens is None else np.asarray(lens, np.int32)
  dec = ARDecoder(target.graphdef, Sampler(), new_tokens, p + new_tokens + 1, special.eos_id)
  rows = np.full((n, p + new_tokens), special.pad_id, np.int32)
  cols = np.arange(p + new_tokens)[None]
  for start in range(0, n, batch_size):
    chunk, chunk_lens = prompts[start:start + batch_size], lens[start:start + batch_size]
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
      chunk_lens = np.concatenate([chunk_lens, np.repeat(chunk_lens[-1:], batch_size - real)])
    r = dec(target.params, chunk, chunk_lens, jax.random.key(0))
    toks, counts = np.asarray(r.tokens_BxN)[:real], np.asarray(r.num_tokens_B)[:real]
    toks = np.where(np.arange(new_tokens)[None] < counts[:, None], toks, special.pad_id)
    block = np.where(cols < chunk_lens[:real, None], np.pad(chunk[:real], ((0, 0), (0, new_tokens))),
                     special.pad_id)
    gen = cols - chunk_lens[:real, None]  # the generated token at each column, where there is one
    block = np.where((gen >= 0) & (gen < new_tokens),
                     np.take_along_axis(toks, np.clip(gen, 0, new_tokens - 1), 1), block)
    rows[start:start + real] = block
  return rows


def _chat_prompts(cfg, tok, split: str, count: int, seed: int, special):
  """[count, prompt_len] instruction prompts under the chat template (right-padded) and their
  lengths; instructions longer than prompt_len tokens are skipped."""
  from specjax.data import chat, instructions
  r = cfg.regen
  source = pipeline.open_split(cfg.data, split)
  docs = (pipeline.record_text(source[i], cfg.data.text_feature) for i in range(len(source)))
  banned = instructions.Banned(*instructions.benchmark_texts())
  template = chat.load(cfg.run_dir, tok, special)
  prompts, lens = np.full((count, r.prompt_len), special.pad_id, np.int32), []
  for text in instructions.instructions(docs, seed, banned, enough=4 * count):
    ids = chat.encode(tok, template.render([{"role": "user", "content": text}]))
    if len(ids) <= r.prompt_len:
      prompts[len(lens), :len(ids)] = ids
      lens.append(len(ids))
      if len(lens) == count:
        return prompts, np.asarray(lens, np.int32)
  raise SpecjaxError(f"only {len(lens)} of the {count} {split} instructions fit "
                     f"regen.prompt_len={r.prompt_len} tokens; raise it or ask for fewer")


PROMPTS = ("corpus", "instructions")


def regenerated(cfg, target, tok, split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
  """(rows [count, prompt_len + new_tokens], each row's prompt length [count])."""
  r = cfg.regen
  kind, weights = r.get("prompts", "corpus"), r.get("weights", "xla")
  if kind not in PROMPTS:
    raise SpecjaxError(f"regen.prompts must be one of {', '.join(PROMPTS)}, got '{kind}'")
  key = {"split": split, "count": count, "prompt_len": r.prompt_len,
         "new_tokens": r.new_tokens, "seed": cfg.seed, "data": cfg.data.to_dict(),
         "target_step": target.step}
  if kind != "corpus":  # (the corpus rows keep the keys they were made under)
    key.update(prompts=kind, weights=weights)
  key = json.dumps(key, sort_keys=True)
  path = os.path.join(os.path.abspath(os.path.expanduser(cfg.run_dir)), "regenerated",
                      hashlib.md5(key.encode()).hexdigest()[:12] + ".npy")
  lens_path = path[:-len(".npy")] + ".lens.npy"
  if os.path.exists(path):
    rows = np.load(path)
    lens = np.load(lens_path) if os.path.exists(lens_path) else np.full(len(rows), r.prompt_len)
    return rows, lens
  print(f"[regenerate] {count} greedy continuations of {split} {kind} prompts "
        f"(<= {r.prompt_len} + {r.new_tokens} tokens) -> {path}", flush=True)
  t0 = time.perf_counter()
  special = run_dir_lib.load_special_ids(cfg.run_dir)
  seed = cfg.seed + (split == cfg.data.validation_split)
  if kind == "corpus":
    source = pipeline.open_split(cfg.data, split)
    prompts = _prompts(source, tok, cfg.data.text_feature, count, r.prompt_len, seed, special)
    lens = np.full((count,), r.prompt_len, np.int32)
  else:
    prompts, lens = _chat_prompts(cfg, tok, split, count, seed, special)
  if weights != "xla":
    from specjax import decode_weights
    target = decode_weights.prepare(target, cfg.run_dir,
                                    decode_weights.resolve(weights, cfg.run_dir))
  rows = generate(target, prompts, r.new_tokens, r.batch_size, special, lens)
  answer = (rows != special.pad_id) & (np.arange(rows.shape[1])[None] >= lens[:, None])
  print(f"[regenerate] {count} rows: {int(lens.sum())} prompt and {int(answer.sum())} answer "
        f"tokens in {time.perf_counter() - t0:.0f} s", flush=True)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if jax.process_index() == 0:  # one writer; the key beside the data says what made it
    with open(path[:-len(".npy")] + ".json", "w") as f:
      f.write(key)
    if kind != "corpus":  # (corpus prompts all have prompt_len tokens)
      np.save(lens_path + ".tmp.npy", lens)
      os.replace(lens_path + ".tmp.npy", lens_path)
    np.save(path + ".tmp.npy", rows)
    os.replace(path + ".tmp.npy", path)
  return rows, lens


def as_batch(rows: np.ndarray, pad_id: int = tokenizer_lib.PAD_ID, prompt_len=0) -> dict:
  """Regenerated rows as training batches (one document per row; PAD after the prompt ends
  the row). Where a tokenizer has no pad token, pad_id is the EOS id and the answer's EOS is
  dropped too (a chat prompt's own end-of-turn tokens stay). Labels only on generated tokens:
  `loss_mask` is 0 where the next token is part of the prompt (a row's first `prompt_len`
  tokens: one length, or one per row), which stays visible as context."""
  tokens = rows.astype(np.int32)
  b, t = tokens.shape
  cols = np.arange(t, dtype=np.int32)[None]
  plen = np.broadcast_to(np.asarray(prompt_len, np.int32).reshape(-1, 1), (b, 1))
  is_pad = (tokens == pad_id) & (cols >= plen)
  seg = np.where(np.cumsum(is_pad, axis=1) > 0, 0, 1).astype(np.int32)
  positions = np.broadcast_to(cols, (b, t)).copy()
  batch = pipeline.with_loss_mask({"tokens": tokens, "tokens_positions": positions,
                                   "tokens_segment_ids": seg})
  batch["loss_mask"][cols < plen - 1] = 0.0
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
  train_rows, train_lens = regenerated(cfg, target, tok, cfg.data.train_split, r.num_sequences)
  val_rows, val_lens = regenerated(cfg, target, tok, cfg.data.validation_split, r.num_validation)
  pad_id = run_dir_lib.load_special_ids(cfg.run_dir).pad_id
  rows_per_batch = cfg.batch_size  # whole batches on every process; place_batch keeps its rows

  def extras(rows, lens):
    if per_row is None:
      return {}
    chunk = max(rows_per_batch, 32)
    return per_row([as_batch(rows[i:i + chunk], pad_id, lens[i:i + chunk])
                    for i in range(0, len(rows), chunk)])

  def batch_of(rows, lens, extra, idx):
    idx = np.asarray(idx, np.int64)
    b = as_batch(rows[idx], pad_id, lens[idx])
    b.update({k: v[idx] for k, v in extra.items()})
    return b

  train_extra, val_extra = extras(train_rows, train_lens), extras(val_rows, val_lens)
  ds = grain.MapDataset.source(list(range(len(train_rows))))
  ds = ds.shuffle(seed=cfg.seed).repeat().batch(rows_per_batch, drop_remainder=True)
  ds = ds.map(lambda idx: batch_of(train_rows, train_lens, train_extra, idx))
  val = [batch_of(val_rows, val_lens, val_extra, np.arange(i, i + rows_per_batch))
         for i in range(0, len(val_rows) - rows_per_batch + 1, rows_per_batch)]
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
