"""MTP drafters for the tiny target, trained against the frozen target.

  python train.py --config=configs/mtp_tiny.py --config.run_dir=runs/tiny --config.variant=parallel
  python train.py --config=configs/mtp_tiny.py --config.run_dir=runs/tiny --config.variant=sequential

Trains into runs/tiny/mtp_parallel/ or runs/tiny/mtp_sequential/.
"""

from specjax import config_base


def get_config():
  c = config_base.train_defaults()
  c.method = "mtp"
  c.variant = "parallel"  # parallel (Medusa-style heads) | sequential (DeepSeek-V3 modules)
  c.num_heads = 4  # depths K; decode may use any num_draft_tokens <= num_heads
  c.layers_per_head = 1  # parallel: residual blocks per head
  c.depth_weights = ()  # loss weight per depth; empty = 1.0 each (DeepSeek-V3 used 0.3/0.1)
  c.label_source = "target"  # target: the target's greedy predictions | data: the corpus
  c.freeze_target = True  # False: train the target jointly (for MTP pretraining)
  c.train_on = "corpus"  # corpus | regenerated (the block drafters' regenerated rows)
  # True (with train_on=regenerated): the target's outputs per row computed once, not per step
  c.feature_cache = False
  c.num_steps = 200  # scripts/tiny.sh gives the (2.5x costlier) sequential variant 120
  c.learning_rate = 3e-3
  return c
