#!/usr/bin/env bash
# Here (a machine with pip and a package index): download the cp312 manylinux wheels that the lent GPU machines'
# image lacks into .whl/ (git-ignored), in folders that each fit one device call (64 MiB a call, the working tree
# included: ~3 MB today). Any file too big for what is left of a folder is cut into pieces that go on in the next
# ones (torchmonarch, 93 MB; a .gguf model); install.sh puts them back together on the machine, which must stay warm
# between the calls (30 s): chain them without a pause.
#
#   bash benchmarks/gpu/fetch_wheels.sh                       # requirements-gpu.txt and -titan.txt → .whl/p1 .. p3
#   bash benchmarks/gpu/fetch_wheels.sh benchmarks/gpu/requirements-real.txt "$(bash launchers/fetch_smollm2.sh)"
#                                                             # + the real-model benchmark's wheels and model file
#   bash benchmarks/gpu/fetch_wheels.sh benchmarks/gpu/requirements-vllm.txt   # + vLLM 0.26 (generator=vllm)
# Arguments: more requirement files (*.txt), and files to carry as they are (anything else). A requirement marked
# `# sdist` has no wheel on PyPI: it is built here (`pip wheel`; with $PY312, a Python 3.12, where it compiles C).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=benchmarks/gpu
DL=.whl/dl
PART_BYTES=${PART_BYTES:-60000000}   # per call: 64 MiB = 67.1 MB, less the working tree (~3 MB) and a margin
PIP=${PIP:-python3 -m pip}
PY312=${PY312:-python3.12}
REQS=("$HERE/requirements-gpu.txt" "$HERE/requirements-titan.txt") BLOBS=()  # every gpu.md step runs trainer=titan
for arg in "$@"; do
  if [[ $arg == *.txt ]]; then REQS+=("$arg"); else BLOBS+=("$arg"); fi
done
rm -rf .whl/p[0-9] .whl/p[0-9][0-9] && mkdir -p "$DL"

cat "${REQS[@]}" | grep -v -E '^(#|$)' | sed 's/ *#.*//' | sort -u > .whl/reqs.txt
cat "${REQS[@]}" | grep -v '^#' | grep -E '# *sdist' | sed 's/ *#.*//' > .whl/sdists.txt || true
grep -v -x -F -f .whl/sdists.txt .whl/reqs.txt > .whl/binary.txt || true
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$DL" -r .whl/binary.txt
for wheel in "$DL"/vllm-*.whl; do [ -f "$wheel" ] && python3 "$HERE/slim_vllm.py" "$wheel"; done
while read -r sdist; do  # pure Python ones build anywhere; one with C (pycosat) needs the target's Python, 3.12
  if "$PY312" --version >/dev/null 2>&1; then "$PY312" -m pip wheel -q --no-deps -w "$DL" "$sdist"
  else $PIP wheel -q --no-deps -w "$DL" "$sdist"; fi
done < .whl/sdists.txt

python3 - "$DL" "$PART_BYTES" "${BLOBS[@]}" <<'PY'
"""First fit in order, smallest file first: a file goes whole into the current part when it fits, else it fills
the part and goes on, in pieces, in the next ones. Every part carries the manifest (sha256, name, pieces)."""
import hashlib, os, re, sys
dl, budget, blobs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
reqs = {(norm(l.split("==")[0]), l.split("==")[1].strip()) for l in open(".whl/reqs.txt") if l.strip()}
wheels = {(norm(f.split("-")[0]), f.split("-")[1]): os.path.join(dl, f) for f in os.listdir(dl) if f.endswith(".whl")}
missing = reqs - set(wheels)  # (.whl/dl keeps older downloads too: only the pinned versions travel)
assert not missing, f"no wheel for: {sorted(missing)}"
files = sorted([wheels[r] for r in reqs] + blobs, key=os.path.getsize)
parts, used, manifest = [[]], 0, []
for path in files:
    data = open(path, "rb").read()
    name, pieces, start = os.path.basename(path), [], 0
    while start < len(data):
        room = budget - used
        if room <= 0 or (start == 0 and len(data) <= budget and len(data) > room):  # whole into a new part
            parts.append([]); used = 0; continue
        end = min(len(data), start + room)
        pieces.append((len(parts), data[start:end])); used += end - start; start = end
    manifest.append((hashlib.sha256(data).hexdigest(), name, len(pieces)))
    for i, (part, chunk) in enumerate(pieces):
        os.makedirs(f".whl/p{part}", exist_ok=True)
        suffix = f".part-{i:03d}" if len(pieces) > 1 else ""
        open(f".whl/p{part}/{name}{suffix}", "wb").write(chunk)
for k in range(1, len(parts) + 1):
    with open(f".whl/p{k}/manifest.txt", "w") as f:
        f.writelines(f"{h} {w} {n}\n" for h, w, n in manifest)
    print(f"p{k}", sum(os.path.getsize(f".whl/p{k}/{f}") for f in os.listdir(f".whl/p{k}")), "bytes")
PY
