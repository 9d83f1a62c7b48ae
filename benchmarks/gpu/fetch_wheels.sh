#!/usr/bin/env bash
# Here (a machine with pip and a package index): download the cp312 manylinux wheels that the lent GPU machines'
# image lacks (requirements-gpu.txt) into .whl/ (git-ignored), in folders that each fit one device call (64 MiB a
# call, the working tree included: ~2.5 MB today). torchmonarch (93 MB) is split across them; install.sh puts it
# back together on the machine, which must stay warm between the calls (30 s): chain them without a pause.
#
#   bash benchmarks/gpu/fetch_wheels.sh     → .whl/p1/ (carry in call 1), .whl/p2/ (call 2), .whl/p3/ (call 3)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=benchmarks/gpu
DL=.whl/dl
PART_BYTES=${PART_BYTES:-54000000}   # per call: 64 MiB = 67.1 MB, less the working tree and a wide margin
PIP=${PIP:-python3 -m pip}
rm -rf .whl/p[0-9] && mkdir -p "$DL"

grep -v -E '^(#|$|antlr4)' $HERE/requirements-gpu.txt | sed 's/ *#.*//' > .whl/reqs.txt
$PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$DL" -r .whl/reqs.txt
# hydra-core pins antlr4-python3-runtime 4.9.*, published as an sdist only: build its pure-Python wheel
$PIP wheel --no-deps -w "$DL" antlr4-python3-runtime==4.9.3

python3 - "$DL" "$PART_BYTES" <<'PY'
"""Every wheel goes to p1 except torchmonarch, which fills p1 up to PART_BYTES and goes on in p2, p3, ... (as many
as it takes); a manifest (sha256, wheel, number of pieces) travels in each."""
import hashlib, os, re, shutil, sys
dl, budget = sys.argv[1], int(sys.argv[2])
reqs = {re.sub(r"[-_.]+", "_", l.split("==")[0]).lower() for l in open(".whl/reqs.txt") if "==" in l} | {"antlr4_python3_runtime"}
wheels = sorted(f for f in os.listdir(dl) if f.endswith(".whl") and re.sub(r"[-_.]+", "_", f.split("-")[0]).lower() in reqs)
assert len(wheels) == len(reqs), f"expected {len(reqs)} wheels, found {len(wheels)}: {sorted(reqs - {re.sub(r'[-_.]+', '_', w.split('-')[0]).lower() for w in wheels})}"
big = next(w for w in wheels if w.startswith("torchmonarch"))
os.makedirs(".whl/p1")
manifest, used = [], 0
for w in wheels:
    if w == big:
        continue
    shutil.copy(os.path.join(dl, w), ".whl/p1/")
    used += os.path.getsize(os.path.join(dl, w))
    manifest.append((hashlib.sha256(open(os.path.join(dl, w), "rb").read()).hexdigest(), w, 1))
data = open(os.path.join(dl, big), "rb").read()
assert used < budget, f"the other wheels alone ({used} bytes) exceed PART_BYTES"
cuts = [0, budget - used]
while cuts[-1] < len(data):
    cuts.append(cuts[-1] + budget)
pieces = list(zip(cuts, cuts[1:]))
for i, (a, b) in enumerate(pieces):
    os.makedirs(f".whl/p{i + 1}", exist_ok=True)
    open(f".whl/p{i + 1}/{big}.part-a{chr(ord('a') + i)}", "wb").write(data[a:b])
manifest.append((hashlib.sha256(data).hexdigest(), big, len(pieces)))
for i in range(len(pieces)):
    with open(f".whl/p{i + 1}/manifest.txt", "w") as f:
        f.writelines(f"{h} {w} {n}\n" for h, w, n in manifest)
    print(f"p{i + 1}", sum(os.path.getsize(f".whl/p{i + 1}/{f}") for f in os.listdir(f".whl/p{i + 1}")), "bytes")
PY
