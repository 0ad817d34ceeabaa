#!/usr/bin/env bash
# The one-GPU checks of the parallel paths in one device call, with binaries built elsewhere
# (BUILD, default build-gpu) and carried in:
#   1. the whole CUDA test binary (TpCuda, PpCuda, OneShotCuda, models, kernels) -> test_cuda.json
#   2. the one-shot collective tests again in fresh processes (a collective that is a fresh
#      stream's first work once hung while the peer spun; they must pass every time)
#   3. the op table on the GPU (test_backend_ops --require-cuda)
#   4. Llama-3-8B shape, random bf16 weights, KV 256, decode at batch 1 and 16, alternating in
#      rounds: TP = 1; TP = 2 on this GPU with the fused all-reduce + norm; TP = 2 with separate
#      kernels (STRATA_NO_FUSED_ALLREDUCE=1); PP = 2 stages on this GPU
# SKIP_TESTS=1 runs only the benchmarks; ROUNDS=0 only the tests. Logs come back in $OUT
# (summary.txt + logs.tgz).
#
#   BUILD=.gpu_carry/bin SRC_ROOT=/work/wt-core scripts/gpu_onegpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FINAL=${OUT:-$PWD/gpu_out}
OUT=$(mktemp -d)
BUILD=${BUILD:-build-gpu}
SRC_ROOT=${SRC_ROOT:-/work/main}
ROUNDS=${ROUNDS:-2}
mkdir -p "$FINAL"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
if [ ! -e "$SRC_ROOT/tests/fixtures" ] && [ "$SRC_ROOT" != "$PWD" ]; then
  mkdir -p "$(dirname "$SRC_ROOT")" && ln -sfn "$PWD" "$SRC_ROOT"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  git log -1 --format='commit %H %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/machine.txt" >> "$OUT/summary.txt"
rc=0

if [ -z "${SKIP_TESTS:-}" ]; then
stamp "CUDA tests"
"$BUILD/tests/test_cuda" --gtest_output="json:$FINAL/test_cuda.json" > "$OUT/test_cuda.log" 2>&1 || rc=1
grep -E "^\[  FAILED|\[ info \].*(PP=|TP=)" "$OUT/test_cuda.log" | head -n 40 | tee -a "$OUT/summary.txt"
tail -n 3 "$OUT/test_cuda.log" | tee -a "$OUT/summary.txt"

stamp "one-shot tests in fresh processes"
pass=0
for i in 1 2 3 4; do
  if timeout 120 "$BUILD/tests/test_cuda" --gtest_filter='OneShotCuda.*' > "$OUT/oneshot_$i.log" 2>&1; then
    pass=$((pass + 1))
  else
    rc=1
  fi
done
echo "one-shot fresh processes: $pass / 4 passed" | tee -a "$OUT/summary.txt"

stamp "op table on the GPU"
"$BUILD/tests/test_backend_ops" --require-cuda > "$OUT/backend_ops.log" 2>&1 || rc=1
tail -n 2 "$OUT/backend_ops.log" | tee -a "$OUT/summary.txt"
fi

STRATA="$BUILD/strata"
bench() {  # label, env..., -- args
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 300 "$STRATA" bench --device cuda --model-config llama3-8b --ctx 256 \
    --batch 1,16 "$@" > "$OUT/bench_${label}_$r.log" 2>&1 || { rc=1; echo "$label failed"; }
  echo "-- $label (round $r)" >> "$OUT/summary.txt"
  grep -E "decode|batch|ms" "$OUT/bench_${label}_$r.log" | grep -v "^strata:" | tail -n 4 >> "$OUT/summary.txt"
}
for r in $(seq 1 "$ROUNDS"); do
  stamp "decode benchmarks, round $r"
  bench tp1 X=1 --
  bench tp2_fused X=1 -- --tp 2
  bench tp2_separate STRATA_NO_FUSED_ALLREDUCE=1 -- --tp 2
  bench pp2 X=1 -- --pp 2
done
stamp "done rc=$rc"
cp "$OUT/summary.txt" "$FINAL/summary.txt"
tar -czf "$FINAL/logs.tgz" -C "$OUT" .
exit $rc
