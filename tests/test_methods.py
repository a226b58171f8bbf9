"""The method registry: a method defined here, outside the package, registered at run time,
goes through decode.py, the lossless checks (greedy and sampled), the memory plan and the
report without any file under specjax/ naming it."""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT
from decoding_helpers import random_prompts, run_ar, run_spec, tiny_model, to_lists
from specjax import evaluate, methods, plan, report, sweep
from specjax.drafters.base import Drafter
from specjax.errors import SpecjaxError
from test_decode import decode_config
import test_sampling_lossless as sampled


@dataclasses.dataclass(frozen=True)
class RepeatLastDrafter(Drafter):
  """Proposes the pending token K times (plus `shift`, its one decode option: 0 by default):
  right whenever the text repeats a token."""

  shift: int = 0

  def init(self, params, target, prefill):
    return ()

  def propose(self, params, target, state, ctx, sampler, rng):
    drafts = jnp.repeat(ctx.pending_B[:, None] + self.shift, self.num_draft_tokens, axis=1)
    return drafts.astype(jnp.int32), None, state

  def commit(self, params, target, state, verified):
    return state


@pytest.fixture
def repeat_last():
  method = methods.register(methods.Method(
      "repeat_last", options={"shift": 0},
      build=lambda cfg, target: (RepeatLastDrafter(
          cfg.num_draft_tokens, shift=int(methods.options("repeat_last", cfg)["shift"])), None)))
  yield method
  methods.unregister("repeat_last")


def test_a_registered_method_is_decoded_and_checked_by_decode_py(repeat_last, tiny_run,
                                                                  tmp_path):
  cfg = decode_config(tiny_run, tmp_path, methods="repeat_last", num_draft_tokens=3)
  evaluate.main(cfg)
  with open(cfg.output_json) as f:
    entries = json.load(f)["methods"]
  assert list(entries) == ["ar", "repeat_last"]
  entry = entries["repeat_last"]
  assert entry["lossless_check"] is True and entry["num_draft_tokens"] == 3
  assert entry["tau"] >= 1.0
  # the report orders it after the built-ins and prints its row
  assert report.ordered(entries) == ["ar", "repeat_last"]
  assert "| repeat_last | 3 |" in report.side_by_side(entries)
  # sweeps decode every drafting method that needs no training
  assert "repeat_last" in sweep.trained_methods(tiny_run)


def test_a_registered_method_is_lossless_greedy_and_sampled(repeat_last):
  g, p = tiny_model(61, seed=0)
  prompts = random_prompts(6, 61, seed=4)
  prompts[0] = [7] * 9  # a repeated token: drafts are accepted
  drafter = RepeatLastDrafter(3)
  spec = run_spec(g, p, drafter, None, prompts, 16)
  assert to_lists(spec, 0) == to_lists(run_ar(g, p, prompts, 16), 0)
  target = tiny_model(sampled.V, seed=3)
  exact = sampled.exact_marginals(*target, sampled.SAMPLERS[0])
  worst, result = sampled.worst_tv(target, RepeatLastDrafter(sampled.K), None,
                                   sampled.SAMPLERS[0], exact)
  assert worst < sampled.TOL
  assert np.asarray(result.accept_counts)[1:].sum() > 0  # some drafts were accepted


def test_the_plan_sizes_a_registered_method(repeat_last, tmp_path):
  from specjax import sharding
  from specjax.models import TransformerConfig
  cfg = decode_config("unused", tmp_path, methods="repeat_last", num_draft_tokens=5)
  target_cfg = TransformerConfig(vocab_size=61, num_layers=2, d_model=32, num_heads=4,
                                 num_kv_heads=2, head_dim=8, mlp_dim=64)
  rows = plan.plan_decode(cfg, plan.abstract_mesh(None, 1), sharding.DEFAULT_RULES,
                          ["ar", "repeat_last"], target_cfg)
  names = [r[0] for r in rows]
  assert names == ["target parameters", "target KV cache", "activations"]  # no model to size
  assert "K = 5" in rows[-1][2]


def test_a_methods_options_are_its_own_config_subtree(repeat_last, tmp_path):
  import ml_collections
  cfg = decode_config("unused", tmp_path, num_draft_tokens=2)
  assert cfg.repeat_last.shift == 0 and cfg.dspark.schedule == "fixed"  # one subtree each
  cfg.repeat_last.shift = 3  # as --config.repeat_last.shift=3
  assert methods.build("repeat_last", cfg, None)[0].shift == 3
  variant = methods.with_options(cfg, "repeat_last", shift=5)
  assert methods.build("repeat_last", variant, None)[0].shift == 5
  assert cfg.repeat_last.shift == 3  # variants are copies
  # a config made before the method was registered has no subtree: the defaults
  assert methods.options("repeat_last", ml_collections.ConfigDict()) == {"shift": 0}
  with pytest.raises(SpecjaxError, match=r"--config.repeat_last: unknown option\(s\) shfit; "
                     "repeat_last takes shift"):
    methods.with_options(cfg, "repeat_last", shfit=1)
  with pytest.raises(SpecjaxError, match="--config.dflash.proposal must be one of"):
    from specjax.methods import builtin
    builtin.proposal("dflash", methods.with_options(cfg, "dflash", proposal="best"))


def test_the_batch_sweep_decodes_load_variants_with_their_options(tiny_run, monkeypatch):
  """A method's load_variants are decoded beside it, each with its options set (DSpark's
  load-aware schedule is one); what each decode was given is recorded, not decoded."""
  methods.register(methods.Method(
      "repeat_shifted", options={"shift": 0}, load_variants=(("far", {"shift": 7}),),
      build=lambda cfg, target: (RepeatLastDrafter(cfg.num_draft_tokens), None)))
  seen = []

  def fake_run(self, method, cfg):
    seen.append((method, methods.options(method, cfg) if method != "ar" else {}))
    return {"tokens_per_second": 1.0, "wall_seconds": 1.0, "tau": 1.0}
  monkeypatch.setattr(evaluate.Harness, "run", fake_run)
  try:
    out = sweep.run(tiny_run, "batch", [1, 2], 0.0, num_prompts=2, max_new_tokens=4,
                    methods=["repeat_shifted"], repeats=1)
  finally:
    methods.unregister("repeat_shifted")
  drafted = [s for s in seen if s[0] == "repeat_shifted"]
  assert drafted == [("repeat_shifted", {"shift": 0}), ("repeat_shifted", {"shift": 7})] * 2
  assert [(r["method"], r["variant"]) for r in out["rows"] if r["batch"] == 2] == [
      ("ar", ""), ("repeat_shifted", ""), ("repeat_shifted", "far")]


def test_unknown_and_duplicate_methods_are_one_line_errors(repeat_last):
  with pytest.raises(SpecjaxError, match="unknown method 'nope'; known: ar, prompt_lookup"):
    evaluate.parse_methods("ar,nope")
  with pytest.raises(SpecjaxError, match="already registered"):
    methods.register(methods.Method("repeat_last"))


def test_no_generic_module_names_a_method():
  """Drafters import nothing above decoding/, and the method names appear only in the
  registry's built-ins (and in the report's claims about specific papers)."""
  pkg = os.path.join(ROOT, "specjax")
  for name in sorted(os.listdir(os.path.join(pkg, "drafters"))):
    if name.endswith(".py"):
      with open(os.path.join(pkg, "drafters", name)) as f:
        text = f.read()
      for above in ("run_dir", "costs", "evaluate", "specjax.training", "specjax.methods"):
        assert f"import {above}" not in text and f"specjax.{above} import" not in text, (
            name, above)
  for module in ("evaluate.py", "plan.py", "sweep.py", "run_dir.py"):
    with open(os.path.join(pkg, module)) as f:
      text = f.read()
    for method in methods.drafting():
      assert f'"{method}"' not in text, (module, method)
