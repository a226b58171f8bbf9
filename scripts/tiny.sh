#!/usr/bin/env bash
# The main job on the embedded default: train the tiny target and every drafter into one run
# directory, then compare all methods with decode.py (sampling at T=1, then greedy).
#   bash scripts/tiny.sh [run_dir]        (default runs/tiny; reruns resume / skip done work)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/tiny}
METHODS=ar,prompt_lookup,draft,mtp_parallel,mtp_sequential,dflash,dspark

python train.py --config=configs/target_tiny.py --config.run_dir="$RUN"
python train.py --config=configs/draft_tiny.py --config.run_dir="$RUN"
python train.py --config=configs/mtp_tiny.py --config.run_dir="$RUN" --config.variant=parallel
python train.py --config=configs/mtp_tiny.py --config.run_dir="$RUN" --config.variant=sequential \
    --config.num_steps=120
python train.py --config=configs/dflash_tiny.py --config.run_dir="$RUN"
python train.py --config=configs/dspark_tiny.py --config.run_dir="$RUN"

python decode.py --config.run_dir="$RUN" --config.methods="$METHODS" --config.temperature=1.0
python decode.py --config.run_dir="$RUN" --config.methods="$METHODS" --config.temperature=0.0
