"""Under load: every method on the same requests at concurrency C, with continuous batching
(specjax.decoding.continuous) and, beside it, static batches of C.

For each C and method, three runs on the same requests (benchmark prompts, chat template):
- `static`: batches of C decoded one after another, each until its slowest row is done;
- `queued`: continuous batching, every request queued at the start;
- `poisson`: continuous batching, requests arriving as a Poisson process at `--load` times
  the request rate AR sustained at that concurrency (queued run).

Printed per run: throughput (generated tokens/s), time to first token and time per output
token (p50 / p90, seconds), speed-up over AR at the same C and mode, host round trips (`run`
and `insert` calls) and occupancy: the slot-steps that worked for a request over all
slot-steps (C x loop steps; static batches lose it to stragglers, continuous batching only
to the queue's tail and to free slots). Greedy outputs are checked against AR's, request by
request. Every figure comes from this one run; compilation is outside the timings (a warm-up
pass per method and C).

  python bench/load.py --run_dir=runs/smollm2 --prompts=humaneval --num_prompts=32 \\
      --methods=ar,prompt_lookup,dflash,dspark,dspark:threshold,dspark:load_aware \\
      --concurrency=1,2,4,8,16,32 --max_new_tokens=128 [--out=RUN/load.json]

A method is a registry name, optionally `name:schedule` for DSpark's verify budget (fixed,
threshold, load_aware; the load-aware schedule's step costs are measured at each C).

  python bench/load.py --merge=RUN/load_a.json,RUN/load_b.json --out=RUN/load_all.json

decodes nothing: it prints the tables and draws one plot of the rows of several runs (a
later file's row replaces an earlier one's for the same method, C and mode; each speed-up
stays the one measured against AR in its own run).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import common  # sets sys.path
import jax
import numpy as np

from specjax import evaluate, methods
from specjax.decoding.common import pad_prompts, to_lists
from specjax.decoding.continuous import Slots, serve
from specjax.errors import SpecjaxError

MODES = ("static", "queued", "poisson")


def parse_method(text):
  name, _, schedule = text.partition(":")
  return name, schedule


def decoder_for(harness, cfg, text, concurrency):
  """(loop, params tuple) for `name[:schedule]` at batch size C."""
  name, schedule = parse_method(text)
  cfg = evaluate.method_config(cfg, name).copy_and_resolve_references()
  cfg.batch_size = concurrency
  if schedule:
    cfg = methods.with_options(cfg, name, schedule=schedule)
  eos = harness.special.eos_ids or harness.special.eos_id
  loop, drafter, dparams = evaluate.make_decoder(name, cfg, harness.target, harness.sampler,
                                                 cfg.cache_len, eos, None,
                                                 harness.weights_mode)
  params = (harness.target.params,) if drafter is None else (harness.target.params, dparams)
  return loop, params


def percentiles(xs):
  return {"p50": float(np.percentile(xs, 50)), "p90": float(np.percentile(xs, 90))}


def bucket_width(lengths, bucket):
  """The longest of `lengths` rounded up to a multiple of `bucket` (0: of 16). Callers pass
  every prompt's length for one width (one compilation), or a batch's / one prompt's."""
  return -(-max(lengths) // (bucket or 16)) * (bucket or 16)


def run_static(loop, params, prompts, concurrency, pad_id, rng, bucket=0):
  """Batches of C, one after another; per-request times as the static server sees them:
  every request of a batch gets its tokens when the batch ends."""
  eos = loop.eos_id
  batches = [prompts[i:i + concurrency] for i in range(0, len(prompts), concurrency)]
  everyone = bucket_width([len(p) for p in prompts], 0)
  padded = []
  for b in batches:
    tokens, lens = pad_prompts(b + [b[-1]] * (concurrency - len(b)), pad_id)
    width = bucket_width(lens, bucket) if bucket else everyone
    padded.append((np.pad(tokens, ((0, 0), (0, width - tokens.shape[1])),
                          constant_values=pad_id), lens))
  for width in sorted({t.shape[1] for t, _ in padded}):  # compile every width untimed
    jax.block_until_ready(loop(*params, *next(x for x in padded if x[0].shape[1] == width),
                               rng))
  outputs, ttft, tpot = [], [], []
  row_steps = slot_steps = 0
  start = time.perf_counter()
  for b, (tokens, lens) in zip(batches, padded):
    t0 = time.perf_counter() - start
    result = jax.device_get(loop(*params, tokens, lens, rng))
    t1 = time.perf_counter() - start
    rows = to_lists(result, eos)[:len(b)]
    outputs += rows
    steps = np.asarray(result.verify_steps_B)
    row_steps += int(steps[:len(b)].sum())
    slot_steps += concurrency * int(steps.max())
    # every request arrived at 0; its first token comes with its batch's prefill (counted
    # from the batch's start: the static loop returns tokens only when the batch ends)
    ttft += [t0] * len(b)
    tpot += [(t1 - t0) / max(1, len(r)) for r in rows]
  wall = time.perf_counter() - start
  return outputs, {"wall": wall, "ttft": ttft, "tpot": tpot, "runs": len(batches),
                   "inserts": 0, "row_steps": row_steps, "slot_steps": slot_steps}


def run_continuous(loop, params, prompts, concurrency, pad_id, rng, arrivals=None,
                   step_bound=8, bucket=0):
  slots = Slots(loop, concurrency)
  # one width (one compiled insert), or each prompt to its bucket
  width = 0 if bucket else bucket_width([len(p) for p in prompts], 0)
  first = {}
  for i, p in enumerate(prompts):
    first.setdefault(width or bucket_width([len(p)], bucket), i)
  # warm-up: compile every insert width, the run loop and the empty state
  serve(slots, params, [prompts[i] for i in first.values()], rng, pad_id=pad_id,
        prompt_width=width, prompt_bucket=bucket)
  served, stats, _ = serve(slots, params, prompts, rng, pad_id=pad_id, arrivals=arrivals,
                           step_bound=step_bound, prompt_width=width, prompt_bucket=bucket)
  return [r.tokens for r in served], {
      "wall": stats["wall"], "ttft": [r.ttft for r in served], "tpot": [r.tpot for r in served],
      "runs": stats["runs"], "inserts": stats["inserts"], "row_steps": stats["row_steps"],
      "slot_steps": stats["slot_steps"]}


def summarize(outputs, raw):
  generated = sum(len(o) + 1 for o in outputs)  # the EOS or the last token counted, as decode
  return {"tokens_per_second": generated / raw["wall"], "wall_seconds": raw["wall"],
          "generated_tokens": generated, "ttft": percentiles(raw["ttft"]),
          "tpot": percentiles(raw["tpot"]), "host_round_trips": raw["runs"] + raw["inserts"],
          "occupancy": raw["row_steps"] / max(1, raw["slot_steps"])}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--run_dir", default="runs/smollm2")
  ap.add_argument("--prompts", default="humaneval")
  ap.add_argument("--num_prompts", type=int, default=32)
  ap.add_argument("--chat_template", type=int, default=1)
  ap.add_argument("--methods", default="ar,prompt_lookup")
  ap.add_argument("--concurrency", default="1,2,4,8,16,32")
  ap.add_argument("--modes", default=",".join(MODES))
  ap.add_argument("--max_new_tokens", type=int, default=128)
  ap.add_argument("--num_draft_tokens", type=int, default=7)
  ap.add_argument("--block_size", type=int, default=8)
  ap.add_argument("--draft_tokens", default="mtp_parallel=4,mtp_sequential=4")
  ap.add_argument("--cache_len", type=int, default=512)
  ap.add_argument("--load", type=float, default=0.7,
                  help="Poisson rate as a fraction of AR's queued request rate at that C")
  ap.add_argument("--step_bound", type=int, default=8)
  ap.add_argument("--prompt_bucket", type=int, default=0,
                  help="pad prompts to a multiple of this (0: all to the longest; one compile)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default="")
  ap.add_argument("--merge", default="",
                  help="comma-separated load JSONs: print and plot their rows, decode nothing")
  args = ap.parse_args(argv)
  if args.merge:
    return merge([f for f in args.merge.split(",") if f], args)
  methods = [m for m in args.methods.split(",") if m]
  modes = [m for m in args.modes.split(",") if m]
  if methods[0] != "ar":
    methods = ["ar"] + [m for m in methods if m != "ar"]
  bad = [m for m in modes if m not in MODES]
  if bad:
    raise SystemExit(f"load.py: unknown mode {bad[0]!r}; known: {', '.join(MODES)}")
  if "poisson" in modes and "queued" not in modes:
    raise SystemExit("load.py: the poisson mode's rate comes from the queued run; add queued")
  cfg = common.load_config("decode.py")
  cfg.update({"run_dir": args.run_dir, "prompts": args.prompts,
              "num_prompts": args.num_prompts, "chat_template": bool(args.chat_template),
              "max_new_tokens": args.max_new_tokens, "num_draft_tokens": args.num_draft_tokens,
              "block_size": args.block_size, "draft_tokens": args.draft_tokens,
              "cache_len": args.cache_len, "measure_costs": False})
  try:
    harness = evaluate.Harness(cfg, [parse_method(m)[0] for m in methods])
  except SpecjaxError as e:
    raise SystemExit(f"load.py: {e}")
  pad = harness.special.pad_id
  prompts = [harness.tokens[i, :harness.lens[i]].tolist() for i in range(len(harness.lens))]
  rng = jax.random.key(args.seed)
  results = []
  for c in [int(x) for x in args.concurrency.split(",")]:
    ar_rate, ar_out = None, {}
    for method in methods:
      loop, params = decoder_for(harness, cfg, method, c)
      for mode in modes:
        if mode == "static":
          out, raw = run_static(loop, params, prompts, c, pad, rng, args.prompt_bucket)
        elif mode == "queued":
          out, raw = run_continuous(loop, params, prompts, c, pad, rng,
                                    bucket=args.prompt_bucket)
        else:
          gaps = np.random.default_rng(args.seed).exponential(1.0 / (args.load * ar_rate),
                                                              len(prompts))
          out, raw = run_continuous(loop, params, prompts, c, pad, rng,
                                    arrivals=np.cumsum(gaps) - gaps[0],
                                    step_bound=args.step_bound, bucket=args.prompt_bucket)
        row = {"method": method, "concurrency": c, "mode": mode, **summarize(out, raw)}
        if method == "ar":
          ar_out[mode] = (out, row["tokens_per_second"])
          if mode == "queued":
            ar_rate = len(prompts) / raw["wall"]
          if mode == "poisson":
            row["arrival_rate"] = args.load * ar_rate
        row["speedup_over_ar"] = row["tokens_per_second"] / ar_out[mode][1]
        if harness.sampler.greedy:
          row["outputs_equal_ar"] = sum(a == b for a, b in zip(out, ar_out[mode][0]))
        results.append(row)
        print(f"C={c:<3d} {method:<20s} {mode:<8s} {row['tokens_per_second']:8.1f} tok/s "
              f"x{row['speedup_over_ar']:.2f}  ttft p50 {row['ttft']['p50']:.2f} "
              f"p90 {row['ttft']['p90']:.2f}  tpot p50 {row['tpot']['p50'] * 1e3:.1f} ms  "
              f"occupancy {row['occupancy']:.2f}  round trips {row['host_round_trips']}  "
              f"equal {row.get('outputs_equal_ar', '-')}/{len(prompts)}", flush=True)
      del loop, params
      jax.clear_caches()
      save(results, args, len(prompts))  # after every method: a stopped run keeps its rows
  print_tables(results)
  out_path = save(results, args, len(prompts))
  print(f"wrote {out_path}")


def merge(paths, args):
  rows = {}
  for path in paths:
    try:
      with open(path) as f:
        found = json.load(f)["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise SystemExit(f"load.py: {path} is not a load.py JSON ({type(e).__name__}: {e})")
    for r in found:
      rows[(r["method"], r["concurrency"], r["mode"])] = r
  results = list(rows.values())
  print_tables(results)
  args.out = args.out or os.path.join(args.run_dir, "load_merged.json")
  print(f"wrote {save(results, args, None)}")


def save(results, args, num_prompts) -> str:
  out_path = args.out or os.path.join(args.run_dir, "load.json")
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "w") as f:
    json.dump({"args": vars(args), "num_prompts": num_prompts, "rows": results}, f, indent=1)
  plot(results, os.path.splitext(out_path)[0] + ".png")
  return out_path


def print_tables(results):
  cs = sorted({r["concurrency"] for r in results})
  for mode in MODES:
    rows = [r for r in results if r["mode"] == mode]
    if not rows:
      continue
    print(f"\n{mode}: tokens/s (speed-up over AR) by concurrency")
    print("| method | " + " | ".join(f"C={c}" for c in cs) + " |")
    print("|---" * (len(cs) + 1) + "|")
    for m in dict.fromkeys(r["method"] for r in rows):
      cells = []
      for c in cs:
        r = next((x for x in rows if x["method"] == m and x["concurrency"] == c), None)
        cells.append("" if r is None else
                     f"{r['tokens_per_second']:.1f} ({r['speedup_over_ar']:.2f}x)")
      print(f"| {m} | " + " | ".join(cells) + " |")
  cont = {(r["method"], r["concurrency"]): r for r in results if r["mode"] == "queued"}
  stat = {(r["method"], r["concurrency"]): r for r in results if r["mode"] == "static"}
  both = sorted(set(cont) & set(stat), key=lambda k: (k[1], k[0]))
  if both:
    print("\ncontinuous (queued) over static batches: throughput ratio; occupancy static -> "
          "continuous")
    for k in both:
      print(f"  C={k[1]:<3d} {k[0]:<20s} {cont[k]['tokens_per_second'] / stat[k]['tokens_per_second']:.2f}x"
            f"  {stat[k]['occupancy']:.2f} -> {cont[k]['occupancy']:.2f}")


def plot(results, path):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return
  modes = [m for m in MODES if any(r["mode"] == m for r in results)]
  methods = list(dict.fromkeys(r["method"] for r in results))
  colors = plt.get_cmap("tab20")(np.linspace(0, 1, 20))
  fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes) + 1, 4), sharey=True,
                           squeeze=False)
  for ax, mode in zip(axes[0], modes):
    rows = [r for r in results if r["mode"] == mode]
    for i, m in enumerate(methods):  # one colour and marker per method in every panel
      pts = sorted((r["concurrency"], r["speedup_over_ar"]) for r in rows if r["method"] == m)
      if pts:
        ax.plot(*zip(*pts), marker="os^vD"[i % 5], color=colors[(2 * i) % 20 + (i >= 10)],
                label=m)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_title(mode)
    ax.set_xlabel("concurrency")
  axes[0][0].set_ylabel("speed-up over AR (throughput)")
  if len(methods) > 1:
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  main()
