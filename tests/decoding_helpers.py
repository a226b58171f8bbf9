"""Tiny random targets and drafters for decoding tests."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import pad_prompts, to_lists
from specjax.sampling import Sampler
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



def perturbed(params, seed, scale=0.3):
  """Every leaf plus scale * N(0, 1) noise (a random model moved off its initialisation)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


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
             cache_len=96, seed=0, eos=EOS, keep_cache=False, sampling_verifier=None):
  """sampling_verifier: a replacement for the T > 0 verification rule (broken ones in tests)."""
  tokens, lens = pad_prompts(prompts, 1)
  extra = {} if sampling_verifier is None else {"sampling_verifier": sampling_verifier}
  dec = SpeculativeDecoder(graphdef, sampler, max_new, cache_len, eos, keep_cache, drafter,
                           **extra)
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


def drive_drafter(graphdef, params, drafter, drafter_params, prompts, steps, reference,
                  cache_len=96, accept_schedule=None):
  """Runs the draft-verify protocol by hand (greedy) and checks every proposal against
  `reference(target, drafter_params, committed_BxS, end_B) -> drafts_BxK`, a cache-free
  recomputation (None: no check). Returns the accepted counts, [steps, B].

  `accept_schedule[t]` (optional) forces the number of drafts step t keeps, whatever the
  target thinks of them, so that the drafter's rollback is exercised at every position
  (the target's token after them is then the correction)."""
  from specjax.decoding.common import prefill as prefill_fn
  from specjax.decoding.verify import verify_greedy
  from specjax.drafters.base import Context, Prefill, Verified
  from specjax.models import write_rows

  tokens, lens = pad_prompts(prompts, 1)
  tokens, lens = jnp.asarray(tokens), jnp.asarray(lens)

  @jax.jit
  def start(params, drafter_params):
    target = nnx.merge(graphdef, params)
    cache, out, last = prefill_fn(target, tokens, lens, cache_len, drafter.feature_layers)
    pending = jnp.argmax(last, -1).astype(jnp.int32)
    state = drafter.init(drafter_params, target, Prefill(tokens, lens, out, cache_len))
    seq = jnp.zeros((tokens.shape[0], cache_len), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
    seq = write_rows(seq, pending[:, None], lens)
    return cache, state, seq, pending

  @jax.jit
  def step(params, drafter_params, cache, state, seq, pending, forced):
    target = nnx.merge(graphdef, params)
    end = cache.end_B
    drafts, _, state = drafter.propose(drafter_params, target, state, Context(seq, end, pending),
                                       Sampler(), jax.random.key(0))
    window = jnp.concatenate([pending[:, None], drafts], 1)
    out = target(window, cache=cache, feature_layers=drafter.feature_layers)
    m, nxt = verify_greedy(out.logits_BxTxV, drafts)
    m = jnp.where(forced >= 0, forced, m)
    nxt = jnp.where(forced >= 0, jnp.argmax(jnp.take_along_axis(
        out.logits_BxTxV, m[:, None, None], axis=1)[:, 0], -1).astype(jnp.int32), nxt)
    k = drafts.shape[1]
    new = jnp.where(jnp.arange(k + 1)[None] < m[:, None], jnp.pad(drafts, ((0, 0), (0, 1))),
                    nxt[:, None])
    active = jnp.ones_like(m, bool)
    state = drafter.commit(drafter_params, target, state,
                           Verified(window, end, m, nxt, out, active))
    seq = write_rows(seq, new, end + 1)
    return drafts, out.cache.rollback(end + m + 1), state, seq, nxt, m

  if reference is not None:
    ref = jax.jit(lambda p, dp, seq, end: reference(nnx.merge(graphdef, p), dp, seq, end))
  cache, state, seq, pending = start(params, drafter_params)
  accepted = []
  for t in range(steps):
    if reference is not None:
      expected = ref(params, drafter_params, seq, cache.end_B)
    forced = jnp.full((tokens.shape[0],), -1 if accept_schedule is None else
                      accept_schedule[t % len(accept_schedule)], jnp.int32)
    drafts, cache, state, seq, pending, m = step(params, drafter_params, cache, state, seq,
                                                 pending, forced)
    if reference is not None:
      np.testing.assert_array_equal(np.asarray(drafts), np.asarray(expected))
    accepted.append(np.asarray(m))
  return np.stack(accepted)
