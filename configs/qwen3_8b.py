"""A Qwen3-8B-shaped target (the released config.json's shape), bfloat16 parameters and
activations.

8.2B parameters, 16.4 GB in bf16: more than one v5e chip (16 GiB). v5e-8: tensor=8 (the
default here; 8 KV heads divide). v5p-16 (8 chips of 95 GiB, 2 hosts):
--config.mesh_shape.data=2 --config.mesh_shape.tensor=4.

Check the plan first (allocates nothing):
  python train.py --config=configs/qwen3_8b.py --config.plan=true --config.plan_devices=8 \\
      --config.device_memory_gib=16
For real work import the released weights instead of training: python -m specjax.interop
import-hf <checkpoint dir> runs/qwen3_8b (writes runs/qwen3_8b/target and its tokenizer).
"""

from specjax import scale


def get_config():
  return scale.target_config("qwen3_8b", tensor=8)
