"""Z Lab DFlash drafters: imported drafters compute the reference's logits, import -> export
round trips are exact, and greedy speculative decoding matches `dflash_generate`."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from specjax.methods import builtin
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import zlab

dflash_model = pytest.importorskip("dflash.model")

from hf_models import assert_same_checkpoint  # noqa: E402
from zlab_models import (IDS, VOCAB, block_passes, save_target_run,  # noqa: E402
                         zlab_drafter)


@pytest.fixture(scope="module")
def imported(tiny_run, tmp_path_factory):
  """(z-lab drafter, its folder, a run dir with a random target and the imported drafter)."""
  root = tmp_path_factory.mktemp("zlab")
  target = save_target_run(str(root / "run"), os.path.join(tiny_run, "target", "tokenizer.json"))
  model = zlab_drafter(output_multiplier=0.8, final_logit_softcapping=6.0)
  model.save_pretrained(str(root / "zlab"))
  zlab.import_dflash(str(root / "zlab"), str(root / "run"))
  return model, str(root / "zlab"), str(root / "run"), target


def test_imported_drafter_logits_equal_reference(imported):
  model, _, run, target = imported
  (_, _, logits, _), (_, ref_logits, _) = block_passes(model, run, "dflash", target, VOCAB)
  ours, ref = np.asarray(logits), ref_logits.numpy()
  diff = float(np.abs(ours - ref).max())
  print(f"max drafter-logit difference vs reference: {diff:.2e}")
  assert diff < 1e-4, diff
  assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_import_then_export_is_exact(imported, tmp_path):
  _, src, run, _ = imported
  zlab.export_dflash(run, str(tmp_path))
  assert_same_checkpoint(src, str(tmp_path), (
      "num_target_layers", "block_size", "dflash_config", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
      "rms_norm_eps", "hidden_size"))
  reloaded = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path))  # theirs loads it
  assert reloaded.target_layer_ids == IDS and reloaded.mask_token_id == VOCAB - 1


def test_default_target_layer_ids():
  assert zlab.default_target_layer_ids(36, 5) == dflash_model.build_target_layer_ids(36, 5)
  assert zlab.default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
  assert zlab.default_target_layer_ids(28, 1) == [14]


def test_import_errors_are_one_line(imported, tmp_path):
  _, src, run, _ = imported
  config = json.load(open(os.path.join(src, "config.json")))
  for change, words in [({"architectures": ["DFlash2DraftModel"]}, "conv_kernel_size"),
                        ({"num_target_layers": 6}, "num_target_layers"),
                        ({"hidden_size": 64}, "hidden_size")]:
    with pytest.raises(SpecjaxError, match=words):
      zlab.drafter_config({**config, **change}, zlab._target_cfg(run), src)


def test_export_of_learned_mask_vector_is_an_error(imported, tmp_path):
  _, _, run, _ = imported
  other = tmp_path / "run"
  shutil.copytree(run, other)
  path = other / "dflash" / "config.json"
  cfg = json.load(open(path))
  cfg["mask_token_id"] = -1
  path.write_text(json.dumps(cfg))
  with pytest.raises(SpecjaxError, match="mask_token_id"):
    zlab.export_dflash(str(other), str(tmp_path / "out"))


@pytest.fixture(scope="module")
def trained_export(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """specjax DFlash trained briefly with a mask token (so it exports), exported with its
  target: (run dir, z-lab drafter folder, HF target folder)."""
  from conftest import tiny_train_config
  from specjax.interop import hf
  from specjax.training import registry
  root = tmp_path_factory.mktemp("zlab_trained")
  run = root / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  cfg = tiny_train_config("dflash_tiny.py", run, template_corpus_dir, tfds_dir,
                          num_steps=60, log_every=60, eval_every=60, save_every=60,
                          learning_rate=3e-3, block_size=4, gamma=4.0, num_anchors=8,
                          mask_token_id=VOCAB - 1, feature_layers=(1,))
  cfg.regen.update(dict(num_sequences=64, num_validation=8, prompt_len=8, new_tokens=24,
                        batch_size=32))
  registry.train(cfg)
  zlab.export_dflash(str(run), str(root / "zlab"))
  hf.export_hf(str(run), str(root / "hf"))
  return str(run), str(root / "zlab"), str(root / "hf")


def test_greedy_decoding_matches_dflash_generate(trained_export, monkeypatch):
  """Same output ids and the same per-step committed lengths as the reference loop."""
  import time

  from transformers import AutoModelForCausalLM

  from decoding_helpers import drive_drafter, run_spec, to_lists
  from specjax.drafters.dflash import DFlashDrafter
  run, zdir, hfdir = trained_export
  monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)  # no CUDA on CI
  ref_target = AutoModelForCausalLM.from_pretrained(hfdir, dtype=torch.float32).eval()
  ref_drafter = dflash_model.DFlashDraftModel.from_pretrained(zdir, dtype=torch.float32).eval()
  target = run_dir_lib.load_target(run)
  graphdef, params, layers = builtin.load_dflash(run, target, 4)
  drafter = DFlashDrafter(3, graphdef=graphdef, target_feature_layers=layers)
  tok = run_dir_lib.load_tokenizer(run)
  max_new, agree, total, committed = 24, 0, 0, []
  for a, b, name in [(1, 2, "alpha"), (5, 6, "omega")]:
    prompt = tok.encode(f"def {name}_{a}{b}(x):\n    return x * {a} + {b}\n\ndef ").ids
    stats = dflash_model.dflash_generate(ref_drafter, ref_target, torch.tensor([prompt]),
                                         max_new, None, temperature=0.0, return_stats=True)
    ref_ids = stats.output_ids[0, len(prompt):].tolist()
    ours = to_lists(run_spec(target.graphdef, target.params, drafter, params, [prompt],
                             max_new, eos=-1), -1)[0]
    assert ours == ref_ids
    # per step: the reference commits m + 1 (fewer only when max_new_tokens clips the step)
    m = drive_drafter(target.graphdef, target.params, drafter, params, [prompt],
                      len(stats.acceptance_lengths), None)[:, 0]
    start = 1
    for ref_len, ours_m in zip(stats.acceptance_lengths, m):
      if start + 4 <= max_new:  # the reference drafts a shorter block near the end
        assert ref_len == ours_m + 1
        agree, total = agree + 1, total + 1
      start += ref_len
    committed += stats.acceptance_lengths
  print(f"dflash_generate: outputs identical, {agree}/{total} steps compared, committed per "
        f"step {committed}")
  assert max(committed) > 1  # the drafter accepts something
