"""specjax: speculative decoding research in JAX."""

from flax import nnx as _nnx

# Parameters carry logical axis names as metadata; placement is decided once, by
# `specjax.sharding`, when state is created or restored under `jax.jit`.
_nnx.use_eager_sharding(False)
