"""How decoding holds the models' weights (--config.target_weights).

  xla     the checkpoint's arrays, multiplied by XLA's dot (any backend, any mesh)
  kernel  the same values packed as rows for specjax's CPU kernel (specjax/kernels/cpu.py):
          every weight read once per pass however many positions it scores, and every row
          computed alike whatever else shares the pass (one CPU device)
  gguf    for a target imported from a GGUF file: the kernel on the file's own quantized
          blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; other tensors as in `kernel`), one byte per
          code. The checkpoint holds exactly these blocks' dequantized values, so nothing
          changes but the bytes read
  gguf4   gguf with 4-bit codes two to a byte, as the file stores them: the fewest bytes (the
          fastest one-token pass) but more work per weight (a costlier verify pass)
  auto    gguf where it applies, else kernel, on one CPU device with a C++ compiler; else xla

The target and the draft model (another transformer) are packed the same way; other drafters'
weights stay with XLA.
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from specjax.errors import SpecjaxError
from specjax.interop import gguf_blocks
from specjax.kernels import cpu
from specjax.models import weights

MODES = ("auto", "xla", "kernel", "gguf", "gguf4")


def resolve(mode: str, run_dir: str, layout=None) -> str:
  """The mode a run uses: `auto` made concrete, the others checked."""
  if mode not in MODES:
    raise SpecjaxError(f"target_weights must be one of {', '.join(MODES)}, got '{mode}'")
  if mode == "auto":
    if layout is not None or not cpu.available():
      return "xla"
    return "gguf" if gguf_blocks.is_gguf_target(run_dir) else "kernel"
  if mode != "xla" and layout is not None:
    raise SpecjaxError(f"target_weights={mode} runs on one CPU device; use target_weights=xla "
                       "with a mesh")
  if mode != "xla":
    cpu.require()
  if mode.startswith("gguf") and not gguf_blocks.is_gguf_target(run_dir):
    raise SpecjaxError(f"target_weights={mode} needs a target imported from a GGUF file (python "
                       f"-m specjax.interop import-gguf FILE RUN_DIR); {run_dir}'s was not")
  return mode


def prepare(model, run_dir: str, mode: str):
  """A loaded transformer (run_dir.LoadedModel) with its weights held as `mode` says."""
  if mode == "xla":
    return model
  packed = None
  if mode.startswith("gguf"):
    packed = gguf_blocks.packed_weights(run_dir, model, nibbles=mode == "gguf4")
  return dataclasses.replace(model, params=weights.pack_state(model.params, packed=packed))


def prepare_draft(params, mode: str):
  """A drafter's parameters (trained here: float32 or bfloat16) with every projection weight
  packed for the CPU kernel unless `mode` is xla. A dict of states (EAGLE-3's model beside its
  draft vocabulary) has each state packed and its arrays kept."""
  if mode == "xla":
    return params
  if isinstance(params, dict):
    return {k: prepare_draft(v, mode) if isinstance(v, (dict, nnx.State)) else v
            for k, v in params.items()}
  return weights.pack_state(params)
