"""The evaluation harness behind decode.py: every method on the same prompts, in one process.

For each method: build the decoder, compile it on the first batch (warm-up), then time all
batches. Writes the metrics of SPEC section 4 to `output_json`, a plot of per-position
acceptance beside it, and prints one table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np

from specjax import accounting, costs, decode_weights, sharding
from specjax import run_dir as run_dir_lib
from specjax.data import benchmarks, chat
from specjax.data import tokenizer as tokenizer_lib
from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import DecodeResult, check_fits, pad_prompts, to_lists
from specjax.sampling import Sampler
from specjax.decoding.speculative import SpeculativeDecoder
from specjax import methods as methods_lib
from specjax.errors import SpecjaxError


def parse_methods(text) -> list[str]:
  names = [m.strip() for m in (text.split(",") if isinstance(text, str) else text) if m.strip()]
  if not names:
    raise SpecjaxError("--config.methods is empty; e.g. --config.methods=ar,prompt_lookup,draft")
  for n in names:
    methods_lib.get(n)  # unknown: a one-line error naming the known methods
  # AR runs first, always: it is the baseline for speedup and losslessness.
  return ["ar"] + [n for n in dict.fromkeys(names) if n != "ar"]


def distinct_ngram_ratio(outputs: list[list[int]], n: int = 4) -> float:
  """Distinct n-grams over all n-grams, per output, summed: low means repetition."""
  distinct = total = 0
  for ids in outputs:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    distinct += len(set(grams))
    total += len(grams)
  return distinct / total if total else float("nan")


def method_config(cfg, method: str):
  """cfg as `method` decodes with it: `draft_tokens` ("mtp_parallel=4,draft=7") overrides
  num_draft_tokens per method (MTP can draft no more tokens than it has heads)."""
  text = str(cfg.get("draft_tokens", "") or "")
  over = {}
  for item in [i.strip() for i in text.split(",") if i.strip()]:
    name, _, k = item.partition("=")
    if not k.strip().isdigit() or int(k) < 1:
      raise SpecjaxError(f"draft_tokens={text!r}: expected method=K pairs, e.g. mtp_parallel=4")
    methods_lib.get(name.strip())  # an unknown method is a one-line error
    over[name.strip()] = int(k)
  if method not in over:
    return cfg
  out = cfg.copy_and_resolve_references()
  out.num_draft_tokens = over[method]
  return out


def lookahead(method: str, cfg) -> int:
  """Draft tokens per step for a method (0 for AR)."""
  return methods_lib.num_drafts(method, method_config(cfg, method))


def make_decoder(method: str, cfg, target, sampler: Sampler, cache_len: int, eos_id: int,
                 layout=None, weights_mode: str = "xla"):
  """(decoder, drafter, drafter params); AR has no drafter. With a sharding.Layout the loop
  runs over its mesh and the drafter's parameters are placed on it; a drafter's weights are
  held as `weights_mode` says (decode_weights, methods.build)."""
  spec = methods_lib.get(method)
  if spec.build is None:
    return ARDecoder(target.graphdef, sampler, cfg.max_new_tokens, cache_len, eos_id,
                     layout=layout), None, None
  drafter, params = methods_lib.build(method, cfg, target, weights_mode, layout)
  decoder = SpeculativeDecoder(target.graphdef, sampler, cfg.max_new_tokens, cache_len, eos_id,
                               layout=layout, drafter=drafter,
                               record_steps=bool(cfg.get("record_steps", False)))
  return decoder, drafter, params


def run_batches(call, batches, rng, repeats: int = 2,
                gather=jax.device_get) -> tuple[list[DecodeResult], float]:
  """Runs every batch after one warm-up call (compilation) and returns the results and the
  wall time of a pass over all batches: each batch's fastest of `repeats` timed calls, summed.
  Noise only ever adds time, and on a shared machine a short call finds a quiet moment far
  more often than a whole pass does. Outputs are identical across repeats (same keys)."""
  jax.block_until_ready(call(*batches[0], rng))
  walls = np.full((max(1, repeats), len(batches)), np.inf)
  for rep in range(walls.shape[0]):
    results = []
    for i, (tokens, lens) in enumerate(batches):
      t0 = time.perf_counter()
      results.append(jax.block_until_ready(call(tokens, lens, jax.random.fold_in(rng, i))))
      walls[rep, i] = time.perf_counter() - t0
  return [gather(r) for r in results], float(walls.min(0).sum())


def summarize(method, results, wall, batch_sizes, eos_id, k):
  counts = np.sum([np.asarray(r.accept_counts) for r in results], axis=0)
  outputs, generated = [], 0
  for r, real in zip(results, batch_sizes):
    rows = to_lists(r, eos_id)[:real]
    outputs.extend(rows)
    generated += int(np.asarray(r.num_tokens_B)[:real].sum())
  if k == 0:  # the AR baseline: no drafts
    acceptance, tau = [], 1.0
  else:
    acceptance = accounting.acceptance_from_counts(counts)
    tau = accounting.measured_tau(counts)
  finite = [a if not math.isnan(a) else 0.0 for a in acceptance]
  return outputs, {
      "tau": tau,
      "acceptance_per_position": acceptance,
      "prefix_acceptance": accounting.prefix_products(finite),
      "tau_predicted": accounting.expected_tokens(finite),
      "accept_histogram": [int(c) for c in counts],
      "tokens_per_second": generated / wall,
      "wall_seconds": wall,
      "target_calls": int(sum(int(r.target_calls) for r in results)),
      # wall time per loop iteration (one target pass + drafting + bookkeeping), measured
      "seconds_per_step": wall / max(1, sum(int(r.target_calls) for r in results)),
      "generated_tokens": generated,
      "num_draft_tokens": k,
  }


def make_batches(tokens, lens, batch_size):
  """Fixed-shape batches (the last one padded by repeating its last prompt) and the number of
  real rows in each: one compilation per method."""
  batches, real = [], []
  for start in range(0, len(lens), batch_size):
    rows = list(range(start, min(start + batch_size, len(lens))))
    real.append(len(rows))
    rows += [rows[-1]] * (batch_size - len(rows))
    batches.append((tokens[rows], lens[rows]))
  return batches, real


class Harness:
  """The target, tokenizer and prompts of one evaluation, shared by every method run."""

  def __init__(self, cfg, methods):
    if cfg.max_new_tokens < 1:
      raise SpecjaxError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    if cfg.batch_size < 1:
      raise SpecjaxError(f"batch_size must be >= 1, got {cfg.batch_size}")
    self.sampler = Sampler(cfg.temperature, cfg.top_k, cfg.top_p)
    self.layout = sharding.decode_layout(cfg)
    self.weights_mode = decode_weights.resolve(cfg.get("target_weights", "xla"), cfg.run_dir,
                                               self.layout)
    self.target = run_dir_lib.load_target(cfg.run_dir)
    if self.layout is not None:
      self.target = dataclasses.replace(self.target,
                                        params=self.layout.params(self.target.params))
    self.target = decode_weights.prepare(self.target, cfg.run_dir, self.weights_mode)
    self.tok = run_dir_lib.load_tokenizer(cfg.run_dir)
    self.special = run_dir_lib.load_special_ids(cfg.run_dir)
    self.prompts = benchmarks.load(cfg.prompts, cfg.num_prompts)
    self.texts = [p.text for p in self.prompts]
    self.rendered, ids = self.encode_prompts(cfg)
    self.tokens, self.lens = pad_prompts(ids, self.special.pad_id)
    check_fits(self.lens, cfg.max_new_tokens, max(lookahead(m, cfg) for m in methods),
               cfg.cache_len)
    self.ar_outputs = None

  def encode_prompts(self, cfg):
    """(the chat-rendered texts, None without a chat template; every prompt's ids)."""
    if not cfg.chat_template:
      if any(p.earlier for p in self.prompts):
        raise SpecjaxError(f"--config.prompts={cfg.prompts} continues a conversation; add "
                           "--config.chat_template=true")
      return None, [tokenizer_lib.encode(self.tok, t, self.special) for t in self.texts]
    template = chat.load(cfg.run_dir, self.tok, self.special)
    rendered = chat.render_prompts(template, self.prompts, self.tok,
                                   lambda ids: self.greedy(cfg, ids))
    return rendered, [chat.encode(self.tok, r) for r in rendered]

  def greedy(self, cfg, ids) -> list[list[int]]:
    """The target's greedy AR continuation of each prompt, EOS dropped."""
    tokens, lens = pad_prompts(ids, self.special.pad_id)
    check_fits(lens, cfg.max_new_tokens, 0, cfg.cache_len)
    eos_id = self.special.eos_ids or self.special.eos_id
    decoder = ARDecoder(self.target.graphdef, Sampler(), cfg.max_new_tokens, cfg.cache_len,
                        eos_id, layout=self.layout)
    gather = jax.device_get if self.layout is None else self.layout.gather
    batches, real = make_batches(tokens, lens, cfg.batch_size)
    outputs = []
    for (t, l), n in zip(batches, real):
      if self.layout is not None:
        t, l = self.layout.rows(t), self.layout.rows(l)
      result = gather(decoder(self.target.params, t, l, jax.random.key(cfg.seed)))
      outputs += to_lists(result, eos_id)[:n]
    return outputs

  def run(self, method: str, cfg) -> dict:
    """Decodes every prompt with one method and returns its SPEC section 4 entry."""
    cfg = method_config(cfg, method)
    sampler, target = self.sampler, self.target
    batches, batch_sizes = make_batches(self.tokens, self.lens, cfg.batch_size)
    eos_id = self.special.eos_ids or self.special.eos_id  # stop on any EOS the model names
    decoder, drafter, dparams = make_decoder(method, cfg, target, sampler, cfg.cache_len, eos_id,
                                             self.layout, self.weights_mode)
    if self.layout is not None:
      batches = [(self.layout.rows(t), self.layout.rows(l)) for t, l in batches]
    if drafter is None:
      call = lambda t, l, r: decoder(target.params, t, l, r)
    else:
      call = lambda t, l, r: decoder(target.params, dparams, t, l, r)
    gather = jax.device_get if self.layout is None else self.layout.gather
    results, wall = run_batches(call, batches, jax.random.key(cfg.seed), cfg.timing_repeats,
                                gather)
    k = lookahead(method, cfg)
    outputs, metrics = summarize(method, results, wall, batch_sizes, eos_id, k)
    if k == 0:  # the baseline every other method's output is checked against
      self.ar_outputs = outputs
    greedy = sampler.greedy and self.ar_outputs is not None
    mismatches = sum(a != b for a, b in zip(outputs, self.ar_outputs)) if greedy else None
    entry = {
        "method": method,
        "num_prompts": len(self.texts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "batch_size": cfg.batch_size,
        "target_weights": self.weights_mode,
        **metrics,
        "distinct_4gram": distinct_ngram_ratio(outputs),
        "lossless_check": (mismatches == 0) if greedy else None,
        "mismatched_outputs": mismatches,
        "outputs": [output_entry(p, r, o, self.tok) for p, r, o in
                    zip(self.prompts, self.rendered or [None] * len(outputs), outputs)],
    }
    if methods_lib.get(method).sized_by_block:
      entry["block_size"] = cfg.block_size
    if results[0].committed_BxN is not None:  # cfg.record_steps: tokens committed per step
      entry["committed_per_step"] = [
          [int(n) for n in row if n >= 0] for r, real in zip(results, batch_sizes)
          for row in np.asarray(r.committed_BxN)[:real]]
    entry.update(budget_metrics(results, drafter))
    if cfg.measure_costs:
      entry.update(step_costs(cfg, target, drafter, dparams, sampler, self.lens, k))
      entry["speedup_predicted"] = accounting.predicted_speedup(
          entry["tau"], entry["t_ar"], entry["t_draft"], entry["t_verify"])
      # what the loop pays per step beyond drafting and the target pass (verification,
      # commits, cache bookkeeping): the gap between predicted and measured speedup
      entry["step_overhead"] = entry["seconds_per_step"] - entry["t_draft"] - entry["t_verify"]
    return entry


  def faster_baseline(self, ar_entry: dict, cfg) -> dict:
    """AR timed again after the other methods; the faster of the two runs is the baseline
    (the first run of a process can be slow, and a slow baseline flatters every drafter)."""
    again = self.run("ar", cfg)
    return again if again["wall_seconds"] < ar_entry["wall_seconds"] else ar_entry


def output_entry(prompt, rendered, ids, tok) -> dict:
  """One decoded prompt: its source id (and MT-Bench category and turn), the raw prompt, the
  chat text actually encoded (with a chat template), the output ids and text."""
  entry = {**prompt.fields(), "prompt": prompt.text}
  if rendered is not None:
    entry["rendered_prompt"] = rendered
  return {**entry, "token_ids": ids, "text": tokenizer_lib.decode(tok, ids)}


def evaluate(cfg) -> dict:
  methods = parse_methods(cfg.methods)
  harness = Harness(cfg, methods)
  report = {}
  for method in methods:
    print(f"[decode] {method}: compiling and running {len(harness.texts)} prompts", flush=True)
    report[method] = harness.run(method, cfg)
  if len(methods) > 1:
    report["ar"] = harness.faster_baseline(report["ar"], cfg)
  ar_tps = report["ar"]["tokens_per_second"]
  for entry in report.values():
    entry["speedup_vs_ar"] = entry["tokens_per_second"] / ar_tps
    entry["config"] = json.loads(cfg.to_json_best_effort())
  return {"methods": report}


def budget_metrics(results, drafter) -> dict:
  """For drafters that budget verification (DSpark): a_k from the drafts actually verified,
  the per-row budget and verify-width histograms, mean confidence and survival per position,
  and the measured cost of each compiled verify width."""
  if drafter is None or results[0].budget_counts is None:
    return {}
  reached, accepted = np.sum([np.asarray(r.position_counts) for r in results], axis=0)
  acceptance = [float(a / n) if n else float("nan") for a, n in zip(accepted, reached)]
  budgets = np.sum([np.asarray(r.budget_counts) for r in results], axis=0)
  widths = np.sum([np.asarray(r.width_counts) for r in results], axis=0)
  stats = {k: np.sum([np.asarray(r.draft_stats[k]) for r in results], axis=0)
           for k in results[0].draft_stats}
  rows = max(float(stats.pop("rows", 1.0)), 1.0)
  finite = [a if not math.isnan(a) else 0.0 for a in acceptance]
  out = {
      "acceptance_per_position": acceptance,
      "prefix_acceptance": accounting.prefix_products(finite),
      "tau_predicted_full_block": accounting.expected_tokens(finite),
      "budget_histogram": [int(c) for c in budgets],
      "mean_budget": float((budgets * np.arange(len(budgets))).sum() / max(budgets.sum(), 1)),
      "verify_width_histogram": [int(c) for c in widths],
      "mean_verify_width": float((widths * np.arange(len(widths))).sum() / max(widths.sum(), 1)),
      **{f"mean_{k}_per_position": [float(x) for x in v / rows] for k, v in stats.items()},
  }
  out.update(drafter.summary())
  return out


def step_costs(cfg, target, drafter, dparams, sampler, lens, k) -> dict:
  """T_ar, T_verify(K+1), T_draft(K) at this batch size, each the mean over the context
  lengths the run passes through (attention reads only the prefix a context needs, so a step
  at the end of a row costs more than one at its start)."""
  start = int(np.mean(lens))
  contexts = sorted({start, start + cfg.max_new_tokens // 2, start + cfg.max_new_tokens})
  kw = dict(batch=cfg.batch_size, context_len=contexts, cache_len=cfg.cache_len)
  t = costs.verify_costs(target.graphdef, target.params, ns=sorted({1, k + 1}), sampler=sampler,
                        **kw)
  t_draft = 0.0 if drafter is None else costs.draft_cost(
      target.graphdef, target.params, drafter, dparams, sampler=sampler, **kw)
  return {"t_ar": t[1], "t_verify": t[k + 1], "t_draft": t_draft}


def format_table(report: dict) -> str:
  cols = ("method", "K", "tau", "tau_pred", "tok/s", "speedup", "pred", "lossless", "dist4")
  rows = [cols]
  for name, e in report["methods"].items():
    lossless = "-" if e["lossless_check"] is None else ("yes" if e["lossless_check"] else
                                                      f"NO ({e['mismatched_outputs']})")
    rows.append((name, str(e.get("block_size", e["num_draft_tokens"])), f"{e['tau']:.2f}",
                 f"{e['tau_predicted']:.2f}", f"{e['tokens_per_second']:.1f}",
                 f"{e['speedup_vs_ar']:.2f}x",
                 f"{e['speedup_predicted']:.2f}x" if "speedup_predicted" in e else "-",
                 lossless, f"{e['distinct_4gram']:.2f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def plot_acceptance(report: dict, path: str, title: str = ""):
  """a_k and P_k per method, side by side (decode.py's PNG; the report's per temperature)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  suffix = f" ({title})" if title else ""
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
  for name, e in report["methods"].items():
    a = e["acceptance_per_position"]
    if not a:
      continue
    pos = np.arange(1, len(a) + 1)
    ax1.plot(pos, a, marker="o", label=name)
    ax2.plot(pos, e["prefix_acceptance"], marker="o", label=name)
  ax1.set(title="conditional acceptance a_k" + suffix, xlabel="draft position k",
          ylim=(0, 1.05))
  ax2.set(title="prefix acceptance P_k" + suffix, xlabel="draft position k", ylim=(0, 1.05))
  for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def output_path(cfg) -> str:
  if cfg.output_json:
    return os.path.abspath(os.path.expanduser(cfg.output_json))
  return os.path.join(run_dir_lib.resolve(cfg.run_dir), "decode",
                      f"t{cfg.temperature:g}.json")


def main(cfg):
  report = evaluate(cfg)
  if jax.process_index() != 0:  # every process decodes its rows; one writes the report
    return report
  path = output_path(cfg)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(report, f, indent=1)
  if cfg.plot:
    plot_acceptance(report, os.path.splitext(path)[0] + ".png")
  print(format_table(report))
  print(f"[decode] wrote {path}", flush=True)
  return report
