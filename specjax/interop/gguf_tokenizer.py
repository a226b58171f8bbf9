"""The tokenizer a GGUF file describes in its `tokenizer.*` metadata, as a Hugging Face
`tokenizers` object, plus the run's special ids and the Hugging Face tokenizer_config.json.

Built as transformers 5 builds it from the same metadata (integrations/gguf/
gguf_tokenizer_mapping.py: byte_level_tokenizer, add_gguf_special_tokens, set_split_regex, then
TokenizersBackend's special tokens and post-processor), so both encode every text to the same
ids: a byte-level BPE over the file's tokens and merges; the control tokens (type 3) and the
bos / eos / unk / pad tokens matched whole as special tokens, user-defined ones (type 4) as
plain added tokens; the split regex of the file's `tokenizer.ggml.pre` where transformers knows
it, else GPT-2's. Only `tokenizer.ggml.model = gpt2` is built (SentencePiece files are refused).

One deliberate difference: where the vocabulary has no `<|endoftext|>`, transformers' GPT2
class appends it past the vocabulary (an id the model has no row for); here that text stays
plain text, as llama.cpp reads it.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from specjax.data.tokenizer import SpecialIds
from specjax.errors import SpecjaxError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
GPT2_DEFAULT_SPECIAL = "<|endoftext|>"  # transformers' GPT2 class registers it when present
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> split regex (transformers' GGUF_PRE_TOKENIZER_SPLITS); others: GPT-2's
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
    "tekken": _TEKKEN,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    "qwen35": _QWEN35,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
}


def byte_spelling() -> dict[int, str]:
  """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
  printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b], extra = chr(256 + extra), extra + 1
  return chars


def special_token_ids(meta: dict) -> dict[str, int | None]:
  """{"bos_token": 1, "eos_token": 2, "unk_token": None, ...}: the special ids the file names."""
  count = len(meta["tokenizer.ggml.tokens"])
  out = {}
  for name, key in SPECIAL_KEYS.items():
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is not None and not 0 <= int(value) < count:
      raise SpecjaxError(f"tokenizer.ggml.{key}={value} is outside the {count} tokens")
    out[name] = None if value is None else int(value)
  return out


def special_tokens(meta: dict) -> dict[str, str | None]:
  """{"bos_token": "<|im_start|>", ...}: the text of each special id the file names."""
  tokens = meta["tokenizer.ggml.tokens"]
  return {name: None if i is None else tokens[i] for name, i in special_token_ids(meta).items()}


def build_tokenizer(meta: dict) -> Tokenizer:
  """The file's tokenizer (meta: its `tokenizer.*` metadata, arrays as lists)."""
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise SpecjaxError(f"tokenizer.ggml.model={kind!r} is not supported; specjax builds gpt2 "
                       "(byte-level BPE) tokenizers only")
  for key in ("tokens", "merges"):
    if not meta.get(f"tokenizer.ggml.{key}"):
      raise SpecjaxError(f"the GGUF metadata has no tokenizer.ggml.{key}")
  tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
  spelling = byte_spelling()
  alphabet = set(spelling.values())
  vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
           for i, t in enumerate(tokens)}
  merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
  try:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False,
                               continuing_subword_prefix="", end_of_word_suffix=""))
  except Exception as e:  # tokenizers raises a bare Exception on a bad merge
    raise SpecjaxError(f"the GGUF vocabulary does not form a BPE tokenizer: {e}") from None
  split = SPLITS.get(meta.get("tokenizer.ggml.pre"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else (
      pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                               pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                        use_regex=False)]))
  tok.decoder = decoders.ByteLevel()
  # a control token spelled outside the byte alphabet is a llama.cpp mislabel: not special
  control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
  named = [t for t in special_tokens(meta).values() if t is not None and t in vocab]
  default = [GPT2_DEFAULT_SPECIAL] if GPT2_DEFAULT_SPECIAL in vocab else []
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                          for t in dict.fromkeys(default + control + named)])
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab])
  tok.post_processor = _post_processor(meta)
  return tok


def _post_processor(meta: dict):
  """TokenizersBackend.update_post_processor: BOS / EOS around each sequence, as the file's
  add_bos_token / add_eos_token ask."""
  ids, named = special_token_ids(meta), special_tokens(meta)
  bos, eos = named["bos_token"], named["eos_token"]
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
  add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
  single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
  pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
  specials = ([(bos, ids["bos_token"])] if add_bos else []) + (
      [(eos, ids["eos_token"])] if add_eos else [])
  return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def special_ids(meta: dict, vocab_size: int) -> SpecialIds:
  """EOS (decoding stops on it alone: transformers' generation config from a GGUF has one),
  BOS, PAD (the padding id, else EOS) and whether BOS starts every encoded text."""
  ids = special_token_ids(meta)
  eos, bos, pad = ids["eos_token"], ids["bos_token"], ids["pad_token"]
  if eos is None:
    raise SpecjaxError("the GGUF metadata has no tokenizer.ggml.eos_token_id")
  for name, value in (("eos", eos), ("bos", bos), ("padding", pad)):
    if value is not None and value >= vocab_size:
      raise SpecjaxError(f"tokenizer.ggml.{name}_token_id={value} is outside the model's "
                         f"{vocab_size} embedding rows")
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
  return SpecialIds(eos_id=eos, pad_id=eos if pad is None else pad, bos_id=bos,
                    add_bos=add_bos, eos_ids=(eos,))


def hf_tokenizer_config(meta: dict) -> dict:
  """tokenizer_config.json as transformers saves a tokenizer it read from this file, plus its
  BOS / EOS flags and chat template (so that export-hf's folder loads the same tokenizer)."""
  named = special_tokens(meta)
  config = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", **named,
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False))}
  if meta.get("tokenizer.chat_template"):
    config["chat_template"] = meta["tokenizer.chat_template"]
  return config
