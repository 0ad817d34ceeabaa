#!/usr/bin/env bash
# Every GPU check of a session in one device call: machine facts, the CUDA tests (label cuda:
# test_cuda and the op table), the op table's --perf timings (stage opperf), compute-sanitizer
# memcheck of the model-level tests, the benchmark
# beside the PyTorch peer (scripts/gpu_bench.sh) and the offline-throughput run
# (scripts/gpu_serve_bench.sh). Stages are chosen with STAGES (default "tests memcheck bench
# serve"); everything is written to a scratch folder and comes back in $OUT (or ./gpu_out) as
# few files (the device tool returns at most 8): logs.tgz with every log and JSON, plus the bench
# report, the test JSON and summary.txt; a summary prints last.
#
# Binaries: BUILD (default build-gpu) is used as is when it holds strata and tests/test_cuda
# (carried from a machine with the same toolkit: the device tool's `carry`); otherwise it is
# configured and built here. Test binaries find the fixtures through the absolute path they
# were built with (STRATA_FIXTURE_DIR): when that path does not exist here, SRC_ROOT (the repo
# path on the build machine, default /work/main) is linked to this checkout.
#
#   PEER=.gpu_carry/peer_torch.py STAGES="tests bench" scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FINAL=${OUT:-$PWD/gpu_out}
OUT=$(mktemp -d)
BUILD=${BUILD:-build-gpu}
STAGES=${STAGES:-tests memcheck bench serve}
SRC_ROOT=${SRC_ROOT:-/work/main}
mkdir -p "$FINAL"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
summary=()
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -n 2
  git log -1 --format='commit %H %s' 2>/dev/null || true
  nproc
} 2>&1 | tee "$OUT/machine.txt"
if [ ! -e "$SRC_ROOT/tests/fixtures" ] && [ "$SRC_ROOT" != "$PWD" ]; then
  mkdir -p "$(dirname "$SRC_ROOT")" && ln -sfn "$PWD" "$SRC_ROOT"
fi
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ ! -x "$BUILD/strata" ] || [ ! -x "$BUILD/tests/test_cuda" ]; then
  stamp "configure + build ($BUILD)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_MPI=OFF \
    > "$OUT/configure.log" 2>&1 || { tail -n 40 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" > "$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -n 40; exit 1; }
fi
rc=0
if has tests; then
  stamp "cuda tests"
  "$BUILD/tests/test_cuda" --gtest_filter="${CUDA_FILTER:-*}" --gtest_output="json:$OUT/test_cuda.json" \
    > "$OUT/test_cuda.log" 2>&1 || rc=1
  grep -E "^\[  FAILED|\[ info \]" "$OUT/test_cuda.log" | head -n 80
  summary+=("test_cuda: $(tail -n 40 "$OUT/test_cuda.log" | grep -E "PASSED|FAILED  \]" | head -n 2 | tr '\n' ' ')")
  for t in "$BUILD"/tests/test_backend_ops; do
    [ -x "$t" ] || continue
    stamp "op table ($t)"
    "$t" --require-cuda > "$OUT/backend_ops.log" 2>&1 || rc=1
    grep -E "FAIL|skipped" "$OUT/backend_ops.log" | head -n 20
    summary+=("backend_ops: $(tail -n 1 "$OUT/backend_ops.log")")
  done
fi
if has opperf && [ -x "$BUILD/tests/test_backend_ops" ]; then
  stamp "op table --perf"
  "$BUILD/tests/test_backend_ops" --perf --require-cuda > "$OUT/backend_ops_perf.log" 2>&1 || rc=1
  grep -E " cuda " "$OUT/backend_ops_perf.log" | grep -E "linear 16x1024|attention decode|prefill" | head -n 12
fi
if has memcheck && command -v compute-sanitizer > /dev/null; then
  stamp "compute-sanitizer memcheck"
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$BUILD/tests/test_cuda" \
    --gtest_filter="${MEMCHECK_FILTER:-CudaModel.*:Fixtures/CudaFixture.*}" > "$OUT/memcheck.log" 2>&1 || rc=1
  tail -n 3 "$OUT/memcheck.log"
  summary+=("memcheck: $(grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -n 1)")
fi
if has bench; then
  stamp "benchmark beside the peer"
  OUT="$OUT" PEER="${PEER:-}" COMMIT="$(git rev-parse --short HEAD 2>/dev/null)" \
    scripts/gpu_bench.sh "$BUILD" > "$OUT/bench.log" 2>&1 || rc=1
  grep -E "^\||ratio|decode|prefill" "$OUT/bench.log" | tail -n 40
fi
if has serve; then
  stamp "offline throughput"
  OUT="$OUT" SKIP_SERVE=${SKIP_SERVE:-1} scripts/gpu_serve_bench.sh "$BUILD" > "$OUT/serve.log" 2>&1 || rc=1
  grep -E "throughput|tok/s" "$OUT/serve.log" | tail -n 10
fi
stamp "done (rc=$rc)"
printf '%s\n' "${summary[@]}" | tee "$FINAL/summary.txt"
tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null
for f in report.json test_cuda.json throughput_none.json throughput_fp8.json; do
  [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"
done
exit $rc
