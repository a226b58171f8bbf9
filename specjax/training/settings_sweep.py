"""A drafter's training settings, swept at a short equal budget against a trained target.

  python -m specjax.training.settings_sweep --config=configs/reference.py:dflash \
      --run_dir=runs/reference --budget_s=120 --grid=num_anchors=8,16 [--set=learning_rate=2e-3]

Each combination of the --grid values (on top of the --set ones) trains for `budget_s` seconds
of training steps into RUN_DIR/sweeps/<model>/<variant>/<model>/, next to links to
RUN_DIR/target and RUN_DIR/regenerated (the same frozen target, the same text). Finished
variants are skipped, so a killed sweep resumes. Each is scored by its teacher-forced tau on
the validation split at the end of training (`teacher_forced_tau`; taus equal to 2 decimals
are ranked by validation loss), and the table, best first among the variants of each budget,
goes to stdout and RUN_DIR/sweeps/<model>/sweep.json. Short budgets favour fast-converging
settings (a high learning rate); the ranking is a guide for the full budget, not a proof.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import os

from specjax import config_base
from specjax import methods as methods_lib
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.training import budget as budget_lib

# what every variant reads from the base run folder: the frozen target, its regenerated rows and
# its stored features (both keyed caches: the first variant that needs them writes them there)
SHARED = ("target", "regenerated", "feature_cache")
SETTINGS = "settings.json"  # a variant's settings, next to its model folder
TOKEN_DEPTH = 4  # K at which a token drafter's teacher-forced tau is scored


def model_name(cfg) -> str:
  return methods_lib.for_training(cfg).name


def parse_value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def split_values(text: str) -> list[str]:
  """'a,(1,2),[3]' -> ['a', '(1,2)', '[3]']: commas inside brackets do not split."""
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    depth += (ch in "([") - (ch in ")]")
    if ch == "," and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  return parts + [text[start:]]


def parse_assignments(items, many: bool) -> dict:
  """["key=v1,v2", ...] -> {key: [v1, v2]} (many) or ["key=v"] -> {key: v}. A value may be
  a tuple: feature_layers=(1,2,3),(2,3,4)."""
  out = {}
  for item in items or ():
    key, sep, value = item.partition("=")
    if not sep or not key or not value:
      raise SpecjaxError(f"'{item}': expected key=value{',value...' if many else ''}")
    out[key] = [parse_value(v) for v in split_values(value)] if many else parse_value(value)
  return out


def set_key(cfg, key: str, value):
  """cfg[key] = value for a dotted key that the config already has, cast to its type."""
  node = cfg
  *parents, leaf = key.split(".")
  for p in parents:
    if p not in node:
      raise SpecjaxError(f"config has no key '{key}'")
    node = node[p]
  if leaf not in node:
    raise SpecjaxError(f"config has no key '{key}'")
  old = node[leaf]
  if isinstance(old, bool) or not isinstance(old, (int, float)):
    node[leaf] = value
  elif isinstance(old, int) and float(value) != int(value):
    raise SpecjaxError(f"{key} is an integer setting, got {value}")
  else:
    node[leaf] = type(old)(value)


def variants(grid: dict) -> list[dict]:
  keys = list(grid)
  return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def variant_name(settings: dict) -> str:
  return ",".join(f"{k}={_short(settings[k])}" for k in sorted(settings)) or "base"


def _short(value) -> str:
  """A value as a folder name: tuples without spaces, (1,2,3)."""
  return repr(value).replace(" ", "") if isinstance(value, (tuple, list)) else str(value)


def teacher_forced_tau(row: dict) -> float:
  """Tokens per step if the validation split were verified teacher-forced: the block drafters'
  val_block_tau; MTP's 1 + sum_k prod_{j<=k} val_acc_dj; the draft model's 1 + sum_k a^k over
  TOKEN_DEPTH drafts with its per-token agreement a."""
  if "val_block_tau" in row:
    return float(row["val_block_tau"])
  accs = [row[f"val_acc_d{k}"] for k in range(1, 64) if f"val_acc_d{k}" in row]
  if not accs and "val_accuracy" in row:
    accs = [row["val_accuracy"]] * TOKEN_DEPTH
  if not accs:
    raise SpecjaxError(f"no validation accuracy in the metrics row {sorted(row)}")
  tau, run = 1.0, 1.0
  for a in accs:
    run *= float(a)
    tau += run
  return tau


def final_metrics(model_dir: str):
  """The last metrics row holding validation figures, or None."""
  path = os.path.join(model_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  rows = [json.loads(line) for line in open(path) if line.strip()]
  rows = [r for r in rows if any(k.startswith("val_") for k in r)]
  return rows[-1] if rows else None


def _json(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def finished(model_dir: str):
  """The final metrics row if this variant trained all its steps (budget.json's, or the
  saved config's without a time budget), else None."""
  row = final_metrics(model_dir)
  plan = budget_lib.decided(model_dir) or _json(os.path.join(model_dir, "config.json"))
  if row is None or plan is None:
    return None
  return row if row["step"] >= plan["num_steps"] else None


def link_shared(base_run: str, variant_run: str, create=()):
  """Links the base run's SHARED folders into the variant's, creating those in `create` first."""
  os.makedirs(variant_run, exist_ok=True)
  if not os.path.isdir(os.path.join(base_run, "target")):
    raise SpecjaxError(f"{base_run} holds no trained target")
  for name in create:
    os.makedirs(os.path.join(base_run, name), exist_ok=True)
  for name in SHARED:
    src, dst = os.path.join(base_run, name), os.path.join(variant_run, name)
    if os.path.isdir(src) and not os.path.lexists(dst):
      os.symlink(src, dst)


def sweep(base_cfg, run_dir: str, grid: dict, fixed: dict | None = None,
          budget_s: float | None = None, train_fn=None) -> list[dict]:
  """Trains every variant not yet trained; returns the rows of every finished variant in
  RUN_DIR/sweeps/<model>/ (this call's and earlier ones'), best teacher-forced tau first."""
  if train_fn is None:
    from specjax.training.registry import train as train_fn
  base_run = run_dir_lib.resolve(run_dir)
  name = model_name(base_cfg)
  root = os.path.join(base_run, "sweeps", name)
  for settings in variants(grid):
    cfg = base_cfg.copy_and_resolve_references()
    settings = {**(fixed or {}), **settings}
    for key, value in settings.items():
      set_key(cfg, key, value)
    if budget_s is not None:
      cfg.time_budget_s = float(budget_s)
    variant_run = os.path.join(root, variant_name(settings))
    cfg.run_dir = variant_run
    if finished(run_dir_lib.model_dir(variant_run, name)) is None:
      link_shared(base_run, variant_run, create=["regenerated"] + (
          ["feature_cache"] if cfg.get("feature_cache_store", False) else []))
      with open(os.path.join(variant_run, SETTINGS), "w") as f:
        json.dump(settings, f)
      print(f"[settings_sweep] {name} {variant_name(settings)}", flush=True)
      train_fn(cfg)
      if finished(run_dir_lib.model_dir(variant_run, name)) is None:
        raise SpecjaxError(f"{variant_run} did not finish training")
  rows = collect(root, name)
  with open(os.path.join(root, "sweep.json"), "w") as f:
    json.dump({"model": name, "rows": rows}, f, indent=1)
  return rows


def collect(root: str, name: str) -> list[dict]:
  """A row per finished variant under root, best first."""
  rows = []
  for label in sorted(os.listdir(root)):
    model_dir = os.path.join(root, label, name)
    row = finished(model_dir)
    if row is None:
      continue
    settings = _json(os.path.join(root, label, SETTINGS)) or {}
    budget = budget_lib.decided(model_dir) or {}
    rows.append({"variant": label, "settings": settings,
                 "budget_s": budget.get("time_budget_s", 0.0), "steps": int(row["step"]),
                 "seconds_per_step": budget.get("seconds_per_step"),
                 "val_loss": float(row.get("val_loss", float("nan"))),
                 "teacher_forced_tau": teacher_forced_tau(row)})
  return rank(rows)


def rank(rows: list[dict]) -> list[dict]:
  """Grouped by budget (shortest first: variants are only comparable at equal budgets), best
  first within each: tau to 2 decimals (closer is a tie), then the lower validation loss."""
  return sorted(rows, key=lambda r: (r["budget_s"], -round(r["teacher_forced_tau"], 2),
                                     r["val_loss"]))


def best(rows: list[dict], budget_s: float, key: str):
  """`key`'s value in the best variant trained at budget_s that sets it."""
  for r in rows:
    if r["budget_s"] == budget_s and key in r["settings"]:
      return r["settings"][key]
  raise SpecjaxError(f"no variant at budget {budget_s:g} s sets {key}")


def table(rows) -> str:
  lines = ["| variant | budget s | steps | s / step | val loss | teacher-forced tau |",
           "|---|---|---|---|---|---|"]
  for i, r in enumerate(rows):
    mark = " (best)" if i == 0 or r["budget_s"] != rows[i - 1]["budget_s"] else ""
    sec = "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}"
    lines.append(f"| {r['variant']}{mark} | {r['budget_s']:.0f} | {r['steps']} | {sec} | "
                 f"{r['val_loss']:.3f} | "
                 f"{r['teacher_forced_tau']:.2f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="configs/x.py or configs/x.py:arg")
  parser.add_argument("--run_dir", required=True, help="a run folder with a trained target")
  parser.add_argument("--budget_s", type=float, default=120.0,
                      help="seconds of training steps per variant (0: the config's own)")
  parser.add_argument("--grid", action="append", help="key=v1,v2,... (repeatable)")
  parser.add_argument("--set", action="append", help="key=value for every variant")
  parser.add_argument("--show", action="store_true", help="print the table, train nothing")
  parser.add_argument("--best", default="",
                      help="print KEY's value in the best variant at --budget_s that sets "
                           "it, train nothing")
  args = parser.parse_args(argv)
  from specjax import cli
  with cli.user_errors():
    if args.show or args.best:
      cfg = config_base.load_config_file(args.config)
      name = model_name(cfg)
      root = os.path.join(run_dir_lib.resolve(args.run_dir), "sweeps", name)
      if not os.path.isdir(root):
        raise SpecjaxError(f"{root} does not exist: no sweep of {name} in {args.run_dir}")
      rows = collect(root, name)
      budget_s = args.budget_s or float(cfg.get("time_budget_s", 0))  # 0: the config's own
      print(best(rows, budget_s, args.best) if args.best else table(rows))
      return
    grid = parse_assignments(args.grid, many=True)
    fixed = parse_assignments(args.set, many=False)
    rows = sweep(config_base.load_config_file(args.config), args.run_dir, grid, fixed,
                 args.budget_s if args.budget_s > 0 else None)
    print(table(rows))


if __name__ == "__main__":
  main()
