"""Sweeps for the report: every method over drafts per step K, or over batch size, in one
process (the target, prompts and AR baseline are loaded once).

  python -m specjax.sweep --run_dir=runs/ref --kind=drafts [--values=1,2,4,7] [--temperature=0]
  python -m specjax.sweep --run_dir=runs/ref --kind=batch [--values=1,2,4,8]

`drafts`: K drafts per step (block drafters decode with block_size = K + 1; MTP stops at its
number of heads), at batch 1. `batch`: every method at its decode.py default K, plus DSpark's
load-aware verify budget, at each batch size. Each setting runs AR again, so measured speedup
is always against an AR run of the same batch size in the same process. Writes
run_dir/decode/sweep_<kind>_t<T>.json; `python -m specjax.report` plots it.
"""

from __future__ import annotations

import argparse
import json
import os

import jax

from specjax import config_base, evaluate
from specjax import run_dir as run_dir_lib
from specjax import methods as methods_lib
from specjax.errors import SpecjaxError

DECODE_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "configs", "decode.py")
KINDS = ("drafts", "batch")
DEFAULT_VALUES = {"drafts": "1,2,4,7", "batch": "1,2,4,8"}
KEPT = ("tau", "tau_predicted", "acceptance_per_position", "prefix_acceptance",
        "tokens_per_second", "speedup_vs_ar", "speedup_predicted", "t_ar", "t_verify", "t_draft",
        "seconds_per_step", "num_draft_tokens", "mean_budget", "budget_histogram",
        "mean_verify_width", "lossless_check")


def trained_methods(run_dir: str) -> list[str]:
  """The methods whose drafter run_dir holds (prompt lookup always: it trains nothing)."""
  return [m for m in methods_lib.drafting() if not methods_lib.get(m).trains or
          os.path.isdir(os.path.join(run_dir_lib.model_dir(run_dir, m), "checkpoints"))]


def max_drafts(method: str, run_dir: str) -> int | None:
  """The most drafts per step a trained MTP drafter can propose (None: no limit)."""
  if not method.startswith("mtp_"):
    return None
  return int(run_dir_lib.load_config(run_dir_lib.model_dir(run_dir, method)).num_heads)


def entry_row(method: str, variant: str, setting: dict, e: dict) -> dict:
  return {"method": method, "variant": variant, **setting,
          **{k: e[k] for k in KEPT if k in e}}


def run(run_dir: str, kind: str, values: list[int], temperature: float, num_prompts: int,
        max_new_tokens: int, methods: list[str] | None = None, repeats: int = 2) -> dict:
  if kind not in KINDS:
    raise SpecjaxError(f"--kind must be one of {', '.join(KINDS)}, got '{kind}'")
  cfg = config_base.load_config_file(DECODE_CONFIG)
  cfg.run_dir, cfg.temperature, cfg.num_prompts = run_dir, temperature, num_prompts
  cfg.max_new_tokens, cfg.timing_repeats, cfg.measure_costs = max_new_tokens, repeats, True
  methods = [m for m in (methods or trained_methods(run_dir)) if m != "ar"]
  if kind == "drafts":
    cfg.batch_size = 1
    cfg.cache_len = max(cfg.cache_len, 2 * max_new_tokens + max(values) + 256)
  harness = evaluate.Harness(cfg, ["ar"] + methods)
  rows = []
  for value in values:
    setting = {"K": value, "batch": cfg.batch_size} if kind == "drafts" else {"batch": value}
    if kind == "drafts":
      cfg.num_draft_tokens, cfg.block_size = value, value + 1
    else:
      cfg.batch_size = value
    ar = harness.run("ar", cfg)
    runs = []
    for method in methods:
      limit = max_drafts(method, run_dir)
      if kind == "drafts" and limit is not None and value > limit:
        continue
      runs.append((method, "", harness.run(method, cfg)))
      if kind == "batch":  # the method's own load-dependent settings (DSpark's schedule)
        for variant, settings in methods_lib.get(method).load_variants:
          runs.append((method, variant, harness.run(
              method, methods_lib.with_options(cfg, method, **settings))))
    ar = harness.faster_baseline(ar, cfg)
    rows.append(entry_row("ar", "", setting, {**ar, "speedup_vs_ar": 1.0}))
    for method, variant, e in runs:
      e["speedup_vs_ar"] = e["tokens_per_second"] / ar["tokens_per_second"]
      rows.append(entry_row(method, variant, setting, e))
    print(f"[sweep] {kind}={value} done", flush=True)
  return {"kind": kind, "temperature": temperature, "values": values,
          "num_prompts": len(harness.texts), "max_new_tokens": max_new_tokens, "rows": rows}


def output_path(run_dir: str, kind: str, temperature: float) -> str:
  return os.path.join(run_dir_lib.resolve(run_dir), "decode",
                      f"sweep_{kind}_t{temperature:g}.json")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--kind", default="drafts", choices=KINDS)
  parser.add_argument("--values", default="")
  parser.add_argument("--temperature", type=float, default=0.0)
  parser.add_argument("--methods", default="")
  parser.add_argument("--num_prompts", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args(argv)
  from specjax import cli
  with cli.user_errors():
    values = [int(v) for v in (args.values or DEFAULT_VALUES[args.kind]).split(",")]
    if min(values) < 1:
      raise SpecjaxError(f"--values must be >= 1, got {args.values}")
    methods = evaluate.parse_methods(args.methods)[1:] if args.methods else None
    out = run(args.run_dir, args.kind, values, args.temperature, args.num_prompts,
              args.max_new_tokens, methods, args.repeats)
    if jax.process_index() == 0:
      path = output_path(args.run_dir, args.kind, args.temperature)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        json.dump(out, f, indent=1)
      print(f"[sweep] wrote {path}", flush=True)


if __name__ == "__main__":
  main()
