"""What train.py and decode.py share: flag parsing with one-line errors, and error handling."""

from __future__ import annotations

import contextlib
import sys

from absl import flags

from specjax.errors import SpecjaxError


def fail(message: str):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def parse_flags(argv):
  """absl flag parsing, but a bad flag or unknown config key is one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(_first_line(e))
  except (AttributeError, KeyError) as e:  # config_flags on an override of a missing key
    key = next((a.split("=")[0] for a in argv if a.startswith("--config.")
                and _first_line(e).strip("'\"") in a), "")
    hint = [l for l in _message(e).splitlines()[1:] if l.startswith("Did you mean")]
    fail(f"unknown config key {key or _first_line(e)}"
         f"{' (' + hint[0].rstrip('?') + '?)' if hint else ''}; see the config file for the "
         "keys it has")
  except Exception as e:  # config files that fail to load raise plain exceptions
    fail(f"{type(e).__name__}: {_first_line(e)}")


def _message(e: BaseException) -> str:
  """The text of an error; ml_collections wraps a KeyError in an AttributeError, and a
  KeyError's str() is its message's repr ("'a'\\nDid you mean..."): read the message."""
  while isinstance(e, (KeyError, AttributeError)) and e.args and isinstance(e.args[0],
                                                                            BaseException):
    e = e.args[0]
  if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str):
    return e.args[0]
  return str(e)


def _first_line(e: BaseException) -> str:
  text = _message(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def config_value(holder):
  """The parsed config, or a one-line error if its file could not be loaded."""
  try:
    cfg = holder.value
    if cfg is None:
      fail("no config given; pass --config=configs/<name>.py")
    cfg.keys()  # config_flags defers a load failure to the first access
    return cfg
  except OSError as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    fail(f"could not load the config file: {lines[-1] if lines else e}")


def reject_extra_args(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]}; settings go in --config.key=value")


@contextlib.contextmanager
def user_errors():
  """Turns SpecjaxError into a one-line message and exit code 1."""
  from absl import logging

  from specjax import sharding
  logging.set_verbosity(logging.ERROR)  # orbax and tfds log routine events
  try:
    sharding.maybe_initialize_distributed()
    yield
  except SpecjaxError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(config_holder, fn, default_config: str | None = None):
  """The body of train.py / decode.py: parse, then fn(config) with one-line user errors.
  `default_config` is used when no --config is given (passed here rather than to
  DEFINE_config_file, which would parse overrides at import, before errors are handled)."""
  if default_config and not any(a == "--config" or a.startswith("--config=")
                                for a in sys.argv[1:]):
    sys.argv.insert(1, f"--config={default_config}")

  def main(argv):
    reject_extra_args(argv)
    cfg = config_value(config_holder)
    with user_errors():
      fn(cfg)

  from absl import app
  app.run(main, flags_parser=parse_flags)
