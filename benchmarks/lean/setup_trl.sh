#!/usr/bin/env bash
# A benchmark-only venv with TRL, the single-process GRPO trainer benchmarks/lean/compare.py measures forge-exp
# against. It lives in ./.venv-trl and never touches the main ./.venv (forge-exp does not depend on TRL).
#   bash benchmarks/lean/setup_trl.sh
# torch is installed first, pinned to the same CPU build as the main venv, so pip never resolves another torch;
# transformers and tokenizers are pinned to the main venv's versions so both sides run the same Qwen3 code.
# forge-exp is installed without its dependencies (the TRL scripts use its pure modules, and benchmarks/real's
# composes its config, hence Hydra), so this venv has no monarch or MLflow.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
TORCH=${FORGE_EXP_TORCH:-torch==2.13.0}
# + what benchmarks/real/trl_grpo.py composes forge-exp's config and reward with (Hydra, reasoning-gym, gguf)
PINS=("trl==1.16.0" "transformers==5.24.0" "tokenizers==0.23.3" "datasets==4.7.0" "psutil" "hydra-core==1.3.8"
      "omegaconf>=2.3,<2.4" "reasoning-gym==0.1.25" "gguf>=0.10" "accelerate>=1.0")
PIP=(.venv-trl/bin/python -m pip install -q --disable-pip-version-check)
want="$TORCH ${PINS[*]} forge-exp"
stamp=.venv-trl/.setup-stamp
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "TRL benchmark venv is set up in $(pwd)/.venv-trl (unchanged)"
  exit 0
fi
[[ -x .venv-trl/bin/python ]] || "$PY" -m venv .venv-trl
.venv-trl/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" "$TORCH"
"${PIP[@]}" "$TORCH" "${PINS[@]}"
"${PIP[@]}" --no-deps -e .  # forge_exp and its config groups (conf/ installs as forge_exp.conf), not its dependencies
.venv-trl/bin/python -c "import torch, trl; assert torch.__version__.startswith('2.13.0'), torch.__version__; \
print('torch', torch.__version__, 'trl', trl.__version__)"
echo "$want" > "$stamp"
echo "TRL benchmark venv is set up in $(pwd)/.venv-trl"
