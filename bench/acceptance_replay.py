"""Per-position against per-step acceptance: why teacher-forced accuracy overstates decode tau.

Greedy decoding commits the target's own text, so a drafter's proposal at each step equals
its teacher-forced prediction at the step's position on that text. This takes the AR outputs
of a greedy decode.py run, computes the drafter's teacher-forced predictions at every position
(the draft model: next token; DFlash: its training-mode block), and replays greedy
speculative decoding from them: a step whose pending token sits at position p accepts the
run of correct drafts from p (up to K) and the next step starts at p + m + 1. It prints the
first draft's accuracy over all positions, and a_1 and tau over the replayed steps next to
the decode's own (they agree up to the last step of each row, whose drafts reach past the
decoded text). Steps land on hard positions more often than text does.

  python bench/acceptance_replay.py --run_dir=runs/reference --decode_json=runs/reference/decode/t0.json
      [--methods=draft,dflash]
"""

from __future__ import annotations

import argparse
import json

import common  # sets sys.path
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.methods import builtin
from specjax import run_dir as run_dir_lib
from specjax.data import tokenizer as tokenizer_lib
from specjax.training.block import block_hidden


def accepted_runs(drafts_PxK, text, start: int) -> list[int]:
  """m[i]: how many of drafts_PxK[i] (proposed with the pending token at text[start + i])
  match text[start + i + 1:], stopping at the first miss or the end of the text."""
  out = []
  for i, row in enumerate(drafts_PxK):
    n, at = 0, start + i + 1
    while n < len(row) and at + n < len(text) and row[n] == text[at + n]:
      n += 1
    out.append(n)
  return out


def replay(m: list[int]) -> list[int]:
  """Accepted drafts of each step when the first step's pending token is position 0 and a
  step at position p accepts m[p] drafts."""
  steps, p = [], 0
  while p < len(m):
    steps.append(m[p])
    p += m[p] + 1
  return steps


def draft_model_drafts(run_dir: str, k: int):
  """(tokens) -> [T, K] greedy drafts of the draft model with the pending token at each
  position, teacher-forced: draft j is its prediction after the true text up to p + j - 1."""
  model = run_dir_lib.load_transformer(run_dir, "draft").module()
  logits = jax.jit(lambda t: model(t).logits_BxTxV)

  def drafts(seq):
    pred = np.asarray(jnp.argmax(logits(jnp.asarray([seq], jnp.int32)), -1))[0]
    return np.stack([np.roll(pred, -j)[:len(seq)] for j in range(k)], axis=1)
  return drafts


def dflash_drafts(run_dir: str, block_size: int):
  """(tokens) -> [T, B-1] DFlash's training-mode block drafts anchored at each position."""
  target_loaded = run_dir_lib.load_target(run_dir)
  target = target_loaded.module()
  graphdef, params, layers = builtin.load_dflash(run_dir, target_loaded, block_size)
  model = nnx.merge(graphdef, params)

  @jax.jit
  def blocks(tokens):
    t = tokens.shape[1]
    batch = {"tokens": tokens, "segment_ids": jnp.ones_like(tokens),
             "positions": jnp.arange(t, dtype=jnp.int32)[None]}
    anchors = jnp.arange(t, dtype=jnp.int32)[None]
    hidden = block_hidden(model, target, target(tokens, feature_layers=layers), batch,
                          anchors, block_size)
    logits = model.draft_logits(target, hidden).reshape(1, t, block_size, -1)
    return jnp.argmax(logits[0, :, 1:], -1)

  return lambda seq: np.asarray(blocks(jnp.asarray([seq], jnp.int32)))


def method_rows(run_dir: str, report: dict, method: str) -> tuple[float, float, float]:
  """(first-draft accuracy per position, replayed a_1, replayed tau) over the AR outputs."""
  entry = report[method]
  k = entry["num_draft_tokens"]
  drafts = (draft_model_drafts(run_dir, k) if method == "draft" else
            dflash_drafts(run_dir, entry.get("block_size", k + 1)))
  tok = run_dir_lib.load_tokenizer(run_dir)
  special = run_dir_lib.load_special_ids(run_dir)
  per_position, steps = [], []
  for out in report["ar"]["outputs"]:
    prompt = tokenizer_lib.encode(tok, out["prompt"], special)
    text = prompt + out["token_ids"]
    start = len(prompt)  # the first pending token: the first generated one
    proposed = drafts(text)[start:len(text) - 1]
    m = accepted_runs(proposed, text, start)
    per_position += [int(x > 0) for x in m]
    steps += replay(m)
  return (float(np.mean(per_position)), float(np.mean([s > 0 for s in steps])),
          float(np.mean(steps)) + 1.0)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/reference")
  parser.add_argument("--decode_json", default="runs/reference/decode/t0.json")
  parser.add_argument("--methods", default="draft,dflash")
  args = parser.parse_args(argv)
  try:
    with open(args.decode_json) as f:
      report = json.load(f)["methods"]
  except (OSError, ValueError, KeyError) as e:
    raise SystemExit(f"error: {args.decode_json} is not a decode.py report ({e})") from None
  if "ar" not in report:
    raise SystemExit(f"error: {args.decode_json} has no AR outputs; decode with methods=ar,...")
  if report["ar"].get("temperature", 0.0) != 0.0:
    raise SystemExit("error: replay needs a greedy (temperature 0) decode")
  print("method  a_1 per position  a_1 per step (replayed / decode)  tau (replayed / decode)")
  methods = [m for m in args.methods.split(",") if m]
  unknown = [m for m in methods if m not in ("draft", "dflash")]
  if unknown:
    raise SystemExit(f"error: replay supports draft and dflash, not {unknown}")
  for method in [m for m in methods if m in report]:
    position, a1, tau = method_rows(args.run_dir, report, method)
    e = report[method]
    print(f"{method:7s} {position:17.3f}  {a1:16.3f} / {e['acceptance_per_position'][0]:.3f}"
          f"  {tau:14.2f} / {e['tau']:.2f}", flush=True)


if __name__ == "__main__":
  main()
