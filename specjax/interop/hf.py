"""Hugging Face Llama / Qwen3 checkpoints <-> a specjax target in `run_dir/target/`.

  python -m specjax.interop import-hf HF_DIR RUN_DIR
  python -m specjax.interop export-hf RUN_DIR OUT_DIR [--model=draft]

Import reads one tensor at a time, lays it out as specjax's parameter, and puts it straight
onto its sharding under the mesh (`make_array_from_callback`: each device receives only its
slice), so host memory stays near one tensor. The result is an ordinary target folder
(config.json with `method: target`, an Orbax checkpoint, tokenizer.json), which decode.py and
every drafter's train.py load unchanged; the checkpoint's own config files are kept under
`target/hf/` for export. The model code never learns a Hugging Face tensor name: the name
table below is the whole mapping.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
from flax import nnx

from specjax import run_dir as run_dir_lib
from specjax import sharding
from specjax.checkpoint import save_params_only
from specjax.data import tokenizer as tokenizer_lib
from specjax.errors import SpecjaxError
from specjax.interop import hf_config, layer_map
from specjax.interop.safetensors_io import open_tensors, write_tensors
from specjax.models import TransformerConfig

# Files copied verbatim into target/hf/ (config.json too) and back out on export.
HF_SIDE_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
# Tensors some checkpoints carry that the model does not use (precomputed RoPE tables).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
DEFAULT_IMPORT_MESH = {"data": 1, "fsdp": -1, "tensor": 1}


def name_table(cfg: TransformerConfig) -> dict[str, tuple[tuple, int]]:
  """HF tensor name -> (specjax parameter path, n_in) (n_in as in interop/layer_map.py)."""
  table = {"model.embed_tokens.weight": (("embedding",), 0),
           "model.norm.weight": (("final_norm", "scale"), 0)}
  for i in range(cfg.num_layers):
    table.update(layer_map.decoder_layer(f"model.layers.{i}.", ("blocks", i), cfg.qk_norm))
  if not cfg.tie_embeddings:
    table["lm_head.weight"] = (("lm_head",), 1)
  return table


hf_shape, to_specjax, to_hf = layer_map.torch_shape, layer_map.to_specjax, layer_map.to_torch


def _ignored(name: str, cfg: TransformerConfig) -> bool:
  # a tied checkpoint may still store lm_head.weight (a copy of the embedding)
  return name.endswith(IGNORED_SUFFIXES) or (cfg.tie_embeddings and name == "lm_head.weight")


def placed(x: np.ndarray, sharding_: jax.sharding.Sharding) -> jax.Array:
  """x on its sharding: each addressable device receives a copy of its slice only."""
  return jax.make_array_from_callback(x.shape, sharding_, lambda index: x[index])


def load_params(src: str, cfg: TransformerConfig, mesh, rules=sharding.DEFAULT_RULES):
  """The parameters of an HF checkpoint folder as a sharded nnx.State, read one tensor at a
  time (never a random init: the state is built from abstract shapes)."""
  _, abstract = run_dir_lib.abstract_transformer(cfg)
  shardings = dict(nnx.to_flat_state(sharding.state_shardings(abstract, mesh, rules)))
  flat = dict(nnx.to_flat_state(abstract))
  table = name_table(cfg)
  with open_tensors(src) as reader:
    for name in reader.names():
      if name not in table and not _ignored(name, cfg):
        raise SpecjaxError(f"tensor '{name}' in {src} is not part of the model its config.json "
                           "describes (unsupported option or architecture)")
    for name, (path, n_in) in table.items():
      if name not in reader:
        raise SpecjaxError(f"{src} has no tensor '{name}'")
      var = flat[path]
      want = hf_shape(var.shape, n_in)
      if reader.shape(name) != want:
        raise SpecjaxError(f"tensor '{name}' has shape {list(reader.shape(name))}, but "
                           f"config.json implies {list(want)}")
      if reader.dtype(name) not in (np.float32, jax.numpy.bfloat16):
        raise SpecjaxError(f"tensor '{name}' is {reader.dtype(name)}; only float32 and "
                           "bfloat16 weights are supported")
      x = to_specjax(reader.read(name), var.shape, n_in).astype(var.dtype, copy=False)
      flat[path] = var.replace(placed(x, shardings[path].get_value()))
      del x
  return nnx.from_flat_state(flat)


def fresh_target(dst: str) -> tuple[str, str]:
  """(dst/target, its checkpoints folder), refusing a run directory that holds a target."""
  folder = run_dir_lib.model_dir(dst, "target")
  ckpt_dir = os.path.join(folder, "checkpoints")
  if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
    raise SpecjaxError(f"{folder} already holds a target; import into a fresh run directory")
  return folder, ckpt_dir


def import_hf(src: str, dst: str, mesh_shape: dict | None = None) -> str:
  """Converts the HF checkpoint folder `src` into `dst/target/`; returns that folder."""
  src = os.path.abspath(os.path.expanduser(src))
  if not os.path.isdir(src):
    raise SpecjaxError(f"{src} is not a directory")
  hf = hf_config.read_json(os.path.join(src, "config.json"))
  arch, cfg = hf_config.to_specjax(hf)
  side = {f: hf_config.read_json(os.path.join(src, f), required=False) for f in HF_SIDE_FILES}
  special = hf_config.special_ids(hf, side["generation_config.json"],
                                  side["tokenizer_config.json"], cfg.vocab_size)
  tok_path = os.path.join(src, "tokenizer.json")
  tok = tokenizer_lib.load_tokenizer(tok_path, check_specjax_ids=False)
  if tok.get_vocab_size() > cfg.vocab_size:
    raise SpecjaxError(f"{tok_path} has {tok.get_vocab_size()} tokens, more than the model's "
                       f"vocab_size={cfg.vocab_size}")

  folder, ckpt_dir = fresh_target(dst)
  params = load_params(src, cfg, sharding.make_mesh(mesh_shape or DEFAULT_IMPORT_MESH))
  num_params = sum(x.size for x in jax.tree.leaves(params))

  os.makedirs(os.path.join(folder, "hf"), exist_ok=True)
  largest = max(x.nbytes for x in jax.tree.leaves(params))
  save_params_only(ckpt_dir, 0, params, host_bytes=2 * largest)
  del params
  model = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "vocab_size"}
  config = {"method": "target", "vocab_size": cfg.vocab_size,
            "model": model, "tokenizer": special.to_dict(),
            "imported_from": {"format": "hf", "architecture": arch, "path": src}}
  write_json(os.path.join(folder, "config.json"), config)
  write_json(os.path.join(folder, "metrics.jsonl"),
              {"step": 0, "num_params": int(num_params), "imported_from": src}, indent=None)
  shutil.copyfile(tok_path, os.path.join(folder, "tokenizer.json"))
  shutil.copyfile(os.path.join(src, "config.json"), os.path.join(folder, "hf", "config.json"))
  for name, content in side.items():
    if content is not None:
      shutil.copyfile(os.path.join(src, name), os.path.join(folder, "hf", name))
  print(f"[import-hf] {arch} target, {num_params:,} parameters ({cfg.param_dtype}) "
        f"-> {folder}", flush=True)
  return folder


def export_hf(src: str, dst: str, model: str = "target") -> str:
  """Writes the target (or another transformer in the run directory, `model="draft"`: the
  draft model) of run directory `src` as an HF checkpoint folder `dst` (config.json,
  model.safetensors written one tensor at a time, tokenizer and generation config)."""
  if model not in ("target", "draft"):
    raise SpecjaxError(f"export-hf exports the target or the draft model, not '{model}'")
  target = run_dir_lib.load_transformer(src, model)  # one-line error when it is missing
  cfg = target.model_cfg
  folder = run_dir_lib.model_dir(src, model)
  special = run_dir_lib.load_special_ids(src)
  flat = dict(nnx.to_flat_state(target.params))
  table = name_table(cfg)
  specs = {name: (hf_shape(flat[path].shape, n_in), flat[path].dtype)
           for name, (path, n_in) in table.items()}

  def read(name):
    path, n_in = table[name]
    return to_hf(np.asarray(jax.device_get(flat[path].get_value())), n_in)

  dst = os.path.abspath(os.path.expanduser(dst))
  os.makedirs(dst, exist_ok=True)
  write_tensors(os.path.join(dst, "model.safetensors"), specs, read, metadata={"format": "pt"})
  kept = os.path.join(folder, "hf")
  if os.path.exists(os.path.join(kept, "config.json")):  # an imported checkpoint: as it came
    for name in ("config.json",) + HF_SIDE_FILES:
      if os.path.exists(os.path.join(kept, name)):
        shutil.copyfile(os.path.join(kept, name), os.path.join(dst, name))
  else:  # trained by specjax (a draft model always: it has its own shape)
    train_cfg = target.config
    max_positions = int(train_cfg.get("seq_len", 0) or 4096)
    write_json(os.path.join(dst, "config.json"),
                hf_config.from_specjax(cfg, special, max_positions))
    write_json(os.path.join(dst, "generation_config.json"),
                {"bos_token_id": special.bos_id, "eos_token_id": special.eos_id,
                 "pad_token_id": special.pad_id})
  tok = os.path.join(run_dir_lib.model_dir(src, "target"), "tokenizer.json")  # the run's
  shutil.copyfile(tok, os.path.join(dst, "tokenizer.json"))
  print(f"[export-hf] {model} of {src} -> {dst}", flush=True)
  return dst


def write_json(path: str, obj: dict, indent: int | None = 2):
  with open(path, "w") as f:
    f.write(json.dumps(obj, indent=indent) + "\n")
