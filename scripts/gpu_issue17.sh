#!/usr/bin/env bash
# Issue 17 on a two-GPU machine (nvidia-h200-x2), every item in one script; STAGES splits it over
# device calls (default: all, about 15 minutes on two H200s; "coll tp moe" and "pp fetch plan"
# each fit one 10-minute call). Ranks are threads of one strata process, one GPU each; random
# weights (--load-format dummy), CUDA graphs on. One JSON per measurement under $OUT/<stage>/,
# the text beside it, and $OUT/summary.txt.
#   coll   1. all-reduce, bf16, 1 KB - 256 MB: one-shot vs NCCL, eager / one per graph / 16 per
#             graph; the one-shot all-reduce fused with the residual add + RMSNorm; point to point
#             rank 1 -> 0 (NCCL send/recv, cudaMemcpyPeer) (bench_allreduce --json); the expert
#             exchange, dispatch + combine, 1-128 tokens per GPU, hidden 7,168, top-8 of 256: the
#             engine's fused kernels with bf16 outputs back, with f32 back, NCCL variable splits
#   tp     2. Llama-3-70B shape TP = 2, batch 1 / 16 / 64 at KV 256 (+ prefill 1 x 2,048) and
#             at KV 2,048; the collectives' share of a step (STRATA_CUDA_PROFILE=1, eager);
#             Llama-3-8B one GPU vs TP = 2; `strata serve --tp 2` + `strata bench-serve`
#   moe    4. Mixtral-8x7B shape bf16 EP = 2 vs TP = 2 (expert slicing) at batch 1 / 8 (and
#             Qwen3-30B-A3B, the same layouts)
#   pp     3. offline throughput, 256 requests of 512 in / 128 out, up to 64 running: Llama-3-8B
#             one GPU / TP = 2 / PP = 2 and Llama-3-70B TP = 2 / PP = 2, with the bubble; the
#             decode steps of `bench --pp 2` for both shapes (the planner set's points)
#   fetch  5. partitioned weight fetch (scripts/gpu_partitioned_fetch.sh, DP = 2): each link
#             alone and both at once (bench_h2d), CodeLlama-34B shape with an 8 GiB budget
#   plan   6. `strata plan --calibrate`, then the planner's ranking of the measured layouts
#             (predicted vs measured: scripts/planset_update.py on tests/planner/data/
#             h200x2_measured.json with this run's tp / moe / pp files)
#   BUILD=<dir with strata, tests/, bench/> OUT=<dir> [STAGES="coll tp"] scripts/gpu_issue17.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu_out}
BUILD=${BUILD:-build-gpu}
STAGES=${STAGES:-coll tp moe pp fetch plan}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
N=$(nvidia-smi -L | wc -l)
if [ "$N" -lt 2 ]; then
  echo "gpu_issue17.sh: needs two GPUs, this machine has $N" >&2
  exit 2
fi
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
t0=$(date +%s)
rc=0
step() {  # step DIR NAME LIMIT CMD...
  local dir=$1 name=$2 lim=$3; shift 3
  mkdir -p "$OUT/$dir"
  echo "== [$(($(date +%s) - t0))s] $dir/$name"
  timeout "$lim" "$@" > "$OUT/$dir/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|tok/s|bubble|error|^ +[0-9]+ +[0-9]+ " "$OUT/$dir/$name.txt" | head -n 20
}
# A bench_moe_all_to_all table as JSON (it prints text only): the '#' lines, then one record per
# row keyed by the column header.
a2a_json() {  # a2a_json TXT JSON
  python3 - "$1" "$2" <<'EOF'
import json, sys
rows, head, cols = [], "", []
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("#"):
        head += line[1:].strip() + " "
    elif f and f[0] == "tokens":
        cols = f
    elif cols and len(f) == len(cols) and f[0].isdigit():
        rows.append({c: float(v) for c, v in zip(cols, f)})
json.dump({"bench": "bench_moe_all_to_all", "setup": head.strip(), "rows": rows},
          open(sys.argv[2], "w"), indent=1)
EOF
}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi topo -m
  echo "NCCL library: ${STRATA_NCCL_LIBRARY:-system}"
  nproc
} > "$OUT/machine.txt" 2>&1

if has coll; then
  step coll allreduce 240 "$BUILD/bench/bench_allreduce" --ranks 2 --min 1024 --max 268435456 \
    --per-graph 16 --json "$OUT/coll/allreduce.json"
  cat "$OUT/coll/allreduce.txt"
  for cfg in "fused_bf16:--transport fused --combine-dtype bf16" \
             "fused_f32:--transport fused --combine-dtype f32" "nccl:--transport nccl"; do
    name=${cfg%%:*}; args=${cfg#*:}
    # shellcheck disable=SC2086
    step coll "a2a_$name" 120 "$BUILD/bench/bench_moe_all_to_all" --device cuda --ranks 2 $args \
      --iters 50
    a2a_json "$OUT/coll/a2a_$name.txt" "$OUT/coll/a2a_$name.json"
  done
fi

if has tp; then
  D="--device cuda --load-format dummy"
  step tp 70b_tp2_ctx256 200 "$BUILD/strata" bench $D --model-config llama3-70b --tp 2 \
    --gpu-memory-utilization 0.97 --batch 1,16,64 --ctx 256 --prefill 1x2048 -r 5 \
    --json "$OUT/tp/70b_tp2_ctx256.json"
  step tp 70b_tp2_ctx2048 200 "$BUILD/strata" bench $D --model-config llama3-70b --tp 2 \
    --gpu-memory-utilization 0.97 --batch 1,16,64 --ctx 2048 -r 3 \
    --json "$OUT/tp/70b_tp2_ctx2048.json"
  step tp 70b_tp2_profile 200 env STRATA_CUDA_PROFILE=1 "$BUILD/strata" bench $D \
    --model-config llama3-70b --tp 2 --gpu-memory-utilization 0.97 --batch 1,64 --ctx 256 -r 3
  grep -E "section|all_reduce|all_gather" "$OUT/tp/70b_tp2_profile.txt" | head -n 12
  for cfg in "8b_1gpu:" "8b_tp2:--tp 2"; do
    name=${cfg%%:*}; args=${cfg#*:}
    # shellcheck disable=SC2086
    step tp "$name" 150 "$BUILD/strata" bench $D --model-config llama3-8b $args \
      --batch 1,16,64 --ctx 256 --prefill 1x2048 -r 5 --json "$OUT/tp/$name.json"
  done
  # The tensor-parallel server under load: 200 requests at 8 req/s, 128 in / 128 out.
  mkdir -p "$OUT/tp"
  echo "== [$(($(date +%s) - t0))s] tp/serve_tp2"
  PORT=18127
  "$BUILD/strata" serve $D --model-config llama3-8b -m llama3-8b --tp 2 --port $PORT -c 2048 \
    --max-num-seqs 64 > "$OUT/tp/serve_tp2.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 1
  done
  timeout 120 "$BUILD/strata" bench-serve --port $PORT --num-prompts 200 --request-rate 8 \
    --input-len 128 --output-len 128 --json "$OUT/tp/serve_tp2_rate8.json" \
    > "$OUT/tp/serve_tp2_rate8.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  tail -n 12 "$OUT/tp/serve_tp2_rate8.txt"
  kill -TERM $SERVER 2>/dev/null
  wait $SERVER
fi

if has moe; then
  D="--device cuda --load-format dummy"
  for m in mixtral qwen3; do
    cfgname=mixtral-8x7b
    [ $m = qwen3 ] && cfgname=qwen3-30b-a3b
    for cfg in "tp2:--tp 2" "ep2:--ep 2"; do
      name=${cfg%%:*}; args=${cfg#*:}
      # shellcheck disable=SC2086
      step moe "${m}_$name" 150 "$BUILD/strata" bench $D --model-config $cfgname $args \
        --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/moe/${m}_$name.json"
    done
  done
fi

if has pp; then
  D="--device cuda --load-format dummy"
  W="--num-prompts ${PROMPTS:-256} --input-len 512 --output-len 128 --max-num-seqs 64"
  for cfg in "8b:tput_8b_1gpu:" "8b:tput_8b_tp2:--tp 2" "8b:tput_8b_pp2:--pp 2" \
             "70b:tput_70b_tp2:--tp 2" "70b:tput_70b_pp2:--pp 2"; do
    m=llama3-${cfg%%:*}; rest=${cfg#*:}; name=${rest%%:*}; args=${rest#*:}
    # shellcheck disable=SC2086
    step pp "$name" 240 "$BUILD/strata" bench-throughput $D --model-config "$m" $args $W \
      --gpu-memory-utilization 0.95 --json "$OUT/pp/$name.json"
  done
  step pp 8b_pp2 150 "$BUILD/strata" bench $D --model-config llama3-8b --pp 2 \
    --batch 1,16,64 --ctx 256 --prefill 1x2048 -r 5 --json "$OUT/pp/8b_pp2.json"
  step pp 70b_pp2 200 "$BUILD/strata" bench $D --model-config llama3-70b --pp 2 \
    --gpu-memory-utilization 0.97 --batch 1,64 --ctx 256 -r 3 --json "$OUT/pp/70b_pp2.json"
fi

if has fetch; then
  mkdir -p "$OUT/fetch"
  echo "== [$(($(date +%s) - t0))s] fetch: partitioned weight fetch, DP = 2"
  OUT="$OUT/fetch" DP=2 BATCH=16 STAGES="h2d bench" BUILD=$BUILD \
    timeout 420 scripts/gpu_partitioned_fetch.sh || rc=1
fi

if has plan; then
  step plan calibrate 240 "$BUILD/strata" plan --calibrate "$OUT/plan/h200x2_calibrated.json"
  for w in "llama3-70b:prompt=256,gen=32,batch=1" "llama3-70b:prompt=512,gen=128,batch=64" \
           "llama3-8b:prompt=512,gen=128,batch=64" "mixtral-8x7b:prompt=256,gen=32,batch=1" \
           "mixtral-8x7b:prompt=256,gen=32,batch=8"; do
    m=${w%%:*}; wl=${w#*:}; b=${wl##*batch=}
    for prof in h200 "$OUT/plan/h200x2_calibrated.json"; do
      [ -f "$prof" ] || [ "$prof" = h200 ] || continue
      tag=shipped
      [ "$prof" = h200 ] || tag=calibrated
      step plan "plan_${m}_b${b}_$tag" 60 "$BUILD/strata" plan --model-config "$m" --gpus 2 \
        --profile "$prof" --workload "$wl" --top 0
      "$BUILD/strata" plan --model-config "$m" --gpus 2 --profile "$prof" --workload "$wl" \
        --top 0 --json > "$OUT/plan/plan_${m}_b${b}_$tag.json" 2>/dev/null
    done
  done
fi

echo "== [$(($(date +%s) - t0))s] done (rc=$rc)"
exit $rc
