"""Planning mode: per-device bytes equal those of the real arrays on a tiny config, and the
plan of a real-scale config runs on CPU in seconds, allocating nothing."""

import os
import subprocess
import sys

import jax
import pytest
from flax import nnx

from conftest import ROOT, load_config
from specjax import plan, sharding
from specjax.models import Transformer

MESHES = {1: {"data": 1}, 8: {"data": 2, "tensor": 4}}


def tiny_target_config(devices):
  c = load_config("target_tiny.py")
  c.model.num_heads, c.model.num_kv_heads = 8, 4  # both divide over tensor = 4
  c.data.vocab_size = 512
  c.batch_size, c.plan_devices = 8, devices
  return c


def row(rows, name):
  return dict((r[0], r[1]) for r in rows)[name]


@pytest.mark.parametrize("devices", [1, 8])
def test_parameter_and_cache_bytes_equal_the_real_arrays(devices):
  cfg = tiny_target_config(devices)
  mesh = plan.abstract_mesh(MESHES[devices], devices)
  rules = sharding.DEFAULT_RULES
  model_cfg = plan.target_model_config(cfg)
  params = nnx.state(Transformer(model_cfg, rngs=nnx.Rngs(0)), nnx.Param)
  cache = Transformer(model_cfg, rngs=nnx.Rngs(0)).init_cache(cfg.batch_size, 256)
  if devices == 1:
    real_params = sum(x.nbytes for x in jax.tree.leaves(params))
    real_cache = sum(x.nbytes for x in jax.tree.leaves(cache.layers))
  else:  # one device's shards of the arrays as they are really placed
    layout = sharding.Layout(sharding.make_mesh(MESHES[devices]))
    placed = layout.params(params)
    shard = lambda x: x.addressable_shards[0].data.nbytes
    real_params = sum(shard(x) for x in jax.tree.leaves(placed))
    constrained = jax.jit(lambda c: layout.constrain(c, cfg.batch_size))(cache)
    real_cache = sum(shard(x) for x in jax.tree.leaves(constrained.layers))
    assert real_params < sum(x.nbytes for x in jax.tree.leaves(params))  # really split
  assert row(plan.plan_train(cfg, mesh, rules), "parameters") == real_params
  dcfg = load_config("decode.py")
  dcfg.batch_size, dcfg.cache_len = cfg.batch_size, 256
  got = plan.plan_decode(dcfg, mesh, rules, ["ar"], target_cfg=model_cfg)
  assert row(got, "target parameters") == real_params
  assert row(got, "target KV cache") == real_cache


def test_optimizer_and_gradients_follow_the_trainable_parameters():
  cfg = tiny_target_config(1)
  rows = plan.plan_train(cfg, plan.abstract_mesh(MESHES[1], 1), sharding.DEFAULT_RULES)
  p = row(rows, "parameters")
  assert row(rows, "optimizer state") == 2 * p and row(rows, "gradients") == p
  assert row(rows, "activations") > 0


def test_qwen3_8b_dflash_plan_runs_on_cpu_and_says_what_fits():
  cfg = load_config("qwen3_8b_dflash.py")
  cfg.plan_devices, cfg.device_memory_gib = 8, 16.0
  out = plan.run(cfg, "train")
  rows = dict((r[0], r[1]) for r in out["rows"])
  # Qwen3-8B: 8.19e9 parameters in bf16 over tensor = 8 (the frozen target here)
  assert rows["frozen target"] == pytest.approx(8.19e9 * 2 / 8, rel=0.02)
  assert out["fits"] in (True, False) and out["mesh"] == {"data": 1, "fsdp": 1, "tensor": 8}
  # the whole target on one device of 16 GiB does not fit
  one = load_config("qwen3_8b.py")
  one.mesh_shape.tensor = 1
  one.plan_devices, one.device_memory_gib = 1, 16.0
  assert plan.run(one, "train")["fits"] is False


def test_decode_plan_from_the_command_line_allocates_nothing():
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "decode.py", "--config.plan=true", "--config.methods=ar,dflash",
         "--config.target_config=configs/qwen3_8b.py",
         "--config.drafter_config=configs/qwen3_8b_dflash.py", "--config.plan_devices=8",
         "--config.mesh_shape.tensor=8", "--config.device_memory_gib=16",
         "--config.batch_size=8", "--config.cache_len=4096", "--config.block_size=16"]
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "target KV cache" in out.stdout and "dflash parameters" in out.stdout
  assert "fit" in out.stdout
