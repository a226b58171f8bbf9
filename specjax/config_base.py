"""Defaults every training config shares; `configs/*.py` start from these and override."""

from __future__ import annotations

import ml_collections


def train_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = "target"
  c.run_dir = "runs/tiny"
  c.seed = 0
  c.num_steps = 1000
  # > 0: train for this many seconds of training steps instead; num_steps is then set from
  # the measured step time before training (specjax/training/budget.py)
  c.time_budget_s = 0.0
  c.batch_size = 16
  c.seq_len = 128
  # Mesh axes and sizes (-1 = all remaining devices). Logical axis rules map parameter and
  # batch axes onto them; an empty list means specjax.sharding.DEFAULT_RULES.
  c.mesh_shape = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  c.logical_axis_rules = ()
  # AdamW, linear warmup then cosine decay to learning_rate * min_lr_ratio.
  c.learning_rate = 3e-3
  c.warmup_steps = 0.05  # < 1: a fraction of num_steps
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.1
  c.grad_clip = 1.0
  c.b1 = 0.9
  c.b2 = 0.95
  c.log_every = 25
  c.eval_every = 100
  c.eval_batches = 8
  c.save_every = 100
  c.keep_checkpoints = 3
  c.data = data_defaults()
  # --config.plan=true: print per-device memory (parameters, optimizer, gradients,
  # activations) for this config on its mesh of plan_devices devices (0 = this machine's),
  # and whether it fits device_memory_gib (0 = no check); allocates nothing, then exits
  c.plan = False
  c.plan_devices = 0
  c.device_memory_gib = 0.0
  return c


def data_defaults() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.name = "python_source"  # the bundled builder; or any prepared TFDS text dataset's name
  # python_source only: a directory, `stdlib` (empty = this interpreter's standard library),
  # `pkg:NAME` (an installed package's sources), or several of these comma-separated
  d.source_dir = ""
  d.validation_percent = 5
  d.tfds_dir = "~/tensorflow_datasets"
  d.train_split = "train"
  d.validation_split = "validation"
  d.text_feature = "text"
  d.shuffle_window = 1024  # packed rows shuffled in windows this large (train split only)
  d.vocab_size = 2048  # BPE vocabulary trained when tokenizer_path is empty
  d.tokenizer_path = ""  # a tokenizer.json to use as is
  d.tokenizer_max_docs = 0  # 0 = train the tokenizer on the whole train split
  return d


def model_defaults() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.num_layers = 4
  m.d_model = 256
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 64
  m.mlp_dim = 768
  m.rope_theta = 10_000.0
  m.qk_norm = True
  m.tie_embeddings = True
  m.norm_eps = 1e-6
  m.dtype = "float32"
  m.param_dtype = "float32"
  return m


def block_drafter_defaults() -> ml_collections.ConfigDict:
  """What DFlash, DFlash 2 and DSpark share: the tiny-target training schedule and the
  regenerated data (the target's greedy continuations of corpus prompts, generated once into
  run_dir/regenerated/ and shared by all three)."""
  c = train_defaults()
  c.num_layers = 2
  c.feature_layers = ()  # target layers to read; empty = num_feature_layers spread evenly
  c.num_feature_layers = 3
  c.num_anchors = 16  # blocks per sequence per step
  # True: the target's features over every regenerated row computed once, kept in host memory
  # and read per batch instead of a target pass per step (specjax/training/feature_cache.py)
  c.feature_cache = False
  c.label_source = "target"  # target: train on the target's greedy continuations | data
  c.regen = ml_collections.ConfigDict(
      {"num_sequences": 768, "num_validation": 64, "prompt_len": 32, "new_tokens": 96,
       "batch_size": 64})
  c.batch_size = 16
  c.seq_len = 128
  c.learning_rate = 2e-3
  c.warmup_steps = 0.04
  return c


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """get_config() of a config file given by path (configs/*.py), as --config=PATH loads it;
  PATH:ARG calls get_config(ARG), as --config=PATH:ARG does."""
  import importlib.util
  import os

  from specjax.errors import SpecjaxError
  path, _, arg = path.partition(":")
  if not os.path.exists(path):
    raise SpecjaxError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def tiny_drafter_config(configs_dir: str, method: str) -> ml_collections.ConfigDict:
  """A decode method's training config from configs_dir/<name>_tiny.py (mtp_parallel and
  mtp_sequential: mtp_tiny.py with its variant): where experiment configs start."""
  import os
  if method.startswith("mtp_"):
    c = load_config_file(os.path.join(configs_dir, "mtp_tiny.py"))
    c.variant = method[4:]
    return c
  return load_config_file(os.path.join(configs_dir, f"{method}_tiny.py"))
