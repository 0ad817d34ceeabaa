#!/usr/bin/env bash
# GGUF block formats on the GPU (issue 15: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K kept in their blocks) on
# one GPU, one device call:
#   1. correctness: the op table's GGUF cases (decode kernel up to 64 tokens, dequantized tiles +
#      cuBLASLt above, gated; CUDA vs the CPU twins), the model-level GGUF tests (the mixed-format
#      llama fixture on CUDA vs the CPU twins and the CPU engine, greedy decoding through graphs),
#      the kernels against the twin (dequantizer bit-exact, gguf_linear incl. misaligned rows),
#      and the host emulation of the kernels' lane plumbing;
#   2. speed: bench_gpu_linear for the GGUF formats against bf16 / int8 on the Llama-3-8B shapes
#      (weight GB/s against the read ceiling), then `strata bench` on Llama-3-8B with random
#      weights: q8_0, q4_k, q6_k against bf16 at batch 1 / 16 / 64 (goal: q4_k batch 1 <= 2.6 ms
#      per token on an H100), JSON to $OUT. With GGUF=<file.gguf> also that file in block format
#      and with STRATA_GGUF_DEQUANT=1 (the old dequantize-to-bf16 path), A/B in the same job.
#   BUILD=<dir with strata, tests/, bench/> scripts/gpu_gguf_check.sh
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
  grep -E "^\| (decode|prefill)|^ *[0-9]+ +[0-9]+ +[0-9]+ |q[0-9]_|info|error|PASSED|FAILED|failures" \
    "$OUT/$name.txt" | head -n 60
}
for f in q8_0 q4_0 q4_k q5_k q6_k; do
  step "backend_ops_$f" 300 "$BUILD/tests/test_backend_ops" --require-cuda --filter " $f"
done
step model_tests 300 "$BUILD/tests/test_cuda" --gtest_filter='CudaGguf.*:GgufKernelsCuda.*'
if [ -x "$BUILD/tests/test_ops" ]; then
  step fragments 120 "$BUILD/tests/test_ops" --gtest_filter='GgufFragments.*'
fi
step bench_gpu_linear 300 "$BUILD/bench/bench_gpu_linear" --dtypes q4_k,q6_k,q8_0,q5_k,q4_0,bf16,i8 \
  --paths sbi --reps 20 --n 1,8,16,17,32,64 --json "$OUT/bench_gpu_linear_gguf.json"
B8="--device cuda --model-config llama3-8b --batch 1,16,64 --ctx 256 --prefill 1x2048 -p 128 -r 5"
for q in q4_k q8_0 q6_k; do
  step "bench_$q" 300 "$BUILD/strata" bench $B8 --quantization $q --json "$OUT/$q.json"
done
step bench_bf16 300 "$BUILD/strata" bench $B8 --json "$OUT/bf16.json"
if [ -n "${GGUF:-}" ]; then
  BG="--device cuda -m $GGUF --batch 1,16,64 --ctx 256 --prefill 1x2048 -p 128 -r 5"
  step bench_file_blocks 300 "$BUILD/strata" bench $BG --json "$OUT/file_blocks.json"
  step bench_file_dequant 300 env STRATA_GGUF_DEQUANT=1 "$BUILD/strata" bench $BG \
    --json "$OUT/file_dequant.json"
fi
exit $rc
