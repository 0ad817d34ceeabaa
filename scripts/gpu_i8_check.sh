#!/usr/bin/env bash
# int8 weights above the SBI crossover (issue 15, the A8W8 path of src/backends/cuda/linear.cpp)
# on one GPU, one device call:
#   1. correctness: the GPU linear layer's int8 cases against the CPU twins (A8W8 rows compare
#      with cpu::gpu_linear_a8w8, to ~1e-5 of max|out|), the A8W8 route for Llama-3 shapes, the
#      int8 activation bytes, graph capture, the model-level int8-vs-bf16 test, and the op table;
#   2. speed, A/B in the same job: bench_gpu_linear for int8 (sbi vs lt, n = 1 .. 2048), then
#      `strata bench` int8 with the A8W8 GEMM and with STRATA_NO_I8_GEMM=1 (the old SBI slices),
#      and bf16 as the peer (Llama-3-8B: batch 1/16/64, prefill 1x2048; the 70B shape at
#      batch 64 when LARGE=1 and the GPU holds it: ~70 GB of int8 weights).
#   BUILD=<dir with strata, tests/, bench/> scripts/gpu_i8_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $name"
  timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|^ *[0-9]+ +[0-9]+ +[0-9]+ |info|error|PASSED|FAILED|failures" \
    "$OUT/$name.txt" | head -n 40
}
step linear_tests 300 "$BUILD/tests/test_cuda" \
  --gtest_filter='AwkwardShapes/GpuLinearCudaTest.*_i8_*:GpuLinearGraphTest.*:QuantizeRowsCudaTest.*:GpuLinearCudaArgs.*'
step model_tests 300 "$BUILD/tests/test_cuda" \
  --gtest_filter='CudaModel.Int8AboveCrossoverStaysCloseToBf16:CudaModel.QuantizedWeightsStayClose:Fixtures/CudaMoe.*:WeightStreamingCuda.FixturesHostTierEqualResident'
step backend_ops 300 "$BUILD/tests/test_backend_ops" --require-cuda
step bench_gpu_linear 300 "$BUILD/bench/bench_gpu_linear" --dtypes i8 --paths sbi,lt --reps 20 \
  --n 1,8,16,17,32,64,128,512,2048 --json "$OUT/bench_gpu_linear_i8.json"
B8="--device cuda --model-config llama3-8b --batch 1,16,64 --ctx 256 --prefill 1x2048 -p 128 -r 5"
step bench_i8_a8w8 300 "$BUILD/strata" bench $B8 --quantization int8 --json "$OUT/i8_a8w8.json"
step bench_i8_sbi 300 env STRATA_NO_I8_GEMM=1 "$BUILD/strata" bench $B8 --quantization int8 \
  --json "$OUT/i8_sbi.json"
step bench_bf16 300 "$BUILD/strata" bench $B8 --json "$OUT/bf16.json"
if [ -n "${LARGE:-}" ]; then
  B70="--device cuda --model-config llama3-70b --quantization int8 --batch 64 --ctx 512 --decode-steps 4 -r 3"
  step bench_70b_i8_a8w8 600 "$BUILD/strata" bench $B70 --json "$OUT/70b_i8_a8w8.json"
  step bench_70b_i8_sbi 600 env STRATA_NO_I8_GEMM=1 "$BUILD/strata" bench $B70 \
    --json "$OUT/70b_i8_sbi.json"
fi
exit $rc
