#!/usr/bin/env bash
# Mixture-of-experts on one GPU, in one device call (issue 12): the MoE op-table checks (CUDA
# against the CPU twins), the MoE fixture tests on CUDA, then decode / prefill speed of the
# Qwen3-30B-A3B and Mixtral-8x7B shapes (random weights) beside the peer
# (shared/bench/peer_torch_moe.py: gpt-fast's MoE with torch.compile and CUDA graphs) in the same job.
#   BUILD=<dir with strata, tests/> PEER=<path to peer_torch_moe.py> scripts/gpu_moe_check.sh
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
  grep -E "^\| (decode|prefill)|error|PASSED|FAILED|checks|passed|failed|ms/token|^  *[0-9]+ " \
    "$OUT/$name.txt" | head -n 30
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
step moe_ops 300 "$BUILD/tests/test_backend_ops" --require-cuda --filter moe
step moe_cuda 400 "$BUILD/tests/test_cuda" --gtest_filter='*CudaMoe*:*Moe*'
step qwen3_strata 300 "$BUILD/strata" bench --device cuda --model-config qwen3-30b-a3b \
  --batch 1,8,32,64 --ctx 256 --prefill 8x2048 -r 5 --json "$OUT/qwen3_strata.json"
if [ -n "${PEER:-}" ]; then
  step qwen3_peer 400 env PYTHONUNBUFFERED=1 python3 "$PEER" --model qwen3-30b-a3b \
    --batch 1,8,32,64 --ctx 256
fi
step mixtral_strata_fp8 300 "$BUILD/strata" bench --device cuda --model-config mixtral-8x7b \
  --quantization fp8 --batch 1,8 --ctx 256 -r 5 --json "$OUT/mixtral_fp8.json"
echo "== done rc=$rc"
exit $rc
