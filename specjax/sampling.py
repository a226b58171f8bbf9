"""Logit processing shared by the AR baseline and verification: temperature, top-k, top-p.

Speculative sampling is lossless only if the target's distribution p is processed exactly
as the AR baseline processes it, so both call `Sampler.probs` / `Sampler.sample`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import fast_rng  # noqa: F401  (one kernel per random draw on CPU)
from specjax.errors import SpecjaxError


@dataclasses.dataclass(frozen=True)
class Sampler:
  temperature: float = 0.0  # 0 = greedy
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1 = off

  def __post_init__(self):
    if self.temperature < 0:
      raise SpecjaxError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise SpecjaxError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise SpecjaxError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def log_probs(self, logits_xV):
    """Processed log-probabilities (-inf outside the top-k / top-p set)."""
    logits = logits_xV.astype(jnp.float32) / self.temperature
    if self.top_k and self.top_k < logits.shape[-1]:
      # top-p then only needs the k candidates, already sorted: no sort over the vocabulary
      candidates = jax.lax.top_k(logits, self.top_k)[0]
    elif self.top_p < 1.0:
      candidates = jnp.sort(logits, axis=-1)[..., ::-1]
    else:
      candidates = None
    if candidates is not None:
      threshold = candidates[..., -1:]
      if self.top_p < 1.0:
        probs = jax.nn.softmax(candidates, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
        threshold = jnp.min(jnp.where(before < self.top_p, candidates, jnp.inf), axis=-1,
                            keepdims=True)
      logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.nn.log_softmax(logits, axis=-1)

  def probs(self, logits_xV):
    return jnp.exp(self.log_probs(logits_xV))

  def sample(self, logits_xV, rng):
    if self.greedy:
      return jnp.argmax(logits_xV, axis=-1).astype(jnp.int32)
    return jax.random.categorical(rng, self.log_probs(logits_xV), axis=-1).astype(jnp.int32)
