#!/usr/bin/env bash
# The GPU benchmark of issue 4, in one job: shared/bench/peer_torch.py (torch.compile + CUDA
# graphs decode, HF eager prefill, and the machine's ceilings) and `strata bench` on the same
# GPU, then scripts/bench_report.py joins them into one JSON with ratios.
#
#   PEER=/path/to/peer_torch.py COMMIT=<sha> scripts/gpu_bench.sh [build-dir]
#
# Env: MODEL (default llama3-8b), BATCH (1,16,64), CTX (256), PREFILL (1x2048,8x2048),
# QUANT (int8,fp8: extra decode runs with quantized weights), SKIP_PEER=1, OUT (results folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUILD=${1:-build-gpu}
BIN=$BUILD/strata
OUT=${OUT:-$PWD/gpu_out}
MODEL=${MODEL:-llama3-8b}
BATCH=${BATCH:-1,16,64}
CTX=${CTX:-256}
PREFILL=${PREFILL:-1x2048,8x2048}
QUANT=${QUANT:-int8,fp8}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
rc=0
if [ -z "${SKIP_PEER:-}" ] && [ -n "${PEER:-}" ]; then
  echo "== peer: $PEER"
  PYTHONUNBUFFERED=1 python3 "$PEER" --model "$MODEL" --batch "$BATCH" --ctx "$CTX" \
    --prefill "$PREFILL" --ceilings > "$OUT/peer.jsonl" 2> "$OUT/peer.err" || { rc=1; tail -n 20 "$OUT/peer.err"; }
  grep '^|' "$OUT/peer.jsonl"
fi
PEAK=$(python3 -c "import json,sys
for l in open('$OUT/peer.jsonl'):
  l=l.strip()
  if l.startswith('{'):
    r=json.loads(l)
    if r.get('what')=='hbm_read_GBps': print(r['value'])" 2>/dev/null | head -n 1)
PEAK_ARG=${PEAK:+--peak-gbps $PEAK}
echo "== strata bf16"
"$BIN" bench --device cuda --model-config "$MODEL" --batch "$BATCH" --ctx "$CTX" \
  --prefill "$PREFILL" -p 128 -r 5 $PEAK_ARG --json "$OUT/strata_bf16.json" 2>&1 | tee "$OUT/strata_bf16.txt" || rc=1
IFS=',' read -ra QS <<< "$QUANT"
for q in "${QS[@]}"; do
  [ -z "$q" ] && continue
  echo "== strata $q"
  "$BIN" bench --device cuda --model-config "$MODEL" --quantization "$q" --batch "$BATCH" \
    --ctx "$CTX" --prefill 1x2048 -p 128 -r 5 $PEAK_ARG --json "$OUT/strata_$q.json" 2>&1 | tee "$OUT/strata_$q.txt" || rc=1
done
python3 scripts/bench_report.py --out "$OUT/report.json" --gpu "$OUT/gpu.txt" \
  --commit "${COMMIT:-unknown}" --peer "$OUT/peer.jsonl" "$OUT"/strata_*.json || rc=1
exit $rc
