"""Hugging Face Llama / Qwen3 import and export, checked against `transformers` as the peer:
logits, greedy decoding, prompt encoding, exact round trips, and one-line refusals."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_models  # noqa: E402
from conftest import ROOT, load_config  # noqa: E402
from specjax import evaluate, run_dir as run_dir_lib  # noqa: E402
from specjax.data import tokenizer as tokenizer_lib  # noqa: E402
from specjax.errors import SpecjaxError  # noqa: E402
from specjax.interop import hf, hf_config  # noqa: E402
from specjax.interop.__main__ import main as interop_main  # noqa: E402
from specjax.interop.safetensors_io import open_tensors  # noqa: E402

VARIANTS = [("llama", False), ("llama", True), ("qwen3", False), ("qwen3", True)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """(arch, tie) -> (hf folder, transformers model, run_dir), each imported once."""
  torch.set_num_threads(1)
  out = {}
  for i, (arch, tie) in enumerate(VARIANTS):
    base = tmp_path_factory.mktemp(f"{arch}_{'tied' if tie else 'untied'}")
    folder, model = hf_models.save_checkpoint(str(base / "hf"), arch, tie=tie, seed=i)
    hf.import_hf(folder, str(base / "run"))
    out[(arch, tie)] = (folder, model, str(base / "run"))
  return out


def ids_of(name):
  arch, tie = name
  return f"{arch}-{'tied' if tie else 'untied'}"


def specjax_logits(run_dir, rows):
  """Logits of every prompt in one right-padded batch; each row cut to its own length."""
  target = run_dir_lib.load_target(run_dir)
  width = max(len(r) for r in rows)
  tokens = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
  logits = jax.jit(lambda p, t: nnx.merge(target.graphdef, p)(t).logits_BxTxV)(target.params,
                                                                          tokens)
  return [np.asarray(logits[i, :len(r)]) for i, r in enumerate(rows)]


def prompt_rows(run_dir):
  tok = run_dir_lib.load_tokenizer(run_dir)
  special = run_dir_lib.load_special_ids(run_dir)
  return [tokenizer_lib.encode(tok, t, special) for t in hf_models.PROMPTS]


@pytest.mark.parametrize("variant", VARIANTS, ids=ids_of)
def test_logits_equal_transformers(imported, variant):
  folder, model, run_dir = imported[variant]
  rows = prompt_rows(run_dir)
  assert len({len(r) for r in rows}) > 2  # prompts of different lengths in one batch
  ours = specjax_logits(run_dir, rows)
  with torch.no_grad():
    for row, got in zip(rows, ours):
      ref = model(torch.tensor([row])).logits[0].numpy()
      np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


def test_imported_config_reads_every_option(imported):
  cfg = run_dir_lib.load_target(imported[("llama", False)][2]).model_cfg
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model) == (4, 2, 16, 32)
  assert cfg.rope_theta == 500_000.0 and cfg.rope_llama3_scaling == (8.0, 1.0, 4.0, 32.0)
  assert not cfg.qk_norm and not cfg.tie_embeddings and cfg.norm_eps == 1e-5
  qwen = run_dir_lib.load_target(imported[("qwen3", True)][2]).model_cfg
  assert qwen.qk_norm and qwen.tie_embeddings and qwen.rope_llama3_scaling is None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prompt_ids_are_tokenizer_json_encoding(imported, arch):
  from transformers import AutoTokenizer
  folder, _, run_dir = imported[(arch, False)]
  reference = AutoTokenizer.from_pretrained(folder)
  for text, ids in zip(hf_models.PROMPTS, prompt_rows(run_dir)):
    assert ids == reference(text).input_ids
    bos = reference.bos_token_id
    assert (ids.count(bos) == 1 and ids[0] == bos) if arch == "llama" else bos not in ids


def test_bos_added_once_when_the_config_asks(imported):
  tok = run_dir_lib.load_tokenizer(imported[("qwen3", False)][2])
  llama_tok = run_dir_lib.load_tokenizer(imported[("llama", False)][2])
  ask = tokenizer_lib.SpecialIds(eos_id=1, pad_id=1, bos_id=0, add_bos=True)
  assert tokenizer_lib.encode(tok, "x", ask) == [0] + tok.encode("x").ids
  assert tokenizer_lib.encode(llama_tok, "x", ask) == llama_tok.encode("x").ids  # already there


@pytest.mark.parametrize("variant", [("llama", False), ("qwen3", True)], ids=ids_of)
def test_decode_py_greedy_equals_transformers_generate(imported, variant, tmp_path):
  folder, model, run_dir = imported[variant]
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in hf_models.PROMPTS))
  cfg = load_config("decode.py")
  cfg.update(dict(run_dir=run_dir, methods="ar", prompts=str(prompts), max_new_tokens=16,
                  batch_size=2, cache_len=64, output_json=str(tmp_path / "out.json"),
                  measure_costs=False, plot=False, timing_repeats=1))
  outputs = evaluate.main(cfg)["methods"]["ar"]["outputs"]
  eos = run_dir_lib.load_special_ids(run_dir).eos_id
  assert len(outputs) == len(hf_models.PROMPTS)
  for row, out in zip(prompt_rows(run_dir), outputs):
    with torch.no_grad():
      ref = model.generate(torch.tensor([row]), max_new_tokens=16, do_sample=False,
                           eos_token_id=eos, pad_token_id=eos)[0, len(row):].tolist()
    assert out["token_ids"] == (ref[:-1] if ref[-1] == eos else ref)  # EOS is not kept


def test_decode_py_loads_the_import_on_one_device(imported, tmp_path):
  """Imported over 8 devices, decoded by the real command in a 1-device process."""
  run_dir = imported[("qwen3", True)][2]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(
      [sys.executable, "decode.py", f"--config.run_dir={run_dir}", "--config.methods=ar",
       "--config.num_prompts=2", "--config.max_new_tokens=4", "--config.plot=False",
       "--config.measure_costs=False", f"--config.output_json={tmp_path / 'o.json'}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / "o.json") as f:
    assert len(json.load(f)["methods"]["ar"]["outputs"]) == 2


@pytest.mark.parametrize("variant", VARIANTS, ids=ids_of)
def test_import_then_export_is_exact(imported, variant, tmp_path):
  folder, _, run_dir = imported[variant]
  hf.export_hf(run_dir, str(tmp_path / "out"))
  with open_tensors(folder) as a, open_tensors(str(tmp_path / "out")) as b:
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():
      x, y = a.read(name), b.read(name)
      assert x.dtype == y.dtype and x.shape == y.shape
      assert x.tobytes() == y.tobytes(), name
  for f in ("config.json", "generation_config.json", "tokenizer.json"):
    with open(os.path.join(folder, f)) as fa, open(tmp_path / "out" / f) as fb:
      assert fa.read() == fb.read()


def test_bf16_sharded_checkpoint_round_trip(tmp_path):
  folder, model = hf_models.save_checkpoint(str(tmp_path / "hf"), "qwen3", tie=False,
                                            dtype="bfloat16", max_shard_size="20KB")
  assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
  hf.import_hf(folder, str(tmp_path / "run"))
  target = run_dir_lib.load_target(str(tmp_path / "run"))
  assert target.model_cfg.param_dtype == "bfloat16"
  assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(target.params))
  hf.export_hf(str(tmp_path / "run"), str(tmp_path / "out"))
  with open_tensors(folder) as a, open_tensors(str(tmp_path / "out")) as b:
    assert sorted(a.names()) == sorted(b.names())
    assert all(a.read(n).tobytes() == b.read(n).tobytes() for n in a.names())
  # the exported folder loads in transformers and computes what the original does
  from transformers import AutoModelForCausalLM
  again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.bfloat16)
  row = torch.tensor([[3, 5, 7, 11]])
  with torch.no_grad():
    assert torch.equal(model(row).logits, again(row).logits)


def test_import_spreads_parameters_over_the_mesh(imported, tmp_path):
  folder, _, _ = imported[("llama", False)]
  from specjax import sharding
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
  params = hf.load_params(folder, hf_config.to_specjax(hf_config.read_json(
      os.path.join(folder, "config.json")))[1], mesh)
  wq = params["blocks"][0]["attn"]["wq"].get_value()
  assert wq.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert wq.addressable_shards[0].data.shape == (16, 1, 16)


def test_legacy_and_v5_rope_keys_give_the_same_config():
  v5 = hf_models.hf_config("llama", tie=False).to_dict()
  legacy = dict(v5)
  legacy.pop("rope_parameters")
  legacy["rope_theta"] = 500_000.0
  legacy["rope_scaling"] = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=32)
  assert hf_config.to_specjax(v5) == hf_config.to_specjax(legacy)
  old_qwen = hf_models.hf_config("qwen3", tie=True).to_dict()
  old_qwen.pop("rope_parameters")
  old_qwen["rope_theta"] = 1e6
  assert hf_config.to_specjax(old_qwen)[1].rope_theta == 1e6


@pytest.mark.parametrize("edit, key", [
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True, "sliding_window": 64}, "sliding_window"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type"),
    ({"dtype": "float16"}, "dtype"),
    ({"hidden_size": 64}, "shape"),
])
def test_unsupported_checkpoints_are_one_line_errors(imported, tmp_path, capsys, edit, key):
  folder = str(tmp_path / "hf")
  shutil.copytree(imported[("qwen3", False)][0], folder)
  with open(os.path.join(folder, "config.json")) as f:
    cfg = json.load(f)
  cfg.update(edit)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(cfg, f)
  assert interop_main(["import-hf", folder, str(tmp_path / "run")]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and key in err


def test_missing_files_are_one_line_errors(imported, tmp_path, capsys):
  folder = str(tmp_path / "hf")
  shutil.copytree(imported[("llama", True)][0], folder)
  os.remove(os.path.join(folder, "tokenizer.json"))
  assert interop_main(["import-hf", folder, str(tmp_path / "run")]) == 1
  assert "tokenizer.json" in capsys.readouterr().err
  with pytest.raises(SpecjaxError, match="model.safetensors"):
    os.remove(os.path.join(folder, "model.safetensors"))
    hf.load_params(folder, run_dir_lib.load_target(imported[("llama", True)][2]).model_cfg,
                   jax.make_mesh((1,), ("data",)))
  assert interop_main(["export-hf", str(tmp_path / "nowhere"), str(tmp_path / "o")]) == 1
