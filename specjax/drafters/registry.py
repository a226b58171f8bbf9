"""Method names -> drafters. Each entry builds (drafter, drafter params) for a decode run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specjax import run_dir as run_dir_lib
from specjax.drafters.base import Drafter
from specjax.errors import SpecjaxError


def proposal(cfg) -> str:
  """How DFlash and parallel MTP propose at T > 0 (decode config `proposal`)."""
  from specjax.drafters.base import PROPOSALS
  value = cfg.get("proposal", "sample")
  if value not in PROPOSALS:
    raise SpecjaxError(f"proposal must be one of {', '.join(PROPOSALS)}, got '{value}'")
  return value


def _prompt_lookup(cfg, target):
  from specjax.drafters.prompt_lookup import PromptLookupDrafter
  return PromptLookupDrafter(cfg.num_draft_tokens, max_ngram=cfg.lookup_max_ngram), None


def _draft(cfg, target):
  from specjax.drafters.draft_model import DraftModelDrafter
  draft = run_dir_lib.load_transformer(cfg.run_dir, "draft")
  return DraftModelDrafter(cfg.num_draft_tokens, graphdef=draft.graphdef), draft.params


def _mtp(variant):
  def build(cfg, target):
    graphdef, params, train_cfg = run_dir_lib.load_mtp_heads(cfg.run_dir, variant, target)
    if cfg.num_draft_tokens > train_cfg.num_heads:
      raise SpecjaxError(f"num_draft_tokens={cfg.num_draft_tokens} but mtp_{variant} was "
                         f"trained with {train_cfg.num_heads} heads; lower --config."
                         "num_draft_tokens or retrain with more --config.num_heads")
    if variant == "parallel":
      from specjax.drafters.mtp_parallel import MTPParallelDrafter
      return MTPParallelDrafter(cfg.num_draft_tokens, graphdef=graphdef,
                                proposal=proposal(cfg)), params
    from specjax.drafters.mtp_sequential import MTPSequentialDrafter
    return MTPSequentialDrafter(cfg.num_draft_tokens, graphdef=graphdef,
                                target_layers=target.model_cfg.num_layers), params
  return build


def _dflash(cfg, target):
  from specjax.drafters.dflash import DFlashDrafter
  graphdef, params, layers = run_dir_lib.load_dflash(cfg.run_dir, target, cfg.block_size)
  return DFlashDrafter(cfg.block_size - 1, graphdef=graphdef, target_feature_layers=layers,
                       proposal=proposal(cfg)), params


def _dflash2(cfg, target):
  from specjax.drafters.dflash2 import DFlash2Drafter
  graphdef, params, layers = run_dir_lib.load_dflash2(cfg.run_dir, target, cfg.block_size)
  return DFlash2Drafter(cfg.block_size - 1, graphdef=graphdef, target_feature_layers=layers,
                        proposal=proposal(cfg),
                        use_selector=bool(cfg.get("selector", True))), params


def _dspark(cfg, target):
  from specjax import costs
  from specjax.decoding import schedule
  from specjax.drafters.dspark import DSparkDrafter
  from specjax.sampling import Sampler
  k = cfg.block_size - 1  # the same verify window as DFlash at this block_size
  sched, threshold = cfg.get("schedule", "fixed"), cfg.get("schedule_threshold", 0.5)
  schedule.check_schedule(sched, threshold)
  graphdef, params, layers, temps = run_dir_lib.load_dspark(cfg.run_dir, target, k)
  drafter = DSparkDrafter(k, graphdef=graphdef, target_feature_layers=layers, schedule="fixed",
                          threshold=threshold, widths=schedule.default_widths(k),
                          temperatures=temps)
  if sched == "load_aware":  # T(w) and T_draft at this batch size, measured once at start-up
    kw = dict(batch=cfg.batch_size, cache_len=cfg.cache_len,
              context_len=min(cfg.cache_len - k - 2, 48 + cfg.max_new_tokens // 2))
    sampler = Sampler(cfg.temperature, cfg.top_k, cfg.top_p)
    t = costs.verify_costs(target.graphdef, target.params, ns=[w + 1 for w in drafter.widths],
                           sampler=sampler, **kw)
    t_draft = costs.draft_cost(target.graphdef, target.params, drafter, params,
                               sampler=sampler, **kw)
    drafter = dataclasses.replace(drafter, width_seconds=tuple(t[w + 1] for w in drafter.widths),
                                  draft_seconds=t_draft)
  return dataclasses.replace(drafter, schedule=sched), params


BUILDERS: dict[str, Callable] = {
    "prompt_lookup": _prompt_lookup,
    "draft": _draft,
    "mtp_parallel": _mtp("parallel"),
    "mtp_sequential": _mtp("sequential"),
    "dflash": _dflash,
    "dflash2": _dflash2,
    "dspark": _dspark,
}
METHODS = ("ar",) + tuple(BUILDERS)
BLOCK_METHODS = ("dflash", "dflash2", "dspark")  # sized by block_size, not num_draft_tokens


def num_drafts(name: str, cfg) -> int:
  return cfg.block_size - 1 if name in BLOCK_METHODS else cfg.num_draft_tokens


def build(name: str, cfg, target) -> tuple[Drafter, object]:
  if name not in BUILDERS:
    raise SpecjaxError(f"unknown method '{name}'; known: {', '.join(METHODS)}")
  return BUILDERS[name](cfg, target)
