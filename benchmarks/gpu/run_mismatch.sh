#!/usr/bin/env bash
# The generator/trainer logprob mismatch in bf16 on one GPU, and what each rollout correction does with it
# (docs/algorithms.md: Rollout correction, Mismatch metrics). For each generator and each
# algorithm.loss.rollout_correction, a short GRPO run through run_layouts.sh (the real `forge-exp` entry point) on
# make_model.py's Qwen3-1.7B shape in model.dtype=bfloat16, at the gpu.md batch; then mismatch_table.py's table:
# step 1's mismatch over current-version tokens (the two engines' numerics alone: every step-1 rollout was sampled
# by the weights step 1 starts from, the same rollouts for every mode of a generator), the mismatch over all tokens
# in the later steps (numerics + one version of staleness), and each mode's effect (tokens truncated or dropped,
# mean weight, reward, gradient norm, step time).
#
#   source benchmarks/gpu/install.sh
#   python3 benchmarks/gpu/make_model.py --out /tmp/gpubench      # once per machine
#   bash benchmarks/gpu/run_mismatch.sh                           # every generator x mode, then the table
#   bash benchmarks/gpu/run_mismatch.sh table                     # the table of what has run ($OUT/mismatch.json)
#
# Environment: GENERATORS (default "torch vllm"), MODES ("none tis mis seq_mask"), STEPS (6), DTYPE (bfloat16),
# VLLM_OVERRIDES (overrides for generator=vllm only; default generator.gpu_memory_utilization=0.35: it shares the
# GPU with the trainer), EXTRA (overrides for every run, e.g. algorithm.loss.rollout_cap=3), and run_layouts.sh's
# (BENCH, OUT, PROMPTS, NEW_TOKENS, ...). LAYOUT=cpu runs the same on services=cpu (tests/benchmarks: a tiny shape).
# Each run is TAG=mismatch_<generator>_<mode>: $OUT/<tag>.json, .log, .config.yaml and $BENCH/<tag>/mlflow.db.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export BENCH=${BENCH:-/tmp/gpubench}
export OUT=${OUT:-$BENCH/out}
export STEPS=${STEPS:-6}
LAYOUT=${LAYOUT:-single_gpu}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
read -r -a VLLM_ARGS <<< "${VLLM_OVERRIDES:-generator.gpu_memory_utilization=0.35}"
if [[ ${1:-} != table ]]; then
  failed=0
  for generator in ${GENERATORS:-torch vllm}; do
    only=()
    [[ $generator == vllm ]] && only=("${VLLM_ARGS[@]}")
    for mode in ${MODES:-none tis mis seq_mask}; do
      TAG=mismatch_${generator}_${mode} bash "$HERE/run_layouts.sh" "$LAYOUT" "generator=$generator" \
        "model.dtype=${DTYPE:-bfloat16}" "algorithm.loss.rollout_correction=$mode" "${only[@]}" "${EXTRA_ARGS[@]}" \
        || { echo "mismatch_${generator}_${mode} failed"; failed=1; }
    done
  done
fi
python3 "$HERE/mismatch_table.py" --bench "$BENCH" --out "$OUT"
exit "${failed:-0}"
