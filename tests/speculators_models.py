"""speculators (vLLM's drafter library, the test peer) EAGLE-3 drafters on tiny random Hugging
Face verifiers, and their logits per training-time-test step. Shared by
tests/test_interop_speculators.py."""

from __future__ import annotations

import numpy as np


def eagle3_drafter(verifier_dir: str, *, layers=2, ids=(1, 2, 3), draft_vocab=None, seed=0,
                   norm_before_fc=True, fc_norm=False, norm_output=True,
                   norm_before_residual=True, ttt_steps=3):
  """A random speculators Eagle3DraftModel for the verifier in `verifier_dir` (eager attention,
  norms moved away from 1), its verifier tensors loaded; draft_vocab: sorted target ids."""
  import torch
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.eagle3 import Eagle3SpeculatorConfig
  from speculators.models.eagle3.core import Eagle3DraftModel
  from speculators.proposals.greedy import GreedyTokenProposalConfig
  from transformers import AutoConfig
  layer = AutoConfig.from_pretrained(verifier_dir)
  layer.num_hidden_layers = layers
  layer._attn_implementation = "eager"
  vocab = layer.vocab_size if draft_vocab is None else len(draft_vocab)
  cfg = Eagle3SpeculatorConfig(
      transformer_layer_config=layer, draft_vocab_size=vocab,
      norm_before_residual=norm_before_residual, norm_before_fc=norm_before_fc,
      fc_norm=fc_norm, norm_output=norm_output, eagle_aux_hidden_state_layer_ids=list(ids),
      speculators_config=SpeculatorsConfig(
          algorithm="eagle3", default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
          verifier=VerifierConfig.from_pretrained(verifier_dir)))
  torch.manual_seed(seed)
  model = Eagle3DraftModel(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.requires_grad:
        p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else
                0.2 * torch.randn_like(p))
  if draft_vocab is not None:
    ids_t = torch.as_tensor(np.asarray(draft_vocab), dtype=torch.long)
    t2d = torch.zeros(layer.vocab_size, dtype=torch.bool)
    t2d[ids_t] = True
    model.load_vocab_mappings(t2d, ids_t - torch.arange(len(ids_t)))
  model.load_verifier_weights()
  return model.eval()


def ttt_logits(model, aux_1xTxF, tokens_1xT, steps: int):
  """Their logits per TTT step, [T - 1, Vd] each, for a sequence whose aux hidden states (the
  verifier's, concatenated) are `aux`: index i reads token i + 1 and the features at i."""
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


def dflash_drafter(verifier_dir: str, *, layers=2, ids=(1, 2, 3), block_size=8, mask_token_id=0,
                   seed=0):
  """A random speculators DFlashDraftModel (eager attention, norms moved away from 1), its
  verifier tensors loaded."""
  import torch
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.dflash import DFlashSpeculatorConfig
  from speculators.models.dflash.core import DFlashDraftModel
  from speculators.proposals.greedy import GreedyTokenProposalConfig
  from transformers import AutoConfig
  layer = AutoConfig.from_pretrained(verifier_dir)
  layer.num_hidden_layers = layers
  layer._attn_implementation = "eager"
  cfg = DFlashSpeculatorConfig(
      transformer_layer_config=layer, draft_vocab_size=layer.vocab_size, block_size=block_size,
      aux_hidden_state_layer_ids=list(ids), mask_token_id=mask_token_id,
      speculators_config=SpeculatorsConfig(
          algorithm="dflash", default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block_size - 1)],
          verifier=VerifierConfig.from_pretrained(verifier_dir)))
  torch.manual_seed(seed)
  model = DFlashDraftModel(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.requires_grad:
        p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else
                0.2 * torch.randn_like(p))
  model.load_verifier_weights()
  return model.eval()


def dflash_block_logits(model, aux_1xTxF, pending: int):
  """Their logits for the mask slots 1..B-1 of the block [pending, MASK x (B-1)] at positions
  t..t+B-1 after a t-token context whose aux hidden states are `aux` (full attention: the
  block sees the whole context and itself). [B - 1, V]."""
  import torch
  bs = model.block_size
  with torch.no_grad():
    aux = torch.as_tensor(np.asarray(aux_1xTxF))
    t = aux.shape[1]
    ctx = model.hidden_norm(model.fc(aux))
    ids = torch.full((1, bs), model.mask_token_id, dtype=torch.long)
    ids[0, 0] = pending
    x = model.embed_tokens(ids)
    pos = torch.arange(t + bs)[None]
    emb = model.rotary_emb(x, pos)
    for layer in model.layers:
      x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos,
                position_embeddings=emb)
    return model.lm_head(model.norm(x))[0, 1:].numpy()


def dspark_drafter(verifier_dir: str, *, layers=2, ids=(1, 2, 3), block_size=6, mask_token_id=0,
                   markov_rank=8, seed=0):
  """A random speculators DSparkDraftModel (vanilla Markov head, confidence head with the
  Markov embedding; eager attention, norms moved away from 1)."""
  import torch
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.dspark import DSparkSpeculatorConfig
  from speculators.models.dspark.core import DSparkDraftModel
  from speculators.proposals.greedy import GreedyTokenProposalConfig
  from transformers import AutoConfig
  layer = AutoConfig.from_pretrained(verifier_dir)
  layer.num_hidden_layers = layers
  layer._attn_implementation = "eager"
  cfg = DSparkSpeculatorConfig(
      transformer_layer_config=layer, draft_vocab_size=layer.vocab_size, block_size=block_size,
      aux_hidden_state_layer_ids=list(ids), mask_token_id=mask_token_id,
      markov_rank=markov_rank, sample_from_anchor=True,
      speculators_config=SpeculatorsConfig(
          algorithm="dspark", default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block_size)],
          verifier=VerifierConfig.from_pretrained(verifier_dir)))
  torch.manual_seed(seed)
  model = DSparkDraftModel(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.requires_grad:
        p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else
                0.2 * torch.randn_like(p))
  model.load_verifier_weights()
  return model.eval()


def dspark_block(model, aux_1xTxF, prev_tokens):
  """Their DSpark slot logits (backbone + Markov bias) and confidence logits for the block
  [prev_tokens[0] (the anchor), MASK x (B-1)] after the context: slot k reads prev_tokens[k]
  as its previous token (sample_from_anchor: slot k predicts the token after anchor + k).
  ([B, V], [B])."""
  import torch
  bs = model.block_size
  with torch.no_grad():
    aux = torch.as_tensor(np.asarray(aux_1xTxF))
    t = aux.shape[1]
    ctx = model.hidden_norm(model.fc(aux))
    ids = torch.full((1, bs), model.mask_token_id, dtype=torch.long)
    ids[0, 0] = int(prev_tokens[0])
    x = model.embed_tokens(ids)
    pos = torch.arange(t + bs)[None]
    emb = model.rotary_emb(x, pos)
    for layer in model.layers:
      x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos,
                position_embeddings=emb)
    hidden = model.norm(x)[0]
    prev = torch.as_tensor(np.asarray(prev_tokens))[None]
    prev_emb = model.markov_head.prev_embeddings(prev)
    logits = model.lm_head(hidden) + model.markov_head.block_bias(
        prev_token_ids=prev, hidden_states=hidden[None], prev_emb=prev_emb)[0]
    conf = model.confidence_head(torch.cat([hidden, prev_emb[0]], -1))
    return logits.numpy(), conf.numpy()


def dflash2_drafter(verifier_dir: str, *, layers=2, ids=(1, 2, 3), block_size=6,
                    mask_token_id=0, seed=0):
  """A random speculators DFlash2DraftModel: random convolutions (not the identity they start
  as) and selector, eager attention, norms moved away from 1."""
  import torch
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.dflash2 import DFlash2SpeculatorConfig
  from speculators.models.dflash2.core import DFlash2DraftModel
  from speculators.proposals.greedy import GreedyTokenProposalConfig
  from transformers import AutoConfig
  layer = AutoConfig.from_pretrained(verifier_dir)
  layer.num_hidden_layers = layers
  layer._attn_implementation = "eager"
  cfg = DFlash2SpeculatorConfig(
      transformer_layer_config=layer, draft_vocab_size=layer.vocab_size, block_size=block_size,
      aux_hidden_state_layer_ids=list(ids), mask_token_id=mask_token_id, conv_kernel_size=2,
      conv_group_size=16, selector_rank=8, selector_top_k=5,
      speculators_config=SpeculatorsConfig(
          algorithm="dflash2", default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block_size - 1)],
          verifier=VerifierConfig.from_pretrained(verifier_dir)))
  torch.manual_seed(seed)
  model = DFlash2DraftModel(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.requires_grad:
        p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else
                (p + 0.2 * torch.randn_like(p)) if "base_kernel" in name else
                0.2 * torch.randn_like(p))
  model.load_verifier_weights()
  return model.eval()


def dflash2_block(model, aux_1xTxF, pending: int, predecessors):
  """Their DFlash 2 mask slots 1..B-1 after the context: (unary logits [B-1, V], the top-k
  candidates [B-1, N], the selector's scores of those candidates after `predecessors`
  [B-1, N])."""
  import torch
  bs = model.block_size
  with torch.no_grad():
    aux = torch.as_tensor(np.asarray(aux_1xTxF))
    t = aux.shape[1]
    ctx = model.hidden_norm(model.fc(aux))
    ids = torch.full((1, bs), model.mask_token_id, dtype=torch.long)
    ids[0, 0] = pending
    x = model.embed_tokens(ids)
    pos = torch.arange(t + bs)[None]
    emb = model.rotary_emb(x, pos)
    for layer in model.layers:
      x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos,
                position_embeddings=emb)
    hidden = model.norm(x)[0, 1:]
    unary = model.lm_head(hidden)
    cand, scores = model.candidate_selector.select(
        unary, hidden, torch.as_tensor(np.asarray(predecessors)))
    return unary.numpy(), cand.numpy(), scores.numpy()
