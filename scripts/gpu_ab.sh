#!/usr/bin/env bash
# A/B of two strata binaries on the same GPU in one job: `strata bench` of each, alternated
# ROUNDS times (A B A B ...), then the median of each test over the rounds and the ratio B/A.
# For "no regression" checks: A is the baseline build, B the candidate.
#
#   scripts/gpu_ab.sh A/strata B/strata        (env: MODEL, BATCH, CTX, PREFILL, ROUNDS, OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
A=$1
B=$2
OUT=${OUT:-$PWD/gpu_out}
MODEL=${MODEL:-llama3-8b}
BATCH=${BATCH:-1,16,64}
CTX=${CTX:-256}
PREFILL=${PREFILL:-1x2048,8x2048}
ROUNDS=${ROUNDS:-3}
RAW=$(mktemp -d)  # per-round files stay here; the summary (all samples) goes to $OUT
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A
    [ "$side" = B ] && bin=$B
    "$bin" bench --device cuda --model-config "$MODEL" --batch "$BATCH" --ctx "$CTX" \
      --prefill "$PREFILL" -r 5 --json "$RAW/${side}_$r.json" > "$RAW/${side}_$r.txt" 2>&1 ||
      { echo "$side round $r failed"; tail -n 5 "$RAW/${side}_$r.txt"; }
  done
done
python3 - "$RAW" "$ROUNDS" "$OUT/ab_summary.json" <<'EOF'
import json, statistics, sys
d, rounds, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(side):
    rows = {}
    for r in range(1, rounds + 1):
        try:
            for t in json.load(open(f"{d}/{side}_{r}.json")):
                key = (t["test"], t.get("batch"), t.get("tokens"))
                v = t.get("ms_per_step", t.get("ms"))
                rows.setdefault(key, []).extend(t.get("ms_samples", [v]))
        except Exception as e:
            print(side, r, "unreadable:", e)
    return rows
a, b = load("A"), load("B")
print("| test | batch | tokens | A median ms | B median ms | B/A |")
print("|---|---:|---:|---:|---:|---:|")
out = []
for k in sorted(a):
    if k not in b:
        continue
    ma, mb = statistics.median(a[k]), statistics.median(b[k])
    print(f"| {k[0]} | {k[1]} | {k[2]} | {ma:.3f} | {mb:.3f} | {mb / ma:.4f} |")
    out.append({"test": k[0], "batch": k[1], "tokens": k[2], "A_ms": a[k], "B_ms": b[k],
                "A_median": ma, "B_median": mb, "ratio_B_over_A": mb / ma})
json.dump(out, open(dest, "w"), indent=1)
EOF
