#!/usr/bin/env bash
# strata vs llama.cpp on a shared (noisy) machine: many short runs in alternation, compared in
# pairs. Each round runs `strata bench` and `llama-bench` with -r 1, once for tg64 (-p 0 -n 64)
# and once for pp512 (-p 512 -n 0), the two engines' order swapped every round, so that load
# that comes and goes over seconds hits both about equally. The summary gives each engine's
# median tokens/s and the median of the per-round ratios strata / llama.cpp, with the rounds
# strata won.
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_vs_llamacpp_paired.sh [model.gguf] [threads] [rounds]
# TG=128 generates 128 tokens instead of 64 (the issue's tg128). STRATA_BIN picks the strata
# binary (default ./build/strata); PIN=4,5 runs both under
# `taskset -c 4,5`. Writes the runs as CSV to $OUT (default bench/results/
# cpu-paired-<threads>t-<date>.csv) and the summary beside it (.txt).
# Seventeenth and eighteenth sessions: on the GPU machines' Xeon the same binary's tg128 moved by
# 2x within minutes, so single runs of a few repetitions (bench_vs_llamacpp.sh) can not tell
# 5-10% apart there; this can.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${STRATA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}
model=${1:-$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
rounds=${3:-20}
tg=${TG:-64}
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
strata=${STRATA_BIN:-./build/strata}
out=${OUT:-bench/results/cpu-paired-${threads}t-$(date +%Y%m%d).csv}
pin=()
[[ -n ${PIN:-} ]] && pin=(taskset -c "$PIN")
echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), ${threads} threads, ${rounds} rounds"
echo "== load: $(uptime)"
# t/s of the row named $1 in a llama-bench style table on stdin.
value() { awk -F'|' -v want="$1" '{gsub(/ /, "", $7); if ($7 == want) {split($8, x, " "); print x[1]}}'; }
one() {  # one ENGINE TEST
  local args=(-p 0 -n "$tg") row=tg$tg
  [[ $2 == pp ]] && args=(-p 512 -n 0) && row=pp512
  if [[ $1 == strata ]]; then
    "${pin[@]}" "$strata" bench -m "$model" -t "$threads" "${args[@]}" -r 1 2>/dev/null | value $row
  else
    "${pin[@]}" "$LLAMA_BENCH" -m "$model" -t "$threads" "${args[@]}" -r 1 2>/dev/null | value $row
  fi
}
echo "round,test,engine,tps" > "$out"
for ((r = 0; r < rounds; r++)); do
  order=(strata llama)
  ((r % 2 == 1)) && order=(llama strata)
  for test in tg pp; do
    for e in "${order[@]}"; do echo "$r,$test,$e,$(one "$e" "$test")" >> "$out"; done
  done
done
python3 - "$out" "$tg" <<'PY' | tee "${out%.csv}.txt"
import csv, statistics as st, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["tps"]]
for test, name in (("tg", "tg" + sys.argv[2]), ("pp", "pp512")):
    by = {}
    for r in rows:
        if r["test"] == test:
            by.setdefault(r["engine"], {})[r["round"]] = float(r["tps"])
    if len(by) < 2:
        print(f"{name}: missing runs"); continue
    common = [k for k in by["strata"] if k in by["llama"]]
    ratios = sorted(by["strata"][k] / by["llama"][k] for k in common)
    wins = sum(x > 1 for x in ratios)
    print(f"{name}: strata median {st.median(by['strata'].values()):.1f} t/s, llama.cpp "
          f"{st.median(by['llama'].values()):.1f}; per-round ratio median {st.median(ratios):.3f} "
          f"(quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f}), "
          f"strata ahead in {wins} of {len(ratios)}")
PY
