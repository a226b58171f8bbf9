"""A Llama-3.1-8B-shaped target (the released config.json's shape), bfloat16 parameters and
activations.

8.0B parameters, 16.1 GB in bf16. v5e-8: tensor=8 (the default here). v5p-16 (8 chips, 2
hosts): --config.mesh_shape.data=2 --config.mesh_shape.tensor=4.

Check the plan first (allocates nothing):
  python train.py --config=configs/llama3_8b.py --config.plan=true --config.plan_devices=8 \\
      --config.device_memory_gib=16
For real work import the released weights instead of training: python -m specjax.interop
import-hf <checkpoint dir> runs/llama3_8b (writes runs/llama3_8b/target and its tokenizer).
"""

from specjax import scale


def get_config():
  return scale.target_config("llama3_8b", tensor=8)
