"""The tiny target: a 4-layer Llama/Qwen3-style decoder on the Python standard library.

  python train.py --config=configs/target_tiny.py --config.run_dir=runs/tiny

About 5 minutes on 2 CPU cores. Trains into runs/tiny/target/.
"""

from specjax import config_base


def get_config():
  c = config_base.train_defaults()
  c.method = "target"
  c.num_steps = 500
  c.batch_size = 16
  c.seq_len = 128
  c.model = config_base.model_defaults()
  return c
