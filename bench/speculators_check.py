"""Do a run's drafters compute the same in vLLM's speculators as in specjax, on real data?

  python bench/speculators_check.py --run_dir=runs/smollm2 [--methods=eagle3,dflash,dspark]
      [--num_prompts=4] [--new_tokens=32] [--anchors=4] [--tol=1e-3] [--out=FILE]
      (--methods defaults to all four: eagle3,dflash,dspark,dflash2)

For each method present in RUN_DIR: export it in the speculators format (`export-speculators`,
with the target exported by `export-hf` as the verifier), load the export with speculators' own
classes in torch (`from_pretrained`: their loader also reads the verifier's embedding and LM
head from the verifier path), and feed both implementations the same inputs: the first
`num_prompts` HumanEval prompts under the target's chat template, each followed by the target's
greedy continuation of `new_tokens` tokens (transformers' generate on the exported verifier),
and the verifier's hidden states at the drafter's layers on that text (identical float32 arrays
for both). Compared:

  eagle3            the logits of every TTT step at every position of every sequence
  dflash / dflash2  the mask slots' logits of a block at `anchors` anchors per sequence in the
                    continuation (context = the features before the anchor), DFlash 2 also the
                    selector's scores and candidates
  dspark            every slot's logits with the Markov bias (previous tokens = the text's), and
                    the confidence logits

Printed per method: max |difference| per output, top-1 agreement of the drafts over the
positions compared, the number of positions, and PASS / FAIL. A method passes when every
max |difference| is <= --tol and every top-1 disagreement is a near tie (the reference's top-2
margin there <= 2 x the max difference). An export or load that fails is a FAIL. The results go
to --out (default RUN_DIR/speculators_check.json); the exit status is 1 on any FAIL.

speculators' DFlash-family layers always have q/k norm (Qwen3 layers), so a DFlash, DSpark or
DFlash 2 trained here on a target without (a Llama, such as SmolLM2) cannot be exported: train
it with `c.layer_shape = ml_collections.ConfigDict({"qk_norm": True})` in its config file
(an empty layer_shape takes no --config.layer_shape.* flag), as configs/smollm2.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

import common  # noqa: F401  (sets sys.path)
import numpy as np

sys.path.insert(0, os.path.join(common.ROOT, "tests"))
import speculators_models as theirs  # noqa: E402

from specjax import run_dir as run_dir_lib  # noqa: E402
from specjax.data import benchmarks, chat  # noqa: E402
from specjax.errors import SpecjaxError  # noqa: E402
from specjax.interop import hf, speculators  # noqa: E402

METHODS = ("eagle3", "dflash", "dspark", "dflash2")


def prompt_ids(run_dir: str, n: int) -> list[list[int]]:
  """The first n HumanEval prompts rendered with the target's chat template, as ids."""
  tok = run_dir_lib.load_tokenizer(run_dir)
  template = chat.load(run_dir, tok, run_dir_lib.load_special_ids(run_dir))
  rendered = chat.render_prompts(template, benchmarks.load("humaneval", n), tok, None)
  return [chat.encode(tok, r) for r in rendered]


def sequences(verifier, prompts, new_tokens: int) -> list[tuple[np.ndarray, int]]:
  """(prompt + the verifier's greedy continuation [1, T], prompt length) per prompt."""
  import torch
  out = []
  for ids in prompts:
    with torch.no_grad():
      seq = verifier.generate(torch.as_tensor([ids]), max_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=verifier.config.eos_token_id)
    out.append((seq.numpy(), len(ids)))
  return out


def top1(ours: np.ndarray, ref: np.ndarray, max_diff: float) -> dict:
  """Top-1 agreement over the rows of [N, V] logits, and whether every disagreement is a near
  tie of the reference (top-2 margin <= 2 x max_diff)."""
  ours, ref = ours.reshape(-1, ours.shape[-1]), ref.reshape(-1, ref.shape[-1])
  differ = ours.argmax(-1) != ref.argmax(-1)
  top2 = np.sort(ref[differ], -1)[:, -2:]
  margins = top2[:, 1] - top2[:, 0]
  return {"positions": int(len(ref)), "top1_agree": int((~differ).sum()),
          "disagreements_all_near_ties": bool((margins <= 2 * max_diff).all()),
          "max_margin_at_disagreement": float(margins.max()) if len(margins) else 0.0}


def summarize(outputs: dict[str, tuple[list, list]]) -> dict:
  """{output: {max_abs_diff, and for logits positions / top-1 agreement}} from (ours, ref)
  array lists per output."""
  out = {}
  for name, (ours, ref) in outputs.items():
    ours, ref = np.concatenate(ours), np.concatenate(ref)
    diff = float(np.abs(ours - ref).max())
    out[name] = {"max_abs_diff": diff, "max_abs_ref": float(np.abs(ref).max())}
    if name == "candidates":
      out[name] = {"equal": bool((ours == ref).all()), "positions": int(ours.shape[0])}
    elif name != "confidence":  # confidences are one logit per slot: no argmax
      out[name].update(top1(ours, ref, diff))
  return out


def check_eagle3(run_dir, model, verifier, seqs) -> dict:
  from specjax.methods import builtin
  ids = list(model.config.eagle_aux_hidden_state_layer_ids)
  ours_ids = builtin.load_eagle3(run_dir, run_dir_lib.load_target(run_dir))[2]
  assert list(ours_ids) == ids, (ours_ids, ids)
  steps = int(model.config.speculators_config.proposal_methods[0].speculative_tokens)
  ours_fn = theirs.ours_ttt(run_dir, steps)
  outputs = {f"step {k} logits": ([], []) for k in range(steps)}
  for tokens, _ in seqs:
    aux, features = theirs.aux_states(verifier, tokens, ids)
    ref = theirs.ttt_logits(model, aux, tokens, steps)
    ours = ours_fn(tokens, features)
    for k in range(steps):
      outputs[f"step {k} logits"][0].append(ours[k])
      outputs[f"step {k} logits"][1].append(ref[k])
  return {"layers": ids, "draft_vocab_size": int(model.draft_vocab_size),
          "outputs": summarize(outputs)}


def check_block(kind, run_dir, model, verifier, seqs, anchors: int) -> dict:
  ids = list(model.config.aux_hidden_state_layer_ids)
  block = int(model.block_size)
  ours_fn = theirs.ours_block(kind, run_dir, block)
  outputs, used = {}, 0
  for tokens, prompt_len in seqs:
    aux, features = theirs.aux_states(verifier, tokens, ids)
    t = tokens.shape[1]
    last = t - block  # the block's previous tokens are the text's
    if last < prompt_len:
      continue
    for a in np.unique(np.linspace(prompt_len, last, anchors).astype(int)):
      prev = tokens[0, a:a + block].tolist()
      ref = theirs.block_outputs(kind, model, aux[:, :a], prev)
      ours = ours_fn([f[:, :a] for f in features], prev)
      for name in ref:
        outputs.setdefault(name, ([], []))
        outputs[name][0].append(ours[name])
        outputs[name][1].append(ref[name])
      used += 1
  if not used:
    raise SpecjaxError(f"no sequence is longer than its prompt + {block}: raise --new_tokens")
  return {"layers": ids, "block_size": block, "mask_token_id": int(model.mask_token_id),
          "blocks": used, "outputs": summarize(outputs)}


def verdict(result: dict, tol: float) -> bool:
  for name, o in result["outputs"].items():
    if name == "candidates":
      if not o["equal"]:
        return False
    elif o["max_abs_diff"] > tol or not o.get("disagreements_all_near_ties", True):
      return False
  return True


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--run_dir", required=True)
  p.add_argument("--methods", default=",".join(METHODS),
                 help="comma-separated, of " + ", ".join(METHODS) + " (those present)")
  p.add_argument("--num_prompts", type=int, default=4)
  p.add_argument("--new_tokens", type=int, default=32,
                 help="the target's greedy continuation of each prompt")
  p.add_argument("--anchors", type=int, default=4,
                 help="DFlash-family blocks per sequence, spread over the continuation")
  p.add_argument("--tol", type=float, default=1e-3,
                 help="max |difference| allowed per output (float32 on both sides)")
  p.add_argument("--out", default="", help="JSON results (default RUN_DIR/speculators_check.json)")
  args = p.parse_args(argv)
  import torch
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

  methods = [m for m in args.methods.split(",") if m]
  unknown = set(methods) - set(METHODS)
  if unknown:
    raise SystemExit(f"unknown methods {sorted(unknown)}; known: {', '.join(METHODS)}")
  present = [m for m in methods if os.path.isdir(os.path.join(args.run_dir, m, "checkpoints"))]
  if not present:
    raise SystemExit(f"none of {methods} has a checkpoint in {args.run_dir}")
  results = {"run_dir": os.path.abspath(args.run_dir), "tol": args.tol,
             "num_prompts": args.num_prompts, "new_tokens": args.new_tokens,
             "prompts": "humaneval, chat template", "methods": {}}
  with tempfile.TemporaryDirectory(prefix="speculators_check_") as tmp:
    verifier_dir = hf.export_hf(args.run_dir, os.path.join(tmp, "verifier"))
    verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
    seqs = sequences(verifier, prompt_ids(args.run_dir, args.num_prompts), args.new_tokens)
    results["sequence_lengths"] = [int(s.shape[1]) for s, _ in seqs]
    results["prompt_lengths"] = [n for _, n in seqs]
    for m in present:
      run = args.run_dir
      try:
        out = os.path.join(tmp, m)
        speculators.export_speculators(run, m, out, verifier_dir)
        model = theirs.load_export(m, out)
      except Exception as e:  # an export or load that fails is this method's FAIL
        msg = str(e) if isinstance(e, SpecjaxError) else traceback.format_exc(limit=3)
        results["methods"][m] = {"pass": False, "error": msg.strip()}
        print(f"{m:8s} FAIL: export/load: {msg.strip()}", flush=True)
        continue
      r = (check_eagle3(run, model, verifier, seqs) if m == "eagle3" else
           check_block(m, run, model, verifier, seqs, args.anchors))
      r["pass"] = verdict(r, args.tol)
      results["methods"][m] = r
      print(f"{m:8s} {'PASS' if r['pass'] else 'FAIL'}"
            f" (tol {args.tol:g}; layers {r['layers']})", flush=True)
      for name, o in r["outputs"].items():
        if name == "candidates":
          print(f"  {name:16s} equal {o['equal']} over {o['positions']} positions")
          continue
        line = f"  {name:16s} max |diff| {o['max_abs_diff']:.2e} (|ref| <= {o['max_abs_ref']:.1f})"
        if "positions" in o:
          line += (f", top-1 agree {o['top1_agree']}/{o['positions']} "
                   f"({o['top1_agree'] / o['positions']:.2%})")
          if o["top1_agree"] < o["positions"]:
            line += (f", disagreements near ties: {o['disagreements_all_near_ties']} "
                     f"(max margin {o['max_margin_at_disagreement']:.1e})")
        print(line, flush=True)
      del model
  ok = all(r["pass"] for r in results["methods"].values())
  results["pass"] = ok
  path = args.out or os.path.join(args.run_dir, "speculators_check.json")
  with open(path, "w") as f:
    json.dump(results, f, indent=2)
  print(f"{'PASS' if ok else 'FAIL'}: {len(results['methods'])} method(s) on "
        f"{len(seqs)} HumanEval prompts (lengths {results['sequence_lengths']}) -> {path}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
