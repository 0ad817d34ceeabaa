#!/usr/bin/env bash
# After the fix (drain the stream before a cuBLASLt plan's first run): the TP=2 batches that hung,
# the multi-GPU tests, and the 70B TP=2 table with the collective share.
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.gpu_carry/lib
export STRATA_NCCL_LIBRARY=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))")
mkdir -p /work && ln -sfn $PWD /work/wt-core
B=.gpu_carry/bin/strata
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $(date +%T) $name"
  STRATA_COLLECTIVE_TIMEOUT=60 timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$?"
  grep -E "^\| (decode|prefill)|error|PASSED|FAILED|all_reduce|all_gather|total" "$OUT/$name.txt" | head -n 24
}
step 8b_b64_nccl 150 env STRATA_ONESHOT_MAX_BYTES=1024 $B bench --device cuda --model-config llama3-8b --tp 2 --batch 1,16,32,64 --ctx 256 -r 3
step 8b_b64_eager_nccl 150 env STRATA_ONESHOT_MAX_BYTES=1024 $B bench --device cuda --model-config llama3-8b --tp 2 --batch 64 --ctx 256 -r 3 --no-cuda-graphs
step 70b_tp2 240 $B bench --device cuda --model-config llama3-70b --tp 2 --gpu-memory-utilization 0.95 --batch 1,16,32,64 --ctx 256 --prefill 1x2048 -r 5 --json $OUT/70b_tp2.json
step 70b_tp2_profile 150 env STRATA_CUDA_PROFILE=1 $B bench --device cuda --model-config llama3-70b --tp 2 --gpu-memory-utilization 0.95 --batch 1,64 --ctx 256 -r 3
step tests 200 .gpu_carry/bin/tests/test_cuda --gtest_filter='NcclCuda.*:Fixtures/TpCuda.*:Fixtures/PpCuda.*:OneShotCuda.*'
