"""Z Lab DFlash drafters (`dflash` package, `DFlashDraftModel`) <-> run_dir/dflash/.

  python -m specjax.interop import-dflash DRAFT_DIR RUN_DIR   # needs RUN_DIR/target
  python -m specjax.interop export-dflash RUN_DIR OUT_DIR
  python -m specjax.interop export-dflash2 RUN_DIR OUT_DIR

import-dflash reads `architectures`: DFlashDraftModel -> run_dir/dflash/, DFlash2DraftModel
-> run_dir/dflash2/.

Their checkpoint: `config.json` (Qwen3 attention keys, `num_target_layers`, `block_size`,
`dflash_config` {`target_layer_ids`, `mask_token_id`, optional `output_multiplier`,
`final_logit_softcapping`, `input_embedding_scale`}) and safetensors `fc`, `hidden_norm`,
`norm`, `layers.{i}.*` (a Qwen3 decoder layer). A drafter without q/k norms (Llama-shaped,
e.g. trained by specjax against SmolLM2) exports with `dflash_config.qk_norm: false` and no
`q_norm` / `k_norm` tensors: Z Lab's stock code always applies them, so it computes this
drafter only with those norms replaced by identity (bench/drafter_peers.py does this). Their
target layer id i is the output of decoder layer i, Hugging Face `hidden_states[i + 1]`:
specjax feature layer i + 1.

DFlash 2 (`DFlash2DraftModel`) adds `dflash_config` {`conv_kernel_size`, `conv_group_size`,
`selector_rank`, `selector_top_k`} and tensors `layers.{i}.{attention_conv,mlp_conv}.
{base_kernel, kernel_projection.weight}` and `candidate_selector.{hidden_projection.weight,
predecessor_codebook, successor_codebook}` (codebooks without `.weight`, as their loader
expects; `.weight` names are accepted on import).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import drafter_io, layer_map
from specjax.interop.safetensors_io import open_tensors

ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}


def _selector_keys(method: str) -> dict[str, int]:
  """The dflash_config keys (with specjax's defaults) a format adds to DFlash's: DFlash 2's
  convolution and selector shape; none for DFlash. Their tensors come with them."""
  if method != ARCHITECTURES["DFlash2DraftModel"]:
    return {}
  from specjax.drafters.dflash2 import SELECTOR_KEYS
  return SELECTOR_KEYS

_CONV_TENSORS = {"base_kernel": (("base_kernel",), 0),
                 "kernel_projection.weight": (("kernel_projection",), 1)}
_SELECTOR_TENSORS = {"hidden_projection.weight": (("hidden_projection",), 1),
                     "predecessor_codebook": (("predecessor_codebook",), 0),
                     "successor_codebook": (("successor_codebook",), 0)}
METHOD_ARCHITECTURE = {m: a for a, m in ARCHITECTURES.items()}


def name_table(num_layers: int, method: str = "dflash",
               qk_norm: bool = True) -> dict[str, tuple[tuple, int]]:
  """z-lab tensor name -> (specjax parameter path, n_in) (interop/layer_map.py)."""
  table = {"fc.weight": (("fc",), 1),
           "hidden_norm.weight": (("fc_norm", "scale"), 0),
           "norm.weight": (("final_norm", "scale"), 0)}
  for i in range(num_layers):
    table.update(layer_map.decoder_layer(f"layers.{i}.", ("layers", i), qk_norm=qk_norm))
    if _selector_keys(method):
      for conv in ("attention_conv", "mlp_conv"):
        for name, (path, n_in) in _CONV_TENSORS.items():
          table[f"layers.{i}.{conv}.{name}"] = (("layers", i, conv) + path, n_in)
  if _selector_keys(method):
    for name, (path, n_in) in _SELECTOR_TENSORS.items():
      table[f"candidate_selector.{name}"] = (("candidate_selector",) + path, n_in)
  return table


def _builder(method: str):
  from specjax.methods.builtin import block_builder
  return block_builder(method)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
  """Z Lab's default: one id per drafter layer, round(1 + i*(N-4)/(n-1)); one layer: N//2."""
  if num_draft_layers == 1:
    return [num_target_layers // 2]
  span = num_target_layers - 4
  return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SpecjaxError(f"cannot read {path} ({e})") from None


def _target_cfg(run_dir: str):
  """The target's TransformerConfig, from its config and tokenizer only (no weights)."""
  folder = run_dir_lib.require_model_dir(run_dir, "target")
  return run_dir_lib.transformer_config(run_dir_lib.load_config(folder).model,
                                        run_dir_lib.vocab_size(run_dir))


def _rope_theta(config: dict) -> float:
  rope = config.get("rope_parameters") or {}
  scaling = config.get("rope_scaling") or {}
  kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
  if kind != "default":
    raise SpecjaxError(f"drafter RoPE type '{kind}' is not supported (plain RoPE only)")
  return float(rope.get("rope_theta", config.get("rope_theta", 10_000.0)))


def drafter_config(zlab: dict, target_cfg, source: str) -> ml_collections.ConfigDict:
  """The run_dir/dflash/config.json of an imported z-lab drafter."""
  extra = zlab.get("dflash_config") or {}

  def value(name, default=None):  # dflash_config wins over the top level, as in theirs
    return extra.get(name, zlab.get(name, default))

  arch = (zlab.get("architectures") or ["DFlashDraftModel"])[0]
  if arch not in ARCHITECTURES:
    raise SpecjaxError(f"architecture '{arch}' is not a z-lab drafter; known: "
                       f"{', '.join(ARCHITECTURES)}")
  method = ARCHITECTURES[arch]
  d, n_target = int(zlab["hidden_size"]), int(zlab.get("num_target_layers", -1))
  if d != target_cfg.d_model:
    raise SpecjaxError(f"drafter hidden_size {d} != the target's d_model {target_cfg.d_model}")
  if n_target != target_cfg.num_layers:
    raise SpecjaxError(f"drafter num_target_layers {n_target} != the target's "
                       f"{target_cfg.num_layers} layers; import the target it was trained on")
  for key, bad in (("attention_bias", True), ("is_causal", True)):
    if zlab.get(key) == bad or extra.get(key) == bad:
      raise SpecjaxError(f"drafter {key}={bad} is not supported")
  if "sliding_attention" in (zlab.get("layer_types") or []):
    raise SpecjaxError("drafter sliding-window attention layers are not supported")
  if zlab.get("hidden_act", "silu") != "silu":
    raise SpecjaxError(f"drafter hidden_act '{zlab['hidden_act']}' is not supported (silu)")
  layers = int(zlab["num_hidden_layers"])
  ids = value("target_layer_ids") or default_target_layer_ids(n_target, layers)
  bad = [i for i in ids if not 0 <= int(i) < n_target - 1]
  if bad:  # id N-1 is HF's last hidden state, which is after the final norm
    raise SpecjaxError(f"target_layer_ids {bad} outside 0..{n_target - 2}")
  mask = value("mask_token_id")
  if mask is None or not 0 <= int(mask) < target_cfg.vocab_size:
    raise SpecjaxError(f"mask_token_id {mask} is not a token of the target's vocabulary "
                       f"(size {target_cfg.vocab_size})")
  heads = int(zlab["num_attention_heads"])
  softcap = value("final_logit_softcapping")
  cfg = ml_collections.ConfigDict({
      "method": method,
      "num_layers": layers,
      "feature_layers": [int(i) + 1 for i in ids],
      "num_feature_layers": len(ids),
      "block_size": int(value("block_size", 16)),
      "mask_token_id": int(mask),
      "layer_shape": {
          "num_heads": heads,
          "num_kv_heads": int(zlab.get("num_key_value_heads") or heads),
          "head_dim": int(zlab.get("head_dim") or d // heads),
          "mlp_dim": int(zlab["intermediate_size"]),
          "rope_theta": _rope_theta(zlab),
          "norm_eps": float(zlab.get("rms_norm_eps", 1e-6)),
          "rope_llama3_scaling": None,
          # Qwen3 decoder layers, whatever the target (false: exported by specjax, below)
          "qk_norm": bool(value("qk_norm", True)),
      },
      "output_multiplier": float(value("output_multiplier", 1.0)),
      "final_logit_softcapping": float(softcap) if softcap else 0.0,
      "embedding_scale": float(value("input_embedding_scale", 1.0)),
      "imported_from": os.path.abspath(source),
      "zlab_config_json": json.dumps(zlab, sort_keys=True),  # export starts from it
  })
  for key in _selector_keys(method):
    if value(key) is None:
      raise SpecjaxError(f"DFlash 2 drafter config has no dflash_config.{key}")
    cfg[key] = int(value(key))
  if _selector_keys(method):
    if d % cfg.conv_group_size:
      raise SpecjaxError(f"hidden_size {d} is not a multiple of conv_group_size "
                         f"{cfg.conv_group_size}")
    if not 1 <= cfg.selector_top_k <= target_cfg.vocab_size:
      raise SpecjaxError(f"selector_top_k {cfg.selector_top_k} outside 1..the target's "
                         f"vocabulary ({target_cfg.vocab_size})")
  return cfg


def import_dflash(src: str, run_dir: str):
  """A z-lab DFlash (2) checkpoint -> run_dir/dflash/ or run_dir/dflash2/ (config.json + an
  Orbax checkpoint)."""
  zlab = _read_json(os.path.join(src, "config.json"))
  target_cfg = _target_cfg(run_dir)
  cfg = drafter_config(zlab, target_cfg, src)
  abstract = drafter_io.abstract_params(_builder(cfg.method), cfg, target_cfg)
  table = name_table(cfg.num_layers, cfg.method, cfg.layer_shape.qk_norm)
  with open_tensors(src) as reader:
    for name in reader.names():  # codebooks saved by torch's save_pretrained
      if name.endswith("_codebook.weight") and name[:-len(".weight")] in table:
        table[name] = table.pop(name[:-len(".weight")])
    params, dtypes = drafter_io.read_params(reader, src, table, abstract,
                                            f"a {cfg.num_layers}-layer {cfg.method} drafter")
  cfg.export_dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
  folder = drafter_io.save_imported(run_dir, cfg.method, cfg, params)
  print(f"[import-dflash] {src} -> {folder}: {cfg.num_layers} layers, block {cfg.block_size}, "
        f"target features from specjax layers {list(cfg.feature_layers)}, mask token "
        f"{cfg.mask_token_id}", flush=True)


def export_config(cfg, target_cfg, method: str = "dflash") -> dict:
  """Their config.json for a specjax drafter (an imported one keeps its other keys)."""
  from specjax.drafters.dflash import feature_layers, layer_config
  layer = layer_config(cfg, target_cfg)
  layers = feature_layers(cfg, target_cfg.num_layers)
  if min(layers) < 1 or max(layers) >= target_cfg.num_layers:
    raise SpecjaxError(f"feature layers {list(layers)} have no z-lab target_layer_ids (they "
                       f"must be 1..{target_cfg.num_layers - 1})")
  if layer.rope_llama3_scaling is not None:
    raise SpecjaxError("drafter layers with Llama-3 RoPE scaling cannot be exported")
  base = json.loads(cfg.get("zlab_config_json", None) or "{}")
  extra = dict(base.get("dflash_config") or {})
  extra.update(target_layer_ids=[l - 1 for l in layers], mask_token_id=int(cfg.mask_token_id))
  extra.pop("qk_norm", None)
  if not layer.qk_norm:  # not Z Lab's layer: their stock code would apply q/k norms anyway
    extra["qk_norm"] = False
  selector = _selector_keys(method)
  if "block_size" in extra or selector:  # DFlash 2's loader needs it
    extra["block_size"] = int(cfg.block_size)
  if selector:
    extra.update({k: int(cfg.get(k, v)) for k, v in selector.items()})
    extra["output_multiplier"] = float(cfg.get("output_multiplier", 1.0))
    extra["final_logit_softcapping"] = float(cfg.get("final_logit_softcapping", 0.0))
  for key, value, off in (("output_multiplier", cfg.get("output_multiplier", 1.0), 1.0),
                          ("final_logit_softcapping", cfg.get("final_logit_softcapping", 0.0),
                           0.0),
                          ("input_embedding_scale", cfg.get("embedding_scale", 1.0), 1.0)):
    if float(value) != off:
      extra[key] = float(value)
  base.pop("rope_scaling", None)
  base.update({
      "architectures": [METHOD_ARCHITECTURE[method]], "model_type": "qwen3",
      "hidden_size": layer.d_model, "num_hidden_layers": layer.num_layers,
      "num_attention_heads": layer.num_heads, "num_key_value_heads": layer.num_kv_heads,
      "head_dim": layer.head_dim, "intermediate_size": layer.mlp_dim,
      "rms_norm_eps": layer.norm_eps, "rope_theta": layer.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": layer.rope_theta},
      "vocab_size": base.get("vocab_size", target_cfg.vocab_size),
      "num_target_layers": target_cfg.num_layers, "block_size": int(cfg.block_size),
      "attention_bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
      "dflash_config": extra,
  })
  base.setdefault("max_position_embeddings", 32768)
  return base


def export_dflash(run_dir: str, out_dir: str, method: str = "dflash"):
  """run_dir/<method>/ -> a z-lab checkpoint (config.json + model.safetensors) in out_dir."""
  from specjax.drafters.dflash import layer_config
  build_model = _builder(method)
  folder = run_dir_lib.require_model_dir(run_dir, method)
  cfg = run_dir_lib.load_config(folder)
  if int(cfg.get("mask_token_id", -1)) < 0:
    raise SpecjaxError("this DFlash drafter uses a learned mask vector, which z-lab's format "
                       "cannot hold; train it with --config.mask_token_id=<a token id>")
  target_cfg = _target_cfg(run_dir)
  config = export_config(cfg, target_cfg, method)
  abstract = drafter_io.abstract_params(build_model, cfg, target_cfg)
  params = drafter_io.flat(run_dir_lib.restore_params(folder, abstract))
  dtype = np.dtype(jnp.dtype(cfg.get("export_dtype", "float32")))
  qk_norm = bool(layer_config(cfg, target_cfg).qk_norm)
  count = drafter_io.write_params(out_dir, name_table(cfg.num_layers, method, qk_norm), params,
                                  dtype)
  config["dtype"] = config["torch_dtype"] = {"bfloat16": "bfloat16", "float16": "float16"}.get(
      dtype.name, "float32")
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  print(f"[export-{method}] {folder} -> {out_dir}: {count} tensors ({dtype.name})"
        + ("" if qk_norm else "; no q/k norms (dflash_config.qk_norm=false): Z Lab's code "
           "applies them unless replaced by identity"), flush=True)


def export_dflash2(run_dir: str, out_dir: str):
  """run_dir/dflash2/ -> a z-lab DFlash2DraftModel checkpoint in out_dir."""
  export_dflash(run_dir, out_dir, "dflash2")
