"""Shared by the benchmarks: a target to time (trained if run_dir has one, else random)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
  import importlib.util
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "decode.py")
  spec = importlib.util.spec_from_file_location("decode_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  cfg = mod.get_config()
  cfg.run_dir = run_dir
  cfg.temperature = temperature
  cfg.num_prompts = num_prompts
  cfg.max_new_tokens = max_new_tokens
  cfg.measure_costs = True
  return cfg
