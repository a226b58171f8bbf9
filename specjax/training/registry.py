"""config.method -> the function that trains it."""

from __future__ import annotations

from specjax.errors import SpecjaxError


def trainers():
  from specjax.training.dflash import train_dflash
  from specjax.training.dflash2 import train_dflash2
  from specjax.training.draft import train_draft
  from specjax.training.dspark import train_dspark
  from specjax.training.mtp import train_mtp
  from specjax.training.target import train_target
  return {"target": train_target, "draft": train_draft, "mtp": train_mtp,
          "dflash": train_dflash, "dflash2": train_dflash2,
          "dspark": train_dspark}


def train(cfg):
  table = trainers()
  if cfg.method not in table:
    raise SpecjaxError(f"unknown method '{cfg.method}' in the config; known: {sorted(table)}")
  return table[cfg.method](cfg)
