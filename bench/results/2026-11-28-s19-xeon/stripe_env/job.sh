# Issue 19 job 19d: striped 4-row tiles (STRATA_CPU_STRIPE=N, an experiment: a tile's rows a quarter of
# the thread's range apart, N rows of software prefetch ahead in each stream, 0 none) in the MLP block
# and the LM head, against the default (def) and llama.cpp 0c1e570; rotated single runs (-r 1).
set -u
mkdir -p /tmp/xp /tmp/xn && tar -C /tmp/xp -xJf .gpu_pack/libs.tar.xz && tar -C /tmp/xn -xJf .gpu_pack/xn19d.tar.xz
export LD_LIBRARY_PATH=/tmp/xp/lib:/tmp/llb/bin:${LD_LIBRARY_PATH:-}
m=/tmp/gp/model.gguf
R=$OUT/cpu19d; mkdir -p $R; lscpu > $R/lscpu.txt; uptime > $R/uptime.txt; sha256sum $m > $R/model.sha256
S=/tmp/xn/bin/strata; LB=/tmp/llb/bin/llama-bench
a=$(cd /tmp && $S run -m $m -p "The capital of France is" -n 48 --temp 0 2>/dev/null)
for v in 0 4; do b=$(cd /tmp && STRATA_CPU_STRIPE=$v $S run -m $m -p "The capital of France is" -n 48 --temp 0 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] && echo "greedy: stripe $v same 48 tokens as def" || echo "greedy: stripe $v DIFFERS or empty"; done | tee $R/greedy.txt
one() { local t=$1 v=$2 p=$3 n=$4 test=$5 pin=""; [ $t = 2 ] && pin="taskset -c 4,5"
  case $v in llama) $pin $LB -m $m -t $t -p $p -n $n -r 1 2>/dev/null;; def) $pin $S bench -m $m -t $t -p $p -n $n -r 1 2>/dev/null;;
    *) STRATA_CPU_STRIPE=${v#s} $pin $S bench -m $m -t $t -p $p -n $n -r 1 2>/dev/null;; esac |
    awk -F'|' -v want=$test '{gsub(/ /,"",$7); if ($7==want) {split($8,x," "); print x[1]}}'; }
echo "threads,test,round,variant,tps" > $R/runs.csv
orders=("def s0 s4 s8 llama" "s0 s4 s8 llama def" "s4 s8 llama def s0" "s8 llama def s0 s4" "llama def s0 s4 s8")
rounds() { local t=$1 test=$2 p=$3 n=$4 nr=$5; for ((r=0; r<nr; r++)); do for v in ${orders[$((r%5))]}; do echo "$t,$test,$r,$v,$(one $t $v $p $n $test)" >> $R/runs.csv; done; done; }
rounds 2 tg128 0 128 15
rounds 16 tg128 0 128 6
for v in -1 0 4 8; do STRATA_CPU_STRIPE=$v STRATA_PROFILE=1 taskset -c 4,5 $S bench -m $m -t 2 -p 0 -n 128 -r 2 > $R/profile_s$v.txt 2>&1; done
python3 - $R/runs.csv <<'PY' | tee $R/summary.txt
import csv, statistics as st, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["tps"]]
keys = sorted({(r["threads"], r["test"]) for r in rows}, key=lambda k: (int(k[0]), k[1]))
for t, test in keys:
    by = {}
    for r in rows:
        if (r["threads"], r["test"]) == (t, test): by.setdefault(r["variant"], {})[r["round"]] = float(r["tps"])
    print(f"t{t} {test}: " + ", ".join(f"{v} {st.median(by[v].values()):.1f}" for v in by))
    for v in by:
        if v == "llama": continue
        for ref in ("llama", "def"):
            if ref == v or ref not in by: continue
            rat = sorted(by[v][k] / by[ref][k] for k in by[v] if k in by[ref])
            if rat: print(f"   {v}/{ref} median {st.median(rat):.3f} (ahead {sum(x > 1 for x in rat)}/{len(rat)})")
PY
for f in $R/profile_s*.txt; do echo "$f: $(grep -E 'MLP block|lm_head' $f | tr -s ' ' | tr '\n' ' ')"; done | tee -a $R/summary.txt
tar -czf $OUT/cpu19d.tgz -C $OUT cpu19d && rm -rf $R
