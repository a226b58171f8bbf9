"""DFlash 2 for the tiny target: DFlash's drafter (2 layers, block 8, gamma 4) with a grouped
dynamic causal convolution around every sublayer and a candidate selector.

  python train.py --config=configs/dflash2_tiny.py --config.run_dir=runs/tiny

Trains into runs/tiny/dflash2/ (resumes from its last checkpoint) on the target's own greedy
continuations (runs/tiny/regenerated/, shared with DFlash). Loss: kl_weight * KL(target ||
drafter logits) + selector_weight * the selector's top-K cross-entropy on the target's token.
Export: python -m specjax.interop export-dflash2 runs/tiny OUT_DIR (needs mask_token_id >= 0).
"""

import os

from specjax import config_base


def get_config():
  c = config_base.load_config_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "dflash_tiny.py"))
  c.method = "dflash2"
  c.block_size = 8
  c.gamma = 4.0
  c.conv_kernel_size = 2  # taps
  c.conv_group_size = 16  # channels per dynamic coefficient
  c.selector_rank = 64
  c.selector_top_k = 16  # candidates per slot
  c.kl_weight = 1.0
  c.selector_weight = 1.0
  return c
