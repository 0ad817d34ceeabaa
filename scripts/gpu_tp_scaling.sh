#!/usr/bin/env bash
# Tensor-parallel scaling of the Llama-3-70B shape (issue 18, item 1), one device call on the
# GPUs the machine has (TP = 2 / 4 / 8 as far as they go):
#   1. the HBM read bandwidth of one GPU (a bf16 sum over 2 GiB, torch), the weight-read ceiling
#   2. TP = 1 with 8-bit weights (fp8 and int8: 70 GB, fits one H200), decode batch 1 and 64
#   3. TP = N, bf16: decode batch 1 and 64 at KV 256, prefill 1x2048; % of the N-GPU read ceiling
#   4. the same decode batches with STRATA_CUDA_PROFILE=1 (eager launches, event-timed sections),
#      batch 1 and 64 apart: the all-reduce share of a step
#   5. summary.md: ms/token, % of the weight-read floor, all-reduce ms, and the goal of item 1
#      (batch 1 <= 1.5 x the per-GPU weight-read floor + the measured all-reduce time)
# Random weights (--load-format dummy); CUDA graphs on in 2-3.
#   BUILD=<dir with strata> TPS="2 4" scripts/gpu_tp_scaling.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/gpu_out}/tp-scaling
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
if [ -d .gpu_carry/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu_carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${STRATA_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export STRATA_NCCL_LIBRARY="$lib"
fi
NGPU=$(nvidia-smi -L | wc -l)
TPS=${TPS:-2 4 8}
MODEL=${MODEL:-llama3-70b}
rc=0
step() {  # step NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  echo "== $(date +%T) $name"
  timeout "$lim" "$@" > "$OUT/$name.txt" 2>&1 || { echo "rc=$?"; rc=1; }
  grep -E "^\| (decode|prefill)|decode/all_reduce|error" "$OUT/$name.txt" | head -n 12
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
nvidia-smi topo -m >> "$OUT/machine.txt" 2>&1
python3 - > "$OUT/hbm_read.txt" 2>&1 <<'PY'
import torch
x = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
for _ in range(3): x.sum(dtype=torch.float32)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): x.sum(dtype=torch.float32)
e.record(); torch.cuda.synchronize()
print(round(x.numel() * 2 * 20 / (s.elapsed_time(e) / 1e3) / 1e9))
PY
READ=$(tail -n 1 "$OUT/hbm_read.txt")
case "$READ" in ''|*[!0-9]*) echo "HBM read not measured: $(cat "$OUT/hbm_read.txt")"; READ=0;; esac
echo "HBM read, one GPU: $READ GB/s"
PEAK=(); [ "$READ" -gt 0 ] && PEAK=(--peak-gbps "$READ")
COMMON=(--device cuda --model-config "$MODEL" --gpu-memory-utilization 0.95 --ctx 256)
for q in fp8 int8; do
  step "tp1_$q" 300 "$BUILD/strata" bench "${COMMON[@]}" --quantization "$q" --batch 1,64 -r 5 \
    "${PEAK[@]}" --json "$OUT/tp1_$q.json"
done
for tp in $TPS; do
  [ "$tp" -le "$NGPU" ] || continue
  step "tp${tp}_bf16" 300 "$BUILD/strata" bench "${COMMON[@]}" --tp "$tp" --batch 1,64 -r 5 \
    --prefill 1x2048 "${PEAK[@]}" --json "$OUT/tp${tp}_bf16.json"
  for b in 1 64; do
    step "tp${tp}_profile_b$b" 300 env STRATA_CUDA_PROFILE=1 "$BUILD/strata" bench \
      "${COMMON[@]}" --tp "$tp" --batch "$b" -r 3
  done
done
python3 - "$OUT" "$READ" > "$OUT/summary.md" <<'PY'
import json, os, re, sys
out, read = sys.argv[1], float(sys.argv[2])
def rows(name):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p): return []
    try: return json.load(open(p))
    except Exception: return []
def allreduce_ms(name):  # all-reduce share of decode time, rank 0's table (eager, profiled run)
    p = os.path.join(out, name + ".txt")
    if not os.path.exists(p): return None
    tables = open(p).read().split("CUDA profile")[1:]
    if not tables: return None
    t = tables[0]
    m = re.search(r"decode/all_reduce\s+\d+\s+([\d.]+)", t)
    tot = re.findall(r"^  decode/\S+\s+\d+\s+([\d.]+)", t, re.M)
    if not m or not tot: return None
    return float(m.group(1)) / sum(float(x) for x in tot)
print(f"HBM read of one GPU (measured): {read:.0f} GB/s\n")
print("| layout | batch | ms/token | weight GB read/step | floor ms (N GPUs) | % of floor | all-reduce share (eager) | goal b1: 1.5 x floor + all-reduce |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
names = ["tp1_fp8", "tp1_int8"] + [f"tp{n}_bf16" for n in (2, 4, 8)]
for name in names:
    for r in rows(name):
        if r.get("test") != "decode": continue
        n = r.get("n_gpus", 1); b = r["batch"]; ms = r["ms_per_step"]
        gb = r["weight_bytes_streamed"] / 1e9
        floor = gb / (read * n) * 1e3 if read > 0 else float("nan")
        share = allreduce_ms(name.replace("_bf16", f"_profile_b{b}")) if "bf16" in name else None
        goal = "-"
        if b == 1 and share is not None and read > 0:
            ar = share * ms  # the all-reduce time of a graph step, from its eager share
            lim = 1.5 * floor + ar
            goal = f"{lim:.2f} ms: {'met' if ms <= lim else 'not met'}"
        sh = f"{100 * share:.1f}%" if share is not None else "-"
        print(f"| {name} ({n} GPU) | {b} | {ms:.2f} | {gb:.1f} | {floor:.2f} | {100 * floor / ms:.0f}% | {sh} | {goal} |")
for name in names:
    for r in rows(name):
        if r.get("test") == "prefill":
            print(f"\n{name} prefill {r['batch']}x{r['tokens']}: {r['ms']:.1f} ms, {r['TFLOPs']:.0f} TFLOP/s, MFU {100 * r.get('MFU', 0):.1f}% of {r.get('n_gpus', 1)} GPUs")
PY
cat "$OUT/summary.md"
echo "== done rc=$rc"
exit $rc
