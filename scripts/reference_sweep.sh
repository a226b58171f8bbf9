#!/usr/bin/env bash
# The reference drafters' settings sweep: every variant trains for BUDGET seconds of steps
# (default 120, a quarter of the reference budget) against RUN_DIR's target on its
# regenerated text, scored by teacher-forced tau on the validation split
# (python -m specjax.training.settings_sweep). Tables go to RUN_DIR/sweeps/<model>/sweep.json.
#   bash scripts/reference_sweep.sh [run_dir] [budget_s]   (about 45 minutes, then 3 hours
#   of 8-minute runs: the feature cache per drafter, DFlash's variants with it; resumable)
# Needs RUN_DIR/target and RUN_DIR/regenerated (scripts/reference.sh's first steps).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/reference}
BUDGET=${2:-120}
sweep() { python -m specjax.training.settings_sweep --run_dir="$RUN" --budget_s="$BUDGET" "$@"; }
best() {  # best() MODEL KEY: KEY's value in MODEL's best variant so far at BUDGET seconds
  python -m specjax.training.settings_sweep --config=configs/reference.py:"$1" --run_dir="$RUN" \
    --budget_s="$BUDGET" --best="$2"
}

# DFlash: the learning rate at 16 blocks per sequence, then the number of blocks per sequence
# (more supervision per target pass, but a slower step) at the best rate
sweep --config=configs/reference.py:dflash --grid=learning_rate=1e-3,2e-3,4e-3 --set=num_anchors=16
L=$(best dflash learning_rate)
sweep --config=configs/reference.py:dflash --grid=num_anchors=2,4,8,16,32,64 --set=learning_rate="$L"
A=$(best dflash num_anchors)
# which target layers DFlash reads: the default spreads 3 over 1..L-1 (the target has 4);
# does the last layer's residual stream (the one the LM head reads) help?
sweep --config=configs/reference.py:dflash --grid="feature_layers=(1,2,3),(2,3,4),(1,2,3,4),(4,)" \
  --set=learning_rate="$L" --set=num_anchors="$A"
# DSpark and DFlash 2 train the same backbone: the learning rate at 16 blocks, then DFlash's
# best block count against 16
for m in dspark dflash2; do
  sweep --config=configs/reference.py:$m --grid=learning_rate=2e-3,4e-3 --set=num_anchors=16
  LM=$(best $m learning_rate)  # its own line: set -e stops here if no variant sets it
  sweep --config=configs/reference.py:$m --grid=num_anchors=16,"$A" --set=learning_rate="$LM"
done
# the token drafters: the learning rate
sweep --config=configs/reference.py:draft --grid=learning_rate=1e-3,3e-3,1e-2,3e-2
sweep --config=configs/reference.py:mtp_parallel --grid=learning_rate=1e-3,3e-3,1e-2,3e-2
sweep --config=configs/reference.py:mtp_sequential --grid=learning_rate=1e-3,3e-3,1e-2
# the feature cache, at the full 8-minute budget (its one-time build, 70-80 s, would be most
# of a 2-minute one), with the settings chosen above (configs/reference.py: SWEPT)
for m in draft mtp_parallel mtp_sequential dflash dspark dflash2; do
  sweep --config=configs/reference.py:$m --grid=feature_cache=False,True --budget_s=480
done
# with the cache a block drafter's step loses its fixed part (the target's pass), so more
# blocks per sequence cost less than they did above: DFlash's block count again, at 8 minutes
sweep --config=configs/reference.py:dflash --grid=num_anchors=8,16 --budget_s=480
# three times the regenerated text (its cache's build comes out of the 8 minutes), and half the
# rows per step for twice the steps (16 validation batches of 8: the same 128 rows)
sweep --config=configs/reference.py:dflash --grid=regen.num_sequences=12288 --budget_s=480
for m in dflash dspark draft; do
  sweep --config=configs/reference.py:$m --grid=batch_size=8 --set=eval_batches=16 --budget_s=480
done
for m in dflash dspark dflash2 draft mtp_parallel mtp_sequential; do
  echo "== $m"
  python -m specjax.training.settings_sweep --config=configs/reference.py:$m --run_dir="$RUN" --show
done
