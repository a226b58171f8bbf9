"""Small random GGUF files written as llama.cpp's converter writes them (Llama's q/k rows
permuted, tied models without `output.weight`), with a byte-level BPE vocabulary, control tokens,
a user-defined token and a chat template. Every tensor gets the type its `types` entry names:
float, llama.cpp's 32-weight blocks (`gguf.quants.quantize`), or K-quant blocks of random bytes
with sane scales (gguf-py cannot quantize those). Used by tests/test_interop_gguf.py."""

from __future__ import annotations

import json

import numpy as np

from hf_models import CORPUS

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2; control tokens
USER_DEFINED = "<think>"  # the last id; matched whole, not special
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 12345 and 3.14159, 2024-01-01; x=42",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600 \u00bd \u0663",
    "spaces   and\ttabs\n\n\n  indented   \r\n",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure they'll say it's 'quoted' don't",
    "<think>reasoning</think> done<|endoftext|>",
    "",
    "   ",
]

# llama.cpp's K-quant blocks: byte offsets of their float16 scale fields (d, and dmin)
K_QUANT_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                  "Q6_K": (208,)}

LLAMA = dict(d_model=64, layers=2, heads=4, kv_heads=2, head_dim=32, mlp=256)
# transformers' GGUF loader reads no head size for these: qwen3 gets Qwen3Config's default
# (128), qwen2 d_model / heads
QWEN3 = dict(d_model=64, layers=2, heads=2, kv_heads=1, head_dim=128, mlp=256)
QWEN2 = dict(d_model=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=256)
DIMS = {"llama": LLAMA, "qwen3": QWEN3, "qwen2": QWEN2}

# per-tensor types (names without the `blk.N.` prefix are per-layer, the value a type per layer)
LLAMA_UNTIED_TYPES = {
    "token_embd": "Q8_0", "output": "Q4_1", "output_norm": "F32",
    "attn_q": ("Q4_0", "Q5_0"), "attn_k": ("Q4_1", "Q5_1"), "attn_v": ("F16", "BF16"),
    "attn_output": ("Q8_0", "F32"), "ffn_gate": ("Q4_0", "Q4_1"), "ffn_up": ("Q8_0", "F16"),
    "ffn_down": ("Q4_K", "Q6_K"),
}
LLAMA_TIED_TYPES = {
    "token_embd": "F16", "attn_q": "F32", "attn_k": "F32", "attn_v": "Q8_0",
    "attn_output": "Q4_0", "ffn_gate": "F32", "ffn_up": "Q4_1", "ffn_down": ("Q2_K", "Q3_K"),
}
QWEN3_TYPES = {
    "token_embd": "Q4_0", "attn_q": ("Q8_0", "BF16"), "attn_k": ("Q4_1", "Q8_0"),
    "attn_v": "F16", "attn_output": "Q5_1", "ffn_gate": "Q8_0", "ffn_up": "Q4_0",
    "ffn_down": ("Q5_K", "Q6_K"),
}


def vocabulary(extra_tokens=()):
  """(tokens, merges, token types): a byte-level BPE trained on CORPUS, the control tokens
  first, the user-defined token next, then `extra_tokens` ((token, type) pairs)."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=list(SPECIALS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(CORPUS * 4, trainer=trainer)
  model = json.loads(tok.to_str())["model"]
  tokens = sorted(model["vocab"], key=model["vocab"].get) + [USER_DEFINED]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  types = [3 if t in SPECIALS else 4 if t == USER_DEFINED else 1 for t in tokens]
  return tokens + [t for t, _ in extra_tokens], merges, types + [k for _, k in extra_tokens]


def llama_cpp_permute(w_OxI: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: each head's rows from the
  half-split rotary layout to interleaved pairs."""
  return (w_OxI.reshape(n_heads, 2, w_OxI.shape[0] // n_heads // 2, *w_OxI.shape[1:])
          .swapaxes(1, 2).reshape(w_OxI.shape))


def hf_weights(arch: str, tie: bool, vocab: int, dims: dict, rng, bias: bool = False) -> dict:
  """GGUF name -> float32 weight in Hugging Face layout ([out, in]; not yet permuted)."""
  d, n, k, h, f = (dims[x] for x in ("d_model", "heads", "kv_heads", "head_dim", "mlp"))

  def mat(rows, cols):
    return (rng.standard_normal((rows, cols)) * cols**-0.5).astype(np.float32)

  def norm(size):
    return (1.0 + 0.3 * rng.standard_normal(size)).astype(np.float32)

  out = {"token_embd.weight": mat(vocab, d), "output_norm.weight": norm(d)}
  if not tie:
    out["output.weight"] = mat(vocab, d)
  for i in range(dims["layers"]):
    b = f"blk.{i}."
    out.update({b + "attn_norm.weight": norm(d), b + "attn_q.weight": mat(n * h, d),
                b + "attn_k.weight": mat(k * h, d), b + "attn_v.weight": mat(k * h, d),
                b + "attn_output.weight": mat(d, n * h), b + "ffn_norm.weight": norm(d),
                b + "ffn_gate.weight": mat(f, d), b + "ffn_up.weight": mat(f, d),
                b + "ffn_down.weight": mat(d, f)})
    if arch == "qwen3":
      out[b + "attn_q_norm.weight"] = norm(h)
      out[b + "attn_k_norm.weight"] = norm(h)
    if bias:
      for name, rows in (("attn_q", n * h), ("attn_k", k * h), ("attn_v", k * h)):
        out[b + name + ".bias"] = (0.1 * rng.standard_normal(rows)).astype(np.float32)
  return out


HF_TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def from_hf(state_dict) -> dict:
  """A transformers Llama state dict as GGUF-named float32 arrays (HF layout, unpermuted)."""
  top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
         "output_norm.weight", "lm_head.weight": "output.weight"}
  out = {}
  for name, x in state_dict.items():
    if name in top:
      out[top[name]] = x.float().numpy()
    else:
      _, _, layer, module = name.removesuffix(".weight").split(".", 3)
      out[f"blk.{layer}.{HF_TO_GGUF[module]}.weight"] = x.float().numpy()
  return out


def llama_cpp_rope_freqs(head_dim: int, theta: float, factor: float, low: float, high: float,
                         original: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf.py LlamaModel rope_freqs for Llama-3 RoPE scaling."""
  import math
  freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < original / high:
      out.append(1.0)
    elif wavelen > original / low:
      out.append(factor)
    else:
      smooth = (original / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def type_of(name: str, types: dict) -> str:
  """The type `types` gives a tensor name (F32 for norms, biases and anything unlisted)."""
  parts = name.split(".")
  layer, key = (int(parts[1]), parts[2]) if parts[0] == "blk" else (0, parts[0])
  t = types.get(key, "F32") if name.endswith(".weight") else "F32"
  return t[layer] if isinstance(t, tuple) else t


def random_k_blocks(rows: int, cols: int, qtype: str, rng, peak: float = 0.15):
  """K-quant blocks of random codes, their scale fields set so each block's largest weight
  is `peak` (the values are linear in the scales)."""
  import gguf
  q = gguf.GGMLQuantizationType[qtype]
  elems, nbytes = gguf.GGML_QUANT_SIZES[q]
  raw = rng.integers(0, 256, (rows, cols // elems, nbytes), dtype=np.uint8)

  def set_scales(value_RxB):
    field = value_RxB.astype(np.float16).view(np.uint8).reshape(rows, cols // elems, 2)
    for offset in K_QUANT_SCALES[qtype]:
      raw[..., offset:offset + 2] = field

  set_scales(np.ones((rows, cols // elems)))
  values = gguf.quants.dequantize(raw.reshape(rows, -1), q).reshape(rows, cols // elems, elems)
  set_scales(peak / np.maximum(np.abs(values).max(-1), 1e-3))
  return raw.reshape(rows, -1)


def encoded(x: np.ndarray, qtype: str, rng):
  """(array for GGUFWriter.add_tensor, raw_dtype) of a float32 weight stored as `qtype`."""
  import gguf
  if qtype == "F32":
    return x.astype(np.float32), None
  if qtype == "F16":
    return x.astype(np.float16), None
  if qtype in K_QUANT_SCALES:
    return random_k_blocks(*x.shape, qtype, rng), gguf.GGMLQuantizationType[qtype]
  if qtype == "IQ4_NL":  # a type specjax refuses: any bytes do
    q = gguf.GGMLQuantizationType[qtype]
    elems, nbytes = gguf.GGML_QUANT_SIZES[q]
    return rng.integers(0, 256, (x.shape[0], x.shape[1] // elems * nbytes), np.uint8), q
  q = gguf.GGMLQuantizationType[qtype]
  return gguf.quants.quantize(x, q), q


def write_gguf(path: str, arch: str = "llama", *, tie: bool = False, types: dict | None = None,
               dims: dict | None = None, seed: int = 0, pre: str = "default", bos: int | None = 1,
               eos: int = 2, pad: int | None = None, add_bos: bool | None = False,
               bias: bool = False, drop=(), extra: dict | None = None,
               metadata: dict | None = None, tokenizer_model: str = "gpt2",
               extra_tokens=(), weights: dict | None = None) -> str:
  """Writes a small random GGUF checkpoint to `path` (returned). `drop`: tensor names left
  out; `extra`: more tensors (name -> float32 array, written F32); `metadata`: more keys
  (str, float, int or bool values) or overrides of the architecture's keys ("{arch}."
  prefix); `extra_tokens`: (token, type) pairs appended to the vocabulary; `weights`: the
  model's own (GGUF names, Hugging Face layout) instead of random ones."""
  import gguf
  rng = np.random.default_rng(seed)
  dims = dims or DIMS.get(arch, LLAMA)
  tokens, merges, token_types = vocabulary(extra_tokens)
  w = gguf.GGUFWriter(path, arch)
  w.add_name("specjax test model")
  w.add_context_length(256)
  w.add_block_count(dims["layers"])
  w.add_embedding_length(dims["d_model"])
  w.add_feed_forward_length(dims["mlp"])
  w.add_head_count(dims["heads"])
  w.add_head_count_kv(dims["kv_heads"])
  w.add_key_length(dims["head_dim"])
  w.add_value_length(dims["head_dim"])
  w.add_rope_dimension_count(dims["head_dim"])
  w.add_rope_freq_base(500_000.0 if arch == "llama" else 1_000_000.0)
  w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
  w.add_tokenizer_model(tokenizer_model)
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(token_types)
  w.add_token_merges(merges)
  if bos is not None:
    w.add_bos_token_id(bos)
  w.add_eos_token_id(eos)
  if pad is not None:
    w.add_pad_token_id(pad)
  if add_bos is not None:
    w.add_add_bos_token(add_bos)
  w.add_chat_template(CHAT_TEMPLATE)
  for key, value in (metadata or {}).items():
    key = key.replace("{arch}", arch)
    w.kv_data[0].pop(key, None)
    if isinstance(value, bool):
      w.add_bool(key, value)
    elif isinstance(value, int):
      w.add_uint32(key, value)
    elif isinstance(value, float):
      w.add_float32(key, value)
    else:
      w.add_string(key, value)
  weights = dict(weights or hf_weights(arch, tie, len(tokens), dims, rng, bias))
  weights.update(extra or {})
  for name, x in weights.items():
    if name in drop:
      continue
    if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
      x = llama_cpp_permute(x, dims["heads"] if "attn_q" in name else dims["kv_heads"])
    data, raw_dtype = encoded(x, type_of(name, types or {}), rng)
    w.add_tensor(name, data, raw_dtype=raw_dtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def float_weights(path: str) -> dict:
  """The file's tensors dequantized to float32, as stored (q/k still permuted)."""
  import gguf
  reader = gguf.GGUFReader(path)
  return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
      tuple(int(s) for s in reversed(t.shape))) for t in reader.tensors}
