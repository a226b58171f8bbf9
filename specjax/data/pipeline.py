"""Text -> packed fixed-length training batches: TFDS ArrayRecord storage read through Grain.

Each document is tokenized and closed with EOS; documents are concatenated and split into
rows of `seq_len` tokens (grain's concat-then-split packing). A row carries `segment_ids`
(one per document piece, 0 = padding) and `positions` (restarting per piece); attention
and the loss never cross a document boundary.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

import grain
import numpy as np
import tensorflow_datasets as tfds

from specjax.data import tokenizer as tokenizer_lib
from specjax.data.python_source import PythonSource, source_config
from specjax.errors import SpecjaxError

BUILTIN = "python_source"


def expand(path: str) -> str:
  return os.path.abspath(os.path.expanduser(path))


@contextlib.contextmanager
def file_lock(path: str):
  """An exclusive lock on `path` (created): the processes of a multi-process launch that share
  a disk prepare a dataset or train a tokenizer one at a time, so the first does the work and
  the rest find it done (on hosts with their own disks, each does it once)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def open_split(data_cfg, split: str):
  """A random-access source of records for one split (prepares the built-in corpus once)."""
  data_dir = expand(data_cfg.tfds_dir)
  if data_cfg.name == BUILTIN:
    builder = PythonSource(
        config=source_config(data_cfg.source_dir, data_cfg.validation_percent),
        data_dir=data_dir, file_format="array_record")
    with file_lock(os.path.join(data_dir, ".prepare.lock")):
      builder.download_and_prepare()
    return builder.as_data_source(split=split)
  try:
    return tfds.data_source(data_cfg.name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises many types for a missing / unprepared dataset
    raise SpecjaxError(
        f"could not open TFDS dataset '{data_cfg.name}' split '{split}' in {data_dir} "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); prepare it there "
        "as ArrayRecord (tfds build --file_format=array_record) or use data.name=python_source"
    ) from None


def record_text(record, feature: str) -> str:
  if feature not in record:
    raise SpecjaxError(f"dataset records have no feature '{feature}' (have {sorted(record)}); "
                       "set data.text_feature")
  value = record[feature]
  return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def iter_texts(source, feature: str, limit: int | None = None) -> Iterator[str]:
  n = len(source) if limit is None else min(limit, len(source))
  for i in range(n):
    yield record_text(source[i], feature)


def tokenize_fn(tok, feature: str, special=tokenizer_lib.DEFAULT_SPECIAL_IDS):
  def fn(record):
    ids = tokenizer_lib.encode(tok, record_text(record, feature), special)
    ids.append(special.eos_id)
    return {"tokens": np.asarray(ids, np.int32)}
  return fn


def with_loss_mask(batch: dict) -> dict:
  """Renames grain's packing outputs and adds `targets` / `loss_mask` for next-token loss."""
  tokens = batch["tokens"]
  seg = batch["tokens_segment_ids"]
  targets = np.zeros_like(tokens)
  targets[:, :-1] = tokens[:, 1:]
  mask = np.zeros(tokens.shape, np.float32)
  mask[:, :-1] = (seg[:, :-1] > 0) & (seg[:, :-1] == seg[:, 1:])
  return {"tokens": tokens, "positions": batch["tokens_positions"], "segment_ids": seg,
          "targets": targets, "loss_mask": mask}


def packed_batches(source, tok, *, feature: str, seq_len: int, batch_size: int, seed: int,
                   train: bool, process_index: int = 0, process_count: int = 1,
                   shuffle_window: int = 1024,
                   special=tokenizer_lib.DEFAULT_SPECIAL_IDS):
  """A grain IterDataset of packed batches for this process (its share of the documents).

  train=True: documents shuffled (reshuffled every epoch) and repeated forever; packed rows
  shuffled again in windows of `shuffle_window` rows, since one long file fills many rows.
  train=False: one deterministic pass, the last batch padded with segment 0.
  """
  if batch_size % process_count:
    raise SpecjaxError(f"batch_size {batch_size} is not divisible by {process_count} processes")
  ds = grain.MapDataset.source(source)
  if process_count > 1:
    ds = ds[process_index::process_count]
  if len(ds) == 0:
    raise SpecjaxError("the dataset split is empty for this process; use a bigger corpus")
  if train:
    ds = ds.shuffle(seed=seed).repeat()
  ds = ds.map(tokenize_fn(tok, feature, special)).to_iter_dataset()
  ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": seq_len})
  if train and shuffle_window > 1:
    ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=shuffle_window, seed=seed)
  ds = ds.batch(batch_size // process_count, drop_remainder=train)
  if not train:
    ds = ds.map(lambda b: _pad_rows(b, batch_size // process_count))
  return ds.map(with_loss_mask)


def _pad_rows(batch: dict, rows: int) -> dict:
  have = next(iter(batch.values())).shape[0]
  if have == rows:
    return batch
  return {k: np.concatenate([v, np.zeros((rows - have,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def get_tokenizer(data_cfg, out_path: str):
  """The run's tokenizer: a given file used as is, else trained on the train split once."""
  with file_lock(out_path + ".lock"):
    if data_cfg.tokenizer_path:
      tok = tokenizer_lib.load_tokenizer(expand(data_cfg.tokenizer_path))
    elif os.path.exists(out_path):
      return tokenizer_lib.load_tokenizer(out_path)
    else:
      source = open_split(data_cfg, "train")
      tok = tokenizer_lib.train_tokenizer(
          iter_texts(source, data_cfg.text_feature, data_cfg.tokenizer_max_docs or None),
          data_cfg.vocab_size)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    tmp = f"{out_path}.{os.getpid()}.tmp"
    tok.save(tmp)
    os.replace(tmp, out_path)  # a reader never sees half a file
  return tok
