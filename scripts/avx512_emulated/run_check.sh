#!/usr/bin/env bash
# Checks the AVX-512 block-quant kernels on a machine without AVX-512: builds
# quant_avx512_emulated.cpp (the kernels through SIMDe's portable AVX-512) against a configured
# CPU build's libraries and runs it. Needs an x86-64 CPU with AVX2 + FMA + F16C.
#   scripts/avx512_emulated/run_check.sh [build dir, default build-cpu]
# SIMDe's headers: SIMDE_INCLUDE=<the folder holding simde/>, else the simde-py sdist (0.8.2)
# is fetched from PyPI with pip into a temporary folder. Compiling the emulation takes minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-cpu}
ninja -C "$build" strata_engine strata_core >/dev/null
inc=${SIMDE_INCLUDE:-}
if [[ -z $inc ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  pip download --quiet --no-deps --no-binary :all: simde-py==0.8.2.post1 -d "$tmp"
  tar -xzf "$tmp"/simde_py-*.tar.gz -C "$tmp"
  header=$(find "$tmp" -path '*/simde/x86/avx512.h' | head -n 1)
  inc=$(cd "$(dirname "$header")/../.." && pwd)
fi
out=$build/quant_avx512_emulated
g++ -std=c++20 -O1 -mavx2 -mfma -mf16c -Wno-psabi -I"$inc" -I"$root/src" -I"$root/include" \
  "$root/scripts/avx512_emulated/quant_avx512_emulated.cpp" "$build/libstrata_engine.a" \
  "$build/libstrata_core.a" -lfmt -fopenmp -o "$out"
"$out"
