"""The target transformer: cached decoding equals full forward, causality, shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import jitted
from specjax.models import Transformer, TransformerConfig


def make(**kw):
  cfg = dict(vocab_size=97, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
             mlp_dim=64)
  cfg.update(kw)
  return Transformer(TransformerConfig(**cfg), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("kw", [{}, {"qk_norm": False, "tie_embeddings": False},
                                {"num_kv_heads": 1}, {"num_kv_heads": 4}])
def test_cached_logits_equal_full_forward_for_rows_of_different_lengths(kw):
  module = make(**kw)
  model = jitted(module)
  model.init_cache = module.init_cache
  lens = np.array([3, 7, 5])
  seqs = jax.random.randint(jax.random.key(1), (3, 16), 3, 97)
  # prefill each row's own prompt (right-padded to 7), then feed the rest in chunks of 1 and 3
  cache = model.init_cache(3, 32)
  prompt = jnp.where(jnp.arange(7)[None] < lens[:, None], seqs[:, :7], 1)
  out = model(prompt, cache=cache)
  cache = out.cache.rollback(lens)
  got = [[out.logits_BxTxV[b, :lens[b]]] for b in range(3)]
  pos = lens.copy()
  for chunk in (1, 3, 1, 3):
    tokens = jnp.stack([seqs[b, pos[b]:pos[b] + chunk] for b in range(3)])
    out = model(tokens, cache=cache)
    cache = out.cache
    for b in range(3):
      got[b].append(out.logits_BxTxV[b])
    pos += chunk
  np.testing.assert_array_equal(np.asarray(cache.end_B), pos)
  for b in range(3):
    full = model(seqs[b:b + 1, :pos[b]]).logits_BxTxV[0]
    np.testing.assert_allclose(np.concatenate(got[b]), full, atol=2e-5, rtol=1e-5)


def test_rollback_then_rewrite_equals_clean_pass():
  module = make()
  model = jitted(module)
  model.init_cache = module.init_cache
  seq = jax.random.randint(jax.random.key(2), (2, 12), 3, 97)
  cache = model.init_cache(2, 16)
  out = model(seq[:, :6], cache=cache)
  junk = model(jnp.full((2, 4), 5), cache=out.cache)  # rejected drafts
  out2 = model(seq[:, 6:12], cache=junk.cache.rollback(out.cache.end_B))
  full = model(seq).logits_BxTxV[:, 6:]
  np.testing.assert_allclose(out2.logits_BxTxV, full, atol=2e-5, rtol=1e-5)


def test_causal_by_gradient():
  """The logit at position t does not depend on tokens after t."""
  model = make()
  x = model.embed(jax.random.randint(jax.random.key(3), (1, 8), 3, 97))

  def logit_at(x, t):
    h = x
    pos = jnp.arange(8)[None]
    from specjax.models.layers import causal_segment_mask
    mask = causal_segment_mask(jnp.ones((1, 8), jnp.int32))
    for block in model.blocks:
      h, _ = block(h, pos, mask)
    return model.logits(model.final_norm(h))[0, t].sum()

  grad_at = jax.jit(jax.grad(logit_at))
  for t in range(8):
    g = grad_at(x, jnp.int32(t))
    assert np.all(np.abs(np.asarray(g[0, t + 1:])) == 0)
    assert np.any(np.abs(np.asarray(g[0, :t + 1])) > 0)


def test_segments_do_not_attend_across_documents():
  model = jitted(make())
  tokens = jax.random.randint(jax.random.key(4), (1, 10), 3, 97)
  seg = jnp.array([[1] * 4 + [2] * 6])
  pos = jnp.array([list(range(4)) + list(range(6))])
  a = model(tokens, positions_BxT=pos, segment_ids_BxT=seg).logits_BxTxV
  other = tokens.at[0, :4].set(7)  # change document 1 only
  b = model(other, positions_BxT=pos, segment_ids_BxT=seg).logits_BxTxV
  np.testing.assert_allclose(a[0, 4:], b[0, 4:], atol=1e-6)
  alone = model(tokens[:, 4:]).logits_BxTxV
  np.testing.assert_allclose(a[0, 4:], alone[0], atol=2e-5)


def test_feature_layers_and_shapes():
  model = make()
  out = model(jnp.ones((2, 5), jnp.int32), feature_layers=(0, 1, 2))
  assert out.logits_BxTxV.shape == (2, 5, 97)
  assert out.logits_BxTxV.dtype == jnp.float32
  assert [f.shape for f in out.features] == [(2, 5, 32)] * 3
  np.testing.assert_allclose(out.features[0], model.embed(jnp.ones((2, 5), jnp.int32)))


def test_bad_shapes_are_clear_errors():
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    make(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match="even"):
    make(head_dim=7)
