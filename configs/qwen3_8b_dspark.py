"""DSpark against a Qwen3-8B-shaped target: 5 layers, block 7, Markov rank 256 (DeepSpec's shape); bfloat16.

Trains against runs/qwen3_8b/target (import it: python -m specjax.interop import-hf <checkpoint
dir> runs/qwen3_8b) on its regenerated continuations. `target_model` is the target's shape, so
the plan needs no checkpoint:
  python train.py --config=configs/qwen3_8b_dspark.py --config.plan=true \\
      --config.plan_devices=8 --config.device_memory_gib=16
Meshes: 8.2B parameters, 16.4 GB in bf16: more than one v5e chip (16 GiB). v5e-8:
tensor=8 (the default here; 8 KV heads divide). v5p-16 (8 chips of 95 GiB, 2
hosts): --config.mesh_shape.data=2 --config.mesh_shape.tensor=4.
"""

from specjax import scale


def get_config():
  return scale.drafter_config("dspark", "qwen3_8b", tensor=8)
