#!/usr/bin/env bash
# Configure and build the strata binary into build/ (Release; CUDA backend when nvcc is found).
# Only what running needs: the test suites and kernel benchmarks are built by scripts/test.sh
# (`make test`), which turns them back on in the same build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
  -DSTRATA_BUILD_BENCH=OFF ${STRATA_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target strata
