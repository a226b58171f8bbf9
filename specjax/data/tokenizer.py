"""Byte-level BPE tokenizer trained locally with the `tokenizers` library.

Special tokens of a specjax-trained tokenizer have fixed ids: 0 `<|endoftext|>` (EOS and
document separator), 1 `<|pad|>`, 2 `<|mask|>` (reserved for block-diffusion drafters). An
imported target brings its own tokenizer and its own ids (`SpecialIds`, kept in the target's
config.json under `tokenizer`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specjax.errors import SpecjaxError

EOS = "<|endoftext|>"
PAD = "<|pad|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (EOS, PAD, MASK)
EOS_ID, PAD_ID, MASK_ID = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """The special token ids of a run's tokenizer (defaults: a specjax-trained tokenizer).

  eos_id closes each training document; eos_ids lists every id the checkpoint calls EOS
  (decoding stops on any of them; on eos_id when the list is empty). pad_id fills padding only,
  never attended to; without a pad token it is eos_id. add_bos: prepend bos_id to every
  encoded text that the tokenizer's own post-processor did not already start with it.
  """
  eos_id: int = EOS_ID
  pad_id: int = PAD_ID
  bos_id: int | None = None
  add_bos: bool = False
  eos_ids: tuple[int, ...] = ()

  @classmethod
  def from_dict(cls, d) -> SpecialIds:
    d = dict(d)
    d["eos_ids"] = tuple(d.get("eos_ids") or ())
    return cls(**d)

  def to_dict(self) -> dict:
    return {**dataclasses.asdict(self), "eos_ids": list(self.eos_ids)}


DEFAULT_SPECIAL_IDS = SpecialIds()


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


def load_tokenizer(path: str, check_specjax_ids: bool = True) -> Tokenizer:
  """check_specjax_ids: refuse a tokenizer whose special ids are not specjax's fixed ones
  (False for an imported target, whose ids are in its config)."""
  if not os.path.exists(path):
    raise SpecjaxError(f"tokenizer file {path} does not exist")
  try:
    tok = Tokenizer.from_file(path)
  except Exception as e:  # tokenizers raises a bare Exception on bad JSON
    raise SpecjaxError(f"could not read tokenizer {path}: {e}") from None
  if check_specjax_ids:
    check_special_ids(tok, path)
  return tok


def encode(tok: Tokenizer, text: str, special: SpecialIds = DEFAULT_SPECIAL_IDS) -> list[int]:
  """The tokenizer's own encoding (its post-processor included), plus BOS where the run asks
  for it and the post-processor did not add it: BOS is never doubled."""
  ids = tok.encode(text).ids
  if special.add_bos and special.bos_id is not None and ids[:1] != [special.bos_id]:
    ids = [special.bos_id] + ids
  return ids


def decode(tok: Tokenizer, ids) -> str:
  return tok.decode([int(i) for i in ids], skip_special_tokens=True)
