"""Hugging Face `config.json` <-> specjax `TransformerConfig` for Llama and Qwen3 targets.

What specjax can run exactly is accepted; every other architecture or option is refused with
one line that names the key. Both config generations are read: transformers 5 keeps the RoPE
settings under `rope_parameters`, earlier versions at the top level (`rope_theta`,
`rope_scaling`).
"""

from __future__ import annotations

import json
import os

from specjax.data.tokenizer import SpecialIds
from specjax.errors import SpecjaxError
from specjax.models import TransformerConfig

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
DTYPES = ("float32", "bfloat16")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")


def read_json(path: str, required: bool = True) -> dict | None:
  if not os.path.exists(path):
    if required:
      raise SpecjaxError(f"{path} is missing")
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SpecjaxError(f"{path} is not readable JSON ({e})") from None


def architecture(hf: dict) -> str:
  """'llama' or 'qwen3', from `architectures` (or `model_type` where that is absent)."""
  archs = hf.get("architectures")
  if archs:
    if len(archs) != 1 or archs[0] not in ARCHITECTURES:
      raise SpecjaxError(f"config.json architectures={archs} is not supported; specjax imports "
                         f"{' or '.join(ARCHITECTURES)}")
    arch = ARCHITECTURES[archs[0]]
  else:
    arch = hf.get("model_type")
    if arch not in ARCHITECTURES.values():
      raise SpecjaxError(f"config.json model_type={arch!r} is not supported (llama or qwen3)")
  if hf.get("model_type", arch) != arch:
    raise SpecjaxError(f"config.json model_type={hf.get('model_type')!r} disagrees with "
                       f"architectures={archs}")
  return arch


def _require(hf: dict, key: str):
  if hf.get(key) is None:
    raise SpecjaxError(f"config.json has no '{key}'")
  return hf[key]


def _refuse_options(hf: dict, arch: str):
  """Options that change the computation and that specjax does not implement."""
  if hf.get("attention_bias"):
    raise SpecjaxError("config.json attention_bias=true is not supported (no attention biases)")
  if hf.get("mlp_bias"):
    raise SpecjaxError("config.json mlp_bias=true is not supported (no MLP biases)")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise SpecjaxError(f"config.json hidden_act={act!r} is not supported (silu only)")
  if hf.get("use_sliding_window") or (arch == "llama" and hf.get("sliding_window")):
    raise SpecjaxError("config.json sliding_window / use_sliding_window is not supported "
                       "(full attention only)")
  kinds = set(hf.get("layer_types") or ["full_attention"])
  if kinds != {"full_attention"}:
    raise SpecjaxError(f"config.json layer_types={sorted(kinds)} is not supported "
                       "(full_attention only)")
  if hf.get("quantization_config"):
    raise SpecjaxError("config.json quantization_config is not supported (bf16 / f32 weights)")
  if hf.get("partial_rotary_factor", 1.0) != 1.0:
    raise SpecjaxError("config.json partial_rotary_factor is not supported (1.0 only)")


def rope(hf: dict) -> tuple[float, tuple | None]:
  """(rope_theta, Llama-3 scaling tuple or None) from either config generation."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = hf.get("rope_scaling")
  theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
  kind = params.get("rope_type", params.get("type", "default"))
  if scaling:  # the pre-transformers-5 key wins where both are present
    params, kind = dict(scaling), scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return float(theta), None
  if kind != "llama3":
    raise SpecjaxError(f"config.json rope_scaling rope_type={kind!r} is not supported "
                       "(default or llama3)")
  missing = [k for k in LLAMA3_KEYS if k not in params]
  if missing:
    raise SpecjaxError(f"config.json llama3 rope scaling has no '{missing[0]}'")
  return float(theta), tuple(float(params[k]) for k in LLAMA3_KEYS)


def _dtype(hf: dict) -> str:
  dtype = hf.get("dtype", hf.get("torch_dtype")) or "float32"
  if dtype not in DTYPES:
    key = "dtype" if "dtype" in hf else "torch_dtype"
    raise SpecjaxError(f"config.json {key}={dtype!r} is not supported (float32 or bfloat16)")
  return dtype


def to_specjax(hf: dict) -> tuple[str, TransformerConfig]:
  """(architecture, TransformerConfig) of a Llama / Qwen3 config.json, or a one-line error."""
  arch = architecture(hf)
  _refuse_options(hf, arch)
  d_model, heads = int(_require(hf, "hidden_size")), int(_require(hf, "num_attention_heads"))
  theta, llama3 = rope(hf)
  dtype = _dtype(hf)
  try:
    return arch, TransformerConfig(
        vocab_size=int(_require(hf, "vocab_size")),
        num_layers=int(_require(hf, "num_hidden_layers")),
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or d_model // heads),
        mlp_dim=int(_require(hf, "intermediate_size")),
        rope_theta=theta,
        rope_llama3_scaling=llama3,
        qk_norm=arch == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        dtype=dtype,
        param_dtype=dtype,
    )
  except ValueError as e:
    raise SpecjaxError(f"config.json: {e}") from None


def special_ids(hf: dict, generation: dict | None, tokenizer_config: dict | None,
                vocab_size: int) -> SpecialIds:
  """BOS / EOS / PAD of a checkpoint. generation_config.json wins over config.json (it is what
  `generate` uses); EOS may be a list there: decoding stops on the first, all are recorded.
  BOS is added only where tokenizer_config.json says add_bos_token and tokenizer.json's own
  post-processor does not already add it (`tokenizer.encode`)."""
  generation = generation or {}

  def pick(key):
    value = generation.get(key)
    return hf.get(key) if value is None else value

  eos = pick("eos_token_id")
  eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
  if not eos_ids:
    raise SpecjaxError("no eos_token_id in config.json or generation_config.json")
  bos, pad = pick("bos_token_id"), pick("pad_token_id")
  if isinstance(bos, list):
    bos = bos[0]
  if isinstance(pad, list):
    pad = pad[0]
  for name, value in (("eos_token_id", eos_ids[0]), ("bos_token_id", bos),
                      ("pad_token_id", pad)):
    if value is not None and not 0 <= int(value) < vocab_size:
      raise SpecjaxError(f"{name}={value} is outside the vocabulary of {vocab_size}")
  add_bos = bool((tokenizer_config or {}).get("add_bos_token", False)) and bos is not None
  return SpecialIds(eos_id=eos_ids[0], pad_id=eos_ids[0] if pad is None else int(pad),
                    bos_id=None if bos is None else int(bos), add_bos=add_bos,
                    eos_ids=tuple(eos_ids))


def from_specjax(cfg: TransformerConfig, special: SpecialIds, max_positions: int) -> dict:
  """A config.json for a target that was not imported (trained by specjax): Qwen3 when it has
  q/k norm, else Llama. Written in the transformers 5 layout, with the top-level RoPE keys of
  earlier versions beside it."""
  arch = "qwen3" if cfg.qk_norm else "llama"
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_llama3_scaling is not None:
    rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta,
            **dict(zip(LLAMA3_KEYS, cfg.rope_llama3_scaling))}
    rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
  out = {
      "architectures": ["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
      "model_type": arch,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model,
      "intermediate_size": cfg.mlp_dim,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": max_positions,
      "rms_norm_eps": cfg.norm_eps,
      "rope_parameters": rope,
      "rope_theta": cfg.rope_theta,
      "tie_word_embeddings": cfg.tie_embeddings,
      "attention_bias": False,
      "dtype": cfg.param_dtype,
      "bos_token_id": special.bos_id,
      "eos_token_id": special.eos_id,
      "pad_token_id": special.pad_id,
  }
  if cfg.rope_llama3_scaling is not None:
    out["rope_scaling"] = rope
  if arch == "llama":
    out["mlp_bias"] = False
  else:
    out["use_sliding_window"] = False
    out["sliding_window"] = None
  return out
