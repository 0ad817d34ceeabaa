#!/usr/bin/env bash
# ZeRO-Inference weight streaming on one GPU, one device call (issue 13): the streaming CUDA tests
# (streamed == resident bit for bit, host and disk tiers, prefetch on and off), the pinned
# host-to-device bandwidth of this machine, then the CodeLlama-34B shape (random bf16 weights,
# 67.5 GB) under an 8 GiB GPU weight budget: bytes streamed per pass and effective GB/s.
# PEER=<peer_offload.py> adds the accelerate-offload peer (slow: minutes); NO_PREFETCH=1 adds the
# prefetch-off A/B run.
#   BUILD=<dir with strata, tests/> scripts/gpu_stream_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $name"
  timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|error|PASSED|FAILED|GB/s|stream" "$OUT/$name.txt" | head -n 20
}
step stream_tests 240 "$BUILD/tests/test_cuda" --gtest_filter='WeightStreamingCuda.*'
step h2d 60 python3 -c "
import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True); y = torch.empty_like(x, device='cuda')
for _ in range(3): y.copy_(x, non_blocking=True)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x, non_blocking=True)
torch.cuda.synchronize(); print(f'pinned host-to-device: {10 * (1 << 30) / (time.perf_counter() - t) / 1e9:.1f} GB/s')"
B34="--device cuda --model-config llama-34b --gpu-weight-budget 8 --ctx 512 --decode-steps 2"
# shellcheck disable=SC2086
step llama34b_stream 300 "$BUILD/strata" bench $B34 --batch 16,64 -r 1 --prefill 16x512 \
  --max-num-batched-tokens 16384 --json "$OUT/llama34b_stream.json"
if [ -n "${NO_PREFETCH:-}" ]; then
  # shellcheck disable=SC2086
  step llama34b_noprefetch 300 "$BUILD/strata" bench $B34 --batch 16 -r 1 --no-weight-prefetch
fi
if [ -n "${PEER:-}" ]; then
  step peer 600 env PYTHONUNBUFFERED=1 python3 "$PEER"
fi
echo "== done rc=$rc"
exit $rc
