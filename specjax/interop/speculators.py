"""vLLM's `speculators` checkpoints (what vLLM serves) <-> run_dir/<method>/.

  python -m specjax.interop import-speculators DIR RUN_DIR            # needs RUN_DIR/target
  python -m specjax.interop export-speculators RUN_DIR METHOD OUT_DIR [VERIFIER]

Their checkpoint (speculators 0.9.0): `config.json` {`speculators_model_type`, `architectures`,
`speculators_config` {`algorithm`, `proposal_methods` [{`proposal_type`: greedy,
`speculative_tokens`, ...}], `verifier` {`name_or_path`, `architectures`}},
`transformer_layer_config` (the draft layers' HF config), and the method's keys} and
`model.safetensors` (HF `save_pretrained`).

EAGLE-3 (`eagle3`): keys `eagle_aux_hidden_state_layer_ids` (HF `hidden_states` indices, which
are specjax feature layers as they are), `draft_vocab_size`, `norm_before_residual`,
`norm_before_fc`, `fc_norm`, `norm_output`, `embed_requires_grad`, `target_hidden_size`;
tensors `fc.weight`, optional `input_norm.weight` / `fc_norm.{i}.weight`,
`layers.{i}.*` (a decoder layer; layer 0 adds `hidden_norm.weight` and reads 2H), `norm.weight`,
and the verifier's own `embed_tokens.weight` and `lm_head.weight` (its rows of the draft
vocabulary), with `d2t` (target id - draft index) and `t2d` (kept tokens) when the draft
vocabulary is smaller. specjax reads the embedding and LM head from its target, so an import
checks that the file's copies are the target's (a drafter trained with its own embedding is
refused) and an export writes the target's.

`VERIFIER` is written as `speculators_config.verifier.name_or_path` (vLLM and speculators load
the verifier's tensors from it); an imported drafter keeps the path it came with.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import run_dir as run_dir_lib
from specjax.errors import SpecjaxError
from specjax.interop import drafter_io, hf_config, layer_map
from specjax.interop.safetensors_io import open_tensors

VERSION = "0.9.0"  # the speculators release this format follows
VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")


def eagle3_table(cfg, qk_norm: bool) -> dict[str, tuple[tuple, int]]:
  """speculators EAGLE-3 tensor name -> (specjax parameter path, n_in)."""
  table = {"fc.weight": (("fc",), 1), "norm.weight": (("final_norm", "scale"), 0)}
  if cfg.get("norm_before_fc", False):
    table["input_norm.weight"] = (("input_norm", "scale"), 0)
  if cfg.get("fc_norm", False):
    for i in range(len(cfg.feature_layers)):
      table[f"fc_norm.{i}.weight"] = (("fc_norms", i, "scale"), 0)
  for i in range(int(cfg.num_layers)):
    table.update(layer_map.decoder_layer(f"layers.{i}.", ("layers", i), qk_norm))
  table["layers.0.hidden_norm.weight"] = (("layers", 0, "hidden_norm", "scale"), 0)
  return table


def _layer_config_matches(layer: dict, target_cfg):
  """The draft layers must have the target's shape (speculators builds them from the
  verifier's config): a one-line error naming the first key that differs."""
  _, cfg = hf_config.to_specjax({"vocab_size": target_cfg.vocab_size, **layer})
  for key in ("d_model", "num_heads", "num_kv_heads", "head_dim", "mlp_dim", "rope_theta",
              "rope_llama3_scaling", "qk_norm", "norm_eps"):
    ours, theirs = getattr(target_cfg, key), getattr(cfg, key)
    if ours != theirs:
      raise SpecjaxError(f"transformer_layer_config: {key} {theirs} != the target's {ours} "
                         "(EAGLE-3 layers have the target's shape)")


def eagle3_config(spec: dict, target_cfg, source: str) -> ml_collections.ConfigDict:
  """run_dir/eagle3/config.json of an imported speculators EAGLE-3."""
  layer = spec.get("transformer_layer_config") or {}
  if not layer:
    raise SpecjaxError(f"{source}: config.json has no transformer_layer_config")
  hidden = spec.get("target_hidden_size")
  if hidden is not None and int(hidden) != target_cfg.d_model:
    raise SpecjaxError(f"target_hidden_size {hidden} != the target's d_model "
                       f"{target_cfg.d_model}")
  _layer_config_matches(layer, target_cfg)
  ids = _draft_ids(spec, "eagle_aux_hidden_state_layer_ids", target_cfg)
  if spec.get("norm_before_fc") and spec.get("fc_norm"):
    raise SpecjaxError("norm_before_fc and fc_norm are mutually exclusive")
  proposals = (spec.get("speculators_config") or {}).get("proposal_methods") or [{}]
  vocab = int(spec.get("draft_vocab_size") or target_cfg.vocab_size)
  if not 1 <= vocab <= target_cfg.vocab_size:
    raise SpecjaxError(f"draft_vocab_size {vocab} outside 1..{target_cfg.vocab_size}")
  return ml_collections.ConfigDict({
      "method": "eagle3",
      "num_layers": int(layer.get("num_hidden_layers", 1)),
      "feature_layers": [int(i) for i in ids],
      "ttt_steps": int(proposals[0].get("speculative_tokens", 3)),
      "ttt_step_loss_decay": 1.0,
      "draft_vocab_size": vocab if vocab < target_cfg.vocab_size else 0,
      "norm_before_residual": bool(spec.get("norm_before_residual", False)),
      "norm_before_fc": bool(spec.get("norm_before_fc", False)),
      "fc_norm": bool(spec.get("fc_norm", False)),
      "norm_output": bool(spec.get("norm_output", False)),
      "imported_from": os.path.abspath(source),
      "speculators_config_json": json.dumps(spec, sort_keys=True),  # export starts from it
  })


def _verifier_tensors(target) -> tuple[np.ndarray, np.ndarray]:
  """The target's embedding [V, D] and LM head as [V, D] rows (the embedding when tied)."""
  flat = drafter_io.flat(target.params)
  embedding = np.asarray(flat[("embedding",)].get_value(), np.float32)
  if target.model_cfg.tie_embeddings:
    return embedding, embedding
  return embedding, np.asarray(flat[("lm_head",)].get_value(), np.float32).T


def _draft_vocab(reader, src: str, vocab_size: int, size: int):
  """Target ids of the draft vocabulary from d2t (checked against t2d), or None (full)."""
  if size >= vocab_size:
    return None
  if "d2t" not in reader:
    raise SpecjaxError(f"{src}: draft_vocab_size {size} < {vocab_size} but no d2t tensor")
  d2t = reader.read("d2t").astype(np.int64)
  ids = np.arange(len(d2t)) + d2t
  if len(d2t) != size or ids.min() < 0 or ids.max() >= vocab_size or (np.diff(ids) <= 0).any():
    raise SpecjaxError(f"{src}: d2t does not map {size} draft tokens to distinct ascending "
                       f"ids of the target's {vocab_size}")
  if "t2d" in reader:
    t2d = reader.read("t2d").astype(bool)
    if t2d.shape != (vocab_size,) or not np.array_equal(np.flatnonzero(t2d), ids):
      raise SpecjaxError(f"{src}: t2d and d2t name different draft vocabularies")
  return ids


def _same(src, name, theirs, ours):
  ours = ours.astype(theirs.dtype)
  if theirs.shape != ours.shape or not np.array_equal(theirs, ours):
    raise SpecjaxError(f"{src}: {name} is not the target's (a drafter trained with its own "
                       "embedding or LM head, or another verifier): not supported")


def import_eagle3(src: str, run_dir: str, spec: dict):
  from specjax.drafters import eagle3
  from specjax.training.eagle3 import save_vocab
  target = run_dir_lib.load_target(run_dir)
  target_cfg = target.model_cfg
  cfg = eagle3_config(spec, target_cfg, src)
  table = eagle3_table(cfg, target_cfg.qk_norm)
  abstract = drafter_io.abstract_params(eagle3.build_model, cfg, target_cfg)
  with open_tensors(src) as reader:
    vocab = _draft_vocab(reader, src, target_cfg.vocab_size,
                         cfg.draft_vocab_size or target_cfg.vocab_size)
    params, dtypes = drafter_io.read_params(reader, src, table, abstract,
                                            f"a {cfg.num_layers}-layer EAGLE-3",
                                            extra_ok=VERIFIER_TENSORS)
    embedding, rows = _verifier_tensors(target)
    if "embed_tokens.weight" in reader:
      _same(src, "embed_tokens.weight", reader.read("embed_tokens.weight"), embedding)
    if "lm_head.weight" in reader:
      _same(src, "lm_head.weight", reader.read("lm_head.weight"),
            rows if vocab is None else rows[vocab])
    cfg.export_tensors = sorted(n for n in VERIFIER_TENSORS if n in reader)
  cfg.export_dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
  folder = drafter_io.save_imported(run_dir, "eagle3", cfg, params)
  if vocab is not None:
    save_vocab(folder, vocab.tolist())
  print(f"[import-speculators] {src} -> {folder}: EAGLE-3, {cfg.num_layers} layer(s), target "
        f"features from layers {list(cfg.feature_layers)}, draft vocabulary "
        f"{len(vocab) if vocab is not None else target_cfg.vocab_size}", flush=True)


def _transformer_layer_config(run_dir: str, target, num_layers: int) -> dict:
  """The target's HF config (as imported, else written from its shape) with the drafter's
  depth: speculators builds the draft layers from it."""
  kept = os.path.join(run_dir_lib.model_dir(run_dir, "target"), "hf", "config.json")
  if os.path.exists(kept):
    layer = hf_config.read_json(kept)
  else:
    layer = hf_config.from_specjax(target.model_cfg, run_dir_lib.load_special_ids(run_dir),
                                   int(target.config.get("seq_len", 0) or 4096))
  layer = dict(layer, num_hidden_layers=int(num_layers))
  layer.setdefault("model_type", hf_config.architecture(layer))
  return layer


def eagle3_export_config(cfg, run_dir, target, verifier: str | None, dtype: str) -> dict:
  if cfg.get("speculators_config_json"):
    spec = json.loads(cfg.speculators_config_json)
    if verifier is not None:
      spec["speculators_config"]["verifier"]["name_or_path"] = verifier
    return spec
  from specjax.drafters.eagle3 import feature_layers
  layer = _transformer_layer_config(run_dir, target, cfg.num_layers)
  vocab = int(cfg.get("draft_vocab_size", 0)) or target.model_cfg.vocab_size
  config = _common_config("eagle3", "Eagle3DraftModel", verifier, layer, dtype,
                          int(cfg.get("ttt_steps", 3)))
  config.update({
      "draft_vocab_size": min(vocab, target.model_cfg.vocab_size),
      "eagle_aux_hidden_state_layer_ids": list(feature_layers(cfg, target.model_cfg.num_layers)),
      "embed_requires_grad": False,
      "norm_before_residual": bool(cfg.get("norm_before_residual", True)),
      "norm_before_fc": bool(cfg.get("norm_before_fc", False)),
      "fc_norm": bool(cfg.get("fc_norm", False)),
      "norm_output": bool(cfg.get("norm_output", False)),
  })
  return config


def export_eagle3(run_dir: str, out_dir: str, verifier: str | None = None):
  from specjax.drafters import eagle3
  from specjax.training.eagle3 import load_vocab
  folder = run_dir_lib.require_model_dir(run_dir, "eagle3")
  cfg = run_dir_lib.load_config(folder)
  target = run_dir_lib.load_target(run_dir)
  abstract = drafter_io.abstract_params(eagle3.build_model, cfg, target.model_cfg)
  params = drafter_io.flat(run_dir_lib.restore_params(folder, abstract))
  dtype = np.dtype(jnp.dtype(cfg.get("export_dtype", "float32")))
  vocab = load_vocab(folder)
  embedding, rows = _verifier_tensors(target)
  extra = {"embed_tokens.weight": embedding.astype(dtype),
           "lm_head.weight": (rows if vocab is None else rows[vocab]).astype(dtype)}
  if vocab is not None:
    ids = np.asarray(vocab, np.int64)
    t2d = np.zeros(target.model_cfg.vocab_size, bool)
    t2d[ids] = True
    extra.update(d2t=ids - np.arange(len(ids)), t2d=t2d)
  keep = cfg.get("export_tensors", None)
  if keep is not None:  # an imported drafter: the verifier tensors it came with
    extra = {k: v for k, v in extra.items() if k in keep}
  config = eagle3_export_config(cfg, run_dir, target, verifier, dtype.name)
  count = drafter_io.write_params(out_dir, eagle3_table(cfg, target.model_cfg.qk_norm), params,
                                  dtype, extra)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  print(f"[export-speculators] {folder} -> {out_dir}: EAGLE-3, {count} tensors ({dtype.name}), "
        f"verifier {config['speculators_config']['verifier']['name_or_path']}", flush=True)


# -- DFlash ----------------------------------------------------------------------------------


def _draft_ids(spec: dict, key: str, target_cfg) -> list[int]:
  from specjax.drafters.eagle3 import default_feature_layers_eagle3
  ids = spec.get(key) or list(default_feature_layers_eagle3(target_cfg.num_layers))
  n = target_cfg.num_layers
  if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) > n:
    raise SpecjaxError(f"{key} {ids} must be distinct, in 0..{n}")
  return [int(i) for i in ids]


def _full_vocabulary(spec: dict, target_cfg, method: str):
  vocab = int(spec.get("draft_vocab_size") or target_cfg.vocab_size)
  if vocab != target_cfg.vocab_size:
    raise SpecjaxError(f"a {method} drafter with a reduced draft vocabulary ({vocab} of "
                       f"{target_cfg.vocab_size}) is not supported")


def block_config(spec: dict, target_cfg, source: str, method: str) -> ml_collections.ConfigDict:
  """run_dir/<method>/config.json of an imported speculators DFlash-family drafter: their
  draft layers are Qwen3 layers of the verifier's shape (q/k norm whatever the verifier)."""
  layer = spec.get("transformer_layer_config") or {}
  if not layer:
    raise SpecjaxError(f"{source}: config.json has no transformer_layer_config")
  if int(layer.get("hidden_size", -1)) != target_cfg.d_model:
    raise SpecjaxError(f"transformer_layer_config hidden_size {layer.get('hidden_size')} != "
                       f"the target's d_model {target_cfg.d_model}")
  if layer.get("attention_bias"):
    raise SpecjaxError("drafter attention_bias=True is not supported")
  if layer.get("hidden_act", "silu") != "silu":
    raise SpecjaxError(f"drafter hidden_act '{layer['hidden_act']}' is not supported (silu)")
  num_layers = int(layer.get("num_hidden_layers", 1))
  if "sliding_attention" in (layer.get("layer_types") or [])[:num_layers]:
    raise SpecjaxError("drafter sliding-window attention layers are not supported")
  _full_vocabulary(spec, target_cfg, method)
  mask = spec.get("mask_token_id")
  if mask is None or not 0 <= int(mask) < target_cfg.vocab_size:
    raise SpecjaxError(f"mask_token_id {mask} is not a token of the target's vocabulary "
                       f"(size {target_cfg.vocab_size})")
  ids = _draft_ids(spec, "aux_hidden_state_layer_ids", target_cfg)
  theta, llama3 = hf_config.rope(layer)
  heads = int(layer["num_attention_heads"])
  return ml_collections.ConfigDict({
      "method": method,
      "num_layers": num_layers,
      "feature_layers": ids,
      "num_feature_layers": len(ids),
      "block_size": int(spec.get("block_size", 8)),
      "mask_token_id": int(mask),
      "layer_shape": {
          "num_heads": heads,
          "num_kv_heads": int(layer.get("num_key_value_heads") or heads),
          "head_dim": int(layer.get("head_dim") or target_cfg.d_model // heads),
          "mlp_dim": int(layer["intermediate_size"]),
          "rope_theta": theta,
          "norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
          "rope_llama3_scaling": llama3,
          "qk_norm": True,
      },
      "output_multiplier": 1.0,
      "final_logit_softcapping": 0.0,
      "embedding_scale": 1.0,
      "imported_from": os.path.abspath(source),
      "speculators_config_json": json.dumps(spec, sort_keys=True),
  })


def import_dflash(src: str, run_dir: str, spec: dict):
  from specjax.drafters import dflash
  from specjax.interop import zlab
  if spec.get("sample_from_anchor"):
    raise SpecjaxError("a DFlash drafter with sample_from_anchor=True (B drafts a block, slot 0 "
                       "included) is not supported; specjax's DSpark drafts that way")
  target_cfg = zlab._target_cfg(run_dir)
  cfg = block_config(spec, target_cfg, src, "dflash")
  abstract = drafter_io.abstract_params(dflash.build_model, cfg, target_cfg)
  with open_tensors(src) as reader:
    params, dtypes = drafter_io.read_params(reader, src, zlab.name_table(cfg.num_layers),
                                            abstract, f"a {cfg.num_layers}-layer DFlash",
                                            extra_ok=VERIFIER_TENSORS)
  cfg.export_dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
  folder = drafter_io.save_imported(run_dir, "dflash", cfg, params)
  print(f"[import-speculators] {src} -> {folder}: DFlash, {cfg.num_layers} layer(s), block "
        f"{cfg.block_size}, target features from layers {list(cfg.feature_layers)}, mask "
        f"token {cfg.mask_token_id}", flush=True)


def _common_config(method: str, architecture: str, verifier, layer: dict, dtype: str,
                   speculative_tokens: int) -> dict:
  return {
      "architectures": [architecture],
      "speculators_model_type": method,
      "speculators_version": VERSION,
      "target_hidden_size": None,
      "tie_word_embeddings": False,
      "dtype": dtype,
      "speculators_config": {
          "algorithm": method,
          "default_proposal_method": "greedy",
          "proposal_methods": [{"proposal_type": "greedy", "accept_tolerance": 0.0,
                                "speculative_tokens": int(speculative_tokens),
                                "verifier_accept_k": 1}],
          "verifier": {"name_or_path": verifier, "architectures": layer.get("architectures")},
      },
      "transformer_layer_config": layer,
  }


def _block_layer_config(run_dir, target, cfg) -> dict:
  """The target's HF config with the drafter's depth and its layers' own shape."""
  from specjax.drafters.dflash import layer_config
  shape = layer_config(cfg, target.model_cfg)
  if not shape.qk_norm:
    raise SpecjaxError("speculators' DFlash layers have q/k norm; this drafter's do not (nor "
                       "have the target's): train it with layer_shape.qk_norm = True in its "
                       "config file")
  layer = _transformer_layer_config(run_dir, target, cfg.num_layers)
  rope = {"rope_type": "default", "rope_theta": shape.rope_theta}
  if shape.rope_llama3_scaling is not None:
    rope = {"rope_type": "llama3", "rope_theta": shape.rope_theta,
            **dict(zip(hf_config.LLAMA3_KEYS, shape.rope_llama3_scaling))}
  layer.update(num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
               head_dim=shape.head_dim, intermediate_size=shape.mlp_dim,
               rms_norm_eps=shape.norm_eps, rope_parameters=rope, rope_theta=shape.rope_theta)
  layer.pop("rope_scaling", None)
  return layer


def export_dflash(run_dir: str, out_dir: str, verifier: str | None = None):
  from specjax.drafters import dflash
  from specjax.interop import zlab
  _export_block(run_dir, out_dir, verifier, "dflash", "DFlashDraftModel", dflash.build_model,
                lambda cfg: zlab.name_table(cfg.num_layers), lambda cfg: int(cfg.block_size) - 1,
                lambda cfg: {"sample_from_anchor": False})


# -- DSpark -----------------------------------------------------------------------------------


def dspark_table(cfg) -> dict[str, tuple[tuple, int]]:
  """DFlash's tensors plus the vanilla Markov head and the confidence head."""
  from specjax.interop import zlab
  table = dict(zlab.name_table(cfg.num_layers))
  if int(cfg.markov_rank):
    table["markov_head.markov_w1.weight"] = (("markov_head", "markov_w1"), 0)
    table["markov_head.markov_w2.weight"] = (("markov_head", "markov_w2"), 1)
  table["confidence_head.proj.weight"] = (("confidence_head", "w"), 1)
  table["confidence_head.proj.bias"] = (("confidence_head", "b"), 0)
  return table


def import_dspark(src: str, run_dir: str, spec: dict):
  from specjax.drafters import dspark
  from specjax.interop import zlab
  if spec.get("sample_from_anchor", True) is not True:
    raise SpecjaxError("a DSpark drafter with sample_from_anchor=False is not supported "
                       "(specjax's DSpark drafts from every slot of the block, anchor included)")
  if spec.get("markov_head_type", "vanilla") != "vanilla":
    raise SpecjaxError(f"markov_head_type '{spec['markov_head_type']}' is not supported "
                       "(vanilla)")
  if not spec.get("enable_confidence_head", True):
    raise SpecjaxError("a DSpark drafter without a confidence head is not supported")
  rank = int(spec.get("markov_rank", 256))
  if rank and not spec.get("confidence_head_with_markov", True):
    raise SpecjaxError("confidence_head_with_markov=False is not supported (specjax's "
                       "confidence head reads [hidden ; W1[previous token]])")
  target_cfg = zlab._target_cfg(run_dir)
  cfg = block_config(spec, target_cfg, src, "dspark")
  cfg.markov_rank = rank
  abstract = drafter_io.abstract_params(dspark.build_model, cfg, target_cfg)
  with open_tensors(src) as reader:
    params, dtypes = drafter_io.read_params(reader, src, dspark_table(cfg), abstract,
                                            f"a {cfg.num_layers}-layer DSpark (rank {rank})",
                                            extra_ok=VERIFIER_TENSORS)
  cfg.export_dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
  folder = drafter_io.save_imported(run_dir, "dspark", cfg, params)
  print(f"[import-speculators] {src} -> {folder}: DSpark, {cfg.num_layers} layer(s), block "
        f"{cfg.block_size} (as many drafts), Markov rank {rank}, no calibration", flush=True)


def _export_block(run_dir: str, out_dir: str, verifier, method: str, architecture: str,
                  build, table_of, speculative_tokens, extra_keys):
  """A DFlash-family drafter -> a speculators checkpoint (an imported one keeps its config)."""
  folder = run_dir_lib.require_model_dir(run_dir, method)
  cfg = run_dir_lib.load_config(folder)
  if int(cfg.get("mask_token_id", -1)) < 0:
    raise SpecjaxError(f"this {method} drafter uses a learned mask vector, which speculators' "
                       "format cannot hold; train it with --config.mask_token_id=<a token id>")
  for key, off in (("output_multiplier", 1.0), ("final_logit_softcapping", 0.0),
                   ("embedding_scale", 1.0)):
    if float(cfg.get(key, off)) != off:
      raise SpecjaxError(f"speculators' {method} has no {key} (this drafter's is "
                         f"{cfg.get(key)})")
  target = run_dir_lib.load_target(run_dir)
  abstract = drafter_io.abstract_params(build, cfg, target.model_cfg)
  params = drafter_io.flat(run_dir_lib.restore_params(folder, abstract))
  dtype = np.dtype(jnp.dtype(cfg.get("export_dtype", "float32")))
  if cfg.get("speculators_config_json"):
    config = json.loads(cfg.speculators_config_json)
    if verifier is not None:
      config["speculators_config"]["verifier"]["name_or_path"] = verifier
  else:
    from specjax.drafters.dflash import feature_layers
    layer = _block_layer_config(run_dir, target, cfg)
    config = _common_config(method, architecture, verifier, layer, dtype.name,
                            speculative_tokens(cfg))
    config.update(
        block_size=int(cfg.block_size), mask_token_id=int(cfg.mask_token_id),
        aux_hidden_state_layer_ids=list(feature_layers(cfg, target.model_cfg.num_layers)),
        draft_vocab_size=target.model_cfg.vocab_size, sliding_window_non_causal=False,
        **extra_keys(cfg))
  count = drafter_io.write_params(out_dir, table_of(cfg), params, dtype)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  print(f"[export-speculators] {folder} -> {out_dir}: {method}, {count} tensors ({dtype.name}), "
        f"verifier {config['speculators_config']['verifier']['name_or_path']}", flush=True)


def export_dspark(run_dir: str, out_dir: str, verifier: str | None = None):
  from specjax.drafters import dspark
  _export_block(run_dir, out_dir, verifier, "dspark", "DSparkDraftModel", dspark.build_model,
                dspark_table, lambda cfg: int(cfg.block_size),
                lambda cfg: {"sample_from_anchor": True, "markov_rank": int(cfg.markov_rank),
                             "markov_head_type": "vanilla", "enable_confidence_head": True,
                             "confidence_head_with_markov": bool(int(cfg.markov_rank))})


# -- DFlash 2 --------------------------------------------------------------------------------


def import_dflash2(src: str, run_dir: str, spec: dict):
  from specjax.drafters import dflash2
  from specjax.interop import zlab
  if spec.get("sample_from_anchor"):
    raise SpecjaxError("a DFlash 2 drafter with sample_from_anchor=True is not supported")
  target_cfg = zlab._target_cfg(run_dir)
  cfg = block_config(spec, target_cfg, src, "dflash2")
  for key in dflash2.SELECTOR_KEYS:
    if spec.get(key) is None:
      raise SpecjaxError(f"DFlash 2 drafter config has no {key}")
    cfg[key] = int(spec[key])
  if target_cfg.d_model % cfg.conv_group_size:
    raise SpecjaxError(f"hidden_size {target_cfg.d_model} is not a multiple of conv_group_size "
                       f"{cfg.conv_group_size}")
  abstract = drafter_io.abstract_params(dflash2.build_model, cfg, target_cfg)
  with open_tensors(src) as reader:
    params, dtypes = drafter_io.read_params(reader, src,
                                            zlab.name_table(cfg.num_layers, "dflash2"),
                                            abstract, f"a {cfg.num_layers}-layer DFlash 2",
                                            extra_ok=VERIFIER_TENSORS)
  cfg.export_dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
  folder = drafter_io.save_imported(run_dir, "dflash2", cfg, params)
  print(f"[import-speculators] {src} -> {folder}: DFlash 2, {cfg.num_layers} layer(s), block "
        f"{cfg.block_size}, selector rank {cfg.selector_rank}, top {cfg.selector_top_k}",
        flush=True)


def export_dflash2(run_dir: str, out_dir: str, verifier: str | None = None):
  from specjax.drafters import dflash2
  from specjax.interop import zlab
  _export_block(run_dir, out_dir, verifier, "dflash2", "DFlash2DraftModel", dflash2.build_model,
                lambda cfg: zlab.name_table(cfg.num_layers, "dflash2"),
                lambda cfg: int(cfg.block_size) - 1,
                lambda cfg: {"sample_from_anchor": False,
                             **{k: int(cfg.get(k, v)) for k, v in dflash2.SELECTOR_KEYS.items()}})


IMPORTERS = {"eagle3": import_eagle3, "dflash": import_dflash, "dspark": import_dspark,
             "dflash2": import_dflash2}
EXPORTERS = {"eagle3": export_eagle3, "dflash": export_dflash, "dspark": export_dspark,
             "dflash2": export_dflash2}


def import_speculators(src: str, run_dir: str):
  """A speculators checkpoint folder -> run_dir/<method>/."""
  spec = hf_config.read_json(os.path.join(src, "config.json"))
  kind = spec.get("speculators_model_type")
  if kind not in IMPORTERS:
    raise SpecjaxError(f"{src}: speculators_model_type '{kind}' cannot be imported; supported: "
                       f"{', '.join(IMPORTERS)}")
  IMPORTERS[kind](src, run_dir, spec)


def export_speculators(run_dir: str, method: str, out_dir: str, verifier: str | None = None):
  """run_dir/<method>/ -> a speculators checkpoint in out_dir."""
  if method not in EXPORTERS:
    raise SpecjaxError(f"method '{method}' cannot be exported to the speculators format; "
                       f"supported: {', '.join(EXPORTERS)}")
  EXPORTERS[method](run_dir, out_dir, verifier)
