"""config.method -> the function that trains it: the target's, and each registered method's
(specjax.methods)."""

from __future__ import annotations

from specjax import methods
from specjax.errors import SpecjaxError


def trainers():
  return methods.trainers()


def train(cfg):
  table = trainers()
  if cfg.method not in table:
    raise SpecjaxError(f"unknown method '{cfg.method}' in the config; known: {sorted(table)}")
  return table[cfg.method](cfg)
