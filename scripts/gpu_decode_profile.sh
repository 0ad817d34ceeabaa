#!/usr/bin/env bash
# Where a decode step's time goes, measured with Nsight Compute: for each case (model, weights,
# batch; random weights, KV 256, CUDA graphs) the step time `strata bench` measures alone, then
# the same run under ncu with the graphs' kernels profiled as nodes (duration and DRAM bytes read
# of every kernel), summarised per kernel by scripts/ncu_decode_summary.py: the kernels' time and
# bandwidth, and what the step spends between kernels. One device call.
#   BUILD=<dir with strata> OUT=<dir> scripts/gpu_decode_profile.sh
#   CASES="llama3-8b:bf16:1 llama3-8b:int8:1" (model-config:weights:batch; default below)
# ncu profiles every kernel of the run (~1,600 for the 8B shape, ~70 s on an H100); Qwen3-30B-A3B
# (48 layers of ~15 kernels, prefill included) ran past 200 s there (2026-11-27): for such models
# profile a window of the run, e.g. NCU_WINDOW="1000 2000" (skip the first 1,000 profiled
# kernels, the prompt's pass, then profile 2,000; the summary drops the window's cut passes),
# NCU_TIMEOUT=450.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu_out}/decode_profile
BUILD=${BUILD:-build}
CASES=${CASES:-llama3-8b:bf16:1 llama3-8b:bf16:16 llama3-8b:int8:1 llama3-8b:fp8:1}
NCU_TIMEOUT=${NCU_TIMEOUT:-200}
window=()
summary_args=()
if [ -n "${NCU_WINDOW:-}" ]; then
  read -r skip count <<< "$NCU_WINDOW"
  window=(--launch-skip "$skip" --launch-count "$count")
  summary_args=(--window)
fi
mkdir -p "$OUT"
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
command -v ncu > /dev/null || { echo "gpu_decode_profile: ncu not found"; exit 1; }
t0=$(date +%s)
rc=0
for c in $CASES; do
  IFS=: read -r model weights batch <<< "$c"
  tag="${model}_${weights}_b${batch}"
  q=()
  [ "$weights" != bf16 ] && q=(--quantization "$weights")
  args=(bench --device cuda --load-format dummy --model-config "$model" "${q[@]}" --batch "$batch"
        --ctx 256)
  echo "== [$(($(date +%s) - t0))s] $tag"
  timeout 150 "$BUILD/strata" "${args[@]}" -r 3 --json "$OUT/$tag.json" > "$OUT/$tag.txt" 2>&1 ||
    { echo "bench rc=$?"; rc=1; continue; }
  ms=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0]['ms_per_step'])" "$OUT/$tag.json")
  # The random-weight fills (one kernel per tensor: thousands for a MoE model) are not profiled.
  timeout "$NCU_TIMEOUT" ncu --graph-profiling node --clock-control none "${window[@]}" \
    --kernel-name-base function --kernel-name 'regex:^(?!.*fill_random)' \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file "$OUT/$tag.ncu.csv" \
    "$BUILD/strata" "${args[@]}" -r 1 --decode-steps "${DECODE_STEPS:-2}" > "$OUT/$tag.ncu.txt" 2>&1 ||
    { echo "ncu rc=$?"; tail -n 5 "$OUT/$tag.ncu.txt"; rc=1; continue; }
  python3 scripts/ncu_decode_summary.py "$OUT/$tag.ncu.csv" --step-ms "$ms" --top 20 "${summary_args[@]}" \
    > "$OUT/$tag.summary.md" 2>&1 || rc=1
  head -n 3 "$OUT/$tag.summary.md"
  gzip -f "$OUT/$tag.ncu.csv"
done
echo "== [$(($(date +%s) - t0))s] done rc=$rc"
exit $rc
