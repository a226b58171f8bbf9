"""specjax against other decoders on the same prompts and weights: batch 1, greedy, the same
max_new_tokens and the same prompt token ids, every figure from this one run.

  python bench/peers.py --run_dir=runs/smollm2 [--benchmarks=humaneval,mtbench]
      [--num_prompts=16] [--max_new_tokens=96] [--k=4] [--chat_template=true]
      [--target_weights=auto] [--peers=transformers,llama_cpp] [--drafters=dflash,dflash2,draft]
      [--out=FILE]

Rows, per benchmark:
  specjax       ar, prompt_lookup (K drafts, n-grams up to 3) via decode.py's harness
  transformers  generate(), and generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=3)
                on the model transformers loads from the GGUF file itself (else the exported
                Hugging Face folder), float32, sdpa attention
  llama.cpp     (if llama-cpp-python is installed) the GGUF file itself (its own quantized
                kernels), greedy, and with LlamaPromptLookupDecoding(num_pred_tokens=K)
  drafters      (bench/drafter_peers.py; --drafters, default: those the run dir holds) specjax's
                dflash, dflash2 (block 8) and draft (K drafts) rows; with --peers=transformers,
                Z Lab's dflash_generate on each block drafter exported in its format (tau, and
                on how many prompts its per-step acceptance lengths equal specjax's), and
                transformers' generate(assistant_model=the draft model, K tokens a step)
Columns: tok/s, speedup over the same decoder's own AR (Z Lab's: transformers' AR, its
target), tau, and agreement: prompts whose generated ids equal specjax AR's. A final line
compares the AR rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import common
import drafter_peers

from specjax import evaluate
from specjax import run_dir as run_dir_lib


def specjax_rows(args, benchmark, drafters=()):
  """(rows, prompt ids, AR outputs) of specjax's AR, prompt lookup and `drafters` on one
  benchmark."""
  cfg = common.load_config("decode.py")
  cfg.run_dir, cfg.prompts, cfg.num_prompts = args.run_dir, benchmark, args.num_prompts
  cfg.methods, cfg.batch_size, cfg.temperature = "ar,prompt_lookup", 1, 0.0
  cfg.max_new_tokens, cfg.num_draft_tokens = args.max_new_tokens, args.k
  cfg.chat_template, cfg.target_weights = args.chat_template, args.target_weights
  cfg.measure_costs, cfg.plot, cfg.cache_len = False, False, args.cache_len
  drafter_peers.configure(cfg, drafters)
  harness = evaluate.Harness(cfg, ["ar", "prompt_lookup", *drafters])
  report = {m: harness.run(m, cfg) for m in ("ar", "prompt_lookup")}
  report["ar"] = harness.faster_baseline(report["ar"], cfg)
  ids = [list(map(int, t[:n])) for t, n in zip(harness.tokens, harness.lens)]
  ar_out = [o["token_ids"] for o in report["ar"]["outputs"]]
  mode = report["ar"]["target_weights"]
  rows = []
  for method, e in report.items():
    rows.append({"decoder": f"specjax ({mode})", "method": method,
                 "tokens_per_second": e["tokens_per_second"], "tau": e["tau"],
                 "outputs": [o["token_ids"] for o in e["outputs"]]})
  rows += drafter_peers.specjax_rows(harness, cfg, drafters, f"specjax ({mode})")
  return rows, ids, ar_out


def transformers_model(run_dir):
  import torch
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(os.cpu_count() or 1)
  info = run_dir_lib.load_config(run_dir_lib.model_dir(run_dir, "target")).get(
      "imported_from") or {}
  kw = dict(dtype=torch.float32, attn_implementation="sdpa")
  if info.get("format") == "gguf":
    from specjax.interop import gguf
    path = gguf.source_file(run_dir)
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                gguf_file=os.path.basename(path), **kw).eval()
  import tempfile

  from specjax.interop import hf
  with tempfile.TemporaryDirectory() as tmp:
    hf.export_hf(run_dir, tmp)
    return AutoModelForCausalLM.from_pretrained(tmp, **kw).eval()


def transformers_rows(model, ids, args, eos_ids):
  import torch
  rows = []
  for method, extra in (("ar", {}), ("prompt_lookup", {"prompt_lookup_num_tokens": args.k,
                                                       "max_matching_ngram_size": 3})):
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos_ids,
              pad_token_id=eos_ids[0], **extra)
    with torch.inference_mode():
      model.generate(torch.tensor([ids[0]]), **{**kw, "max_new_tokens": 4})  # warm-up
      outputs, wall, generated = [], 0.0, 0
      for prompt in ids:
        t = time.perf_counter()
        out = model.generate(torch.tensor([prompt]), **kw)[0, len(prompt):].tolist()
        wall += time.perf_counter() - t
        generated += len(out)
        outputs.append([i for i in out if i not in eos_ids] if out and out[-1] in eos_ids
                       else out)
    rows.append({"decoder": "transformers", "method": method,
                 "tokens_per_second": generated / wall, "outputs": outputs})
  return rows


def llama_cpp_generate(llm, prompt, max_new_tokens, eos_ids) -> list[int]:
  out = []
  for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0,
                            reset=True):
    if token in eos_ids:
      break
    out.append(int(token))
    if len(out) == max_new_tokens:
      break
  return out


def llama_cpp_rows(run_dir, ids, args, eos_ids):
  """llama.cpp's rows, decoded in a child process: a crash in its native code (its AMX path
  segfaulted in one build here) costs its rows, not the run's."""
  import subprocess
  import sys
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    job = os.path.join(tmp, "job.json")
    with open(job, "w") as f:
      json.dump({"run_dir": run_dir, "ids": ids, "eos_ids": eos_ids, "k": args.k,
                 "max_new_tokens": args.max_new_tokens, "cache_len": args.cache_len}, f)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama_cpp_job", job],
                          capture_output=True, text=True)
    if done.returncode != 0:
      last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
      print(f"llama.cpp: its decode failed ({last[:200]}); its rows are left out")
      return []
    with open(job + ".out") as f:
      return json.load(f)


def llama_cpp_job(path):
  """The child's work: both llama.cpp rows for the prompts in `path`, written beside it."""
  from llama_cpp import Llama
  from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

  from specjax.interop import gguf
  with open(path) as f:
    job = json.load(f)
  ids, eos_ids = job["ids"], job["eos_ids"]
  rows = []
  for method in ("ar", "prompt_lookup"):
    draft = (LlamaPromptLookupDecoding(num_pred_tokens=job["k"], max_ngram_size=3)
             if method == "prompt_lookup" else None)
    llm = Llama(model_path=gguf.source_file(job["run_dir"]), n_ctx=job["cache_len"],
                n_threads=os.cpu_count() or 1, n_batch=job["cache_len"], draft_model=draft,
                verbose=False)
    llama_cpp_generate(llm, ids[0], 4, eos_ids)  # warm-up
    outputs, wall = [], 0.0
    for prompt in ids:
      t = time.perf_counter()
      outputs.append(llama_cpp_generate(llm, prompt, job["max_new_tokens"], eos_ids))
      wall += time.perf_counter() - t
    rows.append({"decoder": "llama.cpp", "method": method,
                 "tokens_per_second": sum(map(len, outputs)) / wall, "outputs": outputs})
  with open(path + ".out", "w") as f:
    json.dump(rows, f)


AR_OF = {"Z Lab dflash": "transformers"}  # a decoder without an AR row: its target's AR


def table(benchmark, rows, ar_out):
  own_ar = {r["decoder"]: r["tokens_per_second"] for r in rows if r["method"] == "ar"}
  for decoder, other in AR_OF.items():
    own_ar.setdefault(decoder, own_ar.get(other, float("nan")))
  lines = [f"{'benchmark':<10s} {'decoder':<18s} {'method':<14s} {'tok/s':>7s} "
           f"{'speedup':>8s} {'tau':>5s}  same ids as specjax AR"]
  for r in rows:
    agree = sum(a == b for a, b in zip(r["outputs"], ar_out))
    r["agreement"] = agree / len(ar_out)
    r["speedup_vs_own_ar"] = r["tokens_per_second"] / own_ar[r["decoder"]]
    tau = f"{r['tau']:.2f}" if "tau" in r else "-"
    lines.append(f"{benchmark:<10s} {r['decoder']:<18s} {r['method']:<14s} "
                 f"{r['tokens_per_second']:>7.1f} {r['speedup_vs_own_ar']:>7.2f}x {tau:>5s}  "
                 f"{agree}/{len(ar_out)}")
  return "\n".join(lines)


def example(run_dir, benchmark, prompt_ids, output_ids) -> str:
  """The first prompt as the model saw it and specjax AR's answer, as text."""
  from specjax.data import tokenizer as tokenizer_lib
  tok = run_dir_lib.load_tokenizer(run_dir)
  prompt = tok.decode(prompt_ids, skip_special_tokens=False)
  return (f"--- {benchmark}, first prompt:\n{prompt}\n--- specjax AR's answer:\n"
          f"{tokenizer_lib.decode(tok, output_ids)}\n---")


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/smollm2")
  parser.add_argument("--benchmarks", default="humaneval,mtbench")
  parser.add_argument("--num_prompts", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=96)
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--chat_template", type=lambda s: s.lower() in ("1", "true", "yes"),
                      default=True)
  parser.add_argument("--target_weights", default="auto")
  parser.add_argument("--peers", default="transformers,llama_cpp")
  parser.add_argument("--cache_len", type=int, default=1024)
  parser.add_argument("--drafters", default=None,
                      help="comma-separated of dflash,dflash2,draft (default: those present)")
  parser.add_argument("--out", default="")
  parser.add_argument("--llama_cpp_job", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.llama_cpp_job:
    return llama_cpp_job(args.llama_cpp_job)
  peers = [p for p in args.peers.split(",") if p]
  if "llama_cpp" in peers and importlib.util.find_spec("llama_cpp") is None:
    print("llama.cpp: llama-cpp-python is not installed (pip install llama-cpp-python builds "
          "llama.cpp from source, about 4 minutes here); its rows are left out")
    peers.remove("llama_cpp")
  special = run_dir_lib.load_special_ids(args.run_dir)
  eos_ids = list(special.eos_ids or (special.eos_id,))
  model = transformers_model(args.run_dir) if "transformers" in peers else None
  drafters = drafter_peers.select(args.run_dir, args.drafters)
  report = {}
  for benchmark in [b for b in args.benchmarks.split(",") if b]:
    rows, ids, ar_out = specjax_rows(args, benchmark, drafters)
    if model is not None:
      rows += transformers_rows(model, ids, args, eos_ids)
      rows += drafter_peers.peer_rows(args.run_dir, model, ids, args, eos_ids, rows)
    if "llama_cpp" in peers:
      rows += llama_cpp_rows(args.run_dir, ids, args, eos_ids)
    print(table(benchmark, rows, ar_out), flush=True)
    ar = {r["decoder"]: r["tokens_per_second"] for r in rows if r["method"] == "ar"}
    ours = next(v for k, v in ar.items() if k.startswith("specjax"))
    print("AR tok/s relative to specjax's: " +
          ", ".join(f"{k} {v / ours:.2f}x" for k, v in ar.items()), flush=True)
    report[benchmark] = {"rows": rows, "prompt_ids": ids}
    print(example(args.run_dir, benchmark, ids[0], ar_out[0]), flush=True)
  out = args.out or os.path.join(args.run_dir, "peers.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump({"args": vars(args), "benchmarks": report}, f, indent=1)
  print(f"wrote {out}")
  return report


if __name__ == "__main__":
  main()
