"""vLLM's speculators format: imported EAGLE-3, DFlash, DSpark and DFlash 2 drafters compute
the reference's outputs (EAGLE-3 at every training-time-test step), import -> export is
bit-exact, drafters trained here load in speculators with the same outputs, and specjax's
EAGLE-3 chain decoding accepts what a plain reference loop around speculators' model accepts."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import tiny_train_config, train_block_drafter
from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import hf, speculators
from specjax.methods import builtin
from specjax.training import eagle3 as eagle3_training

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from hf_models import assert_same_checkpoint, save_checkpoint  # noqa: E402
import speculators_models as theirs  # noqa: E402

IDS = (1, 2, 3)
STEPS = 3  # EAGLE-3's TTT steps
BLOCK = 6  # the DFlash family's block
# their drafter's settings per method: EAGLE-3 on a draft vocabulary of every other token
SETTINGS = {
    "eagle3": dict(eagle_aux_hidden_state_layer_ids=list(IDS), norm_before_residual=True,
                   norm_before_fc=True, norm_output=True, draft_vocab=list(range(0, 320, 2)),
                   speculative_tokens=STEPS),
    "dflash": dict(block_size=BLOCK, aux_hidden_state_layer_ids=list(IDS), mask_token_id=319,
                   speculative_tokens=BLOCK - 1),
    "dspark": dict(block_size=BLOCK, aux_hidden_state_layer_ids=list(IDS), mask_token_id=319,
                   markov_rank=8, sample_from_anchor=True, speculative_tokens=BLOCK),
    "dflash2": dict(block_size=BLOCK, aux_hidden_state_layer_ids=list(IDS), mask_token_id=319,
                    conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=5,
                    speculative_tokens=BLOCK - 1),
}


def compare(kind, model, run, verifier, ids, vocab, seed, block=BLOCK) -> dict:
  """Max |difference| per output between their `model` and specjax's drafter in `run`, on
  random context tokens (asserting equal argmaxes / candidates)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, vocab, (1, 20 if kind == "eagle3" else 11))
  aux, features = theirs.aux_states(verifier, tokens, ids)
  if kind == "eagle3":
    ref = theirs.ttt_logits(model, aux, tokens, STEPS)
    ours = theirs.ours_ttt(run, STEPS)(tokens, features)
    for a, b in zip(ours, ref):
      assert (a.argmax(-1) == b.argmax(-1)).all()
    return {f"step {k}": float(np.abs(a - b).max()) for k, (a, b) in enumerate(zip(ours, ref))}
  prev = rng.integers(3, vocab, block).tolist()  # the anchor, then each slot's predecessor
  ref = theirs.block_outputs(kind, model, aux, prev)
  ours = theirs.ours_block(kind, run, block)(features, prev)
  assert (ours["logits"].argmax(-1) == ref["logits"].argmax(-1)).all()
  if "candidates" in ref:
    assert (ours.pop("candidates") == ref.pop("candidates")).all()
  return {name: float(np.abs(ours[name] - ref[name]).max()) for name in ref}


CASES = [("eagle3", "qwen3"), ("eagle3", "llama"), ("dflash", "qwen3"), ("dflash", "llama"),
         ("dspark", "qwen3"), ("dspark", "llama"), ("dflash2", "qwen3")]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def imported(request, tmp_path_factory):
  """(method, their random drafter, its folder, a run dir with the verifier imported as the
  target and the drafter imported, the verifier's HF model)."""
  kind, arch = request.param
  root = tmp_path_factory.mktemp(f"speculators_{kind}_{arch}")
  folder, verifier = save_checkpoint(str(root / "verifier"), arch, tie=False, layers=4,
                                     vocab=320)
  hf.import_hf(folder, str(root / "run"))
  model = theirs.drafter(kind, folder, **SETTINGS[kind])
  model.save_pretrained(str(root / "draft"))
  speculators.import_speculators(str(root / "draft"), str(root / "run"))
  return kind, model, str(root / "draft"), str(root / "run"), verifier


def test_imported_drafter_outputs_equal_reference(imported):
  kind, model, _, run, verifier = imported
  diffs = compare(kind, model, run, verifier, IDS, 300, seed=0)
  print(f"{kind}: max difference vs speculators {diffs}")
  assert max(diffs.values()) < 1e-4, diffs
  if kind == "eagle3":
    assert eagle3_training.load_vocab(os.path.join(run, "eagle3")) == list(range(0, 320, 2))
  if kind == "dspark":  # theirs has no calibration step: nor has the import
    assert builtin.load_dspark(run, run_dir_lib.load_target(run), BLOCK)[3] == ()


def test_import_then_export_is_bit_exact(imported, tmp_path):
  kind, model, src, run, _ = imported
  speculators.export_speculators(run, kind, str(tmp_path / "out"))
  assert_same_checkpoint(src, str(tmp_path / "out"))
  if kind == "eagle3":  # and in bfloat16, what their trainer saves
    src, run2 = str(tmp_path / "bf16"), str(tmp_path / "run")
    model.to(torch.bfloat16).save_pretrained(src)
    model.to(torch.float32)
    shutil.copytree(os.path.join(run, "target"), os.path.join(run2, "target"))
    speculators.import_speculators(src, run2)
    speculators.export_speculators(run2, "eagle3", str(tmp_path / "out_bf16"))
    assert_same_checkpoint(src, str(tmp_path / "out_bf16"))


ERRORS = {
    "eagle3": [({"eagle_aux_hidden_state_layer_ids": [1, 1, 2]}, "distinct"),
               ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}, "distinct, in 0..4"),
               ({"transformer_layer_config": {"intermediate_size": 96}}, "mlp_dim"),
               ({"target_hidden_size": 64}, "target_hidden_size"),
               ({"norm_before_fc": True, "fc_norm": True}, "mutually exclusive")],
    "dflash": [({"sample_from_anchor": True}, "sample_from_anchor"),
               ({"draft_vocab_size": 100}, "reduced draft vocabulary"),
               ({"mask_token_id": None}, "mask_token_id"),
               ({"aux_hidden_state_layer_ids": [0, 5]}, "distinct, in 0..4")],
    "dspark": [({"sample_from_anchor": False}, "sample_from_anchor=False"),
               ({"markov_head_type": "rnn"}, "'rnn' is not supported"),
               ({"confidence_head_with_markov": False}, "confidence_head_with_markov"),
               ({"enable_confidence_head": False}, "without a confidence head")],
    "dflash2": [({"selector_rank": None}, "no selector_rank"),
                ({"speculators_model_type": "peagle"}, "'peagle' cannot be imported")],
}


def test_import_errors_are_one_line(imported, tmp_path):
  kind, _, src, run, _ = imported
  config = json.load(open(os.path.join(src, "config.json")))
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  for change, words in ERRORS[kind]:
    if "transformer_layer_config" in change:
      change = {"transformer_layer_config": {**config["transformer_layer_config"],
                                             **change["transformer_layer_config"]}}
    json.dump({**config, **change}, open(bad / "config.json", "w"))
    with pytest.raises(SpecjaxError, match=words):  # refused before anything is written
      speculators.import_speculators(str(bad), run)
  with pytest.raises(SpecjaxError, match="cannot be exported"):
    speculators.export_speculators(run, "draft", str(tmp_path / "x"))


# -- drafters trained here ---------------------------------------------------------------------


def train_and_export(kind, tiny_run, corpus_dir, tfds_dir, root):
  """`kind` trained briefly on the tiny target (EAGLE-3 with a 256-token draft vocabulary; the
  block drafters with a mask token), exported with the target as the verifier; returns (run,
  verifier folder, their model loaded from the export)."""
  run = root / "run"
  if kind == "eagle3":
    from specjax.training import registry
    shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
    registry.train(tiny_train_config("eagle3_tiny.py", run, corpus_dir, tfds_dir, num_steps=60,
                                     log_every=20, eval_every=60, save_every=60,
                                     learning_rate=1e-2, draft_vocab_size=256,
                                     vocab_batches=8))
  else:
    train_block_drafter(tiny_run, f"{kind}_tiny.py", str(run), corpus_dir, tfds_dir,
                        regen_sequences=64, num_steps=20, log_every=10, eval_every=20,
                        save_every=20, block_size=BLOCK if kind == "dspark" else 8,
                        mask_token_id=300)
  verifier = hf.export_hf(str(run), str(root / "verifier"))
  out = str(root / "speculators")
  speculators.export_speculators(str(run), kind, out, verifier)
  return str(run), verifier, theirs.load_export(kind, out)


_TRAINED = {}


def trained_drafter(kind, tiny_run, corpus_dir, tfds_dir, tmp_path_factory):
  if kind not in _TRAINED:
    _TRAINED[kind] = train_and_export(kind, tiny_run, corpus_dir, tfds_dir,
                                      tmp_path_factory.mktemp(f"speculators_trained_{kind}"))
  return _TRAINED[kind]


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "dspark"])
def test_drafter_trained_here_loads_in_speculators_with_the_same_outputs(
    kind, tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  from transformers import AutoModelForCausalLM
  run, verifier_dir, model = trained_drafter(kind, tiny_run, template_corpus_dir, tfds_dir,
                                             tmp_path_factory)
  target = run_dir_lib.load_target(run)
  if kind == "eagle3":
    ids = builtin.load_eagle3(run, target)[2]
    assert model.config.eagle_aux_hidden_state_layer_ids == list(ids)
    assert model.draft_vocab_size == 256
  else:
    ids = (builtin.load_dspark(run, target, BLOCK) if kind == "dspark" else
           builtin.load_dflash(run, target, 8))[2]
    assert model.config.aux_hidden_state_layer_ids == list(ids) and model.mask_token_id == 300
  verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
  diffs = compare(kind, model, run, verifier, ids, target.model_cfg.vocab_size, seed=1,
                  block=getattr(model, "block_size", BLOCK))
  print(f"trained {kind} in speculators: max difference {diffs}")
  assert max(diffs.values()) < 1e-4, diffs


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
      step = theirs.ttt_logits(model, hidden(cur)[1], np.asarray([cur]), j + 1)[j]
      drafts.append(int(vocab[step[end - 1].argmax()]))
    target = hidden(seq + drafts)[0][end:].argmax(-1)
    m = 0
    while m < k and drafts[m] == target[m]:
      m += 1
    new = (drafts[:m] + [int(target[m])])[:max_new - len(generated)]
    accepted.append(m)
    generated += new
    seq += new
  return generated, accepted


def test_chain_decoding_accepts_what_a_reference_loop_around_speculators_accepts(
    tiny_run, template_corpus_dir, tfds_dir, tmp_path_factory):
  from transformers import AutoModelForCausalLM
  from decoding_helpers import run_spec
  from specjax.drafters.eagle3 import Eagle3Drafter
  run, verifier_dir, model = trained_drafter("eagle3", tiny_run, template_corpus_dir, tfds_dir,
                                             tmp_path_factory)
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
    assert np.asarray(r.accept_counts).tolist() == np.bincount(accepted,
                                                               minlength=k + 1).tolist()
    accepted_any += sum(accepted)
  assert accepted_any > 0  # a trained drafter: the comparison covers acceptances
