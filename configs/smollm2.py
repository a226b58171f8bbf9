"""Drafters for SmolLM2-135M-Instruct (imported by scripts/smollm2.sh into runs/smollm2), each
trained for the same wall-clock budget on the same data: the target's own greedy answers to
chat instructions made from Python sources (specjax/data/instructions.py: disjoint from
HumanEval and MT-Bench), generated once into runs/smollm2/regenerated/.

  python train.py --config=configs/smollm2.py:eagle3 --config.run_dir=runs/smollm2

One of: draft, mtp_parallel, mtp_sequential, dflash, dspark, dflash2, eagle3. Each starts from
its tiny config (configs/*_tiny.py) with the settings below. Decode them with decode.py
--config.prompts=humaneval|mtbench --config.chat_template=true (scripts/smollm2.sh).
"""

import os

import ml_collections

from specjax import config_base

HERE = os.path.dirname(os.path.abspath(__file__))
BUDGET_S = 8 * 60.0  # per drafter: its training steps (data preparation is shared)
TARGET_LAYERS = 30
DRAFT_LAYERS = {"dflash": 3, "dspark": 3, "dflash2": 3}

# Each drafter's own settings. Block drafters: block 8 (7 drafts: an 8-row verify pass is the
# widest this CPU's kernel runs in one sweep over the weights), gamma 4, 4 blocks per row (the
# reference sweep's best at a fixed budget), target layers by Z Lab's rule (one per drafter
# layer, spread over 1..L-3: [1, 14, 27]), mask slots read token 0's embedding (Z Lab's format
# needs a token). EAGLE-3: one layer, speculators' layers [2, 15, 27], a draft vocabulary of
# the 8,192 most frequent answer tokens (the 49,152-row head is most of a step otherwise).
SETTINGS = {
    "draft": {"learning_rate": 3e-3},
    "mtp_parallel": {"learning_rate": 3e-3},
    "mtp_sequential": {"learning_rate": 3e-3},
    "dflash": {"learning_rate": 2e-3, "mask_token_id": 0},
    "dspark": {"learning_rate": 2e-3, "mask_token_id": 0},
    "dflash2": {"learning_rate": 2e-3, "mask_token_id": 0},
    "eagle3": {"learning_rate": 3e-3, "draft_vocab_size": 8192, "batch_size": 4},
}
METHODS = tuple(SETTINGS)


def get_config(method: str = "dflash"):
  if method not in METHODS:
    raise ValueError(f"configs/smollm2.py:{method}: pick one of {', '.join(METHODS)}")
  c = config_base.tiny_drafter_config(HERE, method)
  c.run_dir = "runs/smollm2"
  c.time_budget_s = BUDGET_S
  c.seq_len = 384
  c.batch_size = 8
  c.log_every, c.eval_every, c.save_every, c.eval_batches = 25, 200, 200, 4
  # the target's features over the rows, computed once per set of layers and stored in
  # runs/smollm2/feature_cache/: shared by the drafters that read the same layers, so like the
  # rows themselves it is data preparation, out of every drafter's budget
  c.feature_cache = True
  c.feature_cache_store = True
  # the target's answers: 512 training and 32 validation instructions from the standard
  # library's files (split by file), each <= 192 tokens under the chat template, answered in
  # <= 192 tokens with the fastest weights this machine has (decode.py's target_weights=auto)
  c.regen = ml_collections.ConfigDict(
      {"num_sequences": 512, "num_validation": 32, "prompt_len": 192, "new_tokens": 192,
       "batch_size": 32, "prompts": "instructions", "weights": "auto"})
  if method in DRAFT_LAYERS:
    c.num_layers = c.num_feature_layers = DRAFT_LAYERS[method]
    c.block_size, c.gamma, c.num_anchors = 8, 4.0, 4
    # Qwen3 decoder layers (q/k norms) whatever the target, as Z Lab's and speculators' DFlash
    # define them: the trained drafters then load in both formats' stock code
    c.layer_shape = ml_collections.ConfigDict({**c.get("layer_shape", {}), "qk_norm": True})
  else:
    c.train_on = "regenerated"
  if method == "draft":
    # SmolLM2 truncated to its first two layers (its shape, embedding, final norm and layers
    # 0-1: the early-exit start of self-speculative drafts), then distilled on the answers.
    # Measured on 8 validation rows before training: top-1 agreement with the target 2.7%
    # (layers [0, 29]: 0%; [28, 29]: 0.6%).
    c.init_from_target = (0, 1)
  c.update(SETTINGS[method])
  return c
