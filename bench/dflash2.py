"""DFlash 2 against DFlash on one target, from one run: the same target, regenerated data and
training steps for both drafters.

Rows: dflash | dflash2_no_selector (the DFlash 2 checkpoint proposing from its unary logits,
as DFlash does: the convolutions alone) | dflash2 (the candidate selector). Columns at each
temperature and batch size: tau, a_k, the drafter's own step time T_draft, measured and
predicted speedup over AR (the faster of the AR runs before and after). Then how often the
target's token is the drafter's top-1 against how often it is among its top-K candidates, on
the held-out regenerated blocks (the DFlash 2 paper: 85% against 99.5% for K = 16).

Uses run_dir/dflash and run_dir/dflash2 as they are when they exist (the main job trains both
the same way: block 8, gamma 4, 200 steps, the same regenerated data); a missing one is
trained there that way (--steps), an existing one is never trained further.

  python bench/dflash2.py --run_dir=runs/tiny [--batches=1,4] [--temperatures=1,0]
"""

from __future__ import annotations

import argparse
import json
import os

import common  # sets sys.path

from specjax import methods
from specjax.evaluate import Harness

VARIANTS = (("dflash", "dflash", {}), ("dflash2_no_selector", "dflash2", {"selector": False}),
            ("dflash2", "dflash2", {}))


def validation_topk(run_dir: str) -> dict:
  """The last validation record of run_dir/dflash2: top-1, top-K, block tau with and without
  the selector (teacher-forced, exact for greedy)."""
  path = os.path.join(run_dir, "dflash2", "metrics.jsonl")
  with open(path) as f:
    records = [json.loads(l) for l in f if '"val_top1"' in l]
  last = records[-1]
  return {k[4:]: last[k] for k in ("val_top1", "val_topk", "val_block_tau",
                                   "val_block_tau_unary") if k in last} | {"step": last["step"]}


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--run_dir", default="runs/tiny")
  p.add_argument("--steps", type=int, default=200, help="training steps when not trained yet")
  p.add_argument("--batches", default="1,4")
  p.add_argument("--temperatures", default="1.0,0.0")
  p.add_argument("--num_prompts", type=int, default=16)
  p.add_argument("--max_new_tokens", type=int, default=48)
  p.add_argument("--block_size", type=int, default=8)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--out", default="", help="JSON path (default run_dir/decode/dflash2_bench.json)")
  args = p.parse_args(argv)
  run = args.run_dir
  for method in ("dflash", "dflash2"):
    if not os.path.isdir(os.path.join(run, method, "checkpoints")):
      common.train(f"{method}_tiny.py", run, args.steps, block_size=args.block_size, gamma=4.0)

  rows = []
  for temp in [float(t) for t in args.temperatures.split(",")]:
    cfg = common.decode_config(run, temp, args.num_prompts, args.max_new_tokens)
    cfg.block_size, cfg.timing_repeats = args.block_size, args.repeats
    harness = Harness(cfg, ["ar", "dflash", "dflash2"])
    for batch in [int(b) for b in args.batches.split(",")]:
      cfg.batch_size = batch
      ar = harness.run("ar", cfg)
      entries = []
      for label, method, settings in VARIANTS:
        entries.append((label, harness.run(method,
                                           methods.with_options(cfg, method, **settings))))
      ar = harness.faster_baseline(ar, cfg)
      for label, e in entries:
        rows.append({"variant": label, "T": temp, "batch": batch, "tau": e["tau"],
                     "a_k": e["acceptance_per_position"], "t_draft": e["t_draft"],
                     "t_verify": e["t_verify"], "tok_s": e["tokens_per_second"],
                     "speedup": e["tokens_per_second"] / ar["tokens_per_second"],
                     "predicted": e["speedup_predicted"], "lossless": e["lossless_check"]})
        print(json.dumps(rows[-1]), flush=True)

  print(f"\n{'variant':20s} {'T':>3s} {'b':>2s} {'tau':>5s} {'T_draft':>8s} {'tok/s':>7s} "
        f"{'speedup':>8s} {'pred':>6s}  a_k")
  for r in rows:
    print(f"{r['variant']:20s} {r['T']:3g} {r['batch']:2d} {r['tau']:5.2f} "
          f"{r['t_draft'] * 1e3:6.2f}ms {r['tok_s']:7.1f} {r['speedup']:7.2f}x "
          f"{r['predicted']:5.2f}x  " + " ".join(f"{a:.2f}" for a in r["a_k"]))
  for temp in sorted({r["T"] for r in rows}, reverse=True):
    for batch in sorted({r["batch"] for r in rows}):
      tau = {r["variant"]: r["tau"] for r in rows if r["T"] == temp and r["batch"] == batch}
      print(f"T={temp:g} batch {batch}: DFlash 2 tau {tau['dflash2'] / tau['dflash'] - 1:+.1%} "
            f"over DFlash ({tau['dflash2_no_selector'] / tau['dflash'] - 1:+.1%} without the "
            "selector)")
  val = validation_topk(run)
  print(f"DFlash 2 held-out blocks (step {val['step']}): target token is the top-1 {val['top1']:.1%}, "
        f"among the top-K {val['topk']:.1%}; teacher-forced block tau {val['block_tau']:.2f} "
        f"with the selector, {val['block_tau_unary']:.2f} with the top-1")
  out = args.out or os.path.join(run, "decode", "dflash2_bench.json")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"rows": rows, "validation": val}, f, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
