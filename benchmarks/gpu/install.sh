# On a lent GPU machine, in the repo root:   source benchmarks/gpu/install.sh
# (sourced: it exports PYTHONPATH and PATH). Call it in every call that carries one of .whl/p1, p2, ..., and in later ones.
#  1. copies the wheels and wheel pieces carried in this call (.whl/*) to /tmp/wheels, which outlives the call
#     (carried folders are replaced by the next call's; the machine itself stays while warm),
#  2. puts together and checks (sha256, manifest.txt) every file whose pieces are all there: a wheel is installed
#     into /tmp/site with --no-deps (the image has everything else: requirements-gpu.txt says why each one is
#     needed), any other file (a model) is kept in /tmp/wheels/files/,
#  3. once all are in, installs forge_exp itself from this copy of the tree (a regular install: the real
#     `forge-exp` entry point in /tmp/site/bin, conf/ shipped as forge_exp.conf), again in every call.
SITE=${SITE:-/tmp/site}
STASH=${STASH:-/tmp/wheels}
mkdir -p "$SITE" "$STASH/in" "$STASH/done" "$STASH/files"
if [ -d .whl ]; then find .whl -path .whl/dl -prune -o -type f -exec cp -f {} "$STASH/in/" \;; fi
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
_install_wheels() {
  local manifest="$STASH/in/manifest.txt" ready=() total=0 done_n=0
  [ -f "$manifest" ] || { echo "install: no wheels carried yet (.whl/p1 first)"; return 1; }
  while read -r sha name pieces; do
    total=$((total + 1))
    if [ -f "$STASH/done/$name" ]; then done_n=$((done_n + 1)); continue; fi
    if [ "$pieces" -gt 1 ]; then
      local have; have=$(ls "$STASH/in/$name".part-* 2>/dev/null | wc -l)
      if [ "$have" -ne "$pieces" ]; then echo "install: $name: $have of $pieces pieces here"; continue; fi
      cat "$STASH/in/$name".part-* > "$STASH/in/$name"
    fi
    [ -f "$STASH/in/$name" ] || { echo "install: $name missing"; continue; }
    echo "$sha  $STASH/in/$name" | sha256sum -c --quiet - || { echo "install: $name: checksum mismatch"; return 1; }
    if [[ $name != *.whl ]]; then  # a file carried as it is
      mv "$STASH/in/$name" "$STASH/files/$name" && touch "$STASH/done/$name" && done_n=$((done_n + 1))
      continue
    fi
    ready+=("$STASH/in/$name")
  done < "$manifest"
  if [ ${#ready[@]} -gt 0 ]; then
    # into a fresh folder, then merged: `pip --target --upgrade` replaces a top-level folder whole, so wheels of one
    # namespace package (opentelemetry-api, -sdk, -proto) installed in different calls would delete each other
    local fresh; fresh=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$fresh" "${ready[@]}" \
      && cp -a "$fresh/." "$SITE/" && rm -rf "$fresh" || return 1
    for f in "${ready[@]}"; do touch "$STASH/done/$(basename "$f")"; done
    done_n=$((done_n + ${#ready[@]}))
  fi
  echo "install: $done_n of $total wheels in $SITE"
  [ "$done_n" -eq "$total" ]
}
_install_forge_exp() {
  rm -rf build  # a stale build/lib from an earlier call would be installed again
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir --no-compile --upgrade \
    --target "$SITE" . && echo "install: forge_exp $(git rev-parse --short HEAD 2>/dev/null || echo '(tree)') in $SITE"
}
if _install_wheels; then
  _install_forge_exp
else
  export PYTHONPATH="$SITE:$PWD"  # not all wheels yet: the pure layers run from the tree
fi
