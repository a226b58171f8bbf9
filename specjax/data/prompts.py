"""Evaluation prompts: a .txt (one prompt per line) or .jsonl ("prompt" field) file.

The bundled default (`prompts.jsonl`, 32 Python snippets written for specjax) is held out
from training by construction: none of it comes from the training corpus.
"""

from __future__ import annotations

import json
import os

from specjax.errors import SpecjaxError

DEFAULT_PROMPTS = os.path.join(os.path.dirname(__file__), "prompts.jsonl")


def load_prompts(path: str = "", limit: int = 0) -> list[str]:
  path = os.path.expanduser(path or DEFAULT_PROMPTS)
  if not os.path.exists(path):
    raise SpecjaxError(f"prompt file {path} does not exist")
  prompts = []
  with open(path, encoding="utf-8") as f:
    if path.endswith(".jsonl"):
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise SpecjaxError(f"{path} line {n} is not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
          raise SpecjaxError(f"{path} line {n} has no string field 'prompt'")
        prompts.append(record["prompt"])
    else:
      prompts = [line.rstrip("\n") for line in f if line.strip()]
  prompts = [p for p in prompts if p.strip()]
  if not prompts:
    raise SpecjaxError(f"prompt file {path} has no prompts; add one per line (or "
                       "'prompt' fields in .jsonl)")
  return prompts[:limit] if limit else prompts
