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

from specjax.checkpoint import Checkpoints
from specjax.drafters import dflash as dflash_lib
from specjax.drafters.mtp_parallel import heads_from_config
from specjax.drafters.mtp_sequential import modules_from_config
from specjax.data import tokenizer as tokenizer_lib
from specjax.errors import SpecjaxError
from specjax.models import Transformer, TransformerConfig

TRAIN_COMMANDS = {
    "target": "python train.py --config=configs/target_tiny.py --config.run_dir={run_dir}",
    "draft": "python train.py --config=configs/draft_tiny.py --config.run_dir={run_dir}",
    "mtp_parallel": "python train.py --config=configs/mtp_tiny.py --config.variant=parallel "
                    "--config.run_dir={run_dir}",
    "mtp_sequential": "python train.py --config=configs/mtp_tiny.py --config.variant=sequential "
                      "--config.run_dir={run_dir}",
    "dflash": "python train.py --config=configs/dflash_tiny.py --config.run_dir={run_dir}",
    "dflash2": "python train.py --config=configs/dflash2_tiny.py --config.run_dir={run_dir}",
    "dspark": "python train.py --config=configs/dspark_tiny.py --config.run_dir={run_dir}",
}


def resolve(run_dir: str) -> str:
  return os.path.abspath(os.path.expanduser(run_dir))


def model_dir(run_dir: str, name: str) -> str:
  return os.path.join(resolve(run_dir), name)


def require_model_dir(run_dir: str, name: str) -> str:
  """The folder of a trained model, or an error that names the command that trains it."""
  path = model_dir(run_dir, name)
  if not os.path.isdir(resolve(run_dir)):
    raise SpecjaxError(f"run directory {resolve(run_dir)} does not exist; train the target "
                       f"first: {TRAIN_COMMANDS['target'].format(run_dir=run_dir)}")
  ckpts = os.path.join(path, "checkpoints")
  if not os.path.isdir(ckpts) or not any(s.isdigit() for s in os.listdir(ckpts)):
    cmd = TRAIN_COMMANDS.get(name, f"python train.py --config=configs/{name}_tiny.py "
                                   "--config.run_dir={run_dir}").format(run_dir=run_dir)
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


def load_transformer(run_dir: str, name: str = "target") -> LoadedModel:
  """A trained transformer (the target, or a drafter that is one) from run_dir/<name>/.
  Its vocabulary is the target's tokenizer's."""
  folder = require_model_dir(run_dir, name)
  cfg = load_config(folder)
  model_cfg = transformer_config(cfg.model, vocab_size(run_dir))
  graphdef, abstract = abstract_transformer(model_cfg)
  params, step = restore_params(folder, abstract, with_step=True)
  return LoadedModel(cfg, model_cfg, graphdef, params, step)


def load_target(run_dir: str) -> LoadedModel:
  return load_transformer(run_dir, "target")


def load_module(run_dir: str, name: str, build):
  """(graphdef, params, training config) of the model in run_dir/<name>/, whatever it is:
  `build(cfg, rngs)` makes it from its saved config (abstractly: nothing is initialised)."""
  folder = require_model_dir(run_dir, name)
  cfg = load_config(folder)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(cfg, nnx.Rngs(0))), nnx.Param)
  return graphdef, restore_params(folder, abstract), cfg


HEAD_BUILDERS = {"parallel": heads_from_config, "sequential": modules_from_config}


def load_mtp_heads(run_dir: str, variant: str, target):
  """(heads graphdef, heads params, training config) of a trained MTP drafter."""
  folder = require_model_dir(run_dir, f"mtp_{variant}")
  if not load_config(folder).freeze_target:
    raise SpecjaxError(
        f"{folder} was trained jointly with the target (freeze_target=False): its target is "
        "not run_dir/target, so a lossless side-by-side with the AR baseline is impossible; "
        "retrain with --config.freeze_target=True")
  return load_module(run_dir, f"mtp_{variant}",
                     lambda cfg, rngs: HEAD_BUILDERS[variant](cfg, target.model_cfg, rngs))


def load_dflash(run_dir: str, target, block_size: int, method: str = "dflash"):
  """(graphdef, params, feature layers) of a trained or imported DFlash drafter, for a decode
  block size."""
  if block_size < 2:
    raise SpecjaxError(f"block_size must be >= 2, got {block_size}")
  build = dflash_lib.build_model
  if method == "dflash2":
    from specjax.drafters.dflash2 import build_model as build
  graphdef, params, cfg = load_module(
      run_dir, method, lambda cfg, rngs: build(cfg, target.model_cfg, rngs))
  if block_size > cfg.block_size:
    print(f"[{method}] warning: decoding with block_size={block_size} > the trained "
          f"{cfg.block_size}; positions past {cfg.block_size} were never trained", flush=True)
  return graphdef, params, dflash_lib.feature_layers(cfg, target.model_cfg.num_layers)


def load_dflash2(run_dir: str, target, block_size: int):
  """(graphdef, params, feature layers) of a trained or imported DFlash 2 drafter."""
  return load_dflash(run_dir, target, block_size, "dflash2")


DSPARK_CALIBRATION = "calibration.json"  # per-position temperatures, written after training


def load_dspark(run_dir: str, target, num_drafts: int, name: str = "dspark"):
  """(graphdef, params, feature layers, calibration temperatures) of a trained DSpark."""
  from specjax.drafters.dspark import build_model
  if num_drafts < 1:
    raise SpecjaxError(f"DSpark needs at least one draft, got {num_drafts}")
  graphdef, params, cfg = load_module(
      run_dir, name, lambda cfg, rngs: build_model(cfg, target.model_cfg, rngs))
  if num_drafts > cfg.block_size:
    raise SpecjaxError(f"{num_drafts} drafts but {name} was trained with block_size="
                       f"{cfg.block_size}; lower --config.block_size (DSpark drafts "
                       "block_size - 1) or retrain")
  temps = ()
  path = os.path.join(run_dir, name, DSPARK_CALIBRATION)
  if os.path.exists(path):
    with open(path) as f:
      temps = tuple(float(t) for t in json.load(f)["temperatures"])
  return graphdef, params, dflash_lib.feature_layers(cfg, target.model_cfg.num_layers), temps
