"""The reference target: the strongest target 2 CPU cores train in about 45 minutes.

  python train.py --config=configs/target_reference.py --config.run_dir=runs/reference

Data: the Python sources of this interpreter's standard library and of the packages pinned in
requirements.txt (installed by `pip install -r requirements.txt`, nothing downloaded at run
time; tests directories skipped), about 45 MB of text. Size and schedule chosen by a scaling
sweep at equal wall-clock budgets (README, "The reference experiment").
Trains into runs/reference/target/; scripts/reference.sh runs it with everything else.
"""

from specjax import config_base

CORPUS = ",".join(["stdlib"] + [f"pkg:{p}" for p in (
    "jax", "flax", "optax", "orbax", "numpy", "grain", "tensorflow_datasets", "matplotlib",
    "absl", "ml_collections")])


def get_config():
  c = config_base.train_defaults()
  c.method = "target"
  c.time_budget_s = 45 * 60.0  # num_steps follows from the measured step time
  c.batch_size = 16
  c.seq_len = 256
  c.eval_every = 250
  c.save_every = 250
  c.log_every = 50
  c.data.source_dir = CORPUS
  # 4 layers, d_model 256, GQA 4/2, vocabulary 2048 (3.7M parameters): at equal wall clock
  # it beat 6 x 256 (5.2M) and 6 x 384 (10.2M) in the sweep; 45 minutes give it ~2,000
  # steps of 4,096 tokens, about 2 tokens per parameter, still far below compute-optimal
  c.model = config_base.model_defaults()
  return c
