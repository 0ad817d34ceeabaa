#!/usr/bin/env bash
# Issue 18 on the GPUs the machine has (4 or 8), the parts not in gpu_tp_scaling.sh; one stage
# per device call if need be (STAGES, default "moe plan pptp fetch"):
#   moe   expert parallelism: the all-to-all dispatch + combine at 1..128 tokens per GPU over all
#         GPUs (fixed-capacity one-shot vs NCCL, hidden 7,168, top-8, 256 experts), then the
#         Mixtral-8x7B and Qwen3-30B-A3B shapes (bf16, random weights, KV 256) decode at batch
#         1 / 8 / 64 with EP = N, TP = N and TP = 2 x EP = N/2
#   plan  plan --calibrate over all GPUs, then the planner's ranking for the measured cases
#   pptp  Llama-3-70B shape, offline throughput through the serving engine (512 in / 128 out,
#         up to 128 sequences running): TP = N, TP = 2 x PP = N/2, PP = N, with the bubble
#   fetch partitioned weight fetch across all GPUs (scripts/gpu_partitioned_fetch.sh, DP = N)
#   counted (not in the default set) the counted expert exchange: EP tests, the all-to-all bench
#         per transport, EP = N and TP = 2 x EP = N/2 decode, EP = N with whole blocks (A/B)
#   fused (not in the default set) the fused expert exchange (two kernels; model/moe_ep.h): the
#         EP tests, the all-to-all bench fused / counted / NCCL (and fused with bf16 outputs
#         back, --combine-dtype bf16), EP = N decode fused against
#         STRATA_MOE_EP_NO_FUSED=1, TP = 2 x EP = N/2 fused
#   recheck (not in the default set) the runs that stopped on 4 x H200 (2026-11-26), after their
#         fixes: TP = 2 x PP = N/2 throughput (StageGate), TP = 2 x EP = N/2 and EP = N decode at
#         batch 1 / 8 / 64 (branch epnccl: NCCL expert groups, the first-use barrier)
#   layouts (not in the default set) issue 18 item 2 on N GPUs: the FFN / attention layout tests
#         across the GPUs; Llama-3-70B shape TP = N decode at batch 1..256 with --ffn-layout 1d / 2d,
#         prefill 8 x 2,048 and 64 x 2,048 with 1d (weight-stationary) / weight-gathered;
#         Llama-3-8B shape TP = N at KV 4,096 with head-sharded (graphs and eager) / batch-sharded
#         attention; plan --calibrate over all GPUs (the planner's predictions are made from it
#         afterwards, tests/planner/data/)
#   pair  (not in the default set) two of the GPUs: the all-reduce inside a graph of 16 and the
#         fused all-reduce + norm (bench_allreduce --per-graph 16), Llama-3-70B TP = 2 at KV 2,048
#         (does the process exit?), and the same all-reduce table over all N GPUs
#   diag  (not in the default set) TP = 2 x PP = 2 and TP = 2 x EP = 2, which stopped on four GPUs:
#         each with and without CUDA graphs and other switches, under a short collective deadline;
#         a process still alive after DIAG_WAIT s gets its host stacks dumped by cuda-gdb
# Ranks are threads of one strata process, one GPU each. Results in $OUT/<stage>/.
#   BUILD=<dir with strata, tests/, bench/> scripts/gpu_scale_multi.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu_out}
BUILD=${BUILD:-build-gpu}
STAGES=${STAGES:-moe plan pptp fetch}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
N=$(nvidia-smi -L | wc -l)
H=$((N / 2))
t0=$(date +%s)
rc=0
step() {  # step DIR NAME LIMIT CMD...
  local dir=$1 name=$2 lim=$3; shift 3
  mkdir -p "$OUT/$dir"
  echo "== [$(($(date +%s) - t0))s] $dir/$name"
  timeout "$lim" "$@" > "$OUT/$dir/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|per_s|tok/s|bubble|error|^ +[0-9]+ +[0-9]+ " "$OUT/$dir/$name.txt" | head -n 14
}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; } \
  > "$OUT/machine.txt" 2>&1

if has moe; then
  for t in fused oneshot nccl; do
    step moe "a2a_$t" 120 "$BUILD/bench/bench_moe_all_to_all" --device cuda --ranks "$N" \
      --transport "$t" --iters 50
  done
  for m in mixtral-8x7b qwen3-30b-a3b; do
    for cfg in "ep$N:--ep $N" "tp$N:--tp $N" "tp2_ep$H:--tp 2 --ep $H"; do
      name=${cfg%%:*}; args=${cfg#*:}
      # shellcheck disable=SC2086
      step moe "${m}_$name" 150 "$BUILD/strata" bench --device cuda --model-config "$m" $args \
        --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/moe/${m}_$name.json"
    done
  done
fi

if has counted; then
  # The counted expert exchange (only the routed rows move; whole blocks before): the
  # all-to-all bench for each transport, the EP tests repeated, EP decode counted vs whole blocks.
  step counted tests 200 "$BUILD/tests/test_cuda" --gtest_filter='EpFixedCuda.*:EpCuda.*:Layouts/EpFixedGraphCuda.*' \
    --gtest_repeat=3
  for t in counted oneshot nccl; do
    step counted "a2a_$t" 100 "$BUILD/bench/bench_moe_all_to_all" --device cuda --ranks "$N" \
      --transport "$t" --iters 50
  done
  for m in mixtral-8x7b qwen3-30b-a3b; do
    for cfg in "ep$N:--ep $N" "tp2_ep$H:--tp 2 --ep $H"; do
      name=${cfg%%:*}; args=${cfg#*:}
      # shellcheck disable=SC2086
      step counted "${m}_$name" 100 "$BUILD/strata" bench --device cuda --model-config "$m" $args \
        --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/counted/${m}_$name.json"
    done
  done
  step counted "mixtral-8x7b_ep${N}_whole" 100 env STRATA_MOE_EP_NO_COUNTED=1 "$BUILD/strata" bench \
    --device cuda --model-config mixtral-8x7b --ep "$N" --batch 1,8,64 --ctx 256 -r 5 \
    --json "$OUT/counted/mixtral-8x7b_ep${N}_whole.json"
fi

if has fused; then
  step fused tests 200 "$BUILD/tests/test_cuda" --gtest_filter='EpFixedCuda.*:EpCuda.*:Layouts/EpFixedGraphCuda.*'
  for t in fused counted nccl; do
    step fused "a2a_$t" 100 "$BUILD/bench/bench_moe_all_to_all" --device cuda --ranks "$N" \
      --transport "$t" --iters 50
  done
  # What bf16 expert outputs would save (the engine sends f32 back today).
  step fused a2a_fused_bf16_back 100 "$BUILD/bench/bench_moe_all_to_all" --device cuda \
    --ranks "$N" --transport fused --iters 50 --combine-dtype bf16
  for m in mixtral-8x7b qwen3-30b-a3b; do
    step fused "${m}_ep$N" 100 "$BUILD/strata" bench --device cuda --model-config "$m" --ep "$N" \
      --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/fused/${m}_ep$N.json"
    step fused "${m}_ep${N}_composed" 100 env STRATA_MOE_EP_NO_FUSED=1 "$BUILD/strata" bench \
      --device cuda --model-config "$m" --ep "$N" --batch 1,8,64 --ctx 256 -r 5 \
      --json "$OUT/fused/${m}_ep${N}_composed.json"
    step fused "${m}_tp2_ep$H" 100 "$BUILD/strata" bench --device cuda --model-config "$m" --tp 2 \
      --ep "$H" --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/fused/${m}_tp2_ep$H.json"
  done
fi

if has plan; then
  step plan calibrate 200 "$BUILD/strata" plan --calibrate "$OUT/plan/h200x${N}_calibrated.json"
  prof="$OUT/plan/h200x${N}_calibrated.json"
  [ -f "$prof" ] || prof=h200
  for w in "mixtral-8x7b:prompt=256,gen=64,batch=8" "qwen3-30b-a3b:prompt=256,gen=64,batch=8" \
           "llama3-70b:prompt=512,gen=128,batch=128"; do
    m=${w%%:*}; wl=${w#*:}
    step plan "plan_$m" 60 "$BUILD/strata" plan --model-config "$m" --gpus "$N" --profile "$prof" \
      --workload "$wl" --top 0
    "$BUILD/strata" plan --model-config "$m" --gpus "$N" --profile "$prof" --workload "$wl" \
      --top 0 --json > "$OUT/plan/plan_$m.json" 2>/dev/null
  done
fi

if has layouts; then
  export STRATA_COLLECTIVE_TIMEOUT=${STRATA_COLLECTIVE_TIMEOUT:-60}
  step layouts tests 240 "$BUILD/tests/test_cuda" \
    --gtest_filter='Fixtures/FfnLayoutCuda.*:Fixtures/AttnLayoutCuda.*:OneShotCuda.*'
  grep -E "OK \]|FAILED  \]|\[ info \]" "$OUT/layouts/tests.txt" | head -n 30
  M70="--device cuda --load-format dummy --model-config llama3-70b --tp $N"
  for l in 1d 2d; do
    # shellcheck disable=SC2086
    step layouts "70b_decode_$l" 200 "$BUILD/strata" bench $M70 --ffn-layout "$l" \
      --batch 1,16,64,256 --ctx 256 -r 3 --json "$OUT/layouts/70b_decode_$l.json"
  done
  for l in 1d weight-gathered; do
    # shellcheck disable=SC2086
    step layouts "70b_prefill_$l" 200 "$BUILD/strata" bench $M70 --ffn-layout "$l" \
      --prefill 8x2048,64x2048 -r 2 --json "$OUT/layouts/70b_prefill_$l.json"
  done
  M8="--device cuda --load-format dummy --model-config llama3-8b --tp $N --batch 1,16,64 --ctx 4096"
  for cfg in "head:--attn-layout head-sharded" "head_eager:--attn-layout head-sharded --no-cuda-graphs" \
             "batch:--attn-layout batch-sharded"; do
    name=${cfg%%:*}; args=${cfg#*:}
    # shellcheck disable=SC2086
    step layouts "8b_attn_$name" 150 "$BUILD/strata" bench $M8 $args -r 3 \
      --json "$OUT/layouts/8b_attn_$name.json"
  done
  step layouts calibrate 200 "$BUILD/strata" plan --calibrate "$OUT/layouts/h200x${N}_calibrated.json"
fi

if has pair; then
  for n in 2 "$N"; do
    step pair "allreduce_$n" 150 "$BUILD/bench/bench_allreduce" --ranks "$n" --per-graph 16
  done
  s=$(date +%s)
  step pair 70b_tp2_ctx2048 240 env CUDA_VISIBLE_DEVICES=0,1 "$BUILD/strata" bench --device cuda \
    --load-format dummy --model-config llama3-70b --tp 2 --batch 1,16,64 --ctx 2048 -r 3 \
    --json "$OUT/pair/70b_tp2_ctx2048.json"
  echo "70b_tp2_ctx2048: $(($(date +%s) - s)) s from start to exit" | tee -a "$OUT/pair/70b_tp2_ctx2048.txt"
fi

if has recheck; then
  # shellcheck disable=SC2086
  step recheck "70b_tp2_pp$H" 150 "$BUILD/strata" bench-throughput --device cuda --load-format dummy \
    --model-config llama3-70b --tp 2 --pp "$H" --num-prompts 256 --input-len 512 --output-len 128 \
    --max-num-seqs 128 --json "$OUT/recheck/70b_tp2_pp$H.json"
  for m in mixtral-8x7b qwen3-30b-a3b; do
    for cfg in "tp2_ep$H:--tp 2 --ep $H" "ep$N:--ep $N"; do
      name=${cfg%%:*}; args=${cfg#*:}
      # shellcheck disable=SC2086
      step recheck "${m}_$name" 105 "$BUILD/strata" bench --device cuda --model-config "$m" $args \
        --batch 1,8,64 --ctx 256 -r 5 --json "$OUT/recheck/${m}_$name.json"
    done
  done
fi

if has pptp; then
  W="--num-prompts ${PROMPTS:-256} --input-len 512 --output-len 128 --max-num-seqs 128"
  for cfg in "tp$N:--tp $N" "tp2_pp$H:--tp 2 --pp $H" "pp$N:--pp $N"; do
    name=${cfg%%:*}; args=${cfg#*:}
    # shellcheck disable=SC2086
    step pptp "70b_$name" 200 "$BUILD/strata" bench-throughput --device cuda --load-format dummy \
      --model-config llama3-70b $args $W --json "$OUT/pptp/70b_$name.json"
  done
fi

if has fetch; then
  mkdir -p "$OUT/fetch"
  echo "== [$(($(date +%s) - t0))s] partitioned fetch, DP = $N"
  OUT="$OUT/fetch" DP=$N BATCH=${FETCH_BATCH:-16} STAGES="h2d bench" BUILD=$BUILD \
    scripts/gpu_partitioned_fetch.sh || rc=1
fi
diag() {  # diag NAME CMD...: runs CMD; alive after DIAG_WAIT s: host stacks, then killed
  local name=$1; shift
  mkdir -p "$OUT/diag"
  echo "== [$(($(date +%s) - t0))s] diag/$name"
  "$@" > "$OUT/diag/$name.txt" 2>&1 &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "${DIAG_WAIT:-45}" ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "still running after $waited s: host stacks"
    timeout 90 cuda-gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt 25" \
      > "$OUT/diag/${name}_stacks.txt" 2>&1
    kill -9 "$pid" 2>/dev/null
    rc=1
  fi
  wait "$pid" 2>/dev/null
  grep -E "^\| (decode|prefill)|error" "$OUT/diag/$name.txt" | head -n 8
}
if has diag; then
  export STRATA_COLLECTIVE_TIMEOUT=15
  PP8="--device cuda --model-config llama3-8b --tp 2 --pp $H --batch 1,8 --ctx 256 -r 2"
  # shellcheck disable=SC2086
  diag tp2_pp_graphs "$BUILD/strata" bench $PP8
  # shellcheck disable=SC2086
  diag tp2_pp_eager "$BUILD/strata" bench $PP8 --no-cuda-graphs
  # shellcheck disable=SC2086
  diag tp2_pp_nofuse env STRATA_NO_FUSED_ALLREDUCE=1 "$BUILD/strata" bench $PP8
  EP="--device cuda --model-config mixtral-8x7b --tp 2 --ep $H --batch 8 --ctx 256 -r 2"
  # shellcheck disable=SC2086
  diag tp2_ep_graphs "$BUILD/strata" bench $EP
  # shellcheck disable=SC2086
  diag tp2_ep_eager "$BUILD/strata" bench $EP --no-cuda-graphs
  # shellcheck disable=SC2086
  diag tp2_ep_variable env STRATA_MOE_EP_FIXED_TOKENS=0 "$BUILD/strata" bench $EP
  # shellcheck disable=SC2086
  diag tp2_ep_nofuse env STRATA_NO_FUSED_ALLREDUCE=1 "$BUILD/strata" bench $EP
fi
if has diag2; then  # the two runs that stopped in the moe and pptp stages, as they were run
  DIAG_WAIT=100 diag mixtral_tp2_ep_b1_8_64 "$BUILD/strata" bench --device cuda --model-config mixtral-8x7b \
    --tp 2 --ep "$H" --batch 1,8,64 --ctx 256 -r 5
  DIAG_WAIT=150 diag 70b_tp2_pp_tput "$BUILD/strata" bench-throughput --device cuda --load-format dummy \
    --model-config llama3-70b --tp 2 --pp "$H" --num-prompts 256 --input-len 512 --output-len 128 \
    --max-num-seqs 128
fi
if has diag3; then  # is it lazy kernel loading (cuLibraryLoadData waits for every GPU to idle)?
  TP8="--device cuda --load-format dummy --model-config llama3-8b --tp 2 --pp $H --num-prompts 256"
  TP8="$TP8 --input-len 512 --output-len 128 --max-num-seqs 128"
  # shellcheck disable=SC2086
  DIAG_WAIT=60 diag 8b_tp2_pp_tput "$BUILD/strata" bench-throughput $TP8
  # shellcheck disable=SC2086
  DIAG_WAIT=60 diag 8b_tp2_pp_tput_eager env CUDA_MODULE_LOADING=EAGER "$BUILD/strata" bench-throughput $TP8
  DIAG_WAIT=70 diag mixtral_tp2_ep_eager_loading env CUDA_MODULE_LOADING=EAGER "$BUILD/strata" bench \
    --device cuda --model-config mixtral-8x7b --tp 2 --ep "$H" --batch 1,8,64 --ctx 256 -r 5
fi
echo "== [$(($(date +%s) - t0))s] done rc=$rc"
exit $rc
