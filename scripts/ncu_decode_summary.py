#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV of a `strata bench` run into the kernels of one decode step.

The CSV is `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum` over the run (CUDA
graph kernels profiled as nodes). Forward passes are cut at each embedding_kernel (the first
kernel of every pass); a pass with flash_decode_kernel and no prefill attention kernel is a decode
step. Per kernel name: launches, microseconds and DRAM bytes read per step (means over the decode
steps), and the bandwidth it reached. The kernels' sum against the step time measured without the
profiler (--step-ms): what the step spends between kernels, or, when the kernels alone (ncu
serializes them and flushes the caches) sum to more, how much the graph's overlap saves.

  scripts/ncu_decode_summary.py ncu.csv [--step-ms 5.87] [--top 25] [--window]

--window: the CSV covers a window of the run (ncu --launch-skip / --launch-count): the passes cut
by its ends (the first unless it starts with the embedding, always the last) are dropped.
"""
import argparse
import csv
import collections
import re
import sys


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"strata::cuda::(\w+::)*", "", name)
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--window", action="store_true")
    o = ap.parse_args()
    kernels = collections.OrderedDict()  # id -> [name, us, bytes]
    with open(o.csv, newline="") as f:
        rows = [r for r in csv.reader(f)]
    header = None
    for r in rows:
        if "Kernel Name" in r and "Metric Name" in r:
            header = r
            continue
        if header is None or len(r) != len(header):
            continue
        d = dict(zip(header, r))
        try:
            kid = int(d["ID"])
        except ValueError:
            continue
        k = kernels.setdefault(kid, [d["Kernel Name"], 0.0, 0.0])
        v = float(d["Metric Value"].replace(",", "") or 0)
        unit = d.get("Metric Unit", "")
        if d["Metric Name"] == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
            k[1] = v * scale
        elif d["Metric Name"] == "dram__bytes_read.sum":
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
            k[2] = v * scale
    passes, cur = [], []
    for kid in sorted(kernels):
        name, us, b = kernels[kid]
        if "embedding_kernel" in name and cur:
            passes.append(cur)
            cur = []
        cur.append((short(name), us, b))
    if cur:
        passes.append(cur)
    if o.window and passes:
        passes = passes[:-1]
        if passes and "embedding_kernel" not in passes[0][0][0]:
            passes = passes[1:]
    decode = [p for p in passes
              if any("flash_decode_kernel" in n for n, _, _ in p)
              and not any(("flash_prefill" in n or "varlen" in n) for n, _, _ in p)]
    if not decode:
        sys.exit("no decode step found (no pass with flash_decode_kernel only)")
    steps = len(decode)
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for p in decode:
        for n, us, b in p:
            a = agg[n]
            a[0] += 1
            a[1] += us
            a[2] += b
    total_us = sum(a[1] for a in agg.values()) / steps
    total_b = sum(a[2] for a in agg.values()) / steps
    launches = sum(a[0] for a in agg.values()) / steps
    print(f"decode steps profiled: {steps}; kernels per step {launches:.0f}; "
          f"kernel time {total_us / 1e3:.3f} ms, DRAM read {total_b / 1e9:.2f} GB "
          f"({total_b / total_us / 1e3:.0f} GB/s over the kernels)")
    if o.step_ms > 0:
        gap = o.step_ms * 1e3 - total_us
        if gap >= 0:
            print(f"step measured without the profiler {o.step_ms:.3f} ms: between kernels "
                  f"{gap / 1e3:.3f} ms ({100 * gap / (o.step_ms * 1e3):.0f}%, "
                  f"{gap / launches:.2f} us per launch)")
        else:
            # ncu runs each kernel alone, caches flushed: in the graph the PDL-launched GEMMs
            # overlap their predecessors and find their first weights in L2.
            print(f"step measured without the profiler {o.step_ms:.3f} ms: the kernels alone "
                  f"(serialized, caches flushed) sum to {-gap / 1e3:.3f} ms more "
                  f"({-gap / launches:.2f} us per launch): in the graph they overlap")
    print()
    print("| kernel | per step | us / step | share | us / launch | GB read / step | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n, a in sorted(agg.items(), key=lambda kv: -kv[1][1])[: o.top]:
        us, b = a[1] / steps, a[2] / steps
        print(f"| {n} | {a[0] / steps:.0f} | {us:.1f} | {100 * us / total_us:.1f}% | "
              f"{a[1] / a[0]:.2f} | {b / 1e9:.3f} | {b / us / 1e3 if us > 0 else 0:.0f} |")


if __name__ == "__main__":
    main()
