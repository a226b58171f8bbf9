"""Shared by the benchmarks: a target to time (trained if run_dir has one, else random)."""

from __future__ import annotations

import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from flax import nnx  # noqa: E402

from specjax import config_base, run_dir as run_dir_lib  # noqa: E402
from specjax.models import Transformer  # noqa: E402


def target_for_timing(run_dir: str):
  """(graphdef, params, where): the trained target, or the tiny config randomly initialised
  (decode speed does not depend on the weights; EOS is disabled by the callers)."""
  if os.path.isdir(os.path.join(run_dir, "target", "checkpoints")):
    t = run_dir_lib.load_target(run_dir)
    return t.graphdef, t.params, f"trained target in {run_dir}"
  cfg = run_dir_lib.transformer_config(config_base.model_defaults(), 2048)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  return graphdef, params, "randomly initialised configs/target_tiny.py model (vocab 2048)"


def decode_config(run_dir: str, temperature: float, num_prompts: int, max_new_tokens: int):
  """configs/decode.py with the bench's settings and step-cost measurement on."""
  cfg = load_config("decode.py")
  cfg.run_dir = run_dir
  cfg.temperature = temperature
  cfg.num_prompts = num_prompts
  cfg.max_new_tokens = max_new_tokens
  cfg.measure_costs = True
  return cfg


def load_config(name):
  """configs/<name>'s get_config()."""
  return config_base.load_config_file(os.path.join(ROOT, "configs", name))


def prepare(source, run):
  """A run dir holding a copy of the source target and its regenerated data."""
  os.makedirs(run, exist_ok=True)
  for sub in ("target", "regenerated"):
    if not os.path.exists(os.path.join(run, sub)) and os.path.exists(os.path.join(source, sub)):
      shutil.copytree(os.path.join(source, sub), os.path.join(run, sub))
  return run


def train(name, run, steps, **overrides):
  """Trains configs/<name> into run for `steps` (resumes; returns at once when done)."""
  cfg = load_config(name)
  cfg.run_dir, cfg.num_steps = run, steps
  cfg.update(overrides)
  from specjax.training import registry as trainers
  trainers.train(cfg)


def predicted(entry):
  """tau * T_ar / (T_draft + mean T_verify over the widths the steps used)."""
  import numpy as np
  t_verify = entry["t_verify"]
  if "verify_width_seconds" in entry:
    hist = np.asarray(entry["verify_width_histogram"], float)
    secs = entry["verify_width_seconds"]
    per = [secs[str(min(int(w) for w in secs if int(w) >= i))] for i in range(len(hist))]
    t_verify = float((hist * per).sum() / max(hist.sum(), 1))
  return entry["tau"] * entry["t_ar"] / (entry["t_draft"] + t_verify)
