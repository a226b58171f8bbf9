"""The draft model for the tiny target: one small layer, the target's tokenizer and data.

  python train.py --config=configs/draft_tiny.py --config.run_dir=runs/tiny

Needs runs/tiny/target/ (the tokenizer, and the target itself when distill=True).
Trains into runs/tiny/draft/. About 50 seconds on 2 CPU cores.
"""

from specjax import config_base


def get_config():
  c = config_base.train_defaults()
  c.method = "draft"
  c.num_steps = 200
  c.distill = True  # KL to the frozen target's logits; False = next-token loss on the data
  c.train_on = "corpus"  # corpus | regenerated (the block drafters' regenerated rows)
  # True (with train_on=regenerated): the target's outputs per row computed once, not per step
  c.feature_cache = False
  # target layer ids: start as the target's shape with only these layers, its embedding and
  # final norm (c.model's shape is then the target's); empty = a fresh model of c.model's shape
  c.init_from_target = ()
  c.model = config_base.model_defaults()
  c.model.num_layers = 1
  c.model.d_model = 128
  c.model.num_heads = 2
  c.model.num_kv_heads = 1
  c.model.head_dim = 64
  c.model.mlp_dim = 384
  return c
