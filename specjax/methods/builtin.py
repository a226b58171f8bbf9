"""The built-in methods: AR, prompt lookup, the draft model, MTP (parallel heads and sequential
modules), DFlash, DSpark, DFlash 2 and EAGLE-3, each as one `Method` entry: how it is built for
decoding from a run folder, trained, and sized by the memory plan."""

from __future__ import annotations

import dataclasses
import json
import os

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.methods import Method, num_drafts, options, register

# How DFlash, DFlash 2 and parallel MTP propose at T > 0: "sample" draws each draft from its
# own processed distribution q_k and verifies with q (as Z Lab's reference does); "argmax"
# proposes the argmax, verified as a one-hot q. Both are lossless.
PROPOSAL = {"proposal": "sample"}


def proposal(name: str, cfg) -> str:
  """A method's `proposal` decode option (--config.<name>.proposal), checked."""
  from specjax.drafters.base import PROPOSALS
  value = options(name, cfg)["proposal"]
  if value not in PROPOSALS:
    raise SpecjaxError(f"--config.{name}.proposal must be one of {', '.join(PROPOSALS)}, got "
                       f"'{value}'")
  return value


def _tiny(config: str, extra: str = "") -> str:
  return f"python train.py --config=configs/{config}.py {extra}--config.run_dir={{run_dir}}"


def _abstract(build):
  from specjax.plan import abstract_module
  return abstract_module(build)


# -- loading trained drafters from run_dir/<name>/ ---------------------------------------------

def load_mtp_heads(run_dir: str, variant: str, target):
  """(heads graphdef, heads params, training config) of a trained MTP drafter."""
  name = f"mtp_{variant}"
  folder = run_dir_lib.require_model_dir(run_dir, name, train_command=get_command(name))
  if not run_dir_lib.load_config(folder).freeze_target:
    raise SpecjaxError(
        f"{folder} was trained jointly with the target (freeze_target=False): its target is "
        "not run_dir/target, so a lossless side-by-side with the AR baseline is impossible; "
        "retrain with --config.freeze_target=True")
  build = mtp_builder(variant)
  return run_dir_lib.load_module(run_dir, name,
                                 lambda cfg, rngs: build(cfg, target.model_cfg, rngs),
                                 get_command(name))


def load_dflash(run_dir: str, target, block_size: int, method: str = "dflash"):
  """(graphdef, params, feature layers) of a trained or imported DFlash (or DFlash 2)
  drafter, for a decode block size."""
  from specjax.drafters import dflash as dflash_lib
  if block_size < 2:
    raise SpecjaxError(f"block_size must be >= 2, got {block_size}")
  build = block_builder(method)
  graphdef, params, cfg = run_dir_lib.load_module(
      run_dir, method, lambda cfg, rngs: build(cfg, target.model_cfg, rngs), get_command(method))
  if block_size > cfg.block_size:
    print(f"[{method}] warning: decoding with block_size={block_size} > the trained "
          f"{cfg.block_size}; positions past {cfg.block_size} were never trained", flush=True)
  return graphdef, params, dflash_lib.feature_layers(cfg, target.model_cfg.num_layers)


DSPARK_CALIBRATION = "calibration.json"  # per-position temperatures, written after training


def load_dspark(run_dir: str, target, k: int, name: str = "dspark"):
  """(graphdef, params, feature layers, calibration temperatures) of a trained DSpark."""
  from specjax.drafters import dflash as dflash_lib
  from specjax.drafters.dspark import LEGACY_PATHS, build_model
  if k < 1:
    raise SpecjaxError(f"DSpark needs at least one draft, got {k}")
  graphdef, params, cfg = run_dir_lib.load_module(
      run_dir, name, lambda cfg, rngs: build_model(cfg, target.model_cfg, rngs),
      get_command(name), legacy_paths=LEGACY_PATHS)
  if k > cfg.block_size:
    raise SpecjaxError(f"{k} drafts but {name} was trained with block_size="
                       f"{cfg.block_size}; lower --config.block_size (DSpark drafts "
                       "block_size - 1) or retrain")
  temps = ()
  path = os.path.join(run_dir, name, DSPARK_CALIBRATION)
  if os.path.exists(path):
    with open(path) as f:
      temps = tuple(float(t) for t in json.load(f)["temperatures"])
  return graphdef, params, dflash_lib.feature_layers(cfg, target.model_cfg.num_layers), temps


def get_command(name: str) -> str:
  from specjax import methods
  return methods.train_command(name, "{run_dir}")


# -- decode builders -----------------------------------------------------------------------------

def _prompt_lookup(cfg, target):
  from specjax.drafters.prompt_lookup import PromptLookupDrafter
  return PromptLookupDrafter(cfg.num_draft_tokens,
                             max_ngram=int(options("prompt_lookup", cfg)["max_ngram"])), None


def _draft(cfg, target):
  from specjax.drafters.draft_model import DraftModelDrafter
  draft = run_dir_lib.load_transformer(cfg.run_dir, "draft", train_command=get_command("draft"))
  return DraftModelDrafter(cfg.num_draft_tokens, graphdef=draft.graphdef), draft.params


def mtp_builder(variant):
  if variant == "parallel":
    from specjax.drafters.mtp_parallel import heads_from_config
    return heads_from_config
  from specjax.drafters.mtp_sequential import modules_from_config
  return modules_from_config


def _mtp(variant):
  def build(cfg, target):
    graphdef, params, train_cfg = load_mtp_heads(cfg.run_dir, variant, target)
    if cfg.num_draft_tokens > train_cfg.num_heads:
      raise SpecjaxError(f"num_draft_tokens={cfg.num_draft_tokens} but mtp_{variant} was "
                         f"trained with {train_cfg.num_heads} heads; lower --config."
                         "num_draft_tokens or retrain with more --config.num_heads")
    if variant == "parallel":
      from specjax.drafters.mtp_parallel import MTPParallelDrafter
      return MTPParallelDrafter(cfg.num_draft_tokens, graphdef=graphdef,
                                proposal=proposal("mtp_parallel", cfg)), params
    from specjax.drafters.mtp_sequential import MTPSequentialDrafter
    return MTPSequentialDrafter(cfg.num_draft_tokens, graphdef=graphdef,
                                target_layers=target.model_cfg.num_layers), params
  return build


def block_builder(method: str):
  from specjax.drafters import dflash, dflash2, dspark
  return {"dflash": dflash.build_model, "dflash2": dflash2.build_model,
          "dspark": dspark.build_model}[method]


def _dflash(cfg, target):
  from specjax.drafters.dflash import DFlashDrafter
  graphdef, params, layers = load_dflash(cfg.run_dir, target, cfg.block_size)
  return DFlashDrafter(num_drafts("dflash", cfg), graphdef=graphdef, target_feature_layers=layers,
                       proposal=proposal("dflash", cfg)), params


def _dflash2(cfg, target):
  from specjax.drafters.dflash2 import DFlash2Drafter
  graphdef, params, layers = load_dflash(cfg.run_dir, target, cfg.block_size, "dflash2")
  return DFlash2Drafter(num_drafts("dflash2", cfg), graphdef=graphdef, target_feature_layers=layers,
                        proposal=proposal("dflash2", cfg),
                        use_selector=bool(options("dflash2", cfg)["selector"])), params


def _dspark(cfg, target):
  from specjax.decoding import schedule
  from specjax.drafters.dspark import DSparkDrafter
  k = num_drafts("dspark", cfg)  # the same verify window as DFlash at this block_size
  opts = options("dspark", cfg)
  sched, threshold = opts["schedule"], float(opts["threshold"])
  schedule.check_schedule(sched, threshold)
  graphdef, params, layers, temps = load_dspark(cfg.run_dir, target, k)
  # the load-aware schedule takes effect in _dspark_calibrate, once its costs are measured
  return DSparkDrafter(k, graphdef=graphdef, target_feature_layers=layers,
                       schedule="fixed" if sched == "load_aware" else sched,
                       threshold=threshold, widths=schedule.default_widths(k),
                       temperatures=temps), params


def _dspark_calibrate(drafter, params, cfg, target):
  """The load-aware schedule's T(w) per verify width and T_draft at this batch size, measured
  once at start-up on the weights the loop holds (packed or not)."""
  if options("dspark", cfg)["schedule"] != "load_aware":
    return drafter
  from specjax import costs
  from specjax.sampling import Sampler
  k = drafter.num_draft_tokens
  kw = dict(batch=cfg.batch_size, cache_len=cfg.cache_len,
            context_len=min(cfg.cache_len - k - 2, 48 + cfg.max_new_tokens // 2))
  sampler = Sampler(cfg.temperature, cfg.top_k, cfg.top_p)
  t = costs.verify_costs(target.graphdef, target.params, ns=[w + 1 for w in drafter.widths],
                         sampler=sampler, **kw)
  t_draft = costs.draft_cost(target.graphdef, target.params, drafter, params, sampler=sampler,
                             **kw)
  return dataclasses.replace(drafter, width_seconds=tuple(t[w + 1] for w in drafter.widths),
                             draft_seconds=t_draft, schedule="load_aware")


def load_eagle3(run_dir: str, target):
  """(drafter params {"model", and "vocab" with a draft vocabulary}, graphdef, feature
  layers) of a trained or imported EAGLE-3."""
  from specjax.drafters import eagle3
  from specjax.training.eagle3 import load_vocab
  graphdef, params, cfg = run_dir_lib.load_module(
      run_dir, "eagle3", lambda cfg, rngs: eagle3.build_model(cfg, target.model_cfg, rngs),
      get_command("eagle3"))
  drafter_params = {"model": params}
  vocab = load_vocab(run_dir_lib.model_dir(run_dir, "eagle3"))
  if vocab is not None:
    import jax.numpy as jnp
    drafter_params["vocab"] = jnp.asarray(vocab, jnp.int32)
    drafter_params["head"] = eagle3.head_rows(target.module(), drafter_params["vocab"])
  return drafter_params, graphdef, eagle3.feature_layers(cfg, target.model_cfg.num_layers)


def _eagle3(cfg, target):
  from specjax.drafters.eagle3 import Eagle3Drafter
  params, graphdef, layers = load_eagle3(cfg.run_dir, target)
  return Eagle3Drafter(cfg.num_draft_tokens, graphdef=graphdef,
                       target_feature_layers=layers), params


def _prepare_draft(params, mode):
  """Every trained drafter's projection weights (its decoder layers' q/k/v/o and MLP, a draft
  model's embedding and head) packed for the CPU kernel wherever the target's are: the
  drafter's own pass then streams them as the target's does. Values are unchanged."""
  from specjax import decode_weights
  return decode_weights.prepare_draft(params, mode)


# -- the memory plan -----------------------------------------------------------------------------

def _plan_draft(cfg, target_cfg):
  from specjax.models import Transformer
  m = run_dir_lib.transformer_config(cfg.model, target_cfg.vocab_size)
  return (_abstract(lambda r: Transformer(m, rngs=r)),
          [(m.num_layers, m.num_kv_heads, m.head_dim, m.compute_dtype)], None)


def _plan_mtp(variant):
  def plan(cfg, target_cfg):
    build = mtp_builder(cfg.get("variant", variant))
    caches = [] if variant == "parallel" else [(cfg.num_heads, target_cfg.num_kv_heads,
                                                target_cfg.head_dim, target_cfg.compute_dtype)]
    return _abstract(lambda r: build(cfg, target_cfg, r)), caches, None
  return plan


def _plan_eagle3(cfg, target_cfg):
  from specjax.drafters import eagle3
  # decoding: one cache per layer; training-time test runs its layers over the sequence
  # once per step
  return (_abstract(lambda r: eagle3.build_model(cfg, target_cfg, r)),
          [(int(cfg.num_layers), target_cfg.num_kv_heads, target_cfg.head_dim,
            target_cfg.compute_dtype)], int(cfg.seq_len) * int(cfg.ttt_steps))


def _plan_block(method):
  def plan(cfg, target_cfg):
    from specjax.drafters import dflash
    build = block_builder(method)
    lc = dflash.layer_config(cfg, target_cfg)
    tokens = int(cfg.num_anchors) * int(cfg.block_size)
    return (_abstract(lambda r: build(cfg, target_cfg, r)),
            [(cfg.num_layers, lc.num_kv_heads, lc.head_dim, lc.compute_dtype)], tokens)
  return plan


# -- trainers (imported when called: training pulls in optax, orbax and data) ----------------------

def _trainer(module: str, function: str):
  def train(cfg):
    import importlib
    return getattr(importlib.import_module(f"specjax.training.{module}"), function)(cfg)
  train.__name__ = function
  return train


register(Method("ar"))
# the longest n-gram prompt lookup matches (it tries the longest first)
register(Method("prompt_lookup", build=_prompt_lookup, options={"max_ngram": 3}))
register(Method("draft", build=_draft, trains="draft", train=_trainer("draft", "train_draft"),
                train_command=_tiny("draft_tiny"), plan_model=_plan_draft,
                prepare_params=_prepare_draft))
for _variant in ("parallel", "sequential"):
  register(Method(f"mtp_{_variant}", build=_mtp(_variant), trains="mtp",
                  train_select=(("variant", _variant),), train=_trainer("mtp", "train_mtp"),
                  train_command=_tiny("mtp_tiny", f"--config.variant={_variant} "),
                  plan_model=_plan_mtp(_variant),
                  # parallel heads are residual maps the kernel does not take: nothing to pack
                  prepare_params=None if _variant == "parallel" else _prepare_draft,
                  options=PROPOSAL if _variant == "parallel" else {}))
register(Method("dflash", build=_dflash, sized_by_block=True, trains="dflash",
                train=_trainer("dflash", "train_dflash"), train_command=_tiny("dflash_tiny"),
                plan_model=_plan_block("dflash"), prepare_params=_prepare_draft,
                options=PROPOSAL))
register(Method("dspark", build=_dspark, sized_by_block=True, trains="dspark",
                train=_trainer("dspark", "train_dspark"), train_command=_tiny("dspark_tiny"),
                plan_model=_plan_block("dspark"), prepare_params=_prepare_draft,
                calibrate=_dspark_calibrate,
                # the verify budget: fixed (every draft) | threshold (drafts whose calibrated
                # survival stays >= threshold) | load_aware (SPEC 2.7: measured step costs)
                options={"schedule": "fixed", "threshold": 0.5},
                load_variants=(("load_aware", {"schedule": "load_aware"}),)))
register(Method("dflash2", build=_dflash2, sized_by_block=True, trains="dflash2",
                train=_trainer("dflash2", "train_dflash2"), train_command=_tiny("dflash2_tiny"),
                plan_model=_plan_block("dflash2"), prepare_params=_prepare_draft,
                # selector: rerank each slot's top-K candidates (False: unary argmax / sample)
                options={**PROPOSAL, "selector": True}))
register(Method("eagle3", build=_eagle3, trains="eagle3",
                train=_trainer("eagle3", "train_eagle3"), train_command=_tiny("eagle3_tiny"),
                plan_model=_plan_eagle3, prepare_params=_prepare_draft))
