"""Continuous batching: requests refilled into C slots give each request exactly what its own
batch-1 decode gives (tokens and the tokens committed at every step), whatever its slot and
its neighbours, for AR and every drafter; at T = 1 the second wave of requests, decoded in
slots the first wave used, samples the target's exact marginals."""

import dataclasses

import jax
import numpy as np
import pytest

from decoding_helpers import random_prompts, tiny_model
from specjax import sharding
from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import pad_prompts, to_lists
from specjax.decoding.continuous import Slots, serve
from specjax.decoding.speculative import SpeculativeDecoder
from specjax.drafters.dspark import DSparkDrafter
from specjax.errors import SpecjaxError
from specjax.sampling import Sampler
from test_sampling_lossless import (N, PROMPT, STEPS, TOL, V, drafters, empirical,
                                    exact_marginals, tv)

NEW, CACHE, SLOTS = 10, 32, 3
METHODS = ("ar", "prompt_lookup", "target_itself", "draft_model", "mtp_parallel_sample",
           "mtp_sequential", "dflash_argmax", "dflash2", "dspark", "dspark_threshold",
           "dspark_load_aware", "eagle3_draft_vocab")


@pytest.fixture(scope="module")
def target():
  return tiny_model(V, seed=3)


@pytest.fixture(scope="module")
def every_drafter(target):
  out = drafters(target)
  drafter, dp = out["dspark"]
  out["dspark_load_aware"] = (DSparkDrafter(
      2, graphdef=drafter.graphdef, target_feature_layers=(1, 2), schedule="load_aware",
      width_seconds=(1.0, 1.1, 1.3), draft_seconds=0.5), dp)
  return out


@pytest.fixture(scope="module")
def requests(target):
  """8 prompts and an EOS id that ends their greedy continuations at different lengths (so
  slots free up at different steps and refills interleave)."""
  g, p = target
  prompts = random_prompts(8, V, seed=11, min_len=2, max_len=9)
  tokens, lens = pad_prompts(prompts, 1)
  free = to_lists(ARDecoder(g, Sampler(), NEW, CACHE, -1)(p, tokens, lens,
                                                          jax.random.key(0)), -1)
  def spread(e):
    ends = [row.index(e) + 1 if e in row else NEW for row in free]
    return len(set(ends)), -abs(np.mean(ends) - NEW / 2)
  eos = max(range(1, V), key=spread)
  return prompts, eos


def loop_for(method, target, every_drafter, eos, sampler=Sampler(), cache=CACHE, new=NEW):
  g, p = target
  if method == "ar":
    return ARDecoder(g, sampler, new, cache, eos), (p,)
  drafter, dp = every_drafter[method]
  return SpeculativeDecoder(g, sampler, new, cache, eos, drafter=drafter,
                            record_steps=True), (p, dp)


@pytest.mark.parametrize("method", METHODS)
def test_each_request_decodes_as_it_would_alone(target, every_drafter, requests, method):
  prompts, eos = requests
  loop, params = loop_for(method, target, every_drafter, eos)
  served, stats, _ = serve(Slots(loop, SLOTS), params, prompts, jax.random.key(1), pad_id=1)
  for r in served:
    tokens, lens = pad_prompts([prompts[r.index]], 1)
    alone = loop(*params, tokens, lens, jax.random.key(1))
    assert r.tokens == to_lists(alone, eos)[0], f"{method}: request {r.index} in slot {r.slot}"
    assert r.steps == int(alone.verify_steps_B[0])
    if method != "ar":  # the same drafts accepted at every step: the drafter's state is its own
      expected = [int(c) for c in np.asarray(alone.committed_BxN[0]) if c >= 0]
      assert r.committed == expected, f"{method}: request {r.index}"
  # the requests really shared slots: every slot was refilled, and rows ended apart
  assert stats["inserts"] == len(prompts)
  assert len({r.slot for r in served}) == SLOTS
  assert len({r.finish for r in served}) > 2
  # one run call per finishing event at most, plus one when a run ends with several
  assert stats["runs"] <= len(prompts)
  assert 0 < stats["row_steps"] <= stats["slot_steps"]


def test_arrivals_over_time_wait_for_their_time(target, every_drafter, requests):
  prompts, eos = requests
  loop, params = loop_for("prompt_lookup", target, every_drafter, eos)
  arrivals = np.linspace(0.0, 0.3, len(prompts))[::-1]  # the last prompt arrives first
  slots = Slots(loop, 2)
  served, stats, _ = serve(slots, params, prompts, jax.random.key(1), pad_id=1,
                           arrivals=arrivals, step_bound=2, prompt_width=20)
  for r in served:
    assert r.first_token >= r.arrival
    assert r.finish >= r.first_token
    tokens, lens = pad_prompts([prompts[r.index]], 1)
    assert r.tokens == to_lists(loop(*params, tokens, lens, jax.random.key(1)), eos)[0]
  order = sorted(served, key=lambda r: r.first_token)
  assert [r.index for r in order][:2] == [7, 6]


@pytest.mark.parametrize("method", ["draft_model", "dspark_threshold"])
def test_refilled_slots_sample_the_exact_distribution(target, every_drafter, method):
  """T = 1: 2N requests of the same prompt through N slots; the second wave runs in slots the
  first wave used, and its marginals must be the target's exact ones."""
  g, p = target
  sampler = Sampler(1.0)
  loop, params = loop_for(method, target, every_drafter, -1, sampler, cache=16, new=STEPS)
  n = N // 2
  served, stats, _ = serve(Slots(loop, n), params, [PROMPT] * (2 * n), jax.random.key(5),
                           pad_id=1)
  assert stats["inserts"] == 2 * n
  second = np.asarray([r.tokens for r in served[n:]])
  # the first wave filled every slot, so each second-wave request reuses a slot
  assert [r.slot for r in served[:n]] == list(range(n))
  assert all(r.first_token >= min(q.finish for q in served[:n]) for r in served[n:])
  exact = exact_marginals(g, p, sampler)
  for t in range(STEPS):
    got = np.bincount(second[:, t], minlength=V) / n
    assert tv(got, exact[t]) < TOL * 1.5, f"position {t}"


def test_bad_requests_are_one_line_errors(target, every_drafter, requests):
  prompts, eos = requests
  loop, params = loop_for("ar", target, every_drafter, eos)
  with pytest.raises(SpecjaxError, match="arrival times"):
    serve(Slots(loop, 2), params, prompts, jax.random.key(0), pad_id=1, arrivals=[0.0])
  with pytest.raises(SpecjaxError, match="cache_len"):
    serve(Slots(loop, 2), params, [[2] * 40], jax.random.key(0), pad_id=1)


def test_a_request_its_first_token_ends_leaves_at_once(target, every_drafter, requests):
  """max_new_tokens = 1: every request is done by its insert; none waits for a run."""
  prompts, eos = requests
  loop, params = loop_for("dflash_argmax", target, every_drafter, eos, new=1)
  served, stats, _ = serve(Slots(loop, 2), params, prompts, jax.random.key(1), pad_id=1)
  assert stats.get("runs", 0) == 0 and stats["inserts"] == len(prompts)
  for r in served:
    assert r.finish == r.first_token
    tokens, lens = pad_prompts([prompts[r.index]], 1)
    assert r.tokens == to_lists(loop(*params, tokens, lens, jax.random.key(1)), eos)[0]


def test_slots_over_a_mesh_serve_what_one_device_serves(target, every_drafter, requests):
  """4 slots over a 2 x 4 (data x tensor) mesh of the 8 host devices: the same tokens and
  per-step commits per request as on one device, with the state really split by rows."""
  prompts, eos = requests
  lay = sharding.Layout(sharding.make_mesh({"data": 2, "tensor": 4}))
  for method in ("ar", "draft_model", "dflash_argmax", "dspark_threshold"):
    loop, params = loop_for(method, target, every_drafter, eos)
    one, _, _ = serve(Slots(loop, 4), params, prompts, jax.random.key(1), pad_id=1)
    meshed = dataclasses.replace(loop, layout=lay)
    placed = tuple(lay.params(x) for x in params)
    got, _, state = serve(Slots(meshed, 4), placed, prompts, jax.random.key(1), pad_id=1)
    for a, b in zip(one, got):
      assert (a.tokens, a.committed, a.steps) == (b.tokens, b.committed, b.steps), method
    assert not state.pending_B.sharding.is_fully_replicated, method
    jax.clear_caches()
