"""specjax against the reference implementations, on the same imported weights, in one run.

  python bench/parity.py [--new_tokens=32] [--speed_tokens=128] [--run_dir=runs/tiny]

Per reference: the largest |logit difference| over a batch of prompts of different lengths
(float32) and the greedy token agreement with `transformers` `generate`; then the AR tokens/s
of specjax's on-device loop against `generate` (greedy, batch 1, same weights). References are
random checkpoints built with `transformers` (norm weights perturbed), imported with
`specjax.interop.hf`. Each reference family is one function returning rows: add one to
`REFERENCES` to cover another format. Z Lab DFlash (`bench/parity_dflash.py`, on the run's
target): an imported random drafter's logits against the reference's, greedy agreement with
`dflash_generate`, then the T=1 tau of argmax and sampled DFlash / parallel-MTP proposals.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import common  # noqa: F401  (sets sys.path)
import jax
import numpy as np
import torch
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import hf_models  # noqa: E402

from specjax import run_dir as run_dir_lib  # noqa: E402
from specjax.data import tokenizer as tokenizer_lib  # noqa: E402
from specjax.decoding.ar import ARDecoder  # noqa: E402
from specjax.decoding.common import pad_prompts, to_lists  # noqa: E402
from specjax.sampling import Sampler  # noqa: E402
from specjax.interop import hf  # noqa: E402

SIZE = dict(vocab=2048, layers=4, d_model=256, heads=8, kv_heads=4, head_dim=48, mlp=768)


_imported = {}


def import_reference(workdir, arch, tie, seed):
  """(transformers model, run_dir), built and imported once per process."""
  if (arch, tie) in _imported:
    return _imported[(arch, tie)]
  folder, model = hf_models.save_checkpoint(os.path.join(workdir, f"{arch}{tie}", "hf"), arch,
                                            tie=tie, seed=seed, tokenizer_vocab=1024, **SIZE)
  run_dir = os.path.join(workdir, f"{arch}{tie}", "run")
  hf.import_hf(folder, run_dir)
  _imported[(arch, tie)] = model, run_dir
  return model, run_dir


def prompt_ids(run_dir):
  tok, special = run_dir_lib.load_tokenizer(run_dir), run_dir_lib.load_special_ids(run_dir)
  return [tokenizer_lib.encode(tok, t, special) for t in hf_models.PROMPTS]


def max_logit_diff(model, target, rows) -> float:
  width = max(map(len, rows))
  tokens = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
  logits = jax.jit(lambda p, t: nnx.merge(target.graphdef, p)(t).logits_BxTxV)(target.params,
                                                                             tokens)
  worst = 0.0
  with torch.no_grad():
    for i, r in enumerate(rows):
      ref = model(torch.tensor([r])).logits[0].numpy()
      worst = max(worst, float(np.abs(np.asarray(logits[i, :len(r)]) - ref).max()))
  return worst


def greedy_agreement(model, target, rows, new_tokens, eos) -> tuple[int, int]:
  """(tokens equal at the same position, tokens compared), over the longer of each pair."""
  dec = ARDecoder(target.graphdef, Sampler(), new_tokens, max(map(len, rows)) + new_tokens + 1,
                  eos)
  same = total = 0
  for r in rows:
    tokens, lens = pad_prompts([r], eos)
    ours = to_lists(dec(target.params, tokens, lens, jax.random.key(0)), eos)[0]
    with torch.no_grad():
      ref = model.generate(torch.tensor([r]), max_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=eos, pad_token_id=eos)[0, len(r):].tolist()
    ref = ref[:-1] if ref and ref[-1] == eos else ref
    same += sum(a == b for a, b in zip(ours, ref))
    total += max(len(ours), len(ref))
  return same, total


def target_rows(workdir, args) -> list[dict]:
  """Llama and Qwen3, tied and untied embeddings."""
  rows = []
  for seed, (arch, tie) in enumerate([("llama", False), ("llama", True), ("qwen3", False),
                                      ("qwen3", True)]):
    model, run_dir = import_reference(workdir, arch, tie, seed)
    target = run_dir_lib.load_target(run_dir)
    ids = prompt_ids(run_dir)
    same, total = greedy_agreement(model, target, ids, args.new_tokens,
                                   run_dir_lib.load_special_ids(run_dir).eos_id)
    rows.append({"reference": f"transformers {arch} {'tied' if tie else 'untied'}",
                 "max_logit_diff": max_logit_diff(model, target, ids),
                 "agreement": f"{same}/{total}"})
  return rows


def ar_speed(workdir, args) -> tuple[float, float]:
  """(specjax tok/s, transformers tok/s): greedy, batch 1, EOS off, best of `repeats`."""
  model, run_dir = import_reference(workdir, "llama", False, 0)
  target = run_dir_lib.load_target(run_dir)
  row = prompt_ids(run_dir)[0]
  n = args.speed_tokens
  dec = ARDecoder(target.graphdef, Sampler(), n, len(row) + n + 1, -1)
  tokens, lens = pad_prompts([row], 0)
  jax.block_until_ready(dec(target.params, tokens, lens, jax.random.key(0)))  # compile
  ours, theirs = [], []
  for _ in range(args.repeats):
    t = time.perf_counter()
    jax.block_until_ready(dec(target.params, tokens, lens, jax.random.key(0)))
    ours.append(time.perf_counter() - t)
    t = time.perf_counter()
    with torch.no_grad():
      model.generate(torch.tensor([row]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                     pad_token_id=0)
    theirs.append(time.perf_counter() - t)
  return n / min(ours), n / min(theirs)


def dflash_rows(workdir, args) -> list[dict]:
  """Z Lab's DFlashDraftModel, imported for the run's target (needs run_dir/target)."""
  import parity_dflash
  run_dir = run_dir_lib.resolve(args.run_dir)
  if not os.path.isdir(os.path.join(run_dir, "target", "checkpoints")):
    print(f"(no target in {run_dir}: no DFlash rows)")
    return []
  diff, _ = parity_dflash.logit_parity(run_dir, workdir)
  same, total, _, _, which = parity_dflash.generate_parity(run_dir, workdir, 4, args.new_tokens)
  return [{"reference": f"dflash ({which.split()[0]} drafter)", "max_logit_diff": diff,
           "agreement": f"{same}/{total}"}]


REFERENCES = [target_rows, dflash_rows]  # one function per reference family


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--speed_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--run_dir", default="runs/tiny")  # DFlash rows: this run's target
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as workdir:
    rows = [r for fn in REFERENCES for r in fn(workdir, args)]
    print(f"{len(hf_models.PROMPTS)} prompts of different lengths; {args.new_tokens} greedy "
          f"tokens each; float32; model {SIZE}")
    print(f"{'reference':<28} {'max |logit diff|':>16}  {'greedy tokens equal':>19}")
    for r in rows:
      print(f"{r['reference']:<28} {r['max_logit_diff']:>16.2e}  {r['agreement']:>19}")
    ours, theirs = ar_speed(workdir, args)
    print(f"AR greedy, batch 1, {args.speed_tokens} new tokens, best of {args.repeats}, "
          f"torch threads {torch.get_num_threads()}: specjax {ours:.1f} tok/s, transformers "
          f"generate {theirs:.1f} tok/s, ratio {ours / theirs:.2f}x")
    if os.path.isdir(os.path.join(run_dir_lib.resolve(args.run_dir), "target")):
      import parity_dflash
      parity_dflash.print_taus(run_dir_lib.resolve(args.run_dir), workdir)


if __name__ == "__main__":
  main()
