"""Trains the target or a drafter into the run directory.

  python train.py --config=configs/target_tiny.py --config.run_dir=runs/tiny
  python train.py --config=configs/draft_tiny.py --config.run_dir=runs/tiny

Every config key can be overridden with --config.key=value.
"""

from __future__ import annotations

from absl import app
from ml_collections import config_flags

from specjax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config (configs/*.py).",
                                          lock_config=True)


def main(argv):
  cli.reject_extra_args(argv)
  cfg = cli.config_value(_CONFIG)
  with cli.user_errors():
    from specjax.training import registry
    registry.train(cfg)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
