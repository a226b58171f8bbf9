"""speculators (vLLM's drafter library, the test peer) drafters on tiny random Hugging Face
verifiers, and what they compute: EAGLE-3's logits per training-time-test step, and the
DFlash family's block pass (DFlash's mask-slot logits, DSpark's Markov and confidence heads,
DFlash 2's selector), and specjax's drafters in a run dir computing the same. Shared by
tests/test_interop_speculators.py and bench/speculators_check.py."""

from __future__ import annotations

import numpy as np

# speculators_model_type -> (config class, model class), inside speculators.models
CLASSES = {"eagle3": ("eagle3", "Eagle3SpeculatorConfig", "Eagle3DraftModel"),
           "dflash": ("dflash", "DFlashSpeculatorConfig", "DFlashDraftModel"),
           "dspark": ("dspark", "DSparkSpeculatorConfig", "DSparkDraftModel"),
           "dflash2": ("dflash2", "DFlash2SpeculatorConfig", "DFlash2DraftModel")}


def randomize(model, seed: int):
  """Random trainable weights: norms around 1, DFlash 2's convolution kernels around the
  identity they start as, everything else N(0, 0.2^2)."""
  import torch
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if not p.requires_grad:
        continue
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif "base_kernel" in name:
        p.copy_(p + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))


def drafter(kind: str, verifier_dir: str, *, layers=2, seed=0, speculative_tokens=3,
            draft_vocab=None, **config):
  """A random speculators drafter of `kind` for the verifier in `verifier_dir` (eager
  attention), its vocabulary mapping (draft_vocab: sorted target ids) and verifier tensors
  loaded."""
  import importlib

  import torch
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.proposals.greedy import GreedyTokenProposalConfig
  from transformers import AutoConfig
  package, config_name, model_name = CLASSES[kind]
  module = importlib.import_module(f"speculators.models.{package}")
  model_cls = getattr(importlib.import_module(f"speculators.models.{package}.core"), model_name)
  layer = AutoConfig.from_pretrained(verifier_dir)
  layer.num_hidden_layers = layers
  layer._attn_implementation = "eager"
  vocab = layer.vocab_size if draft_vocab is None else len(draft_vocab)
  cfg = getattr(module, config_name)(
      transformer_layer_config=layer, draft_vocab_size=vocab,
      speculators_config=SpeculatorsConfig(
          algorithm=kind, default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
          verifier=VerifierConfig.from_pretrained(verifier_dir)), **config)
  model = model_cls(cfg)
  randomize(model, seed)
  if draft_vocab is not None:
    ids = torch.as_tensor(np.asarray(draft_vocab), dtype=torch.long)
    t2d = torch.zeros(layer.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(len(ids)))
  model.load_verifier_weights()
  return model.eval()


def ttt_logits(model, aux_1xTxF, tokens_1xT, steps: int):
  """EAGLE-3's logits per TTT step, [T - 1, Vd] each, for a sequence whose aux hidden states
  (the verifier's, concatenated) are `aux`: index i reads token i + 1 and the features at i."""
  import torch
  captured = []
  hook = model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
  try:
    t = tokens_1xT.shape[1]
    with torch.no_grad():
      model(hidden_states=torch.as_tensor(np.asarray(aux_1xTxF))[:, :-1],
            input_ids=torch.as_tensor(np.asarray(tokens_1xT))[:, 1:],
            document_ids=torch.zeros(1, t - 1, dtype=torch.long),
            position_ids=torch.arange(1, t)[None], ttt_steps=steps)
  finally:
    hook.remove()
  return [c[0].numpy() for c in captured]


def block_hidden(model, aux_1xTxF, first_token: int):
  """The DFlash family's normed hidden states [B, D] for the block [first_token, MASK x (B-1)]
  at positions t..t+B-1 after a t-token context whose aux hidden states are `aux` (full
  attention: the block sees the whole context and itself)."""
  import torch
  bs = model.block_size
  with torch.no_grad():
    aux = torch.as_tensor(np.asarray(aux_1xTxF))
    ctx = model.hidden_norm(model.fc(aux))
    ids = torch.full((1, bs), model.mask_token_id, dtype=torch.long)
    ids[0, 0] = first_token
    x = model.embed_tokens(ids)
    pos = torch.arange(aux.shape[1] + bs)[None]
    emb = model.rotary_emb(x, pos)
    for layer in model.layers:
      x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos,
                position_embeddings=emb)
    return model.norm(x)[0]


def block_outputs(kind: str, model, aux_1xTxF, prev_tokens) -> dict:
  """What a DFlash-family drafter computes on the block [prev_tokens[0], MASK x (B-1)]:
  DFlash the mask slots' logits; DSpark every slot's logits with the Markov bias of slot k's
  previous token prev_tokens[k], and the confidence logits; DFlash 2 the mask slots' unary
  logits, top-k candidates and the selector's scores of them after prev_tokens[:B-1]."""
  import torch
  hidden = block_hidden(model, aux_1xTxF, int(prev_tokens[0]))
  prev = torch.as_tensor(np.asarray(prev_tokens))[None]
  with torch.no_grad():
    if kind == "dflash":
      return {"logits": model.lm_head(hidden[1:]).numpy()}
    if kind == "dspark":
      e = model.markov_head.prev_embeddings(prev)
      logits = model.lm_head(hidden) + model.markov_head.block_bias(
          prev_token_ids=prev, hidden_states=hidden[None], prev_emb=e)[0]
      return {"logits": logits.numpy(),
              "confidence": model.confidence_head(torch.cat([hidden, e[0]], -1)).numpy()}
    unary = model.lm_head(hidden[1:])
    cand, scores = model.candidate_selector.select(unary, hidden[1:], prev[0, :-1])
    return {"logits": unary.numpy(), "candidates": cand.numpy(), "scores": scores.numpy()}


def load_export(kind: str, folder: str):
  """Their drafter of `kind` loaded from a speculators checkpoint folder with their own classes
  (`from_pretrained`, eager attention), in eval mode."""
  import importlib
  package, config_name, model_name = CLASSES[kind]
  cfg = getattr(importlib.import_module(f"speculators.models.{package}"),
                config_name).from_pretrained(folder)
  cfg.transformer_layer_config._attn_implementation = "eager"
  model_cls = getattr(importlib.import_module(f"speculators.models.{package}.core"), model_name)
  return model_cls.from_pretrained(folder, config=cfg).eval()


def aux_states(verifier, tokens, ids):
  """The HF verifier's hidden states at `ids` for `tokens` [1, T]: (their input, the
  concatenation [1, T, len(ids) * D]; specjax's, the list of [1, T, D])."""
  import torch
  with torch.no_grad():
    hs = verifier(torch.as_tensor(np.asarray(tokens)), output_hidden_states=True).hidden_states
  return torch.cat([hs[i] for i in ids], -1).numpy(), [hs[i].numpy() for i in ids]


# -- specjax's side: the same outputs from the drafter in a run dir ----------------------------


def on_one_device(tree):
  import jax
  return jax.device_put(tree, jax.devices()[0])  # imported targets span the test devices


def ours_ttt(run: str, steps: int):
  """specjax's EAGLE-3 in run: f(tokens [1, T], features) -> its logits per TTT step,
  [T - 1, Vd] each (the layout of ttt_logits)."""
  import jax.numpy as jnp
  from flax import nnx

  from specjax import run_dir as run_dir_lib
  from specjax.methods import builtin
  from specjax.training import eagle3 as eagle3_training
  target = run_dir_lib.load_target(run)
  dp, graphdef, _ = builtin.load_eagle3(run, target)
  dp = on_one_device(dp)
  model = nnx.merge(graphdef, dp["model"])
  tgt = nnx.merge(target.graphdef, on_one_device(target.params))

  def run_ttt(tokens, features):
    t = tokens.shape[1]
    logits = eagle3_training.ttt_logits(
        model, tgt, tuple(jnp.asarray(f) for f in features), jnp.asarray(tokens),
        jnp.arange(t)[None], jnp.ones((1, t), jnp.int32), steps, dp.get("vocab"))
    return [np.asarray(x[0, :t - 1]) for x in logits]
  return run_ttt


def ours_block(kind: str, run: str, block: int):
  """specjax's DFlash-family drafter in run: f(features, prev_tokens) -> block_outputs' dict
  for the block [prev_tokens[0], MASK x (block - 1)] after the features' context."""
  import jax.numpy as jnp
  from flax import nnx

  from specjax import run_dir as run_dir_lib
  from specjax.methods import builtin
  target = run_dir_lib.load_target(run)
  if kind == "dspark":
    graphdef, params = builtin.load_dspark(run, target, block)[:2]
  else:
    graphdef, params, _ = builtin.load_dflash(run, target, block, kind)
  model = nnx.merge(graphdef, on_one_device(params))
  tgt = nnx.merge(target.graphdef, on_one_device(target.params))

  def run_block(features, prev_tokens) -> dict:
    t = features[0].shape[1]
    ctx = model.context_kv(model.project(tuple(jnp.asarray(f) for f in features)),
                           jnp.arange(t)[None])
    x = model.block_inputs(tgt, jnp.asarray([[prev_tokens[0]]]), block)
    hidden = model(x, jnp.arange(t, t + block)[None], ctx,
                   jnp.ones((1, block, t + block), bool))
    prev = jnp.asarray(prev_tokens)[None]
    if kind == "dflash":
      return {"logits": np.asarray(model.draft_logits(tgt, hidden[:, 1:]))[0]}
    if kind == "dspark":
      e = model.markov_head.embed(prev)
      return {"logits": np.asarray(tgt.logits(hidden) + model.markov_head(e))[0],
              "confidence": np.asarray(model.confidence_head(hidden, e))[0]}
    unary = model.draft_logits(tgt, hidden[:, 1:])
    u, cand = model.candidate_selector.candidates(unary)
    scores = u + model.candidate_selector.pair_scores(hidden[:, 1:], prev[:, :-1], cand)
    return {"logits": np.asarray(unary)[0], "candidates": np.asarray(cand)[0],
            "scores": np.asarray(scores)[0]}
  return run_block
