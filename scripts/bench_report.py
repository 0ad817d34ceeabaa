#!/usr/bin/env python3
"""Join `strata bench --json` results with shared/bench/peer_torch.py's JSON lines from the same
GPU job into one report: machine, commit, both systems' numbers and strata/peer ratios.

  scripts/bench_report.py --out report.json --gpu gpu.txt --commit SHA --peer peer.jsonl strata_*.json
"""
import argparse, json, os, sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", help="nvidia-smi name,driver,memory csv line")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--peer")
    ap.add_argument("strata", nargs="+")
    a = ap.parse_args()
    gpu = open(a.gpu).read().strip() if a.gpu and os.path.exists(a.gpu) else ""
    peer = []
    if a.peer and os.path.exists(a.peer):
        for line in open(a.peer):
            line = line.strip()
            if line.startswith("{"):
                peer.append(json.loads(line))
    ceil = {r["what"]: r["value"] for r in peer if "system" not in r}
    peer_decode = {r["batch"]: r["value"] for r in peer if r.get("what") == "decode_ms_per_token"}
    peer_prefill = {(r["batch"], r["tokens"]): r for r in peer if r.get("what") == "prefill_TFLOPs"}
    rows, table = [], []
    for path in a.strata:
        name = os.path.basename(path)[len("strata_"):-len(".json")]
        try:
            res = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            continue
        for r in res:
            r = dict(r, weights_run=name)
            if r["test"] == "decode":
                p = peer_decode.get(r["batch"])
                if p:
                    r["peer_ms_per_step"] = p
                    r["speedup_vs_peer"] = round(p / r["ms_per_step"], 3)
                table.append(f"| decode | {name} | {r['batch']} | {r['ms_per_step']:.3f} ms | "
                             f"{p if p else '-'} ms | {r.get('speedup_vs_peer', '-')} | "
                             f"{r['weight_GBps']:.0f} GB/s |")
            elif r["test"] == "prefill":
                p = peer_prefill.get((r["batch"], r["tokens"]))
                if p:
                    r["peer_TFLOPs"] = p["value"]
                    r["peer_ms"] = p["ms"]
                    r["speedup_vs_peer"] = round(p["ms"] / r["ms"], 3)
                table.append(f"| prefill {r['batch']}x{r['tokens']} | {name} | {r['batch']} | "
                             f"{r['ms']:.2f} ms ({r['TFLOPs']:.0f} TFLOP/s) | "
                             f"{p['value'] if p else '-'} TFLOP/s | {r.get('speedup_vs_peer', '-')} | |")
            elif r["test"] == "ttft":
                table.append(f"| ttft {r['tokens']} | {name} | 1 | {r['ms']:.2f} ms | - | - | |")
            rows.append(r)
    report = {"gpu": gpu, "commit": a.commit, "ceilings": ceil, "peer": peer, "strata": rows}
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print("| test | weights | batch | strata | peer | speedup | bandwidth |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))
    print("ceilings:", ceil)


if __name__ == "__main__":
    main()
