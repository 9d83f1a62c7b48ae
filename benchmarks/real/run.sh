#!/usr/bin/env bash
# The real-model benchmark of benchmarks/real.md, exactly as run: GRPO through the real `forge-exp` entry point on
# SmolLM2-135M-Instruct (its GGUF file) and reasoning-gym tasks (experiment=gym_smollm2), and TRL's GRPOTrainer on
# the same composed run (trl_grpo.py), one after the other in one call.
#
#   source benchmarks/gpu/install.sh                   # on the GPU machine: wheels + the .gguf carried in .whl/p*
#   GGUF=/tmp/wheels/files/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/real/run.sh sweep "algorithm.lr=1e-5" \
#       "algorithm.lr=3e-5 algorithm.temperature=0.7"
#   GGUF=... bash benchmarks/real/run.sh compare algorithm.lr=3e-5
#
#   sweep "OVERRIDES" ..  one forge-exp run per argument (sweep_1, sweep_2, ...), all at once, each stopped (SIGTERM:
#                         a checkpoint, the run KILLED with every step in MLflow) after SWEEP_SECONDS
#   compare [overrides]   forge-exp for STEPS steps, then TRL for as many training seconds as forge-exp's run took
#                         (TRL_SECONDS to set them), then the table and the curves (summarize.py)
# Environment: GGUF (required), RESULTS (default $BENCH/out), BENCH (work dir; /tmp/realbench), STEPS, EXTRA
# (more overrides for every run, e.g. services=cpu for a CPU check), SWEEP_SECONDS, FORGE_MAX_SECONDS (compare: stop
# forge-exp after this; 0 = none), TRL_SECONDS (default: forge-exp's
# training seconds, at most TRL_MAX_SECONDS, 200), PYTHON (summaries;
# python3), TRL_PYTHON (TRL's side: python3; .venv-trl/bin/python here, from benchmarks/lean/setup_trl.sh).
# Writes into $RESULTS: <name>.config.yaml (`forge-exp ... --cfg job`: what the numbers describe), <name>.log, and for
# compare: trl.json, trl.log, real.json and real.png.
set -euo pipefail
MODE=${1:?sweep "OVERRIDES" .. | compare [overrides]}
shift
REPO=$(cd "$(dirname "$0")/../.." && pwd)
: "${GGUF:?GGUF=<path of SmolLM2-135M-Instruct.Q4_1.gguf>}"
BENCH=${BENCH:-/tmp/realbench}
OUT=${RESULTS:-$BENCH/out}
STEPS=${STEPS:-400}
PYTHON=${PYTHON:-python3}
TRL_PYTHON=${TRL_PYTHON:-python3}
read -r -a EXTRA <<< "${EXTRA:-}"
mkdir -p "$OUT" "$BENCH"
cd "$BENCH"  # not the repo root: forge_exp comes from the installed copy, as a user's would

args() {  # the overrides of run $1, then any given
  local name=$1; shift
  echo experiment=gym_smollm2 "model.path=$GGUF" "steps=$STEPS" progress=false "name=$name" \
    "tracking.uri=sqlite:///$BENCH/$name/mlflow.db" "hydra.run.dir=$BENCH/$name/run" "${EXTRA[@]}" "$@"
}

forge() {  # name, seconds limit (0: none), overrides...
  local name=$1 limit=$2; shift 2
  read -r -a a <<< "$(args "$name" "$@")"
  rm -rf "${BENCH:?}/$name" && mkdir -p "$BENCH/$name"
  echo "forge-exp ${a[*]}" | tee "$OUT/$name.command"
  forge-exp "${a[@]}" --cfg job > "$OUT/$name.config.yaml"
  if [[ $limit == 0 ]]; then forge-exp "${a[@]}" > "$OUT/$name.log" 2>&1
  else timeout -s TERM -k 60 "$limit" forge-exp "${a[@]}" > "$OUT/$name.log" 2>&1; fi
}

case $MODE in
  sweep)
    pids=() k=0
    for overrides in "$@"; do
      k=$((k + 1))
      read -r -a o <<< "$overrides"
      forge "sweep_$k" "${SWEEP_SECONDS:-420}" "${o[@]}" &
      pids+=($!)
      sleep 5  # their proc meshes start one after the other
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    for k in $(seq 1 $#); do
      "$PYTHON" "$REPO/benchmarks/real/summarize.py" --db "$BENCH/sweep_$k/mlflow.db" \
        --config "$OUT/sweep_$k.config.yaml" --command "$(cat "$OUT/sweep_$k.command")" --out "$OUT/sweep_$k.json" \
        --plot "$OUT/sweep_$k.png" > "$OUT/sweep_$k.table.json" || true
      echo "sweep_$k: $(cat "$OUT/sweep_$k.command" | grep -o 'algorithm\.[a-z_]*=[^ ]*' | tail -n 3 | xargs)"
      "$PYTHON" -c "import json,sys; t=json.load(open(sys.argv[1]))['table']['forge-exp']; print({k: t[k] for k in \
('accuracy_start','accuracy_end','steps','train_seconds','per_task')})" "$OUT/sweep_$k.json" || tail -n 5 "$OUT/sweep_$k.log"
    done
    ;;
  compare)
    start=$(date +%s)
    forge forge "${FORGE_MAX_SECONDS:-0}" "$@" || echo "forge-exp exited with $?"
    tail -n 8 "$OUT/forge.log"
    read -r -a a <<< "$(args trl "$@")"
    seconds=${TRL_SECONDS:-$("$PYTHON" - "$BENCH/forge/mlflow.db" "${TRL_MAX_SECONDS:-200}" <<'PY'
import sqlite3, sys
print(min(float(sys.argv[2]), round(sum(v for (v,) in sqlite3.connect(sys.argv[1]).execute(
    "select value from metrics where key='time/step_seconds'")))))
PY
)}
    echo "TRL for $seconds s of training; forge-exp took $(( $(date +%s) - start )) s in all"
    "$TRL_PYTHON" "$REPO/benchmarks/real/trl_grpo.py" --out "$OUT/trl.json" --max-train-seconds "$seconds" -- "${a[@]}" \
      > "$OUT/trl.log" 2>&1 || { echo "TRL failed"; tail -n 20 "$OUT/trl.log"; }
    "$PYTHON" "$REPO/benchmarks/real/summarize.py" --db "$BENCH/forge/mlflow.db" --trl "$OUT/trl.json" \
      --config "$OUT/forge.config.yaml" --command "$(cat "$OUT/forge.command")" --out "$OUT/real.json" \
      --plot "$OUT/real.png"
    ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
