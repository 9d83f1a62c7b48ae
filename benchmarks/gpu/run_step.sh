#!/usr/bin/env bash
# The one-GPU GRPO step (gpu.md's shape: Qwen3-1.7B, 4 prompts x 8, 256 + 512 tokens, beta 0.04, services=single_gpu,
# the native generator), trainer=titan, in variants side by side in one call: each a fresh `forge-exp` run through
# run_layouts.sh (STEPS steps, means after step 2), then step_table.py's table and $OUT/steps.json.
#
#   source benchmarks/gpu/install.sh && python3 benchmarks/gpu/make_model.py --out /tmp/gpubench
#   bash benchmarks/gpu/run_step.sh                  # every variant below
#   bash benchmarks/gpu/run_step.sh ga1 ga1_seq      # some of them
#   bash benchmarks/gpu/run_step.sh ga1 ga1          # one twice (the second run's outputs named ga1_2)
#   BASE_SITE=/tmp/site_base bash benchmarks/gpu/run_step.sh base_ga4   # a variant on another install of forge_exp
#
# Variants (tag: overrides after trainer=titan, whose per-block compile, and shared prompts with flex attention,
# are on for CUDA unless set):
#   ga4          algorithm.grad_accum=4 (run_layouts.sh's batch split; the step as measured before)
#   ga1          algorithm.grad_accum=1 (the batch in one forward, as the trainer alone ran at 63% MFU)
#   ga1_eager    + trainer.compile=false (does compile pay inside the step?)
#   ga1_seq      + algorithm.max_policy_age=0: rollouts and training take turns (on-policy), no overlap
#   ga1_lowprio  + generator.high_priority=false: the generator's decode on a normal-priority stream
#   ga1_age2     + algorithm.max_policy_age=2: up to three batches generate at once (samples up to 2 versions old)
#   hf_ga4       trainer=hf (transformers), grad_accum 4
#   ga1_nolookahead  + generator.lookahead=false: the host reads each decode chunk back before queuing the next
#   ga1_sync8    + generator.sync_every=8: decode chunks of 8 steps (16 on GPU by default): a new batch and new
#                weights wait for less of a chunk in flight
#   ga1_sync4    + generator.sync_every=4
#   ga1_copies   + generator.share_prompt_kv=false: each of a prompt's samples reads its own copy of the prompt's K/V
#   ga1_service  + trainer.hosts_reference=false: the reference model a transformers service beside the trainer
#   ga1_neither  + both of the above (the defaults before 8895189 and 1e64657 were flipped)
#   ga1_age2_neither ga1_age2 + both of the above
#   ga1_share    + trainer.share_prompts=true trainer.attention=flex: a group's prompt runs once through the
#                trainer and the hosted reference (docs/titan.md). What titan's null settings pick on CUDA: ga1 runs
#                the same since the default changed (gpu.md)
#   ga1_noshare  + trainer.share_prompts=false: each row its own sequence, SDPA (the default before)
#   ga1_flex     + trainer.share_prompts=false trainer.attention=flex (ga1_share's attention without the sharing)
#   ga1_share_sdpa  + trainer.share_prompts=true with SDPA (a dense mask: every block computed; if flex fails)
#   ga1_age2_share  ga1_share at algorithm.max_policy_age=2
#   ga1_vllm     ga1 with generator=vllm (vLLM 0.26 in a process of its own, 30% of the GPU, an 8 GiB KV cache)
#   ga1_waves    + algorithm.rollout_waves=true: the two batches of a cycle begin together once both earlier ones
#                have trained, so their decode and the two training steps take turns on the GPU (samples 0 or 1
#                version old instead of 1)
#   ga1_waves_nogather  ga1_waves + generator.gather_ms=0: the wave's second batch joins a decode chunk later
#   ga1_768, ga1_waves_768  ga1, ga1_waves + dataset.max_prompt_tokens=256: the prompts' own length, so the
#                generator's max_len is 768 (generation.py's) instead of 1024
#   base_ga4     ga4 with trainer.compile=true, run by the forge_exp installed at $BASE_SITE (an earlier commit,
#                A/B in one call; before this change compile was off unless set)
#   base_ga1     ga1, run by the forge_exp installed at $BASE_SITE
#   base_ga1_waves  ga1_waves, the same way
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export BENCH=${BENCH:-/tmp/gpubench}
export OUT=${OUT:-$BENCH/out}
export STEPS=${STEPS:-8}
TITAN=(trainer=titan)
declare -A VARIANTS=(
  [ga4]="${TITAN[*]} algorithm.grad_accum=4"
  [ga1]="${TITAN[*]} algorithm.grad_accum=1"
  [ga1_eager]="${TITAN[*]} algorithm.grad_accum=1 trainer.compile=false"
  [ga1_seq]="${TITAN[*]} algorithm.grad_accum=1 algorithm.max_policy_age=0"
  [ga1_lowprio]="${TITAN[*]} algorithm.grad_accum=1 generator.high_priority=false"
  [ga1_age2]="${TITAN[*]} algorithm.grad_accum=1 algorithm.max_policy_age=2"
  [hf_ga4]="trainer=hf algorithm.grad_accum=4"
  [ga1_nolookahead]="${TITAN[*]} algorithm.grad_accum=1 generator.lookahead=false"
  [ga1_sync8]="${TITAN[*]} algorithm.grad_accum=1 generator.sync_every=8"
  [ga1_sync4]="${TITAN[*]} algorithm.grad_accum=1 generator.sync_every=4"
  [ga1_copies]="${TITAN[*]} algorithm.grad_accum=1 generator.share_prompt_kv=false"
  [ga1_service]="${TITAN[*]} algorithm.grad_accum=1 trainer.hosts_reference=false"
  [ga1_share]="${TITAN[*]} algorithm.grad_accum=1 trainer.share_prompts=true trainer.attention=flex"
  [ga1_noshare]="${TITAN[*]} algorithm.grad_accum=1 trainer.share_prompts=false"
  [ga1_flex]="${TITAN[*]} algorithm.grad_accum=1 trainer.share_prompts=false trainer.attention=flex"
  [ga1_share_sdpa]="${TITAN[*]} algorithm.grad_accum=1 trainer.share_prompts=true trainer.attention=sdpa"
  [ga1_age2_share]="${TITAN[*]} algorithm.grad_accum=1 algorithm.max_policy_age=2 trainer.share_prompts=true trainer.attention=flex"
  [ga1_neither]="${TITAN[*]} algorithm.grad_accum=1 generator.share_prompt_kv=false trainer.hosts_reference=false"
  [ga1_age2_neither]="${TITAN[*]} algorithm.grad_accum=1 algorithm.max_policy_age=2 generator.share_prompt_kv=false trainer.hosts_reference=false"
  [ga1_vllm]="${TITAN[*]} algorithm.grad_accum=1 generator=vllm generator.gpu_memory_utilization=0.3 generator.kv_cache_gib=8"
  [ga1_waves]="${TITAN[*]} algorithm.grad_accum=1 algorithm.rollout_waves=true"
  [ga1_waves_nogather]="${TITAN[*]} algorithm.grad_accum=1 algorithm.rollout_waves=true generator.gather_ms=0"
  [ga1_768]="${TITAN[*]} algorithm.grad_accum=1 dataset.max_prompt_tokens=256"
  [ga1_waves_768]="${TITAN[*]} algorithm.grad_accum=1 algorithm.rollout_waves=true dataset.max_prompt_tokens=256"
  [base_ga4]="${TITAN[*]} trainer.compile=true algorithm.grad_accum=4"
  [base_ga1]="${TITAN[*]} algorithm.grad_accum=1"
  [base_ga1_waves]="${TITAN[*]} algorithm.grad_accum=1 algorithm.rollout_waves=true"
)
ORDER=(ga4 ga1 ga1_eager ga1_seq ga1_lowprio ga1_age2 ga1_nolookahead ga1_sync8 ga1_sync4 ga1_copies ga1_service ga1_neither ga1_age2_neither ga1_share ga1_noshare ga1_flex ga1_share_sdpa ga1_age2_share ga1_waves ga1_waves_nogather ga1_768 ga1_waves_768 hf_ga4 ga1_vllm base_ga4 base_ga1 base_ga1_waves)
TAGS=("$@")
[ ${#TAGS[@]} -gt 0 ] || TAGS=("${ORDER[@]}")
if [[ " ${TAGS[*]} " != " hf_ga4 " ]] && ! python3 -c "import torchtitan" 2>/dev/null; then
  echo "run_step.sh: trainer=titan needs TorchTitan on this machine: fetch its wheels with" \
    "benchmarks/gpu/fetch_wheels.sh (requirements-titan.txt) and carry .whl/p1 .. again" >&2
  exit 2
fi
declare -A SEEN=()
NAMES=()  # a variant named twice runs twice, its second run's outputs named <tag>_2
for tag in "${TAGS[@]}"; do
  [ -n "${VARIANTS[$tag]:-}" ] || { echo "unknown variant $tag (one of ${ORDER[*]})" >&2; exit 2; }
  SEEN[$tag]=$(( ${SEEN[$tag]:-0} + 1 ))
  name=$tag
  [ "${SEEN[$tag]}" -eq 1 ] || name=${tag}_${SEEN[$tag]}
  NAMES+=("$name")
  read -r -a overrides <<< "${VARIANTS[$tag]}"
  if [[ $tag == base_* ]]; then
    PYTHONPATH="${BASE_SITE:?BASE_SITE: the earlier forge_exp install}:$PYTHONPATH" TAG=$name \
      bash "$HERE/run_layouts.sh" single_gpu "${overrides[@]}" || true
  else
    TAG=$name bash "$HERE/run_layouts.sh" single_gpu "${overrides[@]}" || true
  fi
done
python3 "$HERE/step_table.py" "$OUT" "${NAMES[@]}"
