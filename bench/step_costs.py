"""The cost curve of the accounting model: seconds for one target pass over n new positions,
for each batch size, at a filled KV cache. Prints T(n)/T(1) and writes the curve to JSON.

  python bench/step_costs.py --run_dir=runs/tiny [--batches=1,4,8] [--max_n=17]
      [--context_len=128] [--out=runs/tiny/step_costs.json]

On an accelerator T(n) stays flat until the pass turns compute-bound, and the knee moves left as
the batch grows; on CPU a tiny target is partly compute-bound already.
"""

from __future__ import annotations

import argparse
import json
import os

import common

from specjax import costs


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--batches", default="1,4,8")
  parser.add_argument("--max_n", type=int, default=17)
  parser.add_argument("--context_len", type=int, default=128)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  graphdef, params, where = common.target_for_timing(args.run_dir)
  ns = sorted({1, 2, 3, 5, 9, args.max_n} | set(range(1, args.max_n + 1, 4)))
  cache_len = args.context_len + args.max_n + 1
  curve = {}
  print(f"target: {where}; context {args.context_len}; fastest of {args.reps}")
  print("batch  " + "  ".join(f"n={n:<3d}" for n in ns) + "   (T(n) / T(1))")
  for batch in [int(b) for b in args.batches.split(",")]:
    t = costs.verify_costs(graphdef, params, batch=batch, ns=ns, context_len=args.context_len,
                           cache_len=cache_len, reps=args.reps)
    curve[str(batch)] = {str(n): s for n, s in t.items()}
    print(f"{batch:<5d}  " + "  ".join(f"{t[n] / t[1]:<5.2f}" for n in ns) +
          f"   T(1) = {t[1] * 1e3:.2f} ms")
  out = args.out or os.path.join(args.run_dir, "step_costs.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"target": where, "context_len": args.context_len, "seconds": curve}, f, indent=1)
  print(f"wrote {out}")
  return curve


if __name__ == "__main__":
  main()
