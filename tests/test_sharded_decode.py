"""Decoding over a device mesh (8 fake CPU devices): every method gives the same tokens on a
2x4 (data x tensor) and a 1x8 mesh as on one device, at T=0 and T=1 with a fixed seed, and
the parameters and caches inside the loop really are sharded."""

import dataclasses
import functools
import gc

import jax
import numpy as np
import pytest
from flax import nnx

from decoding_helpers import random_prompts
from specjax import sharding
from specjax.decoding.ar import ARDecoder
from specjax.decoding.common import pad_prompts
from specjax.decoding.speculative import SpeculativeDecoder
from specjax.drafters.dflash import DFlashDrafter
from specjax.models import Transformer, TransformerConfig
from specjax.sampling import Sampler
from test_sampling_lossless import drafters as all_drafters

# one drafter per method (test_sampling_lossless builds them at vocabulary 8, K = 2)
METHODS = ("prompt_lookup", "draft_model", "mtp_parallel_sample", "mtp_sequential",
           "dflash_sample", "dflash2", "dspark_threshold")
MESHES = {"2x4": {"data": 2, "tensor": 4}, "1x8": {"data": 1, "tensor": 8}}
BATCH, NEW, CACHE = 8, 12, 48


@pytest.fixture(scope="module")
def target():
  # 8 heads / 4 KV heads / vocabulary 8: heads, MLP and vocabulary divide over tensor = 4 and
  # 8 (KV heads only over 4: replicated on 1x8, with a warning)
  cfg = TransformerConfig(vocab_size=8, num_layers=2, d_model=64, num_heads=8, num_kv_heads=4,
                          head_dim=8, mlp_dim=128)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(3)), nnx.Param)


@pytest.fixture(scope="module")
def prompts():
  return pad_prompts(random_prompts(BATCH, 8, seed=4, min_len=3, max_len=9), 1)


def layout(name):
  return sharding.Layout(sharding.make_mesh(MESHES[name]))


def decode(target, method, drafters, sampler, lay, prompts, keep_cache=False):
  g, p = target
  tokens, lens = prompts
  if lay is not None:
    p, tokens, lens = lay.params(p), lay.rows(tokens), lay.rows(lens)
  if method == "ar":
    dec = ARDecoder(g, sampler, NEW, CACHE, -1, keep_cache, layout=lay)
    return dec(p, tokens, lens, jax.random.key(7))
  drafter, dp = drafters[method]
  if lay is not None and dp is not None:
    dp = lay.params(dp)
  dec = SpeculativeDecoder(g, sampler, NEW, CACHE, -1, keep_cache, layout=lay, drafter=drafter)
  return dec(p, dp, tokens, lens, jax.random.key(7))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_method_decodes_the_same_tokens_on_any_mesh(target, prompts, temperature):
  drafters = all_drafters(target)
  sampler = Sampler(temperature)
  for method in ("ar",) + METHODS:
    one = decode(target, method, drafters, sampler, None, prompts)
    for name in MESHES:
      got = decode(target, method, drafters, sampler, layout(name), prompts)
      np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(one.tokens_BxN),
                                    err_msg=f"{method} on {name} at T={temperature}")
      np.testing.assert_array_equal(np.asarray(got.accept_counts),
                                    np.asarray(one.accept_counts))
    jax.clear_caches()  # each 8-device program holds hundreds of memory maps until freed
    gc.collect()


SEEN = {}


@dataclasses.dataclass(frozen=True)
class InspectingDFlash(DFlashDrafter):
  """DFlash that records, at compile time, the shardings of what it sees inside the loop."""

  def propose(self, params, target, caches, ctx, sampler, rng):
    for name, x in (("drafter_cache_k", caches[0].k_BxSxKVxH), ("seq", ctx.seq_BxS),
                    ("target_wq", target.blocks[0].attn.wq[...]),
                    ("target_mlp", target.blocks[0].mlp.w_up[...]),
                    ("drafter_wq", nnx.merge(self.graphdef, params).layers[0].attn.wq[...])):
      jax.debug.inspect_array_sharding(x, callback=functools.partial(SEEN.__setitem__, name))
    return super().propose(params, target, caches, ctx, sampler, rng)


def test_parameters_and_caches_are_sharded_inside_the_loop(target, prompts):
  drafters = all_drafters(target)
  base, dp = drafters["dflash_sample"]
  drafter = InspectingDFlash(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
  lay = layout("2x4")
  SEEN.clear()
  out = decode(target, "spec", {"spec": (drafter, dp)}, Sampler(1.0), lay, prompts,
               keep_cache=True)
  spec = lambda name: SEEN[name].spec
  assert spec("drafter_cache_k")[0] == "data" and spec("drafter_cache_k")[2] == "tensor"
  assert spec("seq")[0] == "data"
  assert spec("target_wq")[1] == "tensor"  # [embed, heads, head_dim]: heads over tensor
  assert spec("target_mlp")[1] == "tensor"  # [embed, mlp]
  assert spec("drafter_wq")[1] == "tensor"
  # the loop's final carry: the target's KV cache over batch and kv_heads, tokens over batch
  k = out.cache.layers[0].k_BxSxKVxH
  assert tuple(k.sharding.spec)[:3] == ("data", None, "tensor"), k.sharding
  assert out.tokens_BxN.sharding.spec[0] == "data"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decode_py_harness_on_a_mesh_matches_one_device(tiny_run, tmp_path, temperature):
  """decode.py's harness end to end with --config.mesh_shape: the same outputs and statistics
  as on one device (rows over data = 2, the target's heads over tensor = 4)."""
  from specjax import evaluate
  from test_decode import decode_config
  reports = []
  for shape in ({"data": 1, "tensor": 1}, {"data": 2, "tensor": 4}):
    cfg = decode_config(tiny_run, tmp_path, methods="prompt_lookup,draft",
                        temperature=temperature, batch_size=4)
    cfg.mesh_shape.data, cfg.mesh_shape.tensor = shape["data"], shape["tensor"]
    reports.append(evaluate.main(cfg)["methods"])
  for method in ("ar", "prompt_lookup", "draft"):
    one, mesh = reports[0][method], reports[1][method]
    assert [o["token_ids"] for o in mesh["outputs"]] == [o["token_ids"] for o in one["outputs"]]
    assert mesh["accept_histogram"] == one["accept_histogram"]
