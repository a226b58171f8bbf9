"""The run-directory convention (SPEC section 7): run_dir/target/, run_dir/<method>/.

Each model folder holds `config.json` (the resolved config), `checkpoints/`,
`metrics.jsonl` and, for the target, `tokenizer.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from specjax.checkpoint import Checkpoints
from specjax.data import tokenizer as tokenizer_lib
from specjax.errors import SpecjaxError
from specjax.models import Transformer, TransformerConfig

TRAIN_TARGET = "python train.py --config=configs/target_tiny.py --config.run_dir={run_dir}"


def resolve(run_dir: str) -> str:
  return os.path.abspath(os.path.expanduser(run_dir))


def model_dir(run_dir: str, name: str) -> str:
  return os.path.join(resolve(run_dir), name)


def require_model_dir(run_dir: str, name: str, train_command: str = "") -> str:
  """The folder of a trained model, or an error that names the command that trains it
  (`train_command`, with {run_dir} to fill in; the methods registry knows each method's)."""
  path = model_dir(run_dir, name)
  if not os.path.isdir(resolve(run_dir)):
    raise SpecjaxError(f"run directory {resolve(run_dir)} does not exist; train the target "
                       f"first: {TRAIN_TARGET.format(run_dir=run_dir)}")
  ckpts = os.path.join(path, "checkpoints")
  if not os.path.isdir(ckpts) or not any(s.isdigit() for s in os.listdir(ckpts)):
    cmd = (train_command or (TRAIN_TARGET if name == "target" else
                             f"python train.py --config=configs/{name}_tiny.py "
                             "--config.run_dir={run_dir}")).format(run_dir=run_dir)
    raise SpecjaxError(f"no trained '{name}' model in {path}; train it with: {cmd}")
  return path


def save_config(cfg: ml_collections.ConfigDict, path: str):
  if jax.process_index() == 0:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(cfg.to_json_best_effort(indent=2, sort_keys=True))


def load_config(folder: str) -> ml_collections.ConfigDict:
  path = os.path.join(folder, "config.json")
  if not os.path.exists(path):
    raise SpecjaxError(f"{path} is missing; retrain the model in {folder}")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def transformer_config(model_cfg, vocab_size: int) -> TransformerConfig:
  fields = {f.name for f in dataclasses.fields(TransformerConfig)} - {"vocab_size"}
  unknown = set(model_cfg.keys()) - fields
  if unknown:
    raise SpecjaxError(f"unknown model config keys {sorted(unknown)}; known: {sorted(fields)}")
  try:
    return TransformerConfig(vocab_size=vocab_size, **model_cfg.to_dict())
  except (TypeError, ValueError) as e:
    raise SpecjaxError(f"bad model config: {e}") from None


@dataclasses.dataclass
class LoadedModel:
  """A trained transformer: static config, graph definition and (placed) parameters."""
  config: ml_collections.ConfigDict
  model_cfg: TransformerConfig
  graphdef: nnx.GraphDef
  params: nnx.State
  step: int = 0  # the checkpoint step the parameters come from

  def module(self):
    return nnx.merge(self.graphdef, self.params)


def abstract_transformer(model_cfg: TransformerConfig):
  return nnx.split(nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0))), nnx.Param)


def _target_tokenizer_info(run_dir: str):
  """The `tokenizer` entry of the target's config.json (an imported target), or None."""
  path = os.path.join(model_dir(run_dir, "target"), "config.json")
  if not os.path.exists(path):
    return None
  return load_config(os.path.dirname(path)).get("tokenizer")


def load_tokenizer(run_dir: str):
  folder = require_model_dir(run_dir, "target")
  return tokenizer_lib.load_tokenizer(
      os.path.join(folder, "tokenizer.json"),
      check_specjax_ids=_target_tokenizer_info(run_dir) is None)


def load_special_ids(run_dir: str) -> tokenizer_lib.SpecialIds:
  """The run's special token ids: an imported target's own, else specjax's fixed ones."""
  info = _target_tokenizer_info(run_dir)
  if info is None:
    return tokenizer_lib.DEFAULT_SPECIAL_IDS
  try:
    return tokenizer_lib.SpecialIds.from_dict(info.to_dict())
  except TypeError as e:
    raise SpecjaxError(f"bad 'tokenizer' entry in the target config.json of {run_dir}: {e}"
                       ) from None


def vocab_size(run_dir: str) -> int:
  """The target's vocabulary (embedding rows): its config's `vocab_size` where it has one (an
  imported checkpoint may have more rows than tokens), else its tokenizer's size."""
  cfg = load_config(require_model_dir(run_dir, "target"))
  return int(cfg.get("vocab_size") or load_tokenizer(run_dir).get_vocab_size())


def restore_params(folder: str, abstract, with_step: bool = False):
  """Newest parameters in folder/checkpoints, in the shapes (and shardings) of `abstract`."""
  ckpt = Checkpoints(os.path.join(folder, "checkpoints"))
  try:
    params = ckpt.restore_params(abstract)
    return (params, ckpt.latest_step()) if with_step else params
  finally:
    ckpt.close()


def load_transformer(run_dir: str, name: str = "target", train_command: str = "") -> LoadedModel:
  """A trained transformer (the target, or a drafter that is one) from run_dir/<name>/.
  Its vocabulary is the target's tokenizer's."""
  folder = require_model_dir(run_dir, name, train_command)
  cfg = load_config(folder)
  model_cfg = transformer_config(cfg.model, vocab_size(run_dir))
  graphdef, abstract = abstract_transformer(model_cfg)
  params, step = restore_params(folder, abstract, with_step=True)
  return LoadedModel(cfg, model_cfg, graphdef, params, step)


def load_target(run_dir: str) -> LoadedModel:
  return load_transformer(run_dir, "target")


def load_module(run_dir: str, name: str, build, train_command: str = "",
                legacy_paths: dict | None = None):
  """(graphdef, params, training config) of the model in run_dir/<name>/, whatever it is:
  `build(cfg, rngs)` makes it from its saved config (abstractly: nothing is initialised).
  legacy_paths {old path: new path} (tuples of names): a checkpoint saved under an older
  module layout is read with those parameters renamed."""
  folder = require_model_dir(run_dir, name, train_command)
  cfg = load_config(folder)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0))), nnx.Param)
  try:
    return graphdef, restore_params(folder, abstract), cfg
  except SpecjaxError:
    if not legacy_paths:
      raise
    renamed = _restore_renamed(folder, abstract, legacy_paths)
    if renamed is None:
      raise
    return graphdef, renamed, cfg


def _restore_renamed(folder: str, abstract, legacy_paths: dict):
  """The checkpoint's parameters with legacy_paths' prefixes renamed, in `abstract`'s layout,
  or None if even so they do not match it."""
  ckpt = Checkpoints(os.path.join(folder, "checkpoints"))
  try:
    saved = flatten_dict(ckpt.restore_params_as_saved())
  except (ValueError, TypeError, KeyError):
    return None
  finally:
    ckpt.close()
  renamed = {}  # by path as strings (orbax saves list indices as strings)
  for path, value in saved.items():
    path = tuple(str(p) for p in (path[:-1] if path[-1] == "value" else path))  # Variable leaf
    for old, new in legacy_paths.items():
      if path[:len(old)] == tuple(old):
        path = tuple(new) + path[len(old):]
        break
    renamed[path] = value
  wanted = flatten_dict(nnx.to_pure_dict(abstract))
  keys = {tuple(str(p) for p in path): path for path in wanted}
  if set(renamed) != set(keys) or any(
      renamed[k].shape != wanted[p].shape or renamed[k].dtype != wanted[p].dtype
      for k, p in keys.items()):
    return None
  params = jax.tree.map(lambda x: x, abstract)
  nnx.replace_by_pure_dict(params, unflatten_dict({p: renamed[k] for k, p in keys.items()}))
  return params
