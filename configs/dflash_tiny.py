"""DFlash for the tiny target: 2 drafter layers at the target's width, block 16.

  python train.py --config=configs/dflash_tiny.py --config.run_dir=runs/tiny

Trains into runs/tiny/dflash/ on the target's own greedy continuations of corpus prompts
(generated once into runs/tiny/regenerated/). Decode at any block size <= 16
(decode.py --config.block_size, default 8).
"""

import ml_collections

from specjax import config_base


def get_config():
  c = config_base.block_drafter_defaults()  # 2 layers, 3 feature layers, regenerated data
  c.method = "dflash"
  c.block_size = 16  # trained block; decoding may use any smaller one
  # mask slots: -1 = a learned mask vector; a token id = the target's embedding of that token
  # (Z Lab's design; needed to export to their format: python -m specjax.interop export-dflash)
  c.mask_token_id = -1
  # the drafter layers' own shape (Z Lab drafters set these); empty = the target's.
  # keys: num_heads, num_kv_heads, head_dim, mlp_dim, rope_theta, norm_eps
  c.layer_shape = ml_collections.ConfigDict()
  c.output_multiplier = 1.0  # draft logits scale
  c.final_logit_softcapping = 0.0  # 0 = off; else cap * tanh(logits / cap)
  c.embedding_scale = 1.0  # block embeddings scale (Z Lab's input_embedding_scale)
  c.gamma = 7.0  # loss decay exp(-(k-1)/gamma): 7, 5, 4 for B = 16, 10, 8
  c.num_steps = 300
  return c
