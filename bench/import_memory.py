"""Peak host memory of `import-hf` on a generated Llama checkpoint of ~350M parameters.

  python bench/import_memory.py [--workdir=/tmp/specjax_import_memory] [--dtype=float32]

The checkpoint (random weights, written straight from numpy one tensor at a time) and the run
directory live in --workdir and are deleted afterwards. The import runs in a fresh process
whose peak RSS (ru_maxrss) is compared with the model's size and with the RSS of a process that
only imports specjax. On CPU the device is host memory, so the model itself is part of the
peak: what matters is the overhead above it (a load that read the whole checkpoint first would
show about one more model size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import common  # noqa: F401  (sets sys.path)
import ml_dtypes
import numpy as np

from specjax.interop.safetensors_io import write_tensors

SHAPE = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
             num_key_value_heads=8, head_dim=64, intermediate_size=2816)

CHILD = """
import json, resource, sys, time
import jax
from specjax.interop import hf
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if sys.argv[1] == "import":
  hf.import_hf(sys.argv[2], sys.argv[3])
print(json.dumps({"baseline_kb": base, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "seconds": time.perf_counter() - t}))
"""


def write_checkpoint(folder: str, dtype: str) -> int:
  """A random Llama checkpoint; returns its tensor bytes."""
  s = SHAPE
  d, f, v, hd = s["hidden_size"], s["intermediate_size"], s["vocab_size"], s["head_dim"]
  q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
            "lm_head.weight": (v, d)}
  for i in range(s["num_hidden_layers"]):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                   p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                   p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                   p + "mlp.down_proj.weight": (d, f)})
  np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
  rng = np.random.default_rng(0)
  os.makedirs(folder, exist_ok=True)
  write_tensors(os.path.join(folder, "model.safetensors"),
                {n: (sh, np_dtype) for n, sh in shapes.items()},
                lambda n: (0.02 * rng.standard_normal(shapes[n], np.float32)).astype(np_dtype))
  config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **s,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "dtype": dtype, "bos_token_id": 1, "eos_token_id": 2}
  with open(os.path.join(folder, "config.json"), "w") as fh:
    json.dump(config, fh)
  from tokenizers import Tokenizer, models  # a stand-in tokenizer: ids 0..2 only
  Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>")).save(
      os.path.join(folder, "tokenizer.json"))
  return sum(int(np.prod(sh)) for sh in shapes.values()) * np_dtype.itemsize


def child(*args) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, cwd=root,
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", default="/tmp/specjax_import_memory")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  args = parser.parse_args(argv)
  shutil.rmtree(args.workdir, ignore_errors=True)
  hf_dir, run_dir = os.path.join(args.workdir, "hf"), os.path.join(args.workdir, "run")
  try:
    t = time.perf_counter()
    nbytes = write_checkpoint(hf_dir, args.dtype)
    print(f"checkpoint: {nbytes / 4 if args.dtype == 'float32' else nbytes / 2:,.0f} "
          f"parameters, {nbytes / 2**20:,.0f} MiB ({args.dtype}), written in "
          f"{time.perf_counter() - t:.0f} s")
    idle = child("idle")
    r = child("import", hf_dir, run_dir)
    mib = lambda kb: kb / 1024
    over = mib(r["peak_kb"] - idle["peak_kb"]) - nbytes / 2**20
    print(f"process importing specjax only: {mib(idle['peak_kb']):,.0f} MiB peak RSS")
    print(f"import-hf: {mib(r['peak_kb']):,.0f} MiB peak RSS in {r['seconds']:.0f} s; above the "
          f"idle process {mib(r['peak_kb'] - idle['peak_kb']):,.0f} MiB = model "
          f"{nbytes / 2**20:,.0f} MiB + {over:,.0f} MiB overhead")
  finally:
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
  main()
