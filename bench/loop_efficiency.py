"""Does the decode loop deliver what its measured parts predict?

For each method, batch size and temperature: the speedup the accounting model predicts from
tau and the step costs (T_ar, T_verify(K+1) or the verify widths a budgeted drafter used, and
T_draft(K) as specjax.costs prices it: the drafter's propose and commit, its marginal cost
next to the target's pass; at T > 0 each pass includes one draw over the vocabulary), the
measured speedup over AR, and their ratio, the loop's efficiency: 1.0 means the loop costs
nothing beyond the passes.

This machine's speed drifts by 2x over seconds (a bare 0.5 ms target pass, timed 60 times in a
row as 20-call batches: 0.36-0.92 ms), so figures timed minutes apart cannot be compared. The
bench therefore times in rounds, `--rounds` per prompt batch: a round decodes the batch with
AR and with the method, decodes it again with max_new_tokens=1 (the prefill and the first
token only), and times each cost loop at 8 and 16 back-to-back calls, all within a fraction of
a second, every figure right after an untimed run of the same call (a program launched after
another runs its first milliseconds slower). Each raw time is the fastest of its rounds, each
cost a slope (launch cost left out, as in specjax.costs), and each prompt batch gives its own
measured and predicted speedup; the table shows medians over prompt batches (efficiency: the
median of the per-batch ratios, with its 10th-90th percentile range).

Where a step's time goes: "loop step" is the decode's time per step with the prefill taken
out ((wall - wall at 1 token) / steps), "parts" is T_draft + T_verify, so parts / loop step
is the share of a step that the two passes explain (the rest is the loop's verification and
bookkeeping); "apart/together" is the drafter's step and the target's pass timed in loops of
their own over the two timed in one loop (below 1: the models slow each other down, e.g. by
evicting each other's weights from the processor's caches); "fixed" is the prefill call's
share of the wall time. Then the AR step time at a fixed committed length as cache_len grows.

  python bench/loop_efficiency.py --run_dir=runs/tiny [--methods=prompt_lookup,draft]
      [--batches=1,4] [--temperatures=0,1] [--num_prompts=16] [--rounds=3]
      [--cache_lens=256,...,4096]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import common  # sets sys.path
import jax
import jax.numpy as jnp
import numpy as np

from specjax import accounting, costs, evaluate, methods
from specjax.decoding.ar import ARDecoder
from specjax.sampling import Sampler

METHODS = ",".join(methods.drafting())
INNER = 8  # a cost is the slope between INNER and 2 x INNER back-to-back calls


def _wall(fn, *args):
  """Seconds for one call, timed right after an untimed one: a program launched after another
  one runs its first milliseconds slower (thread pool, caches), which would land on whichever
  figure of a round happened to come first."""
  jax.block_until_ready(fn(*args))
  t = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t, out


class Timed:
  """One method's compiled calls at one batch size: its decode at max_new_tokens and at 1
  token (the prefill and the first token), and the passes the accounting model prices."""

  def __init__(self, harness, method, cfg, context_len):
    target, batch = harness.target, cfg.batch_size
    eos_id = harness.special.eos_ids or harness.special.eos_id
    dec, self.drafter, dparams = evaluate.make_decoder(method, cfg, target, harness.sampler,
                                                       cfg.cache_len, eos_id)
    short = dataclasses.replace(dec, max_new_tokens=1)
    extra = () if self.drafter is None else (dparams,)
    self.decode = lambda dec_, t, l, r: dec_(target.params, *extra, t, l, r)
    self.dec, self.short = dec, short
    self.k = evaluate.lookahead(method, cfg)
    budgeted = self.drafter is not None and self.drafter.verify_widths is not None
    self.widths = self.drafter.verify_widths if budgeted else (self.k,)
    kw = dict(batch=batch, context_len=context_len, cache_len=cfg.cache_len)
    cache = costs.context_cache(target.graphdef, target.params, **kw)
    self.verify = {w: (costs.verify_loop(target.graphdef, batch=batch, n=w + 1,
                                         sampler=harness.sampler), (target.params, cache))
                   for w in self.widths}
    # the target's pass alone, to take out of the joint loop (which draws no token from it)
    self.pass_only = (costs.verify_loop(target.graphdef, batch=batch, n=self.k + 1),
                      (target.params, cache))
    self.draft = self.together = None
    if self.drafter is not None:
      init, many = costs.draft_loop(target.graphdef, self.drafter, batch=batch,
                                    cache_len=cfg.cache_len, sampler=harness.sampler)
      state, verified = init(target.params, dparams,
                             jnp.full((batch, int(context_len)), 3, jnp.int32))
      self.draft = (many, (target.params, dparams, state, verified))
      together = costs.step_loop(target.graphdef, self.drafter, batch=batch,
                                 cache_len=cfg.cache_len, sampler=harness.sampler)
      self.together = (together, (target.params, dparams, state, verified))
    self.calls = [v for v in self.verify.values()] + (
        [self.draft, self.together, self.pass_only] if self.draft else [])

  def warm_up(self, tokens, lens, rng):
    for dec in (self.dec, self.short):
      jax.block_until_ready(self.decode(dec, tokens, lens, rng))
    for fn, args in self.calls:
      jax.block_until_ready(fn(*args, INNER))

  def round(self, tokens, lens, rng) -> dict:
    """One sample of every timed figure for one prompt batch (raw seconds), and the result."""
    times = {"wall": None, "fixed": _wall(self.decode, self.short, tokens, lens, rng)[0]}
    times["wall"], result = _wall(self.decode, self.dec, tokens, lens, rng)
    for w, (fn, args) in self.verify.items():
      times[f"verify{w}"] = _wall(fn, *args, INNER)[0], _wall(fn, *args, 2 * INNER)[0]
    if self.draft is not None:
      for name, (fn, args) in (("draft", self.draft), ("together", self.together),
                               ("pass", self.pass_only)):
        times[name] = _wall(fn, *args, INNER)[0], _wall(fn, *args, 2 * INNER)[0]
    return {"times": times, "result": result}

  def figures(self, samples, real: int) -> dict:
    """A prompt batch's figures from several rounds: each raw time the fastest of its samples
    (noise only adds time), costs as slopes (launch cost left out, as in specjax.costs)."""
    fast = {key: np.min([s["times"][key] for s in samples], axis=0)
            for key in samples[0]["times"]}
    # a slope lost in the noise falls back to the launch-inclusive figure, as in costs.slopes
    slope = lambda key: (float(fast[key][1] - fast[key][0]) / INNER if fast[key][1] > fast[key][0]
                         else float(fast[key][1]) / (2 * INNER))
    result = samples[0]["result"]  # every round decodes the same tokens (same key)
    t_verify = {w: slope(f"verify{w}") for w in self.widths}
    if len(self.widths) > 1:  # the widths this batch's steps verified at
      hist = np.asarray(result.width_counts)[list(self.widths)]
      verify = float((hist * [t_verify[w] for w in self.widths]).sum() / max(hist.sum(), 1))
    else:
      verify = t_verify[self.widths[0]]
    counts = np.asarray(result.accept_counts)
    t_draft = max(slope("together") - slope("pass"), 0.0) if self.draft else 0.0
    bare = slope("pass") if self.draft else t_verify[self.widths[-1]]
    return {"wall": fast["wall"], "fixed": fast["fixed"],
            "steps": int(result.target_calls) - 1,
            "tokens": int(np.asarray(result.num_tokens_B)[:real].sum()),
            "tau": 1.0 if self.drafter is None else accounting.measured_tau(counts),
            # T_draft as the accounting model prices it (specjax.costs.draft_cost): the
            # drafter's marginal cost next to the target's pass over K + 1 positions
            "parts": t_draft + verify,
            "together": slope("together") if self.draft else bare,
            "apart": (slope("draft") if self.draft else 0.0) + bare}


def _ms(x):
  return f"{x * 1e3:.2f}ms"


def efficiency_rows(args, methods):
  rows = [("T", "batch", "method", "tau", "predicted", "measured", "efficiency (p10-p90)",
           "loop step", "parts", "parts/step", "apart/together", "fixed")]
  for temperature in [float(t) for t in args.temperatures.split(",")]:
    cfg = common.decode_config(args.run_dir, temperature, args.num_prompts,
                               args.max_new_tokens)
    cfg.measure_costs = False
    harness = evaluate.Harness(cfg, ["ar"] + methods)
    context = int(np.mean(harness.lens)) + args.max_new_tokens // 2
    for batch in [int(b) for b in args.batches.split(",")]:
      cfg.batch_size = batch
      batches, real = evaluate.make_batches(harness.tokens, harness.lens, batch)
      rng = jax.random.key(cfg.seed)
      ar = Timed(harness, "ar", cfg, context)
      ar.warm_up(*batches[0], rng)
      for method in ["ar"] + methods:
        timed = ar if method == "ar" else Timed(harness, method, cfg, context)
        timed.warm_up(*batches[0], rng)
        pairs = []
        for i, (tokens, lens) in enumerate(batches):
          key = jax.random.fold_in(rng, i)
          base, own = [], []
          for _ in range(args.rounds):  # AR and the method alternate: the same moments
            base.append(ar.round(tokens, lens, key))
            own.append(base[-1] if method == "ar" else timed.round(tokens, lens, key))
          pairs.append((ar.figures(base, real[i]), timed.figures(own, real[i])))
        rows.append(_row(temperature, batch, method, pairs))
      print(f"[loop_efficiency] T={temperature:g} batch {batch} done", flush=True)
  return rows


def _row(temperature, batch, method, pairs):
  """Medians over prompt batches of one method's figures against AR's at the same moments."""
  # a batch that hit EOS with its first token ran no step (at T > 0): nothing to compare
  pairs = [(a, m) for a, m in pairs if a["steps"] and m["steps"]]
  med = lambda xs: float(np.median(xs))
  measured = [(m["tokens"] / m["wall"]) / (a["tokens"] / a["wall"]) for a, m in pairs]
  # AR's own row: its loop against one bare target pass per token
  # the decode's time in its steps (the prefill call taken out, unless noise swallowed it)
  stepping = lambda e: (e["wall"] - e["fixed"] if e["wall"] > e["fixed"] else e["wall"])
  predicted = [m["tau"] * a["parts"] / m["parts"] if method != "ar" else
               a["parts"] * a["steps"] / stepping(a) for a, m in pairs]
  ratio = [x / y for x, y in zip(measured, predicted)] if method != "ar" else predicted
  loop = [stepping(m) / m["steps"] for _, m in pairs]
  parts = [m["parts"] for _, m in pairs]
  lo, hi = np.percentile(ratio, [10, 90])
  return (f"{temperature:g}", str(batch), method, f"{med([m['tau'] for _, m in pairs]):.2f}",
          f"{med(predicted):.2f}x" if method != "ar" else "1.00x",
          f"{med(measured):.2f}x", f"{med(ratio):.2f} ({lo:.2f}-{hi:.2f})", _ms(med(loop)),
          _ms(med(parts)), f"{med([p / s for p, s in zip(parts, loop)]):.2f}",
          f"{med([m['apart'] / m['together'] for _, m in pairs]):.2f}",
          f"{med([m['fixed'] / m['wall'] for _, m in pairs]):.0%}")


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
  parser.add_argument("--rounds", type=int, default=3, help="rounds per prompt batch")
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
