"""Evaluates the AR baseline and speculative decoding methods side by side.

  python decode.py --config.run_dir=runs/tiny --config.methods=ar,prompt_lookup,draft

Every key of configs/decode.py can be overridden with --config.key=value.
"""

from __future__ import annotations

import os

from absl import app
from ml_collections import config_flags

from specjax import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "decode.py"),
    "Decode config.", lock_config=True)


def main(argv):
  cli.reject_extra_args(argv)
  cfg = cli.config_value(_CONFIG)
  with cli.user_errors():
    from specjax import evaluate
    evaluate.main(cfg)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
