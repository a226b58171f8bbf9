"""User-facing errors: one line that names the fix, never a deep JAX traceback."""


class SpecjaxError(Exception):
  """Bad input (config, checkpoint, prompt, shapes). The message is the whole story."""
