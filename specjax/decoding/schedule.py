"""Verify budgets (DSpark's prefix scheduler) and a verify pass whose width follows them.

A drafter that predicts, per row r and draft j, a confidence c_{r,j} that draft j is accepted
given the drafts before it has the survival a_{r,j} = prod_{i<=j} c_{r,i}: the probability
that drafts 1..j are all accepted. A schedule turns survival into a per-row budget b_r (the
loop verifies drafts 1..b_r only):

- `fixed`: every draft, b_r = K.
- `threshold`: the drafts whose survival stays >= a set value.
- `load_aware`: draft tokens across the whole batch in descending survival, admitted while
  (expected committed tokens) / (T_draft + T(verify width)) keeps growing, with T the
  measured cost of a target pass per width at this batch size and T_draft the measured cost
  of the drafter's step (paid whatever the budget). Expected committed tokens are
  sum over active rows of (1 + sum of admitted a_{r,j}).

Losslessness. The budget is fixed before verification sees the drafts, and whether draft j
of row r is admitted depends only on a_{r,1..j} (and other rows): with survival made
non-increasing along j and ties broken by position, every token ranked before (r, j) is
another row's or one of r's earlier drafts, and the greedy stops at its first refusal. Since
c_{r,j} reads draft j-1 but never draft j, the decision to verify draft j is a stopping time
of the drafting process and the rejection rule stays exact at T > 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.errors import SpecjaxError
from specjax.models.transformer import TransformerOutput

SCHEDULES = ("fixed", "threshold", "load_aware")


def check_schedule(schedule: str, threshold: float):
  if schedule not in SCHEDULES:
    raise SpecjaxError(f"unknown schedule '{schedule}'; known: {', '.join(SCHEDULES)}")
  if schedule == "threshold" and not 0.0 < threshold < 1.0:
    raise SpecjaxError(f"schedule threshold must be in (0, 1), got {threshold}")


def default_widths(k: int) -> tuple[int, ...]:
  """0, 1, 2, 4, ... and K: a few compiled verify passes (0 = the pending token only)."""
  widths, w = {0, k}, 1
  while w < k:
    widths.add(w)
    w *= 2
  return tuple(sorted(widths))


def width_costs(widths, seconds_per_width, k: int) -> tuple[float, ...]:
  """Cost of verifying w drafts for every w in 0..K: the smallest compiled width >= w."""
  out = []
  for w in range(k + 1):
    fit = min(x for x in widths if x >= w)
    out.append(float(seconds_per_width[widths.index(fit)]))
  return tuple(out)


def survival(conf_BxK, temperatures_K=None):
  """a_{r,j} = prod_{i<=j} c_{r,i}, optionally calibrated per position by temperature scaling
  of its logit, then made non-increasing in j (a cummin: still a function of c_{r,<=j})."""
  a = jnp.cumprod(conf_BxK.astype(jnp.float32), axis=-1)
  if temperatures_K is not None:
    eps = 1e-6
    a = jnp.clip(a, eps, 1 - eps)
    a = jax.nn.sigmoid((jnp.log(a) - jnp.log1p(-a)) / jnp.asarray(temperatures_K, jnp.float32))
  return jax.lax.cummin(a, axis=a.ndim - 1)


def threshold_budget(survival_BxK, threshold: float):
  return (survival_BxK >= threshold).sum(-1).astype(jnp.int32)


def load_aware_budget(survival_BxK, active_B, costs_K1, draft_seconds: float = 0.0):
  """Greedy admission in descending survival while committed tokens per second of a whole
  step, (T_draft + T(width)), grows."""
  b, k = survival_BxK.shape
  a = jnp.where(active_B[:, None], survival_BxK, 0.0).reshape(-1)
  pos = jnp.broadcast_to(jnp.arange(1, k + 1), (b, k)).reshape(-1)
  row = jnp.broadcast_to(jnp.arange(b)[:, None], (b, k)).reshape(-1)
  order = jnp.lexsort((pos, -a))  # descending survival, earlier position first on ties
  a_s, pos_s, row_s = a[order], pos[order], row[order]
  cost = jnp.asarray(costs_K1, jnp.float32) + draft_seconds
  base = active_B.sum().astype(jnp.float32)
  committed = base + jnp.cumsum(a_s)
  width = jax.lax.cummax(pos_s, axis=0)
  objective = committed / cost[width]
  before = jnp.concatenate([(base / cost[0])[None], objective[:-1]])
  grows = (objective > before) & (a_s > 0)
  admitted = jnp.cumprod(grows.astype(jnp.int32)) > 0  # stop at the first refusal
  return jnp.zeros((b,), jnp.int32).at[row_s].add(admitted.astype(jnp.int32))


def _padded(out: TransformerOutput, k1: int) -> TransformerOutput:
  pad = lambda x: jnp.pad(x, ((0, 0), (0, k1 - x.shape[1])) + ((0, 0),) * (x.ndim - 2))
  return TransformerOutput(pad(out.logits_BxTxV), pad(out.hidden_BxTxD),
                           tuple(pad(f) for f in out.features), out.cache)


def verify_at_width(target, window_BxK1, cache, widths, need, feature_layers=()):
  """The target's verify pass over the first w+1 window positions, w the smallest compiled
  width >= need (a traced scalar), outputs padded to K+1 positions (the padding is never
  read: nothing past the budget is accepted). Returns (output, w).

  Each width is a `while_loop` that runs once or not at all, not a branch of one
  `lax.switch`: XLA:CPU copies every cache buffer into and out of a conditional whose
  branches write it (two full copies of the cache a step), while a loop's carry is updated
  in place."""
  k1 = window_BxK1.shape[1]
  widths_arr = jnp.asarray(widths, jnp.int32)
  index = jnp.minimum(jnp.searchsorted(widths_arr, need), len(widths) - 1)
  shape = jax.eval_shape(lambda w, c: _padded(target(w, cache=c, feature_layers=feature_layers),
                                              k1), window_BxK1, cache)
  out = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
  out = out.replace(cache=cache)
  for i, w in enumerate(widths):
    def body(carry, w=w):
      pending, out = carry
      new = _padded(target(window_BxK1[:, :w + 1], cache=out.cache,
                           feature_layers=feature_layers), k1)
      return jnp.bool_(False), new
    out = jax.lax.while_loop(lambda c: c[0], body, (index == i, out))[1]
  return out, widths_arr[index]
