"""TFDS builder over local trees of Python source files (by default the running interpreter's
standard library), so that the default pipeline needs no network.

`source_dir` names one tree or several, comma-separated: a directory, `stdlib` (this
interpreter's standard library) or `pkg:NAME` (the installed package NAME's directory, found
without importing it). With the versions pinned in requirements.txt, `stdlib,pkg:jax,...` is
the same text on every machine with the same Python.

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


def resolve_roots(source_dir: str) -> list[str]:
  """Absolute directories for a source_dir spec (see the module docstring)."""
  import importlib.util

  from specjax.errors import SpecjaxError
  roots = []
  for entry in [e.strip() for e in (source_dir or "stdlib").split(",") if e.strip()]:
    if entry == "stdlib":
      roots.append(stdlib_dir())
    elif entry.startswith("pkg:"):
      spec = importlib.util.find_spec(entry[4:])
      if spec is None or not spec.submodule_search_locations:
        raise SpecjaxError(f"data.source_dir names {entry}, but no installed package "
                           f"'{entry[4:]}' was found; pip install it or drop it")
      roots.append(list(spec.submodule_search_locations)[0])
    else:
      path = os.path.abspath(os.path.expanduser(entry))
      if not os.path.isdir(path):
        raise SpecjaxError(f"data.source_dir {entry} is not a directory")
      roots.append(path)
  return [os.path.abspath(r) for r in roots]


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
  """A config whose name identifies the source trees, so different trees never share files."""
  roots = resolve_roots(source_dir)
  joined = ",".join(roots)
  key = joined if len(roots) > 1 else roots[0]  # one tree: the name earlier versions gave it
  digest = hashlib.md5(f"{key}|{validation_percent}".encode()).hexdigest()[:10]
  name = ("stdlib" if roots == [os.path.abspath(stdlib_dir())] else "dir") + "_" + digest
  return PythonSourceConfig(name=name, source_dir=joined, validation_percent=validation_percent,
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
    roots = self.builder_config.source_dir.split(",")
    # several trees: each file is keyed by its tree's name too (two trees may share a path)
    label = lambda root: os.path.basename(root) + "/" if len(roots) > 1 else ""
    where = {label(r) + rel: os.path.join(r, rel) for r in roots for rel in list_source_files(r)}
    splits = split_files(sorted(where), self.builder_config.validation_percent)
    return {name: self._generate_examples(where, files) for name, files in splits.items()}

  def _generate_examples(self, where, files):
    for rel in files:
      with open(where[rel], encoding="utf-8", errors="replace") as f:
        yield rel, {"text": f.read(), "path": rel}
