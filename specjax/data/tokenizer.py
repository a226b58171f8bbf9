"""Byte-level BPE tokenizer trained locally with the `tokenizers` library.

Special tokens have fixed ids: 0 `<|endoftext|>` (EOS and document separator), 1 `<|pad|>`,
2 `<|mask|>` (reserved for block-diffusion drafters).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specjax.errors import SpecjaxError

EOS = "<|endoftext|>"
PAD = "<|pad|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (EOS, PAD, MASK)
EOS_ID, PAD_ID, MASK_ID = 0, 1, 2


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  check_special_ids(tok, "freshly trained tokenizer")
  return tok


def check_special_ids(tok: Tokenizer, where: str):
  for name, want in zip(SPECIAL_TOKENS, (EOS_ID, PAD_ID, MASK_ID)):
    got = tok.token_to_id(name)
    if got != want:
      raise SpecjaxError(
          f"{where}: special token {name} has id {got}, expected {want}; "
          "train a tokenizer with specjax (leave data.tokenizer_path empty)")


def load_tokenizer(path: str) -> Tokenizer:
  if not os.path.exists(path):
    raise SpecjaxError(f"tokenizer file {path} does not exist")
  try:
    tok = Tokenizer.from_file(path)
  except Exception as e:  # tokenizers raises a bare Exception on bad JSON
    raise SpecjaxError(f"could not read tokenizer {path}: {e}") from None
  check_special_ids(tok, path)
  return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
  return tok.encode(text).ids


def decode(tok: Tokenizer, ids) -> str:
  return tok.decode([int(i) for i in ids], skip_special_tokens=True)
