"""DSpark (DeepSeek-AI 2026): the DFlash drafter with a sequential Markov head and a
confidence head that tells the loop how much of the block is worth verifying.

- Backbone: DFlash (`DFlashModel`, reused as is), aligned as in DeepSpec: the block is
  [anchor, MASK x (B-1)] and every slot predicts, slot j the token after position anchor + j,
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


class DSparkModel(DFlashModel):
  """DFlash's parameters plus the Markov head (W1, W2; none when markov_rank = 0) and the
  confidence head (w, b)."""

  def __init__(self, cfg: TransformerConfig, num_layers: int, num_features: int,
               markov_rank: int, *, rngs: nnx.Rngs, **backbone):
    """backbone: DFlashModel's keywords (layer shape, mask token, output scaling)."""
    super().__init__(cfg, num_layers, num_features, rngs=rngs, **backbone)
    d, v, r, pd = cfg.d_model, cfg.vocab_size, markov_rank, cfg.weight_dtype
    self.markov_rank = r
    if r:
      self.markov_w1 = param(rngs, nnx.initializers.normal(1.0), (v, r), ("vocab", None), pd)
      # zero: the head starts as the plain backbone and learns the transition from there
      self.markov_w2 = param(rngs, nnx.initializers.zeros, (r, v), (None, "vocab"), pd)
    self.confidence_w = param(rngs, nnx.initializers.zeros, (d + r,), (None,), pd)
    self.confidence_b = param(rngs, nnx.initializers.zeros, (), (), pd)

  def previous_embedding(self, prev_tokens):
    """W1[x_{j-1}] ([..., r]; [..., 0] without a Markov head)."""
    if not self.markov_rank:
      return jnp.zeros(prev_tokens.shape + (0,), jnp.float32)
    return jnp.take(self.markov_w1[...], prev_tokens, axis=0).astype(jnp.float32)

  def markov_logits(self, prev_embedding):
    if not self.markov_rank:
      return 0.0
    return prev_embedding @ self.markov_w2[...].astype(jnp.float32)

  def confidence_logit(self, hidden, prev_embedding):
    x = jnp.concatenate([hidden.astype(jnp.float32), prev_embedding], axis=-1)
    return x @ self.confidence_w[...].astype(jnp.float32) + self.confidence_b[...]


def markov_walk(model: DSparkModel, base_logits_BxKxV, hidden_BxKxD, anchor_B, sampler, rng):
  """Left-to-right drafting through the Markov head. Returns (drafts [B, K], q [B, K, V] or
  None at T = 0, confidences [B, K])."""
  k = base_logits_BxKxV.shape[1]
  keys = jax.random.split(rng, k)
  if not model.markov_rank:  # no dependence between slots: one vectorised draw
    if sampler.greedy:
      drafts, q = jnp.argmax(base_logits_BxKxV, -1).astype(jnp.int32), None
    else:
      logp = sampler.log_probs(base_logits_BxKxV)
      drafts = jax.vmap(lambda key, lp: jax.random.categorical(key, lp, -1),
                        in_axes=(0, 1), out_axes=1)(keys, logp).astype(jnp.int32)
      q = jnp.exp(logp)
    prev = jnp.concatenate([anchor_B[:, None], drafts[:, :-1]], axis=1)
    conf = jax.nn.sigmoid(model.confidence_logit(hidden_BxKxD, model.previous_embedding(prev)))
    return drafts, q, conf

  def slot(prev_B, x):
    logits_BxV, hidden_BxD = x
    e = model.previous_embedding(prev_B)
    conf = jax.nn.sigmoid(model.confidence_logit(hidden_BxD, e))
    return logits_BxV + model.markov_logits(e), None, conf

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
  return DSparkModel(target_cfg, cfg.num_layers,
                     len(feature_layers(cfg, target_cfg.num_layers)), cfg.markov_rank, rngs=rngs,
                     **backbone_kwargs(cfg, target_cfg))
