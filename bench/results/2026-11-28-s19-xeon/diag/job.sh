# Issue 19 Xeon job 19a: why strata's 2-thread decode trails llama.cpp here. Kernels alone
# (bench_quant vs test-backend-ops at the model's shapes), in-model phases, cpu-clock profiles of
# both engines, hardware counters if the VM has them, THP state, huge pages on/off.
set -u
mkdir -p /tmp/xp /tmp/xn && tar -C /tmp/xp -xJf .gpu_pack/libs.tar.xz && tar -C /tmp -xJf .gpu_pack/perfpk.tar.xz && tar -C /tmp/xn -xJf .gpu_pack/xn19a.tar.xz
export LD_LIBRARY_PATH=/tmp/xp/lib:/tmp/llb/bin:${LD_LIBRARY_PATH:-}
m=/tmp/gp/model.gguf
R=$OUT/xeon19a; mkdir -p $R; lscpu > $R/lscpu.txt; uptime > $R/uptime.txt; sha256sum $m > $R/model.sha256
for f in enabled defrag; do echo "$f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done > $R/thp.txt
cat /proc/sys/kernel/perf_event_paranoid >> $R/thp.txt
if command -v perf >/dev/null; then PERF=perf; else PERF="env LD_LIBRARY_PATH=/tmp/perfpk/lib:$LD_LIBRARY_PATH /tmp/perfpk/perf"; fi
$PERF stat -e cycles,instructions,dTLB-load-misses true > $R/perf_probe.txt 2>&1
S=/tmp/xn/bin/strata; BQ=/tmp/xn/bin/bench_quant; LB=/tmp/llb/bin/llama-bench; TBO=/tmp/llb/bin/test-backend-ops
P="taskset -c 4,5"
OMP_NUM_THREADS=2 $P $BQ 1 i16 > $R/bench_quant_t2.txt 2>&1
TBO_THREADS=2 timeout 120 $P $TBO perf -o MUL_MAT -b CPU -p "type_a=q(4_1|8_0),type_b=f32,m=[0-9]+,n=1,k=(576|1536|14336)," > $R/tbo_t2.txt 2>&1
for i in 1 2; do
  STRATA_PROFILE=1 $P $S bench -m $m -t 2 -p 0 -n 64 -r 3 > $R/strata_profile_t2_$i.txt 2>&1
  $P $LB -m $m -t 2 -p 0 -n 64 -r 3 > $R/llama_t2_$i.txt 2>&1
done
$P $PERF record -q -F 4000 -e cpu-clock -o /tmp/ll.data -- $LB -m $m -t 2 -p 0 -n 128 -r 3 > $R/ll_rec.txt 2>&1
$PERF report -i /tmp/ll.data --stdio --sort dso,sym 2>/dev/null | grep -v "^#" | grep -v "^$" | head -60 > $R/ll_report.txt
$P $PERF record -q -F 4000 -e cpu-clock -o /tmp/st.data -- $S bench -m $m -t 2 -p 0 -n 128 -r 3 > $R/st_rec.txt 2>&1
$PERF report -i /tmp/st.data --stdio --sort dso,sym 2>/dev/null | grep -v "^#" | grep -v "^$" | head -60 > $R/st_report.txt
EV=cycles,instructions,cache-references,cache-misses,L1-dcache-load-misses,LLC-loads,LLC-load-misses,dTLB-loads,dTLB-load-misses,page-faults
$P $PERF stat -e $EV -- $LB -m $m -t 2 -p 0 -n 128 -r 3 > $R/ll_stat.txt 2>&1
$P $PERF stat -e $EV -- $S bench -m $m -t 2 -p 0 -n 128 -r 3 > $R/st_stat.txt 2>&1
STRATA_HUGEPAGES=1 $P $PERF stat -e $EV -- $S bench -m $m -t 2 -p 0 -n 128 -r 3 > $R/st_stat_huge.txt 2>&1 &
sleep 4; pid=$(pgrep -n strata); [ -n "$pid" ] && grep -i huge /proc/$pid/smaps_rollup > $R/huge_smaps.txt; wait
for i in 1 2 3; do
  $P $S bench -m $m -t 2 -p 0 -n 64 -r 2 > $R/st_r$i.txt 2>&1
  STRATA_HUGEPAGES=1 $P $S bench -m $m -t 2 -p 0 -n 64 -r 2 > $R/sthuge_r$i.txt 2>&1
  $P $LB -m $m -t 2 -p 0 -n 64 -r 2 > $R/ll_r$i.txt 2>&1
done
tar -czf $OUT/xeon19a.tgz -C $OUT xeon19a && rm -rf $R
