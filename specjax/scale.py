"""Real-scale configurations: published target shapes, and DFlash / DSpark / DFlash 2 drafters
shaped like the released ones, in bfloat16. `configs/<target>.py` and
`configs/<target>_<drafter>.py` are thin wrappers over `target_config` and `drafter_config`.

The target's weights come from Hugging Face (`python -m specjax.interop import-hf`, which
writes run_dir/target and its tokenizer); training a target of this size from scratch is
possible but not the point. Plan before renting: `python train.py --config=configs/qwen3_8b_dflash.py
--config.plan=true --config.plan_devices=8 --config.device_memory_gib=16`.
"""

from __future__ import annotations

import ml_collections

from specjax import config_base

# config.json of the released checkpoints (vocab_size is the embedding's rows)
TARGETS = {
    "qwen3_0_6b": dict(num_layers=28, d_model=1024, num_heads=16, num_kv_heads=8, head_dim=128,
                       mlp_dim=3072, rope_theta=1e6, qk_norm=True, tie_embeddings=True,
                       norm_eps=1e-6, vocab_size=151936, mask_token_id=151669),
    "qwen3_8b": dict(num_layers=36, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                     mlp_dim=12288, rope_theta=1e6, qk_norm=True, tie_embeddings=False,
                     norm_eps=1e-6, vocab_size=151936, mask_token_id=151669),
    "llama3_8b": dict(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                      mlp_dim=14336, rope_theta=5e5, rope_llama3_scaling=(8.0, 1.0, 4.0, 8192),
                      qk_norm=False, tie_embeddings=False, norm_eps=1e-5, vocab_size=128256,
                      # <|reserved_special_token_0|>: never produced by the tokenizer
                      mask_token_id=128002),
}

# the mesh that fits each on one host, by default; docstrings give v5e-8 and v5p-16 variants
MESH = {"data": -1, "fsdp": 1, "tensor": 1}


def target_model(name: str) -> ml_collections.ConfigDict:
  shape = dict(TARGETS[name])
  shape.pop("vocab_size"), shape.pop("mask_token_id")
  m = config_base.model_defaults()
  m.update(shape)
  m.rope_llama3_scaling = shape.get("rope_llama3_scaling")
  m.dtype = "bfloat16"
  m.param_dtype = "bfloat16"
  return m


def target_config(name: str, tensor: int) -> ml_collections.ConfigDict:
  """A target of the published shape (bf16), trained on the configured data with its own
  tokenizer (data.tokenizer_path: the checkpoint's tokenizer.json)."""
  c = config_base.train_defaults()
  c.method = "target"
  c.run_dir = f"runs/{name}"
  c.model = target_model(name)
  c.data.vocab_size = TARGETS[name]["vocab_size"]
  c.batch_size = 8  # per step; the plan shows what it costs (no rematerialisation here)
  c.seq_len = 2048
  c.learning_rate = 3e-4
  c.mesh_shape = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": tensor})
  return c


# Published drafter shapes (SPEC sections 5.3-5.5): 5 layers at the target's width, block 16
# (DFlash), 7 (DSpark), 8 (DFlash 2); features from 5 target layers spread over 1..L-3.
DRAFTERS = {
    "dflash": dict(block_size=16, gamma=7.0),
    "dspark": dict(block_size=7, gamma=4.0, markov_rank=256, ce_weight=0.1, tv_weight=0.9,
                   confidence_weight=1.0),
    "dflash2": dict(block_size=8, gamma=4.0, conv_kernel_size=2, conv_group_size=16,
                    selector_rank=256, selector_top_k=16, kl_weight=1.0, selector_weight=1.0,
                    final_logit_softcapping=20.0),
}


def drafter_config(method: str, target: str, tensor: int) -> ml_collections.ConfigDict:
  """A drafter of the released shape against run_dir/target (imported from Hugging Face);
  `target_model` / `target_vocab_size` let --config.plan=true size it without the checkpoint."""
  c = config_base.block_drafter_defaults()
  c.method = method
  c.run_dir = f"runs/{target}"
  c.num_layers = 5
  c.num_feature_layers = 5
  c.mask_token_id = TARGETS[target]["mask_token_id"]
  c.layer_shape = ml_collections.ConfigDict()
  c.output_multiplier = 1.0
  c.final_logit_softcapping = 0.0
  c.embedding_scale = 1.0
  c.update(DRAFTERS[method])
  # sized for one v5e-8 (the plan: python train.py --config=... --config.plan=true); the
  # published runs use far larger batches (DeepSpec: 512 sequences x 512 anchors)
  c.num_anchors = 64
  c.batch_size = 8
  c.seq_len = 2048
  c.learning_rate = 6e-4
  c.num_steps = 20_000
  c.regen = ml_collections.ConfigDict(
      {"num_sequences": 800_000, "num_validation": 2048, "prompt_len": 1024,
       "new_tokens": 2048, "batch_size": 256})
  c.target_model = target_model(target)
  c.target_vocab_size = TARGETS[target]["vocab_size"]
  c.mesh_shape = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": tensor})
  return c
