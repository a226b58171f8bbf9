"""decode.py: side-by-side evaluation, its metrics JSON, and one-line errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, load_config, tiny_train_config
from specjax import evaluate
from specjax.errors import SpecjaxError
from specjax.training import registry

SPEC_KEYS = {"method", "config", "num_prompts", "max_new_tokens", "temperature", "batch_size",
             "num_draft_tokens", "tau", "acceptance_per_position", "prefix_acceptance",
             "tau_predicted", "tokens_per_second", "wall_seconds", "target_calls",
             "generated_tokens", "speedup_vs_ar", "lossless_check", "outputs"}


def decode_config(run_dir, tmp_path, **kw):
  cfg = load_config("decode.py")
  cfg.run_dir = run_dir
  cfg.num_prompts = 6
  cfg.max_new_tokens = 12
  cfg.batch_size = 4
  cfg.cache_len = 160
  cfg.output_json = str(tmp_path / "out.json")
  cfg.measure_costs = False
  cfg.update(kw)
  return cfg


def test_decode_writes_spec_metrics_for_every_method(tiny_run, tmp_path):
  cfg = decode_config(tiny_run, tmp_path, methods="prompt_lookup,draft", measure_costs=True)
  evaluate.main(cfg)
  with open(cfg.output_json) as f:
    report = json.load(f)["methods"]
  assert list(report) == ["ar", "prompt_lookup", "draft"]  # AR is always run, first
  for name, entry in report.items():
    assert SPEC_KEYS <= set(entry), (name, SPEC_KEYS - set(entry))
    assert entry["lossless_check"] is True
    assert len(entry["outputs"]) == 6
    assert entry["tau_predicted"] == pytest.approx(entry["tau"])
    assert {"prompt", "token_ids", "text"} <= set(entry["outputs"][0])
    assert entry["target_calls"] >= 1 and entry["generated_tokens"] > 0
    assert "speedup_predicted" in entry
  assert report["ar"]["tau"] == 1.0 and report["ar"]["speedup_vs_ar"] == 1.0
  assert len(report["draft"]["acceptance_per_position"]) == cfg.num_draft_tokens
  assert os.path.exists(str(tmp_path / "out.png"))
  outs = [o["token_ids"] for o in report["ar"]["outputs"]]
  assert outs == [o["token_ids"] for o in report["draft"]["outputs"]]


def test_sampled_decode_with_the_target_as_drafter_accepts_everything(tiny_run, tmp_path):
  """The target copied in as the draft model: q = p at every draft, so every draft is
  accepted (min(1, p/q) = 1) and tau is exactly K + 1, acceptance 1 at every position. K is
  the method's own (draft_tokens), not num_draft_tokens."""
  run = tmp_path / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  shutil.copytree(os.path.join(tiny_run, "target"), run / "draft")
  cfg = decode_config(str(run), tmp_path, methods="draft", temperature=1.0, top_k=20,
                      draft_tokens="draft=2")
  report = evaluate.main(cfg)["methods"]
  assert cfg.num_draft_tokens == 4
  assert report["draft"]["lossless_check"] is None
  assert report["draft"]["num_draft_tokens"] == 2 and report["draft"]["tau"] == 3
  assert report["draft"]["acceptance_per_position"] == [1.0] * 2


def test_missing_method_folder_names_the_train_command(tiny_run, tmp_path):
  run = tmp_path / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  with pytest.raises(SpecjaxError, match="train it with: python train.py "
                                         "--config=configs/draft_tiny.py"):
    evaluate.evaluate(decode_config(str(run), tmp_path, methods="draft"))


def test_missing_run_dir_and_bad_prompts_are_clear_errors(tiny_run, tmp_path):
  with pytest.raises(SpecjaxError, match="does not exist; train the target first"):
    evaluate.evaluate(decode_config(str(tmp_path / "nope"), tmp_path))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n")
  with pytest.raises(SpecjaxError, match="has no prompts"):
    evaluate.evaluate(decode_config(tiny_run, tmp_path, prompts=str(empty)))
  long = tmp_path / "long.txt"
  long.write_text("x = 1; " * 200 + "\n")
  with pytest.raises(SpecjaxError, match="raise --config.cache_len"):
    evaluate.evaluate(decode_config(tiny_run, tmp_path, prompts=str(long)))
  with pytest.raises(SpecjaxError, match="unknown method 'medusa'"):
    evaluate.evaluate(decode_config(tiny_run, tmp_path, methods="medusa"))
  with pytest.raises(SpecjaxError, match="unknown method 'medusa'"):
    evaluate.evaluate(decode_config(tiny_run, tmp_path, draft_tokens="medusa=2"))
  with pytest.raises(SpecjaxError, match="expected method=K pairs"):
    evaluate.evaluate(decode_config(tiny_run, tmp_path, draft_tokens="prompt_lookup=0"))


def test_checkpoint_with_other_shapes_is_a_clear_error(tiny_run, tmp_path, template_corpus_dir,
                                                        tfds_dir):
  run = tmp_path / "run"
  shutil.copytree(tiny_run, run)
  cfg = tiny_train_config("target_tiny.py", run, template_corpus_dir, tfds_dir, num_steps=200)
  cfg.model.d_model = 48
  with pytest.raises(SpecjaxError, match="does not match the model config"):
    registry.train(cfg)


def cli(script, *args):
  return subprocess.run([sys.executable, os.path.join(ROOT, script), *args],
                        capture_output=True, text=True, cwd=ROOT)


def test_cli_errors_are_one_line_not_tracebacks(tmp_path):
  cases = [
      cli("train.py", "--config=configs/target_tiny.py", "--config.no_such_key=1"),
      cli("train.py", "--config=configs/missing.py"),
      cli("decode.py", f"--config.run_dir={tmp_path / 'nope'}"),
      cli("decode.py", "--config.no_such_key=1"),
      cli("decode.py", "--config.temperature=-1"),
  ]
  for proc, expect in zip(cases, ["unknown config key --config.no_such_key",
                                  "could not load the config file",
                                  "does not exist; train the target first",
                                  "unknown config key --config.no_such_key",
                                  "temperature must be >= 0"]):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert expect in proc.stderr
