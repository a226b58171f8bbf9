"""DFlash against a Llama-3.1-8B-shaped target: 5 layers, block 16 (Z Lab's released drafters); bfloat16.

Trains against runs/llama3_8b/target (import it: python -m specjax.interop import-hf <checkpoint
dir> runs/llama3_8b) on its regenerated continuations. `target_model` is the target's shape, so
the plan needs no checkpoint:
  python train.py --config=configs/llama3_8b_dflash.py --config.plan=true \\
      --config.plan_devices=8 --config.device_memory_gib=16
Meshes: 8.0B parameters, 16.1 GB in bf16. v5e-8: tensor=8 (the default here). v5p-16 (8
chips, 2 hosts): --config.mesh_shape.data=2 --config.mesh_shape.tensor=4.
"""

from specjax import scale


def get_config():
  return scale.drafter_config("dflash", "llama3_8b", tensor=8)
