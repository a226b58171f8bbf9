"""The feature cache's effect on a training step, measured in one run: each drafter's jitted
step on the same batch with the frozen target's outputs read from the cache and recomputed
by the target's pass, timed alternately, and the cache's one-time build.

Each drafter is set up exactly as train.py sets it up (its training module builds the task;
the bench takes the task instead of training it), in a scratch run folder that links
--run_dir's target and regenerated text, so nothing in --run_dir changes.

  python bench/feature_cache.py --run_dir=runs/reference [--methods=dflash,draft]

Prints per drafter: ms per step without / with the cache, their ratio, the build's seconds
and the steps after which the build has paid for itself (build / the time a step saves).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from unittest import mock

import common  # sets sys.path
import jax
import numpy as np

from specjax import config_base
from specjax import methods
from specjax.training import budget, dflash, draft, mtp, registry
from specjax.training.loop import step_fn
from specjax.training.optimizer import make_optimizer

METHODS = methods.trained()


class _Task(Exception):
  """Carries the TrainTask a trainer built out of registry.train."""


def _capture(cfg, task):
  raise _Task(task)


def task_for(cfg):
  """The TrainTask train.py would train for cfg (cache built, data ready), untrained."""
  with mock.patch.object(dflash, "train", _capture), mock.patch.object(draft, "train", _capture), \
       mock.patch.object(mtp, "train", _capture):
    try:
      registry.train(cfg)
    except _Task as e:
      return e.args[0]
  raise RuntimeError(f"{cfg.method} trained instead of handing over its task")


def step_timer(cfg, task, batch):
  """() -> seconds a step of task's jitted update takes on batch (budget.seconds_per_step:
  fastest of a few runs); compiled once, on the first call."""
  optimizer = make_optimizer(cfg)
  params = task.init_params(jax.random.key(0))
  opt_state = optimizer.init(params)
  step = jax.jit(step_fn(task.loss_fn, optimizer), donate_argnums=(0, 1))
  return lambda: budget.seconds_per_step(step, params, opt_state, task.frozen, batch,
                                         jax.random.key(1))


def measure(method: str, scratch: str, rounds: int):
  """(method, s/step without, with the cache, build seconds, steps that repay the build)."""
  cfg = config_base.load_config_file(
      os.path.join(common.ROOT, "configs", f"reference.py:{method}"))
  cfg.run_dir, cfg.feature_cache, cfg.time_budget_s = scratch, True, 0.0
  task = task_for(cfg)
  cached = next(iter(task.train_data))
  online = {k: v for k, v in cached.items() if not k.startswith("cached_")}
  timers = step_timer(cfg, task, online), step_timer(cfg, task, cached)
  # alternate the two so that both see the same moments of a shared machine
  t_on, t_c = np.min([[t() for t in timers] for _ in range(rounds)], axis=0)
  build, gain = task.setup_seconds, t_on - t_c
  print(f"[{method}] without {t_on * 1e3:.0f} ms, with {t_c * 1e3:.0f} ms a step "
        f"({cfg.batch_size} x {cfg.seq_len} tokens); build {build:.0f} s", flush=True)
  return method, t_on, t_c, build, build / gain if gain > 0 else float("inf")


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--run_dir", default="runs/reference",
                 help="holds target/ and the regenerated text (scripts/reference.sh)")
  p.add_argument("--methods", default="dflash,draft")
  p.add_argument("--rounds", type=int, default=3, help="alternating timings of each variant")
  args = p.parse_args(argv)
  source = os.path.abspath(args.run_dir)
  for need in ("target", "regenerated"):
    if not os.path.isdir(os.path.join(source, need)):
      raise SystemExit(f"{source}/{need} missing: run scripts/reference.sh (its target and "
                       "first drafter) first")
  methods = args.methods.split(",")
  if not set(methods) <= set(METHODS):
    raise SystemExit(f"--methods: pick from {', '.join(METHODS)}")
  scratch = tempfile.mkdtemp(prefix="feature_cache_bench_")
  try:
    for need in ("target", "regenerated"):
      os.symlink(os.path.join(source, need), os.path.join(scratch, need))
    rows = [measure(method, scratch, args.rounds) for method in methods]
  finally:
    shutil.rmtree(scratch)
  print(f"\n{'drafter':<15}{'ms/step without':>16}{'with cache':>12}{'ratio':>8}"
        f"{'build s':>9}{'pays after':>12}")
  for method, t_on, t_c, build, even in rows:
    print(f"{method:<15}{t_on * 1e3:>16.0f}{t_c * 1e3:>12.0f}{t_on / t_c:>7.2f}x"
          f"{build:>9.0f}{even:>10.0f} steps")


if __name__ == "__main__":
  main()
