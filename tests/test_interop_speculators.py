"""vLLM's speculators format: imported EAGLE-3 drafters compute the reference's logits at every
training-time-test step, import -> export is bit-exact, a drafter trained here loads in
speculators with the same logits, and specjax's chain decoding accepts what a plain reference
loop around speculators' model accepts."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_train_config
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import hf, speculators
from specjax.interop.safetensors_io import open_tensors
from specjax.methods import builtin
from specjax.training import eagle3 as eagle3_training

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from hf_models import save_checkpoint  # noqa: E402
from speculators_models import eagle3_drafter, ttt_logits  # noqa: E402

IDS = (1, 2, 3)
VOCAB = list(range(0, 320, 2))  # a draft vocabulary of every other token
STEPS = 3


def ours_ttt(run, tokens, features):
  import jax
  from flax import nnx
  target = run_dir_lib.load_target(run)
  dp, graphdef, _ = builtin.load_eagle3(run, target)
  one = jax.devices()[0]  # an imported target is laid out over the 8 test devices
  dp, params = jax.device_put(dp, one), jax.device_put(target.params, one)
  t = tokens.shape[1]
  logits = eagle3_training.ttt_logits(
      nnx.merge(graphdef, dp["model"]), nnx.merge(target.graphdef, params),
      tuple(jnp.asarray(f) for f in features), jnp.asarray(tokens), jnp.arange(t)[None],
      jnp.ones((1, t), jnp.int32), STEPS, dp.get("vocab"))
  return [np.asarray(x[0, :t - 1]) for x in logits]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def imported(request, tmp_path_factory):
  """(their drafter, its folder, a run dir with the verifier imported as target and the drafter
  imported, the verifier's HF model)."""
  root = tmp_path_factory.mktemp(f"speculators_{request.param}")
  folder, verifier = save_checkpoint(str(root / "verifier"), request.param, tie=False,
                                     layers=4, vocab=320)
  hf.import_hf(folder, str(root / "run"))
  model = eagle3_drafter(folder, layers=2, ids=IDS, draft_vocab=VOCAB)
  model.save_pretrained(str(root / "draft"))
  speculators.import_speculators(str(root / "draft"), str(root / "run"))
  return model, str(root / "draft"), str(root / "run"), verifier


def test_imported_eagle3_logits_equal_reference_at_every_ttt_step(imported):
  model, _, run, verifier = imported
  tokens = np.random.default_rng(0).integers(2, 300, (1, 24))
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  aux = torch.cat([hs[i] for i in IDS], -1).numpy()
  ref = ttt_logits(model, aux, tokens, STEPS)
  ours = ours_ttt(run, tokens, [hs[i].numpy() for i in IDS])
  for k in range(STEPS):
    diff = float(np.abs(ours[k] - ref[k]).max())
    print(f"EAGLE-3 TTT step {k}: max logit difference vs speculators {diff:.2e}")
    assert diff < 1e-4, (k, diff)
    assert (ours[k].argmax(-1) == ref[k].argmax(-1)).all()
  assert eagle3_training.load_vocab(os.path.join(run, "eagle3")) == VOCAB


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_import_then_export_is_bit_exact(imported, tmp_path, dtype):
  model, src, run, _ = imported
  if dtype == "bfloat16":  # what speculators' trainer saves
    src = str(tmp_path / "bf16")
    model.to(torch.bfloat16).save_pretrained(src)
    model.to(torch.float32)
    run2 = str(tmp_path / "run")
    shutil.copytree(os.path.join(run, "target"), os.path.join(run2, "target"))
    speculators.import_speculators(src, run2)
    run = run2
  out = str(tmp_path / "out")
  speculators.export_speculators(run, "eagle3", out)
  with open_tensors(src) as a, open_tensors(out) as b:
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():
      x, y = a.read(name), b.read(name)
      assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
  assert json.load(open(os.path.join(src, "config.json"))) == \
      json.load(open(os.path.join(out, "config.json")))


def test_import_errors_are_one_line(imported, tmp_path):
  _, src, run, _ = imported
  config = json.load(open(os.path.join(src, "config.json")))
  target_cfg = run_dir_lib.load_target(run).model_cfg
  layer = config["transformer_layer_config"]
  for change, words in [({"eagle_aux_hidden_state_layer_ids": [1, 1, 2]}, "distinct"),
                        ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}, "distinct, in 0..4"),
                        ({"transformer_layer_config": {**layer, "intermediate_size": 96}},
                         "mlp_dim"),
                        ({"target_hidden_size": 64}, "target_hidden_size"),
                        ({"norm_before_fc": True, "fc_norm": True}, "mutually exclusive")]:
    with pytest.raises(SpecjaxError, match=words):
      speculators.eagle3_config({**config, **change}, target_cfg, src)
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  json.dump({**config, "speculators_model_type": "peagle"}, open(bad / "config.json", "w"))
  with pytest.raises(SpecjaxError, match="'peagle' cannot be imported"):
    speculators.import_speculators(str(bad), run)
  with pytest.raises(SpecjaxError, match="cannot be exported"):
    speculators.export_speculators(run, "draft", str(tmp_path / "x"))


@pytest.fixture(scope="module")
def trained(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """An EAGLE-3 trained here on the tiny target (a 256-token draft vocabulary), exported to
  the speculators format with the tiny target exported as its HF verifier."""
  from specjax.training import registry
  root = tmp_path_factory.mktemp("speculators_trained")
  run = root / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  registry.train(tiny_train_config("eagle3_tiny.py", run, template_corpus_dir, tfds_dir,
                                   num_steps=60, log_every=20, eval_every=60, save_every=60,
                                   learning_rate=1e-2, draft_vocab_size=256, vocab_batches=8))
  verifier = hf.export_hf(str(run), str(root / "verifier"))
  out = str(root / "speculators")
  speculators.export_speculators(str(run), "eagle3", out, verifier)
  from speculators.models.eagle3 import Eagle3SpeculatorConfig
  from speculators.models.eagle3.core import Eagle3DraftModel
  cfg = Eagle3SpeculatorConfig.from_pretrained(out)
  cfg.transformer_layer_config._attn_implementation = "eager"
  model = Eagle3DraftModel.from_pretrained(out, config=cfg).eval()
  return str(run), verifier, model


def test_trained_eagle3_exported_loads_in_speculators_with_the_same_logits(trained):
  from transformers import AutoModelForCausalLM
  run, verifier_dir, model = trained
  cfg = run_dir_lib.load_config(os.path.join(run, "eagle3"))
  ids = tuple(cfg.feature_layers) or builtin.load_eagle3(run, run_dir_lib.load_target(run))[2]
  assert model.config.eagle_aux_hidden_state_layer_ids == list(ids)
  assert model.draft_vocab_size == 256
  verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
  vocab = run_dir_lib.load_target(run).model_cfg.vocab_size
  tokens = np.random.default_rng(1).integers(3, vocab, (1, 32))
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref = ttt_logits(model, torch.cat([hs[i] for i in ids], -1).numpy(), tokens, STEPS)
  ours = ours_ttt(run, tokens, [hs[i].numpy() for i in ids])
  for k in range(STEPS):
    diff = float(np.abs(ours[k] - ref[k]).max())
    print(f"trained EAGLE-3 TTT step {k}: max logit difference in speculators {diff:.2e}")
    assert diff < 1e-4, (k, diff)


def reference_decode(model, verifier, ids, prompt, k: int, max_new: int):
  """Greedy chain drafting around speculators' model with no cache: each draft from their
  TTT logits over the whole committed sequence plus the drafts so far, verified by the HF
  verifier's argmax. Returns (generated tokens, drafts accepted per step: by verification,
  as specjax's accept_counts records them, even where max_new ends the row first)."""
  def hidden(seq):
    with torch.no_grad():
      out = verifier(torch.as_tensor([seq]), output_hidden_states=True)
    return out.logits[0].numpy(), torch.cat([out.hidden_states[i] for i in ids], -1).numpy()

  vocab = np.arange(model.draft_vocab_size) + model.d2t.numpy()
  logits, _ = hidden(prompt)
  seq = list(prompt) + [int(logits[-1].argmax())]
  generated, accepted = [seq[-1]], []
  while len(generated) < max_new:
    end, drafts = len(seq) - 1, []
    for j in range(k):
      cur = seq + drafts
      _, aux = hidden(cur)
      step = ttt_logits(model, aux, np.asarray([cur]), j + 1)[j]
      drafts.append(int(vocab[step[end - 1].argmax()]))
    logits, _ = hidden(seq + drafts)
    target = logits[end:].argmax(-1)
    m = 0
    while m < k and drafts[m] == target[m]:
      m += 1
    new = (drafts[:m] + [int(target[m])])[:max_new - len(generated)]
    accepted.append(m)
    generated += new
    seq += new
  return generated, accepted


def test_chain_decoding_accepts_what_a_reference_loop_around_speculators_accepts(trained):
  from transformers import AutoModelForCausalLM
  from decoding_helpers import run_spec
  from specjax.drafters.eagle3 import Eagle3Drafter
  run, verifier_dir, model = trained
  verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
  target = run_dir_lib.load_target(run)
  dp, graphdef, ids = builtin.load_eagle3(run, target)
  k, max_new = 3, 20
  drafter = Eagle3Drafter(k, graphdef=graphdef, target_feature_layers=ids)
  rng = np.random.default_rng(2)
  accepted_any = 0
  for _ in range(3):
    prompt = rng.integers(3, target.model_cfg.vocab_size, 10).tolist()
    tokens, accepted = reference_decode(model, verifier, ids, prompt, k, max_new)
    r = run_spec(target.graphdef, target.params, drafter, dp, [prompt], max_new, eos=-1,
                 cache_len=64)
    assert np.asarray(r.tokens_BxN)[0, :max_new].tolist() == tokens
    assert np.asarray(r.accept_counts).tolist() == np.bincount(accepted, minlength=k + 1).tolist()
    accepted_any += sum(accepted)
  assert accepted_any > 0  # a trained drafter: the comparison covers acceptances



# -- DFlash ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def imported_dflash(request, tmp_path_factory):
  from speculators_models import dflash_drafter
  root = tmp_path_factory.mktemp(f"speculators_dflash_{request.param}")
  folder, verifier = save_checkpoint(str(root / "verifier"), request.param, tie=False,
                                     layers=4, vocab=320)
  hf.import_hf(folder, str(root / "run"))
  model = dflash_drafter(folder, layers=2, ids=IDS, block_size=6, mask_token_id=319)
  model.save_pretrained(str(root / "draft"))
  speculators.import_speculators(str(root / "draft"), str(root / "run"))
  return model, str(root / "draft"), str(root / "run"), verifier


def test_imported_dflash_block_logits_equal_reference(imported_dflash):
  import jax
  from flax import nnx
  from speculators_models import dflash_block_logits
  model, _, run, verifier = imported_dflash
  t, pending = 11, 17
  tokens = np.random.default_rng(3).integers(2, 300, (1, t))
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref = dflash_block_logits(model, torch.cat([hs[i] for i in IDS], -1).numpy(), pending)
  target = run_dir_lib.load_target(run)
  graphdef, params, layers = builtin.load_dflash(run, target, 6)
  assert tuple(layers) == IDS
  one = jax.devices()[0]
  drafter = nnx.merge(graphdef, jax.device_put(params, one))
  tgt = nnx.merge(target.graphdef, jax.device_put(target.params, one))
  positions = jnp.arange(t)[None]
  ctx = drafter.context_kv(drafter.project(tuple(jnp.asarray(hs[i].numpy()) for i in IDS)),
                           positions)
  x = drafter.block_inputs(tgt, jnp.asarray([[pending]]), 6)
  hidden = drafter(x, jnp.arange(t, t + 6)[None], ctx, jnp.ones((1, 6, t + 6), bool))[:, 1:]
  ours = np.asarray(drafter.draft_logits(tgt, hidden))[0]
  diff = float(np.abs(ours - ref).max())
  print(f"DFlash block logits: max difference vs speculators {diff:.2e}")
  assert diff < 1e-4, diff
  assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_dflash_import_then_export_is_bit_exact(imported_dflash, tmp_path):
  _, src, run, _ = imported_dflash
  out = str(tmp_path / "out")
  speculators.export_speculators(run, "dflash", out)
  with open_tensors(src) as a, open_tensors(out) as b:
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():
      x, y = a.read(name), b.read(name)
      assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
  assert json.load(open(os.path.join(src, "config.json"))) == \
      json.load(open(os.path.join(out, "config.json")))


def test_dflash_import_errors_are_one_line(imported_dflash, tmp_path):
  _, src, run, _ = imported_dflash
  config = json.load(open(os.path.join(src, "config.json")))
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  for change, words in [({"sample_from_anchor": True}, "sample_from_anchor"),
                        ({"draft_vocab_size": 100}, "reduced draft vocabulary"),
                        ({"mask_token_id": None}, "mask_token_id"),
                        ({"aux_hidden_state_layer_ids": [0, 5]}, "distinct, in 0..4")]:
    json.dump({**config, **change}, open(bad / "config.json", "w"))
    with pytest.raises(SpecjaxError, match=words):
      speculators.import_speculators(str(bad), run)  # refused before anything is written


@pytest.fixture(scope="module")
def trained_dflash(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  """A DFlash trained here (mask token, block 8), exported with its target as the verifier and
  loaded by speculators."""
  from conftest import train_block_drafter
  from speculators.models.dflash import DFlashSpeculatorConfig
  from speculators.models.dflash.core import DFlashDraftModel
  root = tmp_path_factory.mktemp("speculators_dflash_trained")
  run = train_block_drafter(tiny_run, "dflash_tiny.py", str(root / "run"), template_corpus_dir,
                            tfds_dir, regen_sequences=64, num_steps=20, log_every=10,
                            eval_every=20, save_every=20, block_size=8, mask_token_id=300)
  verifier = hf.export_hf(run, str(root / "verifier"))
  out = str(root / "speculators")
  speculators.export_speculators(run, "dflash", out, verifier)
  cfg = DFlashSpeculatorConfig.from_pretrained(out)
  cfg.transformer_layer_config._attn_implementation = "eager"
  return run, verifier, DFlashDraftModel.from_pretrained(out, config=cfg).eval()


def test_trained_dflash_exported_loads_in_speculators_with_the_same_logits(trained_dflash):
  from flax import nnx
  from transformers import AutoModelForCausalLM
  from speculators_models import dflash_block_logits
  run, verifier_dir, model = trained_dflash
  target = run_dir_lib.load_target(run)
  graphdef, params, layers = builtin.load_dflash(run, target, 8)
  assert model.config.aux_hidden_state_layer_ids == list(layers)
  assert model.block_size == 8 and model.mask_token_id == 300
  verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
  t, pending = 13, 40
  tokens = np.random.default_rng(4).integers(3, target.model_cfg.vocab_size, (1, t))
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref = dflash_block_logits(model, torch.cat([hs[i] for i in layers], -1).numpy(), pending)
  drafter, tgt = nnx.merge(graphdef, params), nnx.merge(target.graphdef, target.params)
  ctx = drafter.context_kv(drafter.project(tuple(jnp.asarray(hs[i].numpy()) for i in layers)),
                           jnp.arange(t)[None])
  x = drafter.block_inputs(tgt, jnp.asarray([[pending]]), 8)
  hidden = drafter(x, jnp.arange(t, t + 8)[None], ctx, jnp.ones((1, 8, t + 8), bool))[:, 1:]
  ours = np.asarray(drafter.draft_logits(tgt, hidden))[0]
  diff = float(np.abs(ours - ref).max())
  print(f"trained DFlash block logits in speculators: max difference {diff:.2e}")
  assert diff < 1e-4, diff


# -- DSpark ----------------------------------------------------------------------------------


def ours_dspark_block(run, features, prev_tokens, bs):
  """specjax's imported DSpark on the same block: (slot logits [B, V], confidence logits [B])."""
  import jax
  from flax import nnx
  target = run_dir_lib.load_target(run)
  graphdef, params, layers, _ = builtin.load_dspark(run, target, bs)
  one = jax.devices()[0]
  model = nnx.merge(graphdef, jax.device_put(params, one))
  tgt = nnx.merge(target.graphdef, jax.device_put(target.params, one))
  t = features[0].shape[1]
  ctx = model.context_kv(model.project(tuple(jnp.asarray(f) for f in features)),
                         jnp.arange(t)[None])
  x = model.block_inputs(tgt, jnp.asarray([[prev_tokens[0]]]), bs)
  hidden = model(x, jnp.arange(t, t + bs)[None], ctx, jnp.ones((1, bs, t + bs), bool))
  e = model.previous_embedding(jnp.asarray(prev_tokens)[None])
  logits = tgt.logits(hidden) + model.markov_logits(e)
  return np.asarray(logits)[0], np.asarray(model.confidence_logit(hidden, e))[0]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def imported_dspark(request, tmp_path_factory):
  from speculators_models import dspark_drafter
  root = tmp_path_factory.mktemp(f"speculators_dspark_{request.param}")
  folder, verifier = save_checkpoint(str(root / "verifier"), request.param, tie=False,
                                     layers=4, vocab=320)
  hf.import_hf(folder, str(root / "run"))
  model = dspark_drafter(folder, layers=2, ids=IDS, block_size=6, mask_token_id=319,
                         markov_rank=8)
  model.save_pretrained(str(root / "draft"))
  speculators.import_speculators(str(root / "draft"), str(root / "run"))
  return model, str(root / "draft"), str(root / "run"), verifier


def test_imported_dspark_logits_and_confidences_equal_reference(imported_dspark):
  from speculators_models import dspark_block
  model, _, run, verifier = imported_dspark
  t = 9
  tokens = np.random.default_rng(5).integers(2, 300, (1, t))
  prev = [17, 4, 250, 9, 33, 120]  # the anchor, then the drafts each slot follows
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref_logits, ref_conf = dspark_block(model, torch.cat([hs[i] for i in IDS], -1).numpy(), prev)
  logits, conf = ours_dspark_block(run, [hs[i].numpy() for i in IDS], prev, 6)
  target = run_dir_lib.load_target(run)
  assert builtin.load_dspark(run, target, 6)[3] == ()  # theirs has no calibration step
  diff = float(np.abs(logits - ref_logits).max())
  conf_diff = float(np.abs(conf - ref_conf).max())
  print(f"DSpark slot logits: max difference vs speculators {diff:.2e}; confidence logits "
        f"{conf_diff:.2e}")
  assert diff < 1e-4 and conf_diff < 1e-4, (diff, conf_diff)
  assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()


def test_dspark_import_then_export_is_bit_exact(imported_dspark, tmp_path):
  _, src, run, _ = imported_dspark
  out = str(tmp_path / "out")
  speculators.export_speculators(run, "dspark", out)
  with open_tensors(src) as a, open_tensors(out) as b:
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():
      x, y = a.read(name), b.read(name)
      assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
  assert json.load(open(os.path.join(src, "config.json"))) == \
      json.load(open(os.path.join(out, "config.json")))


def test_dspark_import_errors_are_one_line(imported_dspark, tmp_path):
  _, src, run, _ = imported_dspark
  config = json.load(open(os.path.join(src, "config.json")))
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  for change, words in [({"sample_from_anchor": False}, "sample_from_anchor=False"),
                        ({"markov_head_type": "rnn"}, "'rnn' is not supported"),
                        ({"confidence_head_with_markov": False}, "confidence_head_with_markov"),
                        ({"enable_confidence_head": False}, "without a confidence head")]:
    json.dump({**config, **change}, open(bad / "config.json", "w"))
    with pytest.raises(SpecjaxError, match=words):
      speculators.import_speculators(str(bad), run)


@pytest.fixture(scope="module")
def trained_dspark(tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  from conftest import train_block_drafter
  from speculators.models.dspark import DSparkSpeculatorConfig
  from speculators.models.dspark.core import DSparkDraftModel
  root = tmp_path_factory.mktemp("speculators_dspark_trained")
  run = train_block_drafter(tiny_run, "dspark_tiny.py", str(root / "run"), template_corpus_dir,
                            tfds_dir, regen_sequences=64, num_steps=20, log_every=10,
                            eval_every=20, save_every=20, block_size=6, mask_token_id=300,
                            markov_rank=8)
  verifier = hf.export_hf(run, str(root / "verifier"))
  out = str(root / "speculators")
  speculators.export_speculators(run, "dspark", out, verifier)
  cfg = DSparkSpeculatorConfig.from_pretrained(out)
  cfg.transformer_layer_config._attn_implementation = "eager"
  return run, verifier, DSparkDraftModel.from_pretrained(out, config=cfg).eval()


def test_trained_dspark_exported_loads_in_speculators_with_the_same_logits(trained_dspark):
  from transformers import AutoModelForCausalLM
  from speculators_models import dspark_block
  run, verifier_dir, model = trained_dspark
  target = run_dir_lib.load_target(run)
  layers = builtin.load_dspark(run, target, 6)[2]
  assert model.config.aux_hidden_state_layer_ids == list(layers) and model.block_size == 6
  verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
  tokens = np.random.default_rng(6).integers(3, target.model_cfg.vocab_size, (1, 12))
  prev = [40, 41, 42, 7, 8, 9]
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref_logits, ref_conf = dspark_block(model, torch.cat([hs[i] for i in layers], -1).numpy(),
                                      prev)
  logits, conf = ours_dspark_block(run, [hs[i].numpy() for i in layers], prev, 6)
  diff = max(float(np.abs(logits - ref_logits).max()), float(np.abs(conf - ref_conf).max()))
  print(f"trained DSpark in speculators: max logit / confidence difference {diff:.2e}")
  assert diff < 1e-4, diff


# -- DFlash 2 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported_dflash2(tmp_path_factory):
  from speculators_models import dflash2_drafter
  root = tmp_path_factory.mktemp("speculators_dflash2")
  folder, verifier = save_checkpoint(str(root / "verifier"), "qwen3", tie=False, layers=4,
                                     vocab=320)
  hf.import_hf(folder, str(root / "run"))
  model = dflash2_drafter(folder, layers=2, ids=IDS, block_size=6, mask_token_id=319)
  model.save_pretrained(str(root / "draft"))
  speculators.import_speculators(str(root / "draft"), str(root / "run"))
  return model, str(root / "draft"), str(root / "run"), verifier


def test_imported_dflash2_logits_and_selector_scores_equal_reference(imported_dflash2):
  import jax
  from flax import nnx
  from speculators_models import dflash2_block
  model, src, run, verifier = imported_dflash2
  t, pending = 10, 21
  predecessors = [21, 5, 77, 140, 3]  # slot k's predecessor (the anchor, then drafts)
  tokens = np.random.default_rng(7).integers(2, 300, (1, t))
  with torch.no_grad():
    hs = verifier(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
  ref_unary, ref_cand, ref_scores = dflash2_block(
      model, torch.cat([hs[i] for i in IDS], -1).numpy(), pending, predecessors)
  target = run_dir_lib.load_target(run)
  graphdef, params, layers = builtin.load_dflash(run, target, 6, "dflash2")
  one = jax.devices()[0]
  drafter = nnx.merge(graphdef, jax.device_put(params, one))
  tgt = nnx.merge(target.graphdef, jax.device_put(target.params, one))
  ctx = drafter.context_kv(drafter.project(tuple(jnp.asarray(hs[i].numpy()) for i in IDS)),
                           jnp.arange(t)[None])
  x = drafter.block_inputs(tgt, jnp.asarray([[pending]]), 6)
  hidden = drafter(x, jnp.arange(t, t + 6)[None], ctx, jnp.ones((1, 6, t + 6), bool))[:, 1:]
  unary = drafter.draft_logits(tgt, hidden)
  sel = drafter.candidate_selector
  u, cand = sel.candidates(unary)
  scores = u + sel.pair_scores(hidden, jnp.asarray([predecessors]), cand)
  diffs = (float(np.abs(np.asarray(unary)[0] - ref_unary).max()),
           float(np.abs(np.asarray(scores)[0] - ref_scores).max()))
  print(f"DFlash 2 unary logits / selector scores: max difference vs speculators "
        f"{diffs[0]:.2e} / {diffs[1]:.2e}")
  assert max(diffs) < 1e-4, diffs
  assert (np.asarray(cand)[0] == ref_cand).all()
  out = str(src) + "_export"
  speculators.export_speculators(run, "dflash2", out)  # and back, bit for bit
  with open_tensors(src) as a, open_tensors(out) as b:
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():
      assert np.array_equal(a.read(name), b.read(name)) and \
          a.read(name).dtype == b.read(name).dtype, name
  assert json.load(open(os.path.join(src, "config.json"))) == \
      json.load(open(os.path.join(out, "config.json")))
