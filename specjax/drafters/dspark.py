"""DSpark (DeepSeek-AI 2026): the DFlash drafter with a sequential Markov head and a
confidence head that tells the loop how much of the block is worth verifying.

- Backbone: DFlash's (`DFlashModel`) with the two heads below; aligned as in DeepSpec: the
  block is [anchor, MASK x (B-1)] and every slot predicts, slot j the token after position anchor + j,
  so B inputs give B drafts and the anchor slot's own prediction is the first draft.
- Markov head: logits_j = U_j + W2(W1[x_{j-1}]) with W1 a V x r embedding and W2 an r -> V
  map; x_0 is the anchor token. Drafting walks the block left to right on device: argmax at
  T = 0, a sample at T > 0 from the processed distribution, and that exact q goes to the
  verifier's general rule (lossless).
- Confidence head: c_j = sigmoid(w . [h_j ; W1[x_{j-1}]] + b), an estimate of the probability
  that draft j is accepted given the drafts before it. Its survival prod_{i<=j} c_i, calibrated
  per position, is what the prefix scheduler (`decoding/schedule.py`) budgets with.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.decoding import schedule as schedule_lib
from specjax.drafters.base import Context, Prefill, Verified
from specjax.drafters.dflash import DFlashDrafter, DFlashModel
from specjax.drafters.walk import walk
from specjax.errors import SpecjaxError
from specjax.models.layers import TransformerConfig, param


class MarkovHead(nnx.Module):
  """W1 [V, r], the previous token's embedding, and W2 [r, V], its logit bias (no parameters
  when rank = 0: no dependence between slots)."""

  def __init__(self, vocab: int, rank: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    self.rank = rank
    if rank:
      self.markov_w1 = param(rngs, nnx.initializers.normal(1.0), (vocab, rank), ("vocab", None),
                             param_dtype)
      # zero: the head starts as the plain backbone and learns the transition from there
      self.markov_w2 = param(rngs, nnx.initializers.zeros, (rank, vocab), (None, "vocab"),
                             param_dtype)

  def embed(self, prev_tokens):
    """W1[x_{j-1}] ([..., r]; [..., 0] without a Markov head)."""
    if not self.rank:
      return jnp.zeros(prev_tokens.shape + (0,), jnp.float32)
    return jnp.take(self.markov_w1[...], prev_tokens, axis=0).astype(jnp.float32)

  def __call__(self, prev_embedding):
    """The logits the previous token adds (0.0 without a Markov head)."""
    if not self.rank:
      return 0.0
    return prev_embedding @ self.markov_w2[...].astype(jnp.float32)


class ConfidenceHead(nnx.Module):
  """c_j = sigmoid(w . [h_j ; W1[x_{j-1}]] + b), w [H + r], b []; zero at init."""

  def __init__(self, d: int, rank: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    self.w = param(rngs, nnx.initializers.zeros, (d + rank,), (None,), param_dtype)
    self.b = param(rngs, nnx.initializers.zeros, (), (), param_dtype)

  def __call__(self, hidden, prev_embedding):
    """The confidence logit."""
    x = jnp.concatenate([hidden.astype(jnp.float32), prev_embedding], axis=-1)
    return x @ self.w[...].astype(jnp.float32) + self.b[...]


def dspark_model(cfg: TransformerConfig, num_layers: int, num_features: int, markov_rank: int,
                 *, rngs: nnx.Rngs, **backbone) -> DFlashModel:
  """DFlash's block backbone with DSpark's heads: `markov_head` and `confidence_head`.
  backbone: DFlashModel's keywords (layer shape, mask token, output scaling)."""
  pd = cfg.weight_dtype
  heads = lambda rngs: {
      "markov_head": MarkovHead(cfg.vocab_size, markov_rank, rngs=rngs, param_dtype=pd),
      "confidence_head": ConfidenceHead(cfg.d_model, markov_rank, rngs=rngs, param_dtype=pd)}
  return DFlashModel(cfg, num_layers, num_features, rngs=rngs, heads=heads, **backbone)


# Checkpoints written before the heads were modules of their own (their parameters sat on the
# model): old path -> new path. They decode (run_dir.load_module renames them on load); their
# training does not resume (README, "DSpark").
LEGACY_PATHS = {("markov_w1",): ("markov_head", "markov_w1"),
                ("markov_w2",): ("markov_head", "markov_w2"),
                ("confidence_w",): ("confidence_head", "w"),
                ("confidence_b",): ("confidence_head", "b")}


def markov_walk(model: DFlashModel, base_logits_BxKxV, hidden_BxKxD, anchor_B, sampler, rng):
  """Left-to-right drafting through the Markov head. Returns (drafts [B, K], q [B, K, V] or
  None at T = 0, confidences [B, K])."""
  k = base_logits_BxKxV.shape[1]
  keys = jax.random.split(rng, k)
  markov, confidence = model.markov_head, model.confidence_head
  if not markov.rank:  # no dependence between slots: one vectorised draw
    if sampler.greedy:
      drafts, q = jnp.argmax(base_logits_BxKxV, -1).astype(jnp.int32), None
    else:
      logp = sampler.log_probs(base_logits_BxKxV)
      drafts = jax.vmap(lambda key, lp: jax.random.categorical(key, lp, -1),
                        in_axes=(0, 1), out_axes=1)(keys, logp).astype(jnp.int32)
      q = jnp.exp(logp)
    prev = jnp.concatenate([anchor_B[:, None], drafts[:, :-1]], axis=1)
    conf = jax.nn.sigmoid(confidence(hidden_BxKxD, markov.embed(prev)))
    return drafts, q, conf

  def slot(prev_B, x):
    logits_BxV, hidden_BxD = x
    e = markov.embed(prev_B)
    return logits_BxV + markov(e), None, jax.nn.sigmoid(confidence(hidden_BxD, e))

  drafts, _, q, conf = walk(slot, (base_logits_BxKxV, hidden_BxKxD), anchor_B, sampler, rng)
  return drafts, q, conf


@struct.dataclass
class DSparkState:
  caches: tuple  # DFlash's per-layer context K/V
  conf_BxK: jax.Array  # the last proposal's confidences


@dataclasses.dataclass(frozen=True)
class DSparkDrafter(DFlashDrafter):
  """num_draft_tokens = K = the block's B inputs. `schedule` picks the verify budget;
  `widths` are the compiled verify widths (empty: 0, 1, 2, 4, ..., K); `width_seconds` the
  measured cost of a target pass per width and `draft_seconds` that of this drafter's step
  (load_aware); `temperatures` the per-position calibration of the survival (empty: none)."""

  schedule: str = "fixed"
  threshold: float = 0.5
  widths: tuple[int, ...] = ()
  width_seconds: tuple[float, ...] = ()
  draft_seconds: float = 0.0
  temperatures: tuple[float, ...] = ()

  def __post_init__(self):
    super().__post_init__()
    schedule_lib.check_schedule(self.schedule, self.threshold)
    widths = self.compiled_widths
    if widths[-1] != self.num_draft_tokens or widths[0] < 0:
      raise SpecjaxError(f"verify widths {widths} must lie in 0..K and include K="
                         f"{self.num_draft_tokens}")
    if self.schedule == "load_aware" and len(self.width_seconds) != len(widths):
      raise SpecjaxError(f"the load_aware schedule needs one measured cost per verify width "
                         f"{widths}, got {len(self.width_seconds)}")
    if self.temperatures and len(self.temperatures) < self.num_draft_tokens:
      raise SpecjaxError(f"{len(self.temperatures)} calibration temperatures for "
                         f"{self.num_draft_tokens} drafts")

  @property
  def block_len(self) -> int:
    return self.num_draft_tokens  # every slot predicts: the anchor and K - 1 mask slots

  @property
  def compiled_widths(self) -> tuple[int, ...]:
    return tuple(sorted(set(self.widths))) or schedule_lib.default_widths(self.num_draft_tokens)

  @property
  def verify_widths(self):
    return None if self.schedule == "fixed" else self.compiled_widths

  def init(self, params, target, prefill: Prefill):
    b = prefill.tokens_BxP.shape[0]
    return DSparkState(super().init(params, target, prefill),
                       jnp.zeros((b, self.num_draft_tokens), jnp.float32))

  def block_logits(self, model, target, caches, ctx: Context):
    """The backbone's block pass: (base logits U [B, K, V], hidden [B, K, D], caches)."""
    k = self.block_len
    x = model.block_inputs(target, ctx.pending_B[:, None], k)
    positions = ctx.end_B[:, None] + jnp.arange(k)[None, :]
    hidden, caches = model.decode_block(x, positions, caches)
    return target.logits(hidden), hidden, caches

  def propose(self, params, target, state: DSparkState, ctx: Context, sampler, rng):
    model = nnx.merge(self.graphdef, params)
    base, hidden, caches = self.block_logits(model, target, state.caches, ctx)
    drafts, q, conf = markov_walk(model, base, hidden, ctx.pending_B, sampler, rng)
    return drafts, q, DSparkState(caches, conf)

  def commit(self, params, target, state: DSparkState, verified: Verified):
    return state.replace(caches=super().commit(params, target, state.caches, verified))

  def survival(self, conf_BxK):
    temps = self.temperatures[:self.num_draft_tokens] or None
    return schedule_lib.survival(conf_BxK, temps)

  def verify_budget(self, params, state: DSparkState, active_B):
    if self.schedule == "fixed":
      return None
    a = self.survival(state.conf_BxK)
    if self.schedule == "threshold":
      return schedule_lib.threshold_budget(a, self.threshold)
    costs = schedule_lib.width_costs(self.compiled_widths, self.width_seconds,
                                     self.num_draft_tokens)
    return schedule_lib.load_aware_budget(a, active_B, costs, self.draft_seconds)

  def summary(self) -> dict:
    out = {"schedule": self.schedule}
    if self.width_seconds:
      out["verify_width_seconds"] = dict(zip(map(str, self.compiled_widths), self.width_seconds))
    return out

  def step_statistics(self, state: DSparkState, active_B) -> dict:
    w = active_B[:, None].astype(jnp.float32)
    return {"confidence": (state.conf_BxK * w).sum(0),
            "survival": (self.survival(state.conf_BxK) * w).sum(0),
            "rows": active_B.sum().astype(jnp.float32)}


def build_model(cfg, target_cfg, rngs):
  """DSpark from its training config (abstractly under nnx.eval_shape when loading)."""
  from specjax.drafters.dflash import backbone_kwargs, feature_layers
  return dspark_model(target_cfg, cfg.num_layers,
                      len(feature_layers(cfg, target_cfg.num_layers)), cfg.markov_rank, rngs=rngs,
                      **backbone_kwargs(cfg, target_cfg))
