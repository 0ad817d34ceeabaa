#!/usr/bin/env bash
# KV-cache offload (--kv-offload, issue 11 item 3) on one GPU: offline throughput through the
# serving engine (bench-throughput, Llama-3-8B shape, random weights) at a long context where the
# device KV pool limits the batch: --num-kv-blocks 5120 (10 GiB of KV, the same on an H100 and an
# H200) holds 19 sequences of 4,160 tokens; without and with offload (a 40 GiB pinned host pool:
# 8 groups of at most 8 sequences, 64 running, --max-num-seqs). Each run prints and writes (JSON,
# $OUT) the batch reached and tokens/s; with offload also the groups and the blocks copied each
# way. On one GPU each offload step runs one group (half the device pool) and loads the next
# group's KV (~4 GiB) over PCIe, so expect fewer tokens/s than without: the gain is the batch.
#   BUILD=<dir with strata> [IN=4096 OUT_LEN=64 N=64 BLOCKS=5120 HOST_GIB=40] scripts/gpu_kv_offload.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
MODEL=${MODEL:-llama3-8b}
IN=${IN:-4096}
OUT_LEN=${OUT_LEN:-64}
N=${N:-64}
BLOCKS=${BLOCKS:-5120}
HOST_GIB=${HOST_GIB:-40}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/kv_offload_gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/kv_offload_gpu.txt"
for cfg in "no_offload:" "offload:--kv-offload --kv-host-gib $HOST_GIB"; do
  name=${cfg%%:*}; args=${cfg#*:}
  echo "== bench-throughput $MODEL $name: $N x $IN in / $OUT_LEN out, --num-kv-blocks $BLOCKS"
  # shellcheck disable=SC2086
  timeout 290 "$BUILD/strata" bench-throughput --device cuda --load-format dummy \
    --model-config "$MODEL" --num-kv-blocks "$BLOCKS" --max-num-seqs 64 \
    --num-prompts "$N" --input-len "$IN" --output-len "$OUT_LEN" --warmup 2 $args \
    --json "$OUT/kv_offload_${name}.json" > "$OUT/kv_offload_${name}.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "KV offload|Throughput|Batch reached|error" "$OUT/kv_offload_${name}.txt" | head -n 8
done
echo "== done rc=$rc"
exit $rc
