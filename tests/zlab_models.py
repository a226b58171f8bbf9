"""Builders shared by the Z Lab interop tests: reference drafters (torch, CPU) and run
directories with a random specjax target."""

import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import torch
from flax import nnx

from specjax.methods import builtin
from specjax import run_dir as run_dir_lib
from specjax.checkpoint import Checkpoints
from specjax.models import Transformer, TransformerConfig

VOCAB, D, TARGET_LAYERS = 320, 32, 4
IDS = [2, 0]  # z-lab target layer ids (out of order on purpose): specjax layers 3, 1


def perturb_norms(module, seed):
  """Random checkpoints have norm weights exactly 1; make every norm matter."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))


def zlab_drafter(vocab=VOCAB, hidden=D, target_layers=TARGET_LAYERS, ids=IDS, mask=VOCAB - 1,
                 block_size=4, seed=0, architecture="DFlashDraftModel", **extra):
  """A random reference drafter; DFlash 2's convolutions and selector get random weights too
  (their initialisation leaves the base kernels unset)."""
  from dflash import model as dflash_model
  from transformers import Qwen3Config
  torch.manual_seed(seed)
  config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=48,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, rms_norm_eps=1e-5, rope_theta=5000.0,
                       num_target_layers=target_layers, block_size=block_size,
                       dflash_config={"target_layer_ids": ids, "mask_token_id": mask, **extra})
  model = getattr(dflash_model, architecture)(config).float().eval()
  perturb_norms(model, seed)
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "base_kernel" in name:  # near the identity, as a trained one
        p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        p[:, 0].add_(1.0)
      elif "_conv." in name or "candidate_selector" in name:
        p.copy_(0.3 * torch.randn(p.shape, generator=gen))
  return model


def save_target_run(run_dir, tokenizer_json=None, num_layers=TARGET_LAYERS, seed=0):
  """A run directory whose target is a random specjax model (norms perturbed). Without a
  tokenizer the config names the vocabulary size (enough for import and export)."""
  shape = dict(num_layers=num_layers, d_model=D, num_heads=4, num_kv_heads=2, head_dim=8,
               mlp_dim=64)
  model = Transformer(TransformerConfig(vocab_size=VOCAB, **shape), rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)
  params = jax.tree.map(lambda x: x * (1 + 0.3 * jax.random.normal(jax.random.key(seed),
                                                                     x.shape)), params)
  folder = os.path.join(run_dir, "target")
  os.makedirs(folder)
  config = {"model": shape}
  if tokenizer_json is None:
    config["vocab_size"] = VOCAB
  else:
    shutil.copy(tokenizer_json, os.path.join(folder, "tokenizer.json"))
  run_dir_lib.save_config(ml_collections.ConfigDict(config), os.path.join(folder, "config.json"))
  ckpt = Checkpoints(os.path.join(folder, "checkpoints"))
  ckpt.save(0, params, {"step": jnp.int32(0)}, {})
  ckpt.wait()
  ckpt.close()
  return nnx.merge(graphdef, params)


def block_passes(model, run, method, target, vocab, t=9):
  """Our imported drafter and the reference `model` on the same block [pending, MASK x (B-1)]
  after a t-token context (the target's features from every layer). Returns
  ((drafter, hidden [2, B-1, D], logits, pending [2]), (ref_hidden, ref_logits, head)):
  hidden states and logits of the mask slots."""
  import types

  import numpy as np
  from dflash import model as dflash_model
  cfg = run_dir_lib.load_config(os.path.join(run, method))
  assert cfg.method == method and list(cfg.feature_layers) == [i + 1 for i in IDS]
  graphdef, params, layers = builtin.load_dflash(
      run, types.SimpleNamespace(model_cfg=target.cfg), cfg.block_size, method)
  drafter = nnx.merge(graphdef, params)
  bs = cfg.block_size
  tokens = jax.random.randint(jax.random.key(1), (2, t), 1, vocab - 1)
  pending = jnp.array([[5], [7]])
  out = target(tokens, feature_layers=tuple(range(TARGET_LAYERS + 1)))
  # specjax: context K/V of positions 0..t-1, block at t..t+bs-1
  positions = jnp.broadcast_to(jnp.arange(t), (2, t))
  ctx_kv = drafter.context_kv(drafter.project(tuple(out.features[l] for l in layers)),
                              positions)
  x = drafter.block_inputs(target, pending, bs)
  hidden = drafter(x, positions[:, :bs] + t, ctx_kv, jnp.ones((2, bs, t + bs), bool))[:, 1:]
  logits = drafter.draft_logits(target, hidden)
  # reference: HF hidden_states[i] = specjax feature layer i
  hidden_states = [torch.tensor(np.asarray(f)) for f in out.features]
  embedding = torch.tensor(np.asarray(target.embedding[...]))
  block_ids = torch.cat([torch.from_numpy(np.array(pending)),
                         torch.full((2, bs - 1), model.mask_token_id)], dim=1)
  head = lambda h: h @ embedding.T  # noqa: E731
  with torch.no_grad():
    ref_hidden = model(
        target_hidden=dflash_model.extract_context_feature(hidden_states, model.target_layer_ids),
        noise_embedding=torch.nn.functional.embedding(block_ids, embedding),
        position_ids=torch.arange(t + bs)[None].expand(2, -1))[:, 1:]
    ref_logits = model.compute_logits(ref_hidden, head)
  return (drafter, hidden, logits, pending[:, 0]), (ref_hidden, ref_logits, head)
