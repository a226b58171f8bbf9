"""Evaluates the AR baseline and speculative decoding methods side by side.

  python decode.py --config.run_dir=runs/tiny --config.methods=ar,prompt_lookup,draft

Every key of configs/decode.py can be overridden with --config.key=value.
"""

import os

from ml_collections import config_flags

from specjax import cli

_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "decode.py")
_CONFIG = config_flags.DEFINE_config_file("config", None, "Decode config (configs/decode.py).",
                                          lock_config=True)


def decode(cfg):
  from specjax import evaluate
  if cfg.plan:
    from specjax import plan
    plan.run(cfg, "decode", evaluate.parse_methods(cfg.methods))
    return
  evaluate.main(cfg)


if __name__ == "__main__":
  cli.run(_CONFIG, decode, default_config=_DEFAULT)
