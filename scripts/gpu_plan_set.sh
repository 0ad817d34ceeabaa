#!/usr/bin/env bash
# The planner's one-GPU validation set (issue 14 item 5) in one device call: `strata plan
# --calibrate` on this GPU, then the engine measured on the configurations the cost model is
# checked against (tests/planner/data/<gpu>_measured.json is written from these files by hand):
#   decode   Llama-3-8B shape, random weights: bf16 batch 1/16/64/256 at KV 256, batch 1/16 at
#            KV 2,048 and 8,160; int8 and fp8 batch 1/16/64 at KV 256
#   prefill  bf16 1x128, 1x512, 1x2048, 1x8192, 8x2048; int8 and fp8 1x2048
#   stream   Llama-34B shape with an 8 GiB weight budget (layers streamed from pinned host
#            memory), decode batch 16 and 64 at KV 512, prefill 4x512
#   one GPU, in-process ranks sharing it (Layout::shared_device in the cost model): Llama-3-8B
#            TP = 2 and PP = 2 (decode batch 1/16/64 at KV 256, prefill 1x512 and 1x2048), and
#            Qwen3-30B-A3B EP = 2 against one rank (decode batch 1/8/64 both)
# The multi-GPU configurations come from the lent multi-GPU machines (scripts/gpu_scale_multi.sh).
#   BUILD=<dir with strata> OUT=<dir> scripts/gpu_plan_set.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu_out}/planset
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
t0=$(date +%s)
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== [$(($(date +%s) - t0))s] $name"
  timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|error|streamed" "$OUT/$name.txt" | head -n 12
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/machine.txt" 2>&1
step calibrate 150 "$BUILD/strata" plan --calibrate "$OUT/calibrated.json"
M8="--device cuda --load-format dummy --model-config llama3-8b"
step bf16_ctx256 120 "$BUILD/strata" bench $M8 --batch 1,16,64,256 --ctx 256 \
  --prefill 1x128,1x512,1x2048,1x8192,8x2048 -r 5 --json "$OUT/bf16_ctx256.json"
# KV 8,160: the 32 timed decode steps still fit the 8,192-token context; the prefill that fills
# the cache takes the context in one batch.
for c in 2048 8160; do
  step "bf16_ctx$c" 90 "$BUILD/strata" bench $M8 --batch 1,16 --ctx "$c" -r 5 \
    --json "$OUT/bf16_ctx$c.json"
done
for q in int8 fp8; do
  step "$q" 120 "$BUILD/strata" bench $M8 --quantization "$q" --batch 1,16,64 --ctx 256 \
    --prefill 1x2048 -r 5 --json "$OUT/$q.json"
done
step stream34b 200 "$BUILD/strata" bench --device cuda --load-format dummy --model-config llama-34b \
  --gpu-weight-budget 8 --batch 16,64 --ctx 512 --decode-steps 2 --prefill 4x512 -r 2 \
  --json "$OUT/stream34b.json"
B8="$M8 --batch 1,16,64 --ctx 256 --prefill 1x512,1x2048 -r 3"
step inproc_tp2 120 "$BUILD/strata" bench $B8 --tp 2 --json "$OUT/inproc_tp2.json"
step inproc_pp2 120 "$BUILD/strata" bench $B8 --pp 2 --json "$OUT/inproc_pp2.json"
MQ="--device cuda --load-format dummy --model-config qwen3-30b-a3b --quantization int8 --ctx 256 -r 3"
step qwen3_i8_ep1 150 "$BUILD/strata" bench $MQ --batch 1,8,64 --json "$OUT/qwen3_i8_ep1.json"
# Two expert-parallel ranks sharing the GPU. Batch 64 ran past 150 s on 2026-11-26, when the
# prefill's variable exchange was staged through host memory; it is now device to device.
step inproc_qwen3_i8_ep2 150 "$BUILD/strata" bench $MQ --batch 1,8,64 --ep 2 \
  --json "$OUT/inproc_qwen3_i8_ep2.json"
echo "== [$(($(date +%s) - t0))s] done rc=$rc"
exit $rc
