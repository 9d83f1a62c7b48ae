#!/usr/bin/env bash
# LoRA GRPO on one GPU (docs/models_and_data.md, LoRA): the real `forge-exp` entry point through run_layouts.sh, on
# make_model.py's random-weight shapes, services=single_gpu (trainer and generator in one process; with LoRA the
# reference is the trainer's base with its adapters off), GRPO's beta 0.04, rank 32 alpha 64 at lr 1e-5.
#
#   source benchmarks/gpu/install.sh
#   python3 benchmarks/gpu/make_model.py --out /tmp/gpubench --shape 8b   # once per machine: the Qwen3-8B shape
#   python3 benchmarks/gpu/make_model.py --out /tmp/gpubench              # and the Qwen3-1.7B shape
#   bash benchmarks/gpu/run_lora.sh 8b      # Qwen3-8B, LoRA: STEPS_8B steps (default 4; means after step 2)
#   bash benchmarks/gpu/run_lora.sh 1_7b    # Qwen3-1.7B, LoRA then full fine-tuning, at the gpu.md batch
#   bash benchmarks/gpu/run_lora.sh table   # the side-by-side table of what has run ($OUT/lora.json)
#
# Each run writes $OUT/<tag>.json, .log and .config.yaml (run_layouts.sh); after the runs, lora_table.py prints the
# table of every run found. LAYOUT=cpu runs the same commands on the CPU (tests/benchmarks: a tiny shape).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export BENCH=${BENCH:-/tmp/gpubench}
export OUT=${OUT:-$BENCH/out}
LAYOUT=${LAYOUT:-single_gpu}
LORA=(model.lora.rank=32 model.lora.alpha=64 algorithm.lr=1e-5)
case ${1:-} in
  8b) MODEL=qwen3_8b TAG=lora_8b STEPS=${STEPS_8B:-4} bash "$HERE/run_layouts.sh" "$LAYOUT" "${LORA[@]}" ;;
  1_7b)
    MODEL=qwen3_1_7b TAG=lora_1_7b bash "$HERE/run_layouts.sh" "$LAYOUT" "${LORA[@]}"
    MODEL=qwen3_1_7b TAG=full_1_7b bash "$HERE/run_layouts.sh" "$LAYOUT"
    ;;
  table) ;;
  *) echo "usage: bash benchmarks/gpu/run_lora.sh 8b | 1_7b | table" >&2; exit 2 ;;
esac
python3 "$HERE/lora_table.py" "$OUT"
