#!/usr/bin/env bash
# Partitioned weight fetch (ZeRO-Inference Sec. VI, issue 13 item 4) on an N-GPU machine, one
# device call: the CUDA tests (replicas bit-identical to resident replicas; on N GPUs the layer
# parts' all-gather goes through NCCL), each GPU's host-to-device link alone and all GPUs at once
# (bench_h2d), then the CodeLlama-34B shape (random bf16 weights, 67.5 GB, one shared pinned host
# copy) under an 8 GiB GPU weight budget: --dp 1 against --dp N with partitioned fetch, and --dp N
# with whole-layer fetch (each replica copies every layer over its own link) as the A/B. The same
# total batch in each run (--dp N splits it among the replicas). JSON under $OUT.
# Test binaries find the fixtures through the absolute path they were built with: SRC_ROOT (the
# checkout's path on the build machine) is linked to this checkout when it does not exist here.
# STAGES picks stages (default "tests h2d bench"; "dp1": only bench's one-GPU baseline); the stage "pieces" is the A/B of the pieces a
# layer is fetched in: one --dp N run per entry of PIECES (default "1s 1 4 8"), N = --fetch-pieces,
# "1s" = one piece with the all-gathers on the copy stream (STRATA_FETCH_ONE_STREAM=1: the
# schedule before the gather stream).
#   BUILD=<dir with strata, tests/, bench/> [DP=N] [BATCH=16,64] [PREFILL=16x512] [SRC_ROOT=/work/main] \
#     [PIECES="1s 1 4 8"] scripts/gpu_partitioned_fetch.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
STAGES=${STAGES:-tests h2d bench}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then  # NCCL from PyTorch's wheel when none is installed
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
SRC_ROOT=${SRC_ROOT:-/work/main}
if [ ! -e "$SRC_ROOT/tests/fixtures" ] && [ "$SRC_ROOT" != "$PWD" ]; then
  mkdir -p "$(dirname "$SRC_ROOT")" && ln -sfn "$PWD" "$SRC_ROOT"
fi
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
DP=${DP:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "${DP:-0}" -ge 2 ] || DP=2  # one GPU: both replicas on it (the one-shot kernels gather)
BATCH=${BATCH:-16,64}
PREFILL=${PREFILL-16x512}  # empty: no prefill row
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $name"
  timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| |error|PASSED|FAILED|GB/s|replicas" "$OUT/$name.txt" | head -n 24
}
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1 || true
if has tests; then
  step fetch_tests 300 "$BUILD/tests/test_cuda" \
    --gtest_filter='PartitionedFetchCuda.*:*PartitionedFetchCudaPieces.*:WeightStreamingCuda.FixturesHostTierEqualResident'
fi
if has h2d; then
  step h2d 120 "$BUILD/bench/bench_h2d" --gpus "$DP" --json "$OUT/h2d.json"
fi
B34="--device cuda --model-config llama-34b --gpu-weight-budget 8 --ctx 512 --decode-steps 2 -r 1"
B34="$B34 --batch $BATCH --max-num-batched-tokens 16384${PREFILL:+ --prefill $PREFILL}"
if has pieces; then
  for p in ${PIECES:-1s 1 4 8}; do
    name="llama34b_dp${DP}_pieces$p"
    if [ "$p" = 1s ]; then
      # shellcheck disable=SC2086
      STRATA_FETCH_ONE_STREAM=1 step "$name" 500 "$BUILD/strata" bench $B34 --dp "$DP" \
        --fetch-pieces 1 --json "$OUT/$name.json"
    else
      # shellcheck disable=SC2086
      step "$name" 500 "$BUILD/strata" bench $B34 --dp "$DP" --fetch-pieces "$p" \
        --json "$OUT/$name.json"
    fi
  done
fi
if has bench || has dp1; then
  # shellcheck disable=SC2086
  step llama34b_dp1 400 "$BUILD/strata" bench $B34 --json "$OUT/llama34b_dp1.json"
fi
has bench || { echo "== done rc=$rc"; exit $rc; }
# shellcheck disable=SC2086
step "llama34b_dp${DP}" 500 "$BUILD/strata" bench $B34 --dp "$DP" --json "$OUT/llama34b_dp${DP}.json"
# shellcheck disable=SC2086
step "llama34b_dp${DP}_whole" 500 "$BUILD/strata" bench $B34 --dp "$DP" --no-partitioned-fetch \
  --json "$OUT/llama34b_dp${DP}_whole.json"
echo "== done rc=$rc"
exit $rc
