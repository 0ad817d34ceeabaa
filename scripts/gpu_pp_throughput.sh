#!/usr/bin/env bash
# Pipeline parallelism's generation schedule on two GPUs (issues 11 / 17), one device call:
# offline throughput through the serving engine (bench-throughput, random weights; by default
# issue 11's workload: Llama-3-8B shape, 512 requests of 512 prompt + 128 generated tokens, at most
# 64 running) on one GPU, TP = 2 and PP = 2 (one step per stage in flight; the JSON has the
# measured bubble), then the timed decode steps of `bench --pp 2` (one step at a time) for
# contrast. With four GPUs or more, TP = 4 and PP = 4 too.
#   BUILD=<dir with strata> scripts/gpu_pp_throughput.sh
#   MODEL=llama3-70b ONE_GPU_ARGS="--quantization fp8" ...   (bf16 70B does not fit one GPU)
#   N, IN_LEN, OUT_LEN, MAX_SEQS: the workload (defaults 512, 512, 128, 64)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
MODEL=${MODEL:-llama3-8b}
N=${N:-512}
IN_LEN=${IN_LEN:-512}
OUT_LEN=${OUT_LEN:-128}
MAX_SEQS=${MAX_SEQS:-64}
rc=0
NGPU=$(nvidia-smi -L | wc -l)
CFGS=("1gpu:${ONE_GPU_ARGS:-}" "tp2:--tp 2" "pp2:--pp 2")
[ "$NGPU" -ge 4 ] && CFGS+=("tp4:--tp 4" "pp4:--pp 4")
for cfg in "${CFGS[@]}"; do
  name=${cfg%%:*}; args=${cfg#*:}
  echo "== bench-throughput $MODEL $name"
  # shellcheck disable=SC2086
  timeout 300 "$BUILD/strata" bench-throughput --device cuda --load-format dummy \
    --model-config "$MODEL" $args --num-prompts "$N" --input-len "$IN_LEN" --output-len "$OUT_LEN" \
    --max-num-seqs "$MAX_SEQS" \
    --json "$OUT/throughput_${name}.json" > "$OUT/throughput_${name}.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "tok/s|tokens/s|requests/s|bubble|error" "$OUT/throughput_${name}.txt" | head -n 6
done
echo "== bench --pp 2 (one step at a time)"
timeout 200 "$BUILD/strata" bench --device cuda --model-config "$MODEL" --pp 2 --batch 1,64 \
  --ctx 256 -r 5 > "$OUT/bench_pp2.txt" 2>&1 || rc=1
grep -E "^\| decode|bubble|error" "$OUT/bench_pp2.txt"
echo "== done rc=$rc"
exit $rc
