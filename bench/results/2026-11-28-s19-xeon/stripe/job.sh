# Issue 19 job 19e: old = a201b2e, new = striped one-token 4-row tiles (rows4_striped, 4 rows of prefetch),
# llama = llama.cpp 0c1e570; rotated single runs (-r 1): tg128, tg64, pp512 at 2 threads (4,5), 16; test_ops.
set -u
mkdir -p /tmp/xp /tmp/xn && tar -C /tmp/xp -xJf .gpu_pack/libs.tar.xz && tar -C /tmp/xn -xJf .gpu_pack/xn19e.tar.xz
export LD_LIBRARY_PATH=/tmp/xp/lib:/tmp/llb/bin:${LD_LIBRARY_PATH:-}
m=/tmp/gp/model.gguf
R=$OUT/cpu19e; mkdir -p $R; lscpu > $R/lscpu.txt; uptime > $R/uptime.txt; sha256sum $m > $R/model.sha256
B=/tmp/xn/bin; LB=/tmp/llb/bin/llama-bench
a=$(cd /tmp && $B/strata_old run -m $m -p "The capital of France is" -n 48 --temp 0 2>/dev/null)
b=$(cd /tmp && $B/strata_new run -m $m -p "The capital of France is" -n 48 --temp 0 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && echo "greedy: same 48 tokens old and new" | tee $R/greedy.txt || echo "greedy DIFFERS or empty" | tee $R/greedy.txt
$B/strata_new info -m $m 2>&1 | grep "cpu kernels" > $R/info.txt
(cd /tmp && timeout 120 $B/test_ops > $R/test_ops.log 2>&1; echo "test_ops rc $?" >> $R/test_ops.log); tail -3 $R/test_ops.log
one() { local t=$1 v=$2 p=$3 n=$4 test=$5 pin=""; [ $t = 2 ] && pin="taskset -c 4,5"
  if [ $v = llama ]; then $pin $LB -m $m -t $t -p $p -n $n -r 1 2>/dev/null; else $pin $B/strata_$v bench -m $m -t $t -p $p -n $n -r 1 2>/dev/null; fi |
    awk -F'|' -v want=$test '{gsub(/ /,"",$7); if ($7==want) {split($8,x," "); print x[1]}}'; }
echo "threads,test,round,variant,tps" > $R/runs.csv
orders=("old new llama" "new llama old" "llama old new" "old llama new" "new old llama" "llama new old")
rounds() { local t=$1 test=$2 p=$3 n=$4 nr=$5; for ((r=0; r<nr; r++)); do for v in ${orders[$((r%6))]}; do echo "$t,$test,$r,$v,$(one $t $v $p $n $test)" >> $R/runs.csv; done; done; }
rounds 2 tg128 0 128 16
rounds 2 tg64 0 64 10
rounds 2 pp512 512 0 6
rounds 16 tg128 0 128 6
rounds 16 pp512 512 0 4
for i in 1 2; do for v in old new; do STRATA_PROFILE=1 taskset -c 4,5 $B/strata_$v bench -m $m -t 2 -p 0 -n 128 -r 2 > $R/profile_${v}_$i.txt 2>&1; done; done
python3 - $R/runs.csv <<'PY' | tee $R/summary.txt
import csv, statistics as st, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["tps"]]
keys = sorted({(r["threads"], r["test"]) for r in rows}, key=lambda k: (int(k[0]), k[1]))
for t, test in keys:
    by = {}
    for r in rows:
        if (r["threads"], r["test"]) == (t, test): by.setdefault(r["variant"], {})[r["round"]] = float(r["tps"])
    med = {v: st.median(by[v].values()) for v in by}
    line = f"t{t} {test}: " + ", ".join(f"{v} {med[v]:.1f}" for v in ("old", "new", "llama") if v in med)
    for v in ("old", "new"):
        if v not in by or "llama" not in by: continue
        rat = sorted(by[v][k] / by["llama"][k] for k in by[v] if k in by.get("llama", {}))
        if rat: line += f"; {v}/llama median {st.median(rat):.3f} (ahead {sum(x > 1 for x in rat)}/{len(rat)})"
    rat = sorted(by["new"][k] / by["old"][k] for k in by.get("new", {}) if k in by.get("old", {}))
    if rat: line += f"; new/old {st.median(rat):.3f}"
    print(line)
PY
tar -czf $OUT/cpu19e.tgz -C $OUT cpu19e && rm -rf $R
