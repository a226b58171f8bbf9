"""Sharded decoding overhead: tokens/s of AR and DFlash on 1, 2, 4 and 8 fake CPU devices at
batch 8, with the collectives per loop step read from the compiled HLO.

Fake devices share this machine's cores, so this measures the overhead of sharding (the
collectives XLA inserts and their cost), not a speedup. A new all-gather or a host transfer in
the loop body shows up in the counts.

  python bench/sharded_decode.py [--run_dir=runs/tiny] [--devices=1,2,4,8] [--new_tokens=48]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import common  # noqa: E402  (sets sys.path)
import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from specjax import sharding  # noqa: E402
from specjax.decoding.ar import ARDecoder  # noqa: E402
from specjax.decoding.speculative import SpeculativeDecoder  # noqa: E402
from specjax.drafters.dflash import DFlashDrafter, DFlashModel  # noqa: E402
from specjax.sampling import Sampler  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "send", "recv", "infeed", "outfeed", "custom-call")


def loop_collectives(hlo: str) -> dict:
  """Collective ops in the while loop's body and every computation it calls."""
  comps, name = {}, None
  for line in hlo.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if m:
      name = m.group(1)
      comps[name] = []
    elif name is not None:
      comps[name].append(line)
  bodies = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo)
  seen, stack = set(), list(bodies)
  while stack:
    c = stack.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for line in comps[c]:
      stack += re.findall(r"(?:to_apply|body|condition|calls|branch_computations)="
                          r"\{?%?([\w.\-]+(?:, %?[\w.\-]+)*)", line)
      stack = [x.strip(" %") for s in stack for x in s.split(",")]
  counts = {}
  for c in seen:
    for line in comps[c]:
      for op in COLLECTIVES:
        if re.search(rf"= \S+ {op}(-start)?\(", line):
          counts[op] = counts.get(op, 0) + 1
  return counts


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--run_dir", default="runs/tiny")
  p.add_argument("--devices", default="1,2,4,8")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--new_tokens", type=int, default=48)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  graphdef, params, where = common.target_for_timing(args.run_dir)
  model_cfg = nnx.merge(graphdef, params).cfg
  dg, dp = nnx.split(DFlashModel(model_cfg, 2, 3, rngs=nnx.Rngs(1)), nnx.Param)
  drafter = DFlashDrafter(7, graphdef=dg, target_feature_layers=(1, 2, 3))
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, model_cfg.vocab_size, (args.batch, 32)).astype(np.int32)
  lens = np.full((args.batch,), 32, np.int32)
  print(f"target: {where}; batch {args.batch}, {args.new_tokens} new tokens, random DFlash "
        "drafter (7 drafts); fake CPU devices share the cores")
  print(f"{'devices':>7s} {'data x tensor':>13s} {'method':>7s} {'tok/s':>8s} {'vs 1':>6s}  "
        "collectives in the loop body (all its branches)")
  base = {}
  for n in [int(d) for d in args.devices.split(",")]:
    shape = {"data": 1, "tensor": 1} if n == 1 else {"data": max(1, n // 4), "tensor": min(n, 4)}
    layout = None if n == 1 else sharding.Layout(sharding.make_mesh(shape))
    place = (lambda x: x) if layout is None else layout.params
    rows = (lambda x: x) if layout is None else layout.rows
    t, l, key = rows(tokens), rows(lens), jax.random.key(0)
    runs = {
        "ar": (ARDecoder(graphdef, Sampler(), args.new_tokens, 128, -1, layout=layout),
               (place(params),)),
        "dflash": (SpeculativeDecoder(graphdef, Sampler(), args.new_tokens, 128, -1,
                                      layout=layout, drafter=drafter),
                   (place(params), place(dp))),
    }
    for method, (dec, ps) in runs.items():
      hlo = dec.decode.lower(dec, *ps, t, l, key).compile().as_text()
      jax.block_until_ready(dec(*ps, t, l, key))
      times = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(dec(*ps, t, l, key))
        times.append(time.perf_counter() - start)
      tps = float(np.asarray(out.num_tokens_B).sum()) / min(times)
      base.setdefault(method, tps)
      counts = loop_collectives(hlo)
      shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
      mesh = f"{shape['data']} x {shape['tensor']}"
      print(f"{n:7d} {mesh:>13s} {method:>7s} {tps:8.1f} {tps / base[method]:5.2f}x  "
            f"{shown}", flush=True)


if __name__ == "__main__":
  main()
