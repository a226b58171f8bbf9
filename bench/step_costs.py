"""The verify cost curve: seconds for one target pass over n new positions at a filled KV cache,
for specjax's weight modes and for the torch and numpy peers on the same weights, in one run,
next to the machine's own limit.

  python bench/step_costs.py --run_dir=runs/smollm2 [--max_n=16] [--context_len=128]
      [--modes=xla,kernel,gguf] [--peers=torch,numpy] [--batches=1] [--out=FILE]

Prints T(n)/T(1) per row and T(1) in ms. The limit row: a pass must read every weight once
(stored bytes / measured read bandwidth) and do 2 x parameters x n flops (/ measured float32
matmul peak); T_limit(n) is the larger. Speculative decoding pays when T(K+1)/T(1) stays near 1.
Without a run dir holding a target the tiny config is timed, randomly initialised.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time

import common  # noqa: F401  (puts the repository on sys.path)

import jax
import jax.numpy as jnp
import numpy as np

from specjax import costs, decode_weights
from specjax import run_dir as run_dir_lib


def best_of(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def machine_limits(reps: int = 5) -> tuple[float, float]:
  """(read bandwidth in bytes/s: a jitted sum over 1 GiB; float32 matmul peak in flop/s: a
  jitted 2048^3 product), each the best of `reps`."""
  x = jnp.ones((256 * 1024 * 1024,), jnp.float32)
  total = jax.jit(jnp.sum)
  jax.block_until_ready(total(x))
  bandwidth = x.nbytes / best_of(lambda: jax.block_until_ready(total(x)), reps)
  del x
  a = jnp.ones((2048, 2048), jnp.float32)
  mm = jax.jit(jnp.dot)
  jax.block_until_ready(mm(a, a))
  peak = 2 * 2048**3 / best_of(lambda: jax.block_until_ready(mm(a, a)), reps)
  return bandwidth, peak


def weight_bytes(params) -> int:
  return int(sum(x.nbytes for x in jax.tree.leaves(params)))


def matmul_params(model_cfg) -> int:
  """Weights a pass multiplies by (the embedding lookup reads one row; the LM head all)."""
  c = model_cfg
  attn = c.d_model * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  return c.num_layers * (attn + 3 * c.d_model * c.mlp_dim) + c.vocab_size * c.d_model


def specjax_curve(target, run_dir, mode, ns, batch, context_len, reps, inner):
  model = decode_weights.prepare(target, run_dir, mode)
  t = costs.verify_costs(model.graphdef, model.params, batch=batch, ns=ns,
                         context_len=context_len, cache_len=context_len + max(ns) + 1,
                         reps=reps, inner=inner)
  return t, weight_bytes(model.params)


def torch_curve(run_dir, ns, context_len, reps):
  import torch
  from transformers import AutoModelForCausalLM, DynamicCache

  from specjax.interop import hf
  torch.set_num_threads(os.cpu_count() or 1)
  with tempfile.TemporaryDirectory() as tmp:
    hf.export_hf(run_dir, tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
  out = {}
  with torch.inference_mode():
    cache = DynamicCache(config=model.config)
    model(torch.full((1, context_len), 3), cache=cache, use_cache=True)
    for n in ns:
      ids = torch.full((1, n), 3)

      def call(ids=ids, n=n):
        model(ids, cache=cache, use_cache=True)
        cache.crop(-n)  # back to the context

      call()
      out[n] = best_of(call, reps)
  return out


def numpy_curve(target, ns, context_len, reps):
  from numpy_llama import NumpyLlama
  model = NumpyLlama(target.model_cfg, target.params)
  cache = model.new_cache(context_len + max(ns) + 1)
  model(np.full(context_len, 3), cache, 0)
  return {n: best_of(lambda: model(np.full(n, 3), cache, context_len), reps) for n in ns}


def row(name, t, ns):
  return (f"{name:<16s}" + "".join(f"{t[n] / t[1]:>6.2f}" for n in ns) +
          f"   T(1) = {t[1] * 1e3:.1f} ms")


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/smollm2")
  parser.add_argument("--max_n", type=int, default=16)
  parser.add_argument("--context_len", type=int, default=128)
  parser.add_argument("--modes", default="xla,kernel,gguf")
  parser.add_argument("--peers", default="torch,numpy")
  parser.add_argument("--batches", default="1")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--inner", type=int, default=4)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  ns = list(range(1, args.max_n + 1))
  target = run_dir_lib.load_target(args.run_dir)
  modes = [m for m in args.modes.split(",") if m]
  if "gguf" in modes and decode_weights.resolve("auto", args.run_dir) != "gguf":
    modes.remove("gguf")  # not a GGUF import, or no kernel here
  bandwidth, peak = machine_limits()
  flops = 2 * matmul_params(target.model_cfg)
  print(f"target: {args.run_dir} ({target.model_cfg.num_layers} layers, "
        f"{matmul_params(target.model_cfg) / 1e6:.1f}M weights in products); context "
        f"{args.context_len}; read bandwidth {bandwidth / 1e9:.1f} GB/s, float32 matmul peak "
        f"{peak / 1e9:.0f} GFLOP/s")
  print(f"{'batch 1':<16s}" + "".join(f"{'n=' + str(n):>6s}" for n in ns))
  report = {"run_dir": args.run_dir, "context_len": args.context_len,
            "bandwidth_bytes_per_s": bandwidth, "matmul_flops_per_s": peak, "curves": {}}
  for batch in [int(b) for b in args.batches.split(",")]:
    for mode in modes:
      t, nbytes = specjax_curve(target, args.run_dir, mode, ns, batch, args.context_len,
                                args.reps, args.inner)
      limit = {n: max(nbytes / bandwidth, batch * n * flops / peak) for n in ns}
      name = f"specjax {mode}" + (f" b{batch}" if batch > 1 else "")
      print(row(name, t, ns))
      print(row(f"  limit ({nbytes / 1e6:.0f} MB)", limit, ns))
      report["curves"][name] = {"seconds": t, "limit_seconds": limit, "weight_bytes": nbytes}
  peers = [p for p in args.peers.split(",") if p]
  if "numpy" in peers:
    t = numpy_curve(target, ns, args.context_len, args.reps)
    print(row("numpy", t, ns))
    report["curves"]["numpy"] = {"seconds": t}
  if "torch" in peers:
    t = torch_curve(args.run_dir, ns, args.context_len, args.reps)
    print(row("torch", t, ns))
    report["curves"]["torch"] = {"seconds": t}
  out = args.out or os.path.join(args.run_dir, "step_costs.json")
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {out}")
  return report


if __name__ == "__main__":
  main()
