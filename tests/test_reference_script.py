"""scripts/reference.sh: its drafter list is configs/reference.py's, and a bad DRAFTERS entry
is refused in one line before anything trains."""

import importlib.util
import os
import re
import subprocess

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "reference.sh")


def test_default_drafters_are_the_reference_configs():
  spec = importlib.util.spec_from_file_location(
      "reference_config", os.path.join(ROOT, "configs", "reference.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  listed = re.search(r'^ALL="([^"]*)"', open(SCRIPT).read(), re.M).group(1).split()
  assert sorted(listed) == sorted(mod.METHODS)


def test_bad_drafter_is_refused_before_training(tmp_path):
  run = tmp_path / "run"
  out = subprocess.run(["bash", SCRIPT, str(run)], env={**os.environ, "DRAFTERS": "eagle3,dflsh"},
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 1
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "'dflsh'" in lines[0] and "dflash" in lines[0]
  assert not run.exists()  # nothing trained, no folder made
