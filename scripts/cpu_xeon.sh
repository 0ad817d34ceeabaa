#!/usr/bin/env bash
# Issue 19 on a GPU machine's CPU (or any CPU): strata's CPU path beside llama.cpp in one job.
#   MODEL=x.gguf LLAMA_SRC=<llama.cpp tree> OUT=<dir> [STRATA_BIN=..] [BENCH_QUANT=..] \
#     [THREADS="2 16"] [STAGES="profile kernels vs rounds"] scripts/cpu_xeon.sh
# Stages, each writing under $OUT:
#   profile  strata bench with STRATA_PROFILE=1 (per-section host-clock table), int16 / int8 decode
#   kernels  bench_quant (GB/s of weight bytes, hot and cold, beside a plain read probe) at 1 and
#            512 tokens
#   vs       scripts/bench_vs_llamacpp.sh per thread count (one JSON each)
#   rounds   alternating tg128 / pp512 rounds, strata then llama.cpp, 3 each
# llama.cpp is built from LLAMA_SRC with GGML_NATIVE=ON into /tmp/llb (kept while the machine is).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a GGUF file}" "${OUT:?set OUT to a results folder}"
S=${STRATA_BIN:-./build/strata}
BQ=${BENCH_QUANT:-./build/bench/bench_quant}
THREADS=${THREADS:-"2 $(nproc)"}
STAGES=${STAGES:-"profile kernels vs rounds"}
mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
sha256sum "$MODEL" > "$OUT/model.sha256"
has() { [[ " $STAGES " == *" $1 "* ]]; }
llama_bench() {
  if [ ! -x /tmp/llb/bin/llama-bench ]; then
    : "${LLAMA_SRC:?set LLAMA_SRC to a llama.cpp source tree}"
    uptime > "$OUT/llama_build_uptime.txt"
    cmake -S "$LLAMA_SRC" -B /tmp/llb -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
      > "$OUT/llama_build.txt" 2>&1 && cmake --build /tmp/llb -j "$(nproc)" --target llama-bench \
      >> "$OUT/llama_build.txt" 2>&1 || { echo "llama.cpp build failed"; tail -n 20 "$OUT/llama_build.txt"; exit 1; }
    sleep 20  # let the build's load settle before timing
  fi
  echo /tmp/llb/bin/llama-bench
}

if has profile; then
  for t in $THREADS; do for dec in int16 int8; do
    f="$OUT/profile_t${t}_$dec.txt"
    uptime > "$f"
    STRATA_PROFILE=1 STRATA_CPU_DECODE=$dec timeout 120 "$S" bench -m "$MODEL" -t "$t" -p 512 -n 128 \
      -r 3 >> "$f" 2>&1
    echo "profile t$t $dec rc=$?: $(grep -E 'tg128|pp512' "$f" | awk -F'|' '{print $7 $8}' | tr -s ' ' | tr '\n' ' ')"
  done; done
fi

if has kernels; then
  for t in $THREADS; do for act in i16 i8; do
    OMP_NUM_THREADS=$t timeout 120 "$BQ" 1 $act > "$OUT/bench_quant_t${t}_1_$act.txt" 2>&1
    echo "bench_quant t$t 1 $act rc=$?"
  done
  OMP_NUM_THREADS=$t timeout 120 "$BQ" 512 i8 > "$OUT/bench_quant_t${t}_512_i8.txt" 2>&1
  echo "bench_quant t$t 512 i8 rc=$?"
  done
fi

if has vs; then
  LB=$(llama_bench) || exit 1
  for t in $THREADS; do
    STRATA_BIN=$S LLAMA_BENCH=$LB OUT="$OUT/cpu-smollm2-vs-llamacpp-t$t.json" \
      timeout 300 bash scripts/bench_vs_llamacpp.sh "$MODEL" "$t" > "$OUT/vs_t$t.txt" 2>&1
    echo "vs t$t rc=$?: $(grep -E '^ratio' "$OUT/vs_t$t.txt")"
  done
fi

if has rounds; then
  LB=$(llama_bench) || exit 1
  for t in $THREADS; do for r in 1 2 3; do
    "$S" bench -m "$MODEL" -t "$t" -p 512 -n 128 -r 2 > "$OUT/round_t${t}_r${r}_strata.txt" 2>&1
    "$LB" -m "$MODEL" -t "$t" -p 512 -n 128 -r 2 > "$OUT/round_t${t}_r${r}_llama.txt" 2>&1
    echo "t$t r$r strata: $(grep -E 'pp512|tg128' "$OUT/round_t${t}_r${r}_strata.txt" | awk -F'|' '{print $7 $8}' | tr -s ' ' | tr '\n' ' ')"
    echo "t$t r$r llama:  $(grep -E 'pp512|tg128' "$OUT/round_t${t}_r${r}_llama.txt" | awk -F'|' '{print $7 $8}' | tr -s ' ' | tr '\n' ' ')"
  done; done
fi
