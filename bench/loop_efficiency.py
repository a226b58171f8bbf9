"""Does the decode loop deliver what its measured parts predict?

For each method, batch size and temperature: the speedup the accounting model predicts from
tau and the step costs measured in the same run (T_ar, T_verify(K+1), T_draft(K), the last
including the drafter's commit), the measured speedup over AR (same prompts, same process),
and their ratio, the loop's efficiency: 1.0 means the loop costs nothing beyond the passes.
Then the AR step time at a fixed committed length as cache_len grows.

  python bench/loop_efficiency.py --run_dir=runs/tiny [--methods=prompt_lookup,draft]
      [--batches=1,4] [--temperatures=0,1] [--num_prompts=16] [--cache_lens=256,...,4096]
"""

from __future__ import annotations

import argparse
import time

import common  # sets sys.path
import jax
import numpy as np

from specjax import evaluate
from specjax.decoding.ar import ARDecoder
from specjax.sampling import Sampler

METHODS = "prompt_lookup,draft,mtp_parallel,mtp_sequential,dflash,dspark,dflash2"


def efficiency_rows(args, methods):
  rows = [("T", "batch", "method", "tau", "predicted", "measured", "efficiency",
           "s/step", "T_draft+T_verify")]
  for temperature in [float(t) for t in args.temperatures.split(",")]:
    cfg = common.decode_config(args.run_dir, temperature, args.num_prompts,
                               args.max_new_tokens)
    cfg.timing_repeats = args.repeats
    harness = evaluate.Harness(cfg, ["ar"] + methods)
    for batch in [int(b) for b in args.batches.split(",")]:
      cfg.batch_size = batch
      ar = harness.run("ar", cfg)
      entries = [(m, harness.run(m, cfg)) for m in methods]
      ar = harness.faster_baseline(ar, cfg)  # timed before and after; the faster counts
      # AR's own row: its loop against one bare target pass per token
      ar_eff = ar["t_ar"] / ar["seconds_per_step"]
      rows.append((f"{temperature:g}", str(batch), "ar", "1.00", "1.00x", "1.00x",
                   f"{ar_eff:.2f}", f"{ar['seconds_per_step'] * 1e3:.2f}ms",
                   f"{ar['t_ar'] * 1e3:.2f}ms"))
      for method, e in entries:
        measured = e["tokens_per_second"] / ar["tokens_per_second"]
        predicted = e["speedup_predicted"]
        rows.append((f"{temperature:g}", str(batch), method, f"{e['tau']:.2f}",
                     f"{predicted:.2f}x", f"{measured:.2f}x", f"{measured / predicted:.2f}",
                     f"{e['seconds_per_step'] * 1e3:.2f}ms",
                     f"{(e['t_draft'] + e['t_verify']) * 1e3:.2f}ms"))
      print(f"[loop_efficiency] T={temperature:g} batch {batch} done", flush=True)
  return rows


def ar_step_vs_cache_len(args):
  """Seconds per AR step with the same prompts and new tokens, at growing cache_len."""
  graphdef, params, where = common.target_for_timing(args.run_dir)
  p, n = 64, 64
  tokens = np.full((1, p), 5, np.int32)
  lens = np.full((1,), p, np.int32)
  rows = [("cache_len", "ms/step", "vs first")]
  first = None
  for cache_len in [int(c) for c in args.cache_lens.split(",")]:
    dec = ARDecoder(graphdef, Sampler(), n, cache_len, -1)
    jax.block_until_ready(dec(params, tokens, lens, jax.random.key(0)))
    times = []
    for _ in range(5):
      t = time.perf_counter()
      jax.block_until_ready(dec(params, tokens, lens, jax.random.key(0)))
      times.append(time.perf_counter() - t)
    step = float(np.median(times)) / n
    first = first or step
    rows.append((str(cache_len), f"{step * 1e3:.3f}", f"{step / first:.2f}x"))
  return where, rows


def print_rows(rows):
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--methods", default=METHODS)
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--batches", default="1,4")
  parser.add_argument("--num_prompts", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cache_lens", default="256,512,1024,2048,4096")
  args = parser.parse_args(argv)
  methods = [m for m in args.methods.split(",") if m]
  if methods:
    rows = efficiency_rows(args, methods)
    print(f"target {args.run_dir}, {args.num_prompts} prompts, {args.max_new_tokens} new tokens")
    print_rows(rows)
  if args.cache_lens:
    where, rows = ar_step_vs_cache_len(args)
    print(f"\nAR step time at a fixed committed length (64 + 64 tokens), batch 1, {where}")
    print_rows(rows)


if __name__ == "__main__":
  main()
