"""DFlash against a Qwen3-0.6B-shaped target: 5 layers, block 16 (Z Lab's released drafters); bfloat16.

Trains against runs/qwen3_0_6b/target (import it: python -m specjax.interop import-hf <checkpoint
dir> runs/qwen3_0_6b) on its regenerated continuations. `target_model` is the target's shape, so
the plan needs no checkpoint:
  python train.py --config=configs/qwen3_0_6b_dflash.py --config.plan=true \\
      --config.plan_devices=8 --config.device_memory_gib=16
Meshes: 0.6B parameters, 1.2 GB in bf16: one v5e chip holds it; v5e-8:
--config.mesh_shape.data=8 (tensor=1). v5p-16 (8 chips, 2 hosts): data=8.
"""

from specjax import scale


def get_config():
  return scale.drafter_config("dflash", "qwen3_0_6b", tensor=1)
