"""A Qwen3-0.6B-shaped target (the released config.json's shape), bfloat16 parameters and
activations.

0.6B parameters, 1.2 GB in bf16: one v5e chip holds it; v5e-8: --config.mesh_shape.data=8
(tensor=1). v5p-16 (8 chips, 2 hosts): data=8.

Check the plan first (allocates nothing):
  python train.py --config=configs/qwen3_0_6b.py --config.plan=true --config.plan_devices=8 \\
      --config.device_memory_gib=16
For real work import the released weights instead of training: python -m specjax.interop
import-hf <checkpoint dir> runs/qwen3_0_6b (writes runs/qwen3_0_6b/target and its tokenizer).
"""

from specjax import scale


def get_config():
  return scale.target_config("qwen3_0_6b", tensor=1)
