"""EAGLE-3 for the tiny target: one decoder layer at the target's shape, trained against the
frozen target with training-time test (3 steps), speculators' defaults.

  python train.py --config=configs/eagle3_tiny.py --config.run_dir=runs/tiny

Trains into runs/tiny/eagle3/. Decode any number of drafts (decode.py
--config.num_draft_tokens): the chain runs past ttt_steps, untrained there.
"""

from specjax import config_base


def get_config():
  c = config_base.train_defaults()
  c.method = "eagle3"
  c.num_layers = 1  # drafter decoder layers (the first reads [embedding ; feature])
  c.feature_layers = ()  # target layers fused by fc; empty = speculators' [2, L//2, L-3]
  c.ttt_steps = 3  # training-time test depth
  c.ttt_step_loss_decay = 1.0  # step k's loss weight decay**k
  c.draft_vocab_size = 0  # 0 = the target's vocabulary; else its most frequent tokens
  c.vocab_batches = 64  # training batches counted for the draft vocabulary
  # speculators' training CLI defaults (all three on)
  c.norm_before_residual = True  # the first layer's residual is hidden_norm(feature)
  c.norm_before_fc = True  # one RMSNorm over the concatenated features before fc
  c.fc_norm = False  # (exclusive with norm_before_fc) one RMSNorm per feature layer
  c.norm_output = True  # chained entries read the normed output
  c.train_on = "corpus"  # corpus | regenerated (the block drafters' regenerated rows)
  c.feature_cache = False  # True (with train_on=regenerated): the target's outputs cached
  c.num_steps = 200
  c.learning_rate = 3e-3
  return c
