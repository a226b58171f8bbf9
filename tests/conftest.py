"""Shared fixtures: 8 fake CPU devices, a tiny corpus, tiny configs and a tiny trained run."""

import gc
import os

# Must precede the first jax import: sharding tests use an 8-device CPU mesh.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

jax.config.update("jax_default_matmul_precision", "float32")

from specjax.data import python_source  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def free_compiled_programs():
  """Drops every compiled program after each test module. XLA's CPU executables hold memory
  maps until they are collected (a sharded 8-device decode loop holds ~270), and the whole
  suite would otherwise pass the kernel's 65530-map limit and abort inside a compile."""
  yield
  jax.clear_caches()
  gc.collect()


def load_config(name):
  from specjax import config_base
  return config_base.load_config_file(os.path.join(ROOT, "configs", name))


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
  """40 small standard-library modules: real Python text, no network."""
  src = python_source.stdlib_dir()
  files = python_source.list_source_files(src)
  files = sorted(files, key=lambda f: (os.path.getsize(os.path.join(src, f)), f))
  picked = [f for f in files if os.path.getsize(os.path.join(src, f)) > 2000][:40]
  out = tmp_path_factory.mktemp("corpus")
  for f in picked:
    dst = out / f.replace(os.sep, "__")
    shutil.copy(os.path.join(src, f), dst)
  return str(out)


def tiny_train_config(name, run_dir, corpus_dir, tfds_dir, **overrides):
  cfg = load_config(name)
  cfg.run_dir = str(run_dir)
  cfg.data.source_dir = corpus_dir
  cfg.data.tfds_dir = str(tfds_dir)
  cfg.data.vocab_size = 320
  cfg.data.shuffle_window = 16
  cfg.num_steps = 12
  cfg.batch_size = 8
  cfg.seq_len = 32
  cfg.log_every = 4
  cfg.eval_every = 4
  cfg.eval_batches = 2
  cfg.save_every = 4
  cfg.warmup_steps = 2
  cfg.mesh_shape = {"data": 1, "fsdp": 1, "tensor": 1}  # one fake device: fast on 2 cores
  if "model" in cfg:
    cfg.model.update(dict(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                          mlp_dim=64))
  for key, value in overrides.items():
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return cfg


@pytest.fixture(scope="session")
def template_corpus_dir(tmp_path_factory):
  """Generated, highly regular Python (templated functions with random names and numbers):
  a 30k-parameter model learns it in a hundred steps, so drafter tests see real acceptance."""
  import random
  rng = random.Random(0)
  names = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
  out = tmp_path_factory.mktemp("template_corpus")
  for f in range(24):
    lines = []
    for _ in range(60):
      n, a, b = rng.choice(names), rng.randint(1, 9), rng.randint(1, 9)
      lines.append(f"def {n}_{a}{b}(x):\n    return x * {a} + {b}\n\n")
    (out / f"mod{f:02d}.py").write_text("".join(lines))
  return str(out)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def train_block_drafter(tiny_run, name, run, corpus_dir, tfds_dir, regen_sequences=128,
                        **overrides):
  """Trains configs/<name> (DFlash, DFlash 2 or DSpark) into `run`, given a copy of tiny_run's
  target, on short regenerated continuations (8-token prompts, 24 new tokens). Returns run."""
  from specjax.training import registry
  shutil.copytree(os.path.join(tiny_run, "target"), os.path.join(run, "target"))
  cfg = tiny_train_config(name, run, corpus_dir, tfds_dir, learning_rate=3e-3, num_anchors=8,
                          **overrides)
  cfg.regen.update(dict(num_sequences=regen_sequences, num_validation=16, prompt_len=8,
                        new_tokens=24, batch_size=32))
  registry.train(cfg)
  return str(run)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, template_corpus_dir, tfds_dir):
  """A run directory with a tiny target and draft model trained on the template corpus."""
  from specjax.training import registry
  run_dir = tmp_path_factory.mktemp("run")
  corpus_dir = template_corpus_dir
  registry.train(tiny_train_config("target_tiny.py", run_dir, corpus_dir, tfds_dir,
                                   num_steps=120, learning_rate=1e-2, eval_every=40,
                                   log_every=20))
  registry.train(tiny_train_config("draft_tiny.py", run_dir, corpus_dir, tfds_dir,
                                   num_steps=8, **{"model.num_layers": 1}))
  return str(run_dir)


def jitted(model):
  """model(tokens, **kw) under jax.jit (eager NNX calls are slow on CPU)."""
  import functools

  from flax import nnx
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, static_argnames=("feature_layers", "compute_logits"))
  def call(state, tokens, **kw):
    return nnx.merge(graphdef, state)(tokens, **kw)

  return lambda tokens, **kw: call(state, tokens, **kw)
