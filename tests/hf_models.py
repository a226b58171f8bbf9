"""Small random Hugging Face Llama / Qwen3 checkpoints built with `transformers` (the test peer),
saved as real checkpoint folders: config.json, safetensors, tokenizer.json, tokenizer and
generation configs. Shared by tests/test_interop_hf.py and bench/parity.py."""

from __future__ import annotations

import os

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nprint(os.path.join('a', 'b'))\n",
    "The quick brown fox jumps over the lazy dog.\n",
]
PROMPTS = ["def add(", "The quick brown", "for i in range(10):\n    print(", "x",
           "class Point:\n    def __init__(self"]
SPECIALS = {"llama": ("<s>", "</s>"), "qwen3": ("<|endoftext|>", "<|im_end|>")}


def make_tokenizer(arch: str, vocab: int):
  """A byte-level BPE with the architecture's special tokens; Llama's post-processor adds BOS
  (as Llama checkpoints' tokenizer.json does), Qwen3's adds nothing."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS[arch]),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(CORPUS * 4, trainer=trainer)
  if arch == "llama":
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
  return tok


def hf_config(arch: str, *, tie: bool, vocab: int = 320, layers: int = 2, d_model: int = 32,
              heads: int = 4, kv_heads: int = 2, head_dim: int = 16, mlp: int = 64,
              rope: str = "v5", dtype: str = "float32"):
  """A transformers config. head_dim differs from d_model / heads on purpose. Llama gets
  Llama-3 RoPE scaling; rope='legacy' writes the top-level rope_theta / rope_scaling keys."""
  from transformers import LlamaConfig, Qwen3Config
  bos, eos = (0, 1)
  common = dict(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                intermediate_size=mlp, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                bos_token_id=bos, eos_token_id=eos, initializer_range=0.2,
                max_position_embeddings=256, dtype=dtype)
  if arch == "llama":
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32)
    if rope == "legacy":
      cfg = LlamaConfig(rope_theta=500_000.0, rope_scaling=scaling, **common)
    else:
      cfg = LlamaConfig(rope_parameters=dict(rope_theta=500_000.0, **scaling), **common)
  else:
    cfg = Qwen3Config(rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0),
                      **common)
  cfg.architectures = ["LlamaForCausalLM" if arch == "llama" else "Qwen3ForCausalLM"]
  return cfg


def make_model(cfg, seed: int = 0):
  """A random model with its norm weights moved away from 1 (a random HF model has them all
  exactly 1, which would hide a norm that is read wrongly)."""
  import torch
  from transformers import AutoModelForCausalLM
  torch.manual_seed(seed)
  dtype = cfg.dtype if isinstance(cfg.dtype, torch.dtype) else getattr(torch, cfg.dtype)
  model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
  return model.eval()


def save_checkpoint(folder: str, arch: str, *, tie: bool, seed: int = 0,
                    max_shard_size: str | None = None, tokenizer_vocab: int = 300, **kw):
  """Builds and saves a checkpoint folder; returns (folder, model)."""
  from transformers import GenerationConfig, PreTrainedTokenizerFast
  cfg = hf_config(arch, tie=tie, **kw)
  model = make_model(cfg, seed)
  os.makedirs(folder, exist_ok=True)
  save_kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
  model.save_pretrained(folder, **save_kw)
  tok = make_tokenizer(arch, tokenizer_vocab)
  bos, eos = SPECIALS[arch]
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
  fast.save_pretrained(folder)
  GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                   do_sample=False).save_pretrained(folder)
  return folder, model


def assert_same_checkpoint(a: str, b: str, config_keys=None):
  """Two checkpoint folders hold the same tensors, bit for bit and dtype for dtype, and the
  same config.json (only `config_keys` of it, when given)."""
  import json

  import numpy as np

  from specjax.interop.safetensors_io import open_tensors
  with open_tensors(a) as x, open_tensors(b) as y:
    assert sorted(x.names()) == sorted(y.names())
    for name in x.names():
      u, v = x.read(name), y.read(name)
      assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), name
  ca, cb = (json.load(open(os.path.join(f, "config.json"))) for f in (a, b))
  for key in (config_keys or set(ca) | set(cb)):
    assert ca.get(key) == cb.get(key), key
