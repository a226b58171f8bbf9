"""The AR baseline loop."""

import numpy as np
import pytest

from decoding_helpers import (random_prompts, reference_greedy, run_ar, tiny_model,
                              to_lists)
from specjax.decoding.common import check_fits, pad_prompts
from specjax.errors import SpecjaxError


def test_ar_greedy_equals_python_loop_of_full_forwards_batched():
  g, p = tiny_model()
  prompts = random_prompts(5, 61, seed=1)
  got = to_lists(run_ar(g, p, prompts, 12, eos=-1), -1)
  for prompt, out in zip(prompts, got):
    assert out == reference_greedy(g, p, prompt, 12, eos=-1)


def test_ar_stops_at_eos_and_max_new_tokens_per_row():
  g, p = tiny_model()
  prompts = random_prompts(4, 61, seed=2)
  free = to_lists(run_ar(g, p, prompts, 12, eos=-1), -1)
  eos = free[0][3]  # make a token the first row emits at step 4 the EOS
  result = run_ar(g, p, prompts, 12, eos=eos)
  rows = to_lists(result, eos)
  for free_row, row, n in zip(free, rows, np.asarray(result.num_tokens_B)):
    if eos in free_row:
      cut = free_row.index(eos)
      assert row == free_row[:cut] and n == cut + 1
    else:
      assert row == free_row and n == 12
  assert len(rows[0]) <= 3  # the first row was cut by the EOS


def test_prompt_longer_than_cache_is_a_clear_error():
  tokens, lens = pad_prompts([[1] * 40, [2] * 3], 1)
  with pytest.raises(SpecjaxError, match="prompt 0 has 40 tokens.*cache_len=48"):
    check_fits(lens, 8, 4, 48)
  check_fits(lens, 3, 4, 48)


def test_empty_prompt_is_a_clear_error():
  with pytest.raises(SpecjaxError, match="prompt 1 tokenizes to nothing"):
    pad_prompts([[3], []], 1)
