#!/usr/bin/env bash
# The multi-GPU measurements of tensor parallelism in one device call (issue "Tensor parallelism
# on GPUs", measured on the lent 2/4/8-GPU machines), on the GPUs the machine has:
#   1. machine facts and the GPU topology (nvidia-smi topo -m)
#   2. the CUDA tests of the multi-GPU paths: NCCL in-process ranks (one GPU each) against the
#      host twin, TP = 2 / 3 / 4 fixture models across GPUs against TP = 1, the one-shot kernels,
#      the 2d / weight-gathered FFN and batch-sharded attention layouts (a GPU per rank where
#      there are enough, NCCL groups)
#   3. all-reduce latency, 1 KB - 256 MB bf16: one-shot vs NCCL, eager and in CUDA graphs, for 2
#      ranks and for every GPU (bench_allreduce), which gives the one-shot / NCCL crossover
#   4. Llama-3-8B shape: one GPU vs TP = 2 vs PP = 2 (whole and micro-batched), decode at batch
#      1 / 16 / 64 and prefill 1x2048, with the measured pipeline bubble
#   5. Llama-3-70B-shape decode (KV 256 and 2048) and prefill at TP = 2 (and TP = 4 / 8 when the
#      GPUs exist), random weights, CUDA graphs; then the same with STRATA_CUDA_PROFILE=1 (eager
#      launches, per-section times: the share of all_reduce / all_gather in a step); PP = 2
#   6. (stage "hang", not in the default set) the TP = 2 decode batches that hung, under a
#      collective deadline, with cuda-gdb host stacks if the process is still alive
# STAGES="tests allreduce 8b 70b" (the default) picks the parts, to split them over device calls.
# Ranks are threads of one strata process, one GPU each (no mpirun needed on the GPU machines).
# Logs come back in $OUT as logs.tgz plus summary.txt.
#
#   BUILD=.gpu_carry/bin scripts/gpu_multi.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FINAL=${OUT:-$PWD/gpu_out}
OUT=$(mktemp -d)
BUILD=${BUILD:-build-gpu}
SRC_ROOT=${SRC_ROOT:-/work/main}
mkdir -p "$FINAL"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
summary=()
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
# NCCL: the CUDA image carries it in the nvidia-nccl Python package.
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
if [ ! -e "$SRC_ROOT/tests/fixtures" ] && [ "$SRC_ROOT" != "$PWD" ]; then
  mkdir -p "$(dirname "$SRC_ROOT")" && ln -sfn "$PWD" "$SRC_ROOT"
fi
NGPU=$(nvidia-smi -L | wc -l)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m
  echo "NCCL library: ${STRATA_NCCL_LIBRARY:-system}"
  git log -1 --format='commit %H %s' 2>/dev/null || true
  nproc
} 2>&1 | tee "$OUT/machine.txt"
rc=0

STAGES=${STAGES:-tests allreduce 8b 70b}
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
B8="--model-config llama3-8b --batch 1,16,64 --ctx 256 --prefill 1x2048 -r 5"

if has tests; then
stamp "multi-GPU CUDA tests ($NGPU GPUs)"
"$BUILD/tests/test_cuda" --gtest_filter='NcclCuda.*:Fixtures/TpCuda.*:Fixtures/PpCuda.*:OneShotCuda.*:Fixtures/FfnLayoutCuda.*:Fixtures/AttnLayoutCuda.*' \
  > "$OUT/test_multi.log" 2>&1 || rc=1
grep -E "^\[  FAILED|\[ info \]|PASSED" "$OUT/test_multi.log" | head -n 30
summary+=("tests: $(grep -E "PASSED|FAILED  \]" "$OUT/test_multi.log" | head -n 2 | tr '\n' ' ')")
fi

if has allreduce; then
for n in 2 "$NGPU"; do
  [ "$n" -le "$NGPU" ] || continue
  stamp "all-reduce latency, $n ranks"
  "$BUILD/bench/bench_allreduce" --ranks "$n" --min 1024 --max 268435456 --oneshot-max 16777216 \
    > "$OUT/allreduce_$n.txt" 2>&1 || rc=1
  cat "$OUT/allreduce_$n.txt"
  [ "$n" = 2 ] && [ "$NGPU" = 2 ] && break
done
fi

if has 8b; then
# Llama-3-8B shape: one GPU, TP = 2, PP = 2 (whole batches), PP = 2 cut into micro-batches of 32.
for cfg in "tp1:" "tp2:--tp 2" "pp2:--pp 2" "pp2_mb32:--pp 2 --pp-micro-batch 32"; do
  name=${cfg%%:*}; args=${cfg#*:}
  stamp "llama3-8b shape, $name"
  # shellcheck disable=SC2086
  "$BUILD/strata" bench --device cuda $B8 $args --json "$OUT/8b_$name.json" \
    > "$OUT/8b_$name.txt" 2>&1 || rc=1
  grep -E "^\| (decode|prefill)|bubble|error" "$OUT/8b_$name.txt"
  summary+=("8b $name: $(grep -E "^\| (decode|prefill)" "$OUT/8b_$name.txt" | awk -F'|' '{printf "%s b%s %s ms; ", $2, $3, $5}')")
done
fi

if has 70b; then
for tp in 2 4 8; do
  [ "$tp" -le "$NGPU" ] || continue
  stamp "llama3-70b shape, TP=$tp"
  "$BUILD/strata" bench --device cuda --model-config llama3-70b --tensor-parallel-size "$tp" \
    --gpu-memory-utilization 0.97 --batch 1,16,64 --ctx 256 --prefill 1x2048 -r 5 \
    --json "$OUT/tp${tp}_70b.json" > "$OUT/tp${tp}_70b.txt" 2>&1 || rc=1
  cat "$OUT/tp${tp}_70b.txt"
  "$BUILD/strata" bench --device cuda --model-config llama3-70b --tensor-parallel-size "$tp" \
    --gpu-memory-utilization 0.97 --batch 1,64 --ctx 2048 -r 3 \
    --json "$OUT/tp${tp}_70b_ctx2048.json" > "$OUT/tp${tp}_70b_ctx2048.txt" 2>&1 || rc=1
  grep -E "^\| decode|error" "$OUT/tp${tp}_70b_ctx2048.txt"
  stamp "llama3-70b shape, TP=$tp, profiled sections (eager)"
  STRATA_CUDA_PROFILE=1 "$BUILD/strata" bench --device cuda --model-config llama3-70b \
    --tensor-parallel-size "$tp" --gpu-memory-utilization 0.97 --batch 1,64 --ctx 256 -r 3 \
    > "$OUT/tp${tp}_70b_profile.txt" 2>&1 || rc=1
  grep -E "all_reduce|all_gather|total|decode/|collective" "$OUT/tp${tp}_70b_profile.txt" | head -n 40
done
stamp "llama3-70b shape, PP=2"
"$BUILD/strata" bench --device cuda --model-config llama3-70b --pp 2 --gpu-memory-utilization 0.97 \
  --batch 1,64 --ctx 256 --prefill 1x2048 -r 3 --json "$OUT/pp2_70b.json" > "$OUT/pp2_70b.txt" 2>&1 || rc=1
grep -E "^\| (decode|prefill)|bubble|error" "$OUT/pp2_70b.txt"
fi

if has hang; then
# The decode batches that hung at TP = 2 (70B shape at batch >= 32; every all-reduce through NCCL
# for the 8B shape). STRATA_COLLECTIVE_TIMEOUT makes a stuck pass abort with an error naming the
# ranks; if the process is still alive after HANG_WAIT s, cuda-gdb dumps every host thread.
probe() {  # probe NAME CMD...
  local name=$1; shift
  stamp "hang probe: $name"
  NCCL_DEBUG=WARN STRATA_COLLECTIVE_TIMEOUT=${HANG_TIMEOUT:-60} "$@" > "$OUT/hang_$name.txt" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "${HANG_WAIT:-150}" ]; do sleep 5; waited=$((waited + 5)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "still running after ${waited}s: host stacks" | tee -a "$OUT/hang_$name.txt"
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv >> "$OUT/hang_$name.txt" 2>&1
    timeout 120 cuda-gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt 30" \
      > "$OUT/hang_${name}_stacks.txt" 2>&1
    kill -9 "$pid" 2>/dev/null; rc=1
  fi
  wait "$pid" 2>/dev/null || rc=1
  grep -E "^\| (decode|prefill)|error|NCCL WARN|still running" "$OUT/hang_$name.txt" | head -n 20
}
probe 70b_b32 "$BUILD/strata" bench --device cuda --model-config llama3-70b --tp 2 \
  --gpu-memory-utilization 0.95 --batch 32 --ctx 256 -r 3
probe 70b_b32_eager "$BUILD/strata" bench --device cuda --model-config llama3-70b --tp 2 \
  --gpu-memory-utilization 0.95 --batch 32 --ctx 256 -r 3 --no-cuda-graphs
probe 8b_b64_nccl env STRATA_ONESHOT_MAX_BYTES=1024 "$BUILD/strata" bench --device cuda \
  --model-config llama3-8b --tp 2 --batch 1,64 --ctx 256 -r 3
probe 70b_b32_noautotune env STRATA_NO_AUTOTUNE=1 "$BUILD/strata" bench --device cuda \
  --model-config llama3-70b --tp 2 --gpu-memory-utilization 0.95 --batch 32,64 --ctx 256 -r 3
fi

stamp "done (rc=$rc)"
printf '%s\n' "${summary[@]}" | tee "$FINAL/summary.txt"
tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null
exit $rc
