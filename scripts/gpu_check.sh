#!/usr/bin/env bash
# Every GPU check in one go, for the GPU machine (device tool): configure + build with CUDA,
# run the `cuda` CTest label, then compute-sanitizer memcheck on the CUDA tests. Logs and
# a JSON summary go to $OUT (or ./gpu_out). Usage: scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
JOBS=$(nproc)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -n 2
  cmake --version | head -n 1
} 2>&1 | tee "$OUT/machine.txt"
echo "== configure"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_MPI=OFF \
  ${STRATA_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1 || { tail -n 40 "$OUT/configure.log"; exit 1; }
grep "strata:" "$OUT/configure.log"
echo "== build"
cmake --build build-gpu -j "$JOBS" > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -n 40; exit 1; }
echo "== cuda tests"
rc=0
./build-gpu/tests/test_cuda --gtest_filter="${CUDA_FILTER:-*}" --gtest_output="json:$OUT/test_cuda.json" \
  > "$OUT/test_cuda.log" 2>&1 || rc=1
grep -E "^\[  FAILED|\[ info \]|INFO" "$OUT/test_cuda.log" | head -n 60
tail -n 3 "$OUT/test_cuda.log"
if [ -z "${SKIP_CPU:-}" ]; then
  echo "== cpu tests on this machine (sanity)"
  OMP_NUM_THREADS=2 ctest --test-dir build-gpu -L cpu -E pytest -j "$JOBS" > "$OUT/ctest_cpu.log" 2>&1 || rc=1
  tail -n 3 "$OUT/ctest_cpu.log"
fi
if [ -z "${SKIP_MEMCHECK:-}" ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck"
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 ./build-gpu/tests/test_cuda \
    --gtest_filter="${MEMCHECK_FILTER:-*}" \
    > "$OUT/memcheck.log" 2>&1 || rc=1
  tail -n 3 "$OUT/memcheck.log"
fi
echo "gpu_check rc=$rc"
exit $rc
