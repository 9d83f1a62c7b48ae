#!/usr/bin/env bash
# A benchmark-only venv with TRL, the single-process GRPO trainer benchmarks/lean/compare.py measures forge-exp
# against. It lives in ./.venv-trl and never touches the main ./.venv (forge-exp does not depend on TRL).
#   bash benchmarks/lean/setup_trl.sh
# torch is installed first, pinned to the same CPU build as the main venv, so pip never resolves another torch;
# transformers and tokenizers are pinned to the main venv's versions so both sides run the same Qwen3 code.
# The TRL script imports forge_exp's pure model/tokenizer/task/reward modules from the source tree (PYTHONPATH),
# not an installed forge-exp, so this venv needs no monarch, Hydra or MLflow.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TORCH=${FORGE_EXP_TORCH:-torch==2.13.0}
PINS=("trl==1.16.0" "transformers==5.24.0" "tokenizers==0.23.3" "datasets==4.7.0" "psutil")
PIP=(.venv-trl/bin/python -m pip install -q --disable-pip-version-check)
want="$TORCH ${PINS[*]}"
stamp=.venv-trl/.setup-stamp
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "TRL benchmark venv is set up in $(pwd)/.venv-trl (unchanged)"
  exit 0
fi
[[ -x .venv-trl/bin/python ]] || "$PY" -m venv .venv-trl
.venv-trl/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" "$TORCH"
"${PIP[@]}" "$TORCH" "${PINS[@]}"
.venv-trl/bin/python -c "import torch, trl; assert torch.__version__.startswith('2.13.0'), torch.__version__; \
print('torch', torch.__version__, 'trl', trl.__version__)"
echo "$want" > "$stamp"
echo "TRL benchmark venv is set up in $(pwd)/.venv-trl"
