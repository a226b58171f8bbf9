"""Import and export checkpoints of other codebases into / out of a specjax run directory.

  python -m specjax.interop import-hf HF_DIR RUN_DIR         # Llama / Qwen3 -> RUN_DIR/target
  python -m specjax.interop export-hf RUN_DIR OUT_DIR [--model=draft]   # (the target else)
  python -m specjax.interop import-gguf MODEL.gguf RUN_DIR   # llama.cpp file -> RUN_DIR/target
  python -m specjax.interop import-dflash DRAFT_DIR RUN_DIR  # z-lab drafter -> RUN_DIR/dflash
  python -m specjax.interop export-dflash RUN_DIR OUT_DIR    #   (DFlash 2 -> RUN_DIR/dflash2)
  python -m specjax.interop export-dflash2 RUN_DIR OUT_DIR
  python -m specjax.interop import-speculators DIR RUN_DIR  # vLLM speculators -> RUN_DIR/<method>
  python -m specjax.interop export-speculators RUN_DIR METHOD OUT_DIR [VERIFIER_PATH]
"""

from __future__ import annotations

import importlib
import sys

from specjax.errors import SpecjaxError

# command -> (module, function(*arguments)); each module owns one checkpoint format
COMMANDS = {
    "import-hf": ("specjax.interop.hf", "import_hf"),
    "export-hf": ("specjax.interop.hf", "export_hf"),
    "import-gguf": ("specjax.interop.gguf", "import_gguf"),
    "import-dflash": ("specjax.interop.zlab", "import_dflash"),
    "export-dflash": ("specjax.interop.zlab", "export_dflash"),
    "export-dflash2": ("specjax.interop.zlab", "export_dflash2"),
    "import-speculators": ("specjax.interop.speculators", "import_speculators"),
    "export-speculators": ("specjax.interop.speculators", "export_speculators"),
}
ARGUMENTS = {"export-speculators": (3, 4)}  # (fewest, most); others take exactly 2
OPTIONS = {"export-hf": ("model",)}  # --name=value options a command takes


def main(argv: list[str]) -> int:
  options = [a for a in argv[1:] if a.startswith("--")]
  argv = [a for a in argv if a not in options]
  kwargs = dict(a[2:].partition("=")[::2] for a in options)
  allowed = OPTIONS.get(argv[0] if argv else "", ())
  if any(k not in allowed for k in kwargs):
    print(__doc__.strip(), file=sys.stderr)
    return 2
  low, high = ARGUMENTS.get(argv[0] if argv else "", (2, 2))
  if not argv or argv[0] not in COMMANDS or not low <= len(argv) - 1 <= high:
    print(__doc__.strip(), file=sys.stderr)
    return 2
  module, fn = COMMANDS[argv[0]]
  try:
    getattr(importlib.import_module(module), fn)(*argv[1:], **kwargs)
  except SpecjaxError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
