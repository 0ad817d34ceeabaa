#!/usr/bin/env bash
# Serving numbers of issue 5 on the GPU machine, in one job: offline throughput (bf16 and fp8
# weights; 1,000 requests of 128 in / 128 out, `strata bench-throughput`), then `strata serve`
# with `strata bench-serve` at 8 requests/s Poisson for the TPOT percentiles. Results (JSON and
# logs) go to $OUT. Usage: scripts/gpu_serve_bench.sh [build-dir]
# Env: MODEL (llama3-8b), PROMPTS (1000), RATE_PROMPTS (400), QUANT (fp8), SEQS (256).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${1:-build-gpu}/strata
OUT=${OUT:-$PWD/gpu_out}
MODEL=${MODEL:-llama3-8b}
SEQS=${SEQS:-256}
mkdir -p "$OUT"
rc=0
for q in none ${QUANT-fp8}; do
  echo "== bench-throughput ($q)"
  "$BIN" bench-throughput --device cuda --model-config "$MODEL" --quantization "$q" \
    --num-prompts "${PROMPTS:-1000}" --input-len 128 --output-len 128 --max-num-seqs "$SEQS" \
    --max-num-batched-tokens 8192 --json "$OUT/throughput_$q.json" 2>&1 | tee "$OUT/throughput_$q.txt" || rc=1
done
if [ -z "${SKIP_SERVE:-}" ]; then
  echo "== serve + bench-serve at 8 req/s"
  PORT=18123
  "$BIN" serve --device cuda --model-config "$MODEL" -m "$MODEL" --port $PORT -c 2048 \
    --max-num-seqs "$SEQS" --max-num-batched-tokens 2048 > "$OUT/serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 1
  done
  "$BIN" bench-serve --port $PORT --num-prompts "${RATE_PROMPTS:-400}" --request-rate 8 \
    --input-len 128 --output-len 128 --json "$OUT/serve_rate8.json" 2>&1 | tee "$OUT/serve_rate8.txt" || rc=1
  kill -TERM $SERVER 2>/dev/null
  wait $SERVER
  tail -n 5 "$OUT/serve.log"
fi
exit $rc
