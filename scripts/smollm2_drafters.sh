#!/usr/bin/env bash
# Drafters for SmolLM2-135M-Instruct: after scripts/smollm2.sh has imported it into RUN, train
# each drafter of configs/smollm2.py on the target's own answers to instructions made from
# Python sources (the first one generates them into RUN/regenerated/), each for the same
# wall-clock budget, then decode 16 HumanEval and 16 MT-Bench prompts under the chat template
# (greedy and T=1, batch 1, 7 drafts a step, 4 for the 4-head MTP) with every trained drafter beside AR and prompt
# lookup, into RUN/decode/<benchmark>_t<T>.json.
#   bash scripts/smollm2_drafters.sh [run_dir] [methods]
#   (default runs/smollm2 and every method; a rerun skips trained drafters and done decodes;
#   TEMPS="0.0" decodes greedy only)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/smollm2}
METHODS=${2:-dflash,eagle3,dspark,dflash2,mtp_parallel,mtp_sequential,draft}
if [ ! -d "$RUN/target/checkpoints" ]; then
  echo "no SmolLM2 target in $RUN: run scripts/smollm2.sh $RUN first" >&2
  exit 1
fi
for m in ${METHODS//,/ }; do
  python train.py --config=configs/smollm2.py:"$m" --config.run_dir="$RUN"
done
for bench in humaneval mtbench; do
  for t in ${TEMPS:-0.0 1.0}; do
    out="$RUN/decode/${bench}_t${t}.json"
    if [ ! -f "$out" ]; then
      python decode.py --config.run_dir="$RUN" --config.methods="ar,prompt_lookup,$METHODS" \
          --config.prompts="$bench" --config.chat_template=true --config.num_prompts=16 \
          --config.max_new_tokens=128 --config.batch_size=1 --config.block_size=8 \
          --config.num_draft_tokens=7 --config.draft_tokens=mtp_parallel=4,mtp_sequential=4 \
          --config.cache_len=1024 --config.temperature="$t" \
          --config.output_json="$out"
    fi
  done
done
