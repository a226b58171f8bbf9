"""One training loop for every model: the target and each drafter.

A `TrainTask` says what differs (trainable parameters, loss, data, frozen inputs such as the
target); `train` does the rest: mesh and shardings, AdamW, a jitted step with donated state,
Orbax checkpoints with resume, validation, a progress line and `metrics.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax import sharding as sharding_lib
from specjax.checkpoint import Checkpoints
from specjax.training import budget as budget_lib
from specjax.training.optimizer import learning_rate_schedule, make_optimizer

# Test hook: SIGKILL this process after the given step (a real, unclean interruption).
KILL_ENV = "SPECJAX_KILL_AFTER_STEP"


@dataclasses.dataclass
class TrainTask:
  name: str  # model folder under run_dir: "target", "draft", ...
  init_params: Callable[[jax.Array], nnx.State]  # rng -> trainable parameters
  loss_fn: Callable[..., tuple[jax.Array, dict]]  # (params, frozen, batch, rng) -> loss, metrics
  train_data: Any  # grain IterDataset of host batches (dicts of numpy arrays)
  eval_data: list[dict]  # fixed validation batches
  frozen: Any = None  # inputs that are not trained (e.g. target params); placed by `train`
  summary: dict = dataclasses.field(default_factory=dict)  # extra facts for metrics.jsonl
  setup_seconds: float = 0.0  # one-time work (a feature cache) charged to a time budget


def place_batch(batch: dict, mesh, rules) -> dict:
  """A whole host batch (the same on every process) -> global arrays sharded over the data
  axes; each process copies only the rows its own devices hold."""
  def one(v):
    v = np.asarray(v)
    return jax.make_array_from_callback(v.shape, sharding_lib.batch_sharding(mesh, rules, v.ndim),
                                        lambda index: v[index])
  return {k: one(v) for k, v in batch.items()}


class MetricsWriter:
  """Appends one JSON object per line; on resume drops lines past the restored step."""

  def __init__(self, path: str, resume_step: int | None):
    self.path = path
    if jax.process_index() != 0:  # one writer
      return
    if resume_step is not None and os.path.exists(path):
      with open(path) as f:
        kept = [l for l in f if l.strip() and json.loads(l).get("step", 0) <= resume_step]
      with open(path, "w") as f:
        f.writelines(kept)
    elif resume_step is None and os.path.exists(path):
      os.remove(path)

  def write(self, record: dict):
    if jax.process_index() == 0:
      with open(self.path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _fmt_seconds(s: float) -> str:
  s = int(max(s, 0))
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _weighted_means(metric_list: list[dict]) -> dict:
  total = sum(float(m["weight"]) for m in metric_list) or 1.0
  keys = [k for k in metric_list[0] if k != "weight"]
  return {k: sum(float(m[k]) * float(m["weight"]) for m in metric_list) / total for k in keys}


def step_fn(loss_fn, optimizer):
  """(params, opt_state, frozen, batch, rng) -> (params, opt_state, metrics): one update."""
  def train_step(params, opt_state, frozen, batch, rng):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, frozen, batch, rng)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics
  return train_step


def train(cfg, task: TrainTask):
  """Trains `task` into run_dir/<task.name>/ and returns the final parameters."""
  workdir = run_dir_lib.model_dir(cfg.run_dir, task.name)
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding_lib.make_mesh(cfg.mesh_shape.to_dict())
  rules = sharding_lib.rules_from_config(cfg.get("logical_axis_rules"))
  optimizer = make_optimizer(cfg)
  schedule = learning_rate_schedule(cfg)

  abstract_params = jax.eval_shape(task.init_params, jax.random.key(0))
  p_shard = sharding_lib.state_shardings(abstract_params, mesh, rules)
  abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
  o_shard = sharding_lib.state_shardings(abstract_opt, mesh, rules)
  repl = sharding_lib.replicated(mesh)

  params = jax.jit(task.init_params, out_shardings=p_shard)(jax.random.key(cfg.seed))
  opt_state = jax.jit(optimizer.init, out_shardings=o_shard)(params)
  step = 0

  data_iter = iter(task.train_data)
  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=cfg.keep_checkpoints)
  latest = ckpt.latest_step()
  if latest is not None:
    params, train_state, data_state = ckpt.restore(latest, params, {"opt_state": opt_state})
    opt_state = train_state["opt_state"]
    if data_state:
      data_iter.set_state(data_state)
    step = latest
    print(f"[{task.name}] resumed from step {step} in {workdir}", flush=True)
  writer = MetricsWriter(os.path.join(workdir, "metrics.jsonl"), latest)

  f_shard = None
  if task.frozen is not None:
    f_shard = sharding_lib.state_shardings(task.frozen, mesh, rules)
    task.frozen = jax.device_put(task.frozen, f_shard)

  def jitted_step(optimizer):
    return jax.jit(step_fn(task.loss_fn, optimizer),
                   in_shardings=(p_shard, o_shard, f_shard, None, repl),
                   out_shardings=(p_shard, o_shard, repl), donate_argnums=(0, 1))

  train_step = jitted_step(optimizer)
  if cfg.get("time_budget_s", 0) > 0:
    # the schedule must span the budget, so num_steps is fixed (by timing this very step)
    # before the first update; the optimizer state's structure does not depend on it
    first = place_batch(next(iter(task.train_data)), mesh, rules)
    measure = lambda: budget_lib.seconds_per_step(train_step, params, opt_state, task.frozen,
                                                  first, jax.random.key(0))
    cfg.num_steps = budget_lib.steps_for_budget(cfg, workdir, measure, task.setup_seconds)
    optimizer, schedule = make_optimizer(cfg), learning_rate_schedule(cfg)
    train_step = jitted_step(optimizer)
  eval_step = jax.jit(lambda p, f, b: task.loss_fn(p, f, b, jax.random.key(0))[1],
                      in_shardings=(p_shard, f_shard, None), out_shardings=repl)

  def evaluate(params):
    if not task.eval_data:
      return {}
    return _weighted_means([jax.device_get(eval_step(params, task.frozen,
                                                     place_batch(b, mesh, rules)))
                            for b in task.eval_data])

  if latest is None:  # where training starts from: summary facts and validation at step 0
    writer.write({"step": 0, **task.summary,
                  **{f"val_{k}": v for k, v in evaluate(params).items()}})

  kill_after = int(os.environ.get(KILL_ENV, "-1"))
  base_rng = jax.random.key(cfg.seed + 1)
  pending: list[dict] = []
  tokens_per_step = cfg.batch_size * cfg.seq_len
  t_last, steps_since = None, 0
  while step < cfg.num_steps:
    batch = place_batch(next(data_iter), mesh, rules)
    params, opt_state, metrics = train_step(params, opt_state, task.frozen, batch,
                                            jax.random.fold_in(base_rng, step))
    step += 1
    pending.append(metrics)
    if t_last is None:  # first step includes compilation: start the clock after it
      jax.block_until_ready(metrics)
      t_last, steps_since = time.time(), 0
    else:
      steps_since += 1
    if step % cfg.log_every == 0 or step == cfg.num_steps:
      logged = _weighted_means(jax.device_get(pending))
      pending = []
      now = time.time()
      rate = steps_since / max(now - t_last, 1e-9)
      t_last, steps_since = now, 0
      record = {"step": step, **logged, "learning_rate": float(schedule(step)),
                "tokens_per_second": rate * tokens_per_step}
      if step % cfg.eval_every == 0 or step == cfg.num_steps:
        record.update({f"val_{k}": v for k, v in evaluate(params).items()})
      writer.write(record)
      eta = (cfg.num_steps - step) / max(rate, 1e-9)
      shown = " | ".join(f"{k} {v:.4g}" for k, v in record.items()
                         if k not in ("step", "learning_rate", "tokens_per_second"))
      print(f"[{task.name}] step {step}/{cfg.num_steps} | {shown} | "
            f"{record['tokens_per_second']:,.0f} tok/s | eta {_fmt_seconds(eta)}", flush=True)
    if step % cfg.save_every == 0 or step == cfg.num_steps:
      ckpt.save(step, params, {"opt_state": opt_state}, data_iter.get_state())
    if step == kill_after:
      ckpt.wait()
      os.kill(os.getpid(), signal.SIGKILL)
  ckpt.wait()
  ckpt.close()
  return params
