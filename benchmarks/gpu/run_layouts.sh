#!/usr/bin/env bash
# The GPU layout runs of benchmarks/gpu.md, exactly as run: GRPO through the real `forge-exp` entry point and
# Monarch, on the Qwen3-1.7B shape (random init, bf16) from make_model.py, group_size 8, 4 prompts per step
# (32 sequences), prompts of exactly 256 tokens, completions up to 512 (random weights almost never sample EOS).
#
#   source benchmarks/gpu/install.sh
#   python3 benchmarks/gpu/make_model.py --out /tmp/gpubench          # once per machine
#   bash benchmarks/gpu/run_layouts.sh single_gpu   # 1 GPU: trainer, reference, generator in one process
#   bash benchmarks/gpu/run_layouts.sh multi_gpu    # 2 GPUs: trainer + reference on 0, generator on 1
#   bash benchmarks/gpu/run_layouts.sh three_gpu    # 3 GPUs: trainer 0, reference 1, generator 2   (needs x4)
#   bash benchmarks/gpu/run_layouts.sh three_gpu_2gen  # 4 GPUs: + a second generator replica on 3  (needs x4)
#   bash benchmarks/gpu/run_layouts.sh single_gpu model.lora.rank=32 ...   # more overrides after the layout
#   (env: MODEL=qwen3_8b for make_model.py --shape 8b's model, TAG names the outputs (default: the layout);
#   layout cpu runs the same command on services=cpu without the GPU measurements, for a check at a tiny shape)
#
# Writes $OUT/peak_<layout>.json (the bf16 matmul rate and copy bandwidth MFU is taken against, measured first, in
# the same call: benchmarks/gpu/peak.py), $OUT/<layout>.config.yaml (the composed config: `forge-exp ... --cfg job`),
# $OUT/<layout>.log (the run's output) and $OUT/<layout>.json (benchmarks/gpu/summarize.py).
set -euo pipefail
LAYOUT=${1:?layout: single_gpu | multi_gpu | three_gpu | three_gpu_2gen | cpu}
shift
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=${BENCH:-/tmp/gpubench}
OUT=${OUT:-$BENCH/out}
STEPS=${STEPS:-20}
PROMPTS=${PROMPTS:-4}
MODEL=${MODEL:-qwen3_1_7b}
TAG=${TAG:-$LAYOUT}
NEW_TOKENS=${NEW_TOKENS:-512}
PROMPT_TOKENS=${PROMPT_TOKENS:-256}  # what make_model.py --prompt-tokens wrote
mkdir -p "$OUT" "$BENCH/$TAG"
case $LAYOUT in
  cpu) SERVICES=(services=cpu) ;;
  single_gpu) SERVICES=(services=single_gpu); export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} ;;
  multi_gpu) SERVICES=(services=multi_gpu) ;;
  three_gpu) SERVICES=(services=three_gpu) ;;
  three_gpu_2gen) SERVICES=(services=three_gpu services.generator.replicas=2) ;;
  *) echo "unknown layout $LAYOUT"; exit 2 ;;
esac
ARGS=(
  "${SERVICES[@]}"
  "model=$MODEL" "model.path=$BENCH/$MODEL"
  dataset=jsonl "dataset.train_path=$BENCH/data/train.jsonl" "dataset.eval_path=$BENCH/data/test.jsonl"
  dataset.system_prompt=none dataset.eval_size=null "dataset.max_new_tokens=$NEW_TOKENS" reward=math
  algorithm=grpo algorithm.group_size=8 "algorithm.prompts_per_step=$PROMPTS" algorithm.grad_accum=4
  "steps=$STEPS" progress=false name=gpu_$TAG
  "tracking.uri=sqlite:///$BENCH/$TAG/mlflow.db" "hydra.run.dir=$BENCH/$TAG/run"
  "$@"
)
COMMAND="forge-exp ${ARGS[*]}"
echo "$COMMAND"
(cd "$BENCH" && forge-exp "${ARGS[@]}" --cfg job > "$OUT/$TAG.config.yaml")  # what the numbers describe
GPU=()
SMI_GPU="" SMI_PROC=""
if [[ $LAYOUT != cpu ]]; then
  python3 "$REPO/benchmarks/gpu/peak.py" --out "$OUT/peak_$TAG.json" > /dev/null
  # GPU memory, sampled every 0.5 s: per GPU and per process (CUDA context + PyTorch's allocator reserve)
  MEM=$BENCH/$TAG/mem.csv
  nvidia-smi --query-gpu=index,uuid --format=csv,noheader > "$BENCH/$TAG/mem.gpus.csv"
  nvidia-smi --query-gpu=index,timestamp,memory.used --format=csv,noheader,nounits -lms 500 > "$MEM" &
  SMI_GPU=$!
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits -lms 500 > "$BENCH/$TAG/mem.procs.csv" &
  SMI_PROC=$!
  trap 'kill $SMI_GPU $SMI_PROC 2>/dev/null || true' EXIT
  GPU=(--mem "$MEM" --peak "$OUT/peak_$TAG.json")
fi
FLOPS=()  # what the trainer's FLOPs count
[[ " $* " == *" model.lora.rank="[0-9]* ]] && FLOPS=(--lora)
# trainer.share_prompts as composed: true, or null (titan's default: on for CUDA): GRPO's 8 samples a prompt
SHARE=$(sed -n '/^trainer:/,/^[a-z]/s/^  share_prompts: //p' "$OUT/$TAG.config.yaml")
[[ $SHARE == true || ($SHARE == null && $LAYOUT != cpu) ]] && FLOPS+=(--group 8)

cd "$BENCH"  # not the repo root: forge_exp comes from the installed copy, as a user's would
set +e
timeout -s INT -k 30 "${RUN_TIMEOUT:-560}" forge-exp "${ARGS[@]}" > "$OUT/$TAG.log" 2>&1
RC=$?
set -e
[[ -n $SMI_GPU ]] && kill $SMI_GPU $SMI_PROC 2>/dev/null || true
echo "forge-exp exit status $RC"
grep -v -i -E "warn|Loading weights|LOAD REPORT|^Key |^---|MISSING|^Notes|^- " "$OUT/$TAG.log" | tail -n 15 || true
python3 "$REPO/benchmarks/gpu/summarize.py" --layout "$LAYOUT" --db "$BENCH/$TAG/mlflow.db" "${GPU[@]}" "${FLOPS[@]}" \
  --model-config "$BENCH/$MODEL/config.json" --rows $((PROMPTS * 8)) --prompt "$PROMPT_TOKENS" --command "$COMMAND" \
  --out "$OUT/$TAG.json"
exit $RC
