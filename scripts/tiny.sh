#!/usr/bin/env bash
# The main job on the embedded default: train the tiny target and every drafter into one run
# directory, then compare all methods with decode.py (sampling at T=1, then greedy).
#   bash scripts/tiny.sh [run_dir]        (default runs/tiny; reruns resume / skip done work)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/tiny}
METHODS=ar,prompt_lookup,draft,mtp_parallel,mtp_sequential,eagle3,dflash,dspark,dflash2

python train.py --config=configs/target_tiny.py --config.run_dir="$RUN"
python train.py --config=configs/draft_tiny.py --config.run_dir="$RUN"
python train.py --config=configs/mtp_tiny.py --config.run_dir="$RUN" --config.variant=parallel
python train.py --config=configs/mtp_tiny.py --config.run_dir="$RUN" --config.variant=sequential \
    --config.num_steps=120
python train.py --config=configs/eagle3_tiny.py --config.run_dir="$RUN"
# the three block drafters on equal terms: block 8, decay gamma 4, 200 steps, the same data
BLOCK="--config.block_size=8 --config.gamma=4.0 --config.num_steps=200"
python train.py --config=configs/dflash_tiny.py --config.run_dir="$RUN" $BLOCK
python train.py --config=configs/dspark_tiny.py --config.run_dir="$RUN" $BLOCK
python train.py --config=configs/dflash2_tiny.py --config.run_dir="$RUN" $BLOCK

python decode.py --config.run_dir="$RUN" --config.methods="$METHODS" --config.temperature=1.0
python decode.py --config.run_dir="$RUN" --config.methods="$METHODS" --config.temperature=0.0
