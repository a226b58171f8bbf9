"""The CPU decode kernel: products equal to float64 references in every weight format, rows
bit-identical whatever else shares the call, the XLA-side dequantization equal to the kernel's,
and a packed transformer equal to the XLA one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.kernels import cpu
from specjax.models import Transformer, TransformerConfig, weights

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler for the kernel")
FORMATS = ("f32", "bf16", "q8", "q4")


def random_weight(fmt, n, k, seed=0) -> weights.PackedWeight:
  """A [n, k] weight in `fmt`; block scales and offsets of both signs and float16 values as in
  GGUF blocks (so that d * q is exact in float32 and XLA's d * q + m rounds once, like the
  kernel's fused multiply-add)."""
  rng = np.random.default_rng(seed)
  if fmt in ("f32", "bf16"):
    rows = jnp.asarray(rng.standard_normal((n, k)), jnp.float32 if fmt == "f32" else jnp.bfloat16)
    return weights.PackedWeight.from_rows(rows, None, fmt, (n, k), 0)
  scales = np.stack([rng.uniform(-2e-2, 2e-2, (n, k // 32)),
                     rng.uniform(-1e-1, 1e-1, (n, k // 32))], -1).astype(np.float16)
  codes = rng.integers(0, 16, (n, k)) if fmt == "q4" else rng.integers(-128, 128, (n, k))
  return weights.PackedWeight.from_rows(codes, scales.astype(np.float32), fmt, (n, k), 0)


def kernel(x, w):
  return np.asarray(jax.jit(lambda x: cpu.matmul(x, w))(x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_equals_float64_reference(fmt):
  w = random_weight(fmt, 160, 96)  # 5 panels: a remainder after pairs of panels
  x = np.random.default_rng(1).standard_normal((13, 96)).astype(np.float32)
  ref = x.astype(np.float64) @ np.asarray(w.rows(), np.float64).T
  np.testing.assert_allclose(kernel(jnp.asarray(x), w), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_bit_identical_whatever_shares_the_call(fmt):
  """Row m of an M-row product equals the one-row product of x[m] exactly, for M across the
  register tiles (1-8, then groups of 8) and the dequantized copy of a prefill (32+): what
  makes a verify pass equal AR steps."""
  w = random_weight(fmt, 96, 64, seed=2)
  x = jnp.asarray(np.random.default_rng(3).standard_normal((40, 64)), jnp.float32)
  one_by_one = np.concatenate([kernel(x[i:i + 1], w) for i in range(40)])
  for m in (2, 3, 5, 8, 9, 16, 20, 33, 40):
    np.testing.assert_array_equal(kernel(x[:m], w), one_by_one[:m], err_msg=f"M={m}")


@pytest.mark.parametrize("fmt", ("bf16", "q8", "q4"))
def test_xla_dequantization_equals_the_kernels(fmt):
  """The kernel applied to the identity returns its weights: they must be PackedWeight.rows()
  exactly (embedding lookups and the XLA fallback dequantize with rows())."""
  w = random_weight(fmt, 64, 64, seed=4)
  eye = jnp.eye(64, dtype=jnp.float32)
  np.testing.assert_array_equal(kernel(eye, w).T, np.asarray(w.rows()))


def test_independent_calls_in_one_program_do_not_deadlock():
  """XLA may run independent products at once on its thread pool, and each call hands work
  to the same pool: no call may wait for a task that has not started."""
  ws = [random_weight("q4", 512, 256, seed=s) for s in range(12)]
  x = jnp.ones((3, 256), jnp.float32)

  @jax.jit
  def many(x):
    return sum(cpu.matmul(x, w).sum() for w in ws)

  expected = sum(float(kernel(x, w).astype(np.float64).sum()) for w in ws)
  assert abs(float(many(x)) - expected) < 1e-2 * max(1.0, abs(expected))


def tiny_target(tie, qk_norm):
  cfg = TransformerConfig(vocab_size=96, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                          head_dim=16, mlp_dim=96, tie_embeddings=tie, qk_norm=qk_norm)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  return nnx.split(model, nnx.Param)


@pytest.mark.parametrize("tie,qk_norm", [(True, False), (False, True)])
def test_packed_transformer_equals_xla(tie, qk_norm):
  graphdef, params = tiny_target(tie, qk_norm)
  packed = weights.pack_state(params)
  kinds = {type(v.get_value()).__name__ for _, v in nnx.to_flat_state(packed)}
  assert "PackedWeight" in kinds
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, 96, (2, 11)), jnp.int32)
  run = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t).logits_BxTxV)
  np.testing.assert_allclose(run(packed, tokens), run(params, tokens), rtol=1e-4, atol=1e-4)


def test_packing_keeps_every_value():
  """f32 packing is a layout change only: each packed weight's dense view is the parameter."""
  _, params = tiny_target(False, True)
  packed = dict(nnx.to_flat_state(weights.pack_state(params)))
  for path, var in nnx.to_flat_state(params):
    got = packed[path].get_value()
    if isinstance(got, weights.PackedWeight):
      np.testing.assert_array_equal(np.asarray(got.dense()), np.asarray(var.get_value()))


PORTABLE_CHECK = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, {tests!r})
from test_kernel import FORMATS, kernel, random_weight
x = jnp.asarray(np.random.default_rng(7).standard_normal((9, 64)), jnp.float32)
print(json.dumps({{fmt: kernel(x, random_weight(fmt, 96, 64, seed=8)).tolist()
                  for fmt in FORMATS}}))
"""


def test_portable_build_computes_the_same_products(tmp_path):
  """The kernel built for x86-64-v2 (its portable path, for CPUs without AVX2 or AVX-512)
  gives the products of this CPU's vectorized build (AVX-512 or AVX2): the same arithmetic in
  the same order, up to float32 rounding."""
  import json
  import os
  import subprocess
  import sys
  if os.uname().machine != "x86_64":
    pytest.skip("the vectorized path is x86-64 only")
  env = dict(os.environ, SPECJAX_CACHE=str(tmp_path), SPECJAX_KERNEL_MARCH="x86-64-v2",
             JAX_PLATFORMS="cpu", XLA_FLAGS="")
  code = PORTABLE_CHECK.format(tests=os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert done.returncode == 0, done.stderr[-2000:]
  portable = json.loads(done.stdout.strip().splitlines()[-1])
  assert [p for p in os.listdir(tmp_path / "kernels") if p.endswith(".so")]  # built there
  x = jnp.asarray(np.random.default_rng(7).standard_normal((9, 64)), jnp.float32)
  for fmt in FORMATS:
    np.testing.assert_allclose(portable[fmt], kernel(x, random_weight(fmt, 96, 64, seed=8)),
                               rtol=1e-5, atol=1e-5, err_msg=fmt)


def reference_attention(q, k, v, limit):
  """float64 softmax attention of each query (b, t, n) over slots s <= limit[b, t]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, n, h = q.shape
  group = n // k.shape[2]
  out = np.zeros(q.shape)
  for i in range(b):
    for j in range(t):
      keys = int(limit[i, j]) + 1
      for head in range(n):
        kh, vh = k[i, :keys, head // group], v[i, :keys, head // group]
        s = kh @ q[i, j, head] / np.sqrt(h)
        p = np.exp(s - s.max())
        out[i, j, head] = (p / p.sum()) @ vh
  return out


def test_attention_equals_float64_softmax_over_visible_slots():
  rng = np.random.default_rng(9)
  q = rng.standard_normal((2, 3, 6, 32)).astype(np.float32)
  k = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
  v = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
  limit = np.array([[0, 17, 39], [5, 6, 7]], np.int32)
  got = jax.jit(cpu.attention)(q, k, v, limit)
  np.testing.assert_allclose(got, reference_attention(q, k, v, limit), rtol=1e-5, atol=1e-5)


def test_attention_rows_are_bit_identical_whatever_shares_the_call():
  rng = np.random.default_rng(10)
  q = jnp.asarray(rng.standard_normal((1, 8, 9, 64)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 300, 3, 64)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((1, 300, 3, 64)), jnp.float32)
  limit = jnp.arange(200, 208, dtype=jnp.int32)[None]
  together = np.asarray(jax.jit(cpu.attention)(q, k, v, limit))
  for t in range(8):
    alone = np.asarray(jax.jit(cpu.attention)(q[:, t:t + 1], k, v, limit[:, t:t + 1]))
    np.testing.assert_array_equal(together[:, t:t + 1], alone)
