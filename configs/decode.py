"""Evaluation: every listed method on the same held-out prompts, side by side.

  python decode.py --config=configs/decode.py --config.run_dir=runs/tiny \\
      --config.methods=ar,prompt_lookup,draft --config.temperature=1.0

Writes run_dir/decode/t<temperature>.json (or --config.output_json), a PNG of per-position
acceptance beside it, and prints one table.
"""

import ml_collections

from specjax import methods


def get_config():
  c = ml_collections.ConfigDict()
  c.run_dir = "runs/tiny"
  c.methods = "ar,prompt_lookup,draft"  # AR always runs first: it is the baseline
  # humaneval (164 problems) | mtbench (80 first turns) | mtbench_turn2 (80 second turns, after
  # the target's greedy first answers; needs chat_template), read from their pip packages
  # (specjax/data/benchmarks.py says how each is phrased); else a .txt (one per line) or .jsonl
  # ("prompt") file; empty = the bundled held-out set.
  c.prompts = ""
  c.num_prompts = 0  # the first N prompts; 0 = all
  # Render each prompt as a user message with the target's own chat template (as transformers'
  # apply_chat_template(..., add_generation_prompt=True)); false = the raw prompt text.
  c.chat_template = False
  c.max_new_tokens = 64
  c.temperature = 0.0  # 0 = greedy
  c.top_k = 0
  c.top_p = 1.0
  c.batch_size = 4
  c.num_draft_tokens = 4  # K for draft-model, prompt-lookup and MTP drafters
  c.block_size = 8  # block drafters (B - 1 drafts per step)
  # per-method K overriding num_draft_tokens, e.g. "mtp_parallel=4,mtp_sequential=4"
  c.draft_tokens = ""
  # Each method's own options, one subtree per method that has any (specjax/methods/builtin.py
  # says what each means), e.g. --config.dspark.schedule=load_aware:
  #   prompt_lookup.max_ngram (3); dflash.proposal, dflash2.proposal, mtp_parallel.proposal
  #   ("sample" | "argmax" at T > 0); dflash2.selector (True); dspark.schedule ("fixed" |
  #   "threshold" | "load_aware") and dspark.threshold (0.5)
  c.update(methods.option_configs())
  # How the target (and a draft model) hold their weights: auto | xla | kernel | gguf
  # (specjax/decode_weights.py). auto = specjax's CPU kernel on one CPU device (the GGUF file's
  # own quantized blocks for a target imported from one), else XLA's dot.
  c.target_weights = "auto"
  c.cache_len = 512  # positions per row: prompt + max_new_tokens + K + 1 must fit
  c.seed = 0
  # Decode over a device mesh, with training's logical-axis rules (empty = specjax.sharding.
  # DEFAULT_RULES): rows over data, heads / MLP / vocabulary over tensor. Empty = one device.
  # e.g. --config.mesh_shape.data=2 --config.mesh_shape.tensor=4 (8 devices).
  c.mesh_shape = ml_collections.ConfigDict({"data": 1, "tensor": 1})
  c.logical_axis_rules = ()
  # --config.plan=true: print per-device parameter, KV cache and activation bytes for these
  # methods at batch_size and cache_len on the mesh (plan_devices devices, 0 = this machine's)
  # and whether they fit device_memory_gib; allocates nothing. Shapes come from run_dir, or
  # from target_config / drafter_config (training config files) when set.
  c.plan = False
  c.plan_devices = 0
  c.device_memory_gib = 0.0
  c.target_config = ""
  c.drafter_config = ""
  c.timing_repeats = 2  # timed passes over all prompts per method; the fastest is reported
  c.output_json = ""  # empty = run_dir/decode/t<temperature>.json
  c.plot = True
  c.measure_costs = True  # time T_ar, T_verify(K+1), T_draft(K) for predicted speedup
  return c
