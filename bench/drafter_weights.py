"""What packing a drafter's weights for the CPU kernel saves: T_draft (seconds a drafter adds
to one decode step, measured in the loop beside the target's pass: costs.draft_cost) with the
drafter's weights as XLA's arrays and packed (Method.prepare_params), the target held as
target_weights says in both, every trained drafter of a run, in one run.

  python bench/drafter_weights.py --run_dir=runs/smollm2 [--methods=dflash,eagle3,...]
      [--context_len=200] [--batch=1] [--out=FILE]

Prints per drafter T_draft xla / packed in ms, their ratio, and T_ar for scale.
"""

from __future__ import annotations

import argparse
import json

import common  # noqa: F401  (puts the repository on sys.path)

from specjax import costs, decode_weights, sweep
from specjax import methods as methods_lib
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.evaluate import lookahead, method_config
from specjax.sampling import Sampler


def trained_methods(run_dir: str) -> list[str]:
  """The run's drafters that have weights to pack (sweep's list of trained drafters)."""
  return [m for m in sweep.trained_methods(run_dir) if methods_lib.get(m).prepare_params]


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--run_dir", default="runs/smollm2")
  p.add_argument("--methods", default="", help="default: every trained drafter in run_dir")
  p.add_argument("--target_weights", default="auto")
  p.add_argument("--context_len", type=int, default=200)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--block_size", type=int, default=8)
  p.add_argument("--num_draft_tokens", type=int, default=7)
  p.add_argument("--draft_tokens", default="mtp_parallel=4,mtp_sequential=4")
  p.add_argument("--reps", type=int, default=15)
  p.add_argument("--inner", type=int, default=20)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  methods = [m for m in args.methods.split(",") if m] or trained_methods(args.run_dir)
  if not methods:
    raise SystemExit(f"no trained drafter in {args.run_dir}")
  cfg = common.decode_config(args.run_dir, 0.0, 1, 16)
  cfg.block_size, cfg.num_draft_tokens = args.block_size, args.num_draft_tokens
  cfg.draft_tokens = args.draft_tokens
  mode = decode_weights.resolve(args.target_weights, args.run_dir)
  if mode == "xla":
    raise SystemExit("target_weights resolves to xla here: nothing is packed")
  target = decode_weights.prepare(run_dir_lib.load_target(args.run_dir), args.run_dir, mode)
  kw = dict(batch=args.batch, context_len=[args.context_len], cache_len=args.context_len + 64,
            sampler=Sampler(), reps=args.reps, inner=args.inner)
  t_ar = costs.verify_costs(target.graphdef, target.params, ns=[1], **kw)[1]
  print(f"target ({mode}) T_ar {t_ar * 1e3:.2f} ms at context {args.context_len}, "
        f"batch {args.batch}", flush=True)
  rows = []
  for name in methods:
    spec = methods_lib.get(name)
    if spec.prepare_params is None:
      raise SpecjaxError(f"{name}: no weights to pack")
    drafter, params = spec.build(method_config(cfg, name), target)
    row = {"method": name, "K": lookahead(name, cfg)}
    for label, p_ in (("xla", params), ("packed", spec.prepare_params(params, mode))):
      row[label] = costs.draft_cost(target.graphdef, target.params, drafter, p_, **kw)
    row["ratio"] = row["xla"] / max(row["packed"], 1e-9)
    rows.append(row)
    print(f"{name:16s} K={row['K']}  T_draft xla {row['xla'] * 1e3:6.2f} ms  packed "
          f"{row['packed'] * 1e3:6.2f} ms  ({row['ratio']:.2f}x faster)", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"target_weights": mode, "t_ar": t_ar, "context_len": args.context_len,
                 "batch": args.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
