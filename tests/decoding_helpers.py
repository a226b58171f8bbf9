"""Tiny random targets and drafters for decoding tests."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import pad_prompts, to_lists
from specjax.decoding.sampling import Sampler
from specjax.decoding.speculative import SpeculativeDecoder
from specjax.models import Transformer, TransformerConfig

EOS = 0


def tiny_model(vocab=61, seed=0, layers=2, d=32, logit_scale=1.0):
  cfg = TransformerConfig(vocab_size=vocab, num_layers=layers, d_model=d, num_heads=4,
                          num_kv_heads=2, head_dim=8, mlp_dim=2 * d)
  model = Transformer(cfg, rngs=nnx.Rngs(seed))
  if logit_scale != 1.0:
    model.embedding[...] = model.embedding[...] * logit_scale
  return nnx.split(model, nnx.Param)


def random_prompts(n, vocab, seed=0, min_len=1, max_len=12):
  rng = np.random.default_rng(seed)
  return [rng.integers(1, vocab, size=rng.integers(min_len, max_len + 1)).tolist()
          for _ in range(n)]


def run_ar(graphdef, params, prompts, max_new, sampler=Sampler(), cache_len=96, seed=0,
           eos=EOS, keep_cache=False):
  tokens, lens = pad_prompts(prompts, 1)
  dec = ARDecoder(graphdef, sampler, max_new, cache_len, eos, keep_cache)
  return dec(params, tokens, lens, jax.random.key(seed))


def run_spec(graphdef, params, drafter, drafter_params, prompts, max_new, sampler=Sampler(),
             cache_len=96, seed=0, eos=EOS, keep_cache=False):
  tokens, lens = pad_prompts(prompts, 1)
  dec = SpeculativeDecoder(graphdef, drafter, sampler, max_new, cache_len, eos, keep_cache)
  return dec(params, drafter_params, tokens, lens, jax.random.key(seed))


_FORWARDS = {}


def _full_forward(graphdef):
  if graphdef not in _FORWARDS:
    _FORWARDS[graphdef] = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t).logits_BxTxV)
  return _FORWARDS[graphdef]


def reference_greedy(graphdef, params, prompt, max_new, eos=EOS):
  """A plain Python loop of full forward passes with argmax: the definition of greedy."""
  forward = _full_forward(graphdef)
  seq = list(prompt)
  for _ in range(max_new):
    # causal: padding after the sequence does not change the logits at its last position
    padded = jnp.asarray([seq + [1] * (128 - len(seq))])
    nxt = int(jnp.argmax(forward(params, padded)[0, len(seq) - 1]))
    seq.append(nxt)
    if nxt == eos:
      break
  out = seq[len(prompt):]
  return out[:-1] if out and out[-1] == eos else out


__all__ = ["tiny_model", "random_prompts", "run_ar", "run_spec", "reference_greedy", "to_lists",
           "EOS"]
