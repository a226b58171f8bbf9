"""Chat instructions made from Python source files: the prompts a chat target answers to make
its drafters' training data (`regen.prompts="instructions"`, specjax/training/regenerate.py).

Three kinds, taken from each source file of a corpus split (data.source_dir, split by file as
the corpus is):
  write      a function with a docstring: "Write a Python function `name(args)`. <docstring>"
  explain    a function's source of 4-40 lines: "Explain what this Python code does: <code>"
  summarize  a module or class docstring of 40+ words (prose): "Summarize the following text"
The first two are HumanEval's register (write and read code), the third is prose, the nearest
offline stand-in for MT-Bench's writing and humanities questions.

Deterministic: files in split order, one seeded rng picks each function's kind and the order.

Disjoint from the benchmarks: an instruction that shares a run of OVERLAP_WORDS words with any
HumanEval problem (prompt, canonical solution, tests) or any MT-Bench turn is dropped, and so is
a function named like a HumanEval entry point.
"""

from __future__ import annotations

import ast
import re

import numpy as np

from specjax.errors import SpecjaxError

KINDS = ("write", "explain", "summarize")
OVERLAP_WORDS = 8
MAX_CODE_LINES = 40
MIN_CODE_LINES = 4
MIN_PROSE_WORDS = 40
MAX_DOC_CHARS = 1200

WRITE = "Write a Python function `{signature}`. {doc}"
EXPLAIN = "Explain what this Python code does:\n```python\n{code}\n```"
SUMMARIZE = "Summarize the following text in a few sentences:\n\n{doc}"


def words(text: str) -> list[str]:
  return re.findall(r"[a-z0-9_]+", text.lower())


def ngrams(text: str, n: int = OVERLAP_WORDS) -> set[tuple[str, ...]]:
  w = words(text)
  return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def benchmark_texts() -> tuple[list[str], set[str]]:
  """(every HumanEval and MT-Bench text, HumanEval's entry-point names), from the copies their
  packages ship."""
  from specjax.data import benchmarks
  humaneval = benchmarks.read_shipped("humaneval")
  texts = [r[k] for r in humaneval for k in ("prompt", "canonical_solution", "test")]
  texts += [t for q in benchmarks.read_shipped("mtbench") for t in q["turns"]]
  return texts, {r["entry_point"] for r in humaneval}


class Banned:
  """What an instruction must not share with the benchmarks."""

  def __init__(self, texts, names=()):
    self.grams = set().union(*(ngrams(t) for t in texts)) if texts else set()
    self.names = set(names)

  def overlaps(self, text: str) -> bool:
    return not self.grams.isdisjoint(ngrams(text))


def _clean_doc(doc: str) -> str:
  doc = doc.strip()
  return doc[:MAX_DOC_CHARS].rsplit(" ", 1)[0] + " ..." if len(doc) > MAX_DOC_CHARS else doc


def _signature(fn: ast.FunctionDef) -> str:
  args = ast.unparse(fn.args) if fn.args else ""
  return f"{fn.name}({args})"


def from_source(text: str, rng: np.random.Generator, banned: Banned | None = None) -> list[str]:
  """The instructions one source file gives (possibly none: unparsable, no docstrings)."""
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return []
  lines = text.splitlines()
  out = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef)):
      doc = ast.get_docstring(node)
      if doc and len(doc.split()) >= MIN_PROSE_WORDS:
        out.append(SUMMARIZE.format(doc=_clean_doc(doc)))
      continue
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    if banned is not None and node.name in banned.names or node.name.startswith("__"):
      continue
    doc = ast.get_docstring(node)
    n_lines = node.end_lineno - node.lineno + 1
    can_write = bool(doc) and len(doc.split()) >= 4
    can_explain = MIN_CODE_LINES <= n_lines <= MAX_CODE_LINES
    if not (can_write or can_explain):
      continue
    kind = "write" if can_write and (not can_explain or rng.random() < 0.5) else "explain"
    if kind == "write":
      out.append(WRITE.format(signature=_signature(node), doc=_clean_doc(doc)))
    else:
      code = "\n".join(lines[node.lineno - 1:node.end_lineno])
      indent = len(code) - len(code.lstrip(" "))
      out.append(EXPLAIN.format(code="\n".join(l[indent:] for l in code.splitlines())))
  if banned is not None:
    out = [t for t in out if not banned.overlaps(t)]
  return out


def instructions(documents, seed: int, banned: Banned | None = None,
                 enough: int = 0) -> list[str]:
  """The documents' instructions (strings, read in order until `enough` are found; 0 = all),
  shuffled by `seed`."""
  rng = np.random.default_rng(seed)
  out = []
  for text in documents:
    out += from_source(text, rng, banned)
    if enough and len(out) >= enough:
      break
  if not out:
    raise SpecjaxError("the corpus gives no instructions (no parsable Python with docstrings "
                       "or short functions); check data.source_dir")
  return [out[i] for i in rng.permutation(len(out))]
