"""AdamW with linear warmup, cosine decay and global-norm clipping (optax)."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(cfg):
  warmup = int(cfg.warmup_steps) if cfg.warmup_steps >= 1 else int(cfg.warmup_steps * cfg.num_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=cfg.learning_rate,
      warmup_steps=max(warmup, 1),
      decay_steps=max(cfg.num_steps, warmup + 1),
      end_value=cfg.learning_rate * cfg.min_lr_ratio,
  )


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Weight decay applies to matrices only (ndim >= 2), not to norm scales."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(
          learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=1e-8,
          weight_decay=cfg.weight_decay,
          mask=lambda params: jax.tree.map(lambda x: x.ndim >= 2, params),
      ),
  )
