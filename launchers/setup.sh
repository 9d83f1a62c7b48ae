#!/usr/bin/env bash
# Sets up forge-exp in ./.venv from scratch (idempotent: a second run only checks).
#   bash launchers/setup.sh          # the package, for running experiments
#   bash launchers/setup.sh --test   # + test/sweep/notebook/titan extras and the Debian packages the tests start
#                                    #   (SLURM daemons, munge, Chromium)
# torch is pinned to the CPU build first, so pip never resolves a multi-GB CUDA build on a CPU-only machine;
# GPU users install their own torch first and pip keeps it (pyproject only asks torch>=2.6).
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
[[ "${1:-}" == "--test" ]] && TEST=1
PY=${PYTHON:-python3}
TORCH=${FORGE_EXP_TORCH:-torch==2.13.0}

if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "$TORCH"
fi
if [[ $TEST == 1 ]]; then
  # titan: TorchTitan for trainer=titan's tests. The installed torch is pinned (torch==X matches X+cpu), so no
  # requirement of TorchTitan's can pull another build.
  HAVE_TORCH="torch==$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')"
  .venv/bin/python -m pip install -q -e ".[sweep,notebook,test,titan]" "$HAVE_TORCH"
  if [[ -f launchers/apt-packages.txt ]]; then
    pkgs=$(grep -v '^\s*#' launchers/apt-packages.txt | xargs)
    missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs)
    if [[ -n "$missing" ]]; then
      SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
  fi
  if [[ -f tests/browser/package.json ]]; then
    (cd tests/browser && npm install --silent --no-audit --no-fund)
  fi
else
  .venv/bin/python -m pip install -q -e .
fi
echo "forge-exp is set up in $(pwd)/.venv"
