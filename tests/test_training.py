"""Training: sharded steps agree across meshes, a killed run resumes exactly, the loss falls."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from conftest import ROOT, tiny_train_config
from specjax import run_dir as run_dir_lib
from specjax.training import registry
from specjax.training.loop import KILL_ENV


def losses(run_dir, name="target"):
  with open(os.path.join(run_dir, name, "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f]
  return {r["step"]: r for r in rows}


def assert_trees_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)


def test_train_step_same_on_one_device_and_eight_device_mesh(tmp_path, corpus_dir, tfds_dir):
  assert jax.device_count() == 8
  kw = dict(num_steps=3, log_every=1, eval_every=3, save_every=100, learning_rate=1e-3)
  one = tiny_train_config("target_tiny.py", tmp_path / "one", corpus_dir, tfds_dir, **kw)
  one.mesh_shape = {"data": 1, "fsdp": 1, "tensor": 1}
  eight = tiny_train_config("target_tiny.py", tmp_path / "eight", corpus_dir, tfds_dir, **kw)
  eight.mesh_shape = {"data": 2, "fsdp": 2, "tensor": 2}
  p1 = registry.train(one)
  p8 = registry.train(eight)
  w = p8["blocks"][0]["mlp"]["w_gate"]
  assert len(w.sharding.device_set) == 8 and w.sharding.spec == P("fsdp", "tensor")
  assert len(p1["blocks"][0]["mlp"]["w_gate"].sharding.device_set) == 1
  l1, l8 = losses(one.run_dir), losses(eight.run_dir)
  for step in (1, 2, 3):
    assert l1[step]["loss"] == pytest.approx(l8[step]["loss"], rel=1e-5)
  assert_trees_close(p1, p8, atol=1e-5)


def run_train(cfg_overrides, env=None):
  cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config=" +
         os.path.join(ROOT, "configs", "target_tiny.py")] + [
             f"--config.{k}={v}" for k, v in cfg_overrides.items()]
  full_env = {**os.environ, **(env or {})}
  return subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=ROOT)


def test_killed_run_resumes_to_the_same_parameters(tmp_path, corpus_dir, tfds_dir):
  base = tiny_train_config("target_tiny.py", tmp_path / "x", corpus_dir, tfds_dir)
  overrides = {"data.source_dir": corpus_dir, "data.tfds_dir": tfds_dir,
               "data.vocab_size": 320, "data.shuffle_window": 16, "num_steps": 10,
               "batch_size": 8, "seq_len": 32, "save_every": 4, "log_every": 2,
               "eval_every": 10, "eval_batches": 1, "warmup_steps": 2}
  for k, v in base.model.items():
    overrides[f"model.{k}"] = v
  straight = run_train({**overrides, "run_dir": tmp_path / "straight"})
  assert straight.returncode == 0, straight.stderr[-2000:]
  killed = run_train({**overrides, "run_dir": tmp_path / "killed"}, {KILL_ENV: "6"})
  assert killed.returncode == -9  # SIGKILL after step 6; the last checkpoint is step 4
  ckpts = os.listdir(tmp_path / "killed" / "target" / "checkpoints")
  assert "4" in ckpts and "8" not in ckpts
  resumed = run_train({**overrides, "run_dir": tmp_path / "killed"})
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resumed from step 4" in resumed.stdout
  a = run_dir_lib.load_target(str(tmp_path / "straight")).params
  b = run_dir_lib.load_target(str(tmp_path / "killed")).params
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  la, lb = losses(str(tmp_path / "straight")), losses(str(tmp_path / "killed"))
  assert sorted(la) == sorted(lb)  # metrics.jsonl has no duplicated or lost steps
  assert la[10]["loss"] == lb[10]["loss"]


def test_target_learns_below_unigram_entropy(tiny_run):
  rows = losses(tiny_run)
  final = rows[max(rows)]
  assert rows[0]["val_loss"] > rows[0]["val_unigram_entropy"]  # untrained: worse than unigram
  assert final["val_loss"] < rows[0]["val_unigram_entropy"] - 0.5
  for name in ("config.json", "tokenizer.json", "metrics.jsonl", "checkpoints"):
    assert os.path.exists(os.path.join(tiny_run, "target", name))


def test_draft_initialised_from_target_layers_is_that_truncated_target():
  """init_from_target: the draft model takes the target's shape, embedding, final norm and the
  listed layers in the listed order. All layers in order reproduce the target's logits; a
  reordered pair puts target layer 1 first (a copy by position, or of the wrong layers, fails)."""
  import ml_collections
  from flax import nnx
  from specjax.models import Transformer, TransformerConfig
  from specjax.training import draft

  tcfg = TransformerConfig(vocab_size=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2,
                           head_dim=8, mlp_dim=48, qk_norm=False, norm_eps=1e-5)
  target = Transformer(tcfg, rngs=nnx.Rngs(0))
  tparams = nnx.state(target, nnx.Param)
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 64)
  for ids in ((0, 1, 2), (1, 0)):
    cfg = ml_collections.ConfigDict({"model": {"num_layers": 9, "d_model": 8}})
    cfg.lock()  # as train.py hands it over
    dcfg = draft._truncated_target_config(cfg, tcfg, ids)
    assert cfg.model.num_layers == len(ids) and cfg.model.d_model == 32
    assert cfg.model.norm_eps == 1e-5 and dcfg.num_layers == len(ids)
    model = Transformer(dcfg, rngs=nnx.Rngs(5))
    params = draft.copy_target_layers(nnx.state(model, nnx.Param), tparams, ids)
    nnx.update(model, params)
    if ids == (0, 1, 2):
      np.testing.assert_allclose(model(tokens).logits_BxTxV, target(tokens).logits_BxTxV,
                                 atol=1e-5)
    else:
      np.testing.assert_array_equal(model.blocks[0].mlp.w_gate[...],
                                    target.blocks[1].mlp.w_gate[...])
      np.testing.assert_array_equal(model.embedding[...], target.embedding[...])
  with pytest.raises(Exception, match="distinct target layer ids"):
    draft._truncated_target_config(ml_collections.ConfigDict({"model": {}}), tcfg, (0, 3))
