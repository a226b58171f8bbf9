#!/usr/bin/env bash
# The reference experiment: a target trained for ~45 minutes, every drafter for the same
# wall-clock budget against it, then the side-by-side tables, the K and batch sweeps and the
# report (RUN_DIR/report/report.md). About 2.5 hours on 2 CPU cores.
#   bash scripts/reference.sh [run_dir]     (default runs/reference)
# DRAFTERS="eagle3 dflash" (spaces or commas) trains and evaluates only those (beside AR and prompt lookup);
# SWEEPS=0 skips the K and batch sweeps.
# Resumable: a killed run picks up from the last checkpoint, and finished training or
# evaluation steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/reference}
ALL="draft mtp_parallel mtp_sequential eagle3 dflash dspark dflash2"
DRAFTERS=${DRAFTERS:-$ALL}
DRAFTERS=${DRAFTERS//,/ }
for m in $DRAFTERS; do  # before the 45-minute target, not after it
  case " $ALL " in *" $m "*) ;; *)
    echo "scripts/reference.sh: DRAFTERS has '$m'; pick from: $ALL" >&2; exit 1;; esac
done
SWEEPS=${SWEEPS:-1}
METHODS=ar,prompt_lookup,$(echo $DRAFTERS | tr ' ' ',')

python train.py --config=configs/target_reference.py --config.run_dir="$RUN"
for m in $DRAFTERS; do
  python train.py --config=configs/reference.py:$m --config.run_dir="$RUN"
done

# held-out prompts, batch 1 (the single-stream regime speculative decoding is for)
EVAL="--config.run_dir=$RUN --config.methods=$METHODS --config.batch_size=1 --config.num_prompts=32"
for t in 1 0; do
  [ -f "$RUN/decode/t$t.json" ] || python decode.py $EVAL --config.temperature=$t.0
done
if [ "$SWEEPS" != 0 ]; then
  [ -f "$RUN/decode/sweep_drafts_t0.json" ] || python -m specjax.sweep --run_dir="$RUN" --kind=drafts
  [ -f "$RUN/decode/sweep_batch_t0.json" ] || python -m specjax.sweep --run_dir="$RUN" --kind=batch
fi
python -m specjax.report "$RUN"
