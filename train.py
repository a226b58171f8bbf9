"""Trains the target or a drafter into the run directory.

  python train.py --config=configs/target_tiny.py --config.run_dir=runs/tiny
  python train.py --config=configs/draft_tiny.py --config.run_dir=runs/tiny

Every config key can be overridden with --config.key=value.
"""

from ml_collections import config_flags

from specjax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config (configs/*.py).",
                                          lock_config=True)


def train(cfg):
  if cfg.get("plan", False):
    from specjax import plan
    plan.run(cfg, "train")
    return
  from specjax.training import registry
  registry.train(cfg)


if __name__ == "__main__":
  cli.run(_CONFIG, train)
