#!/usr/bin/env bash
# strata bench vs llama.cpp's llama-bench on the same GGUF, same machine, same threads, one run.
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_vs_llamacpp.sh [model.gguf] [threads]
# STRATA_BIN picks the strata binary (default ./build/strata); COMMIT names its commit where the
# tree is no git checkout (a device machine's copy).
# llama.cpp is built from source beside the project (never committed); see docs/performance.md.
# Writes bench/results/cpu-smollm2-vs-llamacpp-<date>.json (or $OUT) and prints both tables,
# the CPU's SIMD flags, the kernel variant strata picked and the load average.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${STRATA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}
model=${1:-$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
reps=${REPS:-5}
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
out=${OUT:-bench/results/cpu-smollm2-vs-llamacpp-$(date +%Y%m%d).json}
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|f16c|amx)' | sort -u | tr '\n' ' ')
echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), ${threads} threads"
echo "== CPU flags: ${flags}"
load_before=$(cat /proc/loadavg)
echo "== load: $(uptime)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== llama.cpp"
"$LLAMA_BENCH" -m "$model" -t "$threads" -p 512 -n 128 -r "$reps" -o json > "$tmp/llama.json"
"$LLAMA_BENCH" -m "$model" -t "$threads" -p 512 -n 128 -r 1 2>/dev/null | tail -n 4 || true
echo "== strata"
"${STRATA_BIN:-./build/strata}" bench -m "$model" -t "$threads" -p 512 -n 128 -r "$reps" --json "$tmp/strata.json" \
  2> "$tmp/strata.err" || { cat "$tmp/strata.err" >&2; exit 1; }
cat "$tmp/strata.err" >&2
path=$(sed -n 's/^cpu kernels: //p' "$tmp/strata.err")
python3 - "$tmp/llama.json" "$tmp/strata.json" "$out" "$threads" "$flags" "$path" "$load_before" \
  "$(cat /proc/loadavg)" <<'PY'
import json, os, sys, subprocess, platform
llama = json.load(open(sys.argv[1])); strata = json.load(open(sys.argv[2]))
def pick(rows, pp):
    for r in rows:
        if (r.get("n_prompt", 0) > 0) == pp and (r.get("n_gen", 0) > 0) != pp:
            return r
l_pp, l_tg, s_pp, s_tg = pick(llama, True), pick(llama, False), pick(strata, True), pick(strata, False)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
res = {"what": "CPU pp512/tg128 tokens/s, strata vs llama.cpp, same GGUF, same machine, one run",
       "cpu": cpu, "cpu_flags": sys.argv[5].split(), "strata_cpu_kernels": sys.argv[6],
       "loadavg_before": sys.argv[7], "loadavg_after_runs": sys.argv[8], "threads": int(sys.argv[4]),
       "commit": os.environ.get("COMMIT") or subprocess.check_output(["git", "rev-parse", "HEAD"]).decode().strip(),
       "llama_cpp": {"build_commit": l_pp.get("build_commit"), "pp512": l_pp["avg_ts"], "pp512_std": l_pp["stddev_ts"],
                     "tg128": l_tg["avg_ts"], "tg128_std": l_tg["stddev_ts"]},
       "strata": {"pp512": s_pp["avg_ts"], "pp512_std": s_pp["stddev_ts"], "tg128": s_tg["avg_ts"], "tg128_std": s_tg["stddev_ts"]},
       "ratio_pp512": s_pp["avg_ts"] / l_pp["avg_ts"], "ratio_tg128": s_tg["avg_ts"] / l_tg["avg_ts"]}
json.dump(res, open(sys.argv[3], "w"), indent=1)
print(f"ratio strata/llama.cpp: pp512 {res['ratio_pp512']:.2f}x  tg128 {res['ratio_tg128']:.2f}x  -> {sys.argv[3]}")
PY
