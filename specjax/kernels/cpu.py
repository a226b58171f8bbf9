"""specjax's CPU decode kernels (cpu_*.cc): built once with the host's C++ compiler, then called
from jitted code through XLA's FFI.

  y_MxN = matmul(x_MxK, packed_weight)   # f32, bf16, or llama.cpp-style blocks (8 or 4 bits)
  out_BxTxNxH = attention(q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, limit_BxT)   # over a KV cache

The library is compiled with -O3 -march=native into a cache folder (SPECJAX_CACHE, else
~/.cache/specjax) keyed by the source, the flags, jaxlib's version and this CPU's feature
flags, so a second process loads it in milliseconds. Without a compiler or on another backend
`available()` is False and callers keep XLA's dot.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from specjax.errors import SpecjaxError

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(HERE, f) for f in ("cpu_matmul.cc", "cpu_attention.cc"))
HEADERS = (os.path.join(HERE, "cpu_common.h"),)
# SPECJAX_KERNEL_MARCH: the -march to build for (native: this CPU; e.g. x86-64-v2 builds the
# portable path, which the tests check against the vectorized one)
MARCH = os.environ.get("SPECJAX_KERNEL_MARCH", "native")
FLAGS = ("-O3", f"-march={MARCH}", "-std=c++17", "-shared", "-fPIC", "-w",
         *os.environ.get("SPECJAX_KERNEL_FLAGS", "").split())
# weight format -> (FFI target, dtype of the stored data)
FORMATS = {
    "f32": ("specjax_matmul_f32", jnp.float32),
    "bf16": ("specjax_matmul_bf16", jnp.bfloat16),
    "q8": ("specjax_matmul_q8", jnp.int8),
    "q4": ("specjax_matmul_q4", jnp.uint8),
}
ATTENTION = "specjax_attention"
GROUP = 32  # outputs per panel of the weight layout; inputs per (scale, offset) block


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))), "")
  except OSError:
    return platform.processor()


def _library_path() -> str:
  sources = []
  for path in SOURCES + HEADERS:
    with open(path, "rb") as f:
      sources.append(f.read())
  key = hashlib.sha256(b"\0".join(sources + [" ".join(FLAGS).encode(), jax.__version__.encode(),
                                             platform.machine().encode(),
                                             _cpu_flags().encode()]))
  root = os.environ.get("SPECJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "specjax")
  return os.path.join(root, "kernels", f"cpu_kernels-{key.hexdigest()[:16]}.so")


def _compile(path: str):
  compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
  if compiler is None:
    raise RuntimeError("no C++ compiler (set CXX or install g++)")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
  os.close(fd)
  cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *SOURCES, "-o", tmp]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode != 0:
    os.unlink(tmp)
    lines = [l for l in done.stderr.splitlines() if "error" in l] or done.stderr.splitlines()
    raise RuntimeError(f"compiling the kernels ({os.path.basename(HERE)}/cpu_*.cc) failed: "
                       f"{lines[0] if lines else done.returncode}")
  os.replace(tmp, path)  # atomic: a concurrent process sees the whole library or none


@functools.cache
def _load() -> str | None:
  """Builds (first time) and registers the kernel; returns why it is unavailable, or None."""
  if jax.default_backend() != "cpu":
    return f"the default backend is {jax.default_backend()}, not cpu"
  try:
    path = _library_path()
    if not os.path.exists(path):
      _compile(path)
    lib = ctypes.cdll.LoadLibrary(path)
    for target in [t for t, _ in FORMATS.values()] + [ATTENTION]:
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)),
                                  platform="cpu")
  except (OSError, RuntimeError, AttributeError) as e:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
  return None


def available() -> bool:
  return _load() is None


def require():
  reason = _load()
  if reason is not None:
    raise SpecjaxError(f"the CPU decode kernel is unavailable ({reason}); decode with "
                       "--config.target_weights=xla")


def matmul(x_MxK, w):
  """x [M, K] float32 times a PackedWeight (specjax/models/weights.py) -> [M, N] float32."""
  require()
  target, dtype = FORMATS[w.fmt]
  if w.data.dtype != dtype:
    raise SpecjaxError(f"{w.fmt} weights must be {jnp.dtype(dtype).name}, got {w.data.dtype}")
  scales = jnp.zeros((1,), jnp.float32) if w.scales is None else w.scales
  out = jax.ShapeDtypeStruct((x_MxK.shape[0], w.data.shape[0] * GROUP), jnp.float32)
  return jax.ffi.ffi_call(target, out)(x_MxK.astype(jnp.float32), w.data, scales)


def attention(q_BxTxNxH, k_BxSxKVxH, v_BxSxKVxH, limit_BxT):
  """Softmax attention of T new positions per row over a KV cache: query (b, t) sees the slots
  s <= limit[b, t] of its KV head (query head n uses KV head n // (N / KV)), and only those
  are read. float32; head size a multiple of 16."""
  require()
  f32 = jnp.float32
  out = jax.ShapeDtypeStruct(q_BxTxNxH.shape, f32)
  return jax.ffi.ffi_call(ATTENTION, out)(q_BxTxNxH.astype(f32), k_BxSxKVxH.astype(f32),
                                          v_BxSxKVxH.astype(f32), limit_BxT.astype(jnp.int32))
