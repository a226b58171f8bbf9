"""DSpark for the tiny target: the DFlash backbone (2 layers, target width) with a Markov
head and a confidence head; block 8, every slot predicts.

  python train.py --config=configs/dspark_tiny.py --config.run_dir=runs/tiny

Trains into runs/tiny/dspark/ on the same regenerated continuations as DFlash (shared cache
in runs/tiny/regenerated/), then calibrates the confidence head on the held-out ones
(runs/tiny/dspark/calibration.json). Decode with decode.py --config.methods=dspark
--config.dspark.schedule=fixed|threshold|load_aware (block_size - 1 drafts, like DFlash).
"""

from specjax import config_base


def get_config():
  c = config_base.block_drafter_defaults()  # 2 layers, 3 feature layers, regenerated data
  c.method = "dspark"
  c.block_size = 8  # B inputs [anchor, MASK x 7] -> 8 drafts
  c.markov_rank = 64  # r; 0 = no Markov head (r = 256 at V = 152K; V = 2048 here)
  c.gamma = 4.0  # weight exp(-j/gamma), j = 0..B-1
  c.ce_weight = 0.1
  c.tv_weight = 0.9
  c.confidence_weight = 1.0
  c.num_steps = 150
  c.eval_every = 50
  c.save_every = 50
  return c
