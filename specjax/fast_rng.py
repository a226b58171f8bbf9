"""Random draws inside the decode loop as one fused kernel each on CPU.

jax lowers its threefry hash for XLA:CPU as a rolled `while` loop of 5 iterations (it keeps
compile times short). Inside a decode loop that runs every step, each draw (a key split, the
uniforms of verification, the Gumbel noise of a categorical) then costs a loop of ~16 small
kernels times 5: a sampled DFlash step launched 795 kernels where the greedy one launches
316 (`bench/loop_kernels.py`). jax's own unrolled lowering of the same function, which it uses
on every other platform, is elementwise and fuses into one kernel: the same bits, a faster
compile, and about half the kernels per sampled step.

`use_unrolled_threefry()` registers that lowering for CPU. It is process-wide and changes no
random stream, so it is applied when this module is imported (by `specjax.sampling`, which every
sampler user imports). It reaches into jax internals: if they move, it does nothing and the
rolled loop stays (slower, identical results).
"""

from __future__ import annotations

_applied = False


def use_unrolled_threefry() -> bool:
  """Registers jax's unrolled threefry lowering for CPU; True when it is in place."""
  global _applied
  if not _applied:
    try:
      from jax._src.interpreters import mlir
      from jax._src.random import threefry2x32 as threefry
      mlir.register_lowering(threefry.threefry2x32_p, threefry._threefry2x32_lowering_rule,
                             platform="cpu")
      _applied = True
    except (ImportError, AttributeError):  # a jax without these internals: keep its default
      pass
  return _applied


use_unrolled_threefry()
