"""Step-cost measurement: slopes leave out a program's launch cost, and T_draft is the
drafter's marginal cost next to the target's pass. A fake clock makes the timing exact."""

import jax.numpy as jnp
import pytest

from decoding_helpers import tiny_model
from specjax import costs
from specjax.drafters.draft_model import DraftModelDrafter
from specjax.sampling import Sampler


class FakeClock:
  """perf_counter for specjax.costs: a fake call advances it by launch + trips x per_call,
  plus `noise[i]` on its i-th call."""

  def __init__(self, noise=()):
    self.now, self.calls, self.noise = 0.0, 0, list(noise)

  def __call__(self):
    return self.now

  def program(self, launch, per_call):
    def many(trips):
      extra = self.noise[self.calls] if self.calls < len(self.noise) else 0.0
      self.calls += 1
      self.now += launch + trips * per_call + extra
    return many


def test_slope_leaves_out_the_launch_cost(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(costs.time, "perf_counter", clock)
  # 5 ms to launch, 0.4 ms a call: inner=10 calls take 9 ms, of which the launch is 56%
  cheap, dear = clock.program(5e-3, 0.4e-3), clock.program(1e-3, 1.2e-3)
  got = costs.slopes([(cheap, ()), (dear, ())], inner=10, reps=3)
  assert got == pytest.approx([0.4e-3, 1.2e-3])


def test_slope_takes_the_fastest_runs(monkeypatch):
  # noise only ever adds time: one slow run of each length is ignored
  clock = FakeClock(noise=[0.0, 0.0, 7e-3, 0.0, 0.0, 9e-3, 0.0])  # the compile call first
  monkeypatch.setattr(costs.time, "perf_counter", clock)
  many = clock.program(2e-3, 0.5e-3)
  assert costs.seconds_per_call(many, (), inner=4, reps=3) == pytest.approx(0.5e-3)


def test_slopes_stop_taking_runs_once_their_budget_is_spent(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(costs.time, "perf_counter", clock)
  quick = clock.program(0.0, 0.01)  # a run of 10 + 20 trips: 0.3 s, 15 runs within budget
  assert costs.seconds_per_call(quick, (), inner=10, reps=15) == pytest.approx(0.01)
  assert clock.calls == 1 + 2 * 15
  clock.calls = 0
  slow = clock.program(0.0, 0.1)  # 3 s a run: a 5 s budget is spent after 2 runs, 3 taken
  assert costs.slopes([(slow, ())], inner=10, reps=15, budget=5.0) == pytest.approx([0.1])
  assert clock.calls == 1 + 2 * costs.MIN_REPS


def test_draft_cost_is_the_drafters_marginal_cost_next_to_the_target(monkeypatch):
  g, p = tiny_model(61, seed=0)
  dg, dp = tiny_model(61, seed=1, layers=1, d=32)
  drafter = DraftModelDrafter(3, graphdef=dg)
  seen = []

  def fake_slopes(calls, inner, reps):
    seen.append([many for many, _ in calls])
    return [3e-3, 2e-3][:len(calls)] if len(calls) == 2 else [0.7e-3]

  monkeypatch.setattr(costs, "slopes", fake_slopes)
  kw = dict(batch=1, context_len=[8, 12], cache_len=32, sampler=Sampler())
  # in the loop: (propose + target pass + commit) - the target pass alone, per context
  assert costs.draft_cost(g, p, drafter, dp, **kw) == pytest.approx(1e-3)
  assert len(seen) == 2 and all(len(c) == 2 for c in seen)
  assert costs.draft_cost(g, p, drafter, dp, in_loop=False, **kw) == pytest.approx(0.7e-3)


def test_step_loop_runs_the_drafter_and_the_target_pass():
  g, p = tiny_model(61, seed=0)
  dg, dp = tiny_model(61, seed=1, layers=1, d=32)
  drafter = DraftModelDrafter(3, graphdef=dg)
  init, alone = costs.draft_loop(g, drafter, batch=2, cache_len=32, sampler=Sampler())
  state, verified = init(p, dp, jnp.full((2, 8), 3, jnp.int32))
  both = costs.step_loop(g, drafter, batch=2, cache_len=32, sampler=Sampler())

  def computes_window_logits(fn):
    """Whether the program computes [2, K + 1, vocab] logits (the target's verify pass)."""
    text = fn.lower(p, dp, state, verified, 2).as_text()
    return any("dot_general" in line and line.endswith("-> tensor<2x4x61xf32>")
               for line in text.splitlines())

  assert computes_window_logits(both) and not computes_window_logits(alone)
  assert both(p, dp, state, verified, 3).shape == (2,)


def test_verify_loop_draws_a_token_per_pass_only_when_sampling():
  """At T > 0 an AR step pays a draw over the vocabulary per token, so T_ar includes one."""
  g, p = tiny_model(61, seed=0)
  cache = costs.context_cache(g, p, batch=1, context_len=8, cache_len=32)

  def lowered(sampler):
    return costs.verify_loop(g, batch=1, n=1, sampler=sampler).lower(p, cache, 2).as_text()

  assert "threefry" not in lowered(None) and "threefry" not in lowered(Sampler())
  assert "threefry" in lowered(Sampler(temperature=1.0))
