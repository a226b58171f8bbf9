"""Two processes with 4 CPU devices each (jax.distributed over localhost, gloo collectives)
train and decode exactly as one process over 8 devices: the same losses, final parameters and
output tokens. The two processes are launched as README.md says (JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID)."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import ROOT, load_config, tiny_train_config

# Everything tiny_train_config sets, so the command line and the in-process config agree.
TRAIN = {
    "data.vocab_size": 320, "data.shuffle_window": 16, "num_steps": 4, "batch_size": 8,
    "seq_len": 32, "log_every": 2, "eval_every": 2, "eval_batches": 2, "save_every": 2,
    "warmup_steps": 2, "model.num_layers": 2, "model.d_model": 32, "model.num_heads": 4,
    "model.num_kv_heads": 2, "model.head_dim": 8, "model.mlp_dim": 64,
    "mesh_shape.data": 2, "mesh_shape.fsdp": 2, "mesh_shape.tensor": 2,
}
DECODE = {
    "methods": "ar,prompt_lookup", "num_prompts": 8, "max_new_tokens": 8, "batch_size": 8,
    "cache_len": 128, "timing_repeats": 1, "plot": False, "measure_costs": False,
    "mesh_shape.data": 8, "mesh_shape.tensor": 1,  # a row per device, 4 per process
}
TIMEOUT_S = 300


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _flags(settings: dict) -> list[str]:
  return [f"--config.{k}={str(v).lower() if isinstance(v, bool) else v}"
          for k, v in settings.items()]


def launch_two(script: str, args: list[str], log_dir) -> None:
  """Runs `script args` as processes 0 and 1 of a 2-process job (4 CPU devices each)."""
  port = _free_port()
  procs, logs = [], []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(i))
    logs.append(open(os.path.join(log_dir, f"process{i}.log"), "w+"))
    procs.append(subprocess.Popen([sys.executable, script, *args], cwd=ROOT, env=env,
                                  stdout=logs[-1], stderr=subprocess.STDOUT))
  try:
    for p in procs:
      p.wait(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  tails = []
  for i, (p, log) in enumerate(zip(procs, logs)):
    log.seek(0)
    lines = [l for l in log.read().splitlines() if "[Gloo]" not in l]
    log.close()
    tails.append(f"--- process {i} (exit {p.returncode}):\n" + "\n".join(lines[-25:]))
  assert all(p.returncode == 0 for p in procs), "\n".join(tails)


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory, template_corpus_dir, tfds_dir):
  """The tiny target trained in this process (8 devices, a 2x2x2 mesh)."""
  from specjax.training import registry
  run_dir = tmp_path_factory.mktemp("one_process")
  registry.train(tiny_train_config("target_tiny.py", run_dir, template_corpus_dir, tfds_dir,
                                   **TRAIN))
  return str(run_dir)


def _metrics(run_dir):
  with open(os.path.join(run_dir, "target", "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(l).items() if k != "tokens_per_second"}
            for l in f if l.strip()]


def test_train_two_processes_equals_one(one_process_run, template_corpus_dir, tfds_dir,
                                        tmp_path):
  from specjax import run_dir as run_dir_lib
  run2 = tmp_path / "two_processes"
  launch_two("train.py", ["--config=configs/target_tiny.py", f"--config.run_dir={run2}",
                          f"--config.data.source_dir={template_corpus_dir}",
                          f"--config.data.tfds_dir={tfds_dir}", *_flags(TRAIN)], tmp_path)
  one, two = _metrics(one_process_run), _metrics(str(run2))
  assert [m["step"] for m in two] == [0, 2, 4]
  assert [sorted(m) for m in one] == [sorted(m) for m in two]
  for a, b in zip(one, two):
    np.testing.assert_allclose([a[k] for k in sorted(a)], [b[k] for k in sorted(b)],
                               rtol=1e-5, err_msg=f"step {a['step']}")
  p1 = run_dir_lib.load_target(one_process_run)
  p2 = run_dir_lib.load_target(str(run2))
  assert p1.step == p2.step == TRAIN["num_steps"]
  for a, b in zip(jax.tree.leaves(p1.params), jax.tree.leaves(p2.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert os.path.exists(os.path.join(run2, "target", "checkpoints", "4", "params"))


def test_decode_two_processes_equals_one(one_process_run, tmp_path):
  from specjax import evaluate
  cfg = load_config("decode.py")
  cfg.run_dir = one_process_run
  cfg.output_json = str(tmp_path / "one.json")
  for key, value in DECODE.items():
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  one = evaluate.main(cfg)["methods"]
  launch_two("decode.py", [f"--config.run_dir={one_process_run}",
                           f"--config.output_json={tmp_path / 'two.json'}", *_flags(DECODE)],
             tmp_path)
  with open(tmp_path / "two.json") as f:
    two = json.load(f)["methods"]
  assert sorted(two) == sorted(one) == ["ar", "prompt_lookup"]
  for method in one:
    ids1 = [o["token_ids"] for o in one[method]["outputs"]]
    ids2 = [o["token_ids"] for o in two[method]["outputs"]]
    assert len(ids1) == DECODE["num_prompts"] and all(ids1)
    assert ids1 == ids2, method
    assert two[method]["target_calls"] == one[method]["target_calls"]
    assert two[method]["lossless_check"] in (True, None)


@pytest.mark.parametrize("env,message", [
    ({"JAX_COORDINATOR_ADDRESS": "localhost:1234"}, "JAX_NUM_PROCESSES, JAX_PROCESS_ID not"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS not"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
     "is not host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:1234", "JAX_NUM_PROCESSES": "2",
      "JAX_PROCESS_ID": "2"}, "must be in 0..1"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:1234", "JAX_NUM_PROCESSES": "two",
      "JAX_PROCESS_ID": "0"}, "must be integers"),
])
def test_bad_launch_settings_are_one_line_errors(monkeypatch, env, message):
  from specjax import sharding
  from specjax.errors import SpecjaxError
  for key in (*sharding.LAUNCH_ENV, "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
              "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(key, raising=False)
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  with pytest.raises(SpecjaxError, match=message) as e:
    sharding.maybe_initialize_distributed()
  assert "\n" not in str(e.value)


def test_launch_settings(monkeypatch):
  from specjax import sharding
  for key in (*sharding.LAUNCH_ENV, "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
              "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(key, raising=False)
  assert sharding.distributed_launch_args() is None  # one process
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert sharding.distributed_launch_args() == {
      "coordinator_address": "host0:1234", "num_processes": 4, "process_id": 3}
  for key in sharding.LAUNCH_ENV:
    monkeypatch.delenv(key)
  monkeypatch.setenv("SLURM_NTASKS", "8")  # a managed cluster: jax finds everything
  assert sharding.distributed_launch_args() == {}
