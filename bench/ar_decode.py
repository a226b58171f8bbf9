"""On-device AR loop (one jitted lax.while_loop) vs a host-driven loop (one jitted step per
token, the host checking for EOS each step), tokens/s at batch 1 and 8, from one run.

  python bench/ar_decode.py [--run_dir=runs/tiny] [--new_tokens=128]
"""

from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (sets sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import pad_prompts
from specjax.sampling import Sampler


def make_host_loop(graphdef, cache_len):
  """A Python loop over a jitted one-token step (compiled once, like a serving loop)."""

  @jax.jit
  def prefill(params, tokens, lens):
    model = nnx.merge(graphdef, params)
    out = model(tokens, cache=model.init_cache(tokens.shape[0], cache_len))
    last = jnp.take_along_axis(out.logits_BxTxV, (lens - 1)[:, None, None], 1)[:, 0]
    return jnp.argmax(last, -1), out.cache.rollback(lens)

  @jax.jit
  def step(params, token, cache):
    out = nnx.merge(graphdef, params)(token[:, None], cache=cache)
    return jnp.argmax(out.logits_BxTxV[:, 0], -1), out.cache

  def run(params, tokens, lens, new_tokens):
    token, cache = prefill(params, tokens, lens)
    generated = [np.asarray(token)]
    for _ in range(new_tokens - 1):
      token, cache = step(params, token, cache)
      generated.append(np.asarray(token))  # the host reads each token (EOS check, streaming)
      if np.all(generated[-1] == -1):
        break
    return np.stack(generated, 1)

  return run


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", default="runs/tiny")
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  graphdef, params, where = common.target_for_timing(args.run_dir)
  print(f"target: {where}; {args.new_tokens} new tokens per row; median of {args.repeats}")
  cache_len = 64 + args.new_tokens + 1
  print(f"{'batch':>5}  {'on-device tok/s':>15}  {'host-loop tok/s':>15}  {'ratio':>6}")
  for batch in (1, 8):
    prompts = [[5 + i, 6, 7, 8] * 4 for i in range(batch)]
    tokens, lens = pad_prompts(prompts, 1)
    dec = ARDecoder(graphdef, Sampler(), args.new_tokens, cache_len, eos_id=-1)
    run_device = lambda: np.asarray(dec(params, tokens, lens, jax.random.key(0)).tokens_BxN)
    host = make_host_loop(graphdef, cache_len)
    run_host = lambda: host(params, tokens, lens, args.new_tokens)
    a, b = run_device(), run_host()  # compile both; check they agree
    assert np.array_equal(a, b), "on-device and host loops disagree"
    times = {"device": [], "host": []}
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
      for name, fn in (("device", run_device), ("host", run_host)):
        t = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t)
    tps = {k: batch * args.new_tokens / float(np.median(v)) for k, v in times.items()}
    print(f"{batch:>5}  {tps['device']:>15.1f}  {tps['host']:>15.1f}  "
          f"{tps['device'] / tps['host']:>5.2f}x")


if __name__ == "__main__":
  main()
