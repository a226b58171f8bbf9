"""Data pipeline: TFDS ArrayRecord storage, deterministic Grain batches, document masking,
tokenizer round trip."""

import os

import numpy as np
import pytest

from conftest import tiny_train_config
from specjax.data import pipeline, tokenizer as tokenizer_lib
from specjax.data.python_source import list_source_files, split_files
from specjax.errors import SpecjaxError


@pytest.fixture(scope="module")
def setup(corpus_dir, tfds_dir, tmp_path_factory):
  cfg = tiny_train_config("target_tiny.py", tmp_path_factory.mktemp("r"), corpus_dir, tfds_dir)
  tok = pipeline.get_tokenizer(cfg.data, str(tmp_path_factory.mktemp("t") / "tokenizer.json"))
  return cfg, tok


def batches(cfg, tok, seed, n=3, train=True, split="train"):
  ds = pipeline.packed_batches(pipeline.open_split(cfg.data, split), tok, feature="text",
                               seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=seed,
                               train=train, shuffle_window=cfg.data.shuffle_window)
  it = iter(ds)
  return [next(it) for _ in range(n)]


def test_split_is_by_file_and_disjoint(corpus_dir, setup):
  cfg, _ = setup
  files = list_source_files(corpus_dir)
  splits = split_files(files, 5)
  assert splits["validation"] and splits["train"]
  assert not set(splits["train"]) & set(splits["validation"])
  assert sorted(splits["train"] + splits["validation"]) == files
  train = pipeline.open_split(cfg.data, "train")
  val = pipeline.open_split(cfg.data, "validation")
  assert len(train) == len(splits["train"]) and len(val) == len(splits["validation"])
  paths = {train[i]["path"].decode() for i in range(len(train))}
  assert paths == set(splits["train"])


def test_storage_is_array_record_without_tensorflow(setup, tfds_dir):
  import sys
  found = [f for _, _, fs in os.walk(tfds_dir) for f in fs if ".array_record" in f]
  assert found
  assert "tensorflow" not in sys.modules


def test_batches_are_deterministic_for_a_seed(setup):
  cfg, tok = setup
  a, b, c = batches(cfg, tok, 0), batches(cfg, tok, 0), batches(cfg, tok, 1)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert any(not np.array_equal(x["tokens"], z["tokens"]) for x, z in zip(a, c))


def test_loss_mask_never_crosses_a_document_boundary(setup):
  cfg, tok = setup
  for b in batches(cfg, tok, 0, n=4):
    seg, mask, tokens, targets = b["segment_ids"], b["loss_mask"], b["tokens"], b["targets"]
    assert tokens.shape == (cfg.batch_size, cfg.seq_len)
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])
    crossing = seg[:, :-1] != seg[:, 1:]
    assert np.all(mask[:, :-1][crossing] == 0)
    assert np.all(mask[:, -1] == 0)
    assert np.all(mask[seg == 0] == 0)
    # every document piece's positions count up from its start
    for row_seg, row_pos in zip(seg, b["positions"]):
      for s in set(row_seg.tolist()) - {0}:
        pos = row_pos[row_seg == s]
        np.testing.assert_array_equal(np.diff(pos), 1)
  # every document is closed by EOS, which is then a target inside its own document
  ids = pipeline.tokenize_fn(tok, "text")({"text": b"x = 1\n"})["tokens"]
  assert ids[-1] == tokenizer_lib.EOS_ID and tokenizer_lib.EOS_ID not in ids[:-1]


def test_validation_is_one_padded_pass(setup):
  cfg, tok = setup
  val = list(pipeline.packed_batches(pipeline.open_split(cfg.data, "validation"), tok,
                                     feature="text", seq_len=cfg.seq_len,
                                     batch_size=cfg.batch_size, seed=0, train=False))
  assert val and all(b["tokens"].shape == (cfg.batch_size, cfg.seq_len) for b in val)
  n_tokens = sum(int((b["segment_ids"] > 0).sum()) for b in val)
  source = pipeline.open_split(cfg.data, "validation")
  expected = sum(len(tokenizer_lib.encode(tok, t)) + 1
                 for t in pipeline.iter_texts(source, "text"))
  assert n_tokens == expected


def test_tokenizer_round_trips_text(setup):
  _, tok = setup
  text = 'def f(x):\n    return {"a": x ** 2}  # ünïcode ✓\n\tpass'
  assert tokenizer_lib.decode(tok, tokenizer_lib.encode(tok, text)) == text
  assert tok.token_to_id("<|mask|>") == tokenizer_lib.MASK_ID


def test_given_tokenizer_is_used_as_is(setup, tmp_path):
  cfg, tok = setup
  path = str(tmp_path / "given.json")
  tok.save(path)
  cfg = cfg.copy_and_resolve_references()
  cfg.data.tokenizer_path = path
  out = str(tmp_path / "run" / "tokenizer.json")
  got = pipeline.get_tokenizer(cfg.data, out)
  assert got.get_vocab() == tok.get_vocab() and os.path.exists(out)


def test_unknown_dataset_and_feature_are_clear_errors(setup):
  cfg, tok = setup
  bad = cfg.copy_and_resolve_references()
  bad.data.name = "no_such_dataset_xyz"
  with pytest.raises(SpecjaxError, match="could not open TFDS dataset"):
    pipeline.open_split(bad.data, "train")
  source = pipeline.open_split(cfg.data, "train")
  with pytest.raises(SpecjaxError, match="no feature 'body'"):
    next(iter(pipeline.iter_texts(source, "body")))
