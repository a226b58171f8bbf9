"""TFDS builder over a local tree of Python source files (by default the running interpreter's
standard library), so that the default pipeline needs no network.

The split is by file and deterministic: a file goes to `validation` when the MD5 of its
relative path falls in the lowest `validation_percent` buckets (at least one file does).
Stored as ArrayRecord; read back with `tfds.data_source`, no TensorFlow import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig

import tensorflow_datasets as tfds

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__",
             "lib2to3", "ensurepip", "turtledemo", "pydoc_data"}
MAX_FILE_BYTES = 300_000


def stdlib_dir() -> str:
  return sysconfig.get_paths()["stdlib"]


def list_source_files(root: str) -> list[str]:
  """Relative paths of the .py files under root, sorted, skipping tests and vendored trees."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      if name.endswith(".py") and os.path.getsize(path) <= MAX_FILE_BYTES:
        out.append(os.path.relpath(path, root))
  return sorted(out)


def _bucket(relpath: str) -> int:
  return int(hashlib.md5(relpath.encode()).hexdigest(), 16) % 100


def split_files(files: list[str], validation_percent: int) -> dict[str, list[str]]:
  val = [f for f in files if _bucket(f) < validation_percent]
  if not val and len(files) > 1:
    val = [min(files, key=lambda f: (_bucket(f), f))]
  train = [f for f in files if f not in set(val)]
  return {"train": train, "validation": val}


@dataclasses.dataclass
class PythonSourceConfig(tfds.core.BuilderConfig):
  source_dir: str = ""  # empty: the interpreter's standard library
  validation_percent: int = 5


def source_config(source_dir: str = "", validation_percent: int = 5) -> PythonSourceConfig:
  """A config whose name identifies the source tree, so different trees never share files."""
  root = os.path.abspath(source_dir or stdlib_dir())
  digest = hashlib.md5(f"{root}|{validation_percent}".encode()).hexdigest()[:10]
  name = ("stdlib" if not source_dir else "dir") + "_" + digest
  return PythonSourceConfig(name=name, source_dir=root, validation_percent=validation_percent,
                            version=tfds.core.Version("1.0.0"))


class PythonSource(tfds.core.GeneratorBasedBuilder):
  """Python source files as documents: features `text` and `path`."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = []

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "path": tfds.features.Text()}),
        description="Python source files from a local directory, split by file.",
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    root = self.builder_config.source_dir
    splits = split_files(list_source_files(root), self.builder_config.validation_percent)
    return {name: self._generate_examples(root, files) for name, files in splits.items()}

  def _generate_examples(self, root, files):
    for rel in files:
      with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        yield rel, {"text": f.read(), "path": rel}
