"""Speculative decoding vs the AR baseline on the trained tiny target, from one run.

For each batch size and number of drafts K: tau, tokens/s, measured speedup vs AR (timed in
the same process on the same prompts) and the speedup the accounting model predicts from
tau and the measured step costs T_ar, T_verify(K+1), T_draft(K).

  python bench/speculative.py --run_dir=runs/tiny [--methods=prompt_lookup,draft]
      [--temperature=1.0] [--ks=2,4,8] [--batches=1,4] [--num_prompts=16]
"""

from __future__ import annotations

import argparse

import common  # sets sys.path

from specjax import evaluate
from specjax import methods
from specjax.errors import SpecjaxError


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--methods",
                      default="prompt_lookup,draft,mtp_parallel,mtp_sequential,dflash")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--ks", default="2,4,8")
  parser.add_argument("--block_sizes", default="4,8,16")
  parser.add_argument("--batches", default="1,4")
  parser.add_argument("--num_prompts", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  args = parser.parse_args(argv)
  cfg = common.decode_config(args.run_dir, args.temperature, args.num_prompts,
                             args.max_new_tokens)
  methods = [m for m in args.methods.split(",") if m]
  ks = [int(k) for k in args.ks.split(",")]
  blocks = [int(b) for b in args.block_sizes.split(",")]
  cfg.block_size = max(blocks)
  cfg.num_draft_tokens = max(ks)
  harness = evaluate.Harness(cfg, ["ar"] + methods)
  print(f"target {args.run_dir}, {len(harness.texts)} prompts, {cfg.max_new_tokens} new tokens, "
        f"temperature {cfg.temperature}")
  header = ("batch", "method", "K", "tau", "a_1..a_K", "tok/s", "speedup", "predicted")
  rows = [header]
  for batch in [int(b) for b in args.batches.split(",")]:
    cfg.batch_size = batch
    ar = harness.run("ar", cfg)
    ar_row = len(rows)
    rows.append(None)
    entries = []
    for method in methods:
      sizes = blocks if methods.get(method).sized_by_block else ks
      for size in sizes:
        if methods.get(method).sized_by_block:
          cfg.block_size = size
        else:
          cfg.num_draft_tokens = size
        try:
          e = harness.run(method, cfg)
        except SpecjaxError as err:  # e.g. K beyond the heads an MTP drafter was trained with
          print(f"skipped {method} at {size}: {err}")
          continue
        entries.append((method, e))
    ar = harness.faster_baseline(ar, cfg)  # AR timed before and after; the faster counts
    rows[ar_row] = (str(batch), "ar", "0", "1.00", "-", f"{ar['tokens_per_second']:.0f}",
                    "1.00x", "1.00x")
    for method, e in entries:
      accept = " ".join(f"{a:.2f}" for a in e["acceptance_per_position"])
      rows.append((str(batch), method, str(e["num_draft_tokens"]), f"{e['tau']:.2f}", accept,
                   f"{e['tokens_per_second']:.0f}",
                   f"{e['tokens_per_second'] / ar['tokens_per_second']:.2f}x",
                   f"{e['speedup_predicted']:.2f}x"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
  main()
