"""Held-out prompts from the drafters' own distribution: the corpus prefixes of the
regenerated validation rows in a run folder, as a decode.py prompt file.

  python scripts/heldout_prompts.py runs/reference runs/reference/heldout_prompts.jsonl [--count 32]
  python decode.py --config.run_dir=runs/reference --config.prompts=runs/reference/heldout_prompts.jsonl ...
"""

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from specjax import run_dir as run_dir_lib  # noqa: E402
from specjax.data import tokenizer as tokenizer_lib  # noqa: E402
from specjax.errors import SpecjaxError  # noqa: E402


def heldout_prompts(run_dir: str, count: int) -> list[str]:
  root = run_dir_lib.resolve(run_dir)
  for meta_path in sorted(glob.glob(os.path.join(root, "regenerated", "*.json"))):
    with open(meta_path) as f:
      meta = json.load(f)
    if meta.get("split") == "validation":
      rows = np.load(meta_path[:-len(".json")] + ".npy")
      lens_path = meta_path[:-len(".json")] + ".lens.npy"  # chat prompts: one length per row
      lens = np.load(lens_path) if os.path.exists(lens_path) else [meta["prompt_len"]] * len(rows)
      tok = run_dir_lib.load_tokenizer(root)
      return [tokenizer_lib.decode(tok, [int(t) for t in row[:n]])
              for row, n in zip(rows[:count], lens)]
  raise SpecjaxError(f"{root}/regenerated holds no validation rows; train a drafter with "
                     "train_on=regenerated first")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("run_dir")
  parser.add_argument("out")
  parser.add_argument("--count", type=int, default=32)
  args = parser.parse_args(argv)
  try:
    prompts = heldout_prompts(args.run_dir, args.count)
  except SpecjaxError as e:
    sys.exit(f"error: {e}")
  with open(args.out, "w") as f:
    for p in prompts:
      f.write(json.dumps({"prompt": p}) + "\n")
  print(f"wrote {len(prompts)} prompts to {args.out}")


if __name__ == "__main__":
  main()
