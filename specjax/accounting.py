"""The accounting model (SPEC section 3): accepted length and speedup from acceptance and cost.

a_k: conditional acceptance of draft k given drafts 1..k-1 were accepted.
P_k = a_1 * ... * a_k: probability that the first k drafts are all accepted.
tau = 1 + sum_k P_k: expected tokens committed per verify step (the 1 is the target's own).
speedup = tau * T_ar / (T_draft(K) + T_verify(K + 1)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def prefix_products(acceptance: Sequence[float]) -> list[float]:
  return [float(x) for x in np.cumprod(np.asarray(acceptance, np.float64))]


def expected_tokens(acceptance: Sequence[float]) -> float:
  """tau from per-position conditional acceptance."""
  return 1.0 + float(np.sum(prefix_products(acceptance))) if len(acceptance) else 1.0


def expected_tokens_constant(a: float, k: int) -> float:
  """Closed form for a constant acceptance a over K drafts: (1 - a^(K+1)) / (1 - a)."""
  if a == 1.0:
    return float(k + 1)
  return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_from_counts(counts: Sequence[int]) -> list[float]:
  """a_k from a histogram of accepted drafts per verify step (counts[m], m = 0..K).

  Steps that accepted at least k-1 drafts reached draft k; a_k is the fraction of those
  that also accepted it. A position no step reached gets NaN.
  """
  counts = np.asarray(counts, np.float64)
  k = len(counts) - 1
  reached_at_least = np.cumsum(counts[::-1])[::-1]  # [m] -> #steps with accepted >= m
  out = []
  for pos in range(1, k + 1):
    denom = reached_at_least[pos - 1]
    out.append(float(reached_at_least[pos] / denom) if denom > 0 else float("nan"))
  return out


def measured_tau(counts: Sequence[int]) -> float:
  """Mean committed tokens per verify step: mean of (m + 1)."""
  counts = np.asarray(counts, np.float64)
  total = counts.sum()
  return float((counts * (np.arange(len(counts)) + 1)).sum() / total) if total else float("nan")


def predicted_speedup(tau: float, t_ar: float, t_draft: float, t_verify: float) -> float:
  return tau * t_ar / (t_draft + t_verify)


def best_num_drafts(acceptance: Sequence[float], t_ar: float, t_draft_per_token: float,
                    t_verify: Sequence[float]) -> tuple[int, float]:
  """The K (1..len(acceptance)) that maximises predicted speedup, given a per-draft cost
  and t_verify[n-1] = cost of a target pass over n positions. Returns (K, speedup)."""
  best = (0, 1.0)
  for k in range(1, min(len(acceptance), len(t_verify) - 1) + 1):
    s = predicted_speedup(expected_tokens(acceptance[:k]), t_ar, k * t_draft_per_token,
                          t_verify[k])
    if s > best[1]:
      best = (k, s)
  return best
