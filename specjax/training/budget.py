"""Wall-clock training budgets: `--config.time_budget_s=S` turns S seconds into num_steps.

Equal budgets compare drafters fairly only if each one's schedule (warmup, cosine decay) spans
its own budget, so the step count is fixed before training starts: the jitted train step is
timed on copies of the initial state (compilation excluded, fastest of a few runs), and
num_steps = S / seconds_per_step. The figure is written to `<model dir>/budget.json`, so a
resumed run keeps the same schedule instead of measuring again on a machine that may be busier.
The budget counts training steps and a feature cache's one-time build (feature_cache.py);
validation and checkpoint writes come on top.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from specjax.errors import SpecjaxError

FILE = "budget.json"


def seconds_per_step(step_fn, params, opt_state, frozen, batch, rng, runs: int = 3,
                     inner: int = 3) -> float:
  """Fastest of `runs` timings of `inner` steps, on copies (the step donates its state)."""
  copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)
  p, o = copy(params), copy(opt_state)
  p, o, _ = step_fn(p, o, frozen, batch, rng)  # compile
  jax.block_until_ready(p)
  times = []
  for _ in range(runs):
    t = time.perf_counter()
    for _ in range(inner):
      p, o, m = step_fn(p, o, frozen, batch, rng)
    jax.block_until_ready((p, m))
    times.append((time.perf_counter() - t) / inner)
  return float(np.min(times))


def decided(workdir: str) -> dict | None:
  """The budget decision kept in workdir's budget.json, or None before the first one."""
  path = os.path.join(workdir, FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def finished(cfg, workdir: str) -> bool:
  """Whether workdir holds a checkpoint at the run's last step (under a time budget, the
  num_steps its budget.json fixed): resuming it would train nothing, so one-time setup for
  its steps (a feature cache) can be skipped."""
  num_steps = int(cfg.get("num_steps", 0))
  if float(cfg.get("time_budget_s", 0) or 0) > 0:
    saved = decided(workdir)
    if saved is None:
      return False
    num_steps = int(saved["num_steps"])
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if num_steps <= 0 or not os.path.isdir(ckpt_dir):
    return False
  from specjax.checkpoint import Checkpoints  # the loop's own test of what is saved
  latest = Checkpoints(ckpt_dir).latest_step()
  return latest is not None and latest >= num_steps


def steps_for_budget(cfg, workdir: str, measure, setup_seconds: float = 0.0) -> int:
  """num_steps for cfg.time_budget_s (> 0); `measure()` -> seconds per training step, called
  only when the model dir holds no earlier decision for this budget. setup_seconds: one-time
  work the run did for its steps (a feature cache), taken out of the budget."""
  budget = float(cfg.time_budget_s)
  path = os.path.join(workdir, FILE)
  saved = decided(workdir)
  if saved is not None:
    if float(saved["time_budget_s"]) == budget:
      return int(saved["num_steps"])
    raise SpecjaxError(
        f"{workdir} was trained with time_budget_s={saved['time_budget_s']}, not {budget}; "
        "use that budget to resume, or a fresh run_dir")
  if setup_seconds >= budget:
    raise SpecjaxError(f"the one-time setup took {setup_seconds:.0f} s, the whole "
                       f"time_budget_s={budget:.0f}")
  step_seconds = measure()
  steps = max(1, int((budget - setup_seconds) / step_seconds))
  if jax.process_index() == 0:
    with open(path, "w") as f:
      json.dump({"time_budget_s": budget, "setup_seconds": setup_seconds,
                 "seconds_per_step": step_seconds, "num_steps": steps}, f, indent=1)
  setup = f" after {setup_seconds:.0f} s of setup" if setup_seconds else ""
  print(f"[budget] {budget:.0f} s{setup} at {step_seconds * 1e3:.1f} ms/step -> {steps} steps",
        flush=True)
  return steps
