"""llama.cpp GGUF checkpoints (Llama, Qwen3, Qwen2 without attention biases) -> a specjax
target in `run_dir/target/`.

  python -m specjax.interop import-gguf MODEL.gguf RUN_DIR
  python -m specjax.interop export-hf RUN_DIR OUT_DIR    # then, if wanted: an HF folder

The file is read with gguf-py (numpy only). Each tensor is dequantized on its own to float32
(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K..Q6_K), Llama's q/k rows
are put back from llama.cpp's interleaved rotary order, and the result is laid out as the
specjax parameter and placed straight onto its sharding, as import-hf does: host memory stays
near one tensor. The target folder is import-hf's (config.json with `method: target`, an Orbax
checkpoint, tokenizer.json), plus
  source.gguf          the file itself: decode-time kernels read its quantized blocks there
  chat_template.jinja  the file's tokenizer.chat_template, verbatim (absent if it has none)
  hf/                  config.json, generation_config.json, tokenizer_config.json in Hugging
                       Face Llama / Qwen3 form, which export-hf writes out with the weights.
config.json's `imported_from` is {"format": "gguf", "architecture", "path", "file":
"source.gguf", "tensor_types": {type name: [GGUF tensor names]}} (keyed by type: run_dir's
ml_collections config refuses the dots of tensor names as keys).

For code that reads the file's own blocks: `tensor_table(cfg, arch)` maps every GGUF tensor
to its specjax parameter (path, number of input axes, q/k head count to unpermute),
`unpermute_rows` reorders the rows of any [out, ...] array (a row's blocks never cross rows,
so it applies to a quantized tensor's [out, bytes per row] as well), `source_file(run_dir)`
is the imported file. The tokenizer is built in gguf_tokenizer.py.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import time

import jax
import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax import sharding
from specjax.checkpoint import save_params_only
from specjax.errors import SpecjaxError
from specjax.interop import gguf_tokenizer, hf, hf_config
from specjax.models import TransformerConfig, layers

ARCHITECTURES = ("llama", "qwen3", "qwen2")
FLOAT_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SOURCE_FILE = "source.gguf"
TEMPLATE_FILE = "chat_template.jinja"
# Hugging Face module -> GGUF tensor (llama.cpp's gguf-py tensor_mapping.py)
GGUF_NAMES = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
  """'model.layers.3.self_attn.q_proj.weight' -> 'blk.3.attn_q.weight'."""
  base = hf_name.removesuffix(".weight")
  if base in GGUF_NAMES:
    return GGUF_NAMES[base] + ".weight"
  _, _, layer, module = base.split(".", 3)
  return f"blk.{layer}.{GGUF_NAMES[module]}.weight"


def tensor_table(cfg: TransformerConfig, arch: str) -> dict[str, tuple[tuple, int, int | None]]:
  """GGUF tensor name -> (specjax parameter path, n_in, heads). n_in as in hf.name_table (the
  GGUF matrix, numpy-shaped, is Hugging Face's [out, in]); heads: for Llama's attn_q / attn_k,
  the head count whose rows llama.cpp permuted (`unpermute_rows`), else None."""
  heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads} if arch == "llama" else {}
  table = {}
  for name, (path, n_in) in hf.name_table(cfg).items():
    name = gguf_name(name)
    table[name] = (path, n_in, heads.get(name.split(".")[-2]))
  return table


def unpermute_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's q/k row order (each head's rotary pairs interleaved) -> Hugging Face's
  (half-split), as transformers' LlamaTensorProcessor._reverse_permute_weights. `rows`: any
  array whose first axis is the output rows; unpermute_rows(np.arange(out), n) is the gather
  index: row r of the result is row index[r] of the file."""
  half = rows.shape[0] // n_heads // 2
  return (rows.reshape(n_heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape))


def source_file(run_dir: str) -> str:
  """The GGUF file a target was imported from (run_dir/target/source.gguf)."""
  folder = run_dir_lib.require_model_dir(run_dir, "target")
  info = run_dir_lib.load_config(folder).get("imported_from") or {}
  if info.get("format") != "gguf":
    raise SpecjaxError(f"the target of {run_dir} was not imported from a GGUF file; import "
                       "one with: python -m specjax.interop import-gguf MODEL.gguf RUN_DIR")
  return os.path.join(folder, info.get("file", SOURCE_FILE))


def _gguf():
  try:
    import gguf
  except ImportError:
    raise SpecjaxError("reading GGUF files needs gguf-py: pip install gguf") from None
  return gguf


def open_file(path: str):
  """(gguf.GGUFReader, metadata dict with arrays as lists) of a GGUF file."""
  gguf = _gguf()
  if not os.path.isfile(path):
    raise SpecjaxError(f"{path} is not a file")
  try:
    reader = gguf.GGUFReader(path)
    meta = {key: field.contents() for key, field in reader.fields.items()}
  except Exception as e:  # gguf-py raises ValueError, KeyError, ... on a bad file
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise SpecjaxError(f"{path} is not a readable GGUF file ({first[:200]})") from None
  return reader, meta


def _key(meta: dict, arch: str, key: str, default=None, required: bool = False):
  value = meta.get(f"{arch}.{key}", default)
  if value is None and required:
    raise SpecjaxError(f"the GGUF metadata has no {arch}.{key}")
  if isinstance(value, list):
    raise SpecjaxError(f"{arch}.{key} differs per layer ({value[:4]}...); specjax needs one "
                       "value for every layer")
  return value


def _refuse_options(meta: dict, arch: str, names: set[str]):
  """What changes the computation and specjax does not implement: one line naming it."""
  if arch not in ARCHITECTURES:
    raise SpecjaxError(f"GGUF architecture {arch!r} is not supported; specjax imports llama, "
                       "qwen3, and qwen2 without attention biases")
  if _key(meta, arch, "expert_count", 0):
    raise SpecjaxError(f"{arch}.expert_count={meta[f'{arch}.expert_count']}: mixture-of-experts "
                       "models are not supported")
  scaling = _key(meta, arch, "rope.scaling.type", "none")
  if scaling != "none":
    raise SpecjaxError(f"{arch}.rope.scaling.type={scaling!r} is not supported (plain RoPE)")
  biases = sorted(n for n in names if n.endswith(".bias"))
  if biases:
    raise SpecjaxError(f"{arch} file has bias tensors ('{biases[0]}'): specjax's attention "
                       "and MLP have no biases")


def llama3_scaling(freq_factors: np.ndarray, head_dim: int, theta: float) -> tuple | None:
  """The Llama-3 RoPE scaling (factor, low_freq_factor, high_freq_factor, original_max) that
  gives llama.cpp's `rope_freqs` tensor (each frequency's divisor), or a one-line error.
  Only the line the interpolated divisors lie on is identifiable: low_freq_factor is taken
  as 1 (as in every Llama 3.x), then checked against every divisor."""
  f = np.asarray(freq_factors, np.float64).reshape(-1)
  if f.shape != (head_dim // 2,):
    raise SpecjaxError(f"tensor 'rope_freqs.weight' has {f.size} values, not head_dim / 2 = "
                       f"{head_dim // 2}")
  if np.allclose(f, 1.0, rtol=0, atol=1e-6):
    return None
  factor = float(f.max())
  mid = (f > 1 + 1e-5) & (f < factor * (1 - 1e-5))
  inv = theta ** (-np.arange(f.size) / f.size)
  scaling = None
  if mid.sum() >= 2:  # smooth = (original * inv / 2pi - low) / (high - low), linear in inv
    smooth = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(inv[mid], smooth, 1)
    high = round(1 - 1 / intercept, 4)
    scaling = (factor, 1.0, high, float(round(2 * np.pi * slope * (high - 1))))
    ours = np.asarray(layers.rope_inv_freq(f.size, theta) /
                      layers.rope_inv_freq(f.size, theta, scaling))
  if scaling is None or not np.allclose(ours, f, rtol=1e-4, atol=0):
    raise SpecjaxError("tensor 'rope_freqs.weight' is not a Llama-3 RoPE scaling specjax can "
                       "recover; import the Hugging Face checkpoint instead")
  return scaling


def model_config(meta: dict, tensors: dict) -> tuple[str, TransformerConfig]:
  """(architecture, TransformerConfig) of a GGUF file's metadata and tensors (the embedding
  rows are the vocabulary; rope_freqs is Llama-3 RoPE scaling), or a one-line error."""
  arch = meta.get("general.architecture")
  names = set(tensors)
  _refuse_options(meta, arch, names)
  if "token_embd.weight" not in tensors:
    raise SpecjaxError("the file has no tensor 'token_embd.weight'")
  d_model = _key(meta, arch, "embedding_length", required=True)
  heads = _key(meta, arch, "attention.head_count", required=True)
  head_dim = _key(meta, arch, "attention.key_length", d_model // heads)
  for key in ("attention.value_length", "rope.dimension_count"):
    if _key(meta, arch, key, head_dim) != head_dim:
      raise SpecjaxError(f"{arch}.{key}={meta[f'{arch}.{key}']} differs from the head size "
                         f"{head_dim} (partial rotary / other value size): not supported")
  theta = float(_key(meta, arch, "rope.freq_base", 10_000.0))
  freqs = tensors.get("rope_freqs.weight")
  try:
    return arch, TransformerConfig(
        vocab_size=_shape(tensors["token_embd.weight"])[0],
        num_layers=_key(meta, arch, "block_count", required=True),
        d_model=d_model,
        num_heads=heads,
        num_kv_heads=_key(meta, arch, "attention.head_count_kv", heads),
        head_dim=head_dim,
        mlp_dim=_key(meta, arch, "feed_forward_length", required=True),
        rope_theta=theta,
        rope_llama3_scaling=None if freqs is None else llama3_scaling(read_tensor(freqs),
                                                                      head_dim, theta),
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in names,
        norm_eps=float(_key(meta, arch, "attention.layer_norm_rms_epsilon", required=True)),
    )
  except ValueError as e:
    raise SpecjaxError(f"GGUF metadata: {e}") from None


def _shape(tensor) -> tuple[int, ...]:
  """numpy order (GGUF lists dimensions fastest-first)."""
  return tuple(int(n) for n in reversed(tensor.shape))


def check_tensors(tensors: dict, table: dict, flat: dict, src: str):
  """Every tensor the model needs is there, with its shape and a type specjax reads, and
  nothing else is: checked before anything is read."""
  for name in tensors:
    if name not in table and name != "rope_freqs.weight":  # read by model_config
      raise SpecjaxError(f"tensor '{name}' in {src} is not part of the model its metadata "
                         "describes (unsupported option or architecture)")
  for name, (path, n_in, _) in table.items():
    if name not in tensors:
      raise SpecjaxError(f"{src} has no tensor '{name}'")
    _check_type(tensors[name])
    want = hf.hf_shape(flat[path].shape, n_in)
    if _shape(tensors[name]) != want:
      raise SpecjaxError(f"tensor '{name}' has shape {list(_shape(tensors[name]))}, but the "
                         f"metadata implies {list(want)}")


def _check_type(tensor):
  kind = tensor.tensor_type.name
  if kind not in FLOAT_TYPES + BLOCK_TYPES:
    raise SpecjaxError(f"tensor '{tensor.name}' is {kind}, which specjax does not dequantize "
                       f"(supported: {', '.join(FLOAT_TYPES + BLOCK_TYPES)})")


def read_tensor(tensor) -> np.ndarray:
  """One tensor dequantized to float32, numpy-shaped ([out, in] for a linear weight)."""
  _check_type(tensor)
  x = _gguf().quants.dequantize(tensor.data, tensor.tensor_type)
  return x.reshape(_shape(tensor)).astype(np.float32, copy=False)


def load_params(reader, cfg: TransformerConfig, arch: str, mesh,
                rules=sharding.DEFAULT_RULES, src: str = "the GGUF file"):
  """The file's parameters as a sharded nnx.State, dequantized one tensor at a time."""
  _, abstract = run_dir_lib.abstract_transformer(cfg)
  shardings = dict(nnx.to_flat_state(sharding.state_shardings(abstract, mesh, rules)))
  flat = dict(nnx.to_flat_state(abstract))
  table = tensor_table(cfg, arch)
  tensors = {t.name: t for t in reader.tensors}
  check_tensors(tensors, table, flat, src)
  for name, (path, n_in, heads) in table.items():
    x = read_tensor(tensors[name])
    if heads is not None:
      x = unpermute_rows(x, heads)
    var = flat[path]
    x = hf.to_specjax(x, var.shape, n_in).astype(var.dtype, copy=False)
    flat[path] = var.replace(hf.placed(x, shardings[path].get_value()))
    del x
  return nnx.from_flat_state(flat)


def import_gguf(src: str, dst: str, mesh_shape: dict | None = None) -> str:
  """Converts the GGUF file `src` into `dst/target/`; returns that folder."""
  start = time.perf_counter()
  src = os.path.abspath(os.path.expanduser(src))
  reader, meta = open_file(src)
  arch, cfg = model_config(meta, {t.name: t for t in reader.tensors})
  tok = gguf_tokenizer.build_tokenizer(meta)
  special = gguf_tokenizer.special_ids(meta, cfg.vocab_size)
  if len(meta["tokenizer.ggml.tokens"]) > cfg.vocab_size:
    raise SpecjaxError(f"{src} has {len(meta['tokenizer.ggml.tokens'])} tokens, more than the "
                       f"{cfg.vocab_size} rows of token_embd.weight")

  folder, ckpt_dir = hf.fresh_target(dst)
  params = load_params(reader, cfg, arch, sharding.make_mesh(mesh_shape or hf.DEFAULT_IMPORT_MESH),
                       src=src)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  largest = max(x.nbytes for x in jax.tree.leaves(params))
  os.makedirs(os.path.join(folder, "hf"), exist_ok=True)
  save_params_only(ckpt_dir, 0, params, host_bytes=2 * largest)
  del params

  types = collections.defaultdict(list)
  for t in reader.tensors:
    types[t.tensor_type.name].append(t.name)
  model = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "vocab_size"}
  hf.write_json(os.path.join(folder, "config.json"), {
      "method": "target", "vocab_size": cfg.vocab_size, "model": model,
      "tokenizer": special.to_dict(),
      "imported_from": {"format": "gguf", "architecture": arch, "path": src,
                        "file": SOURCE_FILE, "tensor_types": dict(types)}})
  hf.write_json(os.path.join(folder, "metrics.jsonl"),
                {"step": 0, "num_params": int(num_params), "imported_from": src}, indent=None)
  tok.save(os.path.join(folder, "tokenizer.json"))
  shutil.copyfile(src, os.path.join(folder, SOURCE_FILE))
  if meta.get("tokenizer.chat_template"):
    with open(os.path.join(folder, TEMPLATE_FILE), "w", encoding="utf-8") as f:
      f.write(meta["tokenizer.chat_template"])
  _write_hf_side(folder, meta, arch, cfg, special)
  counts = ", ".join(f"{len(n)} {t}" for t, n in sorted(types.items(), key=lambda i: -len(i[1])))
  print(f"[import-gguf] {arch} target, {num_params:,} parameters ({cfg.param_dtype}) from "
        f"{counts} tensors in {time.perf_counter() - start:.1f} s -> {folder}", flush=True)
  return folder


def _write_hf_side(folder: str, meta: dict, arch: str, cfg: TransformerConfig, special):
  """target/hf/: what export-hf writes beside the weights (a Llama / Qwen3 folder)."""
  side = os.path.join(folder, "hf")
  max_positions = int(meta.get(f"{arch}.context_length") or 4096)
  hf.write_json(os.path.join(side, "config.json"),
                hf_config.from_specjax(cfg, special, max_positions))
  hf.write_json(os.path.join(side, "generation_config.json"),
                {"bos_token_id": special.bos_id, "eos_token_id": special.eos_id,
                 "pad_token_id": special.pad_id})
  hf.write_json(os.path.join(side, "tokenizer_config.json"),
                gguf_tokenizer.hf_tokenizer_config(meta))
