"""DSpark against DFlash on one target, from one run: the same target, training steps and
regenerated data for every variant.

Uses --source_run's DFlash and DSpark as they are (the main job trains both, and DFlash 2, on
equal terms: block 8, gamma 4, 200 steps, the same regenerated data); trains what is missing
that way, and DSpark without the Markov head (markov_rank=0) into --out with a copy of the
target and the same data. Then, at T=1 and
T=0 and each batch size: tau, a_k, tokens/s, measured vs predicted speedup for
  dflash | dspark_no_markov (fixed) | dspark_fixed | dspark_load_aware,
the Markov walk's cost per step, the cost of each compiled verify width, and a plot of the
load-aware budget against batch size.

  python bench/dspark.py --source_run=runs/tiny --out=/tmp/dspark_bench [--steps=200]
"""

from __future__ import annotations

import argparse
import json
import os

import common  # sets sys.path

from specjax import costs
from specjax import methods as drafters
from specjax.evaluate import Harness
from specjax.sampling import Sampler


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--source_run", default="runs/tiny")
  p.add_argument("--out", default="/tmp/dspark_bench")
  p.add_argument("--steps", type=int, default=200, help="for models not trained yet")
  p.add_argument("--batches", default="1,4,8")
  p.add_argument("--temperatures", default="1.0,0.0")
  p.add_argument("--num_prompts", type=int, default=16)
  p.add_argument("--max_new_tokens", type=int, default=48)
  p.add_argument("--block_size", type=int, default=8)
  args = p.parse_args(argv)
  main_run = args.source_run
  plain_run = common.prepare(args.source_run, os.path.join(args.out, "no_markov"))
  same = dict(block_size=args.block_size, gamma=4.0)
  for method in ("dflash", "dspark"):
    if not os.path.isdir(os.path.join(main_run, method, "checkpoints")):
      common.train(f"{method}_tiny.py", main_run, args.steps, **same)
  if not os.path.isdir(os.path.join(plain_run, "dspark", "checkpoints")):
    common.train("dspark_tiny.py", plain_run, args.steps, markov_rank=0, **same)

  variants = [("dflash", "dflash", main_run, {}),
              ("dspark_no_markov", "dspark", plain_run, {"schedule": "fixed"}),
              ("dspark_fixed", "dspark", main_run, {"schedule": "fixed"}),
              ("dspark_load_aware", "dspark", main_run, {"schedule": "load_aware"})]
  rows, budgets, extra = [], {}, {}
  for temp in [float(t) for t in args.temperatures.split(",")]:
    for batch in [int(b) for b in args.batches.split(",")]:
      cfg = common.decode_config(main_run, temp, args.num_prompts, args.max_new_tokens)
      cfg.batch_size, cfg.block_size, cfg.timing_repeats = batch, args.block_size, 1
      harness = Harness(cfg, ["ar", "dflash", "dspark"])
      ar = harness.run("ar", cfg)
      for label, method, run, settings in variants:
        cfg.run_dir = run
        e = harness.run(method, drafters.with_options(cfg, method, **settings))
        rows.append({"variant": label, "T": temp, "batch": batch, "tau": e["tau"],
                     "a_k": e["acceptance_per_position"],
                     "tok_s": e["tokens_per_second"],
                     "speedup": e["tokens_per_second"] / ar["tokens_per_second"],
                     "predicted": common.predicted(e), "mean_budget": e.get("mean_budget"),
                     "lossless": e["lossless_check"],
                     "width_seconds": e.get("verify_width_seconds")})
        if settings.get("schedule") == "load_aware":
          budgets[(temp, batch)] = e["mean_budget"]
        print(json.dumps(rows[-1]), flush=True)
      cfg.run_dir = main_run
      if temp == 1.0:  # the Markov walk's cost per step: DSpark with and without it
        k = args.block_size - 1
        kw = dict(batch=batch, context_len=48 + args.max_new_tokens // 2,
                  cache_len=cfg.cache_len, sampler=Sampler(temp))
        walk = {}
        for label, run in (("markov", main_run), ("no_markov", plain_run)):
          cfg.run_dir = run
          d, dp = drafters.build("dspark", drafters.with_options(cfg, "dspark", schedule="fixed"),
                                 harness.target)
          walk[label] = costs.draft_cost(harness.target.graphdef, harness.target.params, d, dp,
                                         **kw)
        widths = costs.verify_costs(harness.target.graphdef, harness.target.params,
                                    ns=[w + 1 for w in (0, 1, 2, 4, k)],
                                    **{x: kw[x] for x in ("batch", "context_len",
                                                         "cache_len")})
        extra[batch] = {"draft_seconds": walk, "verify_seconds_by_drafts":
                        {w - 1: s for w, s in widths.items()}}
        print(json.dumps({"batch": batch, **extra[batch]}), flush=True)

  print(f"\n{'variant':18s} {'T':>3s} {'b':>2s} {'tau':>5s} {'tok/s':>8s} {'speedup':>8s} "
        f"{'pred':>6s} {'budget':>6s}  a_k")
  for r in rows:
    b = "-" if r["mean_budget"] is None else f"{r['mean_budget']:.2f}"
    print(f"{r['variant']:18s} {r['T']:3g} {r['batch']:2d} {r['tau']:5.2f} {r['tok_s']:8.1f} "
          f"{r['speedup']:7.2f}x {r['predicted']:5.2f}x {b:>6s}  "
          + " ".join(f"{a:.2f}" for a in r["a_k"]))
  for batch, e in extra.items():
    m, n = e["draft_seconds"]["markov"], e["draft_seconds"]["no_markov"]
    print(f"batch {batch}: draft step {m * 1e3:.3f} ms with the Markov walk, {n * 1e3:.3f} ms "
          f"without (walk {(m - n) * 1e3:+.3f} ms); verify ms by drafts: "
          + ", ".join(f"{w}: {s * 1e3:.3f}" for w, s in e["verify_seconds_by_drafts"].items()))
  with open(os.path.join(args.out, "dspark_bench.json"), "w") as f:
    json.dump({"rows": rows, "costs": extra,
               "load_aware_budget": {f"T{t:g}_b{b}": v for (t, b), v in budgets.items()}}, f,
              indent=1)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for temp in sorted({t for t, _ in budgets}):
    xs = sorted(b for t, b in budgets if t == temp)
    ax.plot(xs, [budgets[(temp, b)] for b in xs], marker="o", label=f"T={temp:g}")
  ax.set(xlabel="batch size (concurrent rows)", ylabel="mean admitted drafts per row",
         title="DSpark load-aware verify budget")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "dspark_budget.png"), dpi=100)
  print(f"wrote {args.out}/dspark_bench.json and dspark_budget.png")


if __name__ == "__main__":
  main()
