"""The method registry: one `Method` object per decoding method, in one table that decode,
training, the memory plan, sweeps and the report iterate.

A method is its name plus hooks; none of the generic code asks for a method by name. To add
one, build a `Method` and `register` it (the built-ins are in `builtin.py`; a fork or a test
registers its own from anywhere, before decode.py or train.py run):

    methods.register(methods.Method(
        name="repeat_last",
        build=lambda cfg, target: (RepeatLastDrafter(cfg.num_draft_tokens), None)))

and `--config.methods=ar,repeat_last` decodes it, lossless checks and report included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specjax.errors import SpecjaxError


@dataclasses.dataclass(frozen=True)
class Method:
  name: str  # decode.py's --config.methods entry; also run_dir/<name>/ when it trains a model
  # (decode config, loaded target) -> (drafter, drafter params); None only for AR
  build: Callable | None = None
  # drafts per step: block_size - 1 (block drafters), else num_draft_tokens
  sized_by_block: bool = False
  # training: train.py's config.method that trains it, the config keys that pick this method
  # among those sharing it (MTP's variant), the trainer (config -> None) and the command
  # that trains it into a run dir ({run_dir} filled in); trains=None: nothing to train
  trains: str | None = None
  train_select: tuple[tuple[str, object], ...] = ()
  train: Callable | None = None
  train_command: str = ""
  # the memory plan: (training config, target TransformerConfig) -> (abstract trainable
  # params or None, [(layers, kv_heads, head_dim, dtype)] of its KV caches, tokens per
  # sequence its layers see in training or None for all)
  plan_model: Callable | None = None
  # decode weights: (drafter params, target_weights mode) -> params as the loop holds them
  prepare_params: Callable | None = None
  # decode options {key: default}: the method's own subtree of decode.py's config, set as
  # --config.<name>.<key> and read by its build through `options(name, cfg)`
  options: dict = dataclasses.field(default_factory=dict)
  # (drafter, its params as the loop holds them, decode config, target) -> the drafter, after
  # measurements it needs of that very pair (DSpark's load-aware step costs)
  calibrate: Callable | None = None
  # the batch sweep also decodes these (variant name, decode settings): settings that exist
  # for load (DSpark's load-aware schedule)
  load_variants: tuple[tuple[str, dict], ...] = ()

  @property
  def model_dir(self) -> str | None:
    """run_dir/<name>/ holds its trained model (None: it trains nothing)."""
    return self.name if self.trains else None


_REGISTRY: dict[str, Method] = {}


def register(method: Method, replace: bool = False) -> Method:
  if method.name in _REGISTRY and not replace:
    raise SpecjaxError(f"method '{method.name}' is already registered")
  _REGISTRY[method.name] = method
  return method


def unregister(name: str):
  _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
  """Every method, AR first, in registration order (the report's row order)."""
  return tuple(_REGISTRY)


def drafting() -> tuple[str, ...]:
  return tuple(n for n, m in _REGISTRY.items() if m.build is not None)


def trained() -> tuple[str, ...]:
  """Methods that train a model into run_dir/<name>/."""
  return tuple(n for n, m in _REGISTRY.items() if m.trains)


def get(name: str) -> Method:
  if name not in _REGISTRY:
    raise SpecjaxError(f"unknown method '{name}'; known: {', '.join(_REGISTRY)}")
  return _REGISTRY[name]


def num_drafts(name: str, cfg) -> int:
  """Draft tokens per step (0 for AR)."""
  m = get(name)
  if m.build is None:
    return 0
  return int(cfg.block_size) - 1 if m.sized_by_block else int(cfg.num_draft_tokens)


def options(name: str, cfg) -> dict:
  """A method's decode options: its defaults, overridden by the decode config's subtree
  cfg.<name> (absent for a method registered after the config was made)."""
  m = get(name)
  given = dict(cfg.get(name, None) or {})
  unknown = sorted(set(given) - set(m.options))
  if unknown:
    known = ", ".join(sorted(m.options)) or "none"
    raise SpecjaxError(f"--config.{name}: unknown option(s) {', '.join(unknown)}; {name} takes "
                       f"{known}")
  return {**m.options, **given}


def with_options(cfg, name: str, **settings):
  """A copy of a decode config with cfg.<name>'s options updated (sweeps' and benches'
  variants, e.g. DSpark's schedule)."""
  import ml_collections
  out = cfg.copy_and_resolve_references()
  with out.unlocked():
    out[name] = ml_collections.ConfigDict({**options(name, cfg), **settings})
  options(name, out)  # an unknown setting is a one-line error
  return out


def option_configs() -> dict:
  """{method: ConfigDict of its decode options} for every registered method that has any:
  what configs/decode.py adds to its config."""
  import ml_collections
  return {n: ml_collections.ConfigDict(dict(m.options)) for n, m in _REGISTRY.items()
          if m.options}


def build(name: str, cfg, target, weights_mode: str = "xla", layout=None):
  """(drafter, drafter params) of a drafting method for this decode config, as the loop runs
  them: params placed on `layout`'s mesh (a sharding.Layout) if given, held as `weights_mode`
  says (decode_weights), and the drafter calibrated on them."""
  m = get(name)
  if m.build is None:
    raise SpecjaxError(f"method '{name}' has no drafter")
  drafter, params = m.build(cfg, target)
  if layout is not None:
    params = layout.params(params)
  if m.prepare_params is not None:
    params = m.prepare_params(params, weights_mode)
  if m.calibrate is not None:
    drafter = m.calibrate(drafter, params, cfg, target)
  return drafter, params


def for_training(cfg) -> Method:
  """The method a training config trains (config.method, and e.g. MTP's variant)."""
  key = cfg.get("method", "")
  found = [m for m in _REGISTRY.values() if m.trains == key
           and all(cfg.get(k) == v for k, v in m.train_select)]
  if len(found) != 1:
    known = sorted({m.trains for m in _REGISTRY.values() if m.trains})
    raise SpecjaxError(f"unknown method '{key}' in the config; known: {', '.join(known)}")
  return found[0]


TARGET = "target"  # train.py's config.method for the target itself (not a method)


def trains_target(cfg) -> bool:
  """Whether a training config trains the target (a drafter's names its method)."""
  return cfg.get("method", TARGET) == TARGET


def trainers() -> dict[str, Callable]:
  """train.py's config.method -> the function that trains it (the target's included)."""
  from specjax.training.target import train_target
  table = {TARGET: train_target}
  for m in _REGISTRY.values():
    if m.trains and m.train is not None:
      table.setdefault(m.trains, m.train)
  return table


def train_command(name: str, run_dir: str) -> str:
  m = _REGISTRY.get(name)
  cmd = m.train_command if m is not None and m.train_command else (
      f"python train.py --config=configs/{name}_tiny.py --config.run_dir={{run_dir}}")
  return cmd.format(run_dir=run_dir)


from specjax.methods import builtin  # noqa: E402,F401  (registers the built-in methods)
