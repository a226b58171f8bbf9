"""The unrolled threefry lowering: the same random bits as jax's CPU default, one kernel."""

import contextlib
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir
from jax._src.random import threefry2x32 as threefry

from conftest import ROOT
from specjax import fast_rng

sys.path.insert(0, os.path.join(ROOT, "bench"))

import loop_kernels  # noqa: E402


@contextlib.contextmanager
def rolled_threefry():
  """jax's own CPU lowering (a rolled while loop) while the block runs."""
  mlir.register_lowering(threefry.threefry2x32_p, threefry._threefry2x32_cpu_lowering_rule,
                         platform="cpu")
  try:
    yield
  finally:
    mlir.register_lowering(threefry.threefry2x32_p, threefry._threefry2x32_lowering_rule,
                           platform="cpu")


def draws(rng):
  """What a decode step draws: key splits, uniforms, a categorical over a vocabulary."""
  step, accept, resample = jax.random.split(rng, 3)
  logits = jnp.linspace(-2.0, 2.0, 4 * 300).reshape(4, 300)
  return (jax.random.categorical(resample, logits), jax.random.uniform(accept, (4, 7)),
          jax.random.key_data(jax.random.fold_in(step, 11)))


def step_loop(rng):
  """A loop whose body draws as a sampled decode step does."""
  def body(i, carry):
    total, key = carry
    key, sub = jax.random.split(key)
    tokens, u, _ = draws(sub)
    return total + tokens.sum() + (u > 0.5).sum(), key
  return jax.lax.fori_loop(0, 3, body, (jnp.int32(0), rng))[0]


def test_fast_rng_is_active_and_draws_the_same_bits():
  assert fast_rng.use_unrolled_threefry()
  rng = jax.random.key(7)
  fast = jax.jit(lambda r: draws(r))(rng)  # a new function object: compiled afresh
  with rolled_threefry():
    slow = jax.jit(lambda r: draws(r))(rng)
  for a, b in zip(fast, slow):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fast_rng_draws_without_a_loop_per_draw():
  rng = jax.random.key(0)
  fast = loop_kernels.loop_step_launches(jax.jit(lambda r: step_loop(r)).lower(rng)
                                         .compile().as_text())
  with rolled_threefry():
    slow = loop_kernels.loop_step_launches(jax.jit(lambda r: step_loop(r)).lower(rng)
                                           .compile().as_text())
  # five draws: rolled, each is a 5-trip loop of several kernels; unrolled, one fusion or so
  assert fast < 20 and slow > 5 * fast, (fast, slow)  # measured: 8 and 379
