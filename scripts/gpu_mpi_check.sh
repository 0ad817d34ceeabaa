#!/usr/bin/env bash
# Tensor parallelism with one process per rank (mpirun) on the GPU machine, in one device call:
#   1. the CUDA IPC one-shot communicator's tests under mpirun (2 ranks; on one GPU both ranks
#      share it, with STRATA_TP_ONE_GPU=1 for strata itself)
#   2. `strata run` of a fixture model, greedy: mpirun TP = 2, PP = 2 and TP = 2 x PP = 2 must
#      print what TP = 1 prints
#   3. `strata serve` under mpirun: concurrent greedy completions equal the TP = 1 text
#   4. `strata bench` under mpirun (one GPU each when there are two or more GPUs: IPC one-shot
#      below STRATA_ONESHOT_MAX_BYTES, NCCL above), beside the in-process ranks
# SKIP_BENCH=1 stops after step 3.
# Needs a strata built with MPI and CUDA (BUILD: its build dir or a carried bin/ with tests/).
#   BUILD=.gpu_carry/bin scripts/gpu_mpi_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
NGPU=$(nvidia-smi -L | wc -l)
MPI=(mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x STRATA_NCCL_LIBRARY -x NCCL_NVLS_ENABLE)
ONE=()
[ "$NGPU" -lt 2 ] && ONE=(-x STRATA_TP_ONE_GPU=1) && export STRATA_TP_ONE_GPU=1
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $name"
  STRATA_COLLECTIVE_TIMEOUT=60 timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|error|PASSED|FAILED|SKIPPED" "$OUT/$name.txt" | head -n 12
}
step ipc_tests 180 "${MPI[@]}" "${ONE[@]}" "$BUILD/tests/test_cuda" --gtest_filter='IpcOneShotCuda.*'
M=tests/fixtures/models/llama
# Greedy text (stdout; logs go to stderr) of TP = 1 and of mpirun TP = 2 must be the same.
echo "== run tp1 / mpirun tp2"
timeout 60 "$BUILD/strata" run -m "$M" --device cuda -p "The quick brown fox" -n 24 --temp 0 \
  > "$OUT/run_tp1.out" 2> "$OUT/run_tp1.txt" || rc=1
timeout 120 "${MPI[@]}" "${ONE[@]}" "$BUILD/strata" run -m "$M" --device cuda --tp 2 \
  -p "The quick brown fox" -n 24 --temp 0 > "$OUT/run_tp2_mpi.out" 2> "$OUT/run_tp2_mpi.txt" || rc=1
grep -E "error" "$OUT/run_tp2_mpi.txt" | head -n 4
if [ -s "$OUT/run_tp1.out" ] && cmp -s "$OUT/run_tp1.out" "$OUT/run_tp2_mpi.out"; then
  echo "run: mpirun TP=2 text == TP=1 text ($(wc -c < "$OUT/run_tp1.out") bytes)"
else
  echo "run: TEXT DIFFERS"; rc=1
fi
# Pipeline stages as processes: mpirun PP = 2 (and TP = 2 x PP = 2 with 4 GPUs, or every rank
# on one GPU) must print what TP = 1 prints.
MPI4=(mpirun --allow-run-as-root -np 4 -x LD_LIBRARY_PATH -x STRATA_NCCL_LIBRARY -x NCCL_NVLS_ENABLE)
for cfg in "pp2:2:--pp 2" "tp2pp2:4:--tp 2 --pp 2"; do
  name=${cfg%%:*}; rest=${cfg#*:}; np=${rest%%:*}; args=${rest#*:}
  if [ "$np" = 4 ] && [ "$NGPU" -lt 4 ] && [ "$NGPU" -ge 2 ]; then continue; fi
  L=("${MPI[@]}"); [ "$np" = 4 ] && L=("${MPI4[@]}")
  echo "== run mpirun $name"
  # shellcheck disable=SC2086
  STRATA_COLLECTIVE_TIMEOUT=60 timeout 180 "${L[@]}" "${ONE[@]}" "$BUILD/strata" run -m "$M" \
    --device cuda $args -p "The quick brown fox" -n 24 --temp 0 > "$OUT/run_${name}_mpi.out" \
    2> "$OUT/run_${name}_mpi.txt" || rc=1
  grep -E "error" "$OUT/run_${name}_mpi.txt" | head -n 4
  if [ -s "$OUT/run_tp1.out" ] && cmp -s "$OUT/run_tp1.out" "$OUT/run_${name}_mpi.out"; then
    echo "run: mpirun $name text == TP=1 text"
  else
    echo "run: $name TEXT DIFFERS"; rc=1
  fi
done
# A tensor-parallel server under mpirun: 8 concurrent greedy completions must each print what
# `strata run` printed at TP = 1.
echo "== mpirun serve"
"${MPI[@]}" "${ONE[@]}" "$BUILD/strata" serve -m "$M" --device cuda --tp 2 --port 8077 \
  > "$OUT/serve.txt" 2>&1 &
spid=$!
for _ in $(seq 90); do curl -sf http://127.0.0.1:8077/health > /dev/null 2>&1 && break; sleep 1; done
python3 - "$OUT/run_tp1.out" <<'PY' || rc=1
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
want = open(sys.argv[1], encoding="utf-8", errors="replace").read().rstrip("\n")
model = json.load(urllib.request.urlopen("http://127.0.0.1:8077/v1/models", timeout=30))["data"][0]["id"]
def one(_):
    body = json.dumps({"model": model, "prompt": "The quick brown fox", "max_tokens": 24,
                       "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:8077/v1/completions", body,
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]
with ThreadPoolExecutor(8) as ex:
    got = list(ex.map(one, range(8)))
same = sum(g == want for g in got)
print(f"serve: {same}/8 concurrent completions == TP=1 run text")
if same != 8:
    print("want", repr(want)); print("got ", [repr(g) for g in got[:2]]); sys.exit(1)
PY
kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
if [ -n "${SKIP_BENCH:-}" ]; then echo "== done rc=$rc (benchmarks skipped)"; exit $rc; fi
CFG=llama3-8b; [ "$NGPU" -lt 2 ] && CFG=llama3.2-1b
step bench_mpi 240 "${MPI[@]}" "${ONE[@]}" "$BUILD/strata" bench --device cuda --model-config "$CFG" \
  --tp 2 --batch 1,16,64 --ctx 256 -r 5
step bench_inproc 240 "$BUILD/strata" bench --device cuda --model-config "$CFG" --tp 2 \
  --batch 1,16,64 --ctx 256 -r 5
echo "== done rc=$rc"
exit $rc
